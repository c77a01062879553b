"""The local stack refuses to start with one clear line when the machine is not ready for it."""

from __future__ import annotations

import os
import socket
import time
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


def test_servers_stopped_together_are_all_told_before_any_is_waited_for(tmp_path: Path) -> None:
    """``stop_together`` sends every server its SIGTERM before waiting for the first to exit, so servers that
    take a while to drain drain side by side: each of these writes when it is told and when it exits, half a
    second later, and every 'told' comes before any 'exited'. Each is gone afterwards."""
    journal = tmp_path / "journal"
    script = (f'trap \'echo told $0 >> {journal}; sleep 0.5; echo exited $0 >> {journal}; exit 0\' TERM; '
              f'echo up $0 >> {journal}; while :; do sleep 0.05; done')

    class Server:
        def __init__(self, name: str) -> None:
            self.process: servers.JvmProcess | None = servers.JvmProcess(
                name, ["sh", "-c", script, name], tmp_path, tmp_path / f"{name}.log")

        def stop(self) -> None:
            assert self.process is not None
            self.process.stop(timeout=10)

    started = [Server(name) for name in ("a", "b", "c")]
    for server in started:
        assert server.process is not None
        server.process.start(tied_to_parent=True)
    deadline = time.monotonic() + 10
    while not (journal.exists() and journal.read_text().count("up ") == 3):
        assert time.monotonic() < deadline, "the stand-in servers did not start"
        time.sleep(0.05)
    pids = [server.process.pid for server in started if server.process is not None]
    servers.stop_together([*started, None])
    events = [line.split()[0] for line in journal.read_text().splitlines() if not line.startswith("up")]
    assert events == ["told"] * 3 + ["exited"] * 3
    assert all(server.process is not None and server.process.pid is None for server in started)
    assert not any(servers._pid_alive(pid) for pid in pids if pid is not None)


@pytest.mark.parametrize("first_exits", [None, 1])
def test_acl_tools_still_running_are_stopped_when_one_fails_or_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_exits: int | None
) -> None:
    """The broker's ACL tool runs once per ACL, all at once: when the first fails (exit 1) or does not finish in
    time, the others (here still sleeping) are stopped before the error is raised, not left running orphaned."""
    import subprocess

    from stack import secure

    tool = tmp_path / "java"
    # The first call started exits at once (or sleeps, for the timeout); every other one sleeps a minute. (Told
    # by its environment: which of the processes started together runs first is the scheduler's choice.)
    tool.write_text('#!/bin/sh\nif [ "$FIRST_STARTED" = 1 ]; then '
                    + ("sleep 60" if first_exits is None else f"exit {first_exits}") + "; fi\nsleep 60\n")
    tool.chmod(0o755)
    monkeypatch.setattr(secure, "check_java", lambda: str(tool))
    monkeypatch.setattr(secure, "resolve_jars", lambda *args, **kwargs: tmp_path)
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        environment = dict(kwargs.get("env") or os.environ)  # type: ignore[call-overload]
        kwargs["env"] = {**environment, "FIRST_STARTED": "1" if not started else "0"}
        process = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process  # type: ignore[no-any-return]

    monkeypatch.setattr(secure.subprocess, "Popen", recording)
    broker = secure.SecureKafkaServer(root=tmp_path / "kafka", certs=secure.make_certificates(tmp_path / "certs"))
    broker.root.mkdir(parents=True)
    message = "did not finish within" if first_exits is None else "kafka-acls failed"
    with pytest.raises(servers.StackError, match=message):
        broker.grant_acls(timeout=1.0)
    assert len(started) > 1
    assert all(process.poll() is not None for process in started)
