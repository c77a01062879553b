"""Resets over HTTP on real Kafka and Cassandra: ``POST /counters/{name}/reset`` behind admin tokens, against a
real ``countersink serve`` and a real consumer."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env
from tests.docblocks import doc_block
from tests.integration.consumer_support import start_consumer, wait_until_started
from tests.integration.serve_support import running_serve
from tests.integration.test_resets import DEFINITIONS, PARTITIONS, SYMBOLS, _events, _flushed, _publish, _truth

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _value(http: aiohttp.ClientSession, base: str, token: str, counter: str, symbol: str) -> int:
    async with http.get(f"{base}/counters/{counter}/{symbol}", headers=_bearer(token)) as answer:
        assert answer.status == 200, await answer.text()
        value = (await answer.json())["value"]
    return 0 if value is None else int(value)


async def _values(http: aiohttp.ClientSession, base: str, token: str) -> dict[tuple[str, str], int]:
    return {(counter, symbol): await _value(http, base, token, counter, symbol)
            for counter in ("trades", "shares") for symbol in SYMBOLS}


async def test_an_admin_token_resets_over_http_and_read_tokens_or_none_cannot(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """With a read token and an admin token set: no token answers 401 (and so does /trace), a read token 403 and
    a token nobody issued 401, each a problem document, and none resets anything. The admin token resets one
    key of shares and every key of trades: each answer is the reset as recorded (its schema in /openapi.json),
    who asked is the token's name, reads right after show nothing counted before, and once the consumer has
    counted more events, exactly those. Neither token nor the writing role's password is in serve's log."""
    topic = await topic_factory(partitions=PARTITIONS)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    consumer_log = tmp_path / "consumer.log"
    before, after = _events("a", 30), _events("b", 24)
    read_token, admin_token, stranger = (secrets.token_urlsafe(24) for _ in range(3))
    password = secrets.token_urlsafe(18)
    admin_file = tmp_path / "admin-tokens"
    admin_file.write_text(f"# who may reset\nops-oncall:{admin_token}\n")
    env = {"COUNTERSINK_SERVE__TOKENS": read_token, "COUNTERSINK_SERVE__ADMIN_TOKENS_FILE": str(admin_file),
           "COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME": "countersink_serve_admin",
           "COUNTERSINK_SERVE__ADMIN_CASSANDRA_PASSWORD": password,
           # No TLS here (a test on loopback): the tokens and the password would cross in the clear.
           "COUNTERSINK_SERVE__ALLOW_INSECURE": "true", "COUNTERSINK_CASSANDRA__ALLOW_INSECURE": "true",
           "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka_settings.bootstrap_servers),
           "COUNTERSINK_LOG_FORMAT": "json"}
    serve_log = tmp_path / "serve.log"
    consumer = start_consumer(kafka_settings, cassandra_settings, consumer_log, flush_interval_s=0.5,
                              dead_letter_topic=f"dlq-{group}", group_id=group, counters_file=counters)
    try:
        await wait_until_started(consumer_log, consumer)
        await _publish(kafka_settings, topic, before)
        await _flushed(kafka_settings, cassandra_settings, group, topic)
        async with running_serve(cassandra_settings, counters, env=env, output=serve_log) as base, \
                aiohttp.ClientSession() as http:
            assert await _values(http, base, read_token) == _truth(before)
            refused: list[tuple[dict[str, str], int]] = [({}, 401), (_bearer(stranger), 401),
                                                         (_bearer(read_token), 403)]
            for headers, status in refused:
                async with http.post(f"{base}/counters/trades/reset", headers=headers) as answer:
                    assert answer.status == status, await answer.text()
                    assert answer.content_type == "application/problem+json"
                    assert (await answer.json())["status"] == status
            async with http.get(f"{base}/trace/{topic}?offset=0:0") as answer:
                assert answer.status == 401, await answer.text()
            async with http.get(f"{base}/counters/trades/S0", headers=_bearer(admin_token)) as answer:
                assert answer.status == 200  # an admin token reads too
            assert await _values(http, base, read_token) == _truth(before)  # nothing was reset

            async with http.get(f"{base}/openapi.json", headers=_bearer(read_token)) as answer:
                document = await answer.json()
            validate(document)
            operation = document["paths"]["/counters/{name}/reset"]["post"]
            assert operation["security"] == [{"admin": []}]
            schema = {**operation["responses"]["200"]["content"]["application/json"]["schema"],
                      "components": document["components"]}

            # docs/operations.md's two curl commands, as written, with this server and token.
            done = await asyncio.to_thread(
                subprocess.run, ["bash", "-euc", doc_block("docs/operations.md", "http-reset")],
                env={"PATH": os.environ["PATH"], "SERVE": base, "ADMIN_TOKEN": admin_token},
                capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            print(done.stdout)
            one, whole = (json.loads(line) for line in done.stdout.splitlines())
            for done in (one, whole):
                assert not list(OAS31Validator(schema).iter_errors(done)), done
                assert done["requested_by"] == "ops-oncall"
                assert done["epoch"] == 1
                assert sorted(p["partition"] for p in done["positions"]) == list(range(PARTITIONS))
            assert (one["counter"], one["keys"], whole["counter"], whole["keys"]) == ("shares", ["S1"], "trades", [])
            seen = await _values(http, base, read_token)
            assert seen == {**_truth(before), ("shares", "S1"): 0, **{("trades", s): 0 for s in SYMBOLS}}, seen

            await _publish(kafka_settings, topic, after)
            await _flushed(kafka_settings, cassandra_settings, group, topic)
            everything, since = _truth(before + after), _truth(after)
            assert await _values(http, base, read_token) == {
                **everything, ("shares", "S1"): since[("shares", "S1")],
                **{("trades", s): since[("trades", s)] for s in SYMBOLS}}
    finally:
        consumer.send_signal(signal.SIGTERM)
        await asyncio.to_thread(consumer.wait, 60)
    # The CLI lists the reset as the HTTP answer gave it: who, when, every point.
    listed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "reset", "trades", "--list", "--json"], cwd=REPO,
        env=child_env(kafka_settings, cassandra_settings), capture_output=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr.decode(errors="replace")
    [recorded] = json.loads(listed.stdout)
    assert {k: v for k, v in recorded.items() if k in whole} == whole
    assert recorded["not_recorded"] == []  # every partition reached
    text = serve_log.read_text()
    for secret in (read_token, admin_token, password):
        assert secret not in text
    logged = [json.loads(line) for line in text.splitlines() if '"reset_requested"' in line]
    assert [(e["counter"], e["requested_by"], e["keys"]) for e in logged] == [
        ("shares", "ops-oncall", 1), ("trades", "ops-oncall", 0)], logged


async def test_without_the_writing_role_there_is_no_reset_route(
    cassandra_settings: CassandraSettings, tmp_path: Path,
) -> None:
    """A server without admin settings serves no reset: POST answers 405 (a problem document) and
    /openapi.json does not describe it."""
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", "t"))
    async with running_serve(cassandra_settings, counters) as base, aiohttp.ClientSession() as http:
        async with http.post(f"{base}/counters/trades/reset") as answer:
            assert answer.status == 405
            assert answer.content_type == "application/problem+json"
        async with http.get(f"{base}/openapi.json") as answer:
            document = await answer.json()
    assert "/counters/{name}/reset" not in document["paths"]
    assert "Reset" not in document["components"]["schemas"]
