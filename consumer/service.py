"""The consumer process: a Kafka consumer group member running one mutator per assigned partition.

This module is the loop and the wiring. The loop fetches a batch, applies it to the mutators' in-memory
states (invalid events go to the dead-letter topic: ``consumer.dead_letters``), and starts a flush when one
is due (``consumer.schedule``); the flush runs in the background (``consumer.flushing``). Rebalances and
rotations move ownership (``consumer.ownership``), by the protocol of ``consumer.protocol``. Start positions
come from the ownership rows, never from Kafka's committed offsets, which are still committed after each
flush for lag monitoring.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from consumer import schedule
from consumer.applying import KafkaRecord, Mutator, RecordsLostError, RecordSource
from consumer.cassandra_store import CassandraStore
from consumer.cleanup_policies import check_policies, deduplicating
from consumer.dead_letters import DeadLetters, refuse_dead_letter_loop
from consumer.flushing import Flushing
from consumer.handovers import NO_HANDOVERS, HandoverBook
from consumer.kafka_source import KafkaRecordSource
from consumer.ownership import Ownership, PartitionRetry
from consumer.resetting import NO_RESETS, ResetBook
from consumer.schedule import Progress
from consumer.schema_source import SchemaLoadingSource
from consumer.storage import Store
from countersink.backfills import CassandraHandovers
from countersink.cassandra import CassandraClient
from countersink.consistency import check_deciding_reads, replication_factors
from countersink.gc_runs import GcAgeSampler
from countersink.health import HealthServer
from countersink.kafka import (
    cleanup_policies,
    ensure_topics,
    known_position,
    make_consumer,
    make_producer,
    missing_topics,
)
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.registry import CounterRegistry
from countersink.resets import CassandraResets
from countersink.retry import Backoff, StopRequested, is_retriable, pause_unless_stopped, wait_until_reachable
from countersink.schema_registry import SchemaLoader, SchemaRegistryUnavailableError, schema_cache
from countersink.settings import Settings
from countersink.topic_ids import NO_TOPIC_CHECKS, KafkaTopicIds, TopicCheck, TopicIds, TopicRecreatedError
from schemas import formats
from schemas.definitions import CounterSet
from schemas.errors import CompactedTopicError, CountersinkError
from schemas.events import EventRouter

log = get_logger(__name__)


class CounterRedefinedError(CountersinkError):
    """Raised when a counter this process counts was dropped and defined again while it did not look (frozen
    through the drop, its release and the new definition): it holds partitions where the new counter is counted,
    and any flush of them would move past records without it. It exits without a last flush (the next owners
    replay what it applied since its last one, with the new definitions)."""


class RebalanceFailedError(CountersinkError):
    """Raised by the consumer's loop after a rebalance callback failed. aiokafka logs a callback's error and
    goes on, which would leave partitions assigned to this member and never consumed (a failed take of one
    partition leaves the rest of the assignment unclaimed): the process stops instead, releasing what it
    holds, and exits 1 for its supervisor to restart it; the restarted process rejoins the group."""

# A batch that starts this many offsets past the last one applied makes the loop ask for the log start: gaps
# that small are transaction markers or aborted records; retention deletes whole segments.
GAP_WORTH_A_LOOK = 100


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        try:
            await self.service.on_partitions_revoked(revoked)
        except Exception as exc:  # aiokafka would only log it, and go on
            self.service.rebalance_failed("on_partitions_revoked", revoked, exc)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        try:
            await self.service.on_partitions_assigned(assigned)
        except Exception as exc:  # aiokafka would only log it, and go on
            self.service.rebalance_failed("on_partitions_assigned", assigned, exc)


class ConsumerService:
    """``start()``, ``run()`` until ``request_stop()``, ``stop()`` (safe twice); or ``async with``.

    The store, the record source and the Kafka clients are built from the settings unless given: a test
    may run the real loop and ownership code over stand-ins of its own."""

    def __init__(self, settings: Settings, counters: CounterSet, *, cassandra: CassandraClient | None = None,
                 store: Store | None = None, source: RecordSource | None = None,
                 consumer: AIOKafkaConsumer | None = None, producer: AIOKafkaProducer | None = None) -> None:
        self.settings = settings
        self.config = settings.consumer
        self.counters = counters
        refuse_dead_letter_loop(counters, self.config.dead_letter_topic)
        # Avro, Protobuf and JSON Schema topics: writer schemas by id, loaded before any record naming them is
        # routed (a registry away is a wait, unready; schemas.formats, countersink.schema_registry).
        self.schema_cache = schema_cache(settings.schema_registry)
        self.schemas = SchemaLoader(settings.schema_registry, counters, self.schema_cache)
        # While the registry cannot be reached, the partitions whose records name a schema not in the cache wait,
        # paused and sought back to what their mutator applied, and the others go on: the ids each waits for,
        # why the registry last failed, and the task that asks it again while any partition waits.
        self._schema_held: dict[TopicPartition, set[int]] = {}
        self._registry_away = ""
        self._schema_retry: asyncio.Task[None] | None = None
        self.schema_error: Exception | None = None  # what that task met that asking again does not mend
        self.router = EventRouter(counters, max_event_bytes=self.config.max_event_bytes,
                                  on_late=lambda counter: METRICS.late_events.labels(counter).inc(),
                                  max_future_skew_s=self.config.max_future_skew_s,
                                  decoders=formats.decoders(counters.formats, self.schema_cache, counters.schema_base),
                                  on_not_applicable=lambda counter, reason:
                                      METRICS.not_applicable.labels(counter, reason).inc())
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self.cassandra = cassandra or CassandraClient(settings.cassandra, app="countersink-consumer")
        self.registry = CounterRegistry(self.cassandra, settings.cassandra.replay_read_consistency)
        self._registry_checked_at = float("-inf")  # start() registers the counters: as good as a check
        self._registry_check_failed = False
        self._registry_look: asyncio.Task[None] | None = None  # the registry read in flight, if any
        self._registry_look_started = float("-inf")
        self.store: Store = store or CassandraStore(self.cassandra)
        self.source: RecordSource = source or KafkaRecordSource(settings.kafka)
        if self.schemas.needed:
            self.source = SchemaLoadingSource(self.source, self.schemas)
        self.producer = producer or make_producer(settings.kafka)
        self.consumer = consumer or make_consumer(
            settings.kafka,
            group_id=self.config.group_id,
            enable_auto_commit=False,
            # Start positions come from the ownership rows (auto_offset_reset applies there, to a partition
            # seen for the first time). The client resets only a position that fell off the log, and then to
            # the log start, which _check_for_lost_records sees and reports.
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.config.session_timeout_ms // 4),
            max_poll_records=self.config.max_poll_records,
        )
        self._stopping = asyncio.Event()
        self._stop_requested_at: float | None = None
        retry = PartitionRetry(self.config, lambda: self._stop_requested_at)
        self.dead_letters = DeadLetters(self.producer, self.config)
        resets: ResetBook = NO_RESETS
        handovers: HandoverBook = NO_HANDOVERS
        topic_ids: TopicCheck = NO_TOPIC_CHECKS
        if isinstance(self.store, CassandraStore):
            resets = CassandraResets(self.cassandra, self.store.read_cl, self.store.write_cl)
            handovers = CassandraHandovers(self.cassandra, self.host)
            topic_ids = TopicIds(KafkaTopicIds(self.settings.kafka), self.cassandra, self.host)
        self.ownership = Ownership(self.config, self.host, self.router, counters, self.store, self.source,
                                   self.consumer, self.dead_letters, retry, resets=resets, handovers=handovers,
                                   topic_ids=topic_ids)
        self.flushing = Flushing(self.store, self.ownership, self.dead_letters, retry, self.cassandra)
        # Held while a batch is applied, flushed and rotated, and by the rebalance callbacks (which aiokafka
        # runs in its coordinator task, concurrently with this loop): a rotation must never take over a
        # partition that a revoke is handing to another member at the same moment.
        self._lock = asyncio.Lock()
        self._started = False
        self.ready = False
        # What made a rebalance callback fail: the loop raises it (RebalanceFailedError), unready meanwhile.
        self.rebalance_error: Exception | None = None
        gc_age = GcAgeSampler(self.cassandra)

        async def before_scrape() -> None:
            self.cassandra.sample_driver_metrics()
            await gc_age()

        self.waiting_for_topics: list[str] = []
        self.waiting_for_server = ""  # Cassandra or Kafka while the start waits for it to answer
        self.redefined: CounterRedefinedError | None = None  # set by a registry look: the loop raises it
        # Partitions assigned but not counted: their topic became compacted and a counter on it drops publisher
        # retries by event id (consumer.cleanup_policies). Unready until they are revoked or the topic is fixed.
        self.refused: dict[TopicPartition, str] = {}
        self._compacted: dict[str, str] = {}  # the topics found compacted at the last look, with why
        self._deduplicating = deduplicating(counters, self.config.retry_window_records)
        self.health = HealthServer(self.config.health_port, lambda: self.is_ready, host=self.config.health_host,
                                   before_scrape=before_scrape, why_not_ready=self._why_not_ready)

    @property
    def mutators(self) -> dict[TopicPartition, Mutator]:
        return self.ownership.mutators

    @property
    def is_ready(self) -> bool:
        """What /healthz says: consuming, no partition stopped for lost records, none refused (compacted), no
        rebalance callback failed."""
        return (self.ready and self._started and not self.ownership.stopped and not self.refused
                and self.rebalance_error is None and self.schema_wait is None)

    async def __aenter__(self) -> ConsumerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect, check the settings against the keyspace, join the group. Raises
        :class:`~countersink.retry.StopRequested` when a stop is requested meanwhile."""
        if self._started:
            return
        timeout_s = self.config.startup_timeout_s
        if self.config.health_port:
            # Before anything is waited for, so that /readyz says what (a probe finding the port closed cannot
            # tell a process waiting for its servers from one that is gone).
            await self.health.start()
        self.waiting_for_server = "Cassandra"
        await wait_until_reachable("cassandra", self._prepare_cassandra, timeout_s=timeout_s, stop=self._stopping)
        self.waiting_for_server = "Kafka"
        await wait_until_reachable("kafka", functools.partial(
            ensure_topics, self.settings.kafka, {self.config.dead_letter_topic: self.config.dead_letter_partitions},
            replication=self.config.dead_letter_replication_factor), timeout_s=timeout_s, stop=self._stopping)
        self.waiting_for_server = ""
        await self._wait_for_topics()
        # Refused before the group is joined (not retriable): CompactedTopicError names the topics and counters.
        policies: dict[str, str] = {}

        async def look_up_policies() -> None:
            policies.update(await cleanup_policies(self.settings.kafka, self._deduplicating))

        await wait_until_reachable("kafka", look_up_policies, timeout_s=timeout_s, stop=self._stopping)
        check_policies(self.counters, self.config.retry_window_records, policies)
        await self.producer.start()
        start_source = getattr(self.source, "start", None)
        if start_source is not None:
            await start_source()
        self.consumer.subscribe(topics=list(self.counters.topics), listener=_Rebalance(self))
        await self.consumer.start()
        self._started = True
        log.info("consumer_started", group=self.config.group_id, topics=list(self.counters.topics), host=self.host)

    async def _wait_for_topics(self) -> None:
        """The topics the definitions name exist before the group is joined: created when ``create_topics``
        says so, else waited for, unready, with the missing names in the log (each minute) and on /readyz."""
        kafka = self.settings.kafka
        missing: list[str] = []

        async def look() -> None:
            missing[:] = await missing_topics(kafka, self.counters.topics)

        await look()
        if missing and self.config.create_topics:
            # Never compacted, whatever the broker's default, when a counter deduplicates by event id on it.
            await ensure_topics(kafka, dict.fromkeys(missing, self.config.topic_partitions),
                                replication=self.config.topic_replication_factor, configs={
                topic: {"cleanup.policy": "delete"} for topic in missing if topic in self._deduplicating})
            log.info("topics_created", topics=missing, partitions=self.config.topic_partitions)
            return
        checks = 0
        while missing:
            self.waiting_for_topics = list(missing)
            if checks % 12 == 0:
                log.warning("topics_missing", topics=self.waiting_for_topics, hint="create them (countersink "
                            "topics create --counters FILE), or start the consumer with --create-topics")
            checks += 1
            if await pause_unless_stopped(5.0, self._stopping):
                raise StopRequested("stop requested while waiting for topics")
            await wait_until_reachable("kafka", look, timeout_s=self.config.startup_timeout_s, stop=self._stopping)
        if self.waiting_for_topics:
            log.info("topics_found", topics=self.waiting_for_topics)
        self.waiting_for_topics = []

    def _why_not_ready(self) -> str:
        if self.rebalance_error is not None:
            return f"a rebalance callback failed, exiting: {self.rebalance_error!r}"
        if self.refused:
            return f"topics refused: {', '.join(sorted({tp.topic for tp in self.refused}))} (compacted)"
        if self.waiting_for_server:
            return f"waiting for {self.waiting_for_server} to answer"
        if self.schema_wait is not None:
            return f"waiting for the schema registry: {self.schema_wait}"
        if self.waiting_for_topics:
            return f"waiting for topics: {', '.join(self.waiting_for_topics)}"
        if self.ownership.stopped:
            lost = sorted(f"{tp.topic}-{tp.partition}" for tp, why in self.ownership.stopped.items()
                          if isinstance(why, RecordsLostError))
            recreated = sorted({tp.topic for tp, why in self.ownership.stopped.items()
                                if isinstance(why, TopicRecreatedError)})
            return "; ".join([*([f"partitions stopped for lost records: {', '.join(lost)}"] if lost else []),
                              *([f"topics deleted and created again, not consumed: {', '.join(recreated)}"]
                                if recreated else [])])
        if not self._started:
            return "starting"
        return "joining the consumer group" if not self.ready else ""

    async def _prepare_cassandra(self) -> None:
        await self.cassandra.start()
        # Refused before anything is written or consumed: a replay that reads a stale shard loses events. The
        # keyspace as it exists, else as it is about to be created.
        factors = await self.cassandra.replication_factors() or replication_factors(self.settings.cassandra.replication)
        check_deciding_reads(self.settings.cassandra, factors,
                             {"replay_read_consistency": self.settings.cassandra.replay_read_consistency})
        await self.cassandra.ensure_schema()
        # Before anything is counted: a changed meaning under a recorded name is refused (not retriable).
        # One group per keyspace: a counter recorded for another group is refused too.
        # When each counter was recorded decides where a takeover counts one it adds (consumer.ownership).
        self.ownership.registered_us = await self.registry.register(self.counters, self.host, self.config.group_id)
        self._registry_checked_at = time.monotonic()

    def request_stop(self) -> None:
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    # --------------------------------------------------------------------------------- the main loop

    async def run(self) -> None:
        """Consume until :meth:`request_stop`. A flush still failing for a server that is away when the stop
        comes is given up once its retries have had ``flush_retry_max_s`` more (nothing is lost: the next
        owner replays the window it left open); :meth:`stop` then releases what it can."""
        try:
            await self._consume()
        except Exception as exc:
            if not (self._stopping.is_set() and is_retriable(exc)):
                raise
            log.warning("flush_given_up_for_stop", error=str(exc))

    async def _consume(self) -> None:
        while not self._stopping.is_set():
            # A counter redefined first: the look that finds it also marks it dropped, which makes a takeover
            # running meanwhile refuse its partition, and that refusal's exit flushes the other partitions.
            if self.redefined is not None:
                raise self.redefined  # exit 2, with no last flush
            if self.ownership.refusal is not None:
                raise self.ownership.refusal  # exit 2: a partition is counted for a counter these definitions lack
            if self.schema_error is not None:
                raise self.schema_error
            if self.rebalance_error is not None:
                raise RebalanceFailedError(f"a rebalance callback failed: {self.rebalance_error!r}") from (
                    self.rebalance_error)
            batches = await self.consumer.getmany(timeout_ms=200, max_records=self.config.max_poll_records)
            waiting: dict[TopicPartition, list[int]] = {}
            if batches and self.schemas.needed:
                batches, waiting = await self._load_schemas(batches)
            self.ready = True
            offsets = None
            async with self._lock:
                for tp, ids in waiting.items():
                    self._hold_for_schemas(tp, ids)
                for tp, records in batches.items():
                    # None when the partition was revoked after this batch was fetched, or is warming up (then
                    # its partition is read again from its start once it is warm)
                    mutator = self.ownership.applying(tp)
                    if mutator is None:
                        continue
                    if records[0].offset > mutator.applied_through + GAP_WORTH_A_LOOK and not (
                            await self._check_for_lost_records(tp, mutator)):
                        continue  # stopped: records it should have counted are gone
                    if any(record.headers for record in records):
                        # Control records (resets) are looked up before the batch is applied: the hot path
                        # decides from what the applier knows, and never waits.
                        await self.ownership.retry("resets", tp, functools.partial(mutator.applier.learn, records))
                    self._apply(tp, mutator, records)
                    if len(mutator.dirty) >= self.config.flush_max_dirty and self.ownership.takeover_pending(mutator):
                        # It cannot flush before its takeover is finished: bound what it holds meanwhile.
                        self.consumer.pause(tp)
                self._advance_positions()
                if self.flushing.done:
                    offsets = await self._finish_flush()
                if self._flush_due() and self._registry_fresh():
                    if self.flushing.in_flight:
                        offsets = await self._finish_flush()  # one at a time: wait for the last one
                    if await self.ownership.check_topics():
                        self.flushing.start()
            if offsets:
                await self._commit_for_lag(offsets)

    async def _load_schemas(self, batches: Mapping[TopicPartition, Sequence[KafkaRecord]]
                            ) -> tuple[dict[TopicPartition, Sequence[KafkaRecord]], dict[TopicPartition, list[int]]]:
        """The batches whose writer schemas are in the cache, once loaded; and the partitions whose batch names
        one the registry cannot give now, with the ids it names that are not cached (nothing of theirs is
        applied: they wait, :meth:`_hold_for_schemas`). While the registry is away, a batch naming a schema not
        cached waits without asking it: the task asking again (:meth:`_ask_registry_again`) asks for it."""
        ready: dict[TopicPartition, Sequence[KafkaRecord]] = {}
        waiting: dict[TopicPartition, list[int]] = {}
        for tp, records in batches.items():
            if self._schema_retry is None and not waiting:
                try:
                    # Held for the partition until its next batch: routed after the lock is taken, which a
                    # rebalance waiting out a flush to a server away may hold for longer than the cache's idle_s.
                    await self.schemas.load(tp.topic, (record.value for record in records), tp)
                except SchemaRegistryUnavailableError as exc:
                    self._registry_away = str(exc)
                    waiting[tp] = self.schemas.uncached(tp.topic, (record.value for record in records))
                    continue
            elif missing := self.schemas.uncached(tp.topic, (record.value for record in records), tp):
                waiting[tp] = missing
                continue
            ready[tp] = records
        return ready, waiting

    @property
    def schema_wait(self) -> str | None:
        """Why records wait for the registry; None when no partition waits."""
        return self._registry_away if self._schema_held else None

    def _hold_for_schemas(self, tp: TopicPartition, ids: list[int]) -> None:
        """Make ``tp`` wait for the registry (under the lock): paused, and read again from what its mutator
        applied (the position it skips to), until :meth:`_ask_registry_again` has the schemas of ``ids``. A
        partition no longer applying here (revoked, or warming up: read again from its start then) is left
        to what reads it next."""
        mutator = self.ownership.applying(tp)
        if mutator is None:
            return
        if not self._schema_held:
            log.warning("schema_registry_unavailable", error=self._registry_away)
        self._schema_held.setdefault(tp, set()).update(ids)
        self.consumer.seek(tp, mutator.applied_through + 1)
        self.consumer.pause(tp)
        if self._schema_retry is None:
            self._schema_retry = asyncio.create_task(self._ask_registry_again())

    async def _ask_registry_again(self) -> None:
        """While partitions wait: ask the registry, with backoff, for the schemas they wait for (every topic's,
        each round), and let each go on (if still counted here) once it has all of its own, read from where it
        waited. Ends when none waits (revoked ones are forgotten)."""
        pauses = Backoff(first_s=0.2, max_s=self.settings.schema_registry.retry_max_s).pauses()
        while True:
            async with self._lock:
                if not self._schema_held:
                    self._schema_retry = None
                    return
                wanted: dict[str, set[int]] = {}
                for tp, ids in self._schema_held.items():
                    wanted.setdefault(tp.topic, set()).update(ids)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pauses())
            if self._stopping.is_set():
                return
            fetched: dict[str, set[int]] = {}
            failed: SchemaRegistryUnavailableError | None = None
            for topic, ids in wanted.items():
                try:
                    await self.schemas.fetch(topic, sorted(ids))
                except SchemaRegistryUnavailableError as exc:
                    failed = exc
                    continue
                except Exception as exc:  # raised by the main loop, as when it asked the registry itself
                    self.schema_error = exc  # (the registry refusing the credentials: the consumer ends)
                    return
                fetched[topic] = ids
            async with self._lock:
                for tp, ids in list(self._schema_held.items()):
                    if ids <= fetched.get(tp.topic, set()):
                        del self._schema_held[tp]
                        if self.ownership.applying(tp) is not None:
                            self.consumer.resume(tp)
                if failed is not None:
                    self._registry_away = str(failed)
                else:
                    log.info("schema_registry_available")

    def _registry_fresh(self) -> bool:
        """Whether a flush may start: the counter registry was read within ``registry_check_s``. Once half of
        that has passed, it is read again in the background (``_look_at_registry``), so the loop never waits
        for it; while it cannot be read, no flush starts (``countersink drop`` relies on no flush starting on
        an older look), and flushes would fail anyway."""
        now = time.monotonic()
        look = self._registry_look
        if (now - self._registry_checked_at >= self.config.registry_check_s / 2 and (look is None or look.done())
                and now - self._registry_look_started >= 1.0):
            self._registry_look_started = now
            self._registry_look = asyncio.create_task(self._look_at_registry())
        return now - self._registry_checked_at < self.config.registry_check_s

    async def _look_at_registry(self) -> None:
        """Read the registry for counters dropped since the start. One found is refused from then on: the store
        writes none of its states (``counter_dropped`` says so once), and the other counters go on."""
        started = time.monotonic()
        # Those dropped since the start are never written again (Ownership.dropped, the store's refused).
        counted = [c.name for c in self.counters if c.name not in self.ownership.dropped]
        try:
            dropped, redefined = await self.registry.look(counted, self.ownership.registered_us)
        except Exception as exc:
            if not self._registry_check_failed:
                log.warning("registry_check_failed", error=str(exc) or type(exc).__name__,
                            action="no flush starts until the counter registry can be read")
            self._registry_check_failed = True
            return
        if self._registry_check_failed:
            log.info("registry_check_recovered")
        self._registry_check_failed = False
        for name, why in dropped.items():
            log.error("counter_dropped", counter=name, error=why,
                      action="no longer written; the other counters go on. Remove it from the definitions file "
                      "before the next start, which refuses it")
        refused = {**dropped, **redefined}
        self.ownership.dropped.update(refused)  # its claims from now on: neither counted nor handed over
        if refused and isinstance(self.store, CassandraStore):
            self.store.refused.update(refused)
        if redefined:
            # No flush starts on this look (the registry is not taken as read): the loop exits at once.
            self.redefined = CounterRedefinedError("; ".join(redefined.values()))
            return
        self._registry_checked_at = started  # the read began after this: as old as the look may be

    async def _check_for_lost_records(self, tp: TopicPartition, mutator: Mutator) -> bool:
        """A batch starts well past what the mutator applied: compaction or aborted transactions, or records
        deleted by retention while this consumer was behind (the client then moved to the log start without a
        word). Asks for the log start to tell; False when the partition is stopped for lost records."""
        return self.ownership.goes_on_from(tp, mutator, int((await self.consumer.beginning_offsets([tp]))[tp]))

    def _apply(self, tp: TopicPartition, mutator: Mutator, records: Sequence[KafkaRecord]) -> None:
        resets_before = len(mutator.positions)
        result = mutator.apply_batch(records)
        for position in mutator.positions[resets_before:]:
            log.info("reset_applied", topic=tp.topic, partition=tp.partition, offset=position.offset,
                     counter=position.counter, epoch=position.epoch, reset=position.reset_id, mutator=str(mutator.id))
        for record, error in result.invalid:
            self.dead_letters.queue(tp, record, error)
        METRICS.events_applied.inc(result.applied)
        METRICS.duplicates_dropped.inc(result.duplicates)

    def _advance_positions(self) -> None:
        """Move each mutator past the offsets the consumer skipped after its last record (transaction markers,
        aborted or compacted records), and set the lag from the consumer's position. Offsets are not records:
        on a transactional topic the last offset is a commit marker, and lag counted from the last record
        never reaches 0."""
        for tp in self.mutators:
            mutator = self.ownership.applying(tp)
            if mutator is None:
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

    def _flush_due(self) -> bool:
        progress = {tp: Progress(m.applied_through, self._log_end(tp), len(m.dirty),
                                 not self.ownership.takeover_pending(m))
                    for tp, m in self.mutators.items()}
        return schedule.flush_due(progress, self.config, since_last_s=time.monotonic() - self.flushing.last_started,
                                  last_took_s=self.flushing.last_took_s)

    async def _finish_flush(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Wait for the flush in flight (raising its error), replace the mutators it found expired, rotate
        those due, and return the offsets to commit to Kafka for lag monitoring. Called with the lock held."""
        # Replacements read records back through the one record source: one at a time, here.
        for tp, mutator in await self.flushing.finish():
            await self.ownership.replace_expired(tp, mutator)
        await self.ownership.rotate_if_due()
        return {tp: OffsetAndMetadata(m.flushed_through + 1, "") for tp, m in self.mutators.items()
                if m.flushed_through >= 0 and not m.fenced}

    async def _commit_for_lag(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit to Kafka for lag tools only (start positions come from Cassandra). Outside the ownership
        lock: during a rebalance a commit waits for the coordinator, which may be waiting for that lock."""
        with contextlib.suppress(Exception):  # lag monitoring only: never let it stop counting
            await asyncio.wait_for(self.consumer.commit(offsets), self.config.session_timeout_ms / 1000)

    # ------------------------------------------------------------------------------------ rebalancing

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            await self.flushing.wait_until_done()
            for tp in revoked:
                self.refused.pop(tp, None)
                self.schema_cache.release(tp)
                self._schema_held.pop(tp, None)
            await self.ownership.release(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            refused = await self._refused_topics({tp.topic for tp in assigned})
            for tp in assigned:
                if tp.topic in refused:
                    self.refused[tp] = refused[tp.topic]
                    self.consumer.pause(tp)
                else:
                    self.refused.pop(tp, None)
            await self.ownership.take([tp for tp in assigned if tp.topic not in refused])

    async def _refused_topics(self, topics: set[str]) -> dict[str, str]:
        """Topics of ``topics`` not to count now, each with why: a topic's cleanup.policy may have become
        compact since the start. When Kafka cannot say, a topic refused before stays refused."""
        asked = sorted(topics & set(self._deduplicating))
        if not asked:
            return {}
        try:
            # Inside the rebalance: bounded well within the session, whatever Kafka's admin requests do.
            async with asyncio.timeout(self.config.session_timeout_ms / 2000):
                policies = await cleanup_policies(self.settings.kafka, asked)
            check_policies(self.counters, self.config.retry_window_records, policies)
        except CompactedTopicError as exc:
            for topic, line in zip(sorted(exc.topics), exc.lines, strict=True):
                log.error("topic_refused", topic=topic, policy=exc.policies[topic], counters=list(exc.topics[topic]),
                          error=line)
            refused = dict(zip(sorted(exc.topics), exc.lines, strict=True))
        except Exception as exc:
            log.warning("cleanup_policy_unknown", topics=asked, error=str(exc) or type(exc).__name__)
            return {topic: why for topic, why in self._compacted.items() if topic in topics}
        else:
            refused = {}
        for topic in asked:
            self._compacted.pop(topic, None)
        self._compacted.update(refused)
        return refused

    def rebalance_failed(self, callback: str, partitions: list[TopicPartition], error: Exception) -> None:
        """A rebalance callback raised: partitions may now be assigned to this member and never consumed, and
        no rebalance would come to move them. Unready at once; the loop then raises RebalanceFailedError and
        the process exits 1 (its supervisor restarts it, and it rejoins the group). A step given up because
        a stop was requested is not a failure: the next owner finishes it."""
        if self._stopping.is_set() and is_retriable(error):
            log.warning("rebalance_given_up_for_stop", callback=callback, error=str(error))
            return
        self.rebalance_error = error
        log.error("rebalance_failed", callback=callback, error=repr(error),
                  partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in partitions),
                  action="stopping: exit 1 for the supervisor to restart the process, which rejoins the group",
                  exc_info=error)

    # -------------------------------------------------------------------------------------- shutdown

    async def stop(self) -> None:
        """Final flush, ownership released, clients closed (no final flush while Kafka cannot say its topics are
        still the ones counted: Ownership.release). Safe to call twice."""
        if not self._started:
            return
        self._started = False
        self.request_stop()
        try:
            async with self._lock:
                await self.flushing.wait_until_done()
                await self.ownership.release(list(self.mutators))
                error = self.flushing.forget()
                if error is not None:
                    # The releases above flushed everything again (or left it to the next owner, unchecked); this
                    # only says why the earlier one failed.
                    log.warning("flush_failed_before_stop", error=str(error))
        finally:
            await self.close()
            log.info("consumer_stopped", host=self.host)

    async def close(self) -> None:
        """Close every client, started or not (also after a start that failed or was stopped half way)."""
        self.ownership.cancel_takeovers()
        if self._registry_look is not None:
            self._registry_look.cancel()
        if self._schema_retry is not None:
            self._schema_retry.cancel()
        self.dead_letters.abandon()
        stop_source = getattr(self.source, "stop", None)
        closers = [self.health.stop, self.consumer.stop, self.producer.stop, self.cassandra.stop, self.schemas.stop]
        closers.append(self.ownership.topic_ids.close)
        if stop_source is not None:
            closers.insert(2, stop_source)
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
