"""``make bench``'s Kafka Streams application on the real Kafka: built by Maven, run on a topic of trades until
it has committed every record, and its count and sum per symbol, as it wrote them to its output topic,
equal to the truth computed while publishing."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import pytest

from bench import kstreams, pipeline
from countersink.kafka import ensure_topics
from countersink.settings import KafkaSettings
from tests.integration.test_first_hour import delete_topics

EVENTS = 20_000
SYMBOLS = 1_500
PARTITIONS = 4


async def test_kafka_streams_counts_and_sums_the_trades_exactly(kafka_settings: KafkaSettings,
                                                                tmp_path: Path) -> None:
    """make bench's step, as it runs it: TradeCounts until every record is committed, every symbol checked."""
    topic = f"kstreams-trades-{uuid.uuid4().hex[:10]}"
    await ensure_topics(kafka_settings, {topic: PARTITIONS})
    try:
        rng = random.Random(11)
        truth: dict[str, tuple[int, int]] = {}

        def make(i: int) -> tuple[bytes, bytes]:
            key, value = pipeline.trade(i, rng, SYMBOLS)
            event = json.loads(value)
            count, qty = truth.get(event["symbol"], (0, 0))
            truth[event["symbol"]] = (count + 1, qty + event["qty"])
            return key, value

        await pipeline.load(kafka_settings, topic, PARTITIONS, EVENTS, make, "trades")
        classpath = kstreams.build()
        figures, problems = await kstreams.bench_step(kafka_settings, topic, PARTITIONS, truth, 180, {}, tmp_path,
                                                      classpath, commit_ms=200)
    finally:
        await delete_topics(kafka_settings, topic)
    assert figures["committed"] == EVENTS, (tmp_path / "kstreams.log").read_text()[-3000:]
    assert len(truth) > 1_000
    assert figures["symbols_checked"] == len(truth)
    assert problems == []  # every symbol's count and sum as published, and no other symbol
    assert figures["events_per_s"] > 0
    assert figures["jvm_cpu_s_per_million"] > 0
    assert figures["commit_interval_ms"] == 200


async def test_kafka_streams_counts_per_hour_of_a_nested_time_by_a_nested_key(kafka_settings: KafkaSettings,
                                                                            tmp_path: Path) -> None:
    """HourlyCounts keyed by ``user.id`` (not the record key: Kafka Streams repartitions) and bucketed by the
    hour of ``ts``, with events out of order over 30 hours and some lacking the key or the time (skipped)."""
    topic = f"kstreams-views-{uuid.uuid4().hex[:10]}"
    events = 6_000
    await ensure_topics(kafka_settings, {topic: PARTITIONS})
    try:
        rng = random.Random(5)
        truth: dict[str, int] = {}

        def make(i: int) -> tuple[bytes, bytes]:
            minute = rng.randrange(30 * 60)
            ts = f"2026-11-2{1 + minute // 1440}T{minute % 1440 // 60:02d}:{minute % 60:02d}:07Z"
            user = f"u{rng.randrange(40)}"
            event: dict[str, object] = {"id": i, "user": {"id": user}, "ts": ts, "path": "/"}
            if i % 97 == 0:
                del event["ts"]
            elif i % 89 == 0:
                event["user"] = {"name": "no id"}
            else:
                bucket = f"{user}|{ts[:13]}:00Z"
                truth[bucket] = truth.get(bucket, 0) + 1
            return str(i).encode(), json.dumps(event).encode()

        await pipeline.load(kafka_settings, topic, PARTITIONS, events, make, "views")
        classpath = kstreams.build()
        run = await kstreams.streams_rate(kafka_settings, topic, PARTITIONS, events, 180, {}, tmp_path, classpath,
                                          application=kstreams.hourly("user.id", "ts"))
    finally:
        await delete_topics(kafka_settings, topic)
    assert run.committed == events, (tmp_path / "kstreams.log").read_text()[-3000:]
    counts = kstreams.hourly_counts(run.output)
    assert len(truth) > 40 * 25
    assert sum(truth.values()) == events - events // 97 - 1 - sum(1 for i in range(events) if i % 89 == 0 and i % 97)
    assert kstreams.check_counts(counts, truth) == []
    off = {**counts, "u1|2026-11-21T00:00Z": counts["u1|2026-11-21T00:00Z"] + 1}
    assert kstreams.check_counts(off, truth) == [f"u1|2026-11-21T00:00Z: {truth['u1|2026-11-21T00:00Z'] + 1} != "
                                                 f"{truth['u1|2026-11-21T00:00Z']}"]


async def test_a_trade_it_cannot_read_stops_the_run_with_an_error(kafka_settings: KafkaSettings,
                                                                  tmp_path: Path) -> None:
    """An event that is not a trade fails the application (exit 1), and the run says so rather than timing
    out or counting around it."""
    topic = f"kstreams-bad-{uuid.uuid4().hex[:10]}"
    await ensure_topics(kafka_settings, {topic: 1})
    try:
        rng = random.Random(3)
        await pipeline.load(kafka_settings, topic, 1, 10,
                            lambda i: (b"S1", b"not json") if i == 5 else pipeline.trade(i, rng, 3), "trades")
        classpath = kstreams.build()
        with pytest.raises(RuntimeError, match=r"Kafka Streams exited 1; see "):
            await kstreams.streams_rate(kafka_settings, topic, 1, 10, 120, {}, tmp_path, classpath)
    finally:
        await delete_topics(kafka_settings, topic)
    assert "a trade that is not JSON with an integer qty" in (tmp_path / "kstreams.log").read_text()
