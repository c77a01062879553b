"""TLS and authentication end to end, on a secured Kafka and Cassandra (the ``secure_stack`` fixture).

Every countersink process works over TLS with a password and a role of its own; each way a connection can be
refused ends the process at once with one line saying why; the read API's tokens and bounds hold against a
real server; and no secret reaches a log line, a repr or a help text.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
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

from countersink.cassandra import CassandraClient, CassandraError
from countersink.kafka import ensure_topics, make_admin
from stack.loading import end_offsets, publish, wait_until_flushed
from stack.secure import ADMIN_ROLE, SecureStack
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    group = f"g-{uuid.uuid4().hex[:8]}"
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
    consumers = [await start(name, [*consume, "--group", f"g-{uuid.uuid4().hex[:8]}"], env)
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
    consume = ["consume", "--counters", "{counters}"]
    other_ca = "{other_ca}"
    return [
        Refusal("cassandra-wrong-password", ["get", "trades_count", "X"], "countersink_reader", {},
                {"password": "not-the-password"}, "Cassandra refused the credentials (user 'countersink_reader'"),
        Refusal("cassandra-unknown-user", ["gc", "--once", "--no-progress"], "countersink_gc", {},
                {"username": "nobody_here"}, "Cassandra refused the credentials (user 'nobody_here'"),
        Refusal("cassandra-other-ca", ["schema", "--wait", "60"], "countersink_schema", {},
                {"ssl_trusted_cert": other_ca}, "TLS with Cassandra at 127.0.0.1:"),
        Refusal("cassandra-other-ca-serve", ["serve", "--port", "0"], "countersink_reader", {},
                {"ssl_trusted_cert": other_ca}, "certificate"),
        Refusal("consume-cassandra-wrong-password", consume, "countersink_consumer", {},
                {"password": "not-the-password"}, "Cassandra refused the credentials"),
        Refusal("kafka-wrong-password", consume, "countersink_consumer", {"sasl_password": "not-the-password"}, {},
                "refused the SASL login of user 'countersink'"),
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
    finished = await run_command(refusal.name, [placed(arg) for arg in refusal.command], env, within_s=60)
    assert finished.returncode != 0, finished.output
    assert "Traceback" not in finished.output
    assert finished.seconds < 30, f"took {finished.seconds:.0f}s: a refusal must not be retried"
    problems = finished.problem_lines()
    assert len(problems) == 1, finished.output
    assert refusal.says in problems[0], problems[0]


# --------------------------------------------------------------------------------- least privilege


async def test_a_select_only_role_serves_reads_and_cannot_write(
        secure_stack: SecureStack, granted_keyspace: str) -> None:
    """serve runs with the SELECT-only role; a write with that role is refused by Cassandra, and so are
    a schema change by the consumer's role and a read by a role never granted the keyspace."""
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
        await reader.execute("SELECT counter FROM shards LIMIT 1")
        with pytest.raises(CassandraError, match="countersink_reader has no MODIFY permission"):
            await reader.execute("INSERT INTO shards (counter, key, mutator, state) VALUES (?, ?, ?, ?)",
                                 ["trades_count", "X", uuid.uuid4(), b"\x00"])
    async with CassandraClient(secure_stack.cassandra_settings("countersink_consumer", granted_keyspace)) as consumer:
        with pytest.raises(CassandraError, match=r"countersink_consumer has no (ALTER|CREATE) permission"):
            await consumer.execute("CREATE TABLE extra (k int PRIMARY KEY)", prepared=False)
        with pytest.raises(CassandraError, match="countersink_consumer has no DROP permission"):
            await consumer.execute(f"DROP TABLE {granted_keyspace}.shards", prepared=False)
    async with CassandraClient(secure_stack.cassandra_settings("countersink_schema", "system_auth"),
                               use_keyspace=False) as schema:
        with pytest.raises(CassandraError, match="has no SELECT permission"):
            await schema.execute("SELECT role, salted_hash FROM system_auth.roles")
