"""Kafka's topic ids (Metadata v10 and later, which aiokafka does not speak) and the ids a keyspace records, on
the real servers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import CassandraSettings, KafkaSettings
from countersink.topic_ids import KafkaTopicIds, TopicIds, TopicRecreatedError
from tests.integration.consumer_support import create_again


@pytest.fixture
async def kafka_ids(kafka_settings: KafkaSettings) -> AsyncIterator[KafkaTopicIds]:
    ids = KafkaTopicIds(kafka_settings)
    try:
        yield ids
    finally:
        await ids.close()


async def test_kafka_gives_each_topic_an_id_and_another_to_a_topic_created_again(
    kafka_settings: KafkaSettings, kafka_ids: KafkaTopicIds, topic_factory
) -> None:
    topic, other = await topic_factory(partitions=2), await topic_factory(partitions=1)
    missing = f"never-made-{uuid.uuid4().hex[:8]}"
    ids = await kafka_ids([topic, other, missing])
    assert ids[missing] is None  # asked without creating it
    assert isinstance(ids[topic], uuid.UUID)
    assert isinstance(ids[other], uuid.UUID)
    assert ids[topic] != ids[other]
    assert await kafka_ids([missing]) == {missing: None}
    await create_again(kafka_settings, topic)
    again = (await kafka_ids([topic]))[topic]
    assert again is not None
    assert again != ids[topic]


async def test_the_first_id_recorded_is_every_consumers_and_a_topic_created_again_is_changed(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, kafka_ids: KafkaTopicIds,
    topic_factory
) -> None:
    """Three consumers record a topic's id at once: one LWT applies, all agree. After the topic is created again
    each finds it changed, a new process too (the id is read back from the keyspace, not its memory)."""
    topic = await topic_factory(partitions=1)
    missing = f"never-made-{uuid.uuid4().hex[:8]}"

    async with CassandraClient(cassandra_settings) as client:
        checks = [TopicIds(kafka_ids, client, f"host{i}") for i in range(3)]
        answers = await asyncio.gather(*(check.changed([topic, missing], 10.0) for check in checks))
        assert answers == [{}, {}, {}]
        rows = as_dicts(await client.execute("SELECT topic, topic_id FROM topic_ids WHERE topic IN ?",
                                             [[topic, missing]]))
        assert [row["topic"] for row in rows] == [topic]  # a topic Kafka does not know is not recorded
        counted = (await kafka_ids([topic]))[topic]
        assert uuid.UUID(rows[0]["topic_id"]) == counted

        await create_again(kafka_settings, topic)
        for check in [*checks, TopicIds(kafka_ids, client, "later")]:
            changed = await check.changed([topic])
            assert set(changed) == {topic}
            assert isinstance(changed[topic], TopicRecreatedError)
            assert changed[topic].counted == counted != changed[topic].now
