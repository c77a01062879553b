"""Operations as an operator sees them, on real servers: every line a consumer writes is JSON, its /metrics
carries process, build, freshness and GC-status series and drops a revoked partition's, GC runs are recorded
in Cassandra, and the dead-letter topic is created as the settings (or the broker) say."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka.errors import InvalidReplicationFactorError
from prometheus_client.parser import text_string_to_metric_families

from countersink.cassandra import CassandraClient
from countersink.gc_runs import GcAgeSampler, GcRunLog
from countersink.kafka import broker_topic_defaults, ensure_topics, make_admin
from countersink.metrics import METRICS
from countersink.serve import ReadApi
from countersink.settings import CassandraSettings, GcSettings, KafkaSettings, ServeSettings, Settings
from gc_worker import cli as gc_cli
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from stack.servers import free_port
from tests.integration.consumer_support import REPO, make_events, start_consumer, wait_until_started, write_definitions

pytestmark = pytest.mark.integration

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _gc(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "countersink.cli", "gc", *args], cwd=REPO,
                          env=child_env(kafka, cassandra), capture_output=True, text=True, timeout=120, check=False)


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` parsed as JSON: a line that is not fails the test, naming it."""
    parsed = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"line {number} is not JSON: {line!r}")
    return parsed


async def _scrape(port: int) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _partitions(samples: Samples, name: str, topic: str) -> set[int]:
    return {int(labels["partition"]) for labels, _ in samples.get(name, []) if labels["topic"] == topic}


async def _until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} within {within_s} s"
        await asyncio.sleep(0.5)


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


async def test_a_consumer_run_logs_json_and_exports_its_metrics(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any, tmp_path: Path
) -> None:
    """Two consumers of one group on real servers: every line either writes is JSON and none says
    'Unclosed'; the first one's /metrics has process, build, freshness, lag and GC-age series, counts what it
    applied, and, once the second member takes a partition, no series of the partition it gave up. The
    dead-letter topic is created with the partitions the settings ask for."""
    topic = await topic_factory(partitions=2)
    dead_letters = f"dead-{uuid.uuid4().hex[:10]}"
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    done = _gc(kafka_settings, cassandra_settings, "--once", "--json")  # nothing to fold: a complete run
    assert done.returncode == 0, done.stderr
    assert {e["event"] for e in _json_lines(done.stderr)} >= {"gc_started", "gc_finished"}

    settings = {"group_id": group, "counters_file": counters, "dead_letter_topic": dead_letters,
                "dead_letter_partitions": 2, "flush_interval_s": 0.5}
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    port = free_port()
    first = start_consumer(kafka_settings, cassandra_settings, logs[0], **settings, health_port=port)
    second = None
    try:
        await wait_until_started(logs[0], first)
        events, _ = make_events(600, symbols=10, malformed=3, seed=41)
        await publish(kafka_settings, topic, events)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))

        async def counted() -> bool:
            applied = (await _scrape(port)).get("countersink_events_applied_total", [({}, 0.0)])
            return applied[0][1] == 600

        await _until(counted, 30, "the consumer counted every valid event")
        samples = await _scrape(port)
        assert samples["process_resident_memory_bytes"][0][1] > 0
        assert samples["process_cpu_seconds_total"][0][1] > 0
        ((build, one),) = samples["countersink_build_info"]
        assert one == 1
        assert build["version"]
        assert build["python"]
        assert samples["countersink_events_dead_lettered_total"][0][1] == 3
        assert _partitions(samples, "countersink_partition_lag", topic) == {0, 1}
        assert all(v == 0 for labels, v in samples["countersink_partition_lag"] if labels["topic"] == topic)
        assert _partitions(samples, "countersink_partition_flush_age_seconds", topic) == {0, 1}
        assert all(0 <= v < 30 for _, v in samples["countersink_partition_flush_age_seconds"])
        ((_, gc_age),) = samples["countersink_gc_last_complete_age_seconds"]
        assert 0 <= gc_age < 300
        # the GC run above, which exited before any scrape, as the consumer read its record
        assert {labels["outcome"]: v for labels, v in samples["countersink_gc_last_run_outcome"]}["complete"] == 1
        ((_, ended),) = samples["countersink_gc_last_run_end_timestamp_seconds"]
        assert 0 <= time.time() - ended < 300
        assert "countersink_cassandra_driver_timeouts_total" not in samples or all(
            v >= 0 for _, v in samples["countersink_cassandra_driver_timeouts_total"])
        assert not [name for name in samples if name.endswith("_created")]

        second = start_consumer(kafka_settings, cassandra_settings, logs[1], **settings, health_port=free_port())
        await wait_until_started(logs[1], second)

        async def one_partition_left() -> bool:
            now = await _scrape(port)
            lag = _partitions(now, "countersink_partition_lag", topic)
            fresh = _partitions(now, "countersink_partition_flush_age_seconds", topic)
            return len(lag) == 1 and lag == fresh

        await _until(one_partition_left, 60, "the first consumer's series cover only the partition it kept")
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([dead_letters])
            assert len(described["partitions"]) == 2
            await admin.delete_topics([dead_letters])
        finally:
            await admin.close()
    finally:
        codes = [_stop(p) for p in (first, second) if p is not None]
    assert codes == [0, 0]
    for log in logs:
        lines = _json_lines(log.read_text())
        assert {"timestamp", "level", "event"} <= set().union(*lines)
        assert "Unclosed" not in log.read_text()
        assert lines[-1]["event"] == "consumer_stopped"


def test_a_start_up_timeout_is_json_and_leaves_no_client_open(kafka_settings: KafkaSettings,
                                                              tmp_path: Path) -> None:
    """A consumer whose Cassandra never answers gives up after startup_timeout_s with exit 1, writing only
    JSON lines (the driver's complaints included) and no 'Unclosed AIOKafkaProducer'."""
    unreachable = CassandraSettings(contact_points=["127.0.0.1"], port=2)  # nothing listens there
    counters = write_definitions(tmp_path, "never-read")
    env = child_env(kafka_settings, unreachable,
                    consumer={"counters_file": counters, "startup_timeout_s": 2, "health_port": 0})
    done = subprocess.run([sys.executable, "-m", "consumer"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    lines = _json_lines(done.stderr)
    assert "waiting_for_server" in {e["event"] for e in lines}
    assert lines[-1]["event"] == "consumer_start_failed"
    assert "Unclosed" not in done.stderr


async def test_gc_runs_are_recorded_and_their_age_exported(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings
) -> None:
    """A `gc --once` run leaves a complete row and moves last_complete_us; a deferred or failed run is
    recorded without moving it; the sampler turns it into the exported age; `gc --runs` shows the record."""
    async with CassandraClient(cassandra_settings) as client:
        runs = GcRunLog(client)
        assert await runs.last_complete_us() is None
        sampler = GcAgeSampler(client, refresh_s=0)
        await sampler()
        assert _gc_age() == math.inf

        before_us = time.time_ns() // 1000
        done = _gc(kafka_settings, cassandra_settings, "--once", "--json")
        assert done.returncode == 0, done.stderr
        (run,) = await runs.recent()
        assert (run.outcome, run.error) == ("complete", None)
        assert run.ended_us is not None
        assert before_us <= run.started_us <= run.ended_us
        last = await runs.last_complete_us()
        assert last == run.ended_us

        later_us = time.time_ns() // 1000
        deferred, failed = uuid.uuid4(), uuid.uuid4()
        assert await runs.started(deferred, later_us, "test:1")
        assert await runs.finished(deferred, later_us, later_us + 5, outcome="deferred", instances_deferred=4)
        assert await runs.started(failed, later_us + 10, "test:2")
        assert await runs.finished(failed, later_us + 10, later_us + 20, outcome="failed", error="x" * 5000)
        newest = await runs.recent()
        assert [r.outcome for r in newest] == ["failed", "deferred", "complete"]
        assert newest[0].error == "x" * 1000  # bounded
        assert newest[1].instances_deferred == 4
        assert await runs.last_complete_us() == last

        await sampler()
        assert 0 <= _gc_age() < 120
        # The last ended run's record, exported for a GC run from cron, whose own counters died with it.
        exported = {(s.name, tuple(s.labels.values())): s.value
                    for f in METRICS.gc_last_run.collect() for s in f.samples}
        assert exported["countersink_gc_last_run_end_timestamp_seconds", ()] == (later_us + 20) / 1e6
        assert [labels for (name, labels), v in exported.items()
                if name == "countersink_gc_last_run_outcome" and v == 1] == [("failed",)]
        assert exported["countersink_gc_last_run_instances_folded", ()] == 0
        assert await runs.finished(deferred, later_us, later_us + 25, outcome="deferred", instances_folded=9,
                                   instances_deferred=4, shards_deleted=11)
        await sampler()
        exported = {(s.name, tuple(s.labels.values())): s.value
                    for f in METRICS.gc_last_run.collect() for s in f.samples}
        # the run that ended last, though another started after it
        assert exported["countersink_gc_last_run_end_timestamp_seconds", ()] == (later_us + 25) / 1e6
        assert (exported["countersink_gc_last_run_instances_folded", ()],
                exported["countersink_gc_last_run_shards_deleted", ()]) == (9, 11)
        assert exported["countersink_gc_last_run_outcome", ("deferred",)] == 1

    shown = _gc(kafka_settings, cassandra_settings, "--runs", "2", "--json")
    assert shown.returncode == 0, shown.stderr
    head, *rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert head == {"last_complete_us": last}
    assert [(r["outcome"], r["run"]) for r in rows] == [("failed", str(failed)), ("deferred", str(deferred))]
    text = _gc(kafka_settings, cassandra_settings, "--runs")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("last complete run: ")
    assert "error: " + "x" * 1000 in text.stdout


async def test_a_loop_run_stopped_by_sigterm_is_recorded_as_stopped(
        cassandra_settings: CassandraSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM (the loop's stop) in the middle of a run ends the loop with 0 and leaves the run recorded as
    `stopped`, not `running` for good. The run is held in the middle by a collector that never finishes."""
    midway = asyncio.Event()

    class EndlessCollector:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        async def run(self, started_us: int) -> None:
            midway.set()
            await asyncio.Event().wait()

    monkeypatch.setattr(gc_cli, "Collector", EndlessCollector)
    settings = Settings(cassandra=cassandra_settings, gc=GcSettings(every_s=60, health_port=0))
    parser = argparse.ArgumentParser()
    gc_cli.add_gc_arguments(parser)
    stop = asyncio.Event()
    loop = asyncio.ensure_future(gc_cli._loop_until(stop, settings, parser.parse_args(["--every", "60s"])))
    await asyncio.wait_for(midway.wait(), 60)
    stop.set()
    assert await asyncio.wait_for(loop, 30) == 0
    async with CassandraClient(cassandra_settings) as client:
        (run,) = await GcRunLog(client).recent()
    assert run.outcome == "stopped"
    assert run.ended_us is not None
    assert run.ended_us >= run.started_us


def _gc_age() -> float:
    (value,) = [s.value for f in METRICS.gc_age.collect() for s in f.samples]
    return value


async def test_dead_letter_topic_settings_and_broker_defaults(kafka_settings: KafkaSettings) -> None:
    """Topics are created with the broker's defaults when no count is given, with the given count otherwise,
    and a replication factor the cluster cannot meet is refused, not ignored."""
    defaulted, counted = f"dl-{uuid.uuid4().hex[:10]}", f"dl-{uuid.uuid4().hex[:10]}"
    await ensure_topics(kafka_settings, {defaulted: None}, replication=None)
    await ensure_topics(kafka_settings, {counted: 3}, replication=None)
    with pytest.raises(InvalidReplicationFactorError):
        await ensure_topics(kafka_settings, {f"dl-{uuid.uuid4().hex[:10]}": 1}, replication=99)
    admin = make_admin(kafka_settings)
    await admin.start()
    try:
        partitions, replication = await broker_topic_defaults(admin)
        shapes = {t["topic"]: (len(t["partitions"]), len(t["partitions"][0]["replicas"]))
                  for t in await admin.describe_topics([defaulted, counted])}
        await admin.delete_topics([defaulted, counted])
    finally:
        await admin.close()
    assert shapes == {defaulted: (partitions, replication), counted: (3, replication)}


async def test_serve_exports_the_gc_age(kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings) -> None:
    """`countersink serve`'s /metrics reads the last complete GC run from Cassandra and exports its age."""
    done = _gc(kafka_settings, cassandra_settings, "--once", "--json")
    assert done.returncode == 0, done.stderr
    async with CassandraClient(cassandra_settings) as client:
        api = ReadApi(client, ServeSettings())
        async with TestClient(TestServer(api.app())) as http:
            response = await http.get("/metrics")
            assert response.status == 200
            text = await response.text()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert 0 <= values["countersink_gc_last_complete_age_seconds"] < 120
    assert values["countersink_cassandra_connections"] >= 1  # sampled from the driver before the scrape
