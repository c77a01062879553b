"""A burst of invalid records on real Kafka: 20,000 records a counter refuses, in one partition, become 20,000 dead
letters and the partition is flushed through its end. Before, each dead letter was handed to the producer at once:
the thousands waiting for room in its batches were all woken at each drain, until some waited past the request
timeout, and the consumer stopped with KafkaTimeoutError at every start (the broker healthy)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from consumer.service import ConsumerService
from countersink.kafka import make_producer
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.definitions import parse_definitions
from stack.loading import end_offsets, wait_until_flushed
from tests.integration.consumer_support import read_topic, running

pytestmark = pytest.mark.integration
RECORDS = 20_000


async def test_twenty_thousand_dead_letters_in_one_partition_are_sent_and_the_partition_goes_on(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory
) -> None:
    """Every record dated year 1 (a bucket no event can be counted in): all dead letters, delivered, and the
    partition flushed through its last record, within the producer's request timeout (10 s here)."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = parse_definitions(f'[[counter]]\nname = "per_hour"\ntopics = ["{topic}"]\nkind = "count"\n'
                                 'key = ["k"]\nbucket = { field = "ts", size = "1h" }\n')
    async with make_producer(kafka_settings) as producer:
        sent = [await producer.send(topic, json.dumps({"k": f"k{i % 50}", "ts": "0001-01-01T00:00:00Z"}).encode())
                for i in range(RECORDS)]
        await asyncio.gather(*sent)
    kafka = kafka_settings.model_copy(update={"request_timeout_ms": 10_000})
    settings = Settings(kafka=kafka, cassandra=cassandra_settings, consumer=ConsumerSettings(
        group_id=group, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3, session_timeout_ms=6000,
        health_port=0))
    service = ConsumerService(settings, counters)
    async with running(service):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}),
                                 within_s=90)
    dead = await read_topic(kafka_settings, f"dlq-{group}", at_least=RECORDS, within_s=30)
    assert len(dead) >= RECORDS
    assert {dict(r.headers)["countersink.error"] for r in dead} == {b"ValueOutOfRangeError"}
