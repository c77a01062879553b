"""Avro, Protobuf and JSON Schema topics through a real schema registry (Apicurio's Confluent-compatible API),
on real Kafka and Cassandra: schema evolution counted exactly, unknown ids dead-lettered with the id, and a
registry that is away waited for."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from structlog.testing import capture_logs

from consumer.cli import consume
from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient
from countersink.kafka import make_admin
from countersink.reader import read_state
from countersink.schema_registry import SchemaRegistryClient, SchemaRegistryUnavailableError
from countersink.settings import (
    CassandraSettings,
    ConsumerSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    Settings,
)
from schemas.definitions import load_definitions
from schemas.formats import ProtoSchema, avro_encoder, compile_avro, frame
from stack import servers
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.docblocks import doc_block
from tests.integration.consumer_support import read_topic, running

REPO = Path(__file__).resolve().parents[2]
COUNTERS_PAGE = REPO / "docs" / "counters.md"

VIEW_V1 = {"type": "record", "name": "View", "namespace": "shop", "fields": [
    {"name": "page", "type": "string"},
    {"name": "n", "type": "long"},
]}
VIEW_V2 = {**VIEW_V1, "fields": [*VIEW_V1["fields"], {"name": "user", "type": "string", "default": "anon"}]}

PURCHASE_V1 = """syntax = "proto3";
package shop;
message Purchase {
  string sku = 1;
  int64 amount = 2;
}
"""
PURCHASE_V2 = """syntax = "proto3";
package shop;
message Purchase {
  string sku = 1;
  int64 amount = 2;
  string region = 3;
}
"""
CLICK = {"type": "object", "properties": {"button": {"type": "string"}}, "required": ["button"]}

AVRO_AND_PROTOBUF_COUNTERS = """
[[topic]]
name = "{avro}"
format = "avro"
reader_schema_file = "view_v2.avsc"

[[topic]]
name = "{proto}"
format = "protobuf"

[[counter]]
name = "views_by_page"
topics = ["{avro}"]
kind = "count"
key = ["page"]

[[counter]]
name = "n_by_user"
topics = ["{avro}"]
kind = "sum"
key = ["user"]
value = "n"

[[counter]]
name = "purchases_by_sku"
topics = ["{proto}"]
kind = "count"
key = ["sku"]

[[counter]]
name = "amount_by_sku"
topics = ["{proto}"]
kind = "sum"
key = ["sku"]
value = "amount"
"""
COUNTERS = AVRO_AND_PROTOBUF_COUNTERS + """
[[topic]]
name = "{json}"
format = "json-schema"
validate = true

[[counter]]
name = "clicks_by_button"
topics = ["{json}"]
kind = "count"
key = ["button"]
"""


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path,
              registry_url: str) -> Settings:
    return Settings(kafka=kafka, cassandra=cassandra, schema_registry=SchemaRegistrySettings(url=registry_url),
                    consumer=ConsumerSettings(group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}",
                                              flush_interval_s=0.3, session_timeout_ms=6000, health_port=0))


def _views_by_page(folder: Path, topic: str) -> Path:
    """A definitions file counting an Avro topic's views by page."""
    counters = folder / "counters.toml"
    counters.write_text(f'[[topic]]\nname = "{topic}"\nformat = "avro"\n\n[[counter]]\nname = "views_by_page"\n'
                        f'topics = ["{topic}"]\nkind = "count"\nkey = ["page"]\n')
    return counters


async def _values(cassandra: CassandraSettings, wanted: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    async with CassandraClient(cassandra) as client:
        for counter, keys in wanted.items():
            found[counter] = {}
            for key in keys:
                state = await read_state(client, counter, key)
                found[counter][key] = None if state is None else state.value()
    return found


def _avro_and_protobuf_events(n: int, view_ids: list[int], purchase_ids: list[int], seed: int
                              ) -> tuple[list[bytes], list[bytes], dict[str, dict[str, Any]]]:
    """``n`` page views (Avro, v1 or v2 at random) and ``n`` purchases (Protobuf, v1 or v2), framed with the
    given schema ids, and what each counter must say, computed from the events as they are made."""
    rng = random.Random(seed)
    views, purchases = [], []
    pages: Counter[str] = Counter()
    n_by_user: Counter[str] = Counter()
    skus: Counter[str] = Counter()
    amounts: Counter[str] = Counter()
    encode_view = [avro_encoder(json.dumps(s)) for s in (VIEW_V1, VIEW_V2)]
    protos = [ProtoSchema(s) for s in (PURCHASE_V1, PURCHASE_V2)]
    encode_purchase = [p.encoder(p.indexes_of("shop.Purchase")) for p in protos]
    for _ in range(n):
        version = rng.randrange(2)
        page, count = f"/p{rng.randrange(7)}", rng.randrange(1, 2**40)
        view: dict[str, Any] = {"page": page, "n": count}
        if version:
            view["user"] = f"u{rng.randrange(5)}"
        views.append(frame(view_ids[version], encode_view[version](view)))
        pages[page] += 1
        n_by_user[view.get("user", "anon")] += count
        sku, amount = f"k{rng.randrange(9)}", rng.randrange(1, 10**6)
        purchase: dict[str, Any] = {"sku": sku, "amount": amount}
        if version:
            purchase["region"] = rng.choice(["eu", "us"])
        purchases.append(frame(purchase_ids[version], encode_purchase[version](purchase), (0,)))
        skus[sku] += 1
        amounts[sku] += amount
    expected = {"views_by_page": dict(pages), "n_by_user": dict(n_by_user), "purchases_by_sku": dict(skus),
                "amount_by_sku": dict(amounts)}
    return views, purchases, expected


async def _register_evolving_schemas(url: str, avro_topic: str, proto_topic: str) -> tuple[list[int], list[int]]:
    async with SchemaRegistryClient(SchemaRegistrySettings(url=url)) as client:
        view_ids = [await client.register(f"{avro_topic}-value", "AVRO", json.dumps(s)) for s in (VIEW_V1, VIEW_V2)]
        purchase_ids = [await client.register(f"{proto_topic}-value", "PROTOBUF", s)
                        for s in (PURCHASE_V1, PURCHASE_V2)]
    return view_ids, purchase_ids


async def test_avro_protobuf_and_json_schema_with_schema_evolution_count_exactly(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    schema_registry_url: str, tmp_path: Path,
) -> None:
    """v1 and v2 writer schemas (v2 adds a field, with a default in Avro) in the same partitions are counted
    exactly against a truth computed from what was sent; an Avro v1 record reads the v2 default; a record
    naming an id the registry does not know, one naming a schema of another format, and a JSON Schema record
    against its schema are dead letters (the first two with the id in their headers), and counting goes on."""
    avro_topic, proto_topic = await topic_factory("avro", partitions=2), await topic_factory("proto", partitions=2)
    json_topic = await topic_factory("jsonschema", partitions=1)
    view_ids, purchase_ids = await _register_evolving_schemas(schema_registry_url, avro_topic, proto_topic)
    async with SchemaRegistryClient(SchemaRegistrySettings(url=schema_registry_url)) as client:
        click_id = await client.register(f"{json_topic}-value", "JSON", json.dumps(CLICK))
    assert len({*view_ids, *purchase_ids, click_id}) == 5

    views, purchases, expected = _avro_and_protobuf_events(600, view_ids, purchase_ids, seed=31)
    rng = random.Random(5)
    buttons: Counter[str] = Counter()
    clicks = []
    for i in range(600):
        button = rng.choice(["buy", "like", "share"])
        clicks.append(frame(click_id, json.dumps({"button": button, "i": i}).encode()))
        buttons[button] += 1
    expected["clicks_by_button"] = dict(buttons)
    unknown_id = 987_654
    views.insert(300, frame(unknown_id, avro_encoder(json.dumps(VIEW_V1))({"page": "/lost", "n": 1})))
    views.insert(400, frame(purchase_ids[0], b"\x02\x00"))  # a Protobuf schema's id on the Avro topic
    clicks.insert(100, frame(click_id, b'{"button": 7}'))
    await publish(kafka_settings, avro_topic, views)
    await publish(kafka_settings, proto_topic, purchases)
    await publish(kafka_settings, json_topic, clicks)

    group = f"g{os.urandom(4).hex()}"
    (tmp_path / "view_v2.avsc").write_text(json.dumps(VIEW_V2))
    counters = tmp_path / "counters.toml"
    counters.write_text(COUNTERS.replace("{avro}", avro_topic).replace("{proto}", proto_topic)
                        .replace("{json}", json_topic))
    settings = _settings(kafka_settings, cassandra_settings, group, counters, schema_registry_url)
    ends = await end_offsets(kafka_settings, {avro_topic: 2, proto_topic: 2, json_topic: 1})
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, ends)

    assert await _values(cassandra_settings, expected) == expected
    assert expected["n_by_user"]["anon"] > 0  # v1 records were there, and read the v2 default
    dead = await read_topic(kafka_settings, f"dlq-{group}", 3, then_s=1.0)
    by_error = {dict(r.headers)["countersink.error"].decode(): dict(r.headers) for r in dead}
    assert set(by_error) == {"UnknownSchemaError", "BadSchemaEventError", "InvalidEventError"}
    assert by_error["UnknownSchemaError"]["countersink.schema_id"] == str(unknown_id).encode()
    assert by_error["BadSchemaEventError"]["countersink.schema_id"] == str(purchase_ids[0]).encode()
    assert b"PROTOBUF schema on a avro topic" in by_error["BadSchemaEventError"]["countersink.reason"]
    assert by_error["InvalidEventError"]["countersink.path"] == b"button"


async def test_registry_away_is_a_wait_then_everything_counts(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    private_schema_registry: servers.SchemaRegistryServer, tmp_path: Path,
) -> None:
    """With the registry away (its process frozen: every request times out) the consumer applies nothing of
    the Avro topic and is unready, saying why; no record is dead-lettered. A JSON topic the same consumer counts
    goes on meanwhile: its events are counted and flushed (it waited with the Avro topic before). Once the
    registry answers again every record is counted exactly. (Frozen rather than restarted: the stack's registry
    keeps schemas in memory, so a restarted one would answer "unknown id" until the schema is registered again,
    which a record is rightly dead-lettered for.)"""
    topic = await topic_factory("avro", partitions=2)
    plain = await topic_factory("json", partitions=2)
    registry = SchemaRegistrySettings(url=private_schema_registry.url)
    async with SchemaRegistryClient(registry) as client:
        schema_id = await client.register(f"{topic}-value", "AVRO", json.dumps(VIEW_V1))
    encode = avro_encoder(json.dumps(VIEW_V1))
    pages: Counter[str] = Counter()
    events = []
    for i in range(300):
        page = f"/p{i % 11}"
        events.append(frame(schema_id, encode({"page": page, "n": i})))
        pages[page] += 1
    await publish(kafka_settings, topic, events)
    clicks = Counter(f"/c{i % 7}" for i in range(200))
    assert private_schema_registry.process is not None
    registry_pid = private_schema_registry.process.pid
    assert registry_pid is not None
    os.kill(registry_pid, signal.SIGSTOP)
    try:
        group = f"g{os.urandom(4).hex()}"
        counters = _views_by_page(tmp_path, topic)
        counters.write_text(counters.read_text() + f'\n[[counter]]\nname = "clicks_by_page"\ntopics = ["{plain}"]\n'
                            'kind = "count"\nkey = ["page"]\n')
        settings = _settings(kafka_settings, cassandra_settings, group, counters, private_schema_registry.url)
        settings = settings.model_copy(update={"schema_registry": settings.schema_registry.model_copy(
            update={"timeout_s": 2.0})})
        service = ConsumerService(settings, load_definitions(counters))
        async with running(service):
            deadline = time.monotonic() + 60
            while service.schema_wait is None:
                assert time.monotonic() < deadline, "the consumer never waited for the registry"
                await asyncio.sleep(0.2)
            # Published while the Avro topic waits: counted and flushed all the same.
            await publish(kafka_settings, plain, [json.dumps({"page": page}).encode()
                                                  for page, n in clicks.items() for _ in range(n)])
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {plain: 2}))
            assert not service.is_ready
            assert "waiting for the schema registry" in service._why_not_ready()
            assert await _values(cassandra_settings, {"views_by_page": dict(pages)}) == {
                "views_by_page": dict.fromkeys(pages)}
            assert await _values(cassandra_settings, {"clicks_by_page": dict(clicks)}) == {
                "clicks_by_page": dict(clicks)}
            os.kill(registry_pid, signal.SIGCONT)
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
            assert service.schema_wait is None
    finally:
        os.kill(registry_pid, signal.SIGCONT)

    assert await _values(cassandra_settings, {"views_by_page": dict(pages)}) == {"views_by_page": dict(pages)}
    assert await read_topic(kafka_settings, f"dlq-{group}", 1, within_s=2) == []


async def test_an_id_unknown_at_first_is_asked_again_and_its_later_records_count(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    private_schema_registry: servers.SchemaRegistryServer, tmp_path: Path,
) -> None:
    """A record naming an id before its schema is registered (a producer registering and writing at once, a
    registry follower behind) is a dead letter; the schema registered then, the id is asked again after
    ``unknown_schema_retry_s`` and its records count. The 404 was kept for the consumer's life: every later
    record of that schema was a dead letter until a restart."""
    topic = await topic_factory("avro", partitions=1)
    registry = SchemaRegistrySettings(url=private_schema_registry.url)
    async with SchemaRegistryClient(registry) as client:
        before = await client.register(f"{topic}-other-value", "AVRO", json.dumps(
            {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "long"}]}))
    upcoming = before + 1  # the registry numbers new schemas in turn (asserted when registered below)
    encode = avro_encoder(json.dumps(VIEW_V1))
    group = f"g{os.urandom(4).hex()}"
    counters = _views_by_page(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters, private_schema_registry.url)
    settings = settings.model_copy(update={"schema_registry": settings.schema_registry.model_copy(
        update={"unknown_schema_retry_s": 1.0})})
    async with running(ConsumerService(settings, load_definitions(counters))):
        await publish(kafka_settings, topic, [frame(upcoming, encode({"page": "/early", "n": 1}))])
        assert len(await read_topic(kafka_settings, f"dlq-{group}", 1, then_s=0.5)) == 1
        async with SchemaRegistryClient(registry) as client:
            assert await client.register(f"{topic}-value", "AVRO", json.dumps(VIEW_V1)) == upcoming
        await asyncio.sleep(1.5)
        await publish(kafka_settings, topic, [frame(upcoming, encode({"page": "/later", "n": i})) for i in range(5)])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
    assert await _values(cassandra_settings, {"views_by_page": {"/early": 0, "/later": 0}}) == {
        "views_by_page": {"/early": None, "/later": 5}}
    assert len(await read_topic(kafka_settings, f"dlq-{group}", 2, within_s=2)) == 1


async def test_a_stop_while_waiting_for_the_registry_is_prompt(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any, tmp_path: Path,
) -> None:
    """A stop requested while records wait for a registry nothing answers at ends the loop within seconds."""
    topic = await topic_factory("avro", partitions=1)
    await publish(kafka_settings, topic, [frame(1, b"\x02a\x02")])
    counters = tmp_path / "counters.toml"
    counters.write_text(f'[[topic]]\nname = "{topic}"\nformat = "avro"\n\n[[counter]]\nname = "c"\n'
                        f'topics = ["{topic}"]\nkind = "count"\nkey = ["page"]\n')
    group = f"g{os.urandom(4).hex()}"
    settings = _settings(kafka_settings, cassandra_settings, group, counters, "http://127.0.0.1:9/apis/ccompat/v7")
    service = ConsumerService(settings, load_definitions(counters))
    await service.start()
    runner = asyncio.create_task(service.run())
    try:
        deadline = time.monotonic() + 60
        while service.schema_wait is None:
            assert time.monotonic() < deadline, "the consumer never waited for the registry"
            await asyncio.sleep(0.2)
        asked = time.monotonic()
        service.request_stop()
        await asyncio.wait_for(runner, 10)
        assert time.monotonic() - asked < 5
    finally:
        service.request_stop()
        await service.stop()


async def test_a_registry_refusing_the_credentials_ends_the_consumer_with_one_line(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any, tmp_path: Path,
) -> None:
    """A registry (or a proxy before it) answering 401 to a schema look-up: no retry fixes the credentials, so
    the consumer stops at once, exit 1 (as for a refused Kafka login), with one line naming the settings to
    check and not what the registry answered (it may echo the password). Nothing of the batch is counted nor
    dead-lettered."""
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error_code": 401, "message": "Unauthorized: " + request.headers.get(
            "Authorization", "")}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{rest:.*}", refuse)
    refusing = TestServer(app, host="127.0.0.1")
    await refusing.start_server()
    port = refusing.port
    try:
        topic = await topic_factory("avro", partitions=1)
        await publish(kafka_settings, topic, [frame(1, b"\x02a\x02")])
        counters = _views_by_page(tmp_path, topic)
        group = f"g{os.urandom(4).hex()}"
        settings = _settings(kafka_settings, cassandra_settings, group, counters, f"http://127.0.0.1:{port}")
        settings = settings.model_copy(update={"schema_registry": settings.schema_registry.model_copy(update={
            "username": "reader", "password": SecretStr("not-the-password"), "allow_insecure": True})})
        with capture_logs() as logs:
            code = await asyncio.wait_for(consume(settings, load_definitions(counters)), 120)
    finally:
        await refusing.close()
    assert code == 1
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert [(e["event"], e["error"]) for e in errors] == [("schema_registry_refused", (
        f"schema registry http://127.0.0.1:{port} refused the credentials (401) to read schema id 1: check "
        "COUNTERSINK_SCHEMA_REGISTRY__USERNAME and __PASSWORD, and what that user may do"))]
    assert "not-the-password" not in repr(logs)
    assert await _values(cassandra_settings, {"views_by_page": {"a": 0}}) == {"views_by_page": {"a": None}}
    assert await read_topic(kafka_settings, f"dlq-{group}", 1, within_s=5) == []


def _documented_example() -> dict[str, list[str]]:
    """The fenced blocks of docs/counters.md's Avro example, by their info string, in page order."""
    section = COUNTERS_PAGE.read_text().split("#### Example: an Avro topic through the registry", 1)[1]
    section = section.split("\n### ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for kind, body in re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL):
        blocks.setdefault(kind, []).append(body)
    return blocks


def _spawn(argv: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (folder / "consumer.log").open("ab") as log:
        return subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=log)


async def test_the_documented_avro_example(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, schema_registry_url: str, tmp_path: Path,
) -> None:
    """docs/counters.md's Avro example, command by command through the CLI (topics create, publish v1 and v2
    with their schemas registered, consume), prints the values the page shows."""
    blocks = _documented_example()
    topic = f"page_views_{uuid.uuid4().hex[:8]}"
    (tmp_path / "view.avsc").write_text(blocks["avsc"][0])
    (tmp_path / "view_v2.avsc").write_text(blocks["avsc"][1])
    (tmp_path / "counters.toml").write_text(blocks["toml"][0].replace("page_views", topic))
    (tmp_path / "v1.jsonl").write_text(blocks["jsonl"][0])
    (tmp_path / "v2.jsonl").write_text(blocks["jsonl"][1])
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": 0, "group_id": topic,
                                                                  "dead_letter_topic": f"dlq-{topic}"})
    env["PYTHONPATH"] = str(REPO)
    steps: list[tuple[str, list[str]]] = []
    assert blocks["console"] == [doc_block("docs/counters.md", "avro-example")]
    for line in blocks["console"][0].splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].replace("page_views", topic), []))
        elif line.strip():
            steps[-1][1].append(line)
    consumer: subprocess.Popen[bytes] | None = None
    checked = 0
    try:
        for command, expected in steps:
            words = shlex.split(command)
            if words[0] == "export":
                name = words[1].partition("=")[0]
                assert name == "COUNTERSINK_SCHEMA_REGISTRY__URL"
                env[name] = schema_registry_url  # the test session's registry, in place of the stack's
                continue
            assert words[0] == "countersink"
            argv = [sys.executable, "-m", "countersink.cli", *words[1:]]
            if words[1] == "consume":
                consumer = _spawn(argv, tmp_path, env)
                continue
            deadline = time.monotonic() + 90
            while True:
                done = await asyncio.to_thread(subprocess.run, argv, cwd=tmp_path, env=env, capture_output=True,
                                               text=True, timeout=60)
                shown = done.stdout.strip().splitlines()
                if words[1] != "get" or shown == expected:
                    break
                assert consumer is not None
                assert consumer.poll() is None, (tmp_path / "consumer.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{command}: {done.stdout}{done.stderr}"
                await asyncio.sleep(1)
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
            checked += bool(expected)
    finally:
        if consumer is not None:
            consumer.send_signal(signal.SIGTERM)
            consumer.wait(60)
        await _delete_topics(kafka_settings, topic)
    assert checked == 3


async def test_avro_and_protobuf_with_evolution_stay_exact_under_kill_9(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    schema_registry_url: str, tmp_path: Path,
) -> None:
    """A consumer process reading Avro and Protobuf topics (v1 and v2 writer schemas mixed), killed with
    SIGKILL at random moments and started again each time, ends with every counter equal to the truth."""
    avro_topic, proto_topic = await topic_factory("avro", partitions=3), await topic_factory("proto", partitions=3)
    view_ids, purchase_ids = await _register_evolving_schemas(schema_registry_url, avro_topic, proto_topic)
    views, purchases, expected = _avro_and_protobuf_events(3000, view_ids, purchase_ids, seed=17)
    (tmp_path / "view_v2.avsc").write_text(json.dumps(VIEW_V2))
    counters = tmp_path / "counters.toml"
    counters.write_text(AVRO_AND_PROTOBUF_COUNTERS.replace("{avro}", avro_topic).replace("{proto}", proto_topic))
    group = f"g{os.urandom(4).hex()}"
    env = child_env(kafka_settings, cassandra_settings, schema_registry={"url": schema_registry_url},
                    consumer={"health_port": 0, "group_id": group, "counters_file": counters,
                              "dead_letter_topic": f"dlq-{group}", "flush_interval_s": 0.2,
                              "session_timeout_ms": 6000})
    log = tmp_path / "consumer.log"
    rng = random.Random(13)

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen([sys.executable, "-m", "consumer"], cwd=REPO, env=env, stdout=out, stderr=out)

    process = start()
    kills = 0
    try:
        for at in range(0, 3000, 500):
            await publish(kafka_settings, avro_topic, views[at:at + 500])
            await publish(kafka_settings, proto_topic, purchases[at:at + 500])
            await asyncio.sleep(rng.uniform(0.5, 3.0))  # a random point of consuming, loading schemas or flushing
            process.kill()
            process.wait(timeout=30)
            kills += 1
            process = start()
        await wait_until_flushed(cassandra_settings, group, await end_offsets(
            kafka_settings, {avro_topic: 3, proto_topic: 3}), within_s=180)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert kills == 6
    assert await _values(cassandra_settings, expected) == expected, log.read_text()[-3000:]


def test_the_stack_starts_and_stops_the_registry(tmp_path: Path) -> None:
    """``python -m stack up --only schema-registry`` starts a registry that answers; ``down`` stops it."""
    env = {**os.environ, "COUNTERSINK_STACK_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    up = subprocess.run([sys.executable, "-m", "stack", "up", "--only", "schema-registry", "--schema-registry-port",
                         "18484"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    url = "http://127.0.0.1:18484/apis/ccompat/v7"
    try:
        assert up.returncode == 0, up.stderr
        assert f"schema registry ready on {url}" in up.stdout
        assert servers.schema_registry_answers(url)
    finally:
        down = subprocess.run([sys.executable, "-m", "stack", "down"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    assert down.stdout.startswith("stopped: schema-registry (pid ")
    assert not servers.schema_registry_answers(url)


async def test_a_registry_over_tls_is_trusted_only_with_its_authority(tmp_path: Path) -> None:
    """A registry serving HTTPS only answers a client that trusts its CA (register, then the schema by id);
    a client trusting another CA gets no answer it would use: the registry is unavailable to it (a wait)."""
    from stack.secure import make_certificates

    certs = make_certificates(tmp_path / "certs")
    registry = servers.SchemaRegistryServer(port=18485, root=tmp_path / "registry", tls_cert=certs.server_cert,
                                            tls_key=certs.server_key, ca_file=certs.ca_cert)
    try:
        await asyncio.to_thread(registry.start)
        assert registry.url.startswith("https://")
        trusted = SchemaRegistrySettings(url=registry.url, ca_file=certs.ca_cert)
        async with SchemaRegistryClient(trusted) as client:
            schema_id = await client.register("tls-value", "AVRO", json.dumps(VIEW_V1))
            assert await client.schema_by_id(schema_id) == ("AVRO", json.dumps(VIEW_V1))
        untrusted = SchemaRegistrySettings(url=registry.url, ca_file=certs.other_ca_cert)
        async with SchemaRegistryClient(untrusted) as client:
            with pytest.raises(SchemaRegistryUnavailableError, match="cannot be reached"):
                await client.schema_by_id(schema_id)
        plain = SchemaRegistrySettings(url=registry.url.replace("https://", "http://"))
        async with SchemaRegistryClient(plain) as client:
            with pytest.raises(SchemaRegistryUnavailableError):
                await client.schema_by_id(schema_id)
    finally:
        await asyncio.to_thread(registry.stop)


async def test_the_formats_quickstart(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, schema_registry_url: str, tmp_path: Path,
) -> None:
    """docs/counters.md's quickstart of the three formats, run as written (its topics renamed for this test,
    its registry the session's), prints the values it states."""
    block = doc_block("docs/counters.md", "formats-quickstart")
    prefix = f"formats{uuid.uuid4().hex[:8]}-"
    example = tmp_path / "examples" / "formats"
    example.mkdir(parents=True)
    for source in (REPO / "examples" / "formats").iterdir():
        (example / source.name).write_text(source.read_text().replace("formats-", prefix))
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": 0, "group_id": prefix,
                                                                  "dead_letter_topic": f"{prefix}dlq"})
    env["PYTHONPATH"] = str(REPO)
    consumer: subprocess.Popen[bytes] | None = None
    checked = 0
    try:
        for line in block.replace("formats-", prefix).splitlines():
            command, _, comment = line.partition("   # prints: ")
            words = shlex.split(command)
            if words[0] == "export":
                env["COUNTERSINK_SCHEMA_REGISTRY__URL"] = schema_registry_url
                continue
            if words[0] == "kill":
                continue
            assert words[0] == ".venv/bin/countersink", line
            argv = [sys.executable, "-m", "countersink.cli", *[w for w in words[1:] if w not in ("2>", "consumer.log",
                                                                                              "&")]]
            if words[1] == "consume":
                consumer = _spawn(argv, tmp_path, env)
                continue
            deadline = time.monotonic() + 90
            while True:
                done = await asyncio.to_thread(subprocess.run, argv, cwd=tmp_path, env=env, capture_output=True,
                                               text=True, timeout=60)
                if not comment or done.stdout.strip() == comment.strip():
                    break
                assert consumer is not None
                assert consumer.poll() is None, (tmp_path / "consumer.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{command}: {done.stdout}{done.stderr}"
                await asyncio.sleep(1)
            assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
            checked += bool(comment)
    finally:
        if consumer is not None:
            consumer.send_signal(signal.SIGTERM)
            assert consumer.wait(60) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        await _delete_topics(kafka_settings, prefix)
    assert checked == 3


async def _delete_topics(kafka: KafkaSettings, prefix: str) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        if mine := [topic for topic in await admin.list_topics() if topic.startswith(prefix)]:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


async def test_publish_refuses_a_line_its_schema_cannot_hold(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    schema_registry_url: str, tmp_path: Path,
) -> None:
    """``publish --format avro`` stops with exit 2 at the first line the schema cannot hold, naming it, after
    sending the lines before it; ``--format`` without ``--schema`` is refused before anything is sent."""
    topic = await topic_factory("avro", partitions=1)
    (tmp_path / "view.avsc").write_text(json.dumps(VIEW_V1))
    # 1.5 for a long: fastavro's writer would write 1 (the value changed in silence); refused by type.
    (tmp_path / "views.jsonl").write_text('{"page": "/a", "n": 1}\n{"page": "/b", "n": 1.5}\n'
                                          '{"page": "/c", "n": 3}\n')
    env = child_env(kafka_settings, cassandra_settings, schema_registry={"url": schema_registry_url})
    env["PYTHONPATH"] = str(REPO)
    base = [sys.executable, "-m", "countersink.cli", "publish", topic, "views.jsonl"]
    refused = await asyncio.to_thread(subprocess.run, [*base, "--format", "avro", "--schema", "view.avsc"],
                                      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "line_refused" in refused.stderr
    assert '"line": 2' in refused.stderr or "line=2" in refused.stderr, refused.stderr
    assert "View.n: float where the schema has long" in refused.stderr
    sent = await read_topic(kafka_settings, topic, 1, then_s=1.0)
    assert len(sent) == 1  # the first line, in the wire format, readable with the schema it registered
    assert compile_avro(json.dumps(VIEW_V1))(sent[0].value[5:]) == {"page": "/a", "n": 1}
    assert sent[0].value[0] == 0
    no_schema = await asyncio.to_thread(subprocess.run, [*base, "--format", "protobuf"], cwd=tmp_path, env=env,
                                        capture_output=True, text=True, timeout=60)
    assert no_schema.returncode == 2
    assert "needs --schema FILE" in no_schema.stderr
    # A registry that does not answer is a server away: exit 1, as the exit codes' table says (it was 2).
    away = {**env, "COUNTERSINK_SCHEMA_REGISTRY__URL": "http://127.0.0.1:9/apis/ccompat/v7"}
    unreachable = await asyncio.to_thread(subprocess.run, [*base, "--format", "avro", "--schema", "view.avsc"],
                                          cwd=tmp_path, env=away, capture_output=True, text=True, timeout=120)
    assert unreachable.returncode == 1, unreachable.stderr
    assert "schema_registry_unavailable" in unreachable.stderr


async def test_publish_writes_avro_decimals_from_json_lines(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
    schema_registry_url: str, tmp_path: Path,
) -> None:
    """``publish --format avro`` writes a decimal field from a JSON text or number (it could not: fastavro takes
    only a ``Decimal``), each record the exact decimal of its line at the schema's scale."""
    topic = await topic_factory("avrodecimal", partitions=1)
    schema = {"type": "record", "name": "Sale", "namespace": "shop", "fields": [
        {"name": "sku", "type": "string"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 2}}]}
    (tmp_path / "sale.avsc").write_text(json.dumps(schema))
    (tmp_path / "sales.jsonl").write_text('{"sku": "a", "price": "12.5"}\n{"sku": "a", "price": 0.1}\n'
                                          '{"sku": "b", "price": 123456789012345678901234567}\n')
    env = child_env(kafka_settings, cassandra_settings, schema_registry={"url": schema_registry_url})
    env["PYTHONPATH"] = str(REPO)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "publish", topic, "sales.jsonl", "--format", "avro",
                         "--schema", "sale.avsc", "--key", "sku"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sent = await read_topic(kafka_settings, topic, 3, then_s=1.0)
    decode = compile_avro(json.dumps(schema))
    assert [decode(record.value[5:])["price"] for record in sent] == [
        Decimal("12.50"), Decimal("0.10"), Decimal("123456789012345678901234567.00")]


async def test_inline_schemas_count_exactly_without_a_registry(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any, tmp_path: Path,
) -> None:
    """With schemas from files (the inline mode), Avro and Protobuf topics are counted exactly on real Kafka and
    Cassandra with no registry setting at all; the schema ids in the records are not looked up."""
    avro_topic, proto_topic = await topic_factory("avro", partitions=2), await topic_factory("proto", partitions=2)
    # Ids 7 and 8 tell v1 and v2 page views apart here only: the consumer reads every record with the file's v2
    # schema, so they are re-encoded with it (a v1 view's user as its default) under one id.
    views, purchases, expected = _avro_and_protobuf_events(800, [7, 8], [9, 9], seed=23)
    (tmp_path / "view.avsc").write_text(json.dumps(VIEW_V2))
    (tmp_path / "purchase.proto").write_text(PURCHASE_V2)
    encode_v2 = avro_encoder(json.dumps(VIEW_V2))
    await publish(kafka_settings, avro_topic, [frame(7, encode_v2(event)) for event in _views_as_v2(views)])
    await publish(kafka_settings, proto_topic, purchases)
    counters = tmp_path / "counters.toml"
    counters.write_text(AVRO_AND_PROTOBUF_COUNTERS.replace("{avro}", avro_topic).replace("{proto}", proto_topic)
                        .replace('reader_schema_file = "view_v2.avsc"', 'schema_file = "view.avsc"')
                        .replace('format = "protobuf"', 'format = "protobuf"\nschema_file = "purchase.proto"\n'
                                                        'message = "shop.Purchase"'))
    group = f"g{os.urandom(4).hex()}"
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        session_timeout_ms=6000, health_port=0))
    assert settings.schema_registry.url is None
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {avro_topic: 2,
                                                                                               proto_topic: 2}))
    assert await _values(cassandra_settings, expected) == expected


def _views_as_v2(views: list[bytes]) -> list[dict[str, Any]]:
    """The page views back as v2 dicts (each read with its own writer schema: id 7 is v1, 8 is v2)."""
    from schemas.formats import split_header

    decode = [compile_avro(json.dumps(VIEW_V1), json.dumps(VIEW_V2)), compile_avro(json.dumps(VIEW_V2))]
    return [decode[split_header(raw)[0] - 7](raw[5:]) for raw in views]


async def test_a_large_schema_is_read_whole_from_the_registry(schema_registry_url: str) -> None:
    """An answer over 64 KiB comes in chunks: it was read up to what had come (65,216 bytes of a 140 KB schema,
    its JSON unreadable), taken for a registry away, and the consumer waited for ever. It is read whole; a schema
    past max_schema_bytes is a SchemaError (the records naming it are dead letters), not a wait."""
    from countersink.schema_registry import SchemaError

    fields = [{"name": f"f{i}", "type": ["null", "string"], "default": None, "doc": "d" * 80} for i in range(1200)]
    text = json.dumps({"type": "record", "name": f"Wide{uuid.uuid4().hex[:8]}", "fields": fields})
    assert len(text) > 140_000
    subject = f"wide-{uuid.uuid4().hex[:8]}-value"
    async with SchemaRegistryClient(SchemaRegistrySettings(url=schema_registry_url)) as client:
        schema_id = await client.register(subject, "AVRO", text)
        found = await client.schema_by_id(schema_id)
    assert found is not None
    assert json.loads(found[1]) == json.loads(text)
    async with SchemaRegistryClient(SchemaRegistrySettings(url=schema_registry_url, max_schema_bytes=50_000)) as small:
        with pytest.raises(SchemaError, match="larger than 50000 bytes"):
            await small.schema_by_id(schema_id)


async def test_a_burst_of_unknown_schema_ids_is_looked_up_several_at_once(schema_registry_url: str) -> None:
    """A batch naming hundreds of ids the cache lacks (a producer writing random ids: each record a dead letter)
    was looked up one id after the other, a round trip each, holding every topic of the process (about 750
    records a second). The ids go to the registry several at once (at most ``_LOOKUPS_AT_ONCE``); every id
    ends cached, the known one compiled, the others unknown."""
    from countersink import schema_registry
    from schemas.definitions import parse_definitions
    from schemas.formats import UnknownSchemaError, WriterSchema

    topic = f"burst-{uuid.uuid4().hex[:8]}"
    counters = parse_definitions(f"""
[[topic]]
name = "{topic}"
format = "avro"

[[counter]]
name = "views"
topics = ["{topic}"]
kind = "count"
key = ["page"]
""")
    settings = SchemaRegistrySettings(url=schema_registry_url)
    async with SchemaRegistryClient(settings) as client:
        known = await client.register(f"{topic}-value", "AVRO", json.dumps(VIEW_V1))
    unknown = random.Random(5).sample(range(10_000_000, 20_000_000), 300)
    values = [frame(schema_id, b"\x02a") for schema_id in [*unknown, known]]
    loader = schema_registry.SchemaLoader(settings, counters, schema_registry.schema_cache(settings))
    lookup, in_flight, most = loader._client.schema_by_id, 0, 0  # type: ignore[union-attr]

    async def counted(schema_id: int) -> tuple[str, str] | None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            return await lookup(schema_id)
        finally:
            in_flight -= 1

    loader._client.schema_by_id = counted  # type: ignore[method-assign,union-attr]
    try:
        await loader.load(topic, values)
    finally:
        await loader.stop()
    assert most == schema_registry._LOOKUPS_AT_ONCE, most
    assert isinstance(loader.cache.get(topic, known), WriterSchema)
    assert all(isinstance(loader.cache.get(topic, schema_id), UnknownSchemaError) for schema_id in unknown)
    assert loader.cache.missing(topic, [*unknown, known]) == []
