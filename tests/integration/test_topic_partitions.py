"""``topic_partitions`` on a real broker: the partitions of the topics that exist, in order, and none of one that
does not, answered at once rather than after the producer's request timeout (what ``reset`` and ``backfill``
look up before they record anything)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest

from countersink.kafka import make_producer, topic_partitions
from countersink.settings import KafkaSettings

pytestmark = pytest.mark.integration


async def test_partitions_of_existing_topics_and_none_of_a_missing_one_without_waiting_the_timeout(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., Awaitable[str]]
) -> None:
    """Two topics (3 and 1 partitions) and one Kafka does not know, named twice: every partition of the two, in
    the order asked, nothing of the third; the producer's request timeout is 5 minutes, the answer is awaited 60
    seconds at most (its own look-up of the missing topic would wait the timeout out)."""
    first, second = await topic_factory(partitions=3), await topic_factory(partitions=1)
    gone = f"gone-{os.urandom(4).hex()}"
    patient = kafka_settings.model_copy(update={"request_timeout_ms": 300_000})
    producer = make_producer(patient)
    await producer.start()
    try:
        found = await asyncio.wait_for(topic_partitions(patient, producer, [second, gone, first, second]), 60)
    finally:
        await producer.stop()
    assert found == [(second, 0), (first, 0), (first, 1), (first, 2)]
