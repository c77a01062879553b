"""A topic of several event types on real Kafka and Cassandra: each counter decides for itself, dead letters
name the counters that refused them, a re-published dead letter is counted by those alone, and counters keyed
by the record's key and bucketed by its time count exactly."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.produce import ProduceRequest
from structlog.testing import capture_logs

from consumer.applying import Applier, RetryWindow
from consumer.kafka_source import KafkaRecordSource
from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient
from countersink.dead_letters_cli import republish
from countersink.kafka import connection_options, make_producer
from countersink.reader import read_state
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.definitions import CounterSet, load_definitions
from schemas.events import EventRouter, apply_updates
from stack.loading import child_env, end_offsets, wait_until_flushed
from tests.integration.consumer_support import read_topic, running
from tests.integration.per_counter_truth import TruthRecord, per_counter_truth
from tests.record_batches import ESCAPED, PLACEHOLDER, REPLACED, batch_bytes

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

MIXED = """
[[counter]]
name = "page_views"
topics = ["{topic}"]
kind = "count"
key = ["page"]
where = {{ type = "view" }}

[[counter]]
name = "revenue"
topics = ["{topic}"]
kind = "sum"
key = ["sku"]
value = "amount"
where = {{ type = "purchase" }}

[[counter]]
name = "events_by_user"
topics = ["{topic}"]
kind = "count"
key = ["user"]

[[counter]]
name = "biggest_order"
topics = ["{topic}"]
kind = "max"
key = ["sku"]
value = "amount"
where = {{ type = "purchase" }}
required = true

[[counter]]
name = "signups"
topics = ["{topic}"]
kind = "count"
key = ["country", "plan"]
where = {{ type = "signup" }}
event_id = "id"
"""
# Every instance key an event of the stream can name: each is read, so a count under a key the truth does
# not hold (an event counted by a counter that should have skipped or refused it) is seen.
VOCABULARY = {
    "page_views": ["/a", "/b", "/c"],
    "revenue": ["k1", "k2", "k3"],
    "biggest_order": ["k1", "k2", "k3"],
    "events_by_user": ["u1", "u2", "u3", "7", "true"],
    "signups": [f"{c}|{p}" for c in ("fr", "de") for p in ("free", "pro")],
}
# A field's value spoiled: absent, null, or of a type its counters refuse.
SPOILED = ["absent", None, "12", [1], {"a": 1}, 1.5]


def mixed_events(n: int, seed: int) -> list[bytes]:
    """Views, purchases and signups; about one field in six is spoiled, and a few records are not JSON."""
    rng = random.Random(seed)
    events: list[bytes] = []
    for i in range(n):
        kind = rng.choice(["view", "purchase", "signup"])
        event: dict[str, Any] = {"type": kind, "user": rng.choice(["u1", "u2", "u3", 7, True])}
        if kind == "view":
            event["page"] = rng.choice(["/a", "/b", "/c"])
        elif kind == "purchase":
            event.update(sku=rng.choice(["k1", "k2", "k3"]), amount=rng.randrange(1, 500))
        else:
            event.update(country=rng.choice(["fr", "de"]), plan=rng.choice(["free", "pro"]), id=f"s{i}")
        for name in list(event):
            if name != "type" and rng.random() < 1 / 6:
                spoiled = rng.choice(SPOILED)
                if spoiled == "absent":
                    del event[name]
                else:
                    event[name] = spoiled
        events.append(json.dumps(event).encode())
    for _ in range(n // 100):
        events.insert(rng.randrange(len(events)), b"{not json")
    return events


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path) -> Settings:
    return Settings(kafka=kafka, cassandra=cassandra, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        session_timeout_ms=6000, health_port=0))


async def _send(kafka: KafkaSettings, topic: str, records: list[TruthRecord]) -> list[tuple[int, int]]:
    """Publish ``records`` (key, timestamp, headers, partition as given); their (partition, offset)."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        sent = [await producer.send(topic, r.value, key=r.key, partition=r.partition, timestamp_ms=r.timestamp_ms,
                                    headers=list(r.headers)) for r in records]
        return [(meta.partition, meta.offset) for meta in [await s for s in sent]]
    finally:
        await producer.stop()


async def _values(cassandra: CassandraSettings, vocabulary: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    values: dict[str, dict[str, Any]] = {}
    async with CassandraClient(cassandra) as client:
        for counter, keys in vocabulary.items():
            for key in keys:
                state = await read_state(client, counter, key)
                values.setdefault(counter, {})[key] = None if state is None else state.value()
    return values


def _expected(truth_values: dict[str, dict[str, int]], vocabulary: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    return {counter: {key: truth_values[counter].get(key) for key in keys} for counter, keys in vocabulary.items()}


# ``countersink`` whose ``dead-letters republish``, once it has looked for an earlier copy, marks that it has
# (argv[1]) and waits until another run has too (argv[2]); the command's arguments follow.
_AFTER_BOTH_LOOKED = """
import asyncio, sys
from pathlib import Path
from countersink import dead_letters_cli
mine, theirs = Path(sys.argv[1]), Path(sys.argv[2])
looked = dead_letters_cli._sent_back
async def then_wait(*args, **kwargs):
    found = await looked(*args, **kwargs)
    mine.touch()
    for _ in range(600):
        if theirs.exists():
            break
        await asyncio.sleep(0.05)
    return found
dead_letters_cli._sent_back = then_wait
from countersink.cli import main
sys.exit(main(sys.argv[3:]))
"""


async def test_a_mixed_topic_is_counted_per_counter_and_a_republished_dead_letter_is_not_counted_twice(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Three event types, five counters, fields absent, null and wrongly typed: every counter holds exactly
    what a truth computed per counter says; each record some counter refused is dead-lettered once, naming
    exactly those counters; re-published fixed, it is counted by them alone."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    path = tmp_path / "counters.toml"
    path.write_text(MIXED.format(topic=topic))
    counters: CounterSet = load_definitions(path)
    rng = random.Random(3)
    records = [TruthRecord(raw, partition=rng.randrange(3)) for raw in mixed_events(3000, seed=11)]
    truth = per_counter_truth(counters, topic, records)
    assert len(truth.refused) > 50
    assert sum(truth.skipped.values()) > 200
    where = await _send(kafka_settings, topic, records)
    settings = _settings(kafka_settings, cassandra_settings, group, path)

    async with running(ConsumerService(settings, counters)):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        assert await _values(cassandra_settings, VOCABULARY) == _expected(truth.values, VOCABULARY)

        dead = await read_topic(kafka_settings, f"dlq-{group}", len(truth.refused), then_s=1.0)
        by_source = {dict(d.headers)["countersink.source"].decode(): d for d in dead}
        assert len(by_source) == len(dead)  # each once
        expected_refusals = {f"{topic}/{where[i][0]}/{where[i][1]}": names for i, names in truth.refused.items()}
        assert {source: tuple(filter(None, (dict(d.headers).get("countersink.refused") or b"*").decode().split(",")))
                for source, d in by_source.items()} == expected_refusals

        # A purchase whose amount was text: revenue and biggest_order refused it, events_by_user counted it.
        index = next(i for i, names in truth.refused.items() if names == ("revenue", "biggest_order")
                     and json.loads(records[i].value).get("user") in ("u1", "u2", "u3"))
        letter = by_source[f"{topic}/{where[index][0]}/{where[index][1]}"]
        fixed = {**json.loads(records[index].value), "amount": 1000}
        # As an editor saves it: a byte-order mark and a last newline, which publish drops from a line (the
        # payload was refused for the first and sent with the second).
        assert await republish(settings, letter.partition, letter.offset,
                               b"\xef\xbb\xbf" + json.dumps(fixed).encode() + b"\n") == 0
        again = [*records, TruthRecord(json.dumps(fixed).encode(), partition=records[index].partition,
                                       headers=[("countersink.apply-to", b"revenue,biggest_order")])]
        after = per_counter_truth(counters, topic, again)
        assert after.values["events_by_user"] == truth.values["events_by_user"]
        assert after.values["revenue"] != truth.values["revenue"]
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        assert await _values(cassandra_settings, VOCABULARY) == _expected(after.values, VOCABULARY)
        # Sent back a second time by mistake: refused (revenue has no event id: it would count the copy), named;
        # --again sends it.
        with capture_logs() as logs:
            assert await republish(settings, letter.partition, letter.offset, json.dumps(fixed).encode()) == 2
        (refusal,) = [entry for entry in logs if entry["event"] == "already_republished"]
        assert "was sent back before, as" in refusal["error"]
        assert await republish(settings, letter.partition, letter.offset, json.dumps(fixed).encode(),
                               dry_run=True, again=True) == 0
        assert json.dumps(fixed)[:40] in capsys.readouterr().out  # what would be sent, shown
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        assert await _values(cassandra_settings, VOCABULARY) == _expected(after.values, VOCABULARY)

        # Another such purchase sent back by two runs at once (two operators, or a retried job; two processes,
        # as they are): one copy counts. Both looked for an earlier copy before either sent, and both sent.
        second = next(i for i, names in truth.refused.items() if names == ("revenue", "biggest_order") and
                      i != index and json.loads(records[i].value).get("user") in ("u1", "u2", "u3"))
        other = by_source[f"{topic}/{where[second][0]}/{where[second][1]}"]
        mended = {**json.loads(records[second].value), "amount": 7}
        fix = tmp_path / "mended.json"
        fix.write_text(json.dumps(mended))
        env = child_env(kafka_settings, cassandra_settings, consumer={"dead_letter_topic": f"dlq-{group}"})
        # Each run waits, once it has looked for an earlier copy, until the other has looked too: the interleaving
        # that sent two copies, made certain.
        runs = [await asyncio.create_subprocess_exec(
            sys.executable, "-c", _AFTER_BOTH_LOOKED, str(tmp_path / f"looked-{n}"), str(tmp_path / f"looked-{1 - n}"),
            "dead-letters", "republish", "--partition", str(other.partition), "--offset", str(other.offset),
            "--payload", str(fix), cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE) for n in range(2)]
        answers = [await asyncio.wait_for(run.communicate(), 120) for run in runs]
        codes = [run.returncode for run in runs]
        assert sorted(codes) == [0, 2], answers
        refused = b"".join(err for _, err in answers)
        assert b'"event": "already_republished"' in refused, answers
        after = per_counter_truth(counters, topic, [*again, TruthRecord(
            json.dumps(mended).encode(), partition=records[second].partition,
            headers=[("countersink.apply-to", b"revenue,biggest_order")])])
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        assert await _values(cassandra_settings, VOCABULARY) == _expected(after.values, VOCABULARY)

    # A dead letter whose source is gone, or never was (a forged header): said, nothing sent (the producer
    # asserted on a partition past the topic's, and waited 30 s for a topic that does not exist).
    producer = make_producer(kafka_settings)
    await producer.start()
    try:
        forged = [await producer.send_and_wait(f"dlq-{group}", b"{}", partition=0, headers=[
            ("countersink.source", source.encode())]) for source in (f"{topic}/99/0", f"{topic}-gone/0/0")]
    finally:
        await producer.stop()
    for sent, why in zip(forged, ("has 3 partitions", f"no topic {topic}-gone"), strict=True):
        with capture_logs() as logs:
            assert await republish(settings, 0, sent.offset, None) == 2
        (refusal,) = [entry["error"] for entry in logs if entry["event"] == "source_not_found"]
        assert refusal.endswith(why + ")"), refusal


RECORD_COUNTERS = """
[[counter]]
name = "by_key_hour"
topics = ["{topic}"]
kind = "count"
key = ["@key"]
bucket = {{ field = "@timestamp", size = "1h" }}

[[counter]]
name = "amount_by_user_hour"
topics = ["{topic}"]
kind = "sum"
key = ["@key.user", "@header.source"]
value = "n"
bucket = {{ field = "@timestamp", size = "1h" }}
"""


async def test_counters_keyed_by_the_record_key_and_bucketed_by_its_time_are_exact(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """Records keyed by a JSON key, stamped over four hours, with a source header: counters keyed by the
    record key (raw, and a field of it) and the header, bucketed by the record time, equal the truth; records
    without a key are skipped, and a key that is not JSON is refused by the counter reading a field of it."""
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    path = tmp_path / "counters.toml"
    path.write_text(RECORD_COUNTERS.format(topic=topic))
    counters = load_definitions(path)
    first_hour = (int(time.time()) // 3600 - 4) * 3600 * 1000
    rng = random.Random(5)
    records = []
    for _ in range(1200):
        user = rng.choice(["u1", "u2", "u3"])
        key = rng.choice([json.dumps({"user": user}).encode()] * 8 + [None, b"plain"])
        headers = [("source", rng.choice([b"web", b"app"]))] if rng.random() < 0.9 else []
        records.append(TruthRecord(json.dumps({"n": rng.randrange(1, 100)}).encode(), key=key,
                                   timestamp_ms=first_hour + rng.randrange(4 * 3600 * 1000), headers=headers,
                                   partition=rng.randrange(2)))
    truth = per_counter_truth(counters, topic, records)
    assert truth.refused
    assert truth.skipped[("by_key_hour", "key_null")]
    await _send(kafka_settings, topic, records)
    hours = [time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(first_hour // 1000 + h * 3600)) for h in range(4)]
    keys = [json.dumps({"user": u}) for u in ("u1", "u2", "u3")] + ["plain"]
    vocabulary = {"by_key_hour": [f"{k.replace('|', chr(92) + '|')}|{h}" for k in keys for h in hours],
                  "amount_by_user_hour": [f"{u}|{s}|{h}" for u in ("u1", "u2", "u3") for s in ("web", "app")
                                          for h in hours]}
    settings = _settings(kafka_settings, cassandra_settings, group, path)
    async with running(ConsumerService(settings, counters)):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
    assert await _values(cassandra_settings, vocabulary) == _expected(truth.values, vocabulary)
    assert sum(truth.values["by_key_hour"].values()) > 900

    # A takeover's replay and a retry window's rebuild read the records again through the record source: they
    # carry the key, timestamp and headers, so the router decides every record as the live path did.
    source = KafkaRecordSource(kafka_settings)
    await source.start()
    try:
        again: dict[tuple[str, str], Any] = {}
        for partition in range(2):
            applier = Applier(EventRouter(counters), counters, topic, partition, RetryWindow(0))
            for record in await source.read(topic, partition, 0, 10**9):
                _, updates, _ = applier.classify(record)
                apply_updates(again, updates, counters)
    finally:
        await source.stop()
    assert {counter: {key: again[(counter, key)].value() if (counter, key) in again else None for key in keys}
            for counter, keys in vocabulary.items()} == _expected(truth.values, vocabulary)


HEADER_COUNTERS = """
[[counter]]
name = "views"
topics = ["{topic}"]
kind = "count"
key = ["page"]

[[counter]]
name = "views_by_source"
topics = ["{topic}"]
kind = "count"
key = ["@header.source"]
"""


async def _produce_raw(kafka: KafkaSettings, topic: str, batch: bytes) -> None:
    """Append ``batch`` to partition 0 of ``topic`` as it is: what a client other than aiokafka (librdkafka, Go)
    can write and aiokafka's producer cannot."""
    client = AIOKafkaClient(**connection_options(kafka))
    await client.bootstrap()
    try:
        client.add_topic(topic)
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(TopicPartition(topic, 0))
        answer = await client.send(leader, ProduceRequest(None, -1, 30_000, [(topic, [(0, batch)])]))
        assert [error for _, parts in answer.topics for _, error, *_ in parts] == [0]
    finally:
        await client.close()


async def test_a_header_name_that_is_no_utf8_stops_nothing(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """A batch from a client that writes header names as any bytes, between records aiokafka writes: every
    record is counted (aiokafka's reader alone fails the partition's every fetch on it), ``@header.source``
    still read from the record with the odd name, and the one record of it that is no JSON is dead-lettered
    with that name made sendable. A takeover's replay reads the same records."""
    topic = await topic_factory(partitions=1)
    group = f"g{os.urandom(4).hex()}"
    path = tmp_path / "counters.toml"
    path.write_text(HEADER_COUNTERS.format(topic=topic))
    counters = load_definitions(path)
    before = [TruthRecord(b'{"page": "/a"}', headers=[("source", b"web")]) for _ in range(20)]
    await _send(kafka_settings, topic, before)
    now = int(time.time() * 1000)
    await _produce_raw(kafka_settings, topic, batch_bytes([
        (now, None, b'{"page": "/c"}', [("source", b"app")]),
        (now, None, b'{"page": "/b"}', [(f"trace{PLACEHOLDER}", b"1"), ("source", b"app")]),
        (now, None, b'{"page": "/b"', [(f"trace{PLACEHOLDER}", b"2")]),
    ], compression=1, bad_names=True))
    after = [TruthRecord(b'{"page": "/a"}', headers=[("source", b"app")]) for _ in range(5)]
    await _send(kafka_settings, topic, after)
    settings = _settings(kafka_settings, cassandra_settings, group, path)
    expected = {"views": {"/a": 25, "/b": 1, "/c": 1}, "views_by_source": {"web": 20, "app": 7}}
    async with running(ConsumerService(settings, counters)):
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}))
        vocabulary = {counter: list(values) for counter, values in expected.items()}
        assert await _values(cassandra_settings, vocabulary) == expected
        dead = await read_topic(kafka_settings, f"dlq-{group}", 1, then_s=1.0)
    assert [(dict(d.headers)["countersink.source"], dict(d.headers).get(f"trace{REPLACED}")) for d in dead] == [
        (f"{topic}/0/22".encode(), b"2")]

    source = KafkaRecordSource(kafka_settings)
    await source.start()
    try:
        replayed = await source.read(topic, 0, 0, 10**9)
    finally:
        await source.stop()
    assert [r.offset for r in replayed] == list(range(28))
    assert replayed[21].headers[0] == (f"trace{ESCAPED}", b"1")
