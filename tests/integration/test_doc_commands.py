"""The shell blocks of the docs that read and collect counters, run as written on real Kafka and Cassandra.

Each block is found by its mark (``<!-- tested: tests/integration/test_doc_commands.py NAME -->``, see
tests/docblocks.py) and run line by line in a fresh keyspace: ``.venv/bin/countersink`` is this checkout's
``python -m countersink.cli``, a ``&`` line runs in the background until the block ends, and the only other
change is ports: ``serve`` and the GC loop listen on free ports (their settings), and the ``curl`` lines ask
``serve``'s in place of 8082, so that tests can run side by side. What a line
states it prints (a ``# prints:`` comment, a ``# ...`` line after a ``curl``, or the output lines of a
``console`` block) is what it must print; ``<...>`` in a statement stands for any value.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from countersink.cassandra import CassandraClient
from countersink.kafka import make_admin
from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env
from stack.servers import free_port
from tests.docblocks import REPO, doc_block

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "countersink.cli"]


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)  # the lines it states it prints (may hold <...>)
    note: str = ""  # the comment after the command


def sh_steps(block: str) -> list[Step]:
    """The commands of a ```sh block; a ``# prints: X`` comment, or ``# X`` lines after a command, are its output."""
    steps: list[Step] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if line.startswith("# or: "):  # an alternative to the command before it: run too
            steps.append(Step(line.removeprefix("# or: ").strip(), note="or"))
            continue
        if line.startswith("#"):
            steps[-1].expected.append(line[1:].strip())
            continue
        command, _, note = line.partition("  #")
        note = note.strip()
        steps.append(Step(command.strip(), [note.removeprefix("prints:").strip()] if note.startswith("prints:")
                          else [], note))
    return steps


def console_steps(block: str) -> list[Step]:
    """The ``$ `` commands of a ```console block, each with the output lines shown after it."""
    steps: list[Step] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif line.strip():
            steps[-1].expected.append(line)
    return steps


def matches(expected: list[str], printed: list[str]) -> bool:
    """Whether the printed lines are the stated ones, ``<...>`` standing for any text."""
    if len(expected) != len(printed):
        return False
    patterns = ["".join(".+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", line))
                for line in expected]
    return all(re.fullmatch(pattern, line) for pattern, line in zip(patterns, printed, strict=True))


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - a loopback http URL built here
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Runner:
    """Runs the steps of doc blocks in one folder and environment; stops what it started in the background."""

    def __init__(self, env: dict[str, str], folder: Path, replace: dict[str, str]) -> None:
        self.env, self.folder, self.replace = env, folder, replace
        self.background: list[subprocess.Popen[bytes]] = []
        self.log = folder / "background.log"

    def argv(self, command: str) -> list[str]:
        for documented, used in self.replace.items():
            command = command.replace(documented, used)
        words = shlex.split(command)
        if words[0] in (".venv/bin/countersink", "countersink"):
            return [*CLI, *words[1:]]
        if words[0] == ".venv/bin/python":
            return [sys.executable, *words[1:]]
        assert words[0] == "curl", f"a command this runner does not know: {command}"
        return words

    def start(self, command: str) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            process = subprocess.Popen(self.argv(command.removesuffix("&").strip()), cwd=self.folder, env=self.env,
                                       stdout=out, stderr=out)
        self.background.append(process)
        return process

    def wait_for(self, url: str, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while not answers(url):
            assert all(p.poll() is None for p in self.background), self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{url} never answered 200\n{self.log.read_text()[-3000:]}"
            time.sleep(0.2)

    def run(self, step: Step, within_s: float = 90) -> list[str]:
        """Run one command to its end; while it prints other than stated (the consumer has not flushed yet),
        ask again, up to ``within_s``. Returns the printed lines."""
        deadline = time.monotonic() + within_s
        while True:
            done = subprocess.run(self.argv(step.command), cwd=self.folder, env=self.env, capture_output=True,
                                  text=True, timeout=120, check=False)
            printed = done.stdout.strip().splitlines()
            if done.returncode == 0 and (not step.expected or matches(step.expected, printed)):
                return printed
            assert all(p.poll() is None for p in self.background), self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"{step.command}\nexit {done.returncode}, printed:\n{done.stdout}{done.stderr}\nstated:\n"
                + "\n".join(step.expected))
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM to what runs in the background: each must end with exit code 0."""
        for process in self.background:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.background:
            assert process.wait(60) == 0, self.log.read_text()[-3000:]
        self.background.clear()

    def kill(self) -> None:
        for process in self.background:
            if process.poll() is None:
                process.kill()
                process.wait()


COUNTERS = """
[[counter]]
name = "shares_traded"
topics = ["TOPIC"]
kind = "sum"
number = "decimal"
key = "symbol"
value = "qty"

[[counter]]
name = "shares_bought"
topics = ["TOPIC"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "trade_id"
where = { side = "buy" }

[[counter]]
name = "trades_per_hour"
topics = ["TOPIC"]
kind = "count"
key = "symbol"
event_id = "trade_id"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "traders_per_hour"
topics = ["TOPIC"]
kind = "distinct"
key = "symbol"
value = "trader"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "events_total"
topics = ["TOPIC"]
kind = "count"
"""
DAY = datetime(2026, 11, 22, tzinfo=UTC)


def hourly_counts() -> dict[str, list[int]]:
    """IBM trades per hour over 22 and 23 November as docs/reading.md's session shows them: 27, 31, 27, 27 in
    the first four hours, 744 on the 22nd, 749 on the 23rd; SAP takes the rest of 3,000 trades."""
    first = [27, 31, 27, 27] + [32] * 12 + [31] * 8
    second = [32] * 5 + [31] * 19
    assert (sum(first), sum(second)) == (744, 749)
    sap = [31] * 47 + [50]
    assert sum(first) + sum(second) + sum(sap) == 3000
    return {"IBM": first + second, "SAP": sap}


def trades() -> Iterator[dict[str, Any]]:
    """The session's 3,000 trades: IBM's from 295 traders, each hour's spread over the hour."""
    number = 0
    for symbol, per_hour in hourly_counts().items():
        for hour, count in enumerate(per_hour):
            start = DAY + timedelta(hours=hour)
            for index in range(count):
                number += 1
                yield {"trade_id": f"t{number}", "symbol": symbol, "side": ("buy", "sell")[number % 2],
                       "qty": number % 90 + 10, "trader": f"trader-{number % 295}" if symbol == "IBM" else "x",
                       "ts": (start + timedelta(seconds=index * 3600 // count)).strftime("%Y-%m-%dT%H:%M:%SZ")}


async def delete_topic(kafka: KafkaSettings, topic: str) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        if topic in await admin.list_topics():
            await admin.delete_topics([topic])
    finally:
        await admin.close()


async def test_the_reading_blocks_run_as_written(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """docs/reading.md's commands (get, explain, list), its time-series session and its `serve` + `curl` block,
    and the README's explain/list block, on 3,000 trades published and counted by a real consumer."""
    topic = f"docs-trades-{uuid.uuid4().hex[:8]}"
    (tmp_path / "counters.toml").write_text(COUNTERS.replace("TOPIC", topic))
    (tmp_path / "trades.jsonl").write_text("".join(json.dumps(trade) + "\n" for trade in trades()))
    serve_port = free_port()
    env = child_env(kafka_settings, cassandra_settings, consumer={"group_id": topic, "health_port": 0},
                    serve={"host": "127.0.0.1", "port": serve_port})
    env["PYTHONPATH"] = str(REPO)
    env["COUNTERSINK_LOG_FORMAT"] = "console"
    runner = Runner(env, tmp_path, {"localhost:8082": f"localhost:{serve_port}"})
    try:
        for command in ("countersink schema", "countersink topics create --counters counters.toml",
                        f"countersink publish {topic} trades.jsonl --key symbol"):
            await asyncio.to_thread(runner.run, Step(command))
        runner.start("countersink consume --counters counters.toml")
        await asyncio.to_thread(runner.run, Step("countersink get events_total ''", ["events_total '': 3000"]))

        series = console_steps(doc_block("docs/reading.md", "series"))
        assert len(series) == 4
        for step in series:
            assert await asyncio.to_thread(runner.run, step, 5) == step.expected

        for step in sh_steps(doc_block("docs/reading.md", "read-commands")):
            printed = await asyncio.to_thread(runner.run, step, 5)
            assert printed, step.command
            if "--json" in step.command:
                assert '"IBM"' in printed[0], printed
                assert json.loads(printed[0]), printed
                assert not re.search(r'"value": [0-9]', printed[0]), printed  # Decimals as strings: nothing rounded
            if step.command.split()[1] in ("explain", "list"):
                assert "IBM" in "\n".join(printed), printed

        for step in sh_steps(doc_block("README.md", "explain-list")):
            printed = await asyncio.to_thread(runner.run, step, 5)
            assert "IBM" in "\n".join(printed), (step.command, printed)

        served = sh_steps(doc_block("docs/reading.md", "serve"))
        assert served[0].command.endswith("&")
        serve = runner.start(served[0].command)
        runner.wait_for(f"http://127.0.0.1:{serve_port}/readyz")
        for step in served[1:]:
            printed = await asyncio.to_thread(runner.run, step, 5)
            json.loads("\n".join(printed))
        runner.background.remove(serve)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0, runner.log.read_text()[-3000:]
    finally:
        runner.kill()
        await delete_topic(kafka_settings, topic)


async def test_the_gc_blocks_run_as_written(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """docs/running.md's GC commands each end with exit code 0 (the loop answers /healthz, then stops on SIGTERM);
    docs/operations.md's CQL query then shows the runs they recorded, newest first."""
    gc_port = free_port()
    env = child_env(kafka_settings, cassandra_settings, gc={"health_port": gc_port})
    env["PYTHONPATH"] = str(REPO)
    runner = Runner(env, tmp_path, {})
    await asyncio.to_thread(runner.run, Step("countersink schema"))
    complete = 0
    try:
        for step in sh_steps(doc_block("docs/running.md", "gc")):
            if "--every" in step.command:
                runner.start(step.command)
                runner.wait_for(f"http://127.0.0.1:{gc_port}/healthz")
                runner.stop()
                continue
            printed = await asyncio.to_thread(runner.run, step, 0)
            if "--json" in step.command:
                report = json.loads(printed[-1])  # the run's report, one JSON line
                assert (report["dry_run"], report["instances_deferred"]) == (False, 0), printed
            complete += "--once" in step.command
    finally:
        runner.kill()
    assert complete == 2
    query = doc_block("docs/operations.md", "gc-runs")
    async with CassandraClient(cassandra_settings) as client:
        rows = [row.as_dict() for row in await client.execute(query.strip().rstrip(";"))]
    assert len(rows) >= complete, rows  # and the loop's run, when it got that far before its SIGTERM
    # Every --once run complete; the loop's, if recorded, complete or stopped by the SIGTERM midway.
    outcomes = [row["outcome"] for row in rows]
    assert outcomes.count("complete") >= complete, rows
    assert set(outcomes) <= {"complete", "stopped"}, rows
    assert outcomes.count("stopped") <= 1, rows
    assert [row["started_us"] for row in rows] == sorted((row["started_us"] for row in rows), reverse=True)
    assert rows[0]["last_complete_us"] is not None


async def test_the_consumer_block_runs_as_written(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """docs/running.md's "Running the consumer": the schema, the demo's topics, then the consumer and its
    ``python -m consumer`` alternative, each until it answers /readyz 200 and then stopped by SIGTERM (exit 0).

    ``make services-up`` is the one line not run: the servers are the test session's. The demo's topics,
    counters and the group are renamed for this test (a copy of demo/counters.toml), so that nothing else
    shares them (a keyspace counts each counter by one group: another test's group would refuse this one)."""
    unique = uuid.uuid4().hex[:8]
    prefix = f"docs{unique}-"
    (tmp_path / "demo").mkdir()
    renamed = re.sub(r'^name = "(?!demo-)', f'name = "d{unique}_', (REPO / "demo" / "counters.toml").read_text(),
                     flags=re.MULTILINE).replace('"demo-', f'"{prefix}demo-')
    (tmp_path / "demo" / "counters.toml").write_text(renamed)
    shutil.copytree(REPO / "examples" / "formats", tmp_path / "examples" / "formats")  # its inline schemas
    health = free_port()
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": health})
    env["PYTHONPATH"] = str(REPO)
    runner = Runner(env, tmp_path, {"--group trades-counters": f"--group {prefix}group"})
    steps = sh_steps(doc_block("docs/running.md", "consumer"))
    assert steps[0].command == "make services-up"
    topics = sorted(set(re.findall(rf'"({re.escape(prefix)}demo-[a-z-]+)"', renamed)))
    consumers = 0
    try:
        for step in steps[1:]:
            if " consume " in f" {step.command} " or "-m consumer" in step.command:
                runner.start(step.command)
                runner.wait_for(f"http://127.0.0.1:{health}/readyz")
                runner.stop()
                consumers += 1
                continue
            printed = await asyncio.to_thread(runner.run, step, 0)
            if "topics create" in step.command:
                assert sorted(line.split()[1] for line in printed) == sorted(topics), printed
    finally:
        runner.kill()
        for topic in topics:
            await delete_topic(kafka_settings, topic)
    assert consumers == 2


def test_the_steps_are_read_as_stated() -> None:
    """The parsers and the matcher: comments and following ``#`` lines are statements, ``<...>`` any text."""
    steps = sh_steps("a x   # prints: a 'x': <value>\ncurl -s u\n# {\"v\": <v>}\nb  # a note\n# or: c\n")
    assert [(s.command, s.expected) for s in steps] == [
        ("a x", ["a 'x': <value>"]), ("curl -s u", ['{"v": <v>}']), ("b", []), ("c", [])]
    assert matches(["a 'x': <value>"], ["a 'x': 15.40"])
    assert not matches(["a 'x': <value>"], ["a 'y': 15.40"])
    assert not matches(["a"], ["a", "b"])
    assert [(s.command, s.expected) for s in console_steps("$ get x\nx: 1\n$ get y\n")] == [
        ("get x", ["x: 1"]), ("get y", [])]
