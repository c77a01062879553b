"""TLS and authentication end to end, on a secured Kafka and Cassandra (the ``secure_stack`` fixture).

Every countersink process works over TLS with a password and a role of its own; each way a connection can be
refused ends the process at once with one line saying why; the read API's tokens and bounds hold against a
real server; and no secret reaches a log line, a repr or a help text.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from countersink.cassandra import CassandraClient, CassandraError, as_dicts
from countersink.cli import SUBCOMMANDS
from countersink.kafka import ensure_topics, make_admin, make_consumer, make_producer
from countersink.registry import CounterRegistry
from countersink.settings import Settings
from schemas.definitions import load_definitions
from stack.loading import end_offsets, publish, wait_until_flushed
from stack.secure import ADMIN_ROLE, GROUP_PREFIX, SecureStack
from stack.servers import free_port
from tests.integration.consumer_support import expected_values, make_events, read_values, write_definitions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Every output of every process these tests start goes here; the last test reads all of it for secrets.
LOGS = REPO / ".stack" / "test" / "security-logs"
TOKENS = ["rotation-token-old-" + uuid.uuid4().hex, "rotation-token-new-" + uuid.uuid4().hex]
FILE_TOKEN = "file-token-" + uuid.uuid4().hex


@pytest.fixture(scope="module", autouse=True)
def _fresh_logs() -> None:
    """An empty folder for this module's process output."""
    LOGS.mkdir(parents=True, exist_ok=True)
    for old in LOGS.iterdir():
        old.unlink()


def env_for(stack: SecureStack, role: str, keyspace: str, *, kafka_user: str = "countersink",
            **sections: dict[str, object]) -> dict[str, str]:
    """A child's environment: nothing of ours inherited, the stack's settings for ``role``, plus ``sections``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    env.update(stack.env(role, kafka_user))
    env.update(COUNTERSINK_CASSANDRA__KEYSPACE=keyspace, COUNTERSINK_LOG_FORMAT="json",
               COUNTERSINK_CONSUMER__HEALTH_PORT="0", COUNTERSINK_GC__HEALTH_PORT="0")
    for section, values in sections.items():
        env.update({f"COUNTERSINK_{section.upper()}__{name.upper()}": str(value) for name, value in values.items()})
    return env


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float

    def problem_lines(self) -> list[str]:
        """Lines a person would read as trouble: warnings, errors, and anything that is not a JSON log line."""
        problems = []
        for line in self.output.splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                problems.append(line)
                continue
            if not isinstance(entry, dict) or entry.get("level") in ("warning", "error", "critical"):
                problems.append(line)
        return problems


def _log_file(name: str) -> Path:
    return LOGS / f"{name}-{uuid.uuid4().hex[:6]}.log"


def _logged(text: str, logger: str, level: str) -> bool:
    """Whether a log holds a JSON line of ``logger`` at ``level``."""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("logger") == logger and record.get("level") == level:
            return True
    return False


async def run_command(name: str, args: list[str], env: dict[str, str], within_s: float = 90) -> Finished:
    """``countersink ARGS`` to the end; a process still running after ``within_s`` is a hang: killed, failed."""
    log = _log_file(name)
    started = time.monotonic()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "countersink.cli", *args, env=env,
                                                       cwd=REPO, stdout=out, stderr=out)
        try:
            await asyncio.wait_for(process.wait(), within_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            pytest.fail(f"countersink {' '.join(args)} still ran after {within_s}s:\n{log.read_text()}")
    return Finished(int(process.returncode or 0), log.read_text(errors="replace"), time.monotonic() - started)


@dataclass
class Running:
    process: asyncio.subprocess.Process
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            pytest.fail(f"process did not stop on SIGTERM:\n{self.text()}")


async def start(name: str, args: list[str], env: dict[str, str]) -> Running:
    """``countersink ARGS`` in the background, output to its own log file."""
    log = _log_file(name)
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "countersink.cli", *args, env=env,
                                                       cwd=REPO, stdout=out, stderr=out)
    return Running(process, log)


async def wait_for_line(running: Running, event: str, within_s: float = 90) -> None:
    """Until the process has logged ``event``; fails if it exits first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if f'"event": "{event}"' in running.text():
            return
        if running.process.returncode is not None:
            pytest.fail(f"exited with {running.process.returncode} before {event}:\n{running.text()}")
        await asyncio.sleep(0.2)
    pytest.fail(f"no {event} within {within_s}s:\n{running.text()}")


# The consumer group of every consumer on the module's keyspace: one group per keyspace (the counter registry
# refuses a second group on the same counters).
KEYSPACE_GROUP = f"{GROUP_PREFIX}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def granted_keyspace(secure_stack: SecureStack) -> AsyncIterator[str]:
    """A keyspace made by ``countersink schema`` as the schema role, with every process role granted on it."""
    keyspace = f"sec_{uuid.uuid4().hex[:10]}"
    made = await run_command("schema", ["schema"], env_for(secure_stack, "countersink_schema", keyspace))
    assert made.returncode == 0, made.output
    await secure_stack.grant(keyspace)
    yield keyspace
    async with CassandraClient(secure_stack.cassandra_settings(ADMIN_ROLE), use_keyspace=False) as client:
        await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False, consistency="ONE")


@pytest.fixture(scope="module")
async def secure_topic(secure_stack: SecureStack) -> str:
    """A topic on the secured broker, made over SASL_SSL."""
    topic = f"secure-{uuid.uuid4().hex[:10]}"
    await ensure_topics(secure_stack.kafka_settings(), {topic: 2})
    return topic


async def https_get(session: aiohttp.ClientSession, url: str, **kwargs: object) -> tuple[int, dict[str, str], str]:
    async with session.get(url, **kwargs) as response:  # type: ignore[arg-type]
        return response.status, dict(response.headers), await response.text()


def client_tls(stack: SecureStack) -> ssl.SSLContext:
    assert stack.certs is not None
    return ssl.create_default_context(cafile=str(stack.certs.ca_cert))


async def wait_ready(session: aiohttp.ClientSession, base: str, running: Running) -> None:
    for _ in range(300):
        try:
            status, _, _ = await https_get(session, base + "/readyz")
            if status == 200:
                return
        except aiohttp.ClientConnectionError:
            pass
        if running.process.returncode is not None:
            pytest.fail(f"serve exited with {running.process.returncode}:\n{running.text()}")
        await asyncio.sleep(0.2)
    pytest.fail(f"serve never became ready:\n{running.text()}")


# ------------------------------------------------------------------------------------- it all works


async def test_schema_consume_gc_get_and_serve_work_over_tls_with_a_role_each(
        secure_stack: SecureStack, tmp_path: Path) -> None:
    """schema, consume (events in, flushed, offsets committed), gc --once, get and serve all work over TLS,
    each with its own Cassandra role and a SCRAM user, and agree with the truth."""
    assert secure_stack.certs is not None
    keyspace = f"sec_{uuid.uuid4().hex[:10]}"
    made = await run_command("schema", ["schema"], env_for(secure_stack, "countersink_schema", keyspace))
    assert made.returncode == 0, made.output
    assert '"event": "schema_ready"' in made.output
    await secure_stack.grant(keyspace)

    loader = secure_stack.kafka_settings("loader")
    topic = f"secure-{uuid.uuid4().hex[:10]}"
    await ensure_topics(loader, {topic: 2})
    events, truth = make_events(400, symbols=6, seed=17)
    await publish(loader, topic, events)
    counters = write_definitions(tmp_path, topic)
    group = f"{GROUP_PREFIX}-{uuid.uuid4().hex[:8]}"
    consumer = await start("consume", ["consume", "--counters", str(counters), "--group", group],
                           env_for(secure_stack, "countersink_consumer", keyspace))
    try:
        await wait_for_line(consumer, "consumer_started")
        ends = await end_offsets(loader, {topic: 2})
        await wait_until_flushed(secure_stack.cassandra_settings("countersink_consumer", keyspace), group, ends)
        await _wait_for_committed(secure_stack, group, ends)
    finally:
        assert await consumer.stop() == 0, consumer.text()
    reader = secure_stack.cassandra_settings("countersink_reader", keyspace)
    assert await read_values(reader, truth) == expected_values(truth)

    await asyncio.sleep(1.2)  # a mutator lives at least a second: let the last ones be final
    gc = await run_command("gc", ["gc", "--once", "--json", "--grace", "0.5s", "--no-progress"],
                           env_for(secure_stack, "countersink_gc", keyspace))
    assert gc.returncode == 0, gc.output
    report = next(json.loads(line) for line in gc.output.splitlines() if line.startswith("{") and '"event"' not in line)
    assert report["mutators_collected"] >= 2
    assert report["instances_folded"] > 0
    assert await read_values(reader, truth) == expected_values(truth)

    symbol = sorted(truth.count)[0]
    got = await run_command("get", ["get", "trades_count", symbol, "--json"],
                            env_for(secure_stack, "countersink_reader", keyspace))
    assert got.returncode == 0, got.output
    printed = next(json.loads(line) for line in got.output.splitlines() if line.startswith('{"counter"'))
    assert printed["values"] == {symbol: truth.count[symbol]}

    port = free_port()
    serve = await start("serve", ["serve"], env_for(
        secure_stack, "countersink_reader", keyspace,
        serve={"host": "127.0.0.1", "port": port, "tls_cert": secure_stack.certs.server_cert,
               "tls_key": secure_stack.certs.server_key, "tokens": TOKENS[0]}))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(secure_stack))) as http:
            base = f"https://127.0.0.1:{port}"
            await wait_ready(http, base, serve)
            status, _, body = await https_get(http, f"{base}/counters/trades_count/{symbol}",
                                              headers={"Authorization": f"Bearer {TOKENS[0]}"})
            assert status == 200, body
            assert json.loads(body)["value"] == truth.count[symbol]
    finally:
        assert await serve.stop() == 0, serve.text()


async def _wait_for_committed(stack: SecureStack, group: str, ends: dict[TopicPartition, int]) -> None:
    """Until the group's committed Kafka offsets reach the log ends (committed after each flush, for lag)."""
    admin = make_admin(stack.kafka_settings("countersink"))
    await admin.start()
    try:
        for _ in range(100):
            committed = await admin.list_consumer_group_offsets(group)
            if all(tp in committed and committed[tp].offset >= end for tp, end in ends.items()):
                return
            await asyncio.sleep(0.3)
        pytest.fail(f"committed offsets {committed} never reached {ends}")
    finally:
        await admin.close()


async def test_the_ssl_listener_takes_a_client_certificate_and_an_unchecked_host_name_connects(
        secure_stack: SecureStack, granted_keyspace: str, secure_topic: str, tmp_path: Path) -> None:
    """The consumer joins through the SSL listener with a client certificate, and through the listener whose
    address the certificate does not name once ssl_check_hostname is off (so the refusal below is the check)."""
    assert secure_stack.certs is not None
    assert secure_stack.kafka is not None
    counters = write_definitions(tmp_path, secure_topic)
    with_certificate = env_for(secure_stack, "countersink_consumer", granted_keyspace, kafka={
        "bootstrap_servers": secure_stack.kafka.ssl_bootstrap, "security_protocol": "SSL",
        "ssl_certfile": secure_stack.certs.client_cert, "ssl_keyfile": secure_stack.certs.client_key})
    for name in ("SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD"):
        with_certificate.pop(f"COUNTERSINK_KAFKA__{name}")
    unchecked = env_for(secure_stack, "countersink_consumer", granted_keyspace, kafka={
        "bootstrap_servers": secure_stack.kafka.elsewhere_bootstrap, "ssl_check_hostname": "false"})
    consume = ["consume", "--counters", str(counters)]
    consumers = [await start(name, [*consume, "--group", KEYSPACE_GROUP], env)
                 for name, env in (("consume-ssl", with_certificate), ("consume-unchecked", unchecked))]
    try:
        await asyncio.gather(*(wait_for_line(consumer, "consumer_started") for consumer in consumers))
    finally:
        for consumer in consumers:
            assert await consumer.stop() == 0, consumer.text()


# ---------------------------------------------------------------------------------- refusals, one line


@dataclass(frozen=True)
class Refusal:
    name: str
    command: list[str]
    role: str
    kafka: dict[str, object]
    cassandra: dict[str, object]
    says: str


def _refusals() -> list[Refusal]:
    consume = ["consume", "--counters", "{counters}", "--group", KEYSPACE_GROUP]
    other_ca = "{other_ca}"
    return [
        Refusal("cassandra-wrong-password", ["get", "trades_count", "X"], "countersink_reader", {},
                {"password": "not-the-password"}, "Cassandra refused the credentials (user 'countersink_reader'"),
        Refusal("cassandra-unknown-user", ["gc", "--once", "--no-progress"], "countersink_gc", {},
                {"username": "nobody_here"}, "Cassandra refused the credentials (user 'nobody_here'"),
        Refusal("cassandra-other-ca", ["schema", "--wait", "60"], "countersink_schema", {},
                {"ssl_trusted_cert": other_ca}, "TLS with Cassandra at 127.0.0.1:"),
        Refusal("cassandra-without-tls", ["get", "trades_count", "X"], "countersink_reader", {},
                {"ssl_enabled": "false", "allow_insecure": "true"},
                "COUNTERSINK_CASSANDRA__SSL_ENABLED if the node expects TLS"),
        Refusal("cassandra-other-ca-serve", ["serve", "--host", "127.0.0.1", "--port", "0"], "countersink_reader", {},
                {"ssl_trusted_cert": other_ca}, "certificate"),
        Refusal("consume-cassandra-wrong-password", consume, "countersink_consumer", {},
                {"password": "not-the-password"}, "Cassandra refused the credentials"),
        Refusal("kafka-wrong-password", consume, "countersink_consumer", {"sasl_password": "not-the-password"}, {},
                "refused the SASL login of user 'countersink'"),
        Refusal("retire-orphans-kafka-wrong-password", ["retire-orphans"], "countersink_gc",
                {"sasl_password": "not-the-password"}, {}, "refused the SASL login of user 'countersink'"),
        Refusal("cassandra-unreadable-ca-file", ["get", "trades_count", "X"], "countersink_reader", {},
                {"ssl_trusted_cert": "/nonexistent/ca.pem"}, "COUNTERSINK_CASSANDRA__SSL_TRUSTED_CERT: cannot read"),
        Refusal("kafka-unreadable-ca-file", consume, "countersink_consumer", {"ssl_cafile": "/nonexistent/ca.pem"},
                {}, "COUNTERSINK_KAFKA__SSL_CAFILE: cannot use /nonexistent/ca.pem"),
        Refusal("kafka-unknown-user", consume, "countersink_consumer", {"sasl_username": "nobody-here"}, {},
                "refused the SASL login of user 'nobody-here'"),
        Refusal("kafka-other-ca", consume, "countersink_consumer", {"ssl_cafile": other_ca}, {},
                "certificate in certificate chain"),
        Refusal("kafka-host-name-mismatch", consume, "countersink_consumer",
                {"bootstrap_servers": "{elsewhere}", "ssl_check_hostname": "true"}, {},
                "certificate is not valid for '127.0.0.2'"),
        Refusal("kafka-missing-client-certificate", consume, "countersink_consumer",
                {"bootstrap_servers": "{ssl_listener}", "security_protocol": "SSL"}, {},
                "requires a client certificate"),
        Refusal("topics-kafka-wrong-password", ["topics", "create", "--counters", "{counters}"], "countersink_consumer",
                {"sasl_password": "not-the-password"}, {}, "refused the SASL login of user 'countersink'"),
        Refusal("topics-kafka-other-ca", ["topics", "create", "--counters", "{counters}"], "countersink_consumer",
                {"ssl_cafile": other_ca}, {}, "certificate in certificate chain"),
    ]


@pytest.mark.parametrize("refusal", _refusals(), ids=lambda refusal: refusal.name)
async def test_a_refused_connection_ends_the_process_with_one_line(
        secure_stack: SecureStack, granted_keyspace: str, secure_topic: str, tmp_path: Path, refusal: Refusal) -> None:
    """Wrong password, unknown user, a server certificate from another CA, a host name the certificate does
    not name, a missing client certificate: a non-zero exit within seconds, one line saying why, no traceback."""
    assert secure_stack.certs is not None
    assert secure_stack.kafka is not None
    counters = write_definitions(tmp_path, secure_topic)
    places = {"{counters}": str(counters), "{other_ca}": str(secure_stack.certs.other_ca_cert),
              "{elsewhere}": secure_stack.kafka.elsewhere_bootstrap, "{ssl_listener}": secure_stack.kafka.ssl_bootstrap}

    def placed(value: object) -> str:
        return places.get(str(value), str(value))

    env = env_for(secure_stack, refusal.role, granted_keyspace,
                  kafka={k: placed(v) for k, v in refusal.kafka.items()},
                  cassandra={k: placed(v) for k, v in refusal.cassandra.items()})
    if refusal.kafka.get("security_protocol") == "SSL":
        for name in ("SASL_MECHANISM", "SASL_USERNAME", "SASL_PASSWORD"):
            env.pop(f"COUNTERSINK_KAFKA__{name}")
    if refusal.cassandra.get("ssl_enabled") == "false":  # a client without TLS at all, to a node with it only
        for name in ("SSL_TRUSTED_CERT", "SSL_CERT", "SSL_PRIVATE_KEY"):
            env.pop(f"COUNTERSINK_CASSANDRA__{name}", None)
    finished = await run_command(refusal.name, [placed(arg) for arg in refusal.command], env, within_s=60)
    assert finished.returncode != 0, finished.output
    assert "Traceback" not in finished.output
    assert finished.seconds < 30, f"took {finished.seconds:.0f}s: a refusal must not be retried"
    problems = finished.problem_lines()
    if refusal.cassandra.get("allow_insecure") == "true":  # the warning that insecure was allowed, as asked
        problems = [line for line in problems if '"cassandra_credentials_without_tls"' not in line]
    assert len(problems) == 1, finished.output
    assert refusal.says in problems[0], problems[0]


# --------------------------------------------------------------------------------- least privilege


async def test_a_select_only_role_serves_reads_and_cannot_write(
        secure_stack: SecureStack, granted_keyspace: str) -> None:
    """serve runs with the SELECT-only role; a write with that role is refused by Cassandra, and so are
    a schema change and a TRUNCATE of the GC's table by the consumer's role, and a read by a role never
    granted the keyspace."""
    port = free_port()
    serve = await start("serve-reader", ["serve"], env_for(
        secure_stack, "countersink_reader", granted_keyspace, serve={"host": "127.0.0.1", "port": port}))
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, f"http://127.0.0.1:{port}", serve)
            status, _, body = await https_get(http, f"http://127.0.0.1:{port}/counters/trades_count/X")
            assert status == 200, body
    finally:
        assert await serve.stop() == 0, serve.text()

    async with CassandraClient(secure_stack.cassandra_settings("countersink_reader", granted_keyspace)) as reader:
        await reader.execute("SELECT key FROM shards LIMIT 1")
        with pytest.raises(CassandraError, match="countersink_reader has no MODIFY permission"):
            await reader.execute("UPDATE shards SET states = states + ? WHERE part = ? AND key = ? AND born_us = ? "
                                 "AND mutator = ?", [{"trades_count": b"\x00"}, "X", "", 1, uuid.uuid4()])
    async with CassandraClient(secure_stack.cassandra_settings("countersink_consumer", granted_keyspace)) as consumer:
        with pytest.raises(CassandraError, match=r"countersink_consumer has no (ALTER|CREATE) permission"):
            await consumer.execute("CREATE TABLE extra (k int PRIMARY KEY)", prepared=False)
        with pytest.raises(CassandraError, match="countersink_consumer has no DROP permission"):
            await consumer.execute(f"DROP TABLE {granted_keyspace}.shards", prepared=False)
        with pytest.raises(CassandraError, match="countersink_consumer has no MODIFY permission"):
            await consumer.execute(f"TRUNCATE {granted_keyspace}.gc_runs", prepared=False)
    async with CassandraClient(secure_stack.cassandra_settings("countersink_schema", "system_auth"),
                               use_keyspace=False) as schema:
        with pytest.raises(CassandraError, match="has no SELECT permission"):
            await schema.execute("SELECT role, salted_hash FROM system_auth.roles")


async def test_serve_resets_with_its_admin_role_which_writes_only_the_resets_tables(
        secure_stack: SecureStack, granted_keyspace: str, secure_topic: str, tmp_path: Path) -> None:
    """serve reads as the SELECT-only role and resets as its admin role over TLS: an admin token's reset is
    recorded (who: the token's name) and visible to reads at once; the admin role is refused by Cassandra
    when it writes shards. The Kafka user the reset publishes with must write the topic: here the loader."""
    counters = write_definitions(tmp_path, secure_topic)
    async with CassandraClient(secure_stack.cassandra_settings("countersink_consumer", granted_keyspace)) as client:
        await CounterRegistry(client).register(load_definitions(counters), "test", KEYSPACE_GROUP)
    admin_token = "admin-token-" + uuid.uuid4().hex
    certs = secure_stack.certs
    assert certs is not None
    password = secure_stack.cassandra_roles["countersink_serve_admin"]

    async def admin_serve(name: str, kafka_user: str) -> tuple[Running, str]:
        """A serve over TLS with read and admin tokens, its resets written as countersink_serve_admin, its
        control records published as ``kafka_user``; and its base URL."""
        port = free_port()
        started = await start(name, ["serve", "--counters", str(counters)], env_for(
            secure_stack, "countersink_reader", granted_keyspace, kafka_user=kafka_user,
            serve={"host": "127.0.0.1", "port": port, "tls_cert": certs.server_cert, "tls_key": certs.server_key,
                   "tokens": TOKENS[0], "admin_tokens": f"ops:{admin_token}",
                   "admin_cassandra_username": "countersink_serve_admin", "admin_cassandra_password": password}))
        return started, f"https://localhost:{port}"

    serve, base = await admin_serve("serve-admin", "loader")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(secure_stack))) as http:
            await wait_ready(http, base, serve)
            async with http.post(base + "/counters/trades_count/reset", json={"keys": ["X"]},
                                 headers={"Authorization": f"Bearer {TOKENS[0]}"}) as answer:
                assert answer.status == 403, await answer.text()
            async with http.post(base + "/counters/trades_count/reset", json={"keys": ["X"]},
                                 headers={"Authorization": f"Bearer {admin_token}"}) as answer:
                assert answer.status == 200, await answer.text()
                done = await answer.json()
    finally:
        assert await serve.stop() == 0, serve.text()
    assert (done["requested_by"], done["keys"], done["epoch"]) == ("ops", ["X"], 1), done
    assert sorted(p["partition"] for p in done["positions"]) == [0, 1]
    async with CassandraClient(secure_stack.cassandra_settings("countersink_serve_admin", granted_keyspace)) as admin:
        with pytest.raises(CassandraError, match="countersink_serve_admin has no MODIFY permission"):
            await admin.execute("UPDATE shards SET states = states + ? WHERE part = ? AND key = ? AND born_us = ? "
                                "AND mutator = ?", [{"trades_count": b"\x00"}, "X", "", 1, uuid.uuid4()])
    assert admin_token not in serve.text()
    assert password not in serve.text()

    # A Kafka user that may not write the topic (countersink's own, which only reads): the broker refuses the
    # control record after the reset is recorded. No retry passes that: 500 without Retry-After, naming the
    # grant to add and the epoch recorded.
    serve, base = await admin_serve("serve-admin-read-only-kafka", "countersink")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls(secure_stack))) as http:
            await wait_ready(http, base, serve)
            async with http.post(base + "/counters/trades_count/reset", json={"keys": ["X"]},
                                 headers={"Authorization": f"Bearer {admin_token}", "Idempotency-Key": "k1"}
                                 ) as answer:
                assert answer.status == 500, await answer.text()
                assert "Retry-After" not in answer.headers
                problem = await answer.json()
    finally:
        assert await serve.stop() == 0, serve.text()
    assert (problem["reset"]["stage"], problem["reset"]["epoch"], problem["reset"]["published"]) == (
        "publishing", 2, 0), problem
    assert "grant it WRITE" in problem["detail"]
    assert f"epoch 2 (id {problem['reset']['id']})" in problem["detail"]
    assert "TopicAuthorizationFailedError" in serve.text()  # the reset_failed line


async def test_the_kafka_user_reads_events_and_cannot_write_them_or_make_topics(
        secure_stack: SecureStack, secure_topic: str) -> None:
    """The broker authorizes: countersink's user, with only its ACLs, is refused a write to an event topic
    and the creation of a topic other than its dead-letter topic; the loading tool's user may do both."""
    settings = secure_stack.kafka_settings("countersink")
    producer = make_producer(settings)
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(secure_topic, b'{"symbol": "X"}')
    finally:
        await producer.stop()
    other = f"not-ours-{uuid.uuid4().hex[:8]}"
    admin = make_admin(settings)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(other, 1, 1)])
        assert [(name, code) for name, code, *_ in response.topic_errors] == [(other, 29)]  # topic authorization
        assert other not in await admin.list_topics()
    finally:
        await admin.close()
    loader = secure_stack.kafka_settings("loader")
    await ensure_topics(loader, {other: 1})
    await publish(loader, other, [b'{"symbol": "X"}'])


async def test_the_kafka_user_commits_offsets_only_for_its_own_groups(
        secure_stack: SecureStack, secure_topic: str) -> None:
    """countersink's user commits offsets for a group whose id starts with its prefix, and is refused for
    any other group: it cannot move another application's offsets."""
    partition = TopicPartition(secure_topic, 0)
    settings = secure_stack.kafka_settings("countersink")
    for group, allowed in ((f"{GROUP_PREFIX}-{uuid.uuid4().hex[:8]}", True), (f"other-app-{uuid.uuid4().hex[:8]}",
                                                                             False)):
        consumer = make_consumer(settings, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([partition])
            if allowed:
                await consumer.commit({partition: 0})
            else:
                with pytest.raises(GroupAuthorizationFailedError):
                    await consumer.commit({partition: 0})
        finally:
            await consumer.stop()


# ---------------------------------------------------------------------------------- the guarded API


@dataclass
class Guarded:
    base: str
    tokens_file: Path
    running: Running
    tls: ssl.SSLContext

    def session(self, limit: int = 100) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls, limit=limit))


@pytest.fixture(scope="module")
async def guarded(secure_stack: SecureStack, granted_keyspace: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Guarded]:
    """serve over HTTPS with two tokens in a variable and one in a file, and small bounds, as the reader role."""
    assert secure_stack.certs is not None
    tokens_file = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens_file.write_text(f"# the API's tokens, one a line\n{FILE_TOKEN}\n")
    port = free_port()
    running = await start("serve-guarded", ["serve"], env_for(
        secure_stack, "countersink_reader", granted_keyspace,
        serve={"host": "127.0.0.1", "port": port, "tls_cert": secure_stack.certs.server_cert,
               "tls_key": secure_stack.certs.server_key, "tokens": ",".join(TOKENS), "tokens_file": tokens_file,
               "max_keys": 20, "max_url_bytes": 1024, "max_header_bytes": 2048, "max_body_bytes": 256,
               "max_requests": 2}))
    guarded = Guarded(f"https://127.0.0.1:{port}", tokens_file, running, client_tls(secure_stack))
    try:
        async with guarded.session() as http:
            await wait_ready(http, guarded.base, running)
        yield guarded
    finally:
        assert await running.stop() == 0, running.text()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_probes_are_open_and_everything_else_needs_a_token(guarded: Guarded) -> None:
    """/healthz and /readyz answer without a token; counters, /metrics and /openapi.json answer 401 problem
    documents without one, with a wrong one, or with another scheme."""
    async with guarded.session() as http:
        for path in ("/healthz", "/readyz"):
            status, _, body = await https_get(http, guarded.base + path)
            assert status == 200, body
        for path in ("/counters/trades_count/X", "/counters/trades_count?key=X", "/metrics", "/openapi.json"):
            for headers in ({}, _bearer("not-a-token-of-this-server"), {"Authorization": f"Basic {TOKENS[0]}"}):
                status, response_headers, body = await https_get(http, guarded.base + path, headers=headers)
                assert status == 401, (path, headers, body)
                assert response_headers["Content-Type"].startswith("application/problem+json")
                assert response_headers["WWW-Authenticate"] == 'Bearer realm="countersink"'
                assert json.loads(body)["status"] == 401


async def test_every_token_is_accepted_and_a_rotated_file_takes_effect(guarded: Guarded) -> None:
    """Both tokens of the variable and the file's token are accepted; once the file holds a new token
    instead, the new one is accepted and the removed one refused, without a restart."""
    async with guarded.session() as http:
        for token in (*TOKENS, FILE_TOKEN):
            status, _, body = await https_get(http, guarded.base + "/counters/trades_count/X", headers=_bearer(token))
            assert status == 200, body
        rotated = "file-token-rotated-" + uuid.uuid4().hex
        TOKENS.append(rotated)  # for the secrets test
        guarded.tokens_file.write_text(f"{rotated}\n")
        deadline = time.monotonic() + 10
        while True:
            new, _, _ = await https_get(http, guarded.base + "/metrics", headers=_bearer(rotated))
            old, _, _ = await https_get(http, guarded.base + "/metrics", headers=_bearer(FILE_TOKEN))
            if (new, old) == (200, 401):
                break
            assert time.monotonic() < deadline, f"rotation not seen: new token {new}, old token {old}"
            await asyncio.sleep(0.3)
        status, _, _ = await https_get(http, guarded.base + "/metrics", headers=_bearer(TOKENS[0]))
        assert status == 200


async def test_plain_http_to_the_https_port_is_not_answered(guarded: Guarded) -> None:
    """A client speaking plain HTTP to the HTTPS port gets no HTTP answer."""
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            await https_get(http, guarded.base.replace("https://", "http://") + "/healthz")


async def test_oversize_and_malformed_requests_are_refused_and_the_server_stays_up(guarded: Guarded) -> None:
    """A long request target, too many keys, a body (announced or chunked) past the limit, a long header
    line (a token in it too), a bad counter name, key or consistency, and a request line that is not HTTP
    are each refused with a 4xx problem document; the server answers normally afterwards. (The last test
    reads every line the server wrote for the tokens.)"""
    auth = _bearer(TOKENS[1])
    counters = guarded.base + "/counters/trades_count"

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"x" * 100

    async with guarded.session() as http:
        expectations: list[tuple[str, int, dict[str, object]]] = [
            (f"{counters}?key=X&pad={'p' * 1000}", 414, {}),
            (counters + "?" + "&".join(f"key=k{i}" for i in range(21)), 400, {}),
            (counters + "/X", 413, {"data": b"x" * 1000}),
            (counters + "/X", 413, {"data": chunks()}),
            (guarded.base + "/counters/bad-name!/X", 400, {}),
            (counters + "/X?consistency=SOMETIMES", 400, {}),
            (counters, 400, {}),
        ]
        for url, expected, extra in expectations:
            async with http.request("GET", url, headers=auth, **extra) as response:  # type: ignore[arg-type]
                body = await response.text()
                assert response.status == expected, (url[:80], response.status, body)
                assert response.headers["Content-Type"].startswith("application/problem+json"), body
        # Past the parser's own limits (request line, header line) the answer is its 400, as a problem document
        # that quotes nothing of the request: not the token in an oversize Authorization or Cookie header.
        oversize = [{"X-Padding": "p" * 4000}, {"Authorization": f"Bearer {TOKENS[1]}{'x' * 4000}"},
                    {**auth, "Cookie": f"session={TOKENS[1]}{'x' * 4000}"}]
        async with http.get(counters + "/" + "k" * 4000, headers=auth) as response:
            assert response.status == 400, await response.text()
            assert response.content_type == "application/problem+json"
        for headers in oversize:
            async with http.get(counters + "/X", headers={**auth, **headers}) as response:
                body = await response.text()
                assert response.status == 400, body
                assert response.content_type == "application/problem+json"
                assert TOKENS[1] not in body
        status, _, body = await https_get(http, guarded.base + "/counters/trades_count/%FF%FE", headers=auth)
        assert status in (200, 400), body

        host, port = guarded.base.removeprefix("https://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port), ssl=guarded.tls)
        writer.write(b"NOT AN HTTP REQUEST\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(400), 10)
        writer.close()
        assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer
        assert b"application/problem+json" in answer

        status, _, body = await https_get(http, counters + "/X", headers=auth)
        assert status == 200, body
    assert guarded.running.process.returncode is None


async def test_requests_past_the_limit_answer_503_at_once(guarded: Guarded) -> None:
    """With at most two requests handled at once, a burst of multi-key reads gets 503 (with Retry-After)
    for those past the limit and 200 for the others; nothing else."""
    url = guarded.base + "/counters/trades_count?" + "&".join(f"key=k{i}" for i in range(20))
    async with guarded.session(limit=40) as http:
        seen: list[int] = []
        for _ in range(10):
            # Open the connections first, so the burst's requests arrive together rather than one handshake apart.
            await asyncio.gather(*(https_get(http, guarded.base + "/healthz") for _ in range(40)))
            answers = await asyncio.gather(*(https_get(http, url, headers=_bearer(TOKENS[0])) for _ in range(40)))
            seen.extend(status for status, _, _ in answers)
            assert {status for status, _, _ in answers} <= {200, 503}, answers
            assert all(headers.get("Retry-After") == "1" for status, headers, _ in answers if status == 503)
            if 503 in seen and 200 in seen:
                break
        assert 503 in seen, seen
        assert 200 in seen, seen


# ----------------------------------------------------------------------------- what TLS is spoken


async def test_the_cassandra_driver_speaks_tls_1_3_with_cassandra(
        secure_stack: SecureStack, granted_keyspace: str) -> None:
    """Cassandra's own view of every countersink connection (system_views.clients): TLS 1.3 with an AEAD
    suite, from the driver acsylla bundles, for the version and suite docs/security.md states; with the
    node's identity checked too, by address and by name (its certificate names 127.0.0.1 and localhost)."""
    settings = secure_stack.cassandra_settings("countersink_reader", granted_keyspace, ssl_verify_identity="ip")
    async with CassandraClient(settings, app="countersink-tls-check") as reader:
        await reader.execute("SELECT key FROM shards LIMIT 1")
        async with CassandraClient(secure_stack.cassandra_settings(ADMIN_ROLE), use_keyspace=False) as admin:
            rows = as_dicts(await admin.execute(
                "SELECT username, driver_name, driver_version, ssl_enabled, ssl_protocol, ssl_cipher_suite "
                "FROM system_views.clients", prepared=False, consistency="ONE"))
    # The name 127.0.0.1 resolves back to, localhost, is in the certificate too.
    async with CassandraClient(secure_stack.cassandra_settings("countersink_reader", granted_keyspace,
                                                               ssl_verify_identity="dns")) as by_name:
        await by_name.execute("SELECT key FROM shards LIMIT 1")
    ours = [row for row in rows if row["username"] == "countersink_reader"]
    assert ours, rows
    for row in ours:
        assert row["ssl_enabled"] is True
        assert row["ssl_protocol"] == "TLSv1.3", row
        assert row["ssl_cipher_suite"] == "TLS_AES_256_GCM_SHA384", row
        assert row["driver_name"] == "Scylla Shard-Aware C/C++ Driver", row


async def test_the_storage_port_takes_only_a_certificate_of_the_stacks_authority(secure_stack: SecureStack) -> None:
    """Another node joins a cluster through the storage port, where no password is asked: a node of anyone's
    (started by any local user) joined the secured stack there, read every role's hash and made itself a
    superuser. The port speaks TLS now, and ends a connection that brings no certificate of the stack's
    authority; one that brings the node's own is kept open, waiting for internode messages."""
    import ssl

    assert secure_stack.cassandra is not None
    assert secure_stack.certs is not None
    port = secure_stack.cassandra.storage_port

    async def first_read(context: ssl.SSLContext) -> bytes | None:
        """What the node sends first after the handshake: None while it waits (the connection kept)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
        try:  # TLS 1.3 refuses a missing client certificate after the handshake: the first read says so
            return await asyncio.wait_for(reader.read(1), 3)
        except TimeoutError:
            return None
        finally:
            writer.close()

    node = ssl.create_default_context(cafile=str(secure_stack.certs.ca_cert))
    node.load_cert_chain(secure_stack.certs.server_cert, secure_stack.certs.server_key)
    assert await first_read(node) is None  # a TLS handshake (the port spoke plain before), then a wait
    anonymous = ssl.create_default_context(cafile=str(secure_stack.certs.ca_cert))
    try:
        refused = await first_read(anonymous)
    except (ssl.SSLError, ConnectionError):
        refused = b""
    assert refused == b""


# ------------------------------------------------------------------- no secret leaks (keep this last)


def _secrets(stack: SecureStack) -> list[str]:
    """Every password, token and private-key line of the stack and of these tests."""
    assert stack.certs is not None
    key_lines = [line for key in (stack.certs.server_key, stack.certs.client_key)
                 for line in key.read_text().splitlines() if line and not line.startswith("-----")]
    return [*stack.kafka_users.values(), *stack.cassandra_roles.values(), stack.admin_password, "not-the-password",
            *TOKENS, FILE_TOKEN, *key_lines, "PRIVATE KEY"]


async def test_no_secret_reaches_a_log_line_a_repr_or_a_help_text(
        secure_stack: SecureStack, granted_keyspace: str, secure_topic: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line every process of this module wrote (with DEBUG runs that log in, and one refused, added
    here), repr() and str() of the settings, and every --help: no password, SASL secret, token or key."""
    counters = write_definitions(tmp_path, secure_topic)
    debug = {"COUNTERSINK_LOG_LEVEL": "DEBUG", "COUNTERSINK_SERVE__TOKENS": ",".join(TOKENS)}
    reader = {**env_for(secure_stack, "countersink_reader", granted_keyspace), **debug}
    got = await run_command("debug-get", ["get", "trades_count", "X"], reader)
    assert got.returncode == 0, got.output
    consume = ["consume", "--counters", str(counters), "--group", KEYSPACE_GROUP]
    consumer = await start("debug-consume", consume,
                           {**env_for(secure_stack, "countersink_consumer", granted_keyspace), **debug})
    try:
        await wait_for_line(consumer, "consumer_started")
    finally:
        assert await consumer.stop() == 0, consumer.text()
    refused = await run_command("debug-refused", consume, {
        **env_for(secure_stack, "countersink_consumer", granted_keyspace, kafka={"sasl_password": "not-the-password"}),
        **debug})
    assert refused.returncode == 1, refused.output

    written = {path.name: path.read_text(errors="replace") for path in sorted(LOGS.iterdir())}
    assert len(written) >= 3
    # the SASL exchange, at DEBUG: the library's records are JSON lines like countersink's own
    assert any(_logged(text, "aiokafka.conn", "debug") for text in written.values())
    secrets = _secrets(secure_stack)
    for name, text in written.items():
        leaked = [secret[:4] + "..." for secret in secrets if secret in text]
        assert leaked == [], f"{name} holds secrets starting {leaked}"

    for key, value in reader.items():
        if key.startswith("COUNTERSINK_"):
            monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.serve.tokens is not None
    shown = repr(settings) + str(settings) + repr(settings.kafka) + repr(settings.cassandra) + repr(settings.serve)
    assert [secret for secret in secrets if secret in shown] == []

    helps = [["--help"], *([name, "--help"] for name in SUBCOMMANDS)]
    outputs = await asyncio.gather(*(run_command("help", args, reader, within_s=60) for args in helps))
    for args, finished in zip(helps, outputs, strict=True):
        assert finished.returncode == 0, finished.output
        assert [secret for secret in secrets if secret in finished.output] == [], args

