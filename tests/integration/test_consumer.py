"""The consumer end to end on real Kafka and Cassandra: exact counts through redelivery, crashes and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from consumer.applying import Record
from consumer.kafka_source import KafkaRecordSource
from consumer.service import ConsumerService
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.definitions import load_definitions
from stack.loading import end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import (
    expected_values,
    make_events,
    read_topic,
    read_values,
    running,
    start_consumer,
    wait_until_started,
    write_definitions,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path, **consumer: object
              ) -> Settings:
    options: dict[str, object] = {"dead_letter_topic": f"dlq-{group}", "flush_interval_s": 0.3,
                                  "session_timeout_ms": 6000, "health_port": 0, **consumer}
    return Settings(kafka=kafka, cassandra=cassandra,
                    consumer=ConsumerSettings(group_id=group, counters_file=counters, **options))


async def _dead_letters(kafka: KafkaSettings, topic: str, expected: int) -> list[Any]:
    return await read_topic(kafka, topic, expected, then_s=1.0)  # and nothing more than expected arrives


async def test_exact_counts_duplicates_dropped_and_bad_events_dead_lettered(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """Counts equal the truth exactly; publisher retries (same event id) are dropped; every malformed event
    lands in the dead-letter topic with its reason and source, and consumption goes on."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(1500, duplicates=120, malformed=25)
    await publish(kafka_settings, topic, events)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)

    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))

    assert await read_values(cassandra_settings, truth) == expected_values(truth)
    dead = await _dead_letters(kafka_settings, f"dlq-{group}", truth.malformed)
    assert len(dead) == truth.malformed
    headers = dict(dead[0].headers)
    assert headers["countersink.source"].decode().startswith(f"{topic}/")
    assert headers["countersink.error"].decode().endswith("Error")
    assert headers["countersink.reason"]


async def test_batches_of_every_kafka_codec_are_counted(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """lz4, snappy and zstd batches (a Java or librdkafka producer's, or a topic's compression.type) stopped the
    consumer on every start ("Libraries for lz4 compression codec not found"): aiokafka reads them with cramjam,
    now a dependency. A partition of each codec and one of gzip, counted exactly."""
    from countersink.kafka import make_producer

    codecs = ("gzip", "lz4", "snappy", "zstd")
    topic = await topic_factory(partitions=len(codecs))
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(400, symbols=12)
    for partition, codec in enumerate(codecs):
        producer = make_producer(kafka_settings, compression_type=codec, linger_ms=50)
        await producer.start()
        try:
            sent = [await producer.send(topic, event, partition=partition)
                    for event in events[partition::len(codecs)]]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: len(codecs)}))
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


def _start_consumer(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    consumer = settings.consumer
    return start_consumer(settings.kafka, settings.cassandra, log, group_id=consumer.group_id,
                          counters_file=consumer.counters_file, dead_letter_topic=consumer.dead_letter_topic,
                          flush_interval_s=0.2, session_timeout_ms=6000)


async def test_kill_9_at_random_moments_then_restart_counts_exactly(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A consumer killed with SIGKILL at random moments (mid-flush included) and restarted each time ends
    with every counter exactly equal to the truth; a final SIGTERM exits 0."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    rng = random.Random(11)
    log = tmp_path / "consumer.log"
    all_events, truth = make_events(6000, duplicates=200, malformed=10, seed=3)
    chunks = [all_events[i:i + 750] for i in range(0, len(all_events), 750)]

    process = _start_consumer(settings, log)
    kills = 0
    try:
        for chunk in chunks:
            await publish(kafka_settings, topic, chunk)
            await asyncio.sleep(rng.uniform(0.2, 2.5))  # kill at a random point of consuming/flushing
            process.kill()
            process.wait(timeout=30)
            kills += 1
            process = _start_consumer(settings, log)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}),
                                 within_s=180)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert kills == len(chunks)
    values = await read_values(cassandra_settings, truth)
    assert values == expected_values(truth), log.read_text()[-3000:]


async def test_zombie_frozen_past_its_session_then_resumed_counts_nothing_twice(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A consumer frozen (SIGSTOP) past its session timeout while another takes its partitions over, then
    resumed (SIGCONT), is fenced: whatever it writes afterwards does not count."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    events, truth = make_events(4000, duplicates=50, seed=5)
    log = tmp_path / "consumer.log"
    zombie = _start_consumer(settings, log)
    successor = None
    try:
        await publish(kafka_settings, topic, events[:1500])
        await asyncio.sleep(3)
        zombie.send_signal(signal.SIGSTOP)
        await publish(kafka_settings, topic, events[1500:2500])
        successor = _start_consumer(settings, log)
        await asyncio.sleep(12)  # past the 6 s session timeout: the group gives everything to the successor
        zombie.send_signal(signal.SIGCONT)
        await publish(kafka_settings, topic, events[2500:])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}),
                                 within_s=180)
        for process in (zombie, successor):
            process.send_signal(signal.SIGTERM)
        assert zombie.wait(timeout=60) == 0
        assert successor.wait(timeout=60) == 0
    finally:
        for process in (zombie, successor):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
    values = await read_values(cassandra_settings, truth)
    assert values == expected_values(truth), log.read_text()[-3000:]
    assert "partition_taken_over" in log.read_text()


async def test_rebalances_in_a_group_of_three_while_events_flow(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """Consumers joining and leaving a group of three (clean stops and kills) while events flow end with
    every counter exactly equal to the truth."""
    topic = await topic_factory(partitions=6)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    events, truth = make_events(6000, duplicates=100, malformed=5, seed=9)
    chunks = [events[i:i + 1000] for i in range(0, len(events), 1000)]
    log = tmp_path / "consumer.log"
    members = [_start_consumer(settings, log) for _ in range(3)]
    rng = random.Random(4)
    try:
        for i, chunk in enumerate(chunks):
            await publish(kafka_settings, topic, chunk)
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            leaving = members.pop(rng.randrange(len(members)))
            if i % 2:
                leaving.send_signal(signal.SIGTERM)
                assert leaving.wait(timeout=60) == 0
            else:
                leaving.kill()
                leaving.wait(timeout=30)
            members.append(_start_consumer(settings, log))
        await wait_until_flushed(cassandra_settings, group,
                                 await end_offsets(kafka_settings, {topic: 6}), within_s=180)
        for member in members:
            await wait_until_started(log, member)
        for member in members:
            member.send_signal(signal.SIGTERM)
        assert [member.wait(timeout=60) for member in members] == [0, 0, 0]
    finally:
        for member in members:
            if member.poll() is None:
                member.kill()
                member.wait()
    values = await read_values(cassandra_settings, truth)
    assert values == expected_values(truth), log.read_text()[-3000:]


async def test_kafka_broker_and_cassandra_restart_mid_stream(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
    local_kafka, local_cassandra,
) -> None:
    """The broker restarts, then Cassandra restarts, while a consumer runs and events keep coming: the
    consumer waits and retries through both and ends exactly at the truth."""
    if local_kafka is None or local_cassandra is None:
        pytest.fail("this test restarts the servers, so it needs the local stack (unset COUNTERSINK_TEST_*)")
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    events, truth = make_events(4500, duplicates=60, malformed=6, seed=21)
    log = tmp_path / "consumer.log"
    process = _start_consumer(settings, log)
    try:
        await publish(kafka_settings, topic, events[:1500])
        await asyncio.sleep(2)
        # Restarted from this (main) thread so the servers stay tied to the session; the consumer under test
        # is a separate process, so blocking this event loop meanwhile is harmless.
        local_kafka.restart(tied_to_parent=True)
        await publish(kafka_settings, topic, events[1500:3000])
        await asyncio.sleep(2)
        local_cassandra.process.stop(timeout=60)  # down while events keep coming
        await publish(kafka_settings, topic, events[3000:])
        await asyncio.sleep(3)
        assert process.poll() is None, "the consumer must wait for Cassandra, not exit"
        local_cassandra.restart(tied_to_parent=True)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}),
                                 within_s=240)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    values = await read_values(cassandra_settings, truth)
    assert values == expected_values(truth), log.read_text()[-3000:]
    assert "flush_retry" in log.read_text()


async def test_a_sigterm_while_flushes_wait_for_cassandra_exits_0_promptly_and_loses_nothing(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
    local_kafka, local_cassandra,
) -> None:
    """Cassandra stops while a consumer runs; its flushes wait and retry. A SIGTERM then ends it within
    seconds (the flush retries get flush_retry_max_s more, the releases fail), exit 0, no traceback; once
    Cassandra is back, the next consumer counts every event exactly once."""
    if local_kafka is None or local_cassandra is None:
        pytest.fail("this test stops Cassandra, so it needs the local stack (unset COUNTERSINK_TEST_*)")
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    events, truth = make_events(2000, duplicates=40, seed=33)
    log = tmp_path / "consumer.log"
    process = _start_consumer(settings, log)
    try:
        await wait_until_started(log, process)
        await publish(kafka_settings, topic, events[:1000])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
        local_cassandra.process.stop(timeout=60)  # down while events keep coming
        try:
            await publish(kafka_settings, topic, events[1000:])
            deadline = time.monotonic() + 60
            while "flush_retry" not in log.read_text(errors="replace"):
                assert time.monotonic() < deadline, "the consumer never retried a flush"
                await asyncio.sleep(0.2)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(process.wait, 60)
            took = time.monotonic() - signalled
        finally:
            local_cassandra.restart(tied_to_parent=True)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert took < 20, f"took {took:.1f} s to stop"  # flush_retry_max_s (5 s), then failed releases, then close
    assert "Traceback" not in output
    assert "Unclosed" not in output
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}),
                                 within_s=120)
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


@pytest.mark.parametrize(("reason", "limits"), [
    ("memory", {"mutator_memory_budget_bytes": 4096}),
    ("age", {"mutator_max_age_s": 2.0}),
])
async def test_rotation_keeps_counts_exact(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
    reason: str, limits: dict[str, object],
) -> None:
    """Mutators rotate (clean retire, fresh mutator at the next offset) whenever their state outgrows the
    memory budget, or reaches its maximum age; every counter stays exact through the rotations."""
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters, **limits)
    events, truth = make_events(5000, symbols=400, duplicates=80, seed=13)
    with capture_logs() as logs:
        async with running(ConsumerService(settings, load_definitions(counters))):
            for i in range(0, len(events), 1000):
                await publish(kafka_settings, topic, events[i:i + 1000])
                await asyncio.sleep(1.5)
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
    rotations = [entry for entry in logs if entry["event"] == "mutator_rotated"]
    assert len(rotations) >= 2
    assert {entry["reason"] for entry in rotations} == {reason}
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


async def test_expired_mutators_write_nothing_and_their_records_are_read_again(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """Mutators found past their expiry at flush time write nothing more: fresh mutators take over, the
    unflushed records are read again from Kafka, and every counter stays exact."""
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters, flush_interval_s=1.0)
    events, truth = make_events(3000, duplicates=60, seed=17)
    with capture_logs() as logs:
        async with running(ConsumerService(settings, load_definitions(counters))) as service:
            await publish(kafka_settings, topic, events[:1000])
            await asyncio.sleep(2)
            await publish(kafka_settings, topic, events[1000:2000])
            for mutator in list(service.mutators.values()):  # expire them, with unflushed records in memory
                mutator.entry = dataclasses.replace(mutator.entry, expires_us=0)
            await publish(kafka_settings, topic, events[2000:])
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
    assert any(entry["event"] == "mutator_expired" for entry in logs)
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


class _HeldSource:
    """The service's own record source, held shut until the test opens it: a slow read, made deterministic."""

    def __init__(self, inner: KafkaRecordSource) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.held = 0

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        self.held += 1
        await self.open.wait()
        return await self.inner.read_back(topic, partition, before, count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_takeover_claims_at_once_and_applies_only_once_its_retry_window_is_rebuilt(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A consumer taking over partitions must rebuild each one's publisher-retry window from records already
    counted before it applies anything. Its rebalance callback returns with every partition claimed while
    those reads are still held (a callback that read them itself took longer than the session timeout with
    a dozen partitions, and the group evicted the member over and over); nothing is applied meanwhile; once
    the reads go through, the rest counts exactly, retries of records counted before included."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(1200, duplicates=150, seed=21)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    await publish(kafka_settings, topic, events[:700])
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))

    await publish(kafka_settings, topic, events[700:])
    held = _HeldSource(KafkaRecordSource(kafka_settings))
    second = ConsumerService(settings, load_definitions(counters), source=held)  # type: ignore[arg-type]
    async with running(second):
        try:
            for _ in range(600):  # up to a minute for the group to form
                if len(second.mutators) == 3 and held.held == 3:
                    break
                await asyncio.sleep(0.1)
            assert len(second.mutators) == 3, "the rebalance callback did not return while the reads were held"
            assert held.held == 3
            await asyncio.sleep(2)  # records of the new events have been fetched by now, and must wait
            assert all(m.applied_through == m.flushed_through for m in second.mutators.values())
            held.open.set()
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        finally:
            held.open.set()  # a shutdown waits for the takeovers, and they for these reads
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


async def test_a_sigterm_while_waiting_for_kafka_exits_0_at_once(
    cassandra_settings: CassandraSettings, tmp_path: Path
) -> None:
    """With Cassandra up and Kafka unreachable, a starting consumer waits for Kafka; a SIGTERM ends the wait
    at once: exit 0, no traceback, no unclosed client."""
    counters = write_definitions(tmp_path, "never-created")
    log = tmp_path / "consumer.log"
    process = start_consumer(KafkaSettings(bootstrap_servers=["127.0.0.1:1"]), cassandra_settings, log,
                             counters_file=counters)
    try:
        deadline = time.monotonic() + 60
        while '"server": "kafka"' not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the consumer never waited for Kafka"
            await asyncio.sleep(0.1)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output
    assert took < 5
    assert "consumer_stopped_before_start" in output
    assert "Unclosed" not in output
    assert "Traceback" not in output
