"""docs/counters.md's worked example of a real topic, run as written on real Kafka, Cassandra and schema registry:
several types of event in one Avro topic (a union of records), keyed by the record key and bucketed by the record
time, counted exactly, with no valid event lost to any counter."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from countersink.cassandra import CassandraClient
from countersink.kafka import make_admin
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings, KafkaSettings
from schemas.definitions import load_definitions
from stack.loading import child_env
from tests.docblocks import doc_block
from tests.integration.consumer_support import read_topic
from tests.integration.per_counter_truth import TruthRecord, per_counter_truth

REPO = Path(__file__).resolve().parents[2]
COUNTERS_PAGE = REPO / "docs" / "counters.md"
HEADING = "### A real topic: several event types in Avro, keyed and timed by the record"
EXAMPLE = REPO / "examples" / "shop"


def _blocks() -> dict[str, list[str]]:
    """The fenced blocks of the worked example, by their info string, in page order."""
    section = COUNTERS_PAGE.read_text().split(HEADING, 1)[1].split("\n### ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for kind, body in re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL):
        blocks.setdefault(kind, []).append(body)
    return blocks


def test_the_page_shows_the_example_files_as_they_are() -> None:
    """The schema, counters and events the page shows are the files of examples/shop, byte for byte."""
    blocks = _blocks()
    assert blocks["avsc"] == [(EXAMPLE / "shop.avsc").read_text()]
    assert blocks["toml"] == [(EXAMPLE / "counters.toml").read_text()]
    assert blocks["text"] == [(EXAMPLE / "events.txt").read_text()]


def _truth_records(events: str) -> list[TruthRecord]:
    """The records ``publish --key-separator : --timestamp at`` makes of the example's lines."""
    records = []
    for line in events.splitlines():
        key, _, value = line.partition(":")
        records.append(TruthRecord(value.encode(), key=key.encode(), timestamp_ms=json.loads(value)["at"]))
    return records


async def test_the_worked_example_counts_every_event_exactly(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, schema_registry_url: str, tmp_path: Path,
) -> None:
    """The page's commands, run as written through the CLI (its topic renamed, its registry the session's),
    print what the page shows; the records carry the user as key and the event's time as timestamp; every
    counter holds what a truth computed per counter from the events says, no more keys; nothing is refused."""
    topic = f"shop-events-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "examples" / "shop"
    folder.mkdir(parents=True)
    for source in EXAMPLE.iterdir():
        (folder / source.name).write_text(source.read_text().replace("shop-events", topic))
    group = topic
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": 0, "group_id": group,
                                                                  "dead_letter_topic": f"dlq-{group}"})
    env["PYTHONPATH"] = str(REPO)
    steps: list[tuple[str, list[str]]] = []
    for line in doc_block("docs/counters.md", "shop-console").splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].replace("shop-events", topic), []))
        elif line.strip():
            steps[-1][1].append(line.replace("shop-events", topic))
    consumer: subprocess.Popen[bytes] | None = None
    log = tmp_path / "consumer.log"
    checked = 0
    try:
        for command, expected in steps:
            words = shlex.split(command)
            if words[0] == "export":
                assert words[1].partition("=")[0] == "COUNTERSINK_SCHEMA_REGISTRY__URL"
                env["COUNTERSINK_SCHEMA_REGISTRY__URL"] = schema_registry_url  # the session's registry
                continue
            assert words[0] == "countersink", command
            argv = [sys.executable, "-m", "countersink.cli", *words[1:]]
            if words[1] == "consume":
                assert words[-3:] == ["2>", "consumer.log", "&"]
                consumer = _spawn(argv[:-3], tmp_path, env)
                continue
            deadline = time.monotonic() + 90
            while True:
                done = await asyncio.to_thread(subprocess.run, argv, cwd=tmp_path, env=env, capture_output=True,
                                               text=True, timeout=60, check=False)
                shown = done.stdout.strip().splitlines()
                if words[1] != "get" or shown == expected:
                    break
                assert consumer is not None
                assert consumer.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{command}: {done.stdout}{done.stderr}"
                await asyncio.sleep(1)
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
            assert shown == expected, command
            checked += bool(expected)
            if words[1:3] == ["topics", "create"]:
                await _keep_forever(kafka_settings, topic)

        events = (EXAMPLE / "events.txt").read_text()
        records = _truth_records(events)
        published = await read_topic(kafka_settings, topic, len(records))
        assert sorted((r.key, r.timestamp) for r in published) == sorted((r.key, r.timestamp_ms) for r in records)
        assert all(r.value[0] == 0 for r in published)  # the Confluent wire format, not the JSON lines

        truth = per_counter_truth(load_definitions(folder / "counters.toml"), topic, records)
        assert truth.refused == {}
        assert truth.skipped[("coupon_uses", "key_null")] == 1
        assert truth.skipped[("coupon_uses", "key_missing")] == 6
        async with CassandraClient(cassandra_settings) as client:
            reader = CounterReader(client)
            for counter, values in truth.values.items():
                keys, _ = await reader.list_instances(counter, limit=1000)
                assert sorted(keys) == sorted(values), counter
                assert await reader.get_many(counter, keys) == values, counter
        assert await read_topic(kafka_settings, f"dlq-{group}", 0, then_s=1.0) == []
        assert consumer is not None
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait(30)
        await _delete_topics(kafka_settings, [topic, f"dlq-{group}"])
    assert checked == 7  # topics create, publish and five reads


def _spawn(argv: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (folder / "consumer.log").open("ab") as log:
        return subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=log)


async def _keep_forever(kafka: KafkaSettings, topic: str) -> None:
    """The example's records are dated 2026-11-25: from a week later on, the broker's retention (by record
    time) could delete them at any check, before this test has read them back. Not a step of the page's.
    (AlterConfigs replaces the topic's settings: the cleanup.policy ``topics create`` sets is set again.)"""
    admin = make_admin(kafka)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {
            "cleanup.policy": "delete", "retention.ms": "-1"})])
    finally:
        await admin.close()


async def _delete_topics(kafka: KafkaSettings, topics: list[str]) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        if mine := [t for t in await admin.list_topics() if t in topics]:
            await admin.delete_topics(mine)
    finally:
        await admin.close()
