"""Kafka Streams in ``make bench``: the system a JVM team would pick instead, on the same topic in the same run.

The Maven project in ``bench/kstreams/`` builds two Kafka Streams applications (the stack's Kafka version,
``processing.guarantee=exactly_once_v2``, RocksDB stores with their changelogs):

- ``TradeCounts`` keeps, per symbol, the bench's "trades" count and "shares" sum (integer ``qty``);
- ``HourlyCounts`` keeps an hourly count per key (a dotted path or the record key) and per hour of an
  ISO-8601 or epoch-seconds time field (or the record time): the windowed equivalent of a bucketed
  countersink count; several key paths, comma-separated, keep several such counts in one application.

Each writes every update to an output topic of its own; the last committed record of a key is its value,
checked against the truth.

    python -m bench.kstreams BOOTSTRAP TOPIC PARTITIONS EVENTS [--hourly KEY TIME]   # once, on a loaded topic

Timed like Quix Streams: from the JVM's start until the application's committed offsets (its consumer group
is the application id) reach the end of the topic. CPU: user + system of the JVM, and of the servers'
processes meanwhile, from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from bench.pipeline import proc_cpu_s, say, stop_process
from countersink.kafka import ensure_topics, make_admin, make_consumer
from countersink.settings import KafkaSettings
from stack import servers

PROJECT = Path(__file__).resolve().parent / "kstreams"
TRADES = ("dev.countersink.bench.TradeCounts",)
NAME = "Kafka Streams (exactly-once v2)"
TOTALS = struct.Struct(">qq")  # count, sum: TradeCounts' output value
COUNT = struct.Struct(">q")  # HourlyCounts' output value


def hourly(key: str, time: str, grace_hours: int = 168) -> tuple[str, ...]:
    """The HourlyCounts application: counts per ``key`` (a dotted path, or ``@key``; several, comma-separated:
    one count each, output keys ``PATH=VALUE|HOUR``) and per hour of ``time`` (a dotted path to an ISO-8601
    time or to epoch seconds, or ``@timestamp``); events up to ``grace_hours`` late still count."""
    return ("dev.countersink.bench.HourlyCounts", key, time, str(grace_hours))


class BuildError(servers.StackError):
    """Maven (or Java) is missing, or could not build the applications: ``make bench`` says so and exits 1."""


def build(project: Path = PROJECT) -> str:
    """Build the application (offline from ``~/.m2`` first, online if that fails) and return its class path."""
    mvn = shutil.which("mvn")
    if not mvn:
        raise BuildError("Maven is required to build the Kafka Streams application but `mvn` was not found")
    command = [mvn, "-B", "-q", "-f", str(project / "pom.xml"), "package"]
    done = subprocess.run([*command[:2], "-o", *command[2:]], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        say("building the Kafka Streams application online (artifacts not all in ~/.m2 yet)")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line][:8]
        raise BuildError("Maven could not build bench/kstreams:\n" + "\n".join(errors))
    target = project / "target"
    return os.pathsep.join([str(target / "classes"), str(target / "lib" / "*")])


@dataclass
class StreamsRun:
    rate: float  # events per second, from the JVM's start until its committed offsets reach the end
    committed: int  # records committed when it stopped
    elapsed_s: float
    cpu_s: float  # user + system of the JVM
    server_cpu_s: dict[str, float]  # of the servers' processes meanwhile
    output: dict[str, bytes] = field(default_factory=dict)  # key -> the last value it wrote (committed)


async def committed_total(kafka: KafkaSettings, group: str, topic: str, partitions: int) -> int:
    """The sum of the group's committed offsets over the topic's partitions."""
    consumer = make_consumer(kafka, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return sum([await consumer.committed(TopicPartition(topic, p)) or 0 for p in range(partitions)])
    finally:
        await consumer.stop()


async def repartition_behind(kafka: KafkaSettings, application_id: str) -> int:
    """Records of the application's repartition topics that its group has not committed past. Each partition
    written ends with a transaction marker, which a consumer's position may or may not have passed yet."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics()
                  if t.startswith(f"{application_id}-") and t.endswith("-repartition")]
        described = await admin.describe_topics(topics) if topics else []
    finally:
        await admin.close()
    tps = [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]
    if not tps:
        return 0
    consumer = make_consumer(kafka, group_id=application_id, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        committed = {tp: await consumer.committed(tp) or 0 for tp in tps}
        return sum(max(0, ends[tp] - 1 - committed[tp]) for tp in tps if ends[tp] > 0)
    finally:
        await consumer.stop()


async def read_output(kafka: KafkaSettings, topic: str, partitions: int) -> dict[str, bytes]:
    """The last committed value of every key in an application's output topic."""
    consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                             isolation_level="read_committed")
    last: dict[str, bytes] = {}
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)  # read_committed: the last stable offsets
        await consumer.seek_to_beginning()
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=5_000)).values():
                for record in records:
                    if record.key is not None and record.value is not None:
                        last[record.key.decode()] = record.value
            remaining = {tp for tp in remaining if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return last


def trade_totals(output: Mapping[str, bytes]) -> dict[str, tuple[int, int]]:
    """TradeCounts' output: symbol -> (count, sum)."""
    return {symbol: TOTALS.unpack(value) for symbol, value in output.items()}


def hourly_counts(output: Mapping[str, bytes]) -> dict[str, int]:
    """HourlyCounts' output: ``KEY|2026-11-22T10:00Z`` -> count."""
    return {key: COUNT.unpack(value)[0] for key, value in output.items()}


def check_counts(counts: Mapping[str, int], truth: Mapping[str, int]) -> list[str]:
    """Every count against the truth, and no key it invented."""
    problems = [f"{key}: {counts.get(key)} != {want}" for key, want in sorted(truth.items()) if counts.get(key) != want]
    return problems + [f"{key}: not published, counted {n}" for key, n in counts.items() if key not in truth]


def check_totals(totals: Mapping[str, tuple[int, int]], truth: Mapping[str, tuple[int, int]], sample: int
                 ) -> list[str]:
    """Count and sum of the first ``sample`` symbols (sorted) against the truth, and no symbol it invented."""
    problems = []
    for symbol in sorted(truth)[:sample]:
        for name, index in (("trades", 0), ("shares", 1)):
            got = totals[symbol][index] if symbol in totals else None
            if got != truth[symbol][index]:
                problems.append(f"{name}/{symbol}: {got} != {truth[symbol][index]}")
    problems += [f"{symbol}: not published, counted {value}" for symbol, value in totals.items()
                 if symbol not in truth]
    return problems


async def streams_rate(kafka: KafkaSettings, topic: str, partitions: int, total: int, budget_s: float,
                       servers_by_name: Mapping[str, int], workdir: Path, classpath: str, *, threads: int = 1,
                       heap: str = "1g", application: Sequence[str] = TRADES,
                       config: Mapping[str, object] | None = None) -> StreamsRun:
    """Run an application (its main class and arguments after the common ones: TRADES or ``hourly(…)``) on
    ``topic`` from its beginning until it has committed ``total`` records (or for ``budget_s``), stop it, and
    read back what it wrote. Its topics (output, changelog, repartition) are deleted after. ``config``: other
    Streams settings (``{"commit.interval.ms": 1000}``); unset, Kafka Streams' defaults."""
    application_id = f"kstreams-{uuid.uuid4().hex[:8]}"
    output = f"{application_id}-output"
    java = shutil.which("java")
    if not java:
        raise BuildError("`java` was not found")
    await ensure_topics(kafka, {output: partitions})
    workdir.mkdir(parents=True, exist_ok=True)
    state_dir = workdir / "kstreams-state"
    log_path = workdir / "kstreams.log"
    try:
        return await _run(kafka, topic, partitions, total, budget_s, servers_by_name, log_path, [
            java, f"-Xmx{heap}", *[f"-Dstreams.{name}={value}" for name, value in (config or {}).items()],
            "-cp", classpath, application[0], kafka.bootstrap_servers[0], topic, output, application_id,
            str(state_dir), str(threads), *application[1:]], application_id, output)
    finally:
        await delete_application_topics(kafka, application_id)
        shutil.rmtree(state_dir / application_id, ignore_errors=True)


async def _run(kafka: KafkaSettings, topic: str, partitions: int, total: int, budget_s: float,
               servers_by_name: Mapping[str, int], log_path: Path, command: list[str], application_id: str,
               output: str) -> StreamsRun:
    servers_before = {name: proc_cpu_s(pid) for name, pid in servers_by_name.items()}
    started = time.monotonic()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        committed = 0
        last = time.monotonic()
        while committed < total and time.monotonic() - started < budget_s:
            await asyncio.sleep(0.5)
            if process.poll() is not None:
                raise RuntimeError(f"Kafka Streams exited {process.returncode}; see {log_path}")
            committed = await committed_total(kafka, application_id, topic, partitions)
            if time.monotonic() - last > 10:
                say(f"kafka streams: {committed:,}/{total:,} committed")
                last = time.monotonic()
        # A key read from the events goes through a repartition topic to the counting sub-topology: done when
        # that has consumed what the first wrote (all committed with the input's offsets) too.
        while (committed >= total and time.monotonic() - started < budget_s
               and await repartition_behind(kafka, application_id)):
            await asyncio.sleep(0.5)
            if process.poll() is not None:
                raise RuntimeError(f"Kafka Streams exited {process.returncode}; see {log_path}")
        elapsed = time.monotonic() - started
        cpu = proc_cpu_s(process.pid)
        server_cpu = {name: proc_cpu_s(pid) - servers_before[name] for name, pid in servers_by_name.items()}
    finally:
        stop_process(process)
    written = await read_output(kafka, output, partitions)
    return StreamsRun(committed / elapsed, committed, elapsed, cpu, server_cpu, written)


async def bench_step(kafka: KafkaSettings, topic: str, partitions: int, truth: Mapping[str, tuple[int, int]],
                     budget_s: float, servers_by_name: Mapping[str, int], workdir: Path, classpath: str, *,
                     threads: int = 1, commit_ms: int = 100) -> tuple[dict[str, float], list[str]]:
    """``make bench``'s Kafka Streams step: TradeCounts on a topic of ``sum(counts)`` trades whose per-symbol
    (count, sum) is ``truth``. Returns its figures (events/s, events committed, CPU s per million events of the
    JVM and of each server meanwhile, its settings, the symbols checked) and the mismatched values; its values
    are checked only when it committed every record within ``budget_s``."""
    total = sum(count for count, _ in truth.values())
    run = await streams_rate(kafka, topic, partitions, total, budget_s, servers_by_name, workdir, classpath,
                             threads=threads, config={"commit.interval.ms": commit_ms})
    per_million = 1e6 / max(run.committed, 1)
    figures = {"events_per_s": run.rate, "committed": run.committed, "threads": threads,
               "commit_interval_ms": commit_ms, "jvm_cpu_s_per_million": run.cpu_s * per_million,
               **{f"{name.lower()}_cpu_s_per_million": cpu * per_million for name, cpu in run.server_cpu_s.items()}}
    if run.committed < total:
        return figures, []
    figures["symbols_checked"] = len(truth)
    return figures, check_totals(trade_totals(run.output), truth, len(truth))


async def delete_application_topics(kafka: KafkaSettings, application: str) -> None:
    """The application's output and internal topics (all named ``{application}-…``)."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        if mine := [t for t in await admin.list_topics() if t.startswith(f"{application}-")]:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


async def _main(args: argparse.Namespace) -> int:
    kafka = KafkaSettings(bootstrap_servers=[args.bootstrap], client_id="countersink-bench")
    classpath = build()
    application = TRADES if args.hourly is None else hourly(*args.hourly)
    run = await streams_rate(kafka, args.topic, args.partitions, args.events, args.budget_s, {},
                             args.workdir, classpath, threads=args.threads, application=application,
                             config=dict(setting.split("=", 1) for setting in args.config))
    print(f"{NAME}: {run.rate:,.0f} events/s over {run.committed:,} events, JVM "
          f"{run.cpu_s / max(run.committed, 1) * 1e6:.1f} CPU s per million events, "
          f"{len(run.output):,} keys written")
    return 0 if run.committed >= args.events else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kstreams", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("partitions", type=int)
    parser.add_argument("events", type=int, help="records in the topic: the run ends when all are committed")
    parser.add_argument("--threads", type=int, default=1, help="num.stream.threads")
    parser.add_argument("--hourly", nargs=2, metavar=("KEY", "TIME"),
                        help="HourlyCounts instead of TradeCounts: key path (or @key; several, comma-separated), "
                        "time path (or @timestamp)")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                        help="a Kafka Streams setting, e.g. commit.interval.ms=1000 (repeatable)")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--workdir", type=Path, default=Path(".stack") / "kstreams")
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
