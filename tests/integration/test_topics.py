"""Topics that countersink creates (``topics create``, ``consume --create-topics``) get the partitions and
replication factor of the settings, and a topic the broker refuses is an error naming it and the reason."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

from countersink.kafka import make_admin
from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env
from tests.integration.test_first_hour import delete_topics

REPO = Path(__file__).resolve().parents[2]


def countersink(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


async def topic_shape(kafka: KafkaSettings, topic: str) -> tuple[int, int] | None:
    """(partitions, replicas of the first) of ``topic``, or None when it does not exist."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return None
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return len(described["partitions"]), len(described["partitions"][0]["replicas"])


async def test_a_topic_the_broker_refuses_is_an_error_naming_it(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings) -> None:
    """A replication factor above the one broker's count: exit 1, one line naming the topic and the broker's
    reason, nothing printed as created, and no topic."""
    topic = f"refused-{uuid.uuid4().hex[:10]}"
    for args, sections in ((["--replication-factor", "3"], {}),
                           ([], {"consumer": {"topic_replication_factor": 3}})):
        env = child_env(kafka_settings, cassandra_settings, **sections)
        done = await asyncio.to_thread(countersink, "topics", "create", topic, *args, env=env)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout == ""
        (line,) = [json.loads(x) for x in done.stderr.splitlines()]
        assert line["event"] == "command_failed"
        assert f"InvalidReplicationFactorError: cannot create topic {topic}: " in line["error"]
        assert "replication factor of 3 cannot be reached" in line["error"]
        assert await topic_shape(kafka_settings, topic) is None


async def test_topics_create_takes_partitions_and_replication_from_the_settings(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings) -> None:
    """``topics create`` without flags uses topic_partitions and topic_replication_factor."""
    topic = f"shaped-{uuid.uuid4().hex[:10]}"
    env = child_env(kafka_settings, cassandra_settings,
                    consumer={"topic_partitions": 5, "topic_replication_factor": 1})
    try:
        # Named twice: one topic (Kafka refused the whole request for the repeated name).
        done = await asyncio.to_thread(countersink, "topics", "create", topic, topic, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"created {topic} (5 partitions)"
        assert await topic_shape(kafka_settings, topic) == (5, 1)
    finally:
        await delete_topics(kafka_settings, topic)


async def test_a_consumer_creating_a_refused_topic_stops_naming_it(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """``consume --create-topics`` uses topic_replication_factor too: one the broker refuses stops the start
    with exit 1 and a line naming the topic and the reason."""
    topic = f"refused-{uuid.uuid4().hex[:10]}"
    counters = tmp_path / "counters.toml"
    counters.write_text(f'[[counter]]\nname = "hits"\ntopics = ["{topic}"]\nkind = "count"\n')
    env = child_env(kafka_settings, cassandra_settings,
                    consumer={"health_port": 0, "group_id": topic, "topic_replication_factor": 3,
                              "startup_timeout_s": 20})
    done = await asyncio.to_thread(countersink, "consume", "--counters", str(counters), "--create-topics", env=env)
    assert done.returncode == 1, done.stderr
    failed = [json.loads(x) for x in done.stderr.splitlines() if '"level": "error"' in x]
    assert [line["event"] for line in failed] == ["consumer_start_failed"], done.stderr
    assert f"cannot create topic {topic}: " in failed[0]["error"]
    assert "replication factor of 3 cannot be reached" in failed[0]["error"]
    assert await topic_shape(kafka_settings, topic) is None
