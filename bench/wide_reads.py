"""What reading a wide instance costs: one instance with a shard from each of 1, 20, 100, 256 and 1,000
mutators (a counter whose key is not the topic's message key has a shard from every partition), for a sum, a
distinct, a quantiles and a top-k, beside a plain one-row read; and range reads of wide buckets.

    python -m bench.wide_reads [--cassandra HOST:PORT] [--rounds N] [--shards 1,20,100,256,1000] [--alone | --cold]

Without ``--cassandra`` it starts a Cassandra of its own (the benchmark's ports). The shard rows are written
with ``CassandraStore.write_shards``, as the mutators' flushes would leave them, in a keyspace of its own
(dropped at the end). Each shard holds what a mutator's share of a busy instance holds: an integer sum;
2,000 values in a HyperLogLog (lg_k 12, so each sketch is in its dense mode, ~4 KiB); 2,000 values in a KLL
sketch (k 200); 2,000 events over 300 items in a frequent-items sketch (map 256). Then every read is made
``--rounds`` times, all of them interleaved in an order shuffled each round (one round unmeasured first), so
that the machine's noise falls on all alike:

- each instance through ``read_state`` with its counter's resets known (read once, as ``serve`` keeps them: a
  read is the instance's request alone, as the plain row's is), and again through a ``StateCache`` as ``serve``
  keeps one (its default size), with each counter's resets kept as serve keeps them (``EpochsCache``): nothing
  is flushed between reads, so the partition's stamps are unchanged and the cache answers after reading them
  alone;
- the 256-shard instances through the cache with a tenth of their shards flushed again just before each read
  (the cache reads those rows alone, decodes them and merges all);
- 256-shard sketch instances that also have a tally (what the GC leaves), without and with the cache;
- the instances of 100 shards and more as ``read_state`` read them before (commit 9ef4b1a); those of 256 and
  more with their rows fetched and taken apart but neither decoded nor merged (the floor of any read of every
  shard's bytes), and their mutator ids alone (the floor of any read that looks at every row);
- a series of 24 hourly buckets and a roll-up of 168 hourly buckets, 100 shards each, through
  ``CounterReader``, without and with the cache;
- the widest instances through a cache that answers up to 1 s old (``serve.max_staleness_s`` 1, off by
  default), unchanged and with a tenth of their shards flushed since the last read: within that second a read
  makes no request, and misses that flush.

Every value read is checked. Prints p50 and p99 in milliseconds and the ratio of each to the plain row's, then
the targets (256 shards within 2× the plain row at p50 and 3× at p99); ``make bench`` puts the same rows in
its report. ``--alone`` makes only the cached reads of 1 and 256 shards and the query of the stamps,
interleaved with the plain row and no heavier read: what the same reads cost off the mix. ``--cold`` makes only
first reads through serve's cache (nothing kept yet) of 1 and 100 shards, each counter's resets kept and no
longer kept (read alongside the states), interleaved with the plain row.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.cassandra import CassandraClient, as_dicts
from countersink.reader import CounterReader, read_blobs_of, read_stamps, read_state, read_value
from countersink.resets import EpochsCache, read_epochs
from countersink.settings import CassandraSettings, ServeSettings
from countersink.state_cache import StateCache
from schemas.cql import TALLY_ROW, shard_of_cell, shard_slice, stamp_source
from schemas.definitions import CounterDefinition, parse_definitions
from schemas.kinds import KindSpec, State, merge_states, new_state, state_from_bytes
from schemas.timeseries import bucket_key

SHARDS = (1, 20, 100, 256, 1000)
KINDS = ("sum", "distinct", "quantiles", "top_k")
SPECS = {"sum": KindSpec("sum"), "distinct": KindSpec("distinct", lg_k=12),
         "quantiles": KindSpec("quantiles", k=200), "top_k": KindSpec("top_k", lg_max_map_size=8, top=10)}
VALUES_PER_SHARD = 2_000
TOP_K_ITEMS = 300
# Sketches are drawn from a pool (each different): a read's cost does not depend on which sketch a shard holds,
# and filling 20,000 sketches value by value would take longer than the reads.
POOL = 32
HOUR = 3600
START = 1_795_000_000 // 86400 * 86400  # a UTC midnight in November 2026
RANGE_SHARDS = 100
BORN_US = 1_000_000
SERIES_HOURS = 24
ROLLUP_HOURS = 168
RANGE_COUNTERS = parse_definitions("""
[[counter]]
name = "wide_range_sum"
topics = ["bench-wide"]
kind = "sum"
key = ["page"]
value = "ms"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "wide_range_distinct"
topics = ["bench-wide"]
kind = "distinct"
key = ["page"]
value = "user"
bucket = { field = "ts", size = "1h" }
""")
PLAIN = "plain row"


def instance_label(kind: str, shards: int) -> str:
    return f"{kind}, {shards:,} shard{'s' if shards > 1 else ''}"


def range_labels() -> list[str]:
    return [f"{'sum' if c.kind == 'sum' else 'distinct'}, {what}" for what in
            (f"series of {SERIES_HOURS} buckets × {RANGE_SHARDS} shards",
             f"roll-up of {ROLLUP_HOURS} buckets × {RANGE_SHARDS} shards") for c in RANGE_COUNTERS]


def _pool(kind: str, rng: random.Random) -> list[bytes]:
    states = []
    for i in range(POOL):
        state = new_state(SPECS[kind])
        if kind == "distinct":
            for v in range(VALUES_PER_SHARD):
                state.apply(f"u{i}-{v}")
        elif kind == "quantiles":
            for _ in range(VALUES_PER_SHARD):
                state.apply(rng.lognormvariate(3.0, 1.0))
        elif kind == "top_k":
            for _ in range(VALUES_PER_SHARD):
                state.apply(f"item-{min(int(rng.paretovariate(1.2)), TOP_K_ITEMS)}")
        states.append(state.to_bytes())
    return states


def _sum_bytes(value: int) -> bytes:
    state = new_state(SPECS["sum"])
    state.apply(value)
    return state.to_bytes()


async def _bounded(calls: list[Callable[[], Awaitable[None]]], at_once: int = 8) -> None:
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()

    await asyncio.gather(*(worker() for _ in range(at_once)))


class Shards:
    """The mutators of the benchmark's instances, and what they wrote."""

    def __init__(self, client: CassandraClient, shards: tuple[int, ...], seed: int = 7) -> None:
        self.store = CassandraStore(client)
        self.shards = shards
        rng = random.Random(seed)
        self.pools = {kind: _pool(kind, rng) for kind in KINDS if kind != "sum"}
        self.distinct = _pool("distinct", rng)
        # Drawn from the seed: the same instances written again (make bench's mix, then its cached reads alone,
        # in one keyspace) are the same rows, not a second shard from new mutators.
        self.mutators = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(max(shards))]
        self.rewrites = 0
        # The instances flushed again between reads are instances of their own ("sum-256-flushed").
        self.widest = 256 if 256 in shards else max(shards)

    def _flush(self, i: int, writes: list[ShardWrite]) -> Callable[[], Awaitable[None]]:
        born = BORN_US + i
        # Mutator i stands for partition i's: each a source of its own (schemas.cql: a stamp each). Its write
        # timestamps grow with its flushes and are no other mutator's, as consumers' clock readings are.
        return lambda: self.store.write_shards(self.mutators[i], born, born + 1 + self.rewrites * len(self.mutators),
                                               writes,
                                               source=stamp_source("bench", "wide", i))

    async def write(self) -> None:
        """Every wide instance and every range bucket, one row per mutator: what ``max(shards)`` mutators'
        flushes leave (mutator ``i`` holds a shard of every instance wider than ``i``)."""
        flushes = []
        for i in range(max(self.shards)):
            writes = [ShardWrite(f"wide_{kind}", f"{kind}-{n}", _sum_bytes(i + 1) if kind == "sum"
                                 else self.pools[kind][i % POOL], 1, False)
                      for kind in KINDS for n in self.shards if i < n]
            writes += [ShardWrite(f"wide_{kind}", f"{kind}-{self.widest}{suffix}", _sum_bytes(i + 1)
                                  if kind == "sum" else self.pools[kind][i % POOL], 1, False)
                       for kind in KINDS for suffix in ("-flushed", "-tallied") if i < self.widest]
            if i < RANGE_SHARDS:
                for hour in range(ROLLUP_HOURS):
                    for definition in RANGE_COUNTERS:
                        key = bucket_key(definition, "home", START + hour * HOUR)
                        state = (_sum_bytes(i + 1) if definition.kind == "sum"
                                 else self.distinct[(i + hour) % POOL])
                        writes.append(ShardWrite(definition.name, key, state, 1, False))
            flushes.append(self._flush(i, writes))
        await _bounded(flushes)
        # What the GC leaves when it has folded retired mutators: a tally, which Cassandra repeats on every row.
        for kind in TALLIED:
            await self.store.client.execute(
                "UPDATE shards SET tallies = tallies + ? WHERE part = ? AND key = ? AND born_us = ? AND mutator = ?",
                [{f"wide_{kind}": self.pools[kind][-1]}, *shard_slice(f"{kind}-{self.widest}-tallied"), *TALLY_ROW])

    async def rewrite(self, kind: str, every: int) -> None:
        """Every ``every``-th shard of the widest ``-flushed`` instance of ``kind`` flushed again, with other
        bytes (the same value for a sum): what a read meets after some of the instance's partitions flushed."""
        self.rewrites += 1
        flushes = []
        for i in range(self.rewrites % every, self.widest, every):
            state = _sum_bytes(i + 1) if kind == "sum" else self.pools[kind][(i + self.rewrites) % POOL]
            key = f"{kind}-{self.widest}-flushed"
            flushes.append(self._flush(i, [ShardWrite(f"wide_{kind}", key, state, 1, False)]))
        await _bounded(flushes)


async def previous_read_state(client: CassandraClient, counter: str, key: str) -> State | None:
    """How ``read_state`` read one instance before wide reads were made cheap (commit 9ef4b1a): a dict per
    row, every state decoded on its own, then merged. Kept to compare with, in the same run."""
    rows = as_dicts(await client.execute(
        "SELECT key, tallies[?] AS tally, states[?] AS cell, ttl(tallies[?]) AS tally_ttl, "
        "ttl(states[?]) AS state_ttl FROM shards WHERE part = ? AND key = ?", [counter] * 4 + [*shard_slice(key)],
        consistency=client.settings.read_consistency))
    grace = client.settings.retention_grace_s
    if any(ttl is not None and ttl <= grace for row in rows for ttl in (row["tally_ttl"], row["state_ttl"])):
        return None
    blobs = ([rows[0]["tally"]] if rows and rows[0]["tally"] is not None else []) + [
        shard_of_cell(row["cell"])[0] for row in rows if row["cell"] is not None]
    return merge_states([state_from_bytes(blob) for blob in blobs if blob is not None])


def _check(kind: str, shards: int, state: State | None) -> None:
    _check_value(kind, shards, None if state is None else state.value())


async def _cached(client: CassandraClient, cache: StateCache, epochs: EpochsCache, kind: str, key: str,
                  states: int, *, stale: bool = False) -> None:
    """Read instance ``key`` of ``kind`` (``states`` stored states) as serve does (``read_value``: through its
    cache, with its kept resets) and check its value (``stale``: a sum's may be that of a flush before)."""
    found = await read_value(client, f"wide_{kind}", key, client.settings.read_consistency, cache, epochs)
    if not (stale and kind == "sum"):  # a rewritten sum's shards keep their values: the check holds anyway
        _check_value(kind, states, None if found is None else found[1])
    elif found is None:
        raise RuntimeError(f"nothing read of {key}")


def _check_value(kind: str, shards: int, value: object) -> None:
    if kind == "sum":
        ok = value == shards * (shards + 1) // 2
    elif kind == "distinct":
        ok = value is not None and value.estimate > 0  # type: ignore[attr-defined]
    elif kind == "quantiles":
        ok = value is not None and value.count == shards * VALUES_PER_SHARD  # type: ignore[attr-defined]
    else:
        ok = value is not None and value.total_weight == shards * VALUES_PER_SHARD  # type: ignore[attr-defined]
    if not ok:
        raise RuntimeError(f"the {shards}-shard {kind} instance reads {value!r}")


CACHED = ", cached"
# Sketch instances with a tally as large as a shard (the sum's is a few bytes).
TALLIED = ("distinct", "quantiles", "top_k")
TALLY = ", and a tally"
PREVIOUS = ", as read before (9ef4b1a)"
# The same request and rows, the stored states taken from them but neither decoded nor merged: the floor.
FETCH_ONLY = ", rows fetched only"
# The rows' mutator ids alone, no state: what any read that looks at every row costs at least (Cassandra reads
# the rows whole), e.g. a cache checked against each shard's write time.
IDS_ONLY = ", mutator ids only"
# A tenth of the shards flushed again before each read: the cache reads those rows, decodes them and merges all.
REWRITE_EVERY = 10
REWRITTEN = f", cached, 1 in {REWRITE_EVERY} shards flushed since the last read"
# serve with max_staleness_s 1 (off by default): a read within a second of the last check of the stamps answers
# the kept merge without a request, and may miss what was flushed in that second.
STALENESS_S = 1.0
STALE = f", cached, answers up to {STALENESS_S:g} s old"
STALE_REWRITTEN = f"{STALE}, 1 in {REWRITE_EVERY} shards flushed since the last read"


async def _plain_row(client: CassandraClient) -> Callable[[], Awaitable[None]]:
    """The plain one-row read every figure is compared with, its table made and its row written."""
    await client.execute("CREATE TABLE IF NOT EXISTS plain_values (k text PRIMARY KEY, v bigint)", prepared=False)
    await client.execute("INSERT INTO plain_values (k, v) VALUES ('one', 1)", prepared=False)
    level = client.settings.read_consistency

    async def plain() -> None:
        await client.execute("SELECT v FROM plain_values WHERE k = ?", ["one"], consistency=level)
    return plain


async def wide_latencies(cassandra: CassandraSettings, rounds: int, shards: tuple[int, ...] = SHARDS,
                         seed: int = 7) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of the plain row, every wide instance and every range read, ``rounds`` times,
    interleaved in an order shuffled each round; each read without a state cache and with one (serve's, of
    the default size)."""
    async with CassandraClient(cassandra) as client:
        written = Shards(client, shards, seed)
        await written.write()
        cache = StateCache(ServeSettings().state_cache_bytes)
        epochs = EpochsCache(client)  # as serve keeps each counter's resets (countersink.resets)
        stale_cache, stale_epochs = StateCache(ServeSettings().state_cache_bytes, max_staleness_s=STALENESS_S), \
            EpochsCache(client)
        readers = {"": CounterReader(client), CACHED: CounterReader(client, cache=cache, epochs=epochs)}
        # Each counter's resets, read once: serve keeps them (and reads them alongside the states when it no longer
        # does), so a read of a wide instance is its own request, compared with the plain row's.
        known = {f"wide_{kind}": await read_epochs(client, f"wide_{kind}") for kind in KINDS}
        level = client.settings.read_consistency
        widest = written.widest
        series, rollup = range_labels()[:2], range_labels()[2:]
        reads: dict[str, Callable[[], Awaitable[None]]] = {}
        plain = await _plain_row(client)

        def instance(kind: str, n: int, suffix: str, which: str = "") -> Callable[[], Awaitable[None]]:
            states = n + 1 if which == "-tallied" else n  # a tally holds as many values as a shard

            async def read() -> None:
                if suffix == STALE:
                    await _cached(client, stale_cache, stale_epochs, kind, f"{kind}-{n}{which}", states, stale=True)
                elif suffix == CACHED:
                    await _cached(client, cache, epochs, kind, f"{kind}-{n}{which}", states)
                else:
                    _check(kind, states, await read_state(client, f"wide_{kind}", f"{kind}-{n}{which}", level,
                                                          epochs=known[f"wide_{kind}"]))
            return read

        def ranged(definition: CounterDefinition, name: str, suffix: str) -> Callable[[], Awaitable[None]]:
            hours = SERIES_HOURS if name in series else ROLLUP_HOURS

            async def read() -> None:
                reader = readers[suffix]
                if hours == SERIES_HOURS:
                    points = await reader.series(definition, "home", START, START + hours * HOUR)
                    counted = [p.buckets_counted for p in points]
                    if counted != [1] * hours:
                        raise RuntimeError(f"{name}: {counted}")
                    return
                point = await reader.rollup(definition, "home", START, START + hours * HOUR)
                total = hours * RANGE_SHARDS * (RANGE_SHARDS + 1) // 2
                if point.buckets_counted != hours or (definition.kind == "sum" and point.value != total):
                    raise RuntimeError(f"{name}: {point.buckets_counted} buckets, {point.value!r}")
            return read

        def fetch_only(kind: str, n: int) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                if not await read_blobs_of(client, f"wide_{kind}", [f"{kind}-{n}"], level, known[f"wide_{kind}"]):
                    raise RuntimeError(f"nothing read of {kind}-{n}")
            return read

        def ids_only(kind: str, n: int) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                result = await client.execute("SELECT mutator FROM shards WHERE part = ? AND key = ?",
                                              list(shard_slice(f"{kind}-{n}")), consistency=level)
                if len([row.as_tuple() for row in result]) < n:
                    raise RuntimeError(f"fewer than {n} rows of {kind}-{n}")
            return read

        def previous(kind: str, n: int) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                _check(kind, n, await previous_read_state(client, f"wide_{kind}", f"{kind}-{n}"))
            return read

        reads[PLAIN] = plain
        reads.update({instance_label(kind, n) + PREVIOUS: previous(kind, n) for kind in KINDS for n in shards
                      if n >= RANGE_SHARDS})
        reads.update({instance_label(kind, n) + IDS_ONLY: ids_only(kind, n)
                      for kind in KINDS for n in shards if n >= widest})
        reads.update({instance_label(kind, n) + FETCH_ONLY: fetch_only(kind, n)
                      for kind in KINDS for n in shards if n >= widest})
        for suffix in ("", CACHED):
            reads.update({instance_label(kind, n) + suffix: instance(kind, n, suffix)
                          for kind in KINDS for n in shards})
            for definition, name in zip([*RANGE_COUNTERS, *RANGE_COUNTERS], series + rollup, strict=True):
                reads[name + suffix] = ranged(definition, name, suffix)
        for suffix in ("", CACHED):
            reads.update({instance_label(kind, widest) + TALLY + suffix: instance(kind, widest, suffix, "-tallied")
                          for kind in TALLIED})
        reads.update({instance_label(kind, widest) + STALE: instance(kind, widest, STALE) for kind in KINDS})
        rewritten = {instance_label(kind, widest) + REWRITTEN: (kind, instance(kind, widest, CACHED, "-flushed"))
                     for kind in KINDS}
        rewritten.update({instance_label(kind, widest) + STALE_REWRITTEN: (kind, instance(kind, widest, STALE,
                                                                                           "-flushed"))
                          for kind in KINDS})
        timings: dict[str, list[float]] = {name: [] for name in [*reads, *rewritten]}
        rng = random.Random(seed)
        # One round unmeasured first: statements prepared, connections, Cassandra's and the cache warm.
        for measured in [False] + [True] * rounds:
            order = list(reads.items()) + [(name, read) for name, (_, read) in rewritten.items()]
            rng.shuffle(order)
            for name, read in order:
                if name in rewritten:
                    await read()  # the cache holds the instance as it is now
                    await written.rewrite(rewritten[name][0], REWRITE_EVERY)
                started = time.perf_counter()
                await read()
                if measured:
                    timings[name].append(time.perf_counter() - started)
    return {name: (1000 * statistics.median(t), 1000 * statistics.quantiles(t, n=100)[98])
            for name, t in timings.items()}


STAMPS_ALONE = ", its stamps alone (the query)"


async def alone_latencies(cassandra: CassandraSettings, rounds: int, widest: int = 256, seed: int = 7
                          ) -> dict[str, tuple[float, float]]:
    """The cached reads of 1 and ``widest`` shards of every kind, and the query of the widest sum's stamps
    alone, interleaved (shuffled each round) with the plain row and nothing else: what the cached read costs
    where no heavier read shares the machine, beside what it costs in :func:`wide_latencies`' mix."""
    async with CassandraClient(cassandra) as client:
        await Shards(client, (1, widest), seed).write()
        plain = await _plain_row(client)
        cache, epochs = StateCache(ServeSettings().state_cache_bytes), EpochsCache(client)
        level = client.settings.read_consistency

        async def stamps() -> None:
            if (await read_stamps(client, [f"sum-{widest}"], level))[f"sum-{widest}"] is None:
                raise RuntimeError(f"no stamps for sum-{widest}")

        def cached(kind: str, n: int) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                await _cached(client, cache, epochs, kind, f"{kind}-{n}", n)
            return read

        from bench.wide_layouts import interleaved  # (wide_layouts imports this module)

        reads = {PLAIN: plain, instance_label("sum", widest) + STAMPS_ALONE: stamps,
                 **{instance_label(kind, n) + CACHED: cached(kind, n) for kind in KINDS for n in (1, widest)}}
        return await interleaved(reads, rounds, seed)


COLD_KEPT = ", first read through the cache, resets kept"
COLD_GUESSED = ", first read through the cache, resets read alongside"


async def cold_latencies(cassandra: CassandraSettings, rounds: int, shards: tuple[int, ...] = (1, 100), seed: int = 7
                         ) -> dict[str, tuple[float, float]]:
    """Instances read as ``serve`` reads one its state cache keeps no merge of (``read_value`` through an empty
    cache of the default size), each counter's resets kept (read once before), and no longer kept but read before
    (so read alongside the states), interleaved (shuffled each round) with the plain row."""
    async with CassandraClient(cassandra) as client:
        await Shards(client, shards, seed).write()
        plain = await _plain_row(client)
        level = client.settings.read_consistency
        kept = EpochsCache(client, kept_s=86_400.0)
        guessed = EpochsCache(client, kept_s=1e-6)  # expired at once: each read has only the last read's
        for kind in KINDS:
            await kept.get(f"wide_{kind}")
            await guessed.get(f"wide_{kind}")

        def cold(kind: str, n: int, epochs: EpochsCache) -> Callable[[], Awaitable[None]]:
            async def read() -> None:
                found = await read_value(client, f"wide_{kind}", f"{kind}-{n}", level,
                                         StateCache(ServeSettings().state_cache_bytes), epochs)
                _check_value(kind, n, None if found is None else found[1])
            return read

        from bench.wide_layouts import interleaved  # (wide_layouts imports this module)

        reads = {PLAIN: plain}
        for kind in KINDS:
            for n in shards:
                reads[instance_label(kind, n) + COLD_KEPT] = cold(kind, n, kept)
                reads[instance_label(kind, n) + COLD_GUESSED] = cold(kind, n, guessed)
        return await interleaved(reads, rounds, seed)


async def read_loop(cassandra: CassandraSettings, kind: str, shards: int, seconds: float, cached: bool
                    ) -> dict[str, tuple[float, float]]:
    """One instance read back to back for ``seconds``, after it is written, nothing else interleaved: what a
    profiler samples. Returns the loop's p50 and p99 under its name."""
    async with CassandraClient(cassandra) as client:
        await Shards(client, (shards,)).write()
        cache = StateCache(ServeSettings().state_cache_bytes) if cached else None
        epochs = EpochsCache(client) if cached else None
        known = await read_epochs(client, f"wide_{kind}")  # as serve keeps them
        level = client.settings.read_consistency
        timings: list[float] = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.perf_counter()
            if cache is not None and epochs is not None:
                await _cached(client, cache, epochs, kind, f"{kind}-{shards}", shards)
            else:
                _check(kind, shards, await read_state(client, f"wide_{kind}", f"{kind}-{shards}", level,
                                                      epochs=known))
            timings.append(time.perf_counter() - started)
    label = instance_label(kind, shards) + (CACHED if cached else "") + f" ({len(timings)} reads back to back)"
    return {label: (1000 * statistics.median(timings), 1000 * statistics.quantiles(timings, n=100)[98])}


def table(latencies: dict[str, tuple[float, float]]) -> list[str]:
    """The figures as Markdown rows: p50, p99, and each as a multiple of the plain row's."""
    plain50, plain99 = latencies[PLAIN]
    lines = ["| read | p50 ms | p99 ms | p50 × plain row | p99 × plain row |", "|---|---:|---:|---:|---:|"]
    for name, (p50, p99) in latencies.items():
        lines.append(f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / plain50:.1f} | {p99 / plain99:.1f} |")
    return lines


def targets(latencies: dict[str, tuple[float, float]]) -> list[str]:
    """Each 256-shard instance against its targets (≤ 2× the plain row at p50, ≤ 3× at p99), read without and
    with the state cache."""
    plain50, plain99 = latencies[PLAIN]
    lines = []
    for kind in KINDS:
        for suffix, how in (("", "uncached"), (CACHED, "cached"), (PREVIOUS, "as read before"),
                            (FETCH_ONLY, "its rows alone"), (STALE, f"cached, answers up to {STALENESS_S:g} s old "
                                                                    "(serve.max_staleness_s, off by default)"),
                            (STALE_REWRITTEN, f"cached, answers up to {STALENESS_S:g} s old, flushed since")):
            figures = latencies.get(instance_label(kind, 256) + suffix)
            if figures is not None:
                ok = figures[0] <= 2 * plain50 and figures[1] <= 3 * plain99
                # Two decimals: a read at 2.03× the plain row would print as a missed "2.0×" with one.
                lines.append(f"{kind}, 256 shards, {how}: {figures[0] / plain50:.2f}× at p50 (≤ 2), "
                             f"{figures[1] / plain99:.2f}× at p99 (≤ 3): {'met' if ok else 'missed'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wide_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="a running Cassandra (default: start one)")
    parser.add_argument("--rounds", type=int, default=150, help="reads of each instance (default 150)")
    parser.add_argument("--shards", default=",".join(map(str, SHARDS)),
                        help="shard counts of the instances, comma-separated (default %(default)s)")
    parser.add_argument("--alone", action="store_true",
                        help="only the cached reads of 1 and 256 shards and the stamps query, interleaved with the "
                             "plain row and nothing heavier")
    parser.add_argument("--cold", action="store_true",
                        help="only first reads through serve's cache (nothing kept) of 1 and 100 shards, the resets "
                             "kept and read alongside, interleaved with the plain row")
    parser.add_argument("--loop", metavar="KIND:SHARDS:SECONDS[:cached]",
                        help="only read that instance over and over for that long (to sample with py-spy), "
                             "e.g. quantiles:256:10:cached")
    args = parser.parse_args(argv)
    shards = tuple(sorted({int(n) for n in args.shards.split(",")} | {RANGE_SHARDS}))
    keyspace = f"bench_wide_{uuid.uuid4().hex[:8]}"

    async def run(host: str, port: int) -> dict[str, tuple[float, float]]:
        settings = CassandraSettings(contact_points=[host], port=port, keyspace=keyspace)
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.ensure_schema()
        try:
            if args.loop:
                kind, n, seconds, *cached = args.loop.split(":")
                return await read_loop(settings, kind, int(n), float(seconds), bool(cached))
            if args.alone:
                return await alone_latencies(settings, args.rounds)
            if args.cold:
                return await cold_latencies(settings, args.rounds)
            return await wide_latencies(settings, args.rounds, shards)
        finally:
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)

    if args.cassandra:
        host, _, port = args.cassandra.rpartition(":")
        latencies = asyncio.run(run(host, int(port)))
    else:
        from bench.pipeline import ROOT, bench_servers

        with bench_servers(ROOT / ".stack" / "bench-wide", kafka_port=29092, native_port=29042, storage_port=27000,
                           jmx_port=27199, cluster_name="countersink-bench-wide"):
            latencies = asyncio.run(run("127.0.0.1", 29042))
    if args.loop:
        print("\n".join(f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms" for name, (p50, p99) in latencies.items()))
        return 0
    print("\n".join(table(latencies)))
    if not (args.alone or args.cold):  # the targets name reads these runs do not make
        print("\n".join(targets(latencies)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
