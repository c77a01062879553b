"""``POST /counters/{name}/reset`` on real Kafka and Cassandra, the read API served in process: idempotency
keys, a client gone before its reset starts, a stop during a reset, and a failure that retrying will not fix."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka import TopicPartition
from pydantic import SecretStr
from structlog.testing import capture_logs

from countersink.cassandra import CassandraClient
from countersink.kafka import make_consumer
from countersink.registry import CounterRegistry
from countersink.resets import read_points, read_reset_rows, record_reset
from countersink.serve import ReadApi, Resetting, Tokens, api_runner, serve
from countersink.settings import CassandraSettings, Consistency, KafkaSettings, ServeSettings, Settings
from schemas.definitions import parse_definitions
from tests.integration.test_resets import DEFINITIONS, PARTITIONS

pytestmark = pytest.mark.integration

TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def _serving(client: CassandraClient, kafka: KafkaSettings, topic: str) -> AsyncIterator[
        tuple[ReadApi, aiohttp.ClientSession]]:
    """The read API with resets, over the definitions of ``topic`` recorded in the registry as a consumer would,
    served by serve's own runner (aiohttp's test server cancels a handler whose client went; serve's does not)."""
    await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace("{topic}", topic), "c.toml"),
                                           "test", "g")
    settings = ServeSettings(admin_tokens=SecretStr(f"ops:{TOKEN}"), admin_cassandra_username="admin")
    api = ReadApi(client, settings, registry=CounterRegistry(client),
                  resetting=Resetting(Tokens(settings, admin=True), client, kafka))
    runner = api_runner(api)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            yield api, http
    finally:
        await runner.cleanup()


async def _reset_started(api: ReadApi) -> None:
    """Returns once a reset runs in ``api`` (its task made, the request answered only when it ends)."""
    for _ in range(10_000):
        if api._running:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("no reset started")


async def _controls(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    """Records in each partition of ``topic`` (only control records are published in these tests)."""
    consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: int(ends[tp]) for tp in tps}
    finally:
        await consumer.stop()


async def test_an_idempotency_key_answers_the_recorded_reset_and_completes_it(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """A POST repeated with its Idempotency-Key answers the first one's reset (same epoch, id and positions)
    and publishes nothing more; the key with other keys is refused (409), a malformed key too (400); a reset
    recorded with a key but cut short before its control records is completed by the repeated request; without
    a key each POST is a new reset."""
    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client, _serving(client, kafka_settings, topic) as (_, http):
        key = {"Idempotency-Key": "4b7d2c1e-retry-me"}
        first = await http.post("/counters/shares/reset", json={"keys": ["S1"]}, headers={**AUTH, **key})
        assert first.status == 200, await first.text()
        again = await http.post("/counters/shares/reset", json={"keys": ["S1"]}, headers={**AUTH, **key})
        assert again.status == 200, await again.text()
        assert await again.json() == await first.json()
        assert (await first.json())["epoch"] == 1
        assert await _controls(kafka_settings, topic) == dict.fromkeys(range(PARTITIONS), 1)  # nothing new
        other = await http.post("/counters/shares/reset", json={"keys": ["S2"]}, headers={**AUTH, **key})
        assert other.status == 409, await other.text()
        for bad in ("two words", "x" * 129, ""):
            refused = await http.post("/counters/shares/reset", headers={**AUTH, "Idempotency-Key": bad})
            assert refused.status == 400, (bad, await refused.text())
        assert [row["epoch"] for row in await read_reset_rows(client, "shares")] == [1]

        # Recorded under a key, then cut short before any control record (a server killed there).
        cut, _ = await record_reset(client, "shares", [], "http:ops", Consistency.QUORUM, {topic: PARTITIONS},
                                    request_key="cut-short")
        completed = await http.post("/counters/shares/reset", headers={**AUTH, "Idempotency-Key": "cut-short"})
        assert completed.status == 200, await completed.text()
        body = await completed.json()
        assert (body["epoch"], body["id"]) == (cut.epoch, cut.reset_id) == (2, cut.reset_id)
        assert sorted(p["partition"] for p in body["positions"]) == list(range(PARTITIONS))
        assert await read_points(client, "shares", 2, {topic: PARTITIONS}, reset_id=cut.reset_id) == {
            (topic, p["partition"]): p["offset"] for p in body["positions"]}

        for expected in (3, 4):  # no key: each POST a reset of its own
            plain = await http.post("/counters/shares/reset", headers=AUTH)
            assert (plain.status, (await plain.json())["epoch"]) == (200, expected)

    # A keyspace made before keys were recorded: a request with a key fails (500, nothing to retry), one
    # without resets.
    async with CassandraClient(cassandra_settings) as client:
        await client.execute("ALTER TABLE resets DROP request_key", prepared=False)
        async with _serving(client, kafka_settings, topic) as (_, http):
            keyed = await http.post("/counters/trades/reset", headers={**AUTH, "Idempotency-Key": "k"})
            assert keyed.status == 500, await keyed.text()
            assert (await keyed.json())["reset"]["recorded"] is False
            plain = await http.post("/counters/trades/reset", headers=AUTH)
            assert plain.status == 200, await plain.text()


async def test_a_client_gone_before_its_reset_starts_gets_none(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """A POST waiting behind a running reset whose client gives up (a timeout, likely followed by a retry) is
    not started when its turn comes: nothing recorded, nothing published, and a line saying so."""
    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client, _serving(client, kafka_settings, topic) as (api, http):
        with capture_logs() as logs:
            await api._resets.acquire()  # a reset running: the next one waits for it
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await http.post("/counters/trades/reset", headers=AUTH,
                                    timeout=aiohttp.ClientTimeout(total=0.5))
                await asyncio.sleep(0.5)  # the server sees the connection closed
            finally:
                api._resets.release()
            for _ in range(50):
                if any(e["event"] == "reset_not_started" for e in logs):
                    break
                await asyncio.sleep(0.1)
        assert [e["counter"] for e in logs if e["event"] == "reset_not_started"] == ["trades"], logs
        assert await read_reset_rows(client, "trades") == []
        assert await _controls(kafka_settings, topic) == dict.fromkeys(range(PARTITIONS), 0)


async def test_a_stop_awaits_the_running_reset_and_refuses_new_ones(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """Once a stop begins, a running reset is awaited to its end (its answer 200, a control record in every
    partition) while a new one answers 503; a reset still running when the stop's time is up is logged
    (reset_interrupted, with its counter and how far it went)."""
    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client, _serving(client, kafka_settings, topic) as (api, http):
        running = asyncio.create_task(http.post("/counters/trades/reset", headers=AUTH))
        await _reset_started(api)
        stopping = asyncio.create_task(api.finish_resets(5))
        await asyncio.sleep(0)
        refused = await http.post("/counters/shares/reset", headers=AUTH)
        assert refused.status == 503, await refused.text()
        assert "stopping" in (await refused.json())["detail"]
        await stopping
        answer = await running
        assert answer.status == 200, await answer.text()
        assert sorted(p["partition"] for p in (await answer.json())["positions"]) == list(range(PARTITIONS))
        assert [row["epoch"] for row in await read_reset_rows(client, "shares")] == []

    async with CassandraClient(cassandra_settings) as client, _serving(client, kafka_settings, topic) as (api, http):
        with capture_logs() as logs:
            cut = asyncio.create_task(http.post("/counters/trades/reset", headers=AUTH))
            await _reset_started(api)
            await api.finish_resets(0)
            await asyncio.gather(cut, return_exceptions=True)
        (interrupted,) = [e for e in logs if e["event"] == "reset_interrupted"]
        assert interrupted["counter"] == "trades"
        assert interrupted["stage"] in ("partitions", "recording", "publishing", "positions")
        assert ("epoch" in interrupted) == interrupted["recorded"]


async def test_a_control_record_kafka_refuses_answers_500_with_the_recorded_epoch(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """A topic that refuses the control record (max.message.bytes too small: no retry will pass) answers 500
    without Retry-After, naming the recorded epoch and id and what to fix, as its reset_failed line does."""
    topic = await topic_factory(partitions=PARTITIONS, configs={"max.message.bytes": "64"})
    async with CassandraClient(cassandra_settings) as client, _serving(client, kafka_settings, topic) as (_, http):
        with capture_logs() as logs:
            answer = await http.post("/counters/trades/reset", headers={**AUTH, "Idempotency-Key": "k1"})
        assert answer.status == 500, await answer.text()
        assert "Retry-After" not in answer.headers
        problem = await answer.json()
        (row,) = await read_reset_rows(client, "trades")
        assert problem["reset"] == {"stage": "publishing", "recorded": True, "epoch": 1, "id": row["id"],
                                    "published": 0, "partitions": PARTITIONS}
        assert f"epoch 1 (id {row['id']})" in problem["detail"]
        assert "max.message.bytes" in problem["detail"]
        assert "same Idempotency-Key" in problem["detail"]
        (failed,) = [e for e in logs if e["event"] == "reset_failed"]
        assert (failed["epoch"], failed["id"], failed["error"]) == (1, row["id"], "MessageSizeTooLargeError")


async def _logged(logs: list[MutableMapping[str, Any]], event: str) -> MutableMapping[str, Any]:
    """The first entry of ``event`` in ``logs``, waited for (30 s at most)."""
    for _ in range(3000):
        found = [entry for entry in logs if entry["event"] == event]
        if found:
            return found[0]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {event} in {logs}")


async def test_serve_told_to_stop_during_a_reset_finishes_it_and_refuses_new_ones(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """``countersink serve``'s own stop (what SIGTERM sets): with a reset started, a reset asked for after the
    stop answers 503 (the server still listens while it waits), the started one answers 200 with a control
    record in every partition, and serve then exits 0."""
    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace("{topic}", topic), "c.toml"),
                                               "test", "g")
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings.model_copy(update={"allow_insecure": True}))
    serve_settings = ServeSettings(host="127.0.0.1", port=0, allow_insecure=True,
                                   admin_tokens=SecretStr(f"ops:{TOKEN}"), admin_cassandra_username="admin",
                                   admin_cassandra_password=SecretStr(secrets.token_urlsafe(12)))
    stop = asyncio.Event()
    with capture_logs() as logs:
        serving = asyncio.create_task(serve(settings, serve_settings, None, None, stop=stop))
        port = (await _logged(logs, "serve_started"))["port"]
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            first = asyncio.create_task(http.post("/counters/trades/reset", headers=AUTH))
            await _logged(logs, "reset_started")
            stop.set()
            second = await http.post("/counters/shares/reset", headers=AUTH)
            assert second.status == 503, await second.text()
            answer = await first
            assert answer.status == 200, await answer.text()
            assert sorted(p["partition"] for p in (await answer.json())["positions"]) == list(range(PARTITIONS))
        assert await serving == 0
    assert not [entry for entry in logs if entry["event"] == "reset_interrupted"]


async def test_serve_refuses_to_start_on_levels_beyond_the_keyspaces_replicas(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings) -> None:
    """On the test keyspace (one replica), serve with ``--consistency THREE``, or with resets written at TWO,
    exits 2 at start naming the level and the keyspace, rather than answering every request with an error."""
    cassandra = cassandra_settings.model_copy(update={"allow_insecure": True})
    serve_settings = ServeSettings(host="127.0.0.1", port=0, allow_insecure=True)
    with capture_logs() as logs:
        code = await serve(Settings(kafka=kafka_settings, cassandra=cassandra), serve_settings, None, Consistency.THREE)
    assert code == 2
    assert [entry["error"] for entry in logs if entry["event"] == "settings_refused"] == [
        f"--consistency=THREE waits for 3 replicas; keyspace {cassandra.keyspace} keeps 1 (replication_factor=1): "
        "no request at it can succeed; lower it"]
    admin = serve_settings.model_copy(update={"admin_tokens": SecretStr(f"ops:{TOKEN}"),
                                              "admin_cassandra_username": "admin",
                                              "admin_cassandra_password": SecretStr(secrets.token_urlsafe(12))})
    writes_at_two = cassandra.model_copy(update={"write_consistency": Consistency.TWO})
    with capture_logs() as logs:
        code = await serve(Settings(kafka=kafka_settings, cassandra=writes_at_two), admin, None, None)
    assert code == 2
    assert [entry["error"] for entry in logs if entry["event"] == "settings_refused"] == [
        f"COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY=TWO waits for 2 replicas; keyspace {cassandra.keyspace} keeps 1 "
        "(replication_factor=1): no request at it can succeed; lower it"]
