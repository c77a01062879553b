"""``countersink trace`` on real Kafka and Cassandra: a counted, a retried, a filtered and a dead-lettered
record, found by offset and by event id, each as the consumer decided it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient
from countersink.commands.trace import TraceQuery
from countersink.commands.trace import trace as trace_records
from countersink.kafka import make_producer
from countersink.registry import CounterRegistry
from countersink.resets import reset_counter
from countersink.schema_registry import SchemaRegistryClient
from countersink.serve import ReadApi
from countersink.settings import (
    CassandraSettings,
    Consistency,
    ConsumerSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    ServeSettings,
    Settings,
)
from schemas.definitions import load_definitions
from schemas.formats import ProtoSchema, avro_encoder, frame
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import create_again, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = """
[[counter]]
name = "bought"
topics = ["{topic}"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "trade_id"
where = {{ side = "buy" }}

[[counter]]
name = "trades"
topics = ["{topic}"]
kind = "count"
key = "symbol"
event_id = "trade_id"
"""
EVENTS = [  # offset: what it is
    {"trade_id": "t1", "symbol": "IBM", "side": "buy", "qty": 100},  # 0: counted by both
    {"trade_id": "t1", "symbol": "IBM", "side": "buy", "qty": 100},  # 1: a publisher's retry of 0
    {"trade_id": "t2", "symbol": "IBM", "side": "sell", "qty": 40},  # 2: filtered by bought, counted by trades
    {"trade_id": "t3", "symbol": "IBM", "side": "buy", "qty": "x"},  # 3: refused by bought, counted by trades
    {"trade_id": "t4", "symbol": "MSFT", "side": "buy", "qty": 5},   # 4: counted by both
]


def _trace(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str) -> subprocess.CompletedProcess[str]:
    dead_letters = os.environ.get("TRACE_TEST_DLQ", "countersink-dead-letter")
    return subprocess.run([sys.executable, "-m", "countersink.cli", "trace", *args], cwd=REPO,
                          env=child_env(kafka, cassandra, consumer={"dead_letter_topic": dead_letters}),
                          capture_output=True, text=True, timeout=120)


async def _traced(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str) -> list[dict[str, Any]]:
    done = await asyncio.to_thread(_trace, kafka, cassandra, "--json", *args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _by_counter(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["counter"]: entry for entry in record["counters"]}


async def test_trace_tells_counted_retried_filtered_and_dead_lettered_records_apart(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each record's trace says what the consumer did with it in each counter: counted into its instance and
    in the value (the partition flushed through its offset), dropped as a retry of offset 0, filtered by
    ``where``, dead-lettered with the field, the reason and where the dead-letter topic holds it;
    ``--event-id`` finds the original and its retry."""
    topic = await topic_factory(partitions=2)
    group = f"t{os.urandom(4).hex()}"
    monkeypatch.setenv("TRACE_TEST_DLQ", f"dlq-{group}")
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.format(topic=topic))
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        for event in EVENTS:  # keyed by symbol: IBM's records in one partition, in this order
            await producer.send_and_wait(topic, json.dumps(event).encode(), key=event["symbol"].encode())
    finally:
        await producer.stop()
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        health_port=0))
    async with running(ConsumerService(settings, load_definitions(counters))):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))

    found = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--event-id", "t1", "--key", "IBM")
    assert [record["offset"] for record in found] == [0, 1]
    ibm = found[0]["partition"]
    assert found[0]["message_key"] == "IBM"

    original = _by_counter(found[0])
    assert original["bought"]["outcome"] == "counted"
    assert original["bought"]["key"] == "IBM"
    assert original["bought"]["in_value"] is True
    assert original["bought"]["flushed_through"] >= 0
    assert original["bought"]["group"] == group
    assert original["bought"]["value_now"] == 100
    (mutator, through), *_ = original["bought"]["shards"]  # the shard of the mutator that applied it
    assert through >= 0
    assert mutator == original["trades"]["shards"][0][0]
    assert original["trades"]["value_now"] == 3  # t1, t2 and t3 (refused by bought only)

    retry = _by_counter(found[1])
    assert {retry[c]["outcome"] for c in retry} == {"dropped_as_retry"}
    assert {retry[c]["retry_of"] for c in retry} == {0}

    (filtered,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", f"{ibm}:2")
    assert _by_counter(filtered)["bought"]["outcome"] == "filtered"
    assert _by_counter(filtered)["bought"]["reason"] == "where side in ['buy']"
    assert _by_counter(filtered)["trades"]["outcome"] == "counted"

    (dead,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", f"{ibm}:3")
    assert _by_counter(dead)["bought"]["outcome"] == "dead_lettered"
    assert _by_counter(dead)["bought"]["reason"].startswith("WrongTypeError at qty: expected an integer")
    assert _by_counter(dead)["trades"]["outcome"] == "counted"  # each counter decides for itself
    assert _by_counter(dead)["bought"]["dead_letter"].startswith(f"dlq-{group}/")  # where the consumer sent it

    person = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic,
                                     "--offset", f"{ibm}:1")
    assert person.returncode == 0, person.stderr
    assert "dropped as a retry of offset 0" in person.stdout

    missing = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--event-id", "t9")
    assert missing.returncode == 1
    assert "no record with event id 't9'" in missing.stdout
    bounded = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--event-id",
                                      "t1", "--key", "IBM", "--scan", "2")
    assert bounded.returncode == 1  # only offsets 2 and 3 are searched
    assert "(the last 2; a larger scan searches further)" in bounded.stdout
    beyond = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--offset",
                                     f"{ibm}:99")
    assert beyond.returncode == 1
    assert "not written yet" in beyond.stdout

    # Over HTTP, behind the read API's bearer tokens: the same trace as the command line's --json.
    token = secrets.token_urlsafe(24)
    async with CassandraClient(cassandra_settings) as client:
        api = ReadApi(client, ServeSettings(tokens=SecretStr(token)), registry=CounterRegistry(client),
                      tracing=settings)
        async with TestClient(TestServer(api.app())) as http:
            refused = await http.get(f"/trace/{topic}", params={"event_id": "t1", "key": "IBM"})
            assert refused.status == 401
            auth = {"Authorization": f"Bearer {token}"}
            answer = await http.get(f"/trace/{topic}", params={"event_id": "t1", "key": "IBM"}, headers=auth)
            assert answer.status == 200, await answer.text()
            body = await answer.json()
            assert [record["offset"] for record in body["records"]] == [0, 1]
            assert body["records"] == found
            bad = await http.get(f"/trace/{topic}", params={"offset": "x"}, headers=auth)
            assert bad.status == 400
            for params in ({"event_id": "t1", "scan": "\u00b2"}, {"event_id": "t1", "scan": "\u0663"},
                           {"offset": "\u0660:\u0660"}):  # digits of other scripts: 400 (a superscript was a 500)
                odd = await http.get(f"/trace/{topic}", params=params, headers=auth)
                assert odd.status == 400, (params, await odd.text())
            unknown = await http.get("/trace/no-such-topic", params={"offset": "0:0"}, headers=auth)
            assert unknown.status == 404
            spec = await (await http.get("/openapi.json", headers=auth)).json()
            assert "/trace/{topic}" in spec["paths"]
        # Kafka away: 503 with Retry-After, as for a registry away (it was a 500, its consumer left unclosed).
        away = settings.model_copy(update={"kafka": kafka_settings.model_copy(update={
            "bootstrap_servers": ["127.0.0.1:1"], "request_timeout_ms": 2000})})
        api = ReadApi(client, ServeSettings(tokens=SecretStr(token)), registry=CounterRegistry(client), tracing=away)
        async with TestClient(TestServer(api.app())) as http:
            unreachable = await http.get(f"/trace/{topic}", params={"offset": "0:0"},
                                         headers={"Authorization": f"Bearer {token}"})
            assert unreachable.status == 503, await unreachable.text()
            assert unreachable.headers["Retry-After"] == "2"
            assert "cannot reach Kafka at 127.0.0.1:1" in (await unreachable.json())["detail"]

    # The topic deleted and created again: a record at an offset the old topic was counted through was never
    # counted, and trace cannot tell; it says why instead of tracing the new topic by the old one's rows.
    await create_again(kafka_settings, topic, 2)
    await publish(kafka_settings, topic, [json.dumps(event).encode() for event in EVENTS])
    again = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    assert again.returncode == 2, again.stdout
    assert f"topic {topic!r} is now another topic" in again.stderr


ADDED_LATER = """
[[counter]]
name = "added"
topics = ["{topic}"]
kind = "count"
key = "symbol"
"""


async def test_trace_of_a_record_before_a_counter_was_added_says_it_is_not_in_the_value(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path) -> None:
    """A counter added to a running group counts from where its consumers are when they start with it: a record
    before that is in no value of it, though the mutator that counts it now wrote its instance from the same
    partition through a later offset (each mutator records where it started, and trace reads it)."""
    topic = await topic_factory(partitions=1)
    group = f"t{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    trades = DEFINITIONS.format(topic=topic)
    for definitions, events in ((trades, EVENTS[:1]), (trades + ADDED_LATER.format(topic=topic), EVENTS[4:])):
        await publish(kafka_settings, topic, [json.dumps({**event, "symbol": "IBM"}).encode() for event in events])
        counters.write_text(definitions)
        settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
            group_id=group, counters_file=counters, flush_interval_s=0.3, health_port=0))
        async with running(ConsumerService(settings, load_definitions(counters))):
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))

    (before,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    assert _by_counter(before)["trades"]["in_value"] is True
    added = _by_counter(before)["added"]
    assert added["outcome"] == "counted"  # its definition counts it...
    assert (added["in_value"], added["held"], added["shards"]) == (False, False, [])  # ...but none did
    assert added["value_now"] == 1
    (after,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:1")
    assert _by_counter(after)["added"]["in_value"] is True
    assert _by_counter(after)["added"]["shards"][0][1] == 1
    person = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    assert "its definition counts it into 'IBM'; not in the value" in person.stdout, person.stdout

    # The GC folds both mutators' shards into the instance's tally: the record stays out of the value, since the
    # mutator that applied it recorded that it did not count the counter (it was reported held by the tally).
    gc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "gc", "--once"],
                                 cwd=REPO, env=child_env(kafka_settings, cassandra_settings, gc={"grace_s": 0}),
                                 capture_output=True, text=True, timeout=120)
    assert gc.returncode == 0, gc.stderr
    (folded,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    added = _by_counter(folded)["added"]
    assert added["in_tally"] is True, added  # what the GC made of the shards
    assert added["in_value"] is False, added
    assert (added["in_value"], added["applier_counts"], added["value_now"]) == (False, False, 1), added
    assert _by_counter(folded)["trades"]["in_value"] is True
    (later,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:1")
    assert (_by_counter(later)["added"]["in_value"], _by_counter(later)["added"]["applier_counts"]) == (True, True)
    assert _by_counter(later)["added"]["applied_by"] != added["applied_by"]  # the second consumer's mutator
    person = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    assert "which applied it, did not count this counter" in person.stdout, person.stdout


async def test_trace_of_a_record_before_a_reset_says_the_value_counts_from_the_reset(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path) -> None:
    """A record counted before a reset of its instance is in the earlier epoch's cell, not in the value, though
    the mutator that went on past the reset wrote the current epoch's shard through a later offset; a record
    after the reset's control record is in the value."""
    topic = await topic_factory(partitions=1)
    group = f"t{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.format(topic=topic))
    definitions = load_definitions(counters)
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, flush_interval_s=0.3, health_port=0))
    async with running(ConsumerService(settings, definitions)):
        await publish(kafka_settings, topic, [json.dumps(EVENTS[0]).encode()])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
        async with CassandraClient(cassandra_settings) as client:
            done = await reset_counter(client, kafka_settings, definitions["trades"], [], "trace-test",
                                       Consistency.QUORUM, Consistency.QUORUM)
        await publish(kafka_settings, topic, [json.dumps(EVENTS[4]).encode(),
                                              json.dumps({**EVENTS[4], "symbol": "IBM", "trade_id": "t5"}).encode()])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))

    (before,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    trades = _by_counter(before)["trades"]
    assert (trades["outcome"], trades["in_value"], trades["shards"]) == ("counted", False, [])
    assert (trades["reset"], trades["reset_offset"]) == (done.reset.reset_id, 1)  # the control record: offset 1
    assert trades["value_now"] == 1  # the IBM trade after the reset
    assert _by_counter(before)["bought"]["in_value"] is True  # not reset
    (after,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:3")
    assert _by_counter(after)["trades"]["in_value"] is True
    assert _by_counter(after)["trades"]["reset"] is None
    (control,) = await _traced(kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:1")
    assert {c["outcome"] for c in control["counters"]} == {"control_record"}, control  # no event: counted nowhere
    assert done.reset.reset_id in _by_counter(control)["trades"]["reason"]
    person = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", topic, "--offset", "0:0")
    assert f"but the value counts from reset {done.reset.reset_id}, whose control record is at offset 1" in (
        person.stdout), person.stdout


FORMAT_DEFINITIONS = """
[[topic]]
name = "{avro}"
format = "avro"

[[topic]]
name = "{proto}"
format = "protobuf"

[[counter]]
name = "views_by_page"
topics = ["{avro}"]
kind = "sum"
key = ["page"]
value = "n"
event_id = "id"

[[counter]]
name = "amount_by_sku"
topics = ["{proto}"]
kind = "sum"
key = ["sku"]
value = "amount"
"""
VIEW = {"type": "record", "name": "View", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"}, {"name": "page", "type": "string"}, {"name": "n", "type": "long"}]}
PURCHASE = """syntax = "proto3";
package shop;
message Purchase {
  string sku = 1;
  int64 amount = 2;
}
"""


async def test_trace_decodes_avro_and_protobuf_records_as_the_consumer_does(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
        schema_registry_url: str, tmp_path: Path) -> None:
    """Records of an Avro and a Protobuf topic, their writer schemas in a real registry, are traced as counted
    into their instance (by offset, and by an event id read from the Avro record), a retry as a retry, and a
    record naming a schema id the registry does not know as dead-lettered for that reason: not as
    unparseable JSON."""
    avro, proto = await topic_factory("avro", partitions=1), await topic_factory("proto", partitions=1)
    async with SchemaRegistryClient(SchemaRegistrySettings(url=schema_registry_url)) as registry:
        view_id = await registry.register(f"{avro}-value", "AVRO", json.dumps(VIEW))
        purchase_id = await registry.register(f"{proto}-value", "PROTOBUF", PURCHASE)
    encode_view = avro_encoder(json.dumps(VIEW))
    schema = ProtoSchema(PURCHASE)
    encode_purchase = schema.encoder(schema.indexes_of("shop.Purchase"))
    views = [frame(view_id, encode_view({"id": f"v{i}", "page": f"/p{i % 2}", "n": i + 1})) for i in range(4)]
    views.append(views[2])  # offset 4: a publisher's retry of offset 2
    views.append(frame(987_654, encode_view({"id": "lost", "page": "/p0", "n": 1})))  # 5: an id nobody knows
    await publish(kafka_settings, avro, views)
    await publish(kafka_settings, proto, [frame(purchase_id, encode_purchase({"sku": "A1", "amount": 7}), (0,)),
                                          frame(purchase_id, encode_purchase({"sku": "B2", "amount": 5}), (0,))])
    group = f"t{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(FORMAT_DEFINITIONS.replace("{avro}", avro).replace("{proto}", proto))
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings,
                        schema_registry=SchemaRegistrySettings(url=schema_registry_url),
                        consumer=ConsumerSettings(group_id=group, counters_file=counters,
                                                  dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
                                                  health_port=0))
    definitions = load_definitions(counters)
    async with running(ConsumerService(settings, definitions)):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {avro: 1, proto: 1}))

    async with CassandraClient(cassandra_settings) as client:
        async def traced(topic: str, **query: Any) -> list[Any]:
            result = await trace_records(client, settings, TraceQuery(topic, **query), definitions)
            return [{t.counter: t for t in record.counters} for record in result.records]

        (view,) = await traced(avro, offset=(0, 1))
        assert (view["views_by_page"].outcome, view["views_by_page"].key) == ("counted", "/p1")
        assert view["views_by_page"].in_value is True
        (purchase,) = await traced(proto, offset=(0, 1))
        assert (purchase["amount_by_sku"].outcome, purchase["amount_by_sku"].key) == ("counted", "B2")
        assert purchase["amount_by_sku"].value_now == 5
        original, retry = await traced(avro, event_id="v2")
        assert original["views_by_page"].outcome == "counted"
        assert (retry["views_by_page"].outcome, retry["views_by_page"].retry_of) == ("dropped_as_retry", 2)
        (lost,) = await traced(avro, offset=(0, 5))
        assert lost["views_by_page"].outcome == "dead_lettered"
        assert "UnknownSchemaError" in (lost["views_by_page"].reason or ""), lost

        # serve's trace with a registry that refuses its credentials: 503 naming the registry and what to check
        # (it was a 500), never the registry's words.
        async def refuse(request: web.Request) -> web.Response:
            return web.json_response({"message": "Unauthorized: " + request.headers.get("Authorization", "")},
                                     status=401)

        app = web.Application()
        app.router.add_route("*", "/{rest:.*}", refuse)
        refusing = TestServer(app)
        await refusing.start_server()
        try:
            refused = settings.model_copy(update={"schema_registry": SchemaRegistrySettings(
                url=str(refusing.make_url("")).rstrip("/"), username="reader", password=SecretStr("not-it"),
                allow_insecure=True)})
            token = secrets.token_urlsafe(24)
            api = ReadApi(client, ServeSettings(tokens=SecretStr(token)), registry=CounterRegistry(client),
                          tracing=refused)
            async with TestClient(TestServer(api.app())) as http:
                answer = await http.get(f"/trace/{avro}", params={"offset": "0:1"},
                                        headers={"Authorization": f"Bearer {token}"})
                detail = (await answer.json())["detail"]
        finally:
            await refusing.close()
        assert answer.status == 503, detail
        assert detail.startswith("serve cannot read the schema registry: schema registry http://127.0.0.1:"), detail
        assert "refused the credentials (401) to read schema id" in detail
        assert "not-it" not in detail
