"""The test session's choice of servers: external ones when named, containers when an engine answers and
testcontainers is installed (or when asked for), the local JVM stack otherwise."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.servers import free_port
from tests.server_choice import ServerChoiceError, Servers, choose_servers, docker_engine_answers

EXTERNAL = {"COUNTERSINK_TEST_KAFKA": "127.0.0.1:9092", "COUNTERSINK_TEST_CASSANDRA": "127.0.0.1:9042"}


@pytest.mark.parametrize(("env", "engine", "installed", "expected"), [
    (EXTERNAL, True, True, Servers.EXTERNAL),
    ({**EXTERNAL, "COUNTERSINK_TEST_SERVERS": "testcontainers"}, True, True, Servers.EXTERNAL),
    ({}, False, True, Servers.LOCAL_STACK),
    ({}, False, False, Servers.LOCAL_STACK),
    ({}, True, False, Servers.LOCAL_STACK),
    ({}, True, True, Servers.TESTCONTAINERS),
    ({"COUNTERSINK_TEST_SERVERS": "auto"}, True, True, Servers.TESTCONTAINERS),
    ({"COUNTERSINK_TEST_SERVERS": ""}, False, True, Servers.LOCAL_STACK),
    ({"COUNTERSINK_TEST_SERVERS": "stack"}, True, True, Servers.LOCAL_STACK),
    ({"COUNTERSINK_TEST_SERVERS": "testcontainers"}, False, True, Servers.TESTCONTAINERS),
    ({"COUNTERSINK_TEST_SERVERS": "TestContainers"}, True, True, Servers.TESTCONTAINERS),
])
def test_choice_table(env: dict[str, str], engine: bool, installed: bool, expected: Servers) -> None:
    """Each combination of variables, engine and installed module picks the servers the table says."""
    choice = choose_servers(env, docker_engine=lambda: engine, testcontainers=lambda: installed)
    assert choice.servers is expected
    assert choice.reason


def test_the_engine_is_not_asked_when_the_variables_decide() -> None:
    """Named servers or an explicit choice never probe the Docker engine (no delay, no surprise)."""
    def probe() -> bool:
        raise AssertionError("asked the engine")

    for env in (EXTERNAL, {"COUNTERSINK_TEST_SERVERS": "stack"}, {"COUNTERSINK_TEST_SERVERS": "testcontainers"}):
        choose_servers(env, docker_engine=probe, testcontainers=lambda: True)


@pytest.mark.parametrize(("env", "installed", "message"), [
    ({"COUNTERSINK_TEST_KAFKA": "127.0.0.1:9092"}, True, "set both"),
    ({"COUNTERSINK_TEST_CASSANDRA": "127.0.0.1:9042"}, True, "set both"),
    ({"COUNTERSINK_TEST_SERVERS": "podman"}, True, "use auto, stack or testcontainers"),
    ({"COUNTERSINK_TEST_SERVERS": "testcontainers"}, False, "not installed"),
])
def test_contradictions_are_refused(env: dict[str, str], installed: bool, message: str) -> None:
    """Half-named servers, an unknown choice, or containers without the module end the session at once."""
    with pytest.raises(ServerChoiceError, match=message):
        choose_servers(env, docker_engine=lambda: True, testcontainers=lambda: installed)


@pytest.fixture
def fake_engine(tmp_path: Path) -> Iterator[tuple[str, list[bytes]]]:
    """A Unix socket that answers one request the way a Docker engine answers /_ping, recording it."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    requests: list[bytes] = []

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            requests.append(connection.recv(1024))
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"unix://{path}", requests
    thread.join(timeout=5)
    server.close()


def test_an_engine_that_answers_its_ping_is_found(fake_engine: tuple[str, list[bytes]]) -> None:
    """docker_engine_answers pings DOCKER_HOST and accepts a 200 answer."""
    host, requests = fake_engine
    assert docker_engine_answers({"DOCKER_HOST": host})
    assert requests[0].startswith(b"GET /_ping ")


def test_no_engine_means_no_containers(tmp_path: Path) -> None:
    """A missing socket, a closed TCP port or an unsupported scheme is no engine (as on these machines)."""
    closed_port = free_port()
    assert not docker_engine_answers({"DOCKER_HOST": f"unix://{tmp_path / 'none.sock'}"})
    assert not docker_engine_answers({"DOCKER_HOST": f"tcp://127.0.0.1:{closed_port}"})
    assert not docker_engine_answers({"DOCKER_HOST": "ssh://user@host"})
