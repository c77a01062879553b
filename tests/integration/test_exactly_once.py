"""Exactly once on real topics: transactional logs, a takeover after kill -9, a replay through a broker error,
dead letters the broker refuses whole, records deleted by retention, and consistency levels refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.cassandra_store import CassandraStore
from consumer.kafka_source import KafkaRecordSource
from consumer.protocol import claim, flush
from consumer.service import ConsumerService
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.kafka import make_admin, make_consumer, make_producer
from countersink.metrics import METRICS
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from countersink.topic_ids import TopicRecreatedError
from schemas.definitions import CounterSet, load_definitions
from schemas.events import EventRouter
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import create_again, read_topic, running, start_consumer, wait_until_started

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = """
[[counter]]
name = "trades"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "shares"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"
"""


def _event(event_id: str, symbol: str, qty: int) -> bytes:
    return json.dumps({"id": event_id, "symbol": symbol, "qty": qty}).encode()


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path,
              **consumer: object) -> Settings:
    options: dict[str, object] = {"dead_letter_topic": f"dlq-{group}", "flush_interval_s": 0.3, "health_port": 0,
                                  **consumer}
    return Settings(kafka=kafka, cassandra=cassandra,
                    consumer=ConsumerSettings(group_id=group, counters_file=counters, **options))


async def _transactions(kafka: KafkaSettings, topic: str, batches: list[list[bytes]], abort: set[int]) -> None:
    """Each batch in its own transaction, to partition 0; the batches numbered in ``abort`` are aborted."""
    producer = make_producer(kafka, transactional_id=f"tx-{uuid.uuid4().hex}")
    await producer.start()
    try:
        for number, batch in enumerate(batches):
            await producer.begin_transaction()
            for value in batch:
                await producer.send_and_wait(topic, value, partition=0)
            if number in abort:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()


async def _values(cassandra: CassandraSettings, symbols: list[str]) -> dict[tuple[str, str], object]:
    from countersink.reader import read_state

    values: dict[tuple[str, str], object] = {}
    async with CassandraClient(cassandra) as client:
        for counter in ("trades", "shares"):
            for symbol in symbols:
                state = await read_state(client, counter, symbol)
                values[(counter, symbol)] = None if state is None else state.value()
    return values


def _expected(events: list[tuple[str, str, int]]) -> dict[tuple[str, str], object]:
    counts: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    for _, symbol, qty in events:
        counts[symbol] += 1
        sums[symbol] += qty
    return {**{("trades", s): n for s, n in counts.items()}, **{("shares", s): n for s, n in sums.items()}}


async def test_a_successor_after_kill_9_drops_retries_its_predecessor_dropped_on_a_transactional_topic(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """On a transactional topic (one commit marker after every record, an aborted transaction), a consumer
    killed with kill -9 is followed by one whose retry window holds the same 20 records, not the same 20
    offsets: retries 15 records after their original are dropped, though 30 offsets away. The partition also
    reads as flushed through its last offset (the commit marker), and the group's Kafka offset shows no lag."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    first = [(f"e{i}", f"S{i % 3}", i + 1) for i in range(30)]
    await _transactions(kafka_settings, topic, [[_event(*e)] for e in first] + [[_event("gone", "S0", 1000)] * 5],
                        abort={30})
    log = tmp_path / "consumer.log"
    window = {"retry_window_records": 20, "flush_interval_s": 0.3, "dead_letter_topic": f"dlq-{group}",
              "group_id": group, "counters_file": counters}
    process = start_consumer(kafka_settings, cassandra_settings, log, **window)
    try:
        await wait_until_started(log, process)
        ends = await end_offsets(kafka_settings, {topic: 1})
        await wait_until_flushed(cassandra_settings, group, ends, within_s=60)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    # Retries of e15..e29, each 15 records (30 offsets) after its original, and ten new events.
    fresh = [(f"n{i}", f"S{i % 3}", 100 + i) for i in range(10)]
    await _transactions(kafka_settings, topic, [[_event(*e)] for e in first[15:] + fresh], abort=set())

    settings = _settings(kafka_settings, cassandra_settings, group, counters, retry_window_records=20)
    async with running(ConsumerService(settings, load_definitions(counters))):
        ends = await end_offsets(kafka_settings, {topic: 1})
        await wait_until_flushed(cassandra_settings, group, ends, within_s=60)
        tp = TopicPartition(topic, 0)
        deadline = time.monotonic() + 10
        async with make_consumer(kafka_settings, group_id=group, enable_auto_commit=False) as probe:
            committed = await probe.committed(tp)
            while committed != ends[tp] and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                committed = await probe.committed(tp)
        assert committed == ends[tp], f"the group's offset {committed} is short of the log end {ends[tp]}"
    assert await _values(cassandra_settings, ["S0", "S1", "S2"]) == _expected(first + fresh)


async def _compacted_offsets(kafka: KafkaSettings, topic: str, within_s: float = 90) -> list[int]:
    """Wait until the log cleaner has compacted the topic (offsets with no record at the log's start), and
    return the offsets of the records left. New records roll the active segment, which is never compacted."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            await producer.send_and_wait(topic, _event(f"roll-{uuid.uuid4().hex}", "R", 1), key=b"roll", partition=0)
            offsets = [r.offset for r in await read_topic(kafka, topic, at_least=10**9, within_s=1.5)]
            if len(offsets) < offsets[-1] + 1 - 1000:  # most updates gone, not just some of the rolls
                return offsets
        raise AssertionError(f"{topic} was not compacted within {within_s} s")
    finally:
        await producer.stop()


async def test_a_successor_on_a_compacted_topic_drops_the_retries_its_predecessor_dropped(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path
) -> None:
    """On a topic compacted before it is counted (records superseded by a later one with the same key
    removed, leaving offsets without a record; then set to cleanup.policy=delete, as the consumer requires
    of a topic counted with event ids), a consumer killed with kill -9 is followed by one whose retry window
    holds the same 200 records: retries within them are dropped though more than 200 offsets away, and what
    counts is what the log kept."""
    topic = f"compacted-{uuid.uuid4().hex[:10]}"
    admin = make_admin(kafka_settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={
            "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})])
    finally:
        await admin.close()
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    try:
        # Each kept event has a key of its own; between them, forty updates of one key of which only the last
        # is kept: about 40 offsets in 41 lose their record once the log is compacted.
        kept = [(f"k{i}", f"S{i % 3}", i + 1) for i in range(30)]
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            for i, event in enumerate(kept):
                await producer.send_and_wait(topic, _event(*event), key=event[0].encode(), partition=0)
                for update in range(40):
                    await producer.send_and_wait(topic, _event(f"u{i}-{update}", "U", 1), key=b"update",
                                                 partition=0)
        finally:
            await producer.stop()
        offsets = await _compacted_offsets(kafka_settings, topic)
        updates_kept = sum(1 for r in await read_topic(kafka_settings, topic, at_least=len(offsets))
                           if json.loads(r.value)["symbol"] == "U")
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": "delete"})])
        finally:
            await admin.close()

        log = tmp_path / "consumer.log"
        process = start_consumer(kafka_settings, cassandra_settings, log, retry_window_records=200,
                                 dead_letter_topic=f"dlq-{group}", group_id=group, counters_file=counters)
        try:
            await wait_until_started(log, process)
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}),
                                     within_s=60)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        # Retries of the last ten kept events under keys of their own (so compaction keeps them), within 200
        # records of their originals (ten kept events, an update, the rolls) but 400 offsets and more away.
        fresh = [(f"n{i}", f"S{i % 3}", 100 + i) for i in range(5)]
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            for event in kept[-10:]:
                await producer.send_and_wait(topic, _event(*event), key=f"retry-{event[0]}".encode(), partition=0)
            for event in fresh:
                await producer.send_and_wait(topic, _event(*event), key=event[0].encode(), partition=0)
        finally:
            await producer.stop()

        settings = _settings(kafka_settings, cassandra_settings, group, counters, retry_window_records=200)
        async with running(ConsumerService(settings, load_definitions(counters))):
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}),
                                     within_s=60)
        values = await _values(cassandra_settings, ["S0", "S1", "S2"])
        assert values == _expected(kept + fresh)
        # The updates of one key count as the log kept them when they were read (the cleaner may have
        # removed more since it was first seen compacted), never as they were published.
        updates = (await _values(cassandra_settings, ["U"]))[("trades", "U")]
        assert isinstance(updates, int)
        assert 1 <= updates <= updates_kept < 1200
    finally:
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


class _FlakySource:
    """The consumer's own record source, whose first replay read fails as during a broker restart."""

    def __init__(self, source) -> None:  # type: ignore[no-untyped-def]
        self._source = source
        self.failures = 0

    async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        if self.failures == 0:
            self.failures += 1
            raise KafkaConnectionError("broker restarting")
        async for chunk in self._source.stream(topic, partition, first, last):
            yield chunk

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._source, name)


class _WritesFail:
    """A store whose shard writes fail: a flush opens its window and writes nothing, as if its process died."""

    def __init__(self, store: CassandraStore) -> None:
        self._store = store

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int, writes: list[ShardWrite],
                           *, source: bytes) -> None:
        raise CassandraUnavailableError("the process died here")

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)


async def test_a_replay_survives_a_broker_error_and_dead_letters_what_it_skips(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A mutator that opened a flush window and died before writing is replayed by its successor; the
    successor's first read from Kafka fails and is retried, every event of the window counts once, and the
    window's malformed records reach the dead-letter topic though their first owner never sent them."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    definitions = load_definitions(counters)
    events = [(f"e{i}", f"S{i % 2}", i) for i in range(12)]
    values = [_event(*e) for e in events]
    values[4:4] = [b"{not json"]
    values[9:9] = [b'{"id": "bad", "symbol": ["S0"], "qty": 7}']  # refused by both counters (a list as key)
    await _transactions(kafka_settings, topic, [values], abort=set())

    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        born = time.time_ns() // 1000
        record = MutatorEntry(uuid.uuid4(), group, topic, 0, "dead", born, born + 3_600_000_000)
        claimed = await claim(store, record, -1)
        applier = Applier(EventRouter(definitions), definitions, topic, 0, RetryWindow(100))
        mutator = Mutator(record, PartitionId(group, topic, 0), applier, claimed.start_offset - 1,
                          claimed.start_offset - 1)
        async with make_consumer(kafka_settings, topic, group_id=None, auto_offset_reset="earliest",
                                 isolation_level="read_committed") as reader:
            got: list = []
            while len(got) < len(values):
                got.extend(r for batch in (await reader.getmany(timeout_ms=500)).values() for r in batch)
        for message in got:
            mutator.apply(message)
        with pytest.raises(CassandraUnavailableError):
            await flush(_WritesFail(store), mutator, time.time_ns() // 1000)  # type: ignore[arg-type]
        row = await store.read_partition(mutator.pid)
        assert row is not None
        assert row.window_open

    flaky = _FlakySource(KafkaRecordSource(kafka_settings))
    service = ConsumerService(_settings(kafka_settings, cassandra_settings, group, counters), definitions,
                              source=flaky)  # type: ignore[arg-type]
    async with running(service):
        ends = await end_offsets(kafka_settings, {topic: 1})
        await wait_until_flushed(cassandra_settings, group, ends, within_s=60)
    assert flaky.failures == 1
    assert await _values(cassandra_settings, ["S0", "S1"]) == _expected(events)
    dead = await read_topic(kafka_settings, f"dlq-{group}", 2)
    assert sorted(r.value for r in dead) == sorted([b"{not json", b'{"id": "bad", "symbol": ["S0"], "qty": 7}'])


async def test_a_dead_letter_the_broker_refuses_whole_goes_truncated_and_counting_goes_on(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """An invalid event larger than the dead-letter topic accepts is sent cut to 1 KiB with a header saying
    so; the events after it are counted."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    admin = make_admin(kafka_settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(f"dlq-{group}", 1, 1, topic_configs={"max.message.bytes": "4096"})])
    finally:
        await admin.close()
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    huge = json.dumps({"id": "huge", "symbol": ["S0"], "qty": "x" * 20_000}).encode()  # refused by both counters
    events = [(f"e{i}", "S0", 1) for i in range(5)]
    await _transactions(kafka_settings, topic, [[huge, *(_event(*e) for e in events)]], abort=set())

    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    truncated_before = METRICS.dead_letters_truncated._value.get()
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}),
                                 within_s=60)
    assert await _values(cassandra_settings, ["S0"]) == _expected(events)
    dead = await read_topic(kafka_settings, f"dlq-{group}", 1)
    assert len(dead) == 1
    assert dead[0].value == huge[:1024]
    assert dict(dead[0].headers)["countersink.truncated"] == f"{len(huge)} bytes cut to 1024".encode()
    assert METRICS.dead_letters_truncated._value.get() == truncated_before + 1


async def _delete_before(kafka: KafkaSettings, topic: str, offset: int) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(offset)}, timeout_ms=10_000)
    finally:
        await admin.close()


async def _counted_once(kafka: KafkaSettings, cassandra: CassandraSettings, topic_factory, tmp_path: Path
                        ) -> tuple[str, Settings, CounterSet, list[tuple[str, str, int]]]:
    """A one-partition topic of ten events, counted and flushed by a consumer that then stops: its topic, the
    consumer's settings and definitions, the events."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    definitions = load_definitions(counters)
    first = [(f"a{i}", "S0", 1) for i in range(10)]
    await publish(kafka, topic, [_event(*e) for e in first])
    settings = _settings(kafka, cassandra, group, counters)
    async with running(ConsumerService(settings, definitions)):
        await wait_until_flushed(cassandra, group, await end_offsets(kafka, {topic: 1}))
    return topic, settings, definitions, first


async def test_records_deleted_by_retention_under_a_stopped_consumer_are_reported_then_stopped_or_skipped(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """Records deleted before they were counted stop the partition (an error naming the offsets, a metric,
    unready) by default; with on_records_lost = skip the consumer counts on from the log start."""
    topic, settings, definitions, first = await _counted_once(kafka_settings, cassandra_settings, topic_factory,
                                                              tmp_path)
    second = [(f"b{i}", "S0", 10) for i in range(10)]
    await publish(kafka_settings, topic, [_event(*e) for e in second])
    await _delete_before(kafka_settings, topic, 15)  # b0..b4 are gone before anyone counted them

    lost_before = METRICS.records_lost.labels(topic, "0")._value.get()
    stopped = ConsumerService(settings, definitions)
    async with running(stopped):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if METRICS.partitions_stopped._value.get():
                break
            await asyncio.sleep(0.2)
        assert METRICS.partitions_stopped._value.get() == 1
        assert not stopped.is_ready
        assert stopped._why_not_ready() == f"partitions stopped for lost records: {topic}-0"
        await asyncio.sleep(1.0)
    assert METRICS.records_lost.labels(topic, "0")._value.get() == lost_before + 5
    assert await _values(cassandra_settings, ["S0"]) == _expected(first)

    skipping = settings.model_copy(update={"consumer": settings.consumer.model_copy(
        update={"on_records_lost": "skip"})})
    async with running(ConsumerService(skipping, definitions)):
        await wait_until_flushed(cassandra_settings, settings.consumer.group_id,
                                 await end_offsets(kafka_settings, {topic: 1}))
    assert await _values(cassandra_settings, ["S0"]) == _expected(first + second[5:])


async def _wait_stopped(service: ConsumerService, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if service.ownership.stopped:
            break
        # The group sees a topic created again at its next metadata refresh (metadata_max_age_ms, 5 minutes),
        # then assigns it: asked for now, as a fetch error would.
        await service.consumer._client.force_metadata_update()
        await asyncio.sleep(0.5)
    assert service.ownership.stopped, "the partition of the topic created again was not stopped"


async def test_a_topic_deleted_and_created_again_while_no_consumer_runs_stops_its_partitions(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """The keyspace's positions are the old topic's offsets: the new topic's first records (up to the offset the
    old one was counted through) would be skipped without a word. Its partitions are stopped instead (an
    error, a metric, unready), before anything of the new topic is counted or replayed."""
    topic, settings, definitions, first = await _counted_once(kafka_settings, cassandra_settings, topic_factory,
                                                              tmp_path)
    async with CassandraClient(cassandra_settings) as client:
        recorded = as_dicts(await client.execute("SELECT topic_id FROM topic_ids WHERE topic = ?", [topic]))
    assert len(recorded) == 1
    first_id = uuid.UUID(recorded[0]["topic_id"])

    await create_again(kafka_settings, topic)
    second = [(f"b{i}", "S0", 10) for i in range(15)]  # past offset 9: without the check, b10..b14 counted alone
    await publish(kafka_settings, topic, [_event(*e) for e in second])
    recreated_before = METRICS.topics_recreated.labels(topic, "0")._value.get()
    stopped = ConsumerService(settings, definitions)
    async with running(stopped):
        await _wait_stopped(stopped)
        assert not stopped.is_ready
        assert stopped._why_not_ready() == f"topics deleted and created again, not consumed: {topic}"
        error = stopped.ownership.stopped[TopicPartition(topic, 0)]
        await asyncio.sleep(1.5)  # several flush intervals: nothing of the new topic is written
    assert METRICS.topics_recreated.labels(topic, "0")._value.get() == recreated_before + 1
    assert isinstance(error, TopicRecreatedError)
    assert error.counted == first_id != error.now
    assert await _values(cassandra_settings, ["S0"]) == _expected(first)


async def test_a_topic_deleted_and_created_again_under_a_running_consumer_stops_its_partitions(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """While a consumer runs, the topic is deleted and created again and filled past the offset counted: the
    partition stops (at the next flush's check, or at the claim after the rebalances that follow the deletion
    and the creation: which one comes first is the broker's timing; tests/unit/test_topic_recreated.py steps
    the flush's check), and the new topic's records are never counted from the old one's offsets."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    first = [(f"a{i}", "S0", 1) for i in range(10)]
    await publish(kafka_settings, topic, [_event(*e) for e in first])
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    service = ConsumerService(settings, load_definitions(counters))
    async with running(service):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
        await create_again(kafka_settings, topic)
        second = [(f"b{i}", "S0", 10) for i in range(15)]
        await publish(kafka_settings, topic, [_event(*e) for e in second])
        await _wait_stopped(service)
        await asyncio.sleep(1.5)
    assert await _values(cassandra_settings, ["S0"]) == _expected(first)


async def test_reads_that_could_miss_a_write_are_refused_at_start(
    kafka_settings: KafkaSettings, base_cassandra_settings: CassandraSettings, tmp_path: Path
) -> None:
    """With three replicas, reads at ONE and writes at ONE can miss a write: the consumer (replay reads) and
    the GC (instance reads) refuse to start, with one line naming the settings and exit code 2."""
    cassandra = base_cassandra_settings.model_copy(update={"keyspace": f"t_{uuid.uuid4().hex[:12]}"})
    async with CassandraClient(base_cassandra_settings, use_keyspace=False) as client:
        await client.execute(f"CREATE KEYSPACE {cassandra.keyspace} WITH replication = "
                             "{'class': 'SimpleStrategy', 'replication_factor': 3}", prepared=False)
    try:
        await _refused_at_start(kafka_settings, cassandra, tmp_path)
    finally:
        async with CassandraClient(base_cassandra_settings, use_keyspace=False) as client:
            await client.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}", prepared=False)


async def _refused_at_start(kafka_settings: KafkaSettings, cassandra: CassandraSettings, tmp_path: Path) -> None:
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", "never-read"))
    env = child_env(kafka_settings, cassandra, consumer={"counters_file": counters, "health_port": 0})
    env.update(COUNTERSINK_CASSANDRA__REPLICATION="{'class': 'SimpleStrategy', 'replication_factor': 3}",
               COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY="ONE", COUNTERSINK_CASSANDRA__REPLAY_READ_CONSISTENCY="ONE")
    await _refused(["-m", "consumer"], env, "REPLAY_READ_CONSISTENCY=ONE")
    # The GC's read of an instance decides what it folds and deletes: refused the same way.
    env.update(COUNTERSINK_CASSANDRA__GC_READ_CONSISTENCY="ONE")
    await _refused(["-m", "gc_worker"], env, "GC_READ_CONSISTENCY=ONE")


async def _refused(command: list[str], env: dict[str, str], setting: str) -> None:
    """``python COMMAND`` exits 2 with one settings_refused line naming ``setting``, and no traceback."""
    done = await asyncio.to_thread(subprocess.run, [sys.executable, *command], cwd=REPO, env=env,
                                   capture_output=True, timeout=60)
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 2, output
    refused = [json.loads(line) for line in output.splitlines() if '"settings_refused"' in line]
    assert len(refused) == 1, output
    assert setting in refused[0]["error"]
    assert "Traceback" not in output


async def test_records_deleted_under_a_running_consumer_that_fell_behind_are_reported(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A running consumer frozen for a moment (no rebalance) while records it has not read are deleted: the
    Kafka client moves it to the log start, and the consumer says which offsets were lost (records_lost),
    then counts on from the log start (on_records_lost = skip)."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    first = [(f"a{i}", "S0", 1) for i in range(100)]
    await publish(kafka_settings, topic, [_event(*e) for e in first])
    log = tmp_path / "consumer.log"
    process = start_consumer(kafka_settings, cassandra_settings, log, group_id=group, counters_file=counters,
                             dead_letter_topic=f"dlq-{group}", on_records_lost="skip", session_timeout_ms=20000,
                             flush_interval_s=0.3)
    try:
        await wait_until_started(log, process)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
        second = [(f"b{i}", "S0", 10) for i in range(300)]
        process.send_signal(signal.SIGSTOP)  # behind, but not long enough to leave its group
        try:
            # The fetch it had waiting at offset 100 is answered with this one record, then it fetches no more.
            await publish(kafka_settings, topic, [_event("c", "S0", 1000)])
            await asyncio.sleep(1)
            await publish(kafka_settings, topic, [_event(*e) for e in second])  # offsets 101..400
            await _delete_before(kafka_settings, topic, 301)  # b0..b199, never read, are gone
        finally:
            process.send_signal(signal.SIGCONT)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    lost = [e for e in entries if e.get("event") == "records_lost"]
    assert [(e["first"], e["last"], e["action"]) for e in lost] == [(101, 300, "skipped")]
    assert sum(e.get("event") == "partition_taken_over" for e in entries) == 1, "it must not have been a takeover"
    assert await _values(cassandra_settings, ["S0"]) == _expected([*first, ("c", "S0", 1000), *second[200:]])
