"""Event times on real Kafka and Cassandra: one event dated 2040 (or 9999, or year 1) on a counter with retention
is dead-lettered, naming the counter, and the partition goes on counting; a decade of retention still writes
in the 2030s, its rows expiring at the last expiry Cassandra 5.0 stores. Before, such an event made every flush
of its partition fail (Cassandra refuses an expiry after 2038-01-19T03:14:07Z) and every successor with it."""

from __future__ import annotations

import calendar
import json
import os
import time
import uuid

import pytest

from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import make_producer
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.cql import LAST_EXPIRY_S, shard_slice
from schemas.definitions import parse_definitions
from schemas.timeseries import BUCKET_FORMAT
from stack.loading import end_offsets, wait_until_flushed
from tests.integration.consumer_support import read_topic, running

pytestmark = pytest.mark.integration
Y2040 = calendar.timegm((2040, 1, 1, 0, 0, 0))
Y9999 = calendar.timegm((9999, 12, 31, 23, 0, 0))
Y1 = -62_135_596_800  # 0001-01-01T00:00:00Z
DEC_2037 = calendar.timegm((2037, 12, 1, 0, 0, 0))


def _key(at: float) -> str:
    return "home|" + time.strftime(BUCKET_FORMAT, time.gmtime(int(at) // 3600 * 3600))


def _definitions(month_topic: str, decade_topic: str) -> str:
    bucket = 'bucket = { field = "ts", size = "1h", format = "epoch_seconds" }'
    return "".join(f'[[counter]]\nname = "{name}"\ntopics = ["{topic}"]\nkind = "count"\nkey = ["page"]\n'
                   f'{bucket}\nretain = "{retain}"\n\n'
                   for name, topic, retain in (("month", month_topic, "30d"), ("decade", decade_topic, "3650d")))


async def _count(kafka: KafkaSettings, cassandra: CassandraSettings, topic_factory, max_future_skew_s: int,
                 events: dict[str, list[float]]) -> tuple[str, list[object]]:
    """Publish each topic's event times (records written now), count them with one consumer until every
    partition is flushed; the group and its dead letters."""
    month, decade = await topic_factory(partitions=1), await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    counters = parse_definitions(_definitions(month, decade))
    settings = Settings(kafka=kafka, cassandra=cassandra, consumer=ConsumerSettings(
        group_id=group, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3, session_timeout_ms=6000,
        health_port=0, max_future_skew_s=max_future_skew_s))
    topics = {"month": month, "decade": decade}
    async with running(ConsumerService(settings, counters)):
        async with make_producer(kafka) as producer:
            for name, times in events.items():
                for at in times:
                    raw = json.dumps({"id": uuid.uuid4().hex, "page": "home", "ts": at}).encode()
                    await producer.send_and_wait(topics[name], raw)
        await wait_until_flushed(cassandra, group, await end_offsets(kafka, {month: 1, decade: 1}))
    dead = await read_topic(kafka, f"dlq-{group}", at_least=sum(len(t) for t in events.values()), within_s=5)
    return group, dead


async def _total(reader: CounterReader, counter: str, times: list[float]) -> int:
    """The count of every bucket the given times fall in (events a few seconds apart may straddle an hour)."""
    values = [await reader.get(counter, key) for key in sorted({_key(at) for at in times})]
    return sum(v for v in values if isinstance(v, int))


def _refusals(dead: list[object]) -> list[tuple[str, str, str]]:
    out = []
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}  # type: ignore[attr-defined]
        out.append((headers["countersink.counter"], headers["countersink.error"], headers["countersink.path"]))
    return sorted(out)


async def test_an_event_dated_2040_is_dead_lettered_and_the_partition_goes_on_counting(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory
) -> None:
    """With the default future skew (a day), events dated 2040, 9999 and year 1 among events of now, on a
    counter kept 30 days: the three are dead-lettered naming the counter, the others all count."""
    now = time.time()
    _, dead = await _count(kafka_settings, cassandra_settings, topic_factory, 86_400,
                           {"month": [now, now + 1, Y2040, Y9999, Y1, now + 2, now + 3]})
    assert _refusals(dead) == [("month", "FutureEventTimeError", "ts"), ("month", "FutureEventTimeError", "ts"),
                               ("month", "ValueOutOfRangeError", "ts")]
    async with CassandraClient(cassandra_settings) as client:
        assert await _total(CounterReader(client), "month", [now, now + 3]) == 4


async def test_times_storage_cannot_keep_are_refused_and_a_decade_of_retention_still_writes(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory
) -> None:
    """With no future bound to speak of, events whose 30-day bucket would end after the last expiry Cassandra
    stores (2040, 9999) are dead-lettered as UnstorableTimeError, the others count; a 3650-day counter counts an
    event of December 2037, its row expiring no later than 2038-01-18T03:14:07Z."""
    now = time.time()
    _, dead = await _count(kafka_settings, cassandra_settings, topic_factory, 10**12,
                           {"month": [now, Y2040, Y9999, now + 1], "decade": [DEC_2037, now]})
    assert _refusals(dead) == [("month", "UnstorableTimeError", "ts"), ("month", "UnstorableTimeError", "ts")]
    async with CassandraClient(cassandra_settings) as client:
        reader = CounterReader(client)
        assert await reader.get("decade", _key(DEC_2037)) == 1
        assert await reader.get("decade", _key(now)) == 1
        rows = as_dicts(await client.execute(
            "SELECT states['decade'] AS state, ttl(states['decade']) AS ttl FROM shards WHERE part = ? AND key = ?",
            list(shard_slice(_key(DEC_2037)))))
        shards = [row for row in rows if row["state"] is not None]  # not the key's stamps row (schemas.cql)
        assert shards
        assert all(0 < row["ttl"] <= LAST_EXPIRY_S - now for row in shards)
        assert await _total(reader, "month", [now, now + 1]) == 2
