"""Which Kafka and Cassandra the test session uses, decided once, before any test runs.

1. ``COUNTERSINK_TEST_KAFKA`` and ``COUNTERSINK_TEST_CASSANDRA`` name running servers: those (``external``).
2. Otherwise ``COUNTERSINK_TEST_SERVERS`` says how to start them: ``testcontainers`` (Docker containers, through
   testcontainers' Kafka and Cassandra modules), ``stack`` (the local JVM stack of ``stack/``), or ``auto``, the
   default: containers when a Docker engine answers and testcontainers is installed (``pip install -e
   '.[dev,docker]'``), the local stack otherwise.

The choice and its reason are printed in the session header. Pure apart from :func:`docker_engine_answers`
and :func:`testcontainers_installed`, which the caller passes in, so the decision is unit-tested by a table.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
from collections.abc import Callable, Mapping
from enum import StrEnum
from urllib.parse import urlparse


class Servers(StrEnum):
    EXTERNAL = "external"
    TESTCONTAINERS = "testcontainers"
    LOCAL_STACK = "local stack"


class ServerChoiceError(Exception):
    """Raised when the variables contradict each other or ask for what cannot be had."""


@dataclasses.dataclass(frozen=True)
class Choice:
    servers: Servers
    reason: str


def choose_servers(env: Mapping[str, str], *, docker_engine: Callable[[], bool],
                   testcontainers: Callable[[], bool]) -> Choice:
    """The servers the session uses, from the environment and whether an engine answers (asked only when the
    environment leaves it open)."""
    kafka, cassandra = env.get("COUNTERSINK_TEST_KAFKA"), env.get("COUNTERSINK_TEST_CASSANDRA")
    if kafka or cassandra:
        if not (kafka and cassandra):
            raise ServerChoiceError("set both COUNTERSINK_TEST_KAFKA and COUNTERSINK_TEST_CASSANDRA, or neither")
        return Choice(Servers.EXTERNAL, "COUNTERSINK_TEST_KAFKA and COUNTERSINK_TEST_CASSANDRA are set")
    asked = env.get("COUNTERSINK_TEST_SERVERS", "auto").strip().lower() or "auto"
    if asked == "stack":
        return Choice(Servers.LOCAL_STACK, "COUNTERSINK_TEST_SERVERS=stack")
    if asked == "testcontainers":
        if not testcontainers():
            raise ServerChoiceError("COUNTERSINK_TEST_SERVERS=testcontainers, but testcontainers is not installed: "
                                    "pip install -e '.[dev,docker]'")
        return Choice(Servers.TESTCONTAINERS, "COUNTERSINK_TEST_SERVERS=testcontainers")
    if asked != "auto":
        raise ServerChoiceError(f"COUNTERSINK_TEST_SERVERS={asked!r}: use auto, stack or testcontainers")
    if not docker_engine():
        return Choice(Servers.LOCAL_STACK, "no Docker engine answers")
    if not testcontainers():
        return Choice(Servers.LOCAL_STACK, "a Docker engine answers, but testcontainers is not installed")
    return Choice(Servers.TESTCONTAINERS, "a Docker engine answers")


def docker_engine_answers(env: Mapping[str, str] = os.environ, timeout_s: float = 1.0) -> bool:
    """True when the engine at DOCKER_HOST (or the default socket) answers its ping endpoint."""
    host = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    url = urlparse(host)
    try:
        if url.scheme == "unix":
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(timeout_s)
            client.connect(url.path)
        elif url.scheme in ("tcp", "http"):
            client = socket.create_connection((url.hostname or "127.0.0.1", url.port or 2375), timeout=timeout_s)
        else:
            return False  # ssh:// and others: let testcontainers be asked for explicitly
        with client:
            client.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            answer = client.recv(64)
    except OSError:
        return False
    return answer.startswith(b"HTTP/1.") and b" 200 " in answer


def testcontainers_installed() -> bool:
    return importlib.util.find_spec("testcontainers") is not None
