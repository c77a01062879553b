"""The GC: fold the shards of retired mutators into each instance's tally, safely and without coordination.

For every mutator retired before ``now - grace`` and not yet collected, page through the instances it wrote
(``mutator_work``). For each instance, read its cells of the key's partition (at CL ALL by default) and let F
be every shard whose mutator is final (retired before the cutoff). Write ``tally + F`` as the new tally and
delete F's cells in one single-partition batch ``USING TIMESTAMP max(retired_us of F)``. Cassandra applies such a batch
atomically and in isolation, so a reader sees the instance before it or after it, never a mix.

Why several workers at once are safe (seed 000's argument with the retire time for the expiry): a later run
can only see more final shards, which retired later, so its timestamp is higher and its tally includes
everything an earlier run folded; repeating a batch writes the same cells at the same timestamp; a late write
of a retired mutator carries ``born_us + flush_seq``, below its retire time, and stays under the deletion.
The grace period must exceed the clock skew between machines, so that no mutator still to be retired can get
a retire time below a cutoff that a run has already used.

All of this needs the fold to be built from one consistent view of the instance: its tally and its shards as
they were at one moment. One request gives that (Cassandra answers a single-partition read in isolation from a
single-partition batch), but an instance with more shards than a page takes several, and another worker's fold
can land between two of them. Built from a tally from before that fold and shards from after it, our fold
drops the shards the other one folded (our later timestamp overwrites its tally); from shards before and the
tally after, it counts them twice. So a read of more than one page takes the tally as of its first request
and, once the last page is in, reads the tally alone again. A tally cell only ever gives way to one with a
later timestamp (or, at the same timestamp, larger bytes), so the same bytes and write time before and after
mean it was current throughout: no fold that changed it landed in between. (A batch that lost to it folded
only shards that it already holds, deleted with it; one that wrote the same bytes at the same time repeated a
fold, or folded shards that change nothing, such as a max below the tally's.) The shards read while that tally
was current are not in it, and a final shard cannot appear later, so the view is what one request at any
moment in between would have returned, and the timestamp argument above holds as it stands. If the tally
changed, the instance is read again (the other worker has usually finished it by then); after a few tries it
is deferred. The fold itself stays unconditional: Cassandra refuses ``USING TIMESTAMP`` on a conditional (LWT)
batch, and that timestamp is what makes concurrent folds and late writes safe. Nor is the read made one large
page: the shards of an instance have no fixed bound.

Three checks turn a broken assumption into a deferral instead of a lost or double-counted event:
- a shard whose write time is not below its mutator's retire time would survive the deletion;
- a tally written at or after our timestamp means another run folded later shards but not these;
- a tally that keeps changing while its pages are read (a busy instance, retried a few times first).
All three leave the instance as it is (its value stays right: the shards still count) and are reported.

Storage is reached through :class:`GcStore`, so the model test runs this code against its in-memory
Cassandra.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from countersink.logs import get_logger
from countersink.retry import is_retriable
from schemas.errors import CountersinkError
from schemas.kinds import merge_stored

log = get_logger(__name__)

Instance = tuple[str, str]  # (counter, key)


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
    mutator: uuid.UUID
    state: bytes
    through_offset: int
    write_us: int  # writetime(state)


@dataclasses.dataclass(frozen=True)
class InstanceView:
    """A whole-partition read of one instance: the tally, its write time, and every visible shard.

    ``pages`` is how many requests the read took (one while the shards fit one page)."""

    tally: bytes | None
    tally_write_us: int | None
    shards: tuple[ShardView, ...]
    pages: int = 1
    # Seconds until the last of its rows expires (a bucket with retention); None when a row never expires.
    ttl_s: int | None = None


class GcStore(Protocol):
    """Storage operations of the GC."""

    async def read_registry(self) -> list[RegistryEntry]:
        """Every mutator of the registry (all consumer groups)."""
        ...

    def read_work(self, mutator: uuid.UUID) -> AsyncIterator[Sequence[Instance]]:
        """The instances ``mutator`` wrote, a page at a time."""
        ...

    async def read_instance(self, counter: str, key: str) -> InstanceView:
        """The whole partition of one instance, at the GC's read consistency; if it takes more than one
        request, the tally as of the first."""
        ...

    async def read_tally(self, counter: str, key: str) -> tuple[bytes | None, int | None]:
        """The tally of one instance and its write time, in one request at the GC's read consistency."""
        ...

    async def fold(self, counter: str, key: str, tally: bytes, folded: Sequence[uuid.UUID], timestamp_us: int,
                   ttl_s: int | None = None) -> None:
        """One single-partition batch: set the tally and delete the folded shard rows, at ``timestamp_us``."""
        ...

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None: ...

    async def forget(self, mutator: uuid.UUID) -> None:
        """Delete a long-collected mutator's registry row and work list."""
        ...


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
    instances_checked: int = 0
    instances_folded: int = 0
    shards_deleted: int = 0
    instances_deferred: int = 0
    deferred: list[str] = dataclasses.field(default_factory=list)  # the first few, for the log and the CLI

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_DEFERRED_SHOWN = 20
_READ_ATTEMPTS = 3  # reads of an instance whose tally changes between its pages, before deferring it


class Collector:
    """One GC worker. :meth:`run` is one pass; call it from cron or in a loop.

    ``retriable`` says which storage errors mean "not now" (a replica down for a CL ALL read, a timeout: by
    default, what the error itself says is retriable): the instance is deferred and the run goes on. Any
    other error ends the run.
    ``concurrency`` instances are worked on at once; 1 runs strictly in order, with no asyncio tasks.
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
    ) -> None:
        if grace_us < 0:
            raise ValueError("grace must not be negative")
        self.store = store
        self.grace_us = grace_us
        self.retriable = retriable
        self.dry_run = dry_run
        self.concurrency = max(1, concurrency)
        self.forget_after_us = forget_after_us
        self.progress = progress

    async def run(self, now_us: int) -> GcReport:
        report = GcReport(dry_run=self.dry_run)
        cutoff = now_us - self.grace_us
        registry = await self.store.read_registry()
        # Every shard of a mutator in ``final`` is final: collected ones too (a late write of theirs may show).
        final = {e.id: e.retired_us for e in registry if e.retired_us is not None and e.retired_us < cutoff}
        todo = sorted((e for e in registry if e.id in final and e.collected_us is None),
                      key=lambda e: (e.retired_us or 0, str(e.id)))
        report.mutators_final = len(todo)
        report.mutators_waiting = sum(1 for e in registry if e.retired_us is not None and e.retired_us >= cutoff)
        # Instances already handled in this run need no second read for the next mutator that wrote them;
        # an instance deferred once is not tried again in the same run, and holds back every mutator in it.
        handled: set[Instance] = set()
        deferred: set[Instance] = set()
        for done, entry in enumerate(todo):
            if self.progress:
                self.progress(done, len(todo), report)
            complete = True
            async for page in self.store.read_work(entry.id):
                if any(i in deferred for i in page):
                    complete = False
                fresh = [i for i in page if i not in handled and i not in deferred]
                verdicts = await self._fold_all(fresh, final, report)
                for instance, verdict in zip(fresh, verdicts, strict=True):
                    if verdict is Verdict.DEFERRED:
                        deferred.add(instance)
                        complete = False
                    else:
                        handled.add(instance)
                if len(handled) > 1_000_000:
                    handled.clear()  # bounded memory; at worst some instances are read again
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

    async def _fold_all(self, instances: Sequence[Instance], final: dict[uuid.UUID, int],
                          report: GcReport) -> list[Verdict]:
        if self.concurrency == 1:
            return [await self._fold_instance(c, k, final, report) for c, k in instances]
        slots = asyncio.Semaphore(self.concurrency)

        async def bounded(counter: str, key: str) -> Verdict:
            async with slots:
                return await self._fold_instance(counter, key, final, report)

        return list(await asyncio.gather(*(bounded(c, k) for c, k in instances)))

    async def _fold_instance(self, counter: str, key: str, final: dict[uuid.UUID, int],
                      report: GcReport) -> Verdict:
        """Fold the final shards of one instance into its tally, or say why not."""
        report.instances_checked += 1
        try:
            view = await self._read_consistent(counter, key)
            if view is None:
                return self._defer(report, counter, key, "changed_while_read", attempts=_READ_ATTEMPTS)
            folded = [s for s in view.shards if s.mutator in final]
            if not folded:
                return Verdict.NOTHING
            timestamp = max(final[s.mutator] for s in folded)
            late = [s for s in folded if s.write_us >= final[s.mutator]]
            if late:
                return self._defer(report, counter, key, "shard_written_after_retirement",
                                   mutators=[str(s.mutator) for s in late])
            if view.tally_write_us is not None and view.tally_write_us >= timestamp:
                return self._defer(report, counter, key, "tally_newer_than_fold",
                                   tally_write_us=view.tally_write_us, fold_us=timestamp)
            merged = merge_stored([view.tally, *(s.state for s in folded)])
            if merged is None:
                return Verdict.NOTHING
            tally = merged.to_bytes()
            if not self.dry_run:
                await self.store.fold(counter, key, tally, [s.mutator for s in folded], timestamp, view.ttl_s)
        except (CountersinkError, TypeError, ValueError, OSError) as exc:
            if self.retriable(exc):
                return self._defer(report, counter, key, "storage_unavailable", error=str(exc))
            if isinstance(exc, OSError):
                raise
            # States that cannot be merged (corrupt bytes, a kind changed in place): never guess.
            return self._defer(report, counter, key, "unmergeable", error=f"{type(exc).__name__}: {exc}")
        report.instances_folded += 1
        report.shards_deleted += len(folded)
        return Verdict.FOLDED

    async def _read_consistent(self, counter: str, key: str) -> InstanceView | None:
        """The instance as one consistent view (see the module's notes), or None if it kept changing."""
        for _ in range(_READ_ATTEMPTS):
            view = await self.store.read_instance(counter, key)
            if view.pages <= 1 or await self.store.read_tally(counter, key) == (view.tally, view.tally_write_us):
                return view
        return None

    def _defer(self, report: GcReport, counter: str, key: str, reason: str, **detail: object) -> Verdict:
        report.instances_deferred += 1
        if len(report.deferred) < _DEFERRED_SHOWN:
            report.deferred.append(f"{counter}/{key}: {reason}")
        # Expected while a replica is down or other workers fold the same instance; anything else means an
        # assumption broke and needs a look.
        level = log.warning if reason in ("storage_unavailable", "changed_while_read") else log.error
        level("instance_deferred", counter=counter, key=key, reason=reason, **detail)
        return Verdict.DEFERRED

    async def _forget(self, registry: list[RegistryEntry], before_us: int, report: GcReport) -> None:
        for entry in registry:
            if entry.collected_us is not None and entry.collected_us < before_us:
                if not self.dry_run:
                    await self.store.forget(entry.id)
                report.mutators_forgotten += 1


__all__ = ["Collector", "GcReport", "GcStore", "InstanceView", "RegistryEntry", "ShardView", "Verdict"]
