"""Range reads of bucketed counters on real Kafka and Cassandra: series and roll-ups against the truth, across
a GC of some buckets, through the reader, the command line and HTTP, and ranges refused when too large."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from consumer.protocol import MIN_LIFETIME_US
from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.reader import CounterReader
from countersink.registry import CounterRegistry
from countersink.serve import ReadApi
from countersink.settings import (
    CassandraSettings,
    ConsumerSettings,
    KafkaSettings,
    ReadSettings,
    ServeSettings,
    Settings,
)
from gc_worker.collector import Collector
from gc_worker.store import CassandraGcStore
from schemas.cql import TALLY_ROW
from schemas.definitions import parse_definitions
from schemas.kinds.distinct import relative_standard_error
from schemas.timeseries import TimeRangeError
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOUR, DAY = 3600, 86400
T0 = int(datetime(2026, 11, 20, tzinfo=UTC).timestamp())
DEFINITIONS = """
[[counter]]
name = "hourly_trades"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "trade_id"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "hourly_shares"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "trade_id"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "hourly_buyers"
topics = ["{topic}"]
kind = "distinct"
key = ["symbol"]
value = "buyer"
event_id = "trade_id"
bucket = { field = "ts", size = "1h" }
"""


class Trades:
    """Trades over two days, and what each hour holds, computed apart from countersink."""

    def __init__(self) -> None:
        self.count: Counter[int] = Counter()
        self.shares: Counter[int] = Counter()
        self.buyers: defaultdict[int, set[str]] = defaultdict(set)

    def make(self, n: int, first_hour: int, hours: int, seed: int) -> list[bytes]:
        rng, events = random.Random(seed), []
        for _ in range(n):
            at = T0 + first_hour * HOUR + rng.randrange(hours * HOUR)
            qty, buyer = rng.randrange(1, 100), f"u{rng.randrange(400)}"
            ts = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
            events.append(json.dumps({"trade_id": uuid.uuid4().hex, "symbol": "IBM", "ts": ts, "qty": qty,
                                      "buyer": buyer}).encode())
            hour = (at - T0) // HOUR
            self.count[hour] += 1
            self.shares[hour] += qty
            self.buyers[hour].add(buyer)
        return events


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path) -> Settings:
    return Settings(kafka=kafka, cassandra=cassandra, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        session_timeout_ms=6000, health_port=0))


async def _consume(settings: Settings, topic: str, events: list[bytes]) -> None:
    """A consumer counts ``events`` (published now) until they are flushed, then hands its partitions over."""
    definitions = parse_definitions(settings.consumer.counters_file.read_text())  # type: ignore[union-attr]
    async with running(ConsumerService(settings, definitions)):
        await publish(settings.kafka, topic, events)
        await wait_until_flushed(settings.cassandra, settings.consumer.group_id,
                                 await end_offsets(settings.kafka, {topic: 3}))


async def test_series_and_roll_ups_read_the_truth_across_a_gc(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
) -> None:
    """Two days of hourly buckets: the first day counted and folded by the GC into tallies, the second counted
    after the GC (shards, and tallies for the hours both runs touched). Every hour, every daily step and the
    whole range read as the truth (the distinct count within its bound); the CLI and HTTP say the same; a
    range of more buckets than allowed is refused."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    trades = Trades()
    await _consume(settings, topic, trades.make(1500, 0, 30, seed=1))
    async with CassandraClient(cassandra_settings) as client:
        await asyncio.sleep(MIN_LIFETIME_US / 1e6 + 1.0)  # past retire times (born + 1 s at the least) and the grace
        report = await Collector(CassandraGcStore(client), 500_000, retriable=(CassandraUnavailableError,)
                                 ).run(time.time_ns() // 1000)
        assert report.instances_folded > 0
    await _consume(settings, topic, trades.make(1500, 24, 24, seed=2))

    start, end = datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + 2 * DAY, UTC)
    async with CassandraClient(cassandra_settings) as client:
        tallies = as_dicts(await client.execute("SELECT tallies[?] AS tally FROM shards WHERE born_us = ? "
                                                "AND mutator = ? ALLOW FILTERING", ["hourly_trades", *TALLY_ROW]))
        assert any(row["tally"] is not None for row in tallies)  # some hours are read from tallies
        reader = CounterReader(client, max_range_buckets=48)
        series = await reader.series("hourly_trades", "IBM", start, end)
        assert [p.value for p in series] == [trades.count[h] or None for h in range(48)]
        assert [p.start.timestamp() for p in series] == [T0 + h * HOUR for h in range(48)]
        daily = await reader.rollup("hourly_shares", "IBM", start, end, "1d")
        assert [p.value for p in daily] == [sum(trades.shares[h] for h in range(d * 24, d * 24 + 24))
                                             for d in range(2)]
        assert await reader.rollup("hourly_shares", "IBM", start, end, float(DAY)) == daily  # seconds, as a float
        with pytest.raises(TimeRangeError, match="a step is a whole number of seconds"):
            await reader.rollup("hourly_shares", "IBM", start, end, 3600.5)
        whole = await reader.rollup("hourly_trades", "IBM", start, end)
        assert (whole.value, whole.buckets_counted) == (sum(trades.count.values()), len(trades.count))
        buyers = await reader.rollup("hourly_buyers", "IBM", start, end)
        truth = len(set().union(*trades.buyers.values()))
        assert abs(buyers.value.estimate - truth) <= 4 * relative_standard_error(12, merged=True) * truth + 1  # type: ignore[attr-defined]
        assert buyers.value.lower_bound <= truth <= buyers.value.upper_bound  # type: ignore[attr-defined]
        with pytest.raises(TimeRangeError, match="at most 48"):
            await reader.series("hourly_trades", "IBM", start, datetime.fromtimestamp(T0 + 3 * DAY, UTC))

        api = ReadApi(client, ServeSettings(), registry=CounterRegistry(client),
                      read_settings=ReadSettings(max_range_buckets=48))
        async with TestClient(TestServer(api.app())) as http:
            answer = await http.get("/counters/hourly_shares/IBM/series",
                                    params={"from": "2026-11-20T00:00Z", "to": "2026-11-22", "step": "1d"})
            assert answer.status == 200
            body = await answer.json()
            assert [p["value"] for p in body["points"]] == [p.value for p in daily]
            assert body["points"][0]["start"] == "2026-11-20T00:00:00Z"
            rolled = await (await http.get("/counters/hourly_trades/IBM/series", params={
                "from": "2026-11-20T00:00Z", "to": "2026-11-22T00:00Z", "rollup": "true"})).json()
            assert rolled["points"][0]["value"] == whole.value
            for params, complaint in (({"from": "2026-11-20T00:00Z"}, "give ?from= and ?to="),
                                      ({"from": "soon", "to": "now"}, "is not a time"),
                                      ({"from": "2026-11-20", "to": "2026-11-23"}, "at most 48"),
                                      ({"from": "2026-11-20", "to": "2026-11-21", "step": "90m"}, "whole number"),
                                      ({"from": "1900-01-01", "to": "1970-01-01T02:00Z", "step": "1h"},
                                       "holds 613610 steps of 1:00:00; at most 48 points")):
                refused = await http.get("/counters/hourly_trades/IBM/series", params=params)
                assert refused.status == 400
                assert complaint in (await refused.json())["detail"]

    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "get", "hourly_trades", "IBM",
                         "--from", "2026-11-20T00:00Z", "--to", "2026-11-22T00:00Z", "--step", "1d", "--json"],
        cwd=REPO, env=child_env(kafka_settings, cassandra_settings), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert [p["value"] for p in printed["points"]] == [sum(trades.count[h] for h in range(d * 24, d * 24 + 24))
                                                       for d in range(2)]
    # A range not on a minute, in text: its ends keep their seconds (they were cut to the minute, and the points
    # seemed to start and end where they do not).
    text = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "get", "hourly_trades", "IBM",
                         "--from", "2026-11-20T00:30:30Z", "--to", "2026-11-20T04:15:10Z", "--step", "2h"],
        cwd=REPO, env=child_env(kafka_settings, cassandra_settings), capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    spans = [line.split(" ", 2)[2].rsplit(":", 1)[0] for line in text.stdout.splitlines()]
    assert spans == ["2026-11-20T00:30:30Z .. 2026-11-20T02:00Z", "2026-11-20T02:00Z .. 2026-11-20T04:00Z",
                     "2026-11-20T04:00Z .. 2026-11-20T04:15:10Z"], text.stdout
