"""Which partitions this process owns, and how ownership moves: takeovers, releases, rotation, expiry.

One :class:`Ownership` per consumer process holds a :class:`~consumer.applying.Mutator` per owned partition.
It runs the protocol's steps (``consumer.protocol``) against the store and the Kafka consumer:

- a takeover claims the partition at once (one LWT) and finishes in the background: the new mutator's
  publisher-retry window is rebuilt, the window the previous owner left open is replayed; the mutator writes
  nothing before both are done;
- a release (revoke, shutdown) flushes, records the last flush complete and retires the mutator;
- a rotation is a release to a fresh mutator of the same process, claimed only from the rotating one;
- a mutator past its expiry is replaced by a takeover, which re-reads what it had not flushed.

Every step is idempotent and retried while the server it needs is away (:class:`PartitionRetry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Generator, Sequence
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from consumer import schedule
from consumer.applying import Applier, Mutator, RecordsLostError, RecordSource, RetryWindow
from consumer.dead_letters import DeadLetters
from consumer.handovers import NO_HANDOVERS, HandoverBook, HandoverRefusedError, learn_handovers
from consumer.protocol import (
    Claim,
    Claimant,
    ClaimUnresolvedError,
    FencedError,
    MutatorExpiredError,
    Takeover,
    finish_take_over,
    record_start,
    release,
)
from consumer.resetting import NO_RESETS, ResetBook
from consumer.schedule import Footprint
from consumer.storage import FORGOTTEN, MutatorEntry, PartitionId, Store
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.retry import Backoff, is_retriable, retrying
from countersink.settings import ConsumerSettings
from countersink.topic_ids import NO_TOPIC_CHECKS, TopicCheck, TopicRecreatedError
from schemas.definitions import CounterSet
from schemas.events import EventRouter

log = get_logger(__name__)

T = TypeVar("T")

# How long a flush waits for Kafka's topic ids (check_topics) before it goes on without them: a flush a second
# should not wait out Kafka's request timeout while the broker is away.
TOPIC_CHECK_TIMEOUT_S = 2.0


def now_us() -> int:
    return time.time_ns() // 1_000


class Background(Protocol):
    """What ownership needs of a takeover running in the background: an :class:`asyncio.Task`, or a stand-in
    that lets a test decide when each of its steps runs."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> None: ...
    def cancel(self) -> bool: ...
    def __await__(self) -> Generator[Any, None, None]: ...


def in_background(step: Coroutine[Any, Any, None]) -> Background:
    return asyncio.create_task(step)


class PartitionRetry:
    """Runs one idempotent step of one partition until it succeeds, retrying what the error says is retriable
    (a server away, a timeout), with backoff up to ``flush_retry_max_s``; consumption waits meanwhile. Once a
    stop was requested ``flush_retry_max_s`` ago, the error propagates: a final flush gets that long."""

    def __init__(self, config: ConsumerSettings, stop_requested_at: Callable[[], float | None]) -> None:
        self._backoff = Backoff(first_s=0.1, max_s=config.flush_retry_max_s)
        self._grace_s = config.flush_retry_max_s
        self._stop_requested_at = stop_requested_at

    def giving_up(self) -> bool:
        stopped_at = self._stop_requested_at()
        return stopped_at is not None and time.monotonic() - stopped_at >= self._grace_s

    async def __call__(self, what: str, tp: TopicPartition, step: Callable[[], Awaitable[T]],
                       on_retry: Callable[[], None] | None = None) -> T:
        def retried(error: BaseException, pause_s: float) -> None:
            if on_retry is not None:
                on_retry()
            log.warning(f"{what}_retry", topic=tp.topic, partition=tp.partition, error=str(error),
                        wait_s=round(pause_s, 3))

        return await retrying(step, backoff=self._backoff,
                              retry_on=lambda error: is_retriable(error) and not self.giving_up(), on_retry=retried)


class Ownership:
    """The mutators of the partitions this process owns, and every move of ownership (module docstring)."""

    def __init__(self, config: ConsumerSettings, host: str, router: EventRouter, counters: CounterSet, store: Store,
                 source: RecordSource, consumer: AIOKafkaConsumer, dead_letters: DeadLetters,
                 retry: PartitionRetry, *,
                 clock: Callable[[], int] = now_us, new_id: Callable[[], uuid.UUID] = uuid.uuid4,
                 spawn: Callable[[Coroutine[Any, Any, None]], Background] = in_background,
                 resets: ResetBook = NO_RESETS, handovers: HandoverBook = NO_HANDOVERS,
                 topic_ids: TopicCheck = NO_TOPIC_CHECKS) -> None:
        """``clock`` (microseconds), ``new_id`` and ``spawn`` are the process's own unless a test passes
        stand-ins: the protocol model runs this class step by step, with its own clocks and interleavings."""
        self.config = config
        self.host = host
        self.router = router
        self.counters = counters
        self.store = store
        self.source = source
        self.consumer = consumer
        self.dead_letters = dead_letters
        self.retry = retry
        self.clock = clock
        self.new_id = new_id
        self.spawn = spawn
        self.resets = resets
        self.handovers = handovers
        self.topic_ids = topic_ids
        # Counters with ``since`` by topic, and their hand-over offsets by partition once learned (they never
        # change once recorded: consumer.handovers); a partition is in _starts once every counter of its topic
        # has a hand-over there, with or without since.
        self._since = {topic: frozenset(c.name for c in counters.for_topic(topic) if c.since is not None)
                       for topic in {t for c in counters for t in c.topics}}
        self._starts: dict[TopicPartition, dict[str, int]] = {}
        self._defined = frozenset(c.name for c in counters)
        # Counters dropped from the registry since the start (the service adds them as it finds them): this
        # process writes none of them, so it counts none of them. Each is a counter it lacks: it records no
        # hand-over of one, and a hand-over of one defined anew under that name (once the drop is forgotten)
        # makes it refuse the partition, as for a counter its definitions never had.
        self.dropped: set[str] = set()
        # When each counter was recorded in the counter registry (epoch microseconds), set once the process has
        # registered its definitions: a mutator born before a counter was recorded never counted it.
        self.registered_us: dict[str, int] = {}
        # Set when a claimed partition holds a hand-over of a counter these definitions lack: the process must
        # exit (the loop raises it); nothing was applied or written for that partition.
        self.refusal: HandoverRefusedError | None = None
        self.mutators: dict[TopicPartition, Mutator] = {}
        # Takeovers still finishing in the background, by new mutator: it applies meanwhile, but writes
        # nothing until its takeover is finished (see takeover_pending).
        self._takeovers: dict[uuid.UUID, Background] = {}
        self.warming: set[uuid.UUID] = set()  # new mutators whose retry window is not rebuilt yet: not applying
        # Partitions not consumed because records were deleted before they were counted (on_records_lost =
        # stop) or their topic was deleted and created again: the process reports unready until they are revoked
        # or an operator decides.
        self.stopped: dict[TopicPartition, RecordsLostError | TopicRecreatedError] = {}

    def applying(self, tp: TopicPartition) -> Mutator | None:
        """The mutator that applies ``tp``'s records now: None while it is warming up, fenced or gone."""
        mutator = self.mutators.get(tp)
        if mutator is None or mutator.fenced or mutator.id in self.warming:
            return None
        return mutator

    # ------------------------------------------------------------------------------------ takeovers

    async def take(self, assigned: list[TopicPartition]) -> None:
        """Claim each newly assigned partition (the rebalance callback: one LWT each, the rest later)."""
        for tp in assigned:
            if tp in self.mutators:
                continue
            self.stopped.pop(tp, None)
            try:
                mutator: Mutator | None = await self.take_over(tp)
            except FencedError as exc:
                log.warning("takeover_lost", topic=tp.topic, partition=tp.partition, reason=str(exc))
                mutator = None
            if mutator is not None and mutator.id not in self.warming:
                with contextlib.suppress(Exception):
                    self.consumer.resume(tp)  # a fenced mutator's partition was paused
        METRICS.partitions_stopped.set(len(self.stopped))

    async def _initial_last_offset(self, tp: TopicPartition) -> int:
        """First assignment ever: continue from the group's committed offset, else the reset policy."""
        committed = await self.consumer.committed(tp)
        if committed is not None:
            return int(committed) - 1
        if self.config.auto_offset_reset == "latest":
            return int((await self.consumer.end_offsets([tp]))[tp]) - 1
        return int((await self.consumer.beginning_offsets([tp]))[tp]) - 1

    async def take_over(self, tp: TopicPartition, applier: Applier | None = None,
                        from_owner: uuid.UUID | None = None) -> Mutator:
        """Claim ``tp`` for a fresh mutator and return it. The rest runs in the background, so that a rebalance
        callback taking a dozen partitions returns within a heartbeat (it had taken a second per partition
        here, and a callback longer than the session timeout got the member evicted, over and over):

        - a fresh applier's publisher-retry window is rebuilt from the records before the start offset; the
          partition stays paused until then, and is then read from the start offset;
        - what the previous owner left (an open window to replay, mutators to retire) is finished while the
          new mutator applies: a takeover after a crash does not stop counting for as long as the replay takes.

        The new mutator writes nothing (no flush, no release) before both are done: see takeover_pending.
        ``applier`` (a rotation) keeps the rotating mutator's warm retry window; ``from_owner`` claims only
        from that mutator. The claim is retried while the servers are away (see :meth:`_claim`)."""

        def fresh_applier() -> Applier:
            return Applier(self.router, self.counters, tp.topic, tp.partition,
                           RetryWindow(self.config.retry_window_records), self.resets, self._starts.get(tp, {}))

        started = time.monotonic()
        claimed = await self._claim(tp, from_owner)
        entry = claimed.new
        warm = applier is not None
        mutator = Mutator(entry, PartitionId(self.config.group_id, tp.topic, tp.partition),
                          applier if applier is not None else fresh_applier(),
                          applied_through=claimed.start_offset - 1, flushed_through=claimed.start_offset - 1)
        self.mutators[tp] = mutator
        METRICS.ownership_changes.inc()
        METRICS.live_mutators.set(len(self.mutators))
        if warm and claimed.finished:
            await self._record_start(tp, claimed)
            self._log_taken_over(tp, mutator, await finish_take_over(self.store, self.source, claimed, fresh_applier,
                                                                     self.clock), started)
            return mutator
        if not warm:
            self.warming.add(entry.id)
            with contextlib.suppress(Exception):
                self.consumer.pause(tp)
        # Forgotten once it is seen to have succeeded; a failure stays for whoever asks next, to raise.
        self._takeovers[entry.id] = self.spawn(
            self._finish_in_background(tp, mutator, claimed, fresh_applier, started))
        return mutator

    async def _record_start(self, tp: TopicPartition, claimed: Claim) -> None:
        """Record the new mutator's start and counters, retried while the servers are away: it opens no window
        before (a takeover replaying its window decides by them which counters that window counts)."""
        counting = self._counting(tp.topic)
        await self.retry("start", tp, functools.partial(record_start, self.store, claimed, counting))

    async def _replayed_for(self, claimed: Claim, counters: Sequence[str]) -> frozenset[str]:
        """Those of ``counters`` (without ``since``, none with a confirmed hand-over yet) that the window this
        takeover replays counts: the ones its writer W counted. The replay rewrites W's shards, at W's
        timestamps; for a counter W counted, what it adds is what W would have written, so the counter is
        counted from the window's start (a counter counted before hand-overs were recorded is then counted on
        without a gap). A counter W did not count is counted from the start offset: written into W's shards it
        would be new bytes at W's timestamps, which a GC fold of W (retired, its window replayed again) or the
        drop of an earlier counter of that name hides. W did not count a counter its recorded counters lack, nor
        one recorded in the registry after W was born (W counted an earlier counter of that name, dropped and
        released since: a process registers its counters before any of its mutators is born). W that recorded
        none may have counted any: a version before they were recorded (now a mutator records them before it
        opens a window, _record_start). Nothing is counted from the window of a W whose registry row the GC
        has forgotten (below)."""
        window = None if claimed.row is None else claimed.row.window_to_replay
        if window is None or not counters:
            return frozenset(counters)  # nothing is replayed: counted from the start offset either way
        writer, writer_born_us = window
        counted = await self.store.read_counted(writer)
        if counted is FORGOTTEN:
            # The GC folded W and forgot it: W was retired, so whoever retired it had replayed this window first
            # (and died before closing it), and the fold holds what that replay counted. Its tombstone, at W's
            # retirement, hides whatever is written at W's timestamps now: no counter is counted from the window.
            # One that replay counted is then counted from the start offset on, its window in the tally already.
            return frozenset()
        if counted is None:
            # Nothing is known of W's counters, nor of when it was born against their registration: a version
            # before the registry registers them only after its own mutators were born.
            return frozenset(counters)
        return frozenset(name for name in counters
                         if name in counted and writer_born_us > self.registered_us.get(name, -1))

    def _counting(self, topic: str) -> list[str]:
        return [c.name for c in self.counters.for_topic(topic) if c.name not in self.dropped]

    async def _claim(self, tp: TopicPartition, from_owner: uuid.UUID | None) -> Claim:
        """Claim ``tp`` for a fresh mutator, retrying while the servers are away. Each attempt goes on with the
        mutator of the last one: an LWT whose answer was lost is resolved by reading the row, never by
        starting over with a new mutator (a rotation whose claim had applied would then be refused by its
        own claim). A new mutator is made only when the claimant says its own is spent."""
        claimant: Claimant | None = None

        async def attempt() -> Claim:
            nonlocal claimant
            if claimant is None:
                born = self.clock()
                claimant = Claimant(MutatorEntry(
                    id=self.new_id(), consumer_group=self.config.group_id, topic=tp.topic, partition=tp.partition,
                    host=self.host, born_us=born, expires_us=born + int(self.config.mutator_max_age_s * 2e6),
                ), await self._initial_last_offset(tp), from_owner)
            try:
                return await claimant.claim(self.store)
            except ClaimUnresolvedError:
                claimant = None
                raise

        try:
            return await self.retry("takeover", tp, attempt)
        except asyncio.CancelledError:
            # Stopped while waiting to try again: the mutator of the last attempt leaves no orphan either.
            if claimant is not None:
                await claimant.abandon(self.store)
            raise

    async def _finish_in_background(self, tp: TopicPartition, mutator: Mutator, claimed: Claim,
                                     applier_factory: Callable[[], Applier], started: float) -> None:
        accept_lost = self.config.on_records_lost == "skip"
        # First of all: the claim's start offset is in the recorded topic's offsets. If the name now stands for
        # another topic, its records must be neither replayed as the previous owner's window nor counted on.
        recreated = await self.retry("topic_id", tp, functools.partial(self.topic_ids.changed, [tp.topic]))
        if tp.topic in recreated:
            self.topic_recreated(tp, mutator, recreated[tp.topic])
            return
        await self._record_start(tp, claimed)
        # One read per claim, before the mutator applies or writes anything: a hand-over of a counter these
        # definitions lack means newer ones count it here (a rolling deploy), and going on would lose its
        # records from the hand-over on (consumer.handovers).
        foreign = await self.retry("handovers", tp, functools.partial(
            self.handovers.foreign, self.config.group_id, tp.topic, tp.partition, self._defined - self.dropped))
        if foreign:
            self.refuse(tp, mutator, HandoverRefusedError(tp.topic, tp.partition, foreign))
            return
        counting = self._counting(tp.topic)
        if counting and tp not in self._starts:
            # Before the mutator applies anything, and before the replay's applier is made: every counter of the
            # topic has a hand-over here, recorded once (proposed by the first that gets here, confirmed while
            # it still owns the partition), from which the live mutators count it, so that a consumer without it
            # refuses the partition. A counter with ``since`` is counted below its hand-over by its backfill, so
            # it is where this mutator starts; another is counted from the window this takeover replays when that
            # window's writer counted it (_replayed_for), else from where this mutator starts.
            since = self._since.get(tp.topic, frozenset())

            async def proposals(missing: Sequence[str]) -> dict[str, int]:
                # Asked only for counters without a confirmed hand-over: the writer's counters are read then.
                replayed_for = await self._replayed_for(claimed, [name for name in missing if name not in since])
                return {name: claimed.counted_from if name in replayed_for else claimed.start_offset
                        for name in missing}

            try:
                starts = await self.retry("handover", tp, functools.partial(
                    learn_handovers, self.handovers, self.store, mutator.pid, counting, proposals, mutator.id))
            except FencedError as exc:
                mutator.fenced = True
                self.warming.discard(mutator.id)
                self.drop(tp, mutator, str(exc))
                return
            self._starts[tp] = starts
            mutator.applier.start_counting(starts)
            log.info("handover_learned", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id),
                     offsets=starts)
        if mutator.id in self.warming:
            # Reads Kafka again: retried while the broker is away (a restart), as flushes wait for Cassandra.
            await self.retry("warm_up", tp, functools.partial(mutator.applier.warm_up, self.source,
                                                              claimed.start_offset))
            start = await self.retry("log_start", tp, functools.partial(self.source.log_start, tp.topic, tp.partition))
            if not self.goes_on_from(tp, mutator, start):
                return
            self.warming.discard(mutator.id)
            if self.mutators.get(tp) is mutator and not mutator.fenced:
                # Records fetched before the pause were skipped: read on from what is applied.
                with contextlib.suppress(Exception):
                    self.consumer.seek(tp, mutator.applied_through + 1)
                    self.consumer.resume(tp)
        while True:
            try:
                # Kafka errors too: a broker restarting during a replay must not fail the takeover for good.
                result = await self.retry("takeover", tp, functools.partial(
                    self._finish_take_over, tp, claimed, applier_factory, accept_lost))
                break
            except FencedError as exc:
                mutator.fenced = True  # another member claimed it meanwhile; this one wrote nothing, and never will
                self.drop(tp, mutator, str(exc))
                return
            except RecordsLostError as exc:
                if not self.records_lost(tp, mutator, exc):
                    return
                accept_lost = True
        self._log_taken_over(tp, mutator, result, started)
        if self.mutators.get(tp) is mutator and not mutator.fenced:
            with contextlib.suppress(Exception):
                self.consumer.resume(tp)  # if paused at flush_max_dirty while the takeover ran

    async def _finish_take_over(self, tp: TopicPartition, claimed: Claim, applier_factory: Callable[[], Applier],
                                accept_lost: bool) -> Takeover:
        return await finish_take_over(self.store, self.source, claimed, applier_factory, self.clock,
                                      on_invalid=functools.partial(self.dead_letters.send, tp),
                                      accept_lost=accept_lost)

    def goes_on_from(self, tp: TopicPartition, mutator: Mutator, log_start: int) -> bool:
        """Where the log starts now: records the mutator has not applied below ``log_start`` were deleted
        before they were counted. Reports them and skips past them (True), or stops the partition (False),
        as ``on_records_lost`` says; True with nothing to do when none were lost."""
        if log_start <= mutator.applied_through + 1:
            return True
        lost = RecordsLostError(tp.topic, tp.partition, mutator.applied_through + 1, log_start - 1)
        if not self.records_lost(tp, mutator, lost):
            return False
        mutator.skip_to(log_start)
        return True

    def records_lost(self, tp: TopicPartition, mutator: Mutator, lost: RecordsLostError) -> bool:
        """Records to count were deleted from the log. True to go on without them (``on_records_lost`` =
        skip); otherwise the partition is no longer consumed, and the process reports unready."""
        METRICS.records_lost.labels(tp.topic, str(tp.partition)).inc(lost.last - lost.first + 1)
        skip = self.config.on_records_lost == "skip"
        log.error("records_lost", topic=tp.topic, partition=tp.partition, first=lost.first, last=lost.last,
                  action="skipped" if skip else "partition_stopped",
                  hint=None if skip else "set COUNTERSINK_CONSUMER__ON_RECORDS_LOST=skip to count on without them")
        if skip:
            return True
        self.stopped[tp] = lost
        METRICS.partitions_stopped.set(len(self.stopped))
        self.warming.discard(mutator.id)
        self._forget(tp, mutator)
        return False

    def topic_recreated(self, tp: TopicPartition, mutator: Mutator, error: TopicRecreatedError) -> None:
        """``tp``'s topic is not the one counted: its mutator never applies nor writes again, and the partition
        is not consumed (unready) until it is revoked. What it applied since its last flush is not written: the
        old topic's records among it are gone with that topic, and any of the new one's would be counted from
        the old one's offsets."""
        mutator.fenced = True
        self.warming.discard(mutator.id)
        self.stopped[tp] = error
        METRICS.partitions_stopped.set(len(self.stopped))
        METRICS.topics_recreated.labels(tp.topic, str(tp.partition)).inc()
        self._forget(tp, mutator)
        log.error("topic_recreated", topic=tp.topic, partition=tp.partition, counted_id=str(error.counted),
                  kafka_id=str(error.now), mutator=str(mutator.id), flushed_through=mutator.flushed_through,
                  unwritten=mutator.applied_through - mutator.flushed_through, action="partition_stopped",
                  hint="count the new topic with a new consumer group and keyspace, or under a new name")

    async def check_topics(self, partitions: Collection[TopicPartition] | None = None) -> bool:
        """Before anything applied is written (a flush, a release, a rotation) of ``partitions``, else of every
        partition owned: a topic deleted and created again while its partitions were consumed stops them (see
        :meth:`topic_recreated`). The check is Kafka's metadata of the topics, one request. False when it could
        not be made (Kafka away, or slower than TOPIC_CHECK_TIMEOUT_S): the caller then writes nothing of what
        was applied, which is always safe (the next flush, or the next owner, reads it from Kafka again)."""
        owned = [(tp, m) for tp, m in self.mutators.items() if partitions is None or tp in partitions]
        if not owned:
            return True
        try:
            recreated = await self.topic_ids.changed({tp.topic for tp, _ in owned}, TOPIC_CHECK_TIMEOUT_S)
        except Exception as exc:
            METRICS.topic_checks_failed.inc()
            log.warning("topic_ids_unchecked", error=repr(exc), action="not written until checked")
            return False
        for tp, mutator in owned:
            if tp.topic in recreated and self.mutators.get(tp) is mutator:
                await self._end_take_over(tp, mutator)  # it may be replaying records of the new topic
                self.topic_recreated(tp, mutator, recreated[tp.topic])
        return True

    def refuse(self, tp: TopicPartition, mutator: Mutator, refusal: HandoverRefusedError) -> None:
        """A claimed partition is counted for a counter these definitions lack: its mutator never applies nor
        writes, and the process is to exit (:attr:`refusal`). The next owner finishes the takeover as after a
        crash."""
        mutator.fenced = True
        self.warming.discard(mutator.id)
        self._forget(tp, mutator)
        if self.refusal is None:
            self.refusal = refusal
        log.warning("partition_refused", topic=tp.topic, partition=tp.partition, counters=list(refusal.counters),
                  mutator=str(mutator.id))

    def _log_taken_over(self, tp: TopicPartition, mutator: Mutator, result: Takeover, started: float) -> None:
        log.info("partition_taken_over", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id),
                 start_offset=result.start_offset, previous_owner=str(result.previous_owner),
                 replayed_records=result.replayed_records, replayed_instances=result.replayed_instances,
                 retired=[str(m) for m in result.retired], seconds=round(time.monotonic() - started, 3))

    def takeover_pending(self, mutator: Mutator) -> bool:
        """True while ``mutator``'s takeover is still running in the background: it must write nothing yet.
        Raises what made the takeover fail, if it failed."""
        task = self._takeovers.get(mutator.id)
        if task is None:
            return False
        if not task.done():
            return True
        task.result()
        del self._takeovers[mutator.id]
        return False

    async def _end_take_over(self, tp: TopicPartition, mutator: Mutator) -> None:
        """The mutator is stopping: a takeover of it still running is abandoned, one that ended (failed or not)
        forgotten."""
        task = self._takeovers.get(mutator.id)
        if task is not None and not task.done():
            await self._abandon_take_over(tp, mutator)
        else:
            self._takeovers.pop(mutator.id, None)

    async def _abandon_take_over(self, tp: TopicPartition, mutator: Mutator) -> None:
        """Stop a takeover still running (or failed), as a crash would: nothing it did needs undoing (the next
        claimant finishes it the same way: docs/guarantees.md)."""
        task = self._takeovers.pop(mutator.id, None)
        self.warming.discard(mutator.id)
        mutator.fenced = True  # never writes
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        log.info("takeover_abandoned", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id))

    # ------------------------------------------------------------------------------------ releases

    async def release(self, revoked: list[TopicPartition]) -> None:
        """Hand ``revoked`` over cleanly (the caller has let the flush in flight end first)."""
        # A last flush of a topic created again would write its records; unchecked, none is written (the next
        # owner reads them again, as after a crash).
        if not await self.check_topics(revoked):
            for tp in revoked:
                mutator = self.mutators.get(tp)
                if mutator is not None:
                    await self._end_take_over(tp, mutator)  # nor may its takeover go on for a partition gone
                    mutator.fenced = True
                    log.warning("release_unwritten", topic=tp.topic, partition=tp.partition,
                                mutator=str(mutator.id), reason="topic ids unchecked")
        for tp in revoked:
            self.stopped.pop(tp, None)
            METRICS.forget_partition(tp.topic, tp.partition)
        METRICS.partitions_stopped.set(len(self.stopped))
        await self.dead_letters.deliver()
        # Concurrently, as flushes run: a shutdown in the middle of a backlog has a final flush of every
        # partition to write, and one after the other they would not fit in shutdown_timeout_s.
        outcomes = await asyncio.gather(*(self.release_partition(tp) for tp in revoked), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def release_partition(self, tp: TopicPartition) -> None:
        """Hand one partition over: its mutator's last flush is recorded complete and the mutator retired.
        A mutator still taking over writes nothing: its takeover is abandoned as a crash would abandon it."""
        mutator = self.mutators.pop(tp, None)
        METRICS.live_mutators.set(len(self.mutators))
        if mutator is None or mutator.fenced:
            return
        task = self._takeovers.get(mutator.id)
        if task is not None and (not task.done() or task.cancelled() or task.exception() is not None):
            # It has written nothing yet, and never will: whoever takes the partition next finishes the
            # takeover (replaying the same window) and retires this mutator, as after a crash. Waiting for
            # a long replay here would hold the rebalance, and the group would evict this member.
            await self._abandon_take_over(tp, mutator)
            return
        if mutator.fenced:
            return  # it lost the partition before its takeover was finished, and has nothing to hand over
        try:
            await release(self.store, mutator, self.clock())
            log.info("partition_released", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id),
                     through=mutator.flushed_through)
        except FencedError as exc:
            METRICS.fencings.inc()
            log.warning("mutator_fenced", topic=tp.topic, partition=tp.partition, reason=str(exc))
        except MutatorExpiredError:
            # Writes nothing more; the next owner's takeover replays its open window and retires it.
            log.warning("release_of_expired_mutator", topic=tp.topic, partition=tp.partition,
                        mutator=str(mutator.id))
        except Exception as exc:
            if not is_retriable(exc):
                raise
            # The next owner's takeover replays whatever window this left open.
            log.error("release_failed", topic=tp.topic, partition=tp.partition, error=str(exc))

    def drop(self, tp: TopicPartition, mutator: Mutator, reason: str) -> None:
        """A fenced mutator: another owner took the partition; forget its state and stop consuming it."""
        METRICS.fencings.inc()
        log.warning("mutator_fenced", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id), reason=reason)
        self._forget(tp, mutator)

    def _forget(self, tp: TopicPartition, mutator: Mutator) -> None:
        if self.mutators.get(tp) is mutator:
            del self.mutators[tp]
            METRICS.forget_partition(tp.topic, tp.partition)
        METRICS.live_mutators.set(len(self.mutators))
        with contextlib.suppress(Exception):
            self.consumer.pause(tp)

    # ------------------------------------------------------------------------------ rotation, expiry

    async def replace_expired(self, tp: TopicPartition, mutator: Mutator) -> None:
        """A mutator past its expiry writes nothing more: a fresh one takes the partition over (replaying
        any window the old one left open, then retiring it) and its unflushed records are read again."""
        if self.mutators.get(tp) is not mutator:
            return
        successor = await self.take_over(tp)
        METRICS.expiries.inc()
        log.warning("mutator_expired", topic=tp.topic, partition=tp.partition, old=str(mutator.id),
                    new=str(successor.id), rereading_from=successor.applied_through + 1,
                    dropped_through=mutator.applied_through)

    def rotation_reasons(self) -> dict[TopicPartition, str]:
        return schedule.rotation_reasons(
            {tp: Footprint(m.memory_bytes(), m.entry.born_us) for tp, m in self.mutators.items()}, self.config,
            self.clock())

    async def rotate_if_due(self) -> None:
        for tp, reason in self.rotation_reasons().items():
            await self.rotate(tp, reason)

    async def rotate(self, tp: TopicPartition, reason: str) -> None:
        """Release ``tp``'s mutator and take the partition over with a fresh one of this process, which keeps
        the warm publisher-retry window (a mutator too old, or holding too much, starts afresh)."""
        mutator = self.mutators[tp]
        if self.takeover_pending(mutator):
            return  # rotated once its takeover is finished: a replay must not hold the loop
        # Its release writes what it applied since the last flush: checked as a flush is (rotated later if not).
        if not await self.check_topics([tp]) or self.mutators.get(tp) is not mutator:
            return
        try:
            # Every record it skipped as invalid is on the dead-letter topic before its last window is
            # recorded complete.
            await self.dead_letters.deliver()
            # Safe to repeat after any failure: a committed release only retries its retire.
            await self.retry("rotation", tp, functools.partial(release, self.store, mutator, self.clock()))
            # Only from itself: a member that lost the partition without noticing must not fence its owner.
            successor = await self.take_over(tp, applier=mutator.applier, from_owner=mutator.id)
        except FencedError as exc:
            self.drop(tp, mutator, str(exc))
            return
        except MutatorExpiredError:
            await self.replace_expired(tp, mutator)
            return
        log.info("mutator_rotated", topic=tp.topic, partition=tp.partition, reason=reason,
                 old=str(mutator.id), new=str(successor.id))

    def cancel_takeovers(self) -> None:
        """Closing: takeovers still running end as a crash would end them."""
        for unfinished in self._takeovers.values():
            unfinished.cancel()
