"""A newcomer's first hour on real servers: the README's quickstart as written, publishing, topic creation,
and a consumer whose topics do not exist yet."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from countersink.kafka import make_admin
from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env
from stack.servers import free_port
from tests.docblocks import doc_block

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUICKSTART_TOPIC = "quickstart-trades"


def quickstart_commands() -> list[str]:
    """The shell commands of the README's quickstart block, in order (comments kept: they state outputs)."""
    block = doc_block("README.md", "quickstart")
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A background process writing to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
    except OSError:
        return 0, ""


async def delete_topics(kafka: KafkaSettings, *topics: str) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        present = set(await admin.list_topics())
        if gone := [t for t in topics if t in present]:
            await admin.delete_topics(gone)
            for _ in range(150):  # deletion is asynchronous in the broker: until the names are gone
                if not set(await admin.list_topics()) & set(gone):
                    break
                await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def test_the_quickstart_as_written_counts_the_events(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """Every command of the README's quickstart runs as written and the last prints the value it promises.

    ``make services-up`` is the one line not run: the servers are the test session's. The others run in
    the repository with the environment pointing at those servers, a fresh keyspace and consumer group."""
    commands = quickstart_commands()
    assert commands[0].startswith("make services-up")
    await delete_topics(kafka_settings, QUICKSTART_TOPIC)  # a topic left by an earlier run holds its events
    env = child_env(kafka_settings, cassandra_settings,
                    consumer={"group_id": f"quickstart-{uuid.uuid4().hex[:8]}", "health_port": 0})
    env["COUNTERSINK_LOG_FORMAT"] = "console"
    background: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "background.log"
    checked = []
    try:
        for line in commands[1:]:
            command, _, comment = line.partition("  #")
            command = command.strip()
            if command == "kill %1":
                background[0].send_signal(signal.SIGTERM)
                assert background[0].wait(60) == 0, log.read_text()
                continue
            if command.endswith("&"):
                # Its stderr redirection (2> FILE) goes to the test's own log instead.
                words = shlex.split(command[:-1])
                if "2>" in words:
                    del words[words.index("2>"):words.index("2>") + 2]
                background.append(spawn(words, env, log))
                continue
            expected = comment.strip().removeprefix("prints: ").strip() if "prints:" in comment else None
            deadline = time.monotonic() + 90
            while True:
                done = await asyncio.to_thread(subprocess.run, shlex.split(command), cwd=REPO, env=env,
                                               capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
                if expected is None or done.stdout.strip() == expected:
                    break
                # The consumer counts within a flush interval of joining its group: ask again until then.
                assert time.monotonic() < deadline, f"{command} printed {done.stdout!r}, not {expected!r}"
                assert all(p.poll() is None for p in background), log.read_text()
                await asyncio.sleep(1)
            if expected is not None:
                checked.append((command, expected))
        assert checked, "the quickstart states no value to check"
        assert any("get shares_bought IBM" in command for command, _ in checked)
    finally:
        for process in background:
            if process.poll() is None:
                process.kill()
                process.wait()
        await delete_topics(kafka_settings, QUICKSTART_TOPIC)


async def test_a_consumer_waits_unready_for_missing_topics_then_counts(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """A consumer whose topic does not exist says so, answers /readyz 503 naming it, and starts once it exists;
    a SIGTERM then stops it with exit 0 and no unclosed client."""
    topic = f"late-{uuid.uuid4().hex[:10]}"
    counters = tmp_path / "counters.toml"
    counters.write_text(f'[[counter]]\nname = "hits"\ntopics = ["{topic}"]\nkind = "count"\nkey = "page"\n')
    port = free_port()
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": port, "group_id": topic})
    log = tmp_path / "consumer.log"
    process = spawn([sys.executable, "-m", "countersink.cli", "consume", "--counters", str(counters)], env, log)
    try:
        deadline = time.monotonic() + 60
        # Waiting for its servers to answer until it has asked the broker for its topics.
        waiting = (503, f"not ready: waiting for topics: {topic}")
        while True:
            status, body = await asyncio.to_thread(readyz, port)
            if (status, body.strip()) == waiting:
                break
            before = ((0, ""), (503, "not ready: waiting for Cassandra to answer\n"),
                      (503, "not ready: waiting for Kafka to answer\n"))
            assert (status, body) in before, (status, body)  # 0: not listening yet
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{status} {body}\n{log.read_text()}"
            await asyncio.sleep(0.3)
        assert '"topics_missing"' in log.read_text()
        created = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "topics",
                                          "create", topic, "--partitions", "2"], cwd=REPO, env=env,
                                          capture_output=True, text=True, timeout=60)
        assert created.stdout.strip() == f"created {topic} (2 partitions)", created.stderr
        published = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "publish",
                                            topic, "--key", "page"], input='{"page": "home"}\n' * 3, cwd=REPO,
                                            env=env, capture_output=True, text=True, timeout=60)
        assert published.stdout.strip() == f"published 3 records to {topic}", published.stderr
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(readyz, port))[0] != 200:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.5)
        while True:
            got = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "get", "hits",
                                          "home"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            if got.stdout.strip() == "hits 'home': 3":
                break
            assert time.monotonic() < deadline + 30, got.stdout + got.stderr
            await asyncio.sleep(1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
        text = log.read_text()
        assert "Unclosed" not in text
        assert "Traceback" not in text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await delete_topics(kafka_settings, topic)


async def test_a_consumer_told_to_create_topics_creates_them(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """``consume --create-topics`` creates a missing topic with topic_partitions partitions and joins it."""
    topic = f"made-{uuid.uuid4().hex[:10]}"
    counters = tmp_path / "counters.toml"
    counters.write_text(f'[[counter]]\nname = "hits"\ntopics = ["{topic}"]\nkind = "count"\n')
    env = child_env(kafka_settings, cassandra_settings,
                    consumer={"health_port": 0, "group_id": topic, "topic_partitions": 4})
    log = tmp_path / "consumer.log"
    process = spawn([sys.executable, "-m", "countersink.cli", "consume", "--counters", str(counters),
                     "--create-topics"], env, log)
    try:
        deadline = time.monotonic() + 90
        while '"consumer_started"' not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.3)
        assert '"topics_created"' in log.read_text()
        admin = make_admin(kafka_settings)
        await admin.start()
        try:
            described = await admin.describe_topics([topic])
        finally:
            await admin.close()
        assert len(described[0]["partitions"]) == 4
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await delete_topics(kafka_settings, topic)


async def test_publish_stops_at_a_bad_line_naming_it(
        kafka_settings: KafkaSettings, topic_factory: Callable[..., Awaitable[str]]) -> None:
    """``publish`` sends the lines before a bad one, then exits 2 naming the line and why."""
    topic = await topic_factory("publish")
    env = {**os.environ, "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka_settings.bootstrap_servers),
           "COUNTERSINK_LOG_FORMAT": "json"}
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "publish", topic,
                                   "--key", "id"], input='{"id": 1}\n\n\ufeff\n{"id": 2}\n{"name": "x"}\n{"id": 3}\n',
                                   cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert '"line": 5' in done.stderr  # a line of a byte-order mark alone is an empty line (it stopped the run)
    assert "no field 'id' for the key" in done.stderr
    assert '"published_before": 2' in done.stderr


async def test_publish_refused_by_kafka_or_interrupted_says_what_was_published(
        kafka_settings: KafkaSettings, topic_factory: Callable[..., Awaitable[str]]) -> None:
    """A record Kafka refuses (a time two hours ahead of the broker's clock) ends ``publish`` with exit 1 naming
    the line and how many records were published (it said neither, and the records of the refused one's request
    were not sent); Ctrl-C while it waits on standard input ends it at once, saying what was published (it waited
    for the next line)."""
    import json

    from stack.loading import end_offsets

    topic = await topic_factory("publish", partitions=1)
    env = {**os.environ, "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka_settings.bootstrap_servers),
           "COUNTERSINK_LOG_FORMAT": "json"}
    ahead = int(time.time() * 1000) + 2 * 3600 * 1000
    lines = "".join(json.dumps({"id": i, "at": ahead if i == 6 else int(time.time() * 1000)}) + "\n"
                    for i in range(1, 12))
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "publish", topic,
                                   "--timestamp", "at"], input=lines, cwd=REPO, env=env, capture_output=True,
                                   text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    (failed,) = [json.loads(line) for line in done.stderr.splitlines() if '"publish_failed"' in line]
    assert "InvalidTimestampError" in failed["error"]
    published = sum((await end_offsets(kafka_settings, {topic: 1})).values())
    assert published < 6  # line 6 at least was not, nor the lines of its request
    assert failed["published"] == published
    assert failed["first_line_not_published"] == published + 1  # one partition: the lines before are all in

    waiting = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "countersink.cli", "publish", topic, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=env)
    try:
        assert waiting.stdin is not None
        assert waiting.stderr is not None
        waiting.stdin.write(b'{"id": 100}\n')
        await waiting.stdin.drain()
        deadline = time.monotonic() + 30
        while sum((await end_offsets(kafka_settings, {topic: 1})).values()) == published:
            assert time.monotonic() < deadline, "the line was never published"
            await asyncio.sleep(0.2)
        waiting.send_signal(signal.SIGINT)
        err = await asyncio.wait_for(waiting.stderr.read(), 10)  # with standard input still open
        assert await asyncio.wait_for(waiting.wait(), 10) == 130, err
    finally:
        if waiting.returncode is None:
            waiting.kill()
            await waiting.wait()
    (interrupted,) = [json.loads(line) for line in err.decode().splitlines() if '"publish_interrupted"' in line]
    assert interrupted["published"] == 1


async def test_publish_from_no_input_a_closed_input_or_a_line_the_producer_refuses(
        kafka_settings: KafkaSettings, topic_factory: Callable[..., Awaitable[str]], tmp_path: Path) -> None:
    """Standard input from /dev/null (cron, ``docker run`` without ``-i``) publishes nothing and exits 0: it
    printed a traceback and waited for good. A closed standard input is refused (exit 2), not an AttributeError.
    A line the producer refuses before sending (past its request size) is named as the first not published; it
    said none was left."""
    import json

    topic = await topic_factory("publish", partitions=1)
    env = {**os.environ, "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka_settings.bootstrap_servers),
           "COUNTERSINK_LOG_FORMAT": "json", "COUNTERSINK_CONSUMER__MAX_EVENT_BYTES": str(4 << 20)}
    command = [sys.executable, "-m", "countersink.cli", "publish", topic]
    done = await asyncio.to_thread(subprocess.run, command, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
                                   capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"published 0 records to {topic}"), done.stderr
    assert "Traceback" not in done.stderr
    closed = await asyncio.to_thread(subprocess.run, ["sh", "-c", '"$@" <&-', "sh", *command], cwd=REPO, env=env,
                                     capture_output=True, text=True, timeout=60)
    assert closed.returncode == 2, closed.stderr
    assert "standard input is closed" in closed.stderr
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"n": 1}\n' + json.dumps({"n": 2, "pad": "x" * (2 << 20)}) + '\n{"n": 3}\n')
    big = await asyncio.to_thread(subprocess.run, [*command, str(lines)], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=60)
    assert big.returncode == 1, big.stderr
    (failed,) = [json.loads(line) for line in big.stderr.splitlines() if '"publish_failed"' in line]
    assert (failed["published"], failed["first_line_not_published"]) == (1, 2)
