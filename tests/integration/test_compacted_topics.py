"""Compacted topics on a real broker: refused for counters that drop publisher retries by event id (the cleaner
could remove an original that its retry superseded), at start and on a later assignment; accepted with
``cleanup.policy=delete``, and never created compacted by countersink."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from structlog.testing import capture_logs

from consumer.service import ConsumerService
from countersink.kafka import cleanup_policies, make_admin, make_consumer
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.definitions import load_definitions
from stack.loading import child_env
from tests.integration.consumer_support import running, write_definitions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _run(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(kafka, cassandra, consumer={"health_port": 0, "group_id": f"g{os.urandom(4).hex()}"})
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _refusals(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if '"topic_refused"' in line]


async def test_a_consumer_refuses_a_compacted_topic_for_counters_with_an_event_id(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Callable[..., Awaitable[str]],
    tmp_path: Path,
) -> None:
    """``countersink consume`` over a topic with cleanup.policy=compact,delete and counters that deduplicate by
    event id exits 2 with one topic_refused line naming the topic, the policy and the counters; ``topics
    create`` over it says the same. Without event ids, the same topic is accepted by ``topics create``."""
    topic = await topic_factory("compaction", configs={"cleanup.policy": "compact,delete"})
    assert await cleanup_policies(kafka_settings, [topic]) == {topic: "compact,delete"}
    counters = write_definitions(tmp_path, topic)
    done = await asyncio.to_thread(_run, kafka_settings, cassandra_settings, "consume", "--counters", str(counters))
    assert done.returncode == 2, done.stderr
    (refused,) = _refusals(done.stderr)
    assert refused["topic"] == topic
    assert refused["policy"] == "compact,delete"
    assert "'trades_count', 'shares_traded', 'notional' drop publisher retries by event_id" in str(refused["error"])
    assert "Traceback" not in done.stderr

    created = await asyncio.to_thread(_run, kafka_settings, cassandra_settings, "topics", "create",
                                      "--counters", str(counters))
    assert created.returncode == 2, created.stderr
    assert len(_refusals(created.stderr)) == 1
    without_ids = tmp_path / "no_ids.toml"
    without_ids.write_text("\n".join(line for line in counters.read_text().splitlines()
                                     if not line.startswith("event_id")))
    accepted = await asyncio.to_thread(_run, kafka_settings, cassandra_settings, "topics", "create",
                                       "--counters", str(without_ids))
    assert accepted.returncode == 0, accepted.stderr


async def test_a_delete_topic_is_counted_and_refused_once_it_turns_compacted(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Callable[..., Awaitable[str]],
    tmp_path: Path,
) -> None:
    """A topic with cleanup.policy=delete is accepted and its partitions taken. Switched to compact while the
    consumer runs, the next assignment (another member joins) takes none of them: topic_refused is logged
    and the consumer reports unready, naming the topic."""
    topic = await topic_factory("compaction", configs={"cleanup.policy": "delete"})
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        health_port=0))
    async with running(ConsumerService(settings, load_definitions(counters))) as service:
        deadline = time.monotonic() + 60
        while len(service.mutators) < 3 or not service.is_ready:
            assert time.monotonic() < deadline, "the consumer did not take the delete topic's partitions"
            await asyncio.sleep(0.2)
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": "compact"})])
        finally:
            await admin.close()
        other = make_consumer(kafka_settings, topic, group_id=group, session_timeout_ms=6000)
        with capture_logs() as logs:
            await other.start()
            try:
                while not service.refused:
                    assert time.monotonic() < deadline + 60, "no partition was refused after the rebalance"
                    await other.getmany(timeout_ms=200)
                assert not service.is_ready
                assert f"topics refused: {topic}" in service._why_not_ready()
                assert not any(tp in service.mutators for tp in service.refused)
            finally:
                await other.stop()
    refusals = [entry for entry in logs if entry["event"] == "topic_refused"]
    assert refusals
    assert refusals[0]["topic"] == topic
    assert refusals[0]["policy"] == "compact"
