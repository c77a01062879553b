"""Retention on real Kafka and Cassandra, with minute buckets kept two minutes: rows expire with their bucket,
a bucket past its expiry reads as absent (never partly), nothing is written for a bucket already gone, late
events are neither counted nor dead-lettered, and the GC's tally expires with the shards it folds."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from consumer.applying import Applier, Mutator, RetryWindow
from consumer.cassandra_store import CassandraStore
from consumer.kafka_source import KafkaRecordSource
from consumer.protocol import MIN_LIFETIME_US, claim, finish_take_over, flush
from consumer.service import ConsumerService
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.kafka import make_producer
from countersink.metrics import METRICS
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from gc_worker.collector import Collector
from gc_worker.store import CassandraGcStore
from schemas.cql import STAMP_ROW, TALLY_ROW, shard_of_cell, shard_slice
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.kinds import state_from_bytes
from schemas.timeseries import BUCKET_FORMAT
from stack.loading import end_offsets, wait_until_flushed
from tests.integration.consumer_support import read_topic, running

pytestmark = pytest.mark.integration
MINUTE = 60
GRACE_S = 60  # the shortest grace allowed


def _key(bucket_start: int) -> str:
    return "home|" + time.strftime(BUCKET_FORMAT, time.gmtime(bucket_start))


async def _rows(client: CassandraClient, key: str, stamps: bool = False) -> list[dict[str, object]]:
    """The key's rows of mutators, and its tally and stamps rows (schemas.cql) with ``stamps``."""
    rows = as_dicts(await client.execute(
        "SELECT mutator, states['views'] AS cell, ttl(states['views']) AS state_ttl, tallies['views'] AS tally, "
        "ttl(tallies['views']) AS tally_ttl, born_us FROM shards WHERE part = ? AND key = ?", list(shard_slice(key))))
    return [{name: value for name, value in row.items() if name != "born_us"} for row in rows
            if stamps or row["born_us"] not in (TALLY_ROW[0], STAMP_ROW[0])]


def _late() -> float:
    return METRICS.registry.get_sample_value("countersink_late_events_total", {"counter": "views"}) or 0.0


def _expired_writes() -> float:
    return METRICS.registry.get_sample_value("countersink_expired_writes_skipped_total", {"counter": "views"}) or 0.0


async def test_buckets_expire_whole_and_late_events_are_not_counted(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
) -> None:
    """Four minute buckets, each event's record written at a chosen time: the current bucket counts and its
    rows expire within its retention plus the grace; a bucket whose expiry has just passed is written to
    expire within the grace and reads as absent meanwhile; a bucket already past expiry plus grace is not
    written at all; events whose record came after their bucket's expiry are counted as late only. After
    the GC, the tally carries its shards' expiry."""
    # Early in a minute, so that the margins below hold however long the consumer takes to start.
    await asyncio.sleep((MINUTE - time.time() % MINUTE) % MINUTE if time.time() % MINUTE > 30 else 0)
    now = time.time()
    live = int(now) // MINUTE * MINUTE
    hidden, gone, late = live - 3 * MINUTE, live - 5 * MINUTE, live - 4 * MINUTE
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(f"""
[[counter]]
name = "views"
topics = ["{topic}"]
kind = "count"
key = ["page"]
event_id = "id"
bucket = {{ field = "ts", size = "1m", format = "epoch_seconds" }}
retain = "2m"
""")
    cassandra = cassandra_settings.model_copy(update={"retention_grace_s": GRACE_S})
    settings = Settings(kafka=kafka_settings, cassandra=cassandra, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        session_timeout_ms=6000, health_port=0))
    # (bucket of the event, when its record is written, how many)
    plan = [(live, now, 5), (hidden, hidden + 30, 4), (gone, gone + 10, 3), (late, now, 6)]
    late_before, expired_before = _late(), _expired_writes()
    async with running(ConsumerService(settings, parse_definitions(counters.read_text()))):
        async with make_producer(kafka_settings) as producer:
            for bucket, written_at, n in plan:
                for i in range(n):
                    event = {"id": uuid.uuid4().hex, "page": "home", "ts": bucket + i}
                    await producer.send_and_wait(topic, json.dumps(event).encode(), key=b"home",
                                                 timestamp_ms=int(written_at * 1000))
        await wait_until_flushed(cassandra, group, await end_offsets(kafka_settings, {topic: 2}))
    assert _late() - late_before == 6
    assert _expired_writes() - expired_before >= 1  # the gone bucket's instance, once a flush (or a replay)

    async with CassandraClient(cassandra) as client:
        reader = CounterReader(client)
        assert await reader.get("views", _key(live)) == 5
        live_rows = await _rows(client, _key(live))
        assert live_rows
        assert all(0 < row["state_ttl"] <= 3 * MINUTE + GRACE_S for row in live_rows)  # type: ignore[operator]
        assert all(row["state_ttl"] > GRACE_S for row in live_rows)  # type: ignore[operator]

        hidden_rows = await _rows(client, _key(hidden))
        assert hidden_rows  # written, to expire within the grace ...
        assert all(0 < row["state_ttl"] <= GRACE_S for row in hidden_rows)  # type: ignore[operator]
        assert await reader.get("views", _key(hidden)) is None  # ... and hidden from reads meanwhile
        explained = await reader.explain("views", _key(hidden))  # explain (and trace with it) and list too
        assert (explained.value, explained.tally, explained.shards) == (None, None, ())
        assert (await reader.list_instances("views"))[0] == [_key(live)]

        assert await _rows(client, _key(gone)) == []  # past expiry and grace: never written
        assert await _rows(client, _key(late)) == []  # late events: not counted anywhere
        series = await reader.series(parse_definitions(counters.read_text())["views"], "home", live - 5 * MINUTE,
                                     live + MINUTE)
        assert [p.value for p in series] == [None, None, None, None, None, 5]

        await asyncio.sleep(MIN_LIFETIME_US / 1e6 + 1.0)  # past retire times (born + 1 s at the least) and the grace
        await Collector(CassandraGcStore(client), 500_000, retriable=(CassandraUnavailableError,)
                        ).run(time.time_ns() // 1000)
        folded = await _rows(client, _key(live), stamps=True)  # the tally row and the stamps row alone are left
        assert len(folded) == 2
        assert folded[0]["tally"] is not None
        assert GRACE_S < folded[0]["tally_ttl"] <= 3 * MINUTE + GRACE_S  # type: ignore[operator]
        assert await reader.get("views", _key(live)) == 5

    dead = await read_topic(kafka_settings, f"dlq-{group}", at_least=1, within_s=3)
    assert dead == []


class CrashingStore(CassandraStore):
    """Opens its flush's window, then dies before any shard of it is written."""

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int,
                           writes: Sequence[ShardWrite], *, source: bytes) -> None:
        raise ConnectionError("the process died here")


async def test_a_replay_after_the_retention_boundary_decides_as_the_original(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory,
) -> None:
    """Records of a bucket written before its expiry are read after it, by a mutator that opens its flush
    window and dies; its successor replays the window from Kafka: the same records count (their Kafka
    timestamps decide, not the replay's clock), the late ones stay late, and the bucket, now past its
    expiry, is written to expire within the grace and reads as absent meanwhile."""
    if time.time() % MINUTE > 40:  # the bucket must still be within its grace when the replay writes it
        await asyncio.sleep(MINUTE - time.time() % MINUTE + 0.5)
    now = time.time()
    live = int(now) // MINUTE * MINUTE
    expired = live - 2 * MINUTE  # kept one minute after it ends: expired at the start of this minute
    topic = await topic_factory(partitions=1)
    counters = parse_definitions(f"""
[[counter]]
name = "views"
topics = ["{topic}"]
kind = "count"
key = ["page"]
bucket = {{ field = "ts", size = "1m", format = "epoch_seconds" }}
retain = "1m"
""")
    # (bucket of the event, when its record is written, how many): 4 written before the expiry, 3 after it
    plan = [(expired, live - 5, 4), (expired, now, 3), (live, now, 2)]
    async with make_producer(kafka_settings) as producer:
        for bucket, written_at, n in plan:
            for i in range(n):
                await producer.send_and_wait(topic, json.dumps({"page": "home", "ts": bucket + i}).encode(),
                                             partition=0, timestamp_ms=int(written_at * 1000))
    cassandra = cassandra_settings.model_copy(update={"retention_grace_s": GRACE_S})
    late: list[str] = []

    def applier() -> Applier:
        return Applier(EventRouter(counters, on_late=late.append), counters, topic, 0, RetryWindow(100))

    source = KafkaRecordSource(kafka_settings)
    await source.start()
    try:
        async with CassandraClient(cassandra) as client:
            first = MutatorEntry(uuid.uuid4(), "g", topic, 0, "first", time.time_ns() // 1000, 10**18)
            claimed = await claim(CassandraStore(client), first, -1)
            await finish_take_over(CassandraStore(client), source, claimed, applier, lambda: first.born_us)
            mutator = Mutator(first, PartitionId("g", topic, 0), applier(), applied_through=-1, flushed_through=-1)
            mutator.apply_batch(await source.read(topic, 0, 0, 8))
            assert (len(late), mutator.states[("views", _key(expired))].value()) == (3, 4)
            with pytest.raises(ConnectionError):
                await flush(CrashingStore(client), mutator, time.time_ns() // 1000)  # window 0..8 open, no shard
            assert await _rows(client, _key(expired)) == []

            second = MutatorEntry(uuid.uuid4(), "g", topic, 0, "second", time.time_ns() // 1000 + 1, 10**18)
            result = await finish_take_over(CassandraStore(client), source,
                                            await claim(CassandraStore(client), second, -1), applier,
                                            lambda: second.born_us)
            assert (result.replayed_records, len(late)) == (9, 6)  # the same three late again, no more
            reader = CounterReader(client)
            assert await reader.get("views", _key(live)) == 2
            rows = await _rows(client, _key(expired))
            assert [row["mutator"] for row in rows] == [str(first.id)]  # written by the replay, as the first
            assert 0 < rows[0]["state_ttl"] <= GRACE_S  # type: ignore[operator]
            assert state_from_bytes(shard_of_cell(rows[0]["cell"])[0]).value() == 4  # type: ignore[arg-type]
            assert await reader.get("views", _key(expired)) is None  # past its expiry: hidden
    finally:
        await source.stop()
