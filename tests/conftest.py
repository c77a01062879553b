"""Shared fixtures: real servers for the session, a fresh keyspace and topic per test.

Servers (chosen by ``tests/server_choice.py``, and named in the session header):
1. named by ``COUNTERSINK_TEST_KAFKA`` (bootstrap servers) and ``COUNTERSINK_TEST_CASSANDRA`` (host:port):
   an existing deployment; it must answer, or the session fails;
2. otherwise, when a Docker engine answers and testcontainers is installed (or ``COUNTERSINK_TEST_SERVERS=
   testcontainers``): Kafka and Cassandra containers started through testcontainers' modules;
3. otherwise (``COUNTERSINK_TEST_SERVERS=stack`` forces it) the local stack (``stack/``): Kafka and Cassandra
   from Maven artifacts as JVM processes, on ports of their own (so ``make services-up`` may run beside the
   tests). Whatever the session starts, it stops at its end.
There is no skip: an integration test without servers fails.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics, make_admin
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers
from stack.secure import SecureStack
from tests.server_choice import (
    Choice,
    ServerChoiceError,
    Servers,
    choose_servers,
    docker_engine_answers,
    testcontainers_installed,
)

TEST_STACK_DIR = servers.STACK_DIR / "test"


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    cassandra_host: str
    cassandra_port: int


_choice: list[Choice] = []


def _servers() -> Choice:
    """The session's servers, decided on first use (asking the Docker engine at most once)."""
    if not _choice:
        try:
            _choice.append(choose_servers(os.environ, docker_engine=docker_engine_answers,
                                          testcontainers=testcontainers_installed))
        except ServerChoiceError as exc:
            raise pytest.UsageError(str(exc)) from None
    return _choice[0]


def _external_endpoints() -> Endpoints | None:
    if _servers().servers is not Servers.EXTERNAL:
        return None
    kafka, cassandra = os.environ["COUNTERSINK_TEST_KAFKA"], os.environ["COUNTERSINK_TEST_CASSANDRA"]
    host, _, port = cassandra.rpartition(":")
    return Endpoints(kafka, host or cassandra, int(port or 9042))


_terminal: list[object] = []


# The session's shared servers: tests needing none of them start servers of their own, or need none.
_SHARED_SERVERS = frozenset({"local_kafka", "local_cassandra", "cassandra_cluster"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part", choices=("shared", "rest"), default=None,
        help="run only the tests needing the session's shared servers (Kafka and Cassandra, or the 3-node "
             "cluster), or only the rest: make test runs the two parts in sessions side by side (tests/suite.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = config.getoption("--part")
    if part is None:
        return
    kept, dropped = [], []
    for item in items:
        shared = bool(_SHARED_SERVERS & set(getattr(item, "fixturenames", ())))
        (kept if shared == (part == "shared") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    _terminal.append(config)


def _announce(message: str) -> None:
    """A line in the test log that capture does not swallow: servers starting and stopping."""
    config = _terminal[0] if _terminal else None
    capture = config.pluginmanager.getplugin("capturemanager") if config is not None else None  # type: ignore[attr-defined]
    if capture is None:
        servers.say(message)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n[stack] {message}", flush=True)


@pytest.fixture(scope="session")
def local_kafka() -> Iterator[servers.KafkaServer | None]:
    """The session's Kafka broker when the local stack is used (None for external servers)."""
    yield from _local_servers("kafka")


@pytest.fixture(scope="session")
def local_cassandra() -> Iterator[servers.CassandraNode | None]:
    """The session's Cassandra node when the local stack is used (None for external servers)."""
    yield from _local_servers("cassandra")


_started: dict[str, object] = {}
_started_at: list[float] = []  # when they were started (monotonic)
_ready: list[bool] = []  # both answered once


def _spawn_local_servers() -> None:
    """Start the session's Kafka and Cassandra (once), without waiting for them to answer. They are spawned from
    this, the main thread, because a server tied to its parent dies with the thread that started it."""
    if _started:
        return
    kafka = servers.KafkaServer(port=19092, controller_port=19093, root=TEST_STACK_DIR / "kafka")
    cassandra = servers.CassandraNode(
        native_port=19042, storage_port=17000, jmx_port=17199, seeds="127.0.0.1:17000",
        cluster_name="countersink-test", root=TEST_STACK_DIR / "cassandra",
    )
    _started.update(kafka=kafka, cassandra=cassandra)
    _started_at.append(time.monotonic())
    try:
        kafka.start(tied_to_parent=True, wait=False)
        cassandra.start(tied_to_parent=True, wait=False)
    except BaseException:
        servers.stop_together((kafka, cassandra))
        _started.clear()
        _started_at.clear()
        raise


# Servers of session fixtures started when collection ends, not waited for: fixture name -> (what was started,
# when). The fixture finishes the start on first use; pytest_sessionfinish stops any never used.
_early: dict[str, tuple[Any, float]] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """The servers the session's tests need boot while the tests needing none of them run (in a session of every
    test, the unit tests, collected first: ``testpaths``; ``make test`` runs the two ``--part``s side by side,
    ``tests/suite.py``): each Cassandra takes tens of seconds to answer, and the first test needing one then
    waits only for what is left of that. From this, the main thread: a server tied to its parent dies with the
    thread that started it. A server that fails to start here is started again by its fixture, which fails only
    the tests needing it."""
    if session.config.option.collectonly:
        return
    needed = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    if {"local_kafka", "local_cassandra"} & needed and _servers().servers is Servers.LOCAL_STACK:
        _spawn_local_servers()
        _announce("kafka and cassandra starting while the tests that need no server run")
    if "secure_stack" in needed and not os.environ.get("COUNTERSINK_TEST_SECURE_STACK"):
        stack = _new_secure_stack()
        _spawn_early("secure_stack", stack, stack.spawn, "secured kafka and cassandra")
    if "cassandra_cluster" in needed:
        cluster = _new_cluster()
        _spawn_early("cassandra_cluster", cluster, cluster.spawn_seed, "the 3-node cluster's seed")


_next_look: list[float] = [0.0]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The early cluster's other nodes start once its seed listens: looked at before a test, once a second at
    most, until they are started."""
    early = _early.get("cassandra_cluster")
    if early is None or time.monotonic() < _next_look[0]:
        return
    _next_look[0] = time.monotonic() + 1.0
    cluster = early[0]
    try:
        if cluster.spawn_others_once_the_seed_listens(tied_to_parent=True):
            _next_look[0] = float("inf")
    except Exception as exc:  # the fixture starts what is missing, and its tests fail with the error
        _next_look[0] = float("inf")
        _announce(f"the 3-node cluster's other nodes did not start early: {exc}")


def _spawn_early(fixture: str, server: Any, spawn: Callable[..., None], what: str) -> None:
    started = time.monotonic()
    try:
        spawn(tied_to_parent=True)
    except Exception as exc:  # the fixture starts it again, and its tests fail with the error
        server.stop()
        _announce(f"{what} did not start early: {exc}")
        return
    _early[fixture] = (server, started)
    _announce(f"{what} starting")


def _local_servers(which: str) -> Iterator[object]:
    """The session's local server ``which``, both started and answering (started now if they were not yet);
    stopped at session end."""
    if _servers().servers is not Servers.LOCAL_STACK:
        yield None
        return
    if not _ready:
        _spawn_local_servers()
        kafka, cassandra = _started["kafka"], _started["cassandra"]
        assert isinstance(kafka, servers.KafkaServer)
        assert isinstance(cassandra, servers.CassandraNode)
        try:
            kafka.wait_ready()
            seconds = time.monotonic() - _started_at[0]
            _announce(f"kafka {servers.KAFKA_VERSION} ready on {kafka.bootstrap} {seconds:.1f}s after its start")
            cassandra.wait_ready()
            _announce(f"cassandra {servers.CASSANDRA_VERSION} ready on 127.0.0.1:{cassandra.native_port} "
                      f"{time.monotonic() - _started_at[0]:.1f}s after its start")
        except BaseException:
            # stopped and waited for: a later test starts them again on the same ports
            servers.stop_together((kafka, cassandra))
            _started.clear()
            _started_at.clear()
            raise
        _ready.append(True)
    yield _started[which]


@pytest.fixture(scope="session", autouse=True)
def _stop_local_servers() -> Iterator[None]:
    """Whatever the session started, it stops, however the tests ended."""
    yield
    _stop_started()
    _container_endpoints_found.clear()


# Servers whose session fixtures have ended, told to stop (SIGTERM) and waited for when the session finishes: they
# drain side by side (a Cassandra node takes about 5 s) instead of one fixture after another.
_stopping: list[tuple[Any, str]] = []


def _stop_at_session_end(server: Any, request_stop: Callable[[], None] | None, what: str) -> None:
    """``request_stop`` now (SIGTERM), ``server.stop()`` when the session finishes. None: the SIGTERM goes to the
    server's own process, if it has one by then."""
    if request_stop is not None:
        request_stop()
    else:
        servers.request_stop_all([server])
    _stopping.append((server, what))


def pytest_sessionfinish() -> None:
    """The servers of the session's fixtures stopped, and those spawned for tests that never ran (the session
    stopped before them)."""
    _stop_started()
    for server, what in _early.values():
        _stop_at_session_end(server, server.request_stop, what)
    _early.clear()
    for server, what in _stopping:
        server.stop()
        _announce(f"{what} stopped")
    _stopping.clear()


def _stop_started() -> None:
    if not _started:
        return
    for name, server in _started.items():
        _stop_at_session_end(server, None, name)
    _started.clear()
    _ready.clear()
    _started_at.clear()


@pytest.fixture(scope="session")
def endpoints(local_kafka: servers.KafkaServer | None, local_cassandra: servers.CassandraNode | None) -> Endpoints:
    external = _external_endpoints()
    if external is not None:
        if not servers.KafkaServer.answers_at(external.kafka_bootstrap):
            pytest.fail(f"COUNTERSINK_TEST_KAFKA={external.kafka_bootstrap} does not answer")
        if not servers.probe_cassandra(external.cassandra_host, external.cassandra_port):
            pytest.fail(f"COUNTERSINK_TEST_CASSANDRA={external.cassandra_host}:{external.cassandra_port} is silent")
        return external
    if _servers().servers is Servers.TESTCONTAINERS:
        return _container_endpoints()
    assert local_kafka is not None
    assert local_cassandra is not None
    return Endpoints(local_kafka.bootstrap, local_cassandra.address, local_cassandra.native_port)


_container_endpoints_found: list[Endpoints] = []


def _container_endpoints() -> Endpoints:
    """Start the Kafka and Cassandra containers (once); ``_stop_local_servers`` removes them."""
    if not _container_endpoints_found:
        from tests.containers import KAFKA_IMAGE, Containers  # testcontainers is only installed with [docker]

        containers = Containers()
        _started["containers"] = containers
        started = time.monotonic()
        kafka, host, port = containers.start()
        _container_endpoints_found.append(Endpoints(kafka, host, port))
        _announce(f"containers ready in {time.monotonic() - started:.1f}s: {KAFKA_IMAGE} on {kafka}, "
                  f"cassandra on {host}:{port}")
    return _container_endpoints_found[0]


@pytest.fixture(scope="session")
def kafka_settings(endpoints: Endpoints) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=[endpoints.kafka_bootstrap], client_id="countersink-test")


@pytest.fixture(scope="session")
def base_cassandra_settings(endpoints: Endpoints) -> CassandraSettings:
    return CassandraSettings(contact_points=[endpoints.cassandra_host], port=endpoints.cassandra_port)


@pytest.fixture
async def keyspace_factory(
    base_cassandra_settings: CassandraSettings,
) -> AsyncIterator[Callable[..., Awaitable[CassandraSettings]]]:
    """Creates fresh keyspaces with countersink's schema; drops them after the test."""
    created: list[str] = []

    async def make(replication: str | None = None) -> CassandraSettings:
        name = f"t_{uuid.uuid4().hex[:12]}"
        settings = base_cassandra_settings.model_copy(update={"keyspace": name})
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.ensure_schema(replication)
        created.append(name)
        return settings

    yield make
    async with CassandraClient(base_cassandra_settings, use_keyspace=False) as client:
        for name in created:
            await client.execute(f"DROP KEYSPACE IF EXISTS {name}", prepared=False)


@pytest.fixture
async def cassandra_settings(keyspace_factory: Callable[..., Awaitable[CassandraSettings]]) -> CassandraSettings:
    """Settings naming a fresh keyspace with the schema in place."""
    return await keyspace_factory()


@pytest.fixture
async def topic_factory(kafka_settings: KafkaSettings) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Creates fresh topics (name, partitions, topic settings such as cleanup.policy); deletes them after the
    test."""
    created: list[str] = []

    async def make(prefix: str = "events", partitions: int = 3, configs: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        await ensure_topics(kafka_settings, {name: partitions}, configs={name: configs or {}})
        created.append(name)
        return name

    yield make
    if created:
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            await admin.delete_topics(created)
        finally:
            await admin.close()


def _new_cluster() -> servers.CassandraCluster:
    cluster = servers.CassandraCluster(native_port=19142, storage_port=17100, root=TEST_STACK_DIR / "cluster")
    for i, node in enumerate(cluster.nodes):
        node.jmx_port = 17300 + i
    return cluster


@pytest.fixture(scope="session")
def cassandra_cluster() -> Iterator[servers.CassandraCluster]:
    """Three Cassandra nodes on 127.0.0.1-3 (CQL port 19142), for replication tests; started when collection
    ends (the seed, then the others once it listens) and ready on first use."""
    cluster, started = _early.pop("cassandra_cluster", None) or (_new_cluster(), time.monotonic())
    try:
        cluster.start(tied_to_parent=True)
        _announce(f"3-node cassandra cluster ready on 127.0.0.1-3:{cluster.native_port} "
                  f"{time.monotonic() - started:.1f}s after its start")
        yield cluster
    finally:
        _stop_at_session_end(cluster, cluster.request_stop, "3-node cassandra cluster")


@pytest.fixture(scope="session")
def schema_registry_url() -> Iterator[str]:
    """The Confluent-compatible API of a real schema registry: the one ``COUNTERSINK_TEST_SCHEMA_REGISTRY``
    names (a URL), else Apicurio Registry from the local stack, started on first use (port 18481) and stopped
    at the end of the session, whatever servers the other tests use."""
    running = os.environ.get("COUNTERSINK_TEST_SCHEMA_REGISTRY")
    if running:
        if not servers.schema_registry_answers(running):
            pytest.fail(f"COUNTERSINK_TEST_SCHEMA_REGISTRY={running} does not answer")
        yield running
        return
    registry = servers.SchemaRegistryServer(port=18481, root=TEST_STACK_DIR / "schema-registry")
    try:
        seconds = registry.start(tied_to_parent=True)
        _announce(f"schema registry (Apicurio {servers.SCHEMA_REGISTRY_VERSION}) ready on {registry.url} "
                  f"in {seconds:.1f}s")
        yield registry.url
    finally:
        _stop_at_session_end(registry, None, "schema registry")


@pytest.fixture
def private_schema_registry() -> Iterator[servers.SchemaRegistryServer]:
    """A schema registry of the test's own (port 18482), which the test may stop and start again."""
    registry = servers.SchemaRegistryServer(port=18482, root=TEST_STACK_DIR / "schema-registry-private")
    try:
        registry.start(tied_to_parent=True)
        yield registry
    finally:
        registry.stop()


def _new_secure_stack() -> SecureStack:
    return SecureStack(root=TEST_STACK_DIR / "secure", kafka_port=21092, kafka_ssl_port=21093,
                       kafka_controller_port=21094, kafka_elsewhere_port=21095, cassandra_port=21042,
                       cassandra_storage_port=21000, cassandra_jmx_port=21199)


@pytest.fixture(scope="session")
def secure_stack() -> Iterator[SecureStack]:
    """One TLS-only Kafka (SASL_SSL 21092, SSL 21093) and one TLS-only Cassandra with password roles (21042),
    with fresh certificates, users and roles; started when collection ends and ready (ACLs, roles) on first
    use, whatever servers the other tests use
    (or the running one whose stack.json ``COUNTERSINK_TEST_SECURE_STACK`` names)."""
    running = os.environ.get("COUNTERSINK_TEST_SECURE_STACK")  # stack.json of `python -m stack up --secure`
    if running:
        yield SecureStack.attach(Path(running))
        return
    early = _early.pop("secure_stack", None)
    stack, started = early or (_new_secure_stack(), time.monotonic())
    try:
        if early:
            stack.finish_start()
        else:
            # From this, the main thread: a server tied to its parent dies with the thread that started it.
            stack.start(tied_to_parent=True)
        _announce(f"secured kafka and cassandra ready on 127.0.0.1:21092/21093 and :21042 "
                  f"{time.monotonic() - started:.1f}s after their start")
        yield stack
    finally:
        _stop_at_session_end(stack, stack.request_stop, "secured kafka and cassandra")


def pytest_report_header(config: pytest.Config) -> str:
    choice = _servers()
    external = _external_endpoints()
    if external:
        cassandra = f"{external.cassandra_host}:{external.cassandra_port}"
        return f"servers: external kafka={external.kafka_bootstrap} cassandra={cassandra} ({choice.reason})"
    if choice.servers is Servers.TESTCONTAINERS:
        from tests.containers import CASSANDRA_IMAGE, KAFKA_IMAGE

        return f"servers: testcontainers ({KAFKA_IMAGE}, {CASSANDRA_IMAGE}; {choice.reason})"
    versions = f"kafka {servers.KAFKA_VERSION}, cassandra {servers.CASSANDRA_VERSION}"
    return f"servers: local stack ({versions}) in {Path(TEST_STACK_DIR)} ({choice.reason})"
