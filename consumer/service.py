"""The consumer process: a Kafka consumer group member running one mutator per assigned partition.

The loop: fetch a batch, apply it to the mutators' in-memory states (invalid events go to the dead-letter
topic), and flush when the interval passes or too many instances are dirty. A flush runs in the background
while the loop goes on applying; one flush at a time, so the loop waits when the next is due before the last
has finished, and consumption pauses while Cassandra cannot take writes. Rebalances release revoked
partitions cleanly and take assigned ones over (``consumer.protocol``). Start positions come from the
ownership rows, never from Kafka's committed offsets, which are still committed after each flush for lag
monitoring.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError
from aiokafka.structs import OffsetAndMetadata

from consumer import schedule
from consumer.applying import Applier, KafkaRecord, Mutator, Outcome, RecordsLostError, RetryWindow
from consumer.cassandra_store import CassandraStore
from consumer.kafka_source import KafkaRecordSource
from consumer.protocol import Claim, FencedError, MutatorExpiredError, Takeover, claim, finish_take_over, flush, release
from consumer.schedule import Footprint, Progress
from consumer.storage import MutatorRecord, PartitionId
from countersink.cassandra import CassandraClient, CassandraUnavailableError
from countersink.consistency import check_deciding_reads, replication_factors
from countersink.health import HealthServer
from countersink.kafka import ensure_topics, known_position, make_consumer, make_producer
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.settings import Settings
from schemas.definitions import CounterSet
from schemas.errors import InvalidEventError
from schemas.events import EventRouter

log = get_logger(__name__)

T = TypeVar("T")



def now_us() -> int:
    return time.time_ns() // 1_000


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.service.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.service.on_partitions_assigned(assigned)


class ConsumerService:
    """``start()``, ``run()`` until ``request_stop()``, ``stop()`` (safe twice); or ``async with``."""

    def __init__(self, settings: Settings, counters: CounterSet) -> None:
        self.settings = settings
        self.config = settings.consumer
        self.counters = counters
        self.router = EventRouter(counters, max_event_bytes=self.config.max_event_bytes)
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self.cassandra = CassandraClient(settings.cassandra, app="countersink-consumer")
        self.store = CassandraStore(self.cassandra)
        self.source = KafkaRecordSource(settings.kafka)
        self.producer = make_producer(settings.kafka)
        self.consumer = make_consumer(
            settings.kafka,
            group_id=self.config.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self.config.auto_offset_reset,
            isolation_level="read_committed",
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.config.session_timeout_ms // 4),
            max_poll_records=self.config.max_poll_records,
        )
        self.mutators: dict[TopicPartition, Mutator] = {}
        self._pending_dead_letters: list[Awaitable[Any]] = []
        self._stopping = asyncio.Event()
        # Held while a batch is applied, flushed and rotated, and by the rebalance callbacks (which aiokafka
        # runs in its coordinator task, concurrently with this loop): a rotation must never take over a
        # partition that a revoke is handing to another member at the same moment.
        self._ownership = asyncio.Lock()
        self._started = False
        self._last_flush = time.monotonic()  # when the last flush started
        self._last_flush_took = 0.0
        self._flushing: asyncio.Task[list[tuple[TopicPartition, Mutator]]] | None = None
        # Takeovers still replaying what the previous owner left, by new mutator: it applies meanwhile, but
        # writes nothing until its takeover is finished (see _takeover_pending).
        self._takeovers: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._warming: set[uuid.UUID] = set()  # new mutators whose retry window is not rebuilt yet: not applying
        # Partitions not consumed because records were deleted before they were counted (on_records_lost =
        # stop): the process reports unready until they are revoked or an operator decides.
        self._stopped_partitions: dict[TopicPartition, RecordsLostError] = {}
        self.ready = False
        self.health = HealthServer(self.config.health_port, lambda: self.is_ready)

    @property
    def is_ready(self) -> bool:
        """What /healthz says: consuming, and no partition stopped for lost records."""
        return self.ready and self._started and not self._stopped_partitions

    async def __aenter__(self) -> ConsumerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        # A consumer (re)started while Kafka or Cassandra is briefly away waits for them, up to
        # startup_timeout_s, rather than exiting: both steps are idempotent.
        await self._when_reachable("cassandra", self._prepare_cassandra)
        await self._when_reachable("kafka", functools.partial(
            ensure_topics, self.settings.kafka, {self.config.dead_letter_topic: 1}))
        await self.producer.start()
        await self.source.start()
        self.consumer.subscribe(topics=list(self.counters.topics), listener=_Rebalance(self))
        await self.consumer.start()
        if self.config.health_port:
            await self.health.start()
        self._started = True
        log.info("consumer_started", group=self.config.group_id, topics=list(self.counters.topics), host=self.host)

    async def _prepare_cassandra(self) -> None:
        await self.cassandra.start()
        # Refused before anything is written or consumed: a replay that reads a stale shard loses events. The
        # keyspace as it exists, else as it is about to be created.
        factors = await self.cassandra.replication_factors() or replication_factors(self.settings.cassandra.replication)
        check_deciding_reads(self.settings.cassandra, factors,
                             {"replay_read_consistency": self.settings.cassandra.replay_read_consistency})
        await self.cassandra.ensure_schema()

    async def _when_reachable(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        delay = 0.5
        while True:
            try:
                await step()
                return
            except (CassandraUnavailableError, KafkaError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("waiting_for_server", server=what, error=str(exc), wait_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    # --------------------------------------------------------------------------------- the main loop

    async def run(self) -> None:
        """Consume until :meth:`request_stop`; then release every partition cleanly."""
        while not self._stopping.is_set():
            batches = await self.consumer.getmany(timeout_ms=200, max_records=self.config.max_poll_records)
            self.ready = True
            offsets = None
            async with self._ownership:
                for tp, messages in batches.items():
                    # None when the partition was revoked after this batch was fetched
                    mutator = self.mutators.get(tp)
                    if mutator is None or mutator.fenced or mutator.id in self._warming:
                        continue  # a warming mutator's partition is read again from its start once it is warm
                    await self._apply(tp, mutator, messages)
                    if len(mutator.dirty) >= self.config.flush_max_dirty and self._takeover_pending(mutator):
                        # It cannot flush before its takeover is finished: bound what it holds meanwhile.
                        self.consumer.pause(tp)
                self._advance_positions()
                if self._flushing is not None and self._flushing.done():
                    offsets = await self._finish_flush()
                if self._flush_due():
                    if self._flushing is not None:
                        offsets = await self._finish_flush()  # one at a time: wait for the last one
                    self._start_flush()
            if offsets:
                await self._commit_for_lag(offsets)

    def _advance_positions(self) -> None:
        """Move each mutator past the offsets the consumer skipped after its last record (transaction markers,
        aborted or compacted records), and set the lag from the consumer's position. Offsets are not records:
        on a transactional topic the last offset is a commit marker, and lag counted from the last record
        never reaches 0."""
        for tp, mutator in self.mutators.items():
            if mutator.fenced or mutator.id in self._warming:
                continue  # a warming mutator's partition is sought back to its start: its position says nothing
            position = known_position(self.consumer, tp)
            if position is None:
                continue
            mutator.skip_to(position)
            end = self._log_end(tp)
            if end is not None:
                METRICS.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - position))

    def _log_end(self, tp: TopicPartition) -> int | None:
        """Where a read_committed consumer's position ends up once caught up: the last stable offset (the
        high watermark while no transaction is open), as last seen in a fetch; None before the first."""
        stable = self.consumer.last_stable_offset(tp)
        return int(stable) if stable is not None and stable >= 0 else self.consumer.highwater(tp)

    async def _apply(self, tp: TopicPartition, mutator: Mutator, records: Sequence[KafkaRecord]) -> None:
        applied = duplicates = 0
        for record in records:
            outcome, error = mutator.apply(record)
            if outcome is Outcome.APPLIED:
                applied += 1
            elif outcome is Outcome.DUPLICATE:
                duplicates += 1
            elif outcome is Outcome.INVALID and error is not None:
                await self._dead_letter(tp, record, error)
        METRICS.events_applied.inc(applied)
        METRICS.duplicates_dropped.inc(duplicates)

    async def _dead_letter(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Queue ``record`` for the dead-letter topic; its delivery is awaited before the next flush."""
        self._pending_dead_letters.append(asyncio.ensure_future(self._send_dead_letter(tp, record, error)))
        METRICS.dead_lettered.inc()

    async def _send_dead_letter(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Deliver one dead letter (acknowledged by the broker). One the broker or the client refuses as too
        large goes again cut short, with headers saying so: an invalid event never wedges the consumer."""
        headers = [
            ("countersink.reason", str(error.reason).encode()[:1024]),
            ("countersink.error", type(error).__name__.encode()),
            ("countersink.path", str(error.path).encode()[:1024]),
            ("countersink.source", f"{tp.topic}/{tp.partition}/{record.offset}".encode()),
        ]
        value = record.value
        limits = [self.config.dead_letter_max_bytes, 1024]  # the setting, then a size any broker takes
        while True:
            limit = limits.pop(0)
            sent, cut = value, []
            if value is not None and len(value) > limit:
                sent = value[:limit]
                cut = [("countersink.truncated", f"{len(value)} bytes cut to {limit}".encode())]
            try:
                delivery = await self.producer.send(self.config.dead_letter_topic, sent, headers=headers + cut)
                await delivery
            except (MessageSizeTooLargeError, RecordTooLargeError) as exc:
                if not limits or value is None or len(value) <= limits[0]:
                    raise
                log.warning("dead_letter_too_large", topic=tp.topic, partition=tp.partition, offset=record.offset,
                            bytes=len(value), error=str(exc))
                continue
            if cut:
                METRICS.dead_letters_truncated.inc()
            return

    def _flush_due(self) -> bool:
        progress = {tp: Progress(m.applied_through, self._log_end(tp), len(m.dirty), not self._takeover_pending(m))
                    for tp, m in self.mutators.items()}
        return schedule.flush_due(progress, self.config, since_last_s=time.monotonic() - self._last_flush,
                                  last_took_s=self._last_flush_took)

    async def _deliver_dead_letters(self) -> None:
        """Wait until every dead letter sent so far is acknowledged: they must be durable before any window
        that skips their records is committed."""
        if self._pending_dead_letters:
            deliveries, self._pending_dead_letters = self._pending_dead_letters, []
            await asyncio.gather(*deliveries)

    def _start_flush(self) -> None:
        """Start flushing every mutator in the background. Each flush takes its mutator's intent offset and
        shard bytes together when it begins; what the loop applies meanwhile goes to the next flush."""
        self._last_flush = time.monotonic()
        # Every dead letter sent so far is awaited before any window is opened or committed by this flush,
        # and so before any window that skips their records is recorded complete (by the next flush).
        dead_letters, self._pending_dead_letters = self._pending_dead_letters, []
        self._flushing = asyncio.create_task(self._flush_mutators(list(self.mutators.items()), dead_letters))

    async def _flush_mutators(self, mutators: list[tuple[TopicPartition, Mutator]],
                              dead_letters: list[Awaitable[Any]]) -> list[tuple[TopicPartition, Mutator]]:
        """Flush the given mutators; while Cassandra is unavailable, wait and retry. Returns those past their
        expiry, which wrote nothing and must be replaced."""
        started = time.monotonic()
        if dead_letters:
            await asyncio.gather(*dead_letters)
        # Mutators own different partitions and rows, so their flushes overlap: one LWT's round trip does not
        # idle the others, and the client's in-flight slots stay full.
        outcomes = await asyncio.gather(*(self._flush_one(tp, m) for tp, m in mutators), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]
        self._last_flush_took = time.monotonic() - started
        self.cassandra.sample_driver_metrics()
        return [(tp, mutator) for (tp, mutator), expired in zip(mutators, outcomes, strict=True) if expired is True]

    async def _finish_flush(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Wait for the flush in flight (raising its error), replace the mutators it found expired, rotate
        those due, and return the offsets to commit to Kafka for lag monitoring. Called with the lock held."""
        task, self._flushing = self._flushing, None
        if task is not None:
            # Replacements read records back through the one record source: one at a time, here.
            for tp, mutator in await task:
                if self.mutators.get(tp) is mutator:
                    await self._replace_expired(tp, mutator)
            await self._rotate_if_due()
        return {tp: OffsetAndMetadata(m.flushed_through + 1, "") for tp, m in self.mutators.items()
                if m.flushed_through >= 0 and not m.fenced}

    async def _settle_flush(self) -> None:
        """Wait for the flush in flight to end, without raising its error: the loop raises it when it
        finishes that flush. A mutator is never released while a flush of it may still be running."""
        if self._flushing is not None:
            await asyncio.wait([self._flushing])

    async def _commit_for_lag(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit to Kafka for lag tools only (start positions come from Cassandra). Outside the ownership
        lock: during a rebalance a commit waits for the coordinator, which may be waiting for that lock."""
        with contextlib.suppress(Exception):  # lag monitoring only: never let it stop counting
            await asyncio.wait_for(self.consumer.commit(offsets), self.config.session_timeout_ms / 1000)

    async def _flush_one(self, tp: TopicPartition, mutator: Mutator) -> bool:
        """Flush one mutator, retrying while Cassandra is unavailable. True when the mutator is past its expiry
        (it wrote nothing; the caller replaces it). A mutator whose takeover is still replaying is left for a
        later flush: one slow replay must not hold every other partition's flush."""
        if mutator.fenced or self._takeover_pending(mutator):
            return False
        delay = 0.1
        while True:
            started = time.perf_counter()
            try:
                rows = await flush(self.store, mutator, now_us())
            except FencedError as exc:
                self._drop(tp, mutator, str(exc))
                return False
            except MutatorExpiredError:
                return True
            except CassandraUnavailableError as exc:
                METRICS.flush_retries.inc()
                log.warning("flush_retry", topic=tp.topic, partition=tp.partition, error=str(exc), wait_s=delay)
                if self._stopping.is_set() and delay >= self.config.flush_retry_max_s:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.flush_retry_max_s)
                continue
            if rows:
                METRICS.flush_seconds.observe(time.perf_counter() - started)
                METRICS.flush_rows.observe(rows)
            return False

    async def _until_done(self, what: str, tp: TopicPartition, step: Callable[[], Awaitable[T]],
                          unavailable: tuple[type[Exception], ...] = (CassandraUnavailableError,)) -> T:
        """Run one idempotent step, retrying while the server it needs is unavailable (Cassandra unless
        ``unavailable`` says otherwise; consumption waits). While stopping, the error propagates once the retry
        pause has reached its maximum."""
        delay = 0.1
        while True:
            try:
                return await step()
            except unavailable as exc:
                log.warning(f"{what}_retry", topic=tp.topic, partition=tp.partition, error=str(exc), wait_s=delay)
                if self._stopping.is_set() and delay >= self.config.flush_retry_max_s:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.flush_retry_max_s)

    def _drop(self, tp: TopicPartition, mutator: Mutator, reason: str) -> None:
        """A fenced mutator: another owner took the partition; forget its state and stop consuming it."""
        METRICS.fencings.inc()
        log.warning("mutator_fenced", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id), reason=reason)
        if self.mutators.get(tp) is mutator:
            del self.mutators[tp]
        METRICS.live_mutators.set(len(self.mutators))
        with contextlib.suppress(Exception):
            self.consumer.pause(tp)

    async def _replace_expired(self, tp: TopicPartition, mutator: Mutator) -> None:
        """A mutator past its expiry writes nothing more: a fresh one takes the partition over (replaying
        any window the old one left open, then retiring it) and its unflushed records are read again."""
        # Each attempt registers a fresh mutator: a takeover never reuses a record.
        successor = await self._until_done("takeover", tp, functools.partial(self._take_over, tp))
        METRICS.expiries.inc()
        log.warning("mutator_expired", topic=tp.topic, partition=tp.partition, old=str(mutator.id),
                    new=str(successor.id), rereading_from=successor.applied_through + 1,
                    dropped_through=mutator.applied_through)

    def _rotation_reasons(self) -> dict[TopicPartition, str]:
        return schedule.rotation_reasons(
            {tp: Footprint(m.memory_bytes(), m.record.born_us) for tp, m in self.mutators.items()}, self.config,
            now_us())

    async def _rotate_if_due(self) -> None:
        for tp, reason in self._rotation_reasons().items():
            mutator = self.mutators[tp]
            if self._takeover_pending(mutator):
                continue  # rotated once its takeover is finished: a replay must not hold the loop
            try:
                # Every record it skipped as invalid is on the dead-letter topic before its last window is
                # recorded complete.
                await self._deliver_dead_letters()
                # Safe to repeat after any failure: a committed release only retries its retire.
                await self._until_done("rotation", tp, functools.partial(release, self.store, mutator, now_us()))
                # Only from itself: a member that lost the partition without noticing must not fence its owner.
                successor = await self._until_done("takeover", tp, functools.partial(
                    self._take_over, tp, applier=mutator.applier, from_owner=mutator.id))
            except FencedError as exc:
                self._drop(tp, mutator, str(exc))
                continue
            except MutatorExpiredError:
                await self._replace_expired(tp, mutator)
                continue
            log.info("mutator_rotated", topic=tp.topic, partition=tp.partition, reason=reason,
                     old=str(mutator.id), new=str(successor.id))

    # ------------------------------------------------------------------------------------ rebalancing

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._ownership:
            for tp in revoked:
                self._stopped_partitions.pop(tp, None)
            METRICS.partitions_stopped.set(len(self._stopped_partitions))
            await self._release_partitions(revoked)

    async def _release_partitions(self, revoked: list[TopicPartition]) -> None:
        await self._settle_flush()
        await self._deliver_dead_letters()
        releasing = [(tp, mutator) for tp in revoked
                     if (mutator := self.mutators.pop(tp, None)) is not None and not mutator.fenced]
        # Concurrently, as flushes run: a shutdown in the middle of a backlog has a final flush of every
        # partition to write, and one after the other they would not fit in shutdown_timeout_s.
        outcomes = await asyncio.gather(*(self._release_one(tp, m) for tp, m in releasing), return_exceptions=True)
        METRICS.live_mutators.set(len(self.mutators))
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _release_one(self, tp: TopicPartition, mutator: Mutator) -> None:
        try:
            if self._takeover_pending(mutator):
                # It has written nothing yet, and never will: whoever takes the partition next finishes the
                # takeover (replaying the same window) and retires this mutator, as after a crash. Waiting for
                # a long replay here would hold the rebalance, and the group would evict this member.
                await self._abandon_take_over(tp, mutator)
                return
            if mutator.fenced:
                return  # it lost the partition before its takeover was finished, and has nothing to hand over
            await release(self.store, mutator, now_us())
            log.info("partition_released", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id),
                     through=mutator.flushed_through)
        except FencedError as exc:
            METRICS.fencings.inc()
            log.warning("mutator_fenced", topic=tp.topic, partition=tp.partition, reason=str(exc))
        except MutatorExpiredError:
            # Writes nothing more; the next owner's takeover replays its open window and retires it.
            log.warning("release_of_expired_mutator", topic=tp.topic, partition=tp.partition,
                        mutator=str(mutator.id))
        except CassandraUnavailableError as exc:
            # The next owner's takeover replays whatever window this left open.
            log.error("release_failed", topic=tp.topic, partition=tp.partition, error=str(exc))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._ownership:
            await self._take_partitions(assigned)

    async def _take_partitions(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp in self.mutators:
                continue
            try:
                mutator: Mutator | None = await self._until_done(
                    "takeover", tp, functools.partial(self._take_over, tp), (CassandraUnavailableError, KafkaError))
            except FencedError as exc:
                log.warning("takeover_lost", topic=tp.topic, partition=tp.partition, reason=str(exc))
                mutator = None
            if mutator is not None and mutator.id not in self._warming:
                with contextlib.suppress(Exception):
                    self.consumer.resume(tp)  # a fenced mutator's partition was paused

    async def _initial_last_offset(self, tp: TopicPartition) -> int:
        """First assignment ever: continue from the group's committed offset, else the reset policy."""
        committed = await self.consumer.committed(tp)
        if committed is not None:
            return int(committed) - 1
        if self.config.auto_offset_reset == "latest":
            return int((await self.consumer.end_offsets([tp]))[tp]) - 1
        return int((await self.consumer.beginning_offsets([tp]))[tp]) - 1

    async def _take_over(self, tp: TopicPartition, applier: Applier | None = None,
                         from_owner: uuid.UUID | None = None) -> Mutator:
        """Claim ``tp`` for a fresh mutator and return it. The rest runs in the background, so that a rebalance
        callback taking a dozen partitions returns within a heartbeat (it had taken a second per partition
        here, and a callback longer than the session timeout got the member evicted, over and over):

        - a fresh applier's publisher-retry window is rebuilt from the records before the start offset; the
          partition stays paused until then, and is then read from the start offset;
        - what the previous owner left (an open window to replay, mutators to retire) is finished while the
          new mutator applies: a takeover after a crash does not stop counting for as long as the replay takes.

        The new mutator writes nothing (no flush, no release) before both are done: see _takeover_pending."""
        born = now_us()
        record = MutatorRecord(
            id=uuid.uuid4(), consumer_group=self.config.group_id, topic=tp.topic, partition=tp.partition,
            host=self.host, born_us=born, expires_us=born + int(self.config.mutator_max_age_s * 2e6),
        )

        def fresh_applier() -> Applier:
            return Applier(self.router, self.counters, tp.topic, tp.partition,
                           RetryWindow(self.config.retry_window_records))

        started = time.monotonic()
        claimed = await claim(self.store, record, await self._initial_last_offset(tp), from_owner=from_owner)
        warm = applier is not None
        mutator = Mutator(record, PartitionId(self.config.group_id, tp.topic, tp.partition),
                          applier if applier is not None else fresh_applier(),
                          applied_through=claimed.start_offset - 1, flushed_through=claimed.start_offset - 1)
        self.mutators[tp] = mutator
        METRICS.ownership_changes.inc()
        METRICS.live_mutators.set(len(self.mutators))
        if warm and claimed.finished:
            self._log_taken_over(tp, mutator, await finish_take_over(self.store, self.source, claimed, fresh_applier,
                                                                     now_us()), started)
            return mutator
        if not warm:
            self._warming.add(record.id)
            with contextlib.suppress(Exception):
                self.consumer.pause(tp)
        task = asyncio.create_task(self._complete_take_over(tp, mutator, claimed, fresh_applier, started))
        self._takeovers[record.id] = task
        # Forgotten once it succeeds; a failure stays for whoever waits on it next, to raise.
        task.add_done_callback(
            lambda done: None if done.cancelled() or done.exception() is not None
            else self._takeovers.pop(record.id, None))
        return mutator

    async def _complete_take_over(self, tp: TopicPartition, mutator: Mutator, claimed: Claim,
                                  applier_factory: Callable[[], Applier], started: float) -> None:
        accept_lost = self.config.on_records_lost == "skip"
        if mutator.id in self._warming:
            # Reads Kafka again: retried while the broker is away (a restart), as flushes wait for Cassandra.
            await self._until_done("warm_up", tp, functools.partial(mutator.applier.warm_up, self.source,
                                                                    claimed.start_offset), (KafkaError,))
            start = await self._until_done("log_start", tp, functools.partial(
                self.source.log_start, tp.topic, tp.partition), (KafkaError,))
            if start > mutator.applied_through + 1:
                lost = RecordsLostError(tp.topic, tp.partition, mutator.applied_through + 1, start - 1)
                if not self._records_lost(tp, mutator, lost):
                    return
                mutator.skip_to(start)
            self._warming.discard(mutator.id)
            if self.mutators.get(tp) is mutator and not mutator.fenced:
                # Records fetched before the pause were skipped: read on from what is applied.
                with contextlib.suppress(Exception):
                    self.consumer.seek(tp, mutator.applied_through + 1)
                    self.consumer.resume(tp)
        while True:
            try:
                # Kafka errors too: a broker restarting during a replay must not fail the takeover for good.
                result = await self._until_done("takeover", tp, functools.partial(
                    self._finish_take_over, tp, claimed, applier_factory, accept_lost),
                    (CassandraUnavailableError, KafkaError))
                break
            except FencedError as exc:
                mutator.fenced = True  # another member claimed it meanwhile; this one wrote nothing, and never will
                self._drop(tp, mutator, str(exc))
                return
            except RecordsLostError as exc:
                if not self._records_lost(tp, mutator, exc):
                    return
                accept_lost = True
        self._log_taken_over(tp, mutator, result, started)
        if self.mutators.get(tp) is mutator and not mutator.fenced:
            with contextlib.suppress(Exception):
                self.consumer.resume(tp)  # if paused at flush_max_dirty while the takeover ran

    async def _finish_take_over(self, tp: TopicPartition, claimed: Claim, applier_factory: Callable[[], Applier],
                                accept_lost: bool) -> Takeover:
        return await finish_take_over(self.store, self.source, claimed, applier_factory, now_us(),
                                      on_invalid=functools.partial(self._send_dead_letter, tp), accept_lost=accept_lost)

    def _records_lost(self, tp: TopicPartition, mutator: Mutator, lost: RecordsLostError) -> bool:
        """Records to count were deleted from the log. True to go on without them (``on_records_lost`` =
        skip); otherwise the partition is no longer consumed, and the process reports unready."""
        METRICS.records_lost.labels(tp.topic, str(tp.partition)).inc(lost.last - lost.first + 1)
        skip = self.config.on_records_lost == "skip"
        log.error("records_lost", topic=tp.topic, partition=tp.partition, first=lost.first, last=lost.last,
                  action="skipped" if skip else "partition_stopped",
                  hint=None if skip else "set COUNTERSINK_CONSUMER__ON_RECORDS_LOST=skip to count on without them")
        if skip:
            return True
        self._stopped_partitions[tp] = lost
        METRICS.partitions_stopped.set(len(self._stopped_partitions))
        self._warming.discard(mutator.id)
        if self.mutators.get(tp) is mutator:
            del self.mutators[tp]
        METRICS.live_mutators.set(len(self.mutators))
        with contextlib.suppress(Exception):
            self.consumer.pause(tp)
        return False

    def _log_taken_over(self, tp: TopicPartition, mutator: Mutator, result: Takeover, started: float) -> None:
        log.info("partition_taken_over", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id),
                 start_offset=result.start_offset, previous_owner=str(result.previous_owner),
                 replayed_records=result.replayed_records, replayed_instances=result.replayed_instances,
                 retired=[str(m) for m in result.retired], seconds=round(time.monotonic() - started, 3))

    def _takeover_pending(self, mutator: Mutator) -> bool:
        """True while ``mutator``'s takeover is still running in the background: it must write nothing yet.
        Raises what made the takeover fail, if it failed."""
        task = self._takeovers.get(mutator.id)
        if task is None:
            return False
        if not task.done():
            return True
        task.result()
        return False

    async def _abandon_take_over(self, tp: TopicPartition, mutator: Mutator) -> None:
        """Stop a takeover still running, as a crash would: nothing it did needs undoing (the next claimant
        finishes it the same way: README, "Guarantees")."""
        task = self._takeovers.pop(mutator.id, None)
        self._warming.discard(mutator.id)
        mutator.fenced = True  # never writes
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        log.info("takeover_abandoned", topic=tp.topic, partition=tp.partition, mutator=str(mutator.id))

    # -------------------------------------------------------------------------------------- shutdown

    async def stop(self) -> None:
        """Final flush, ownership released, clients closed. Safe to call twice."""
        if not self._started:
            return
        self._started = False
        self._stopping.set()
        try:
            async with self._ownership:
                await self._release_partitions(list(self.mutators))
                task, self._flushing = self._flushing, None
                if task is not None and not task.cancelled() and task.exception() is not None:
                    # The releases above flushed everything again; this only says why the earlier one failed.
                    log.warning("flush_failed_before_stop", error=str(task.exception()))
        finally:
            await self.close()
            log.info("consumer_stopped", host=self.host)

    async def close(self) -> None:
        """Close every client, started or not (also after a start that failed half way)."""
        for unfinished in self._takeovers.values():
            unfinished.cancel()  # only those of mutators dropped before anything waited for them
        for close in (self.health.stop, self.consumer.stop, self.source.stop, self.producer.stop,
                      self.cassandra.stop):
            with contextlib.suppress(Exception):
                await close()
