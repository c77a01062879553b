"""Reading counters: merge the tally and every shard of an instance's partition, in one read.

Reads never coordinate with writers. A GC batch replaces shards by the tally atomically within the
partition, so a read sees the state before it or after it, never a mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, overload

from countersink.cassandra import CassandraClient, as_dicts
from countersink.registry import CounterRegistry
from countersink.resets import EpochsCache, read_epochs
from countersink.settings import Consistency
from countersink.state_cache import Row, ShardRow, Stamps, StateCache
from schemas import timeseries
from schemas.cql import STAMP_ROW, TALLY_ROW, partition_groups, shard_of_cell, shard_slice, slice_key
from schemas.definitions import CounterDefinition
from schemas.errors import CountersinkError
from schemas.kinds import State, merge_blobs, merge_states, state_from_bytes
from schemas.resets import Epochs, cell_name
from schemas.timeseries import SeriesPoint, TimeRangeError

# Counters sharing a key share its slice (schemas.cql): every read selects its own counter's cells.
_INSTANCE = "SELECT tallies[?] AS tally, born_us, mutator, states[?] AS cell, writetime(states[?]) AS written_us, " \
            "ttl(tallies[?]) AS tally_ttl, ttl(states[?]) AS state_ttl FROM shards WHERE part = ? AND key = ?"


@dataclasses.dataclass(frozen=True)
class ShardView:
    """One shard of an instance, with the mutator that wrote it (for ``explain``)."""

    mutator: uuid.UUID
    through_offset: int | None
    written_us: int | None
    value: object
    topic: str | None = None
    partition: int | None = None
    host: str | None = None
    born_us: int | None = None
    retired_us: int | None = None
    collected_us: int | None = None


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why an instance's value is what it is: the tally, every shard, and their merge."""

    counter: str
    key: str
    kind: str | None
    tally: object
    shards: tuple[ShardView, ...]
    value: object
    partitions: tuple[dict[str, Any], ...]


async def read_states(
    client: CassandraClient, counter: str, key: str, consistency: Consistency | None = None
) -> list[State]:
    """Every stored state of one instance (its tally and each shard), not merged; none when nothing was ever
    counted for it, or when it is a bucket past its retention (its rows, written to expire a grace period
    after that, are hidden from then on, so a bucket never reads as partly gone)."""
    return [state_from_bytes(blob) for blob in (await read_blobs_of(client, counter, [key], consistency))[key]]


# Instances per request of a range read: the coordinator reads them as separate partitions, the client pays
# for one request (far below the IN-list sizes Cassandra warns about).
_KEYS_PER_READ = 24
# The columns of a read of several instances, by position: rows are read as tuples, not dicts (a wide
# instance is hundreds of rows).
_PART, _KEY, _TALLY, _CELL, _TALLY_TTL, _STATE_TTL, _STAMPS, _BORN, _MUTATOR, _WRITTEN = range(10)


@dataclasses.dataclass(slots=True)
class _Retention:
    """What one read's TTLs say of one partition's retention: hidden at once when a TTL is at or under the grace
    (a bucket's rows expire at its expiry plus the grace, and readers hide it from its expiry on), else from when
    the request was sent plus the least TTL less the grace."""

    grace: int
    sent: float  # taken before the request, a second early: Cassandra's TTLs count whole seconds down
    least: int | None = None
    hidden: bool = False

    def see(self, *ttls: int | None) -> None:
        for ttl in ttls:
            if ttl is not None:
                self.hidden = self.hidden or ttl <= self.grace
                self.least = ttl if self.least is None else min(self.least, ttl)

    @property
    def hidden_at(self) -> float | None:
        return None if self.least is None else self.sent + self.least - self.grace


@dataclasses.dataclass(slots=True)
class StoredInstance:
    """What one read found of an instance: its stored states (tally first, then its shards in the partition's
    order; none when never counted or hidden), its partition's stamps as the same read returned them, and
    when its retention hides it (epoch seconds), if it has one."""

    blobs: list[bytes] = dataclasses.field(default_factory=list)
    stamps: Stamps | None = None
    hidden_at: float | None = None
    rows: list[ShardRow] | None = None  # each shard's row, when asked for: the last len(rows) of blobs


async def read_blobs_of(client: CassandraClient, counter: str, keys: Sequence[str],
                        consistency: Consistency | None = None, epochs: Epochs | None = None
                        ) -> dict[str, list[bytes]]:
    """The stored states (bytes) of several instances of one counter, in one request: each instance's tally
    first, then its shards in the partition's order. None (an empty list) for an instance never counted, or
    past its retention (:func:`read_states`). ``epochs``: the counter's, when the caller read them already
    (a range read reads them once for all its chunks)."""
    found = await read_instances(client, counter, keys, consistency, epochs)
    return {key: found[key].blobs for key in keys}


async def read_instances(client: CassandraClient, counter: str, keys: Sequence[str],
                         consistency: Consistency | None = None, epochs: Epochs | None = None, *,
                         rows: bool = False) -> dict[str, StoredInstance]:
    """:func:`read_blobs_of`, with each partition's stamps and the time its retention hides it; ``rows``: and
    each shard's row with its newest cell's write timestamp (what a cache needs to read only the rows that
    change)."""
    level = consistency or client.settings.read_consistency
    # Only the cells of each instance's current epoch (schemas.resets): what a reset left behind is not read.
    if epochs is None:
        epochs = await read_epochs(client, counter)
    cells: dict[str, list[str]] = {}
    for key in keys:
        cells.setdefault(epochs.cell(counter, key), []).append(key)
    grace, sent = client.settings.retention_grace_s, time.time() - 1
    out: dict[str, StoredInstance] = {key: StoredInstance() for key in keys}
    retention: dict[str, _Retention] = {}  # of each key read
    extra = ", born_us, mutator, maxwritetime(states)" if rows else ""

    async def read(cell: str, parts: list[str], stored: list[str]) -> None:
        result = await client.execute(
            "SELECT part, key, tallies[?] AS tally, states[?] AS cell, ttl(tallies[?]) AS tally_ttl, "  # noqa: S608
            f"ttl(states[?]) AS state_ttl, stamps{extra} FROM shards WHERE part IN ? AND key IN ?",
            [cell] * 4 + [parts, stored], consistency=level)
        place: tuple[str, str] | None = None
        found, kept = StoredInstance(), _Retention(grace, sent)
        for row in result:
            values = row.as_tuple()
            if (values[_PART], values[_KEY]) != place:  # a key's rows come together, its tally row first
                place = (values[_PART], values[_KEY])
                key = slice_key(*place)
                found = out.setdefault(key, StoredInstance())
                kept = retention[key] = _Retention(grace, sent)
                if rows:
                    found.rows = []
            if values[_TALLY] is not None:  # the key's tally row (schemas.cql.TALLY_ROW), its first
                found.blobs.insert(0, values[_TALLY])
            kept.see(values[_TALLY_TTL], values[_STATE_TTL])
            if values[_CELL] is not None:  # rows of the key's other counters come without a cell of this one
                found.blobs.append(shard_of_cell(values[_CELL])[0])
                if found.rows is not None:
                    found.rows.append(ShardRow((values[_BORN], values[_MUTATOR]), values[_WRITTEN]))
            elif values[_STAMPS] is not None:  # the key's stamps row (schemas.cql), its last
                found.stamps = values[_STAMPS] or None

    # Keys alone in their partition (all but a bucket's) one request for all; a partition holding several of
    # them one request of its own, at the same time (schemas.cql.partition_groups).
    requests = [(cell, parts, stored) for cell, of_cell in cells.items()
                for parts, stored in partition_groups(of_cell, max(len(of_cell), 1))]
    await _all([read(*request) for request in requests])
    for key, seen in retention.items():
        found = out[key]
        found.hidden_at = seen.hidden_at
        if seen.hidden:
            found.blobs = []
    return {key: out[key] for key in keys}


async def read_stamps(client: CassandraClient, keys: Sequence[str], consistency: Consistency | None = None
                      ) -> dict[str, Stamps | None]:
    """The stamps of several instances (schemas.cql), in one request (or one per partition holding several of
    them, a few): one small row each."""
    out: dict[str, Stamps | None] = dict.fromkeys(keys)

    async def read(parts: list[str], stored: list[str]) -> None:
        result = await client.execute(
            "SELECT part, key, stamps FROM shards WHERE part IN ? AND key IN ? AND born_us = ? AND mutator = ?",
            [parts, stored, *STAMP_ROW], consistency=consistency or client.settings.read_consistency)
        for row in result:
            values = row.as_tuple()
            out[slice_key(values[0], values[1])] = values[2] or None

    await _all([read(parts, stored) for parts, stored in partition_groups(keys, max(len(keys), 1))])
    return out


async def _all(reads: Sequence[Awaitable[Any]]) -> list[Any]:
    """The results of ``reads``, all awaited at once (one alone is awaited as it is, no task made); when one
    fails, the others are cancelled (and awaited) before the failure is raised: a failed read leaves no other
    (of a wide partition, perhaps) running unaccounted."""
    if len(reads) == 1:
        return [await reads[0]]
    tasks = [asyncio.ensure_future(read) for read in reads]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def read_states_of(client: CassandraClient, counter: str, keys: Sequence[str],
                         consistency: Consistency | None = None) -> dict[str, list[State]]:
    """:func:`read_states` of several instances of one counter, in one request."""
    found = await read_blobs_of(client, counter, keys, consistency)
    return {key: [state_from_bytes(blob) for blob in blobs] for key, blobs in found.items()}


async def read_state(
    client: CassandraClient, counter: str, key: str, consistency: Consistency | None = None,
    cache: StateCache | None = None, epochs: Epochs | None = None,
    epochs_reader: Callable[[str], Awaitable[Epochs]] | None = None, guess: Epochs | None = None,
) -> State | None:
    """The merged state of one instance, or None when nothing was ever counted for it (or it is a bucket past
    its retention: :func:`read_states`). Its stored states are decoded and merged as a batch
    (:func:`schemas.kinds.merge_blobs`), or taken from ``cache`` when the partition's stamps are those it read
    with the states it merged (:mod:`countersink.state_cache`). ``epochs``: the counter's, when the caller read
    them already (for several keys at once); else read by ``epochs_reader`` (serve's ``EpochsCache.get``), or
    :func:`read_epochs`. ``guess``: the counter's epochs as last read (serve's ``EpochsCache.last``), when
    ``epochs`` are not given: the states of the instance's cell in them are read at the same time as the epochs,
    and read again only when the epochs read says the instance's cell is another (a reset since)."""
    if epochs is None and guess is not None and epochs_reader is not None and (
            cache is None or not cache.holds(guess.cell(counter, key), key, time.monotonic(), time.time())):
        return await _read_guessing(client, counter, key, consistency, cache, epochs_reader, guess)
    if cache is None:
        if epochs is None and epochs_reader is not None:
            epochs = await epochs_reader(counter)
        return merge_blobs((await read_blobs_of(client, counter, [key], consistency, epochs))[key])
    # The stamps do not depend on the epoch: both reads at once, a hit costs one round trip (measured in
    # bench.wide_reads' mix, where each counter's kept resets expire between its reads: a 256-shard hit at
    # 2.0-2.4x a plain row with the two reads one after the other, 1.5-1.9x with them kept fresh).
    sent = time.monotonic()
    if epochs is None:
        known, stamps = await _together((epochs_reader or functools.partial(read_epochs, client))(counter),
                                        read_stamps(client, [key], consistency))
    else:
        known, stamps = epochs, await _stamps_of_held(client, cache, counter, [key], epochs, consistency)
    return (await _through_cache(client, cache, counter, [key], stamps, known, consistency, sent=sent))[key]


async def _together(first: Awaitable[Any], second: Awaitable[Any]) -> tuple[Any, Any]:
    """Both results, the two awaited at once (:func:`_all`): a failed look-up of the resets leaves no read of a
    wide partition running unaccounted."""
    done = await _all((first, second))
    return done[0], done[1]


async def _read_guessing(client: CassandraClient, counter: str, key: str, consistency: Consistency | None,
                         cache: StateCache | None, epochs_reader: Callable[[str], Awaitable[Epochs]],
                         guess: Epochs) -> State | None:
    """:func:`read_state` of an instance whose merge ``cache`` does not keep, with the counter's epochs not kept
    but ``guess``-ed: the epochs and the instance's states in its cell of ``guess`` read at once (one round trip:
    the states read is sent when the read starts, so it sees every flush acknowledged before; the epochs are
    those of a read sent then, or of one in flight sent at most ``kept_s`` earlier, as any read's are, so they
    know every reset that has returned). The states are taken when the epochs read puts the instance in that
    same cell, else read again in the cell it names."""
    cell = guess.cell(counter, key)
    read_at = time.monotonic()
    known, found = await _together(epochs_reader(counter),
                                   read_instances(client, counter, [key], consistency, guess, rows=cache is not None))
    if known.cell(counter, key) != cell:
        return await read_state(client, counter, key, consistency, cache, known)  # in the cell named now
    if cache is None:
        return merge_blobs(found[key].blobs)
    return _keep(cache, cell, key, found[key], read_at)


def _keep(cache: StateCache, cell: str, key: str, found: StoredInstance, read_at: float, *,
          scan: bool = False) -> State | None:
    """The merge of an instance's states as read (at ``read_at``, monotonic), kept by ``cache`` with the stamps,
    retention and rows that read returned."""
    return cache.merged(cell, key, found.blobs, scan=scan, stamps=found.stamps, now=read_at,
                        hidden_at=found.hidden_at, rows=found.rows)


async def _stamps_of_held(client: CassandraClient, cache: StateCache, counter: str, keys: Sequence[str],
                          epochs: Epochs, consistency: Consistency | None) -> dict[str, Stamps | None]:
    """The stamps of those of ``keys`` whose merge ``cache`` keeps (one request, none when it keeps none of
    them); None for the others, which the read of their states gives with them: a first read, or one after its
    merge was evicted or aged, costs one round trip, as an uncached read does."""
    now, wall = time.monotonic(), time.time()
    held = [key for key in keys if cache.holds(epochs.cell(counter, key), key, now, wall)]
    stamps: dict[str, Stamps | None] = dict.fromkeys(keys)
    if held:
        stamps.update(await read_stamps(client, held, consistency))
    return stamps


async def read_value(client: CassandraClient, counter: str, key: str, consistency: Consistency | None,
                     cache: StateCache | None, epochs: EpochsCache, known: Epochs | None = None
                     ) -> tuple[str, object] | None:
    """What ``serve`` answers for one instance: its merged state's kind and value, None when nothing was counted
    (:func:`read_state`). The counter's resets come from ``known``, or those ``epochs`` keeps, or are read
    alongside the stamps (a merge ``cache`` keeps) or the states in the instance's cell of the resets ``epochs``
    read last; the value of a merge ``cache`` keeps is computed once (:meth:`StateCache.value`). With the cache's
    ``max_staleness_s``, a merge whose stamps were found unchanged less than that long ago answers without a
    request, when the counter's resets were read as recently (:meth:`StateCache.recent`)."""
    # Only at the consistency the cache's checks are made at: a read asking for more reads the stamps.
    if cache is not None and cache.max_staleness_s > 0 and consistency in (None, client.settings.read_consistency):
        recent = known if known is not None else epochs.kept(counter, within_s=cache.max_staleness_s)
        if recent is not None:
            cell = recent.cell(counter, key)
            state = cache.recent(cell, key, time.monotonic(), time.time())
            if state is not None:
                return state.kind, cache.value(cell, key, state)
    if known is None:
        known = epochs.kept(counter)
    state = await read_state(client, counter, key, consistency, cache, known, epochs.get,
                             None if known is not None else epochs.last(counter))
    if state is None:
        return None
    if known is None:
        known = epochs.kept(counter)  # read with the stamps just now, unless that took longer than it keeps them
    if cache is None or known is None:
        return state.kind, state.value()
    return state.kind, cache.value(known.cell(counter, key), key, state)


async def _through_cache(client: CassandraClient, cache: StateCache, counter: str, keys: Sequence[str],
                         stamps: dict[str, Stamps | None], epochs: Epochs, consistency: Consistency | None,
                         *, scan: bool = False, sent: float | None = None) -> dict[str, State | None]:
    """The merged state of each of ``keys`` (instances of ``counter``) given their stamps just read (the read
    sent at ``sent``, monotonic seconds): the merge ``cache`` kept where the stamps are unchanged, the others
    read (one request) and merged, and kept with the stamps read with them. ``scan``: see
    :meth:`StateCache.merged`."""
    now, wall = time.monotonic(), time.time()
    cells = {key: epochs.cell(counter, key) for key in keys}
    kept = {key: cache.checked(cells[key], key, stamps[key], now, wall, sent) for key in keys}
    # An instance some of whose sources flushed since its merge was kept: those rows alone, one request each.
    rows = {key: of_key for key, state in kept.items()
            if state is None and (of_key := cache.rows_to_read(cells[key], key, stamps[key], now, wall))}
    if rows:
        patched = await asyncio.gather(*(_patch(client, cache, cells[key], key, of_key, stamps[key], consistency,
                                                sent)
                                         for key, of_key in rows.items()))
        kept.update((key, state) for key, state in zip(rows, patched, strict=True) if state is not None)
    unread = [key for key, state in kept.items() if state is None]
    if unread:
        read_at = time.monotonic()
        for key, found in (await read_instances(client, counter, unread, consistency, epochs, rows=True)).items():
            kept[key] = _keep(cache, cells[key], key, found, read_at, scan=scan)
    return kept


async def _patch(client: CassandraClient, cache: StateCache, cell: str, key: str, rows: Sequence[Row],
                 stamps: Stamps | None, consistency: Consistency | None, sent: float | None = None) -> State | None:
    """The kept merge of ``cell`` and ``key`` with ``rows`` read again, for the partition's ``stamps`` read just
    before (:meth:`StateCache.patched`: a row is taken only if its newest cell was written at its source's stamp,
    so what is merged is what those stamps say, whichever replicas answer each request); None when
    that does not account for what changed, or a row read is past its retention (the whole read then decides
    what to hide)."""
    marks = ", ".join(["(?, ?)"] * (len(rows) + 1))  # bind markers only: the rows and the tally row, bound
    retention = _Retention(client.settings.retention_grace_s, time.time() - 1)
    result = await client.execute(
        "SELECT born_us, mutator, tallies[?] AS tally, states[?] AS cell, ttl(tallies[?]) AS tally_ttl, "  # noqa: S608
        "ttl(states[?]) AS state_ttl, maxwritetime(states) AS written_us FROM shards "
        f"WHERE part = ? AND key = ? AND (born_us, mutator) IN ({marks})",
        [cell] * 4 + [*shard_slice(key)] + [value for row in (TALLY_ROW, *rows) for value in row],
        consistency=consistency or client.settings.read_consistency)
    tally: bytes | None = None
    read: dict[Row, ShardRow] = {}
    cells: dict[Row, bytes] = {}
    for found in result:
        born, mutator, row_tally, cell_bytes, tally_ttl, state_ttl, written = found.as_tuple()
        if born == TALLY_ROW[0]:
            tally = row_tally
        retention.see(tally_ttl, state_ttl)
        if retention.hidden:
            return None
        if cell_bytes is not None:
            read[(born, mutator)] = ShardRow((born, mutator), written)
            cells[(born, mutator)] = shard_of_cell(cell_bytes)[0]
    if not read:
        return None  # none of the rows that changed holds a cell of the counter now: read the instance whole
    return cache.patched(cell, key, tally, read, cells, stamps, retention.hidden_at, sent)


Instant = datetime | int | float | str


def _seconds(when: Instant) -> int:
    return timeseries.instant_seconds(when)


class CounterReader:
    """Typed counter values: ints or Decimals for sums, floats for means, estimates with bounds for sketches.

    Range reads of bucketed counters (:meth:`series`, :meth:`rollup`) read at most ``max_range_buckets``
    buckets, ``concurrency`` at a time (or within ``reads``, a limit shared with other readers, and within
    ``range_reads`` too when given: the share of ``reads`` that ranges may hold, so that single reads sharing
    ``reads`` never queue behind more than that many chunks of ranges). With a
    ``cache`` (:class:`StateCache`), instances and buckets whose stored bytes are unchanged since it merged
    them are not decoded and merged again (every read still reads them)."""

    def __init__(self, client: CassandraClient, consistency: Consistency | None = None, *,
                 max_range_buckets: int = 1000, concurrency: int = 32,
                 reads: asyncio.Semaphore | None = None, cache: StateCache | None = None,
                 epochs: EpochsCache | None = None, range_reads: asyncio.Semaphore | None = None) -> None:
        self.client = client
        self.cache = cache
        self.epochs = epochs  # each counter's resets kept briefly (serve's), or read by every read
        self.consistency = consistency or client.settings.read_consistency
        self.max_range_buckets = max_range_buckets
        self._reads = reads or asyncio.Semaphore(concurrency)
        self._range_reads = range_reads

    async def get(self, counter: str, key: str, epochs: Epochs | None = None) -> object:
        """The value of one instance; None when nothing was counted (or, for min/max, nothing yet)."""
        if self.epochs is not None:
            found = await read_value(self.client, counter, key, self.consistency, self.cache, self.epochs, epochs)
            return None if found is None else found[1]
        state = await read_state(self.client, counter, key, self.consistency, self.cache, epochs)
        return None if state is None else state.value()

    async def _epochs(self, counter: str) -> Epochs:
        return await (self.epochs.get(counter) if self.epochs is not None else read_epochs(self.client, counter))

    async def get_many(self, counter: str, keys: Sequence[str]) -> dict[str, object]:
        # Once for every key: with serve's EpochsCache, kept or read once alongside the keys' first requests (each
        # key's read takes them from it: read_value); else read before them.
        epochs = None if self.epochs is not None else await self._epochs(counter)
        values = await asyncio.gather(*(self.get(counter, key, epochs) for key in keys))
        return dict(zip(keys, values, strict=True))

    async def series(self, counter: CounterDefinition | str, key: str, start: Instant, end: Instant
                     ) -> list[SeriesPoint]:
        """Each bucket of ``key`` starting in ``[start, end)``, in order, empty ones included (value None)."""
        return await self._points(counter, key, start, end, None)

    @overload
    async def rollup(self, counter: CounterDefinition | str, key: str, start: Instant, end: Instant,
                     step: None = None) -> SeriesPoint: ...

    @overload
    async def rollup(self, counter: CounterDefinition | str, key: str, start: Instant, end: Instant,
                     step: float | str) -> list[SeriesPoint]: ...

    async def rollup(self, counter: CounterDefinition | str, key: str, start: Instant, end: Instant,
                     step: float | str | None = None) -> SeriesPoint | list[SeriesPoint]:
        """The buckets of ``[start, end)`` merged into one value, or, with ``step`` (seconds or ``1d``, a
        multiple of the bucket size), one merged value per step. States merge as CRDTs: sums, counts, min,
        max, mean and variance exactly; distinct, quantiles and top-k as their sketches merge, with bounds."""
        if step is None:
            first, last = _seconds(start), _seconds(end)
            points = await self._points(counter, key, first, last, last - first, whole=True)
            return points[0]
        if isinstance(step, float):  # seconds, as an int is (an AttributeError out of the parser otherwise)
            if not step.is_integer():
                raise timeseries.TimeRangeError(f"a step is a whole number of seconds, not {step!r}")
            step = int(step)
        return await self._points(counter, key, start, end,
                                  step if isinstance(step, int) else timeseries.parse_duration(step))

    async def _points(self, counter: CounterDefinition | str, key: str, start: Instant, end: Instant,
                      step: int | None, *, whole: bool = False) -> list[SeriesPoint]:
        definition = await self._definition(counter)
        why = timeseries.why_no_series(definition, key)
        if why is not None:  # it would read buckets no event is counted in, and answer nothing counted
            raise TimeRangeError(why)
        first, last = _seconds(start), _seconds(end)
        starts = timeseries.bucket_starts(definition, first, last, self.max_range_buckets)
        if whole:
            groups = [timeseries.Step(first, last, tuple(starts))]
        else:
            groups = timeseries.steps(definition, starts, first, last, step, self.max_range_buckets)

        keys = {timeseries.bucket_key(definition, key, bucket): bucket for bucket in starts}
        names = list(keys)
        cache = self.cache

        async def read(chunk: list[str], epochs: Epochs) -> dict[str, State | None]:
            async with self._range_reads or contextlib.nullcontext(), self._reads:
                if cache is None:
                    found = await read_blobs_of(self.client, definition.name, chunk, self.consistency, epochs)
                    return {name: merge_blobs(blobs) for name, blobs in found.items()}
                # With a cache: the buckets whose stamps are unchanged since it merged them are not read again
                # (and the stamps of buckets it keeps no merge of are not read apart from their states).
                sent = time.monotonic()
                stamps = await _stamps_of_held(self.client, cache, definition.name, chunk, epochs, self.consistency)
                return await _through_cache(self.client, cache, definition.name, chunk, stamps, epochs,
                                            self.consistency, scan=True, sent=sent)

        async def read_all(of: list[str], epochs: Epochs) -> list[dict[str, State | None]]:
            return await asyncio.gather(*(read(of[i:i + _KEYS_PER_READ], epochs)
                                          for i in range(0, len(of), _KEYS_PER_READ)))

        # The counter's resets, once for every chunk of the range. When serve no longer keeps them but read them
        # before, the buckets are read in their cells of the resets last read while the resets are read again,
        # and the buckets the resets read puts in other cells (a reset since) are read again in those.
        guess = None
        if self.epochs is not None and self.epochs.kept(definition.name) is None:
            guess = self.epochs.last(definition.name)
        if guess is None:
            found = await read_all(names, await self._epochs(definition.name))
        else:
            epochs, found = await _together(self._epochs(definition.name), read_all(names, guess))
            moved = [name for name in names if epochs.cell(definition.name, name) != guess.cell(definition.name, name)]
            if moved:
                found += await read_all(moved, epochs)
        # Each bucket merged on its own (from the cache when its stamps or bytes are unchanged), then the buckets
        # of each step merged together: a merge of merges, which CRDT states allow.
        states: dict[int, list[State]] = {}
        for chunk in found:
            for name, merged in chunk.items():
                states[keys[name]] = [] if merged is None else [merged]
        return timeseries.roll_up(groups, states)

    async def _definition(self, counter: CounterDefinition | str) -> CounterDefinition:
        if isinstance(counter, CounterDefinition):
            return counter
        known, definition = await CounterRegistry(self.client, self.consistency).lookup(counter)
        if not known or definition is None:
            raise TimeRangeError(f"no counter {counter!r} in the counter registry")
        return definition

    async def explain(self, counter: str, key: str) -> Explanation:
        cell = (await read_epochs(self.client, counter)).cell(counter, key)  # its current epoch's
        rows = as_dicts(await self.client.execute(_INSTANCE, [cell] * 5 + [*shard_slice(key)],
                                                  consistency=self.consistency))
        retention = _Retention(self.client.settings.retention_grace_s, time.time() - 1)
        for row in rows:
            retention.see(row["tally_ttl"], row["state_ttl"])
        if retention.hidden:
            rows = []  # a bucket past its retention: absent, as every other read has it
        tally_blob = rows[0]["tally"] if rows else None  # the tally row comes first (schemas.cql.TALLY_ROW)
        tally = state_from_bytes(tally_blob) if tally_blob is not None else None
        # Each cell decoded once: its state is shown and merged (merging leaves its inputs unchanged).
        cells = []
        for row in rows:
            if row["cell"] is None:
                continue  # the tally row, the stamps row, or a row of another counter of the key
            blob, through_offset = shard_of_cell(row["cell"])
            cells.append((row, uuid.UUID(str(row["mutator"])), state_from_bytes(blob), through_offset))
        infos = await asyncio.gather(*(self._first_row(
            "SELECT consumer_group, topic, partition, host, born_us, retired_us, collected_us FROM mutators "
            "WHERE id = ?", [mutator]) for _, mutator, _, _ in cells))
        shards = []
        partitions: dict[tuple[str, str, int], None] = {}  # in the order the shards name them, once each
        for (row, mutator, state, through_offset), info in zip(cells, infos, strict=True):
            shards.append(ShardView(
                mutator=mutator, through_offset=through_offset, written_us=row["written_us"],
                value=state.value(), topic=info.get("topic"),
                partition=info.get("partition"), host=info.get("host"), born_us=row["born_us"],
                retired_us=info.get("retired_us"), collected_us=info.get("collected_us")))
            if info:
                partitions[(info["consumer_group"], info["topic"], info["partition"])] = None
        found_partitions = await asyncio.gather(*(self._first_row(
            "SELECT consumer_group, topic, partition, owner, window_mutator, flush_seq, committed_offset, "
            "intent_offset FROM partitions WHERE consumer_group = ? AND topic = ? AND partition = ?",
            list(ident)) for ident in partitions))
        states = [state for _, _, state, _ in cells]
        merged = merge_states(states if tally is None else [tally, *states])
        return Explanation(
            counter=counter, key=key, kind=merged.kind if merged is not None else None,
            tally=tally.value() if tally is not None else None, shards=tuple(shards),
            value=merged.value() if merged is not None else None, partitions=tuple(found_partitions))

    async def _first_row(self, cql_text: str, params: list[object]) -> dict[str, Any]:
        """The first row ``cql_text`` selects (``{}`` for none), within the reader's limit on reads in flight."""
        async with self._reads:
            found = as_dicts(await self.client.execute(cql_text, params, consistency=self.consistency))
        return found[0] if found else {}

    async def list_instances(self, counter: str, limit: int = 100, page: bytes | None = None
                             ) -> tuple[list[str], bytes | None]:
        """Instance keys of a counter, ``limit`` at a time; pass the returned page token for more.

        This walks every row of the table in token order: an operator's tool, not a hot path.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        # Keys are shared by counters, so the walk is over rows, and one key's rows may straddle two pages:
        # the token carries the last key returned, and its remaining rows are skipped.
        last, page = _split_token(page) if page else (None, None)
        keys: list[str] = []
        # A key is listed when it has a cell of its current epoch (schemas.resets): one column pair per epoch
        # in use (all keys', and those of keys reset one by one).
        epochs = await read_epochs(self.client, counter)
        # (The epoch of all keys by itself, not the empty key's: that key may have been reset on its own.)
        base = epochs.all_keys.get(counter, 0)
        cells = sorted({cell_name(counter, base), *(cell_name(counter, max(base, e)) for e in
                                                    epochs.by_key.get(counter, {}).values())})
        columns = ", ".join(f"tallies[?] AS t{i}, states[?] AS c{i}, ttl(tallies[?]) AS tt{i}, ttl(states[?]) AS ct{i}"
                            for i in range(len(cells)))
        grace = self.client.settings.retention_grace_s

        async def walk(rows: int, state: bytes | None) -> tuple[list[str], bytes | None]:
            """The keys listed in the next ``rows`` rows from ``state``, and the state after them."""
            result = await self.client.execute(
                f"SELECT part, key, {columns} FROM shards", [c for cell in cells for c in (cell,) * 4],  # noqa: S608
                consistency=self.consistency, page_size=rows, page_state=state)
            found: list[str] = []
            for row in as_dicts(result):
                key = slice_key(row["part"], row["key"])
                index = cells.index(epochs.cell(counter, key))
                # (A bucket past its retention, its rows expiring within the grace, is absent, as reads have it.)
                retention = _Retention(grace, 0.0)
                retention.see(row[f"tt{index}"], row[f"ct{index}"])
                if not retention.hidden and (row[f"t{index}"] is not None or row[f"c{index}"] is not None):
                    found.append(key)
            return found, result.page_state() if result.has_more_pages() else None

        given = page
        while len(keys) < limit:
            # A page never holds more rows than keys still wanted: the next page starts right after the last
            # row returned, so no key is skipped.
            try:
                found, page = await walk(limit - len(keys), page)
            except Exception as exc:
                # Cassandra checks the paging state the token carries: a token cut or altered is the caller's.
                if page is not None and page is given and "paging state" in str(exc):
                    raise PageTokenError("not a page token of this listing: give one countersink list printed"
                                         ) from None
                raise
            for key in found:
                if key != last:
                    keys.append(key)
                    last = key
            if page is None:
                break
        # Offer a next page only if it holds a key: look ahead past the rows of keys this counter does not have,
        # and past the last key's remaining rows. The token resumes at the look-ahead's last request, which found
        # that key: the next page does not read those rows again.
        ahead = page
        while ahead is not None:
            found, after = await walk(_LIST_LOOKAHEAD_ROWS, ahead)
            if any(key != last for key in found):
                page = ahead
                break
            ahead = after
        else:
            page = None
        return sorted(keys), None if page is None else _join_token(last, page)


# Rows per request while looking ahead for the next page's first key.
_LIST_LOOKAHEAD_ROWS = 100


def _join_token(last: str | None, page: bytes) -> bytes:
    key = (last or "").encode()
    return len(key).to_bytes(4, "big") + (b"\x01" if last is not None else b"\x00") + key + page


class PageTokenError(CountersinkError, ValueError):
    """A page token no listing printed (a usage error: exit 2)."""


def _split_token(token: bytes) -> tuple[str | None, bytes]:
    size = int.from_bytes(token[:4], "big")
    try:
        if len(token) < 5 + size:
            raise ValueError
        key = token[5:5 + size].decode()
    except ValueError:
        raise PageTokenError("not a page token of this listing: give one countersink list printed") from None
    return (key if token[4:5] == b"\x01" else None), token[5 + size:]


def to_jsonable(value: object) -> object:
    """Values as JSON: Decimals and big integers as strings (no precision lost), dataclasses as objects, and a float
    that is not finite (a float sum past the largest double, a mean of one) as the string ``"Infinity"``,
    ``"-Infinity"`` or ``"NaN"`` (as Protocol Buffers' JSON writes them): JSON has no such number, and a parser
    refuses the bare words Python would write."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: to_jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return timeseries.iso_datetime(value)
    return str(value)
