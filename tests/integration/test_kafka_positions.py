"""``known_position`` on a real broker: the consumer's position read through aiokafka's public API only,
without ever waiting for one (the consumer service calls it with its lock held)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import TopicPartition

from countersink.kafka import known_position, make_consumer, make_producer
from countersink.settings import KafkaSettings

pytestmark = pytest.mark.integration


async def test_known_position_is_none_until_fetched_then_past_the_commit_marker(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Awaitable[str]]
) -> None:
    """None for an unassigned partition and while the offset is still to be reset (at once, no wait); after
    a fetch, the offset past the last transaction's commit marker (3 records + 1 marker = 4); a sought
    offset at once; None once unassigned."""
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    producer = make_producer(kafka_settings, transactional_id=f"positions-{topic}")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send_and_wait(topic, f"r{i}".encode())
    finally:
        await producer.stop()

    consumer = make_consumer(kafka_settings, enable_auto_commit=False, auto_offset_reset="earliest",
                             isolation_level="read_committed")
    await consumer.start()
    try:
        assert known_position(consumer, tp) is None  # not assigned
        consumer.assign([tp])
        started = time.monotonic()
        assert known_position(consumer, tp) is None  # no committed offset: reset to the earliest is pending
        assert time.monotonic() - started < 0.1
        records: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(records) < 3 and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            records += [r.value for r in batch.get(tp, []) if r.value is not None]
        assert records == [b"r0", b"r1", b"r2"]
        while known_position(consumer, tp) != 4 and time.monotonic() < deadline:
            await consumer.getmany(tp, timeout_ms=200)  # the marker is skipped by a fetch after the records
        assert known_position(consumer, tp) == 4
        assert known_position(consumer, tp) == await consumer.position(tp)
        consumer.seek(tp, 1)
        assert known_position(consumer, tp) == 1
        consumer.unsubscribe()
        assert known_position(consumer, tp) is None
    finally:
        await consumer.stop()
