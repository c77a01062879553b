"""The GC: fold the shards of retired mutators into each key's tallies, safely and without coordination.

A mutator is *final* once retired before ``now - grace``. Rows of ``shards`` are ordered by the birth time
of their mutator, so the GC deletes what it folds with range tombstones over birth times instead of a
tombstone per cell: the births of the mutators that are not final (and the cutoff itself, above which
mutators not yet registered will be born) cut the time line into *gaps*, and every row born strictly inside a
gap belongs to a final mutator, now and later. For every final mutator not yet collected, the GC pages through the
instances it wrote (``mutator_work``) and folds each key they name once: read the key's partition (at CL ALL
by default), fold every row inside a gap into the tallies of the counters it holds, and write the new
tallies and one range tombstone per gap it found rows in (``DELETE ... WHERE part = ? AND key = ? AND born_us > a AND
born_us < b``) in one single-partition batch ``USING TIMESTAMP T``, T the latest retire time of all final
mutators. (A final mutator born at the very microsecond of a live one sits on a bound: its row is folded too,
and deleted on its own.) Cassandra applies such a batch atomically and
in isolation, so a reader sees the key before it or after it, never a mix.

Why reads stay cheap: the next run's gaps contain this run's (a mutator final now stays final, so the
points cutting the line only go away, and the cutoff only moves on), and T only grows, so each range
tombstone of a key is covered by the next one written there at a later timestamp. Cassandra merges them as
it reads: a key carries two range markers per mutator that stayed live while later ones were folded, and
two in all in the steady state, whatever the number of partitions, counters and rotations (schema 2's cell
tombstones grew by partitions x counters every rotation; ``python -m bench.tombstones``).

Why several workers at once are safe (seed 000's argument with the retire time for the expiry): a later run
can only see more final mutators, which retired later, so its timestamp is higher, its gaps contain the
earlier run's, and its tallies include everything the earlier run folded; repeating a batch writes the same
cells at the same timestamp; a late write of a retired mutator carries ``born_us + flush_seq``, below its
retire time, and stays under the deletion. The grace period must exceed the clock skew between machines, so
that no mutator still to be retired can get a retire time below a cutoff that a run has already used. No
mutator still to be registered keeps a birth time below one, however late its registration lands: a run records
its cutoff before it reads the registry, and a claimant reads the cutoffs once registered (a quorum write, a
SERIAL read: one of the two sees the other, as the run's read of the registry and the registration do) and,
born at or below one, retires unused (consumer.protocol.Claimant). A worker whose clock is ahead of Cassandra's
by more than the grace records nothing and folds nothing (its cutoff would hold every birth ahead of time).

All of this needs the fold to be built from one consistent view of the key: its tallies and its rows as
they were at one moment. One request gives that (Cassandra answers a single-partition read in isolation from a
single-partition batch), but a key with more rows than a page takes several, and another worker's fold
can land between two of them. Built from tallies from before that fold and rows from after it, our fold
drops the shards the other one folded (our later timestamp overwrites its tallies); from rows before and the
tallies after, it counts them twice. So a read of more than one page takes the tallies as of its first request
and, once the last page is in, reads the tallies alone again. A tally cell only ever gives way to one with a
later timestamp (or, at the same timestamp, larger bytes), so the same bytes and write times before and after
mean they were current throughout: no fold that changed them landed in between. The rows read while those
tallies were current are not in them, and a final row cannot appear later, so the view is what one request
at any moment in between would have returned, and the timestamp argument above holds as it stands. If the
tallies changed, the key is read again (the other worker has usually finished it by then); after a few tries
it is deferred. The fold itself stays unconditional: Cassandra refuses ``USING TIMESTAMP`` on a conditional
(LWT) batch, and that timestamp is what makes concurrent folds and late writes safe. Nor is the read made
one large page: the rows of a key have no fixed bound.

Four checks turn a broken assumption into a deferral instead of a lost or double-counted event:
- a row inside a gap whose mutator the registry does not know as final (or knows with another birth time)
  would be deleted unfolded;
- a row whose write time is not below its mutator's retire time would survive the deletion;
- a tally written at or after our timestamp means another run folded later shards but not these;
- tallies that keep changing while the pages are read (a busy key, retried a few times first).
All four leave the key as it is (its values stay right: the shards still count) and are reported.

Storage is reached through :class:`GcStore`, so the model test runs this code against its in-memory
Cassandra.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from countersink.logs import get_logger
from countersink.retry import is_retriable
from schemas.errors import CountersinkError
from schemas.kinds import merge_stored
from schemas.resets import Epochs, split_cell

log = get_logger(__name__)

Instance = tuple[str, str]  # (counter, key)
Range = tuple[int | None, int]  # births strictly between the two (None: from the first), as deleted
Row = tuple[int, uuid.UUID]  # (born_us, mutator): one row, deleted on its own


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
    """One row of the mutator registry, as the GC needs it."""

    id: uuid.UUID
    consumer_group: str
    topic: str
    partition: int
    born_us: int
    expires_us: int
    retired_us: int | None
    collected_us: int | None


@dataclasses.dataclass(frozen=True)
class ShardView:
    """One row of a key's partition: one mutator's state of each counter it wrote there."""

    mutator: uuid.UUID
    born_us: int
    states: Mapping[str, bytes]  # counter -> state bytes
    write_us: int  # the latest write time of its cells
    ttls: Mapping[str, int | None]  # counter -> seconds its cell has left (None: it never expires)


@dataclasses.dataclass(frozen=True)
class KeyView:
    """A whole-partition read of one key: each counter's tally with its write time, and every visible row.

    ``pages`` is how many requests the read took (one while the rows fit one page)."""

    tallies: Mapping[str, bytes]
    tally_write_us: Mapping[str, int]
    shards: tuple[ShardView, ...]
    pages: int = 1
    tally_ttls: Mapping[str, int | None] = dataclasses.field(default_factory=dict)


class GcStore(Protocol):
    """Storage operations of the GC."""

    async def read_registry(self) -> list[RegistryEntry]:
        """Every mutator of the registry (all consumer groups)."""
        ...

    def read_work(self, mutator: uuid.UUID) -> AsyncIterator[Sequence[Instance]]:
        """The instances ``mutator`` wrote, a page at a time."""
        ...

    async def read_key(self, key: str) -> KeyView:
        """The whole partition of one key, at the GC's read consistency; if it takes more than one request,
        the tallies as of the first."""
        ...

    async def read_tallies(self, key: str) -> tuple[Mapping[str, bytes], Mapping[str, int]]:
        """The tallies of one key and their write times, in one request at the GC's read consistency."""
        ...

    async def fold(self, key: str, tallies: Mapping[str, tuple[bytes, int | None]], ranges: Sequence[Range],
                   rows: Sequence[Row], timestamp_us: int) -> None:
        """One single-partition batch at ``timestamp_us``: set each counter's tally (with its TTL in seconds,
        or none), delete the rows born within each range, and each of ``rows``."""
        ...

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None: ...

    async def record_cutoff(self, cutoff_us: int) -> None:
        """Record that a run takes births up to ``cutoff_us`` for final mutators' unless registered (never
        lowering an earlier run's): a claimant reads it once registered, and one born at or below it retires
        unused (consumer.protocol.Claimant)."""
        ...

    async def forget(self, mutator: uuid.UUID) -> None:
        """Delete a long-collected mutator's registry row and work list."""
        ...


@dataclasses.dataclass(frozen=True)
class Gaps:
    """Where a run may delete rows: the births strictly between two consecutive *bounds*, the births of
    mutators that are not final and the run's cutoff (a mutator registered later is born after it)."""

    bounds: tuple[int, ...]  # sorted, distinct; the last is the cutoff

    @classmethod
    def of(cls, registry: Sequence[RegistryEntry], final: Mapping[uuid.UUID, int], cutoff_us: int) -> Gaps:
        live = {e.born_us for e in registry if e.id not in final and e.born_us < cutoff_us}
        return cls(tuple(sorted(live | {cutoff_us})))

    def range_of(self, born_us: int) -> Range | None:
        """The gap holding ``born_us``, or None when it is a bound or past the cutoff."""
        at = bisect.bisect_left(self.bounds, born_us)
        if at == len(self.bounds) or self.bounds[at] == born_us:
            return None
        return (self.bounds[at - 1] if at else None), self.bounds[at]


class Verdict(enum.Enum):
    FOLDED = "folded"
    NOTHING = "nothing"  # no final shard left (folded already, by this run or another)
    DEFERRED = "deferred"  # try again next run: a replica was unavailable, or a safety check failed


@dataclasses.dataclass
class GcReport:
    """What one run did (or, in a dry run, would do)."""

    dry_run: bool = False
    mutators_final: int = 0  # retired before the cutoff and not yet collected: this run's work
    mutators_waiting: int = 0  # retired, but within the grace period
    mutators_collected: int = 0
    mutators_forgotten: int = 0
    instances_checked: int = 0  # keys read (each key's counters are folded together)
    instances_folded: int = 0  # tallies written
    shards_deleted: int = 0  # states folded (one per counter and row)
    instances_deferred: int = 0  # keys left as they were
    deferred: list[str] = dataclasses.field(default_factory=list)  # the first few, for the log and the CLI

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_DEFERRED_SHOWN = 20
_READ_ATTEMPTS = 3  # reads of a key whose tallies change between its pages, before deferring it


@dataclasses.dataclass(frozen=True)
class _Run:
    """What one run decided from the registry: the final mutators (id -> retire time), their births, the
    gaps, and the timestamp of every fold."""

    final: Mapping[uuid.UUID, int]
    born: Mapping[uuid.UUID, int]
    gaps: Gaps
    timestamp_us: int


class Collector:
    """One GC worker. :meth:`run` is one pass; call it from cron or in a loop.

    ``retriable`` says which storage errors mean "not now" (a replica down for a CL ALL read, a timeout: by
    default, what the error itself says is retriable): the key is deferred and the run goes on. Any
    other error ends the run.
    ``concurrency`` keys are worked on at once; 1 runs strictly in order, with no asyncio tasks.
    """

    def __init__(
        self,
        store: GcStore,
        grace_us: int,
        *,
        retriable: Callable[[BaseException], bool] = is_retriable,
        dry_run: bool = False,
        concurrency: int = 16,
        forget_after_us: int | None = None,
        progress: Callable[[int, int, GcReport], None] | None = None,
        epochs_of: Callable[[str], Awaitable[Epochs]] | None = None,
    ) -> None:
        """``epochs_of`` (a counter's current epochs, ``schemas.resets``): cells of an epoch a reset has ended
        are deleted with their rows without being folded (nobody reads them again); None folds every cell."""
        if grace_us < 0:
            raise ValueError("grace must not be negative")
        self.store = store
        self.grace_us = grace_us
        self.retriable = retriable
        self.dry_run = dry_run
        self.concurrency = max(1, concurrency)
        self.forget_after_us = forget_after_us
        self.progress = progress
        self.epochs_of = epochs_of
        self._epochs: dict[str, Epochs] = {}  # per run: a reset recorded since only ends more epochs

    async def run(self, now_us: int) -> GcReport:
        report = GcReport(dry_run=self.dry_run)
        self._epochs = {}
        cutoff = now_us - self.grace_us
        if not self.dry_run:
            # Before the registry is read: a mutator whose registration this read misses then sees the cutoff.
            await self.store.record_cutoff(cutoff)
        registry = await self.store.read_registry()
        # Every shard of a mutator in ``final`` is final: collected ones too (a late write of theirs may show).
        final = {e.id: e.retired_us for e in registry if e.retired_us is not None and e.retired_us < cutoff}
        gaps = Gaps.of(registry, final, cutoff)
        plan = _Run(final, {e.id: e.born_us for e in registry}, gaps, max(final.values(), default=0))
        todo = sorted((e for e in registry if e.id in final and e.collected_us is None),
                      key=lambda e: (e.retired_us or 0, str(e.id)))
        report.mutators_final = len(todo)
        report.mutators_waiting = sum(1 for e in registry if e.retired_us is not None and e.retired_us >= cutoff)
        # Keys already handled in this run need no second read for the next mutator that wrote them; a key
        # deferred once is not tried again in the same run, and holds back every mutator in it.
        handled: set[str] = set()
        deferred: set[str] = set()
        for done, entry in enumerate(todo):
            if self.progress:
                self.progress(done, len(todo), report)
            complete = True
            async for page in self.store.read_work(entry.id):
                keys = list(dict.fromkeys(key for _, key in page))
                if any(k in deferred for k in keys):
                    complete = False
                fresh = [k for k in keys if k not in handled and k not in deferred]
                verdicts = await self._fold_all(fresh, plan, report)
                for key, verdict in zip(fresh, verdicts, strict=True):
                    if verdict is Verdict.DEFERRED:
                        deferred.add(key)
                        complete = False
                    else:
                        handled.add(key)
                if len(handled) > 1_000_000:
                    handled.clear()  # bounded memory; at worst some keys are read again
                if self.progress:
                    # within a mutator too: one that wrote millions of instances takes minutes to fold
                    self.progress(done, len(todo), report)
            if complete:
                if not self.dry_run:
                    await self.store.mark_collected(entry.id, now_us)
                report.mutators_collected += 1
                log.info("mutator_collected", mutator=str(entry.id), topic=entry.topic, partition=entry.partition,
                         dry_run=self.dry_run)
        if self.progress:
            self.progress(len(todo), len(todo), report)
        if self.forget_after_us is not None:
            await self._forget(registry, now_us - self.forget_after_us, report)
        return report

    async def _ended(self, cell: str, key: str) -> bool:
        """Whether ``cell`` of instance key ``key`` belongs to an epoch a reset has ended."""
        counter, epoch = split_cell(cell)
        if self.epochs_of is None:
            return False
        epochs = self._epochs.get(counter)
        if epochs is None:
            epochs = self._epochs[counter] = await self.epochs_of(counter)
        return epoch < epochs.epoch(counter, key)

    async def _fold_all(self, keys: Sequence[str], plan: _Run, report: GcReport) -> list[Verdict]:
        if self.concurrency == 1:
            return [await self._fold_key(key, plan, report) for key in keys]
        slots = asyncio.Semaphore(self.concurrency)

        async def bounded(key: str) -> Verdict:
            async with slots:
                return await self._fold_key(key, plan, report)

        return list(await asyncio.gather(*(bounded(key) for key in keys)))

    async def _fold_key(self, key: str, plan: _Run, report: GcReport) -> Verdict:
        """Fold every row of one key that a final mutator wrote into its tallies, or say why not."""
        report.instances_checked += 1
        try:
            view = await self._read_consistent(key)
            if view is None:
                return self._defer(report, key, "changed_while_read", attempts=_READ_ATTEMPTS)
            # Rows inside a gap go by range; a final mutator born at the very microsecond of a live one (a
            # bound) has its row deleted on its own.
            folded = [s for s in view.shards if plan.gaps.range_of(s.born_us) is not None or s.mutator in plan.final]
            if not folded:
                return Verdict.NOTHING
            strangers = [s for s in folded if s.mutator not in plan.final or plan.born[s.mutator] != s.born_us]
            if strangers:
                return self._defer(report, key, "shard_of_no_final_mutator",
                                   mutators=[str(s.mutator) for s in strangers])
            late = [s for s in folded if s.write_us >= plan.final[s.mutator]]
            if late:
                return self._defer(report, key, "shard_written_after_retirement",
                                   mutators=[str(s.mutator) for s in late])
            counters = [cell for cell in sorted({cell for s in folded for cell in s.states})
                        if not await self._ended(cell, key)]
            newer = {c: view.tally_write_us[c] for c in counters
                     if view.tally_write_us.get(c, -1) >= plan.timestamp_us}
            if newer:
                return self._defer(report, key, "tally_newer_than_fold", tally_write_us=newer,
                                   fold_us=plan.timestamp_us)
            tallies = {}
            for counter in counters:
                merged = merge_stored([view.tallies.get(counter), *(s.states.get(counter) for s in folded)])
                if merged is not None:
                    tallies[counter] = (merged.to_bytes(), _ttl_of(view, counter))
            gaps = {gap for s in folded if (gap := plan.gaps.range_of(s.born_us)) is not None}
            ranges = sorted(gaps, key=lambda gap: gap[1])
            rows = [(s.born_us, s.mutator) for s in folded if plan.gaps.range_of(s.born_us) is None]
            if not self.dry_run:
                await self.store.fold(key, tallies, ranges, rows, plan.timestamp_us)
        except (CountersinkError, TypeError, ValueError, OSError) as exc:
            if self.retriable(exc):
                return self._defer(report, key, "storage_unavailable", error=str(exc))
            if isinstance(exc, OSError):
                raise
            # States that cannot be merged (corrupt bytes, a kind changed in place): never guess.
            return self._defer(report, key, "unmergeable", error=f"{type(exc).__name__}: {exc}")
        report.instances_folded += len(tallies)
        report.shards_deleted += sum(len(s.states) for s in folded)
        return Verdict.FOLDED

    async def _read_consistent(self, key: str) -> KeyView | None:
        """The key as one consistent view (see the module's notes), or None if it kept changing."""
        for _ in range(_READ_ATTEMPTS):
            view = await self.store.read_key(key)
            if view.pages <= 1 or await self.store.read_tallies(key) == (view.tallies, view.tally_write_us):
                return view
        return None

    def _defer(self, report: GcReport, key: str, reason: str, **detail: object) -> Verdict:
        report.instances_deferred += 1
        if len(report.deferred) < _DEFERRED_SHOWN:
            report.deferred.append(f"{key}: {reason}")
        # Expected while a replica is down or other workers fold the same key; anything else means an
        # assumption broke and needs a look.
        level = log.warning if reason in ("storage_unavailable", "changed_while_read") else log.error
        level("key_deferred", key=key, reason=reason, **detail)
        return Verdict.DEFERRED

    async def _forget(self, registry: list[RegistryEntry], before_us: int, report: GcReport) -> None:
        for entry in registry:
            if entry.collected_us is not None and entry.collected_us < before_us:
                if not self.dry_run:
                    await self.store.forget(entry.id)
                report.mutators_forgotten += 1


def _ttl_of(view: KeyView, counter: str) -> int | None:
    """A bucket with retention: its tally lives as long as the longest-lived of its cells (they all expire at
    the bucket's expiry plus the grace, give or take the writers' clocks); None when one never expires."""
    ttls = [s.ttls.get(counter) for s in view.shards if counter in s.states]
    if counter in view.tallies:
        ttls.append(view.tally_ttls.get(counter))
    if not ttls or None in ttls:
        return None
    return max(t for t in ttls if t is not None)


__all__ = ["Collector", "Gaps", "GcReport", "GcStore", "KeyView", "Range", "RegistryEntry", "Row", "ShardView",
           "Verdict"]
