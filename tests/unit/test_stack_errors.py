"""The local stack refuses to start with one clear line when the machine is not ready for it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from stack import servers


def test_taken_port_is_named() -> None:
    """A port something already listens on stops the start with a one-line error naming it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(servers.StackError, match=rf"port 127.0.0.1:{port} for Kafka is already taken"):
            servers.check_port_free("127.0.0.1", port, "Kafka")


def test_a_port_in_the_client_range_is_warned_of(capfd: pytest.CaptureFixture[str]) -> None:
    """A server port among the ports clients are given locally is started with a warning naming the range; a
    port below it is not."""
    clients = servers.ephemeral_ports()
    servers.check_port_free("127.0.0.1", servers.free_port(), "Kafka")
    assert "warning" not in capfd.readouterr().err
    with socket.socket() as held:  # a free port inside the range: bound by this test, not listening
        held.bind(("127.0.0.1", 0))
        inside = held.getsockname()[1]
        assert inside in clients
        servers.check_port_free("127.0.0.1", inside, "Kafka")
    err = capfd.readouterr().err
    assert f"warning: port {inside} for Kafka is in this machine's range of client ports " \
           f"({clients.start}-{clients.stop - 1})" in err


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a java executable the error says Java 17 is required."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(servers.StackError, match="Java 17 is required"):
        servers.check_java()


def test_wrong_java_version_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Java other than 17 is refused with the version found."""
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'openjdk version "21.0.2" 2024-01-16\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(servers.StackError, match="is Java 21"):
        servers.check_java()


def test_missing_maven_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Resolving jars for a version not in the cache without Maven says Maven is required."""
    monkeypatch.setattr(servers, "CACHE_DIR", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(servers.StackError, match="Maven is required"):
        servers.resolve_jars("kafka", "0.0.0-missing")


def test_kraft_cluster_ids_never_look_like_options() -> None:
    """Cluster ids are 22 URL-safe characters and never begin with '-', which the storage tool would
    parse as an option (about one random id in 64 would)."""
    ids = [servers.kraft_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
