"""``make bench``: countersink beside the limit and the alternatives, measured in one run on one stack.

    python -m bench.pipeline [--events 2000000] [--symbols 100000] [--partitions 12] [--quick]

It starts its own Kafka and Cassandra (ports 29092 and 29042, data under ``.stack/bench``), loads one topic
of JSON trades keyed by symbol, and consumes that same topic five ways, one after the other:

1. the limit: aiokafka ``getmany`` and discard, in one process;
2. countersink: one consumer process with a count, an integer sum and a distinct counter over the trades,
   exactly-once on (event ids), until every partition's last record is flushed;
3. without countersink: aiokafka plus one Cassandra counter-column ``UPDATE`` per event (count and sum),
   at the same number of requests in flight as countersink's client allows;
4. Quix Streams in its exactly-once mode, counting trades and summing ``qty`` per symbol in RocksDB state,
   until its committed offsets reach the end of the topic;
5. Kafka Streams (``bench/kstreams/``, exactly-once v2, RocksDB), counting trades and summing ``qty`` per
   symbol, timed the same way; its values, read back from its output topic, checked against the truth.

Then the second stream (``bench.stream2``): page views with nested fields, hourly buckets, a decimal sum under
a filter, quantiles and top-k, nine counters over seven keys, in a topic of their own, counted by countersink
(and once more per ``--stream2-variant``, other settings on the same topic) and by Kafka Streams (the hourly
counts it can keep), every system's values checked against the truth; Cassandra rows written per event and
Cassandra CPU per row beside the trades'.

Then: consumer CPU per million events; the GC folding what the countersink run left (instances per
second); read latency of an instance with 1, 5 and 20 shards beside a plain one-row read, and of wide
instances (up to 1,000 shards, ``bench.wide_reads``) and ranges of wide buckets; memory per
live instance of each kind; and recovery after ``kill -9`` of a consumer holding 10 thousand and 1 million
live instances, until the replacement applies events again. Figures, ratios and the targets go to stdout
and to ``bench/results/REPORT.md`` with PNG plots. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from bench.shapes import EVENTS_PER_HOUR
from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import ensure_topics, make_consumer, make_producer
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from schemas.cql import stamp_source
from stack import servers
from stack.loading import child_env, end_offsets, wait_until_flushed

ROOT = Path(__file__).resolve().parents[1]
STACK = servers.STACK_DIR / "bench"
# Quix Streams runs from a virtual environment of its own (its pydantic bounds exclude countersink's pins).
QUIX_PYTHON = ROOT / ".venv-quix" / "bin" / "python"
RESULTS = ROOT / "bench" / "results"
TOPIC = "bench-trades"
RECOVERY_TOPIC = "bench-recovery"
COMMAND = "make bench"
SPACING_4 = "countersink, flush_spacing 4"
# bench.stream2's mismatches, by run
STREAM2_CHECKS = ("checks", "variant_checks", "like_kstreams_checks", "kstreams_checks")
TWO_PROCESSES = "countersink, 2 processes"


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# The group of the measured run: its counters keep their plain names (checked against the truth, read for
# latency). Every other run counts under names of its own: one consumer group per keyspace and counter.
MAIN_GROUP = "bench-countersink"


def counter_prefix(group: str) -> str:
    """What :func:`named_for` puts before each counter's name for ``group``: nothing for the main run's."""
    if group == MAIN_GROUP:
        return ""
    return "run_" + re.sub(r"[^a-z0-9]+", "_", group.removeprefix(MAIN_GROUP).lower()).strip("_") + "_"


def named_for(text: str, group: str) -> str:
    """Definitions ``text`` with each counter renamed for ``group`` (``run_spacing_4_trades``), unless it is
    the main run's: the registry refuses a second group on a counter, and it would count the log again."""
    return text.replace('name = "', f'name = "{counter_prefix(group)}')


def definitions(topic: str) -> str:
    return f"""
[[counter]]
name = "trades"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "shares"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"

[[counter]]
name = "buyers"
topics = ["{topic}"]
kind = "distinct"
key = ["symbol"]
value = "buyer"
event_id = "id"
"""


RECOVERY_DEFINITIONS = f"""
[[counter]]
name = "seen"
topics = ["{RECOVERY_TOPIC}"]
kind = "count"
key = ["id"]
"""


@dataclass
class Report:
    """Every figure of the run, in the order the report prints them."""

    events: int = 0
    symbols: int = 0
    partitions: int = 0
    load_s: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)  # events per second by system
    notes: dict[str, str] = field(default_factory=dict)
    cpu_s_per_million: float = 0.0
    server_cpu_s_per_million: dict[str, float] = field(default_factory=dict)  # during the countersink run
    rows_per_event: float = 0.0  # shards the countersink run wrote per event (three to a Cassandra row)
    apply_only: float = 0.0  # events/s of decode + route + apply in process, no I/O (the batch path)
    hot_path_us: dict[str, dict[str, float]] = field(default_factory=dict)  # bench.hot_path: path -> regime -> µs
    # bench.hot_path --shapes: shape of definition -> batch path and router µs/event, share taken, updates per event
    hot_path_shapes: dict[str, dict[str, float]] = field(default_factory=dict)
    hot_path_shape_events: int = 0  # events per round of that measurement
    gc: dict[str, float] = field(default_factory=dict)
    read_latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (p50, p99)
    rollup_latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # bench.rollup: (p50, p99)
    wide_latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # bench.wide_reads: (p50, p99)
    # bench.wide_reads --alone: the cached reads and the stamps query, interleaved with the plain row only
    wide_alone_latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    memory_bytes: dict[str, float] = field(default_factory=dict)
    recovery_s: dict[str, dict[str, float]] = field(default_factory=dict)
    profile: str = ""
    checks: list[str] = field(default_factory=list)
    # Kafka Streams: events/s, CPU s per million events of its JVM and of the servers meanwhile, symbols checked
    kstreams: dict[str, float] = field(default_factory=dict)
    kstreams_checks: list[str] = field(default_factory=list)  # its count and sum against the truth: mismatches
    cassandra_rows_per_event: float = 0.0  # Cassandra rows of shards the countersink run wrote per event
    # the second stream (bench.stream2): its figures, countersink's and Kafka Streams', and their checks
    stream2: dict[str, Any] = field(default_factory=dict)


# --- servers


@contextlib.contextmanager
def bench_servers(root: Path, *, kafka_port: int, native_port: int, storage_port: int, jmx_port: int,
                  cluster_name: str) -> Iterator[tuple[servers.KafkaServer, servers.CassandraNode]]:
    """A Kafka broker (its controller on the next port) and one Cassandra node of a benchmark's own, started
    side by side, ready inside the block, stopped on the way out. Ports below Linux's ephemeral range
    (32768-60999): a readiness probe of a port in that range, sent before the server listens, can be given
    that same port as its own and connect to itself, and the server then fails to bind."""
    kafka_server = servers.KafkaServer(port=kafka_port, controller_port=kafka_port + 1, root=root / "kafka")
    cassandra_node = servers.CassandraNode(native_port=native_port, storage_port=storage_port, jmx_port=jmx_port,
                                           seeds=f"127.0.0.1:{storage_port}", cluster_name=cluster_name,
                                           root=root / "cassandra")
    kafka_server.start(tied_to_parent=True, wait=False)
    cassandra_node.start(tied_to_parent=True, wait=False)
    try:
        kafka_server.wait_ready()
        cassandra_node.wait_ready()
        yield kafka_server, cassandra_node
    finally:
        kafka_server.stop()
        cassandra_node.stop()


# --- loading


def trade(i: int, rng: random.Random, symbols: int) -> tuple[bytes, bytes]:
    symbol = f"S{rng.randrange(symbols):06d}"
    event = (f'{{"id":"{i:012x}{rng.getrandbits(64):016x}","symbol":"{symbol}","qty":{rng.randrange(1, 10_000)},'
             f'"buyer":"u{rng.randrange(1_000_000)}","side":"{rng.choice(("buy", "sell"))}"}}')
    return symbol.encode(), event.encode()


async def load(kafka: KafkaSettings, topic: str, partitions: int, n: int,
               make: Callable[[int], tuple[bytes, bytes]], what: str) -> None:
    """Publish ``n`` records made by ``make(i)`` in per-partition batches; a key always goes to the same
    partition, as the key-hashing partitioner would do."""
    async with make_producer(kafka, linger_ms=20, max_batch_size=1_048_576, enable_idempotence=True) as producer:
        batches = {p: producer.create_batch() for p in range(partitions)}
        pending: list[Awaitable[Any]] = []
        last = time.monotonic()
        for i in range(n):
            key, value = make(i)
            partition = zlib.crc32(key) % partitions
            batch = batches[partition]
            if batch.append(key=key, value=value, timestamp=None) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batches[partition] = batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)
            if len(pending) > 64:
                await asyncio.gather(*pending)
                pending.clear()
            if time.monotonic() - last > 5:
                say(f"{what}: published {i + 1:,}/{n:,}")
                last = time.monotonic()
        for partition, batch in batches.items():
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)


# --- the four consumers


async def raw_rate(kafka: KafkaSettings, partitions: int, total: int) -> float:
    consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                             isolation_level="read_committed", max_poll_records=2_000)
    started = time.monotonic()
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        seen = 0
        while seen < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=2_000)
            seen += sum(len(records) for records in batches.values())
    finally:
        await consumer.stop()
    return total / (time.monotonic() - started)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_consumer(env: dict[str, str], log_name: str, tree: Path = ROOT) -> subprocess.Popen[bytes]:
    """A consumer process of the source tree ``tree`` (another version's, written out: bench.consumer_versions)."""
    with open(STACK / log_name, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "consumer"], cwd=tree, env=env, stdout=log, stderr=log)


def sample_stacks(pid: int, to: Path) -> subprocess.Popen[bytes]:
    """py-spy samples ``pid``'s Python stacks from outside (100 a second, without pausing it) until it exits,
    and writes them collapsed to ``to``: unlike cProfile, the consumer runs at its own speed meanwhile."""
    py_spy = Path(sys.executable).with_name("py-spy")
    with open(STACK / "py-spy.log", "ab") as log:
        return subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--rate", "100", "--nonblocking",
                                 "--full-filenames", "--format", "raw", "--output", str(to)], stdout=log, stderr=log)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 60, *, signalled: bool = False) -> int:
    """SIGTERM (unless ``signalled`` already), then its exit code; killed if it takes over ``timeout``."""
    if not signalled and process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def metric_values(port: int, names: tuple[str, ...], timeout: float = 5) -> dict[str, float]:
    """The named samples of a process's /metrics, by name (those it does not show are left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[name] = float(value)
    return out


@dataclass
class ConsumerRun:
    rate: float  # events per second, start to clean exit
    cpu_s: float  # user + system CPU of the consumer processes
    rows: float  # shards written until every record was flushed
    server_cpu_s: dict[str, float]  # CPU the Kafka and Cassandra processes used meanwhile
    cassandra_rows: float = 0.0  # Cassandra rows of shards written (one per key flushed, its counters' shards in it)


async def countersink_rate(kafka: KafkaSettings, cassandra: CassandraSettings, partitions: int, total: int,
                           group: str, servers_by_name: dict[str, int], profile_to: Path | None = None,
                           processes: int = 1, topic: str = TOPIC, counters_text: str | None = None,
                           cassandra_options: dict[str, object] | None = None, tree: Path = ROOT,
                           **consumer: object) -> ConsumerRun:
    """Events per second until the last record of every partition of ``topic`` is flushed, and what it cost.
    With ``processes`` > 1, that many consumers in one group share the partitions (figures are their sums).
    ``counters_text``: the definitions (the trades' three by default), renamed for ``group``;
    ``cassandra_options``: Cassandra settings of the consumers (``{"write_batch_rows": 20}``); ``tree``: the
    source tree the consumers run from."""
    counters = STACK / "counters.toml"
    counters.write_text(named_for(counters_text if counters_text is not None else definitions(topic), group))
    ports = [servers.free_port() for _ in range(processes)]
    ends = await end_offsets(kafka, {topic: partitions})
    servers_before = {name: proc_cpu_s(pid) for name, pid in servers_by_name.items()}
    started = time.monotonic()
    running: list[subprocess.Popen[bytes]] = []
    try:
        for n, port in enumerate(ports):
            env = child_env(kafka, cassandra, consumer={"group_id": group, "counters_file": counters,
                                                        "health_port": port, **consumer}, gc={"health_port": 0})
            env["COUNTERSINK_LOG_LEVEL"] = os.environ.get("BENCH_CONSUMER_LOG_LEVEL", "WARNING")
            env.update({f"COUNTERSINK_CASSANDRA__{name.upper()}": str(value)
                        for name, value in (cassandra_options or {}).items()})
            running.append(start_consumer(env, f"{group}-{n}.log" if processes > 1 else f"{group}.log", tree))
        sampler = None if profile_to is None else sample_stacks(running[0].pid, profile_to)
        try:
            await wait_until_flushed(cassandra, group, ends, 1800,
                                     lambda behind: say(f"countersink: {total - behind:,}/{total:,} flushed"),
                                     consumers=running)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {STACK / group}*.log") from None
        # The ownership rows show the last window's intent before its shards are written: the figures are read
        # once every window is recorded complete (its writes acknowledged), or a large last flush is left out.
        await wait_until_windows_committed(cassandra, group, topic, partitions)
        cpu = sum(proc_cpu_s(process.pid) for process in running)
        written = ("countersink_flush_rows_sum", "countersink_shard_rows_written_total")
        # a consumer busy encoding a large flush on a loaded machine answers late: its figures are still wanted
        metrics = [metric_values(port, written, timeout=120) for port in ports]
        rows = sum(m.get(written[0], 0.0) for m in metrics)
        cassandra_rows = sum(m.get(written[1], 0.0) for m in metrics)
        server_cpu = {name: proc_cpu_s(pid) - servers_before[name] for name, pid in servers_by_name.items()}
    finally:
        # The last window's writes may still be in flight when its intent shows the end: the run ends when
        # every consumer has shut down cleanly, its final flush written and committed.
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        # Once each: a second SIGTERM that lands after a consumer's handler is gone kills it mid-exit (-15).
        codes = [stop_process(process, signalled=True) for process in running]
    elapsed = time.monotonic() - started
    if sampler is not None and sampler.wait(timeout=60) != 0:
        raise RuntimeError(f"py-spy exited {sampler.returncode}; see {STACK / 'py-spy.log'}")
    if any(codes):
        raise RuntimeError(f"countersink consumers exited {codes}; see {STACK / group}*.log")
    return ConsumerRun(total / elapsed, cpu, rows, server_cpu, cassandra_rows)


async def warm_up_consumer(kafka: KafkaSettings, cassandra: CassandraSettings, partitions: int,
                           seconds: float) -> None:
    """A countersink consumer on the topic for ``seconds``, under counter names of its own (its shards must not
    add to the measured counters), then stopped cleanly."""
    counters = STACK / "warmup.toml"
    counters.write_text(definitions(TOPIC).replace('name = "', 'name = "warmup_'))
    # stopped in the middle of a backlog on a busy machine, its final flush is large: not what is measured
    env = child_env(kafka, cassandra, consumer={"group_id": "bench-warmup", "counters_file": counters,
                                                "health_port": 0, "shutdown_timeout_s": 300}, gc={"health_port": 0})
    env["COUNTERSINK_LOG_LEVEL"] = "WARNING"
    process = start_consumer(env, "bench-warmup.log")
    try:
        await asyncio.sleep(seconds)
    finally:
        code = stop_process(process)
    if code != 0:
        raise RuntimeError(f"the warm-up consumer exited {code}; see {STACK / 'bench-warmup.log'}")


async def native_counter_rate(kafka: KafkaSettings, cassandra: CassandraSettings, partitions: int, total: int,
                              budget_s: float) -> tuple[float, int]:
    """aiokafka + one counter-column UPDATE per event, ``max_in_flight`` at a time, for ``budget_s`` at most."""
    async with CassandraClient(cassandra) as client:
        await client.execute("CREATE TABLE IF NOT EXISTS native_trades (symbol text PRIMARY KEY, trades counter, "
                             "shares counter)", prepared=False)
        update = "UPDATE native_trades SET trades = trades + 1, shares = shares + ? WHERE symbol = ?"
        slots = asyncio.Semaphore(cassandra.max_in_flight)
        consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                 isolation_level="read_committed", max_poll_records=2_000)
        done = 0
        failures: list[BaseException] = []

        async def one(value: bytes) -> None:
            nonlocal done
            try:
                event = json.loads(value)
                # not idempotent: a retried UPDATE may count twice, which is why this path is not exact
                await client.execute(update, [event["qty"], event["symbol"]], idempotent=False)
                done += 1
            except Exception as exc:
                failures.append(exc)
            finally:
                slots.release()

        started = time.monotonic()
        await consumer.start()
        tasks: set[asyncio.Task[None]] = set()
        try:
            consumer.assign([TopicPartition(TOPIC, p) for p in range(partitions)])
            await consumer.seek_to_beginning()
            seen = 0
            while seen < total and time.monotonic() - started < budget_s and not failures:
                for records in (await consumer.getmany(timeout_ms=1000, max_records=2_000)).values():
                    for record in records:
                        await slots.acquire()
                        task = asyncio.create_task(one(record.value or b""))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    seen += len(records)
            await asyncio.gather(*tasks)
        finally:
            await consumer.stop()
        if failures:
            raise RuntimeError(f"native counter updates failed: {failures[0]!r}")
        return done / (time.monotonic() - started), done


async def committed_total(kafka: KafkaSettings, group: str, partitions: int) -> int:
    consumer = make_consumer(kafka, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(TOPIC, p)) or 0
        return total
    finally:
        await consumer.stop()


async def quix_rate(kafka: KafkaSettings, partitions: int, total: int, budget_s: float, python: Path
                    ) -> tuple[float, int]:
    group = f"quix-{uuid.uuid4().hex[:8]}"
    state_dir = STACK / "quix-state"
    started = time.monotonic()
    with open(STACK / "quix.log", "ab") as log:
        process = subprocess.Popen(
            [str(python), "-m", "bench.quix_app", kafka.bootstrap_servers[0], TOPIC, group, str(state_dir)],
            cwd=ROOT, stdout=log, stderr=log)
    try:
        committed = 0
        last = time.monotonic()
        while committed < total and time.monotonic() - started < budget_s:
            await asyncio.sleep(1)
            if process.poll() is not None:
                raise RuntimeError(f"Quix Streams exited {process.returncode}; see {STACK / 'quix.log'}")
            committed = await committed_total(kafka, group, partitions)
            if time.monotonic() - last > 10:
                say(f"quix streams: {committed:,}/{total:,} committed")
                last = time.monotonic()
        elapsed = time.monotonic() - started
    finally:
        stop_process(process)
    return committed / elapsed, committed


# --- after the runs


async def gc_throughput(kafka: KafkaSettings, cassandra: CassandraSettings) -> dict[str, float]:
    env = child_env(kafka, cassandra, gc={"grace_s": 0, "health_port": 0})
    env["COUNTERSINK_LOG_LEVEL"] = "WARNING"
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gc_worker", "--once", "--json", "--no-progress", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE)
    out = (await process.communicate())[0].decode().strip()
    elapsed = time.monotonic() - started
    if process.returncode != 0 or not out:
        raise RuntimeError(f"GC exited {process.returncode}")
    report = json.loads(out.splitlines()[-1])
    folded = float(report["instances_folded"])
    return {"instances_folded": folded, "shards_deleted": float(report["shards_deleted"]), "seconds": elapsed,
            "instances_per_s": folded / elapsed}


async def read_latencies(cassandra: CassandraSettings, rounds: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 of reading one instance with 1, 5 and 20 shards, and of a plain one-row read, interleaved
    so that the machine's noise falls on all of them alike."""
    from consumer.cassandra_store import CassandraStore
    from consumer.storage import MutatorEntry, PartitionId, ShardWrite
    from schemas.kinds import KindSpec, new_state

    async with CassandraClient(cassandra) as client:
        store = CassandraStore(client)
        for shards in (1, 5, 20):
            for i in range(shards):
                record = MutatorEntry(uuid.uuid4(), "bench-read", "bench-read", i, "bench", 1_000_000, 9_000_000)
                await store.register_mutator(record)
                await store.create_partition(PartitionId("bench-read", f"bench-read-{shards}", i), record.id,
                                             record.born_us, 0)
                state = new_state(KindSpec("sum"))
                state.apply(i + 1)
                await store.write_shards(record.id, record.born_us, record.born_us + 1,
                                         [ShardWrite("readbench", f"shards-{shards}", state.to_bytes(), 1, True)],
                                         source=stamp_source("bench-read", f"bench-read-{shards}", i))
        await client.execute("CREATE TABLE IF NOT EXISTS plain_values (k text PRIMARY KEY, v bigint)", prepared=False)
        await client.execute("INSERT INTO plain_values (k, v) VALUES ('one', 1)", prepared=False)
        timings: dict[str, list[float]] = {"plain row": [], "1 shard": [], "5 shards": [], "20 shards": []}
        for _ in range(rounds):
            started = time.perf_counter()
            await client.execute("SELECT v FROM plain_values WHERE k = ?", ["one"],
                                 consistency=client.settings.read_consistency)
            timings["plain row"].append(time.perf_counter() - started)
            for shards, name in ((1, "1 shard"), (5, "5 shards"), (20, "20 shards")):
                started = time.perf_counter()
                merged = await read_state(client, "readbench", f"shards-{shards}")
                timings[name].append(time.perf_counter() - started)
                if merged is None or merged.value() != shards * (shards + 1) // 2:
                    raise RuntimeError(f"the {shards}-shard instance reads {merged and merged.value()}")
    return {name: (1000 * statistics.median(t), 1000 * statistics.quantiles(t, n=100)[98])
            for name, t in timings.items()}


async def rollup_latencies(cassandra: CassandraSettings, rounds: int) -> dict[str, tuple[float, float]]:
    from bench import rollup

    return await rollup.rollup_latencies(cassandra, rounds)


async def wide_latencies(cassandra: CassandraSettings, rounds: int) -> dict[str, tuple[float, float]]:
    from bench import wide_reads

    return await wide_reads.wide_latencies(cassandra, rounds)


async def wide_alone_latencies(cassandra: CassandraSettings, rounds: int) -> dict[str, tuple[float, float]]:
    from bench import wide_reads

    return await wide_reads.alone_latencies(cassandra, rounds)


def memory_per_instance(instances: int) -> dict[str, float]:
    """Resident bytes per live instance of each kind, each measured in a fresh interpreter."""
    from bench.apply import COUNTERS

    out: dict[str, float] = {}
    for name, _ in COUNTERS:
        result = subprocess.run([sys.executable, "-m", "bench.memory", name, str(instances)], cwd=ROOT,
                                capture_output=True, text=True, check=True)
        out[name] = float(result.stdout.strip())
    return out


def applied_events(port: int) -> float | None:
    progress = consumer_progress(port)
    return None if progress is None else progress[0]


def consumer_progress(port: int) -> tuple[float, float] | None:
    """(events applied, flushes that wrote rows) of a consumer process; None while it serves no metrics."""
    names = ("countersink_events_applied_total", "countersink_flush_seconds_count")
    try:
        values = metric_values(port, names)
    except OSError:
        return None
    return values.get(names[0], 0.0), values.get(names[1], 0.0)


async def recovery(kafka: KafkaSettings, cassandra: CassandraSettings, instances: int, session_timeout_ms: int,
                   *, quiet: bool = True) -> dict[str, float]:
    """A consumer holding ``instances`` live instances is killed with -9; a replacement starts at once while
    events keep arriving. Seconds from the kill until the replacement has applied an event.

    ``quiet``: killed once it has recorded its last flush window complete (a consumer whose partition has
    gone quiet); otherwise killed as soon as its last flush is written, with that window still open, so the
    replacement replays it first (a consumer killed while busy)."""
    topic_group = f"recovery-{instances}-{session_timeout_ms}-{'quiet' if quiet else 'open'}"
    counters = STACK / f"{topic_group}.toml"
    counters.write_text(RECOVERY_DEFINITIONS)
    # a fresh topic per measurement: the replacement must apply new events, not old ones
    topic = f"{RECOVERY_TOPIC}-{topic_group.removeprefix('recovery-')}"
    counters.write_text(named_for(RECOVERY_DEFINITIONS.replace(RECOVERY_TOPIC, topic), topic_group))
    await ensure_topics(kafka, {topic: 1})
    port_a, port_b = servers.free_port(), servers.free_port()

    def env(port: int, level: str = "WARNING") -> dict[str, str]:
        e = child_env(kafka, cassandra, consumer={
            "group_id": topic_group, "counters_file": counters, "health_port": port,
            "session_timeout_ms": session_timeout_ms, "mutator_max_age_s": 3600,
            # the point is a consumer holding every instance live: no rotation may free them first
            "mutator_memory_budget_bytes": 8 << 30, "memory_budget_bytes": 16 << 30})
        e["COUNTERSINK_LOG_LEVEL"] = level
        return e

    await load(kafka, topic, 1, instances, lambda i: (b"k", f'{{"id":"i{i}"}}'.encode()), f"recovery {instances:,}")
    first = start_consumer(env(port_a), f"{topic_group}-a.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        ends = await end_offsets(kafka, {topic: 1})
        await wait_until_flushed(cassandra, topic_group, ends, 900,
                                 lambda behind: say(f"recovery: {instances - behind:,}/{instances:,} flushed"))
        applied = None
        for _ in range(20):  # the consumer may be busy serialising a large flush for a moment
            if first.poll() is not None:
                raise RuntimeError(f"the first consumer exited {first.returncode}; see {STACK / topic_group}-a.log")
            applied = applied_events(port_a)
            if applied is not None:
                break
            await asyncio.sleep(0.5)
        if applied is None or applied < instances:
            raise RuntimeError(f"the first consumer reports {applied} events applied, expected {instances}")
        if quiet:
            await wait_until_window_committed(cassandra, topic_group, topic)
        rss_kb = int(next(line for line in Path(f"/proc/{first.pid}/status").read_text().splitlines()
                          if line.startswith("VmRSS")).split()[1])
        first.kill()
        killed = time.monotonic()
        first.wait()
        second = start_consumer(env(port_b, "INFO"), f"{topic_group}-b.log")
        stop_trickle = asyncio.Event()

        async def trickle() -> None:
            async with make_producer(kafka) as producer:
                i = 0
                while not stop_trickle.is_set():
                    await producer.send_and_wait(topic, f'{{"id":"new{i}"}}'.encode(), key=b"k")
                    i += 1
                    await asyncio.sleep(0.05)

        feeder = asyncio.create_task(trickle())
        answered_s = applying_s = None
        try:
            while True:
                await asyncio.sleep(0.1)
                elapsed = time.monotonic() - killed
                seen = consumer_progress(port_b)
                if seen is not None and answered_s is None:
                    answered_s = elapsed
                if seen and seen[0] and applying_s is None:
                    applying_s = elapsed
                if seen and seen[1]:
                    break  # its first flush: what it applied since the kill is readable
                if elapsed > 120 or second.poll() is not None:
                    raise RuntimeError(f"the replacement consumer applied {seen} within {elapsed:.0f}s")
        finally:
            stop_trickle.set()
            await feeder
        takeover = next((json.loads(line) for line in (STACK / f"{topic_group}-b.log").read_text().splitlines()
                         if '"partition_taken_over"' in line), {})
        return {"seconds": applying_s or elapsed, "flushed_s": elapsed, "process_up_s": answered_s or 0.0,
                "rss_mb_before_kill": rss_kb / 1024,
                "replayed_records": float(takeover.get("replayed_records", 0)),
                "replayed_instances": float(takeover.get("replayed_instances", 0)),
                "takeover_s": float(takeover.get("seconds", 0))}
    finally:
        if first.poll() is None:
            first.kill()
        if second is not None:
            stop_process(second)


async def wait_until_windows_committed(cassandra: CassandraSettings, group: str, topic: str, partitions: int,
                                      within_s: float = 300) -> None:
    """Until every partition's ownership row shows its last flush window recorded complete."""
    deadline = time.monotonic() + within_s
    async with CassandraClient(cassandra) as client:
        while time.monotonic() < deadline:
            rows = as_dicts(await client.execute(
                "SELECT committed_offset, intent_offset FROM partitions WHERE consumer_group = ? AND topic = ? "
                "AND partition IN ?", [group, topic, list(range(partitions))]))
            if len(rows) == partitions and all(r["committed_offset"] == r["intent_offset"] for r in rows):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{group}: the last flush windows of {topic} were not recorded complete within {within_s}s")


async def wait_until_window_committed(cassandra: CassandraSettings, group: str, topic: str,
                                     within_s: float = 60) -> None:
    """Until partition 0's ownership row shows its last flush window recorded complete."""
    deadline = time.monotonic() + within_s
    async with CassandraClient(cassandra) as client:
        while time.monotonic() < deadline:
            rows = as_dicts(await client.execute(
                "SELECT committed_offset, intent_offset FROM partitions WHERE consumer_group = ? AND topic = ? "
                "AND partition = 0", [group, topic]))
            if rows and rows[0]["committed_offset"] == rows[0]["intent_offset"]:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{group}: the last flush window of {topic} was not recorded complete within {within_s}s")


async def check_values(cassandra: CassandraSettings, expected: dict[str, tuple[int, int]], sample: int,
                       group: str = MAIN_GROUP) -> list[str]:
    """Compare count and sum of a sample of symbols with the truth from what was published, as counted by the
    run of ``group`` (under the names :func:`named_for` gave its counters)."""
    problems = []
    prefix = counter_prefix(group)
    async with CassandraClient(cassandra) as client:
        for symbol in sorted(expected)[:sample]:
            count, qty = expected[symbol]
            for counter, want in ((prefix + "trades", count), (prefix + "shares", qty)):
                state = await read_state(client, counter, symbol)
                got = None if state is None else state.value()
                if got != want:
                    problems.append(f"{counter}/{symbol}: {got} != {want}")
    return problems


# --- the run


async def run(args: argparse.Namespace) -> Report:
    from bench import kstreams

    report = Report(events=args.events, symbols=args.symbols, partitions=args.partitions)
    STACK.mkdir(parents=True, exist_ok=True)
    for old in STACK.glob("*.log"):
        old.unlink()
    say("building the Kafka Streams application (bench/kstreams)")
    kstreams_classpath = kstreams.build()
    say("starting Kafka and Cassandra")
    with bench_servers(STACK, kafka_port=29092, native_port=29042, storage_port=27000, jmx_port=27199,
                       cluster_name="countersink-bench") as (kafka_server, cassandra_node):
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-bench")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace="countersink_bench",
                                      replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS countersink_bench", prepared=False)
            await client.ensure_schema()
        await ensure_topics(kafka, {TOPIC: args.partitions})

        rng = random.Random(args.seed)
        truth: dict[str, tuple[int, int]] = {}

        def make(i: int) -> tuple[bytes, bytes]:
            key, value = trade(i, rng, args.symbols)
            event = json.loads(value)
            count, qty = truth.get(event["symbol"], (0, 0))
            truth[event["symbol"]] = (count + 1, qty + event["qty"])
            return key, value

        started = time.monotonic()
        await load(kafka, TOPIC, args.partitions, args.events, make, "trades")
        report.load_s = time.monotonic() - started
        say(f"loaded {args.events:,} trades over {len(truth):,} symbols into {args.partitions} partitions "
            f"in {report.load_s:.0f}s")

        jvms = {name: server.process.pid for name, server in (("Cassandra", cassandra_node), ("Kafka", kafka_server))
                if server.process is not None and server.process.pid is not None}
        if args.warmup_seconds > 0:
            # A JVM compiles its hot paths during its first minutes: whichever system ran first would pay for
            # Cassandra's warm-up. Counter-column updates and a consumer's shard writes, not measured.
            say(f"warming Cassandra up ({args.warmup_seconds:.0f} s, not measured)")
            await native_counter_rate(kafka, cassandra, args.partitions, args.events, args.warmup_seconds / 2)
            await warm_up_consumer(kafka, cassandra, args.partitions, args.warmup_seconds / 2)

        say("1/5 raw aiokafka getmany")
        report.rates["raw aiokafka"] = await raw_rate(kafka, args.partitions, args.events)
        say(f"raw aiokafka: {report.rates['raw aiokafka']:,.0f} events/s")

        say("2/5 countersink (count, sum, distinct; exactly-once)")
        run_ = await countersink_rate(kafka, cassandra, args.partitions, args.events, MAIN_GROUP, jvms)
        report.rates["countersink"] = run_.rate
        report.cpu_s_per_million = run_.cpu_s / args.events * 1_000_000
        report.server_cpu_s_per_million = {name: cpu / args.events * 1_000_000
                                           for name, cpu in run_.server_cpu_s.items()}
        report.rows_per_event = run_.rows / args.events
        report.cassandra_rows_per_event = run_.cassandra_rows / args.events
        say(f"countersink: {run_.rate:,.0f} events/s, {report.cpu_s_per_million:.1f} CPU s per million events, "
            f"{report.rows_per_event:.2f} shards per event")
        report.checks = await check_values(cassandra, truth, 2000)
        say(f"checked count and sum of 2,000 symbols against the truth: {len(report.checks)} mismatched")

        # The same run with one thing changed: flushes closer together (4 was the default before 10), and a
        # second process in the group. Each noted with what it cost.
        variants: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
            ("2b/5", SPACING_4, "bench-countersink-spacing-4", {"flush_spacing": 4}),
            ("2c/5", TWO_PROCESSES, "bench-countersink-2-processes", {"processes": 2}))
        for step, name, group, options in variants:
            say(f"{step} {name}")
            run_ = await countersink_rate(kafka, cassandra, args.partitions, args.events, group, jvms, **options)
            report.rates[name] = run_.rate
            report.notes[name] = (f"{run_.rows / args.events:.2f} shards per event; CPU s per million events: "
                                  f"consumers {run_.cpu_s / args.events * 1e6:.1f}, Cassandra "
                                  f"{run_.server_cpu_s.get('Cassandra', 0) / args.events * 1e6:.1f}")
            say(f"{name}: {run_.rate:,.0f} events/s")

        say(f"3/5 Cassandra counter columns, one UPDATE per event ({args.native_seconds:.0f}s at most)")
        rate, done = await native_counter_rate(kafka, cassandra, args.partitions, args.events, args.native_seconds)
        report.rates["Cassandra counter columns"] = rate
        report.notes["Cassandra counter columns"] = f"{done:,} events in the time budget"
        say(f"counter columns: {rate:,.0f} events/s over {done:,} events")

        say(f"4/5 Quix Streams, exactly-once ({args.quix_seconds:.0f}s at most)")
        rate, done = await quix_rate(kafka, args.partitions, args.events, args.quix_seconds, args.quix_python)
        report.rates["Quix Streams (exactly-once)"] = rate
        report.notes["Quix Streams (exactly-once)"] = f"{done:,} events committed"
        say(f"quix streams: {rate:,.0f} events/s over {done:,} events")

        say(f"5/5 Kafka Streams, exactly-once v2 ({args.kstreams_seconds:.0f}s at most)")
        report.kstreams, report.kstreams_checks = await kstreams.bench_step(
            kafka, TOPIC, args.partitions, truth, args.kstreams_seconds, jvms, STACK, kstreams_classpath,
            threads=args.kstreams_threads, commit_ms=args.kstreams_commit_ms)
        report.rates[kstreams.NAME] = report.kstreams["events_per_s"]
        report.notes[kstreams.NAME] = (f"{report.kstreams['committed']:,.0f} events committed; CPU s per million "
                                       f"events: JVM {report.kstreams['jvm_cpu_s_per_million']:.1f}, Kafka "
                                       f"{report.kstreams.get('kafka_cpu_s_per_million', 0):.1f}")
        say(f"kafka streams: {report.notes[kstreams.NAME]}; count and sum of "
            f"{report.kstreams.get('symbols_checked', 0):,.0f} symbols checked against the truth: "
            f"{len(report.kstreams_checks)} mismatched")

        if args.stream2_events > 0:
            from bench import stream2

            say(f"the second stream: {args.stream2_events:,} page views over {args.pages:,} pages, "
                f"{stream2.COUNTERS} counters; countersink (and its variants, and with Kafka Streams' two counters "
                "alone), then Kafka Streams")
            report.stream2 = await stream2.bench_step(
                kafka, cassandra, events=args.stream2_events, pages=args.pages, partitions=args.partitions,
                seed=args.seed, variants=args.stream2_variant,
                kstreams_budget_s=args.kstreams_seconds, servers_by_name=jvms, workdir=STACK,
                classpath=kstreams_classpath, kstreams_threads=args.kstreams_threads,
                kstreams_commit_ms=args.kstreams_commit_ms)
            say(f"page views: {sum(len(report.stream2[k]) for k in STREAM2_CHECKS)} values mismatched")

        from bench.hot_path import measure

        # The regime: keys repeating over 10,000 symbols; every path side by side, best of three.
        report.hot_path_us = measure(100_000, 10_000, 3, args.seed)
        report.apply_only = 1e6 / report.hot_path_us["batch, collector tuned"]["keys repeating"]
        say("decode + route + apply alone, in process: " + ", ".join(
            f"{name} {figures['keys repeating']:.2f} µs/event" for name, figures in report.hot_path_us.items()))
        # Each shape of definition on one stream (bench.shapes), rounds of one hour of it: a bucketed counter pays
        # for its new instances each hour, which a shorter round may not meet.
        from bench.hot_path import measure_shapes, slowest_shape

        report.hot_path_shape_events = args.shape_events
        say(f"decode + route + apply by shape of definition ({args.shape_events:,} events a round, best of three)")
        report.hot_path_shapes = measure_shapes(args.shape_events, 10_000, 3, args.seed)
        name, ratio = slowest_shape(report.hot_path_shapes)
        say(f"the slowest shape of the bench's three counters: {name}, {ratio:.2f}× flat")

        say("GC of the countersink run's shards")
        report.gc = await gc_throughput(kafka, cassandra)
        say(f"GC: {report.gc['instances_folded']:,.0f} instances in {report.gc['seconds']:.1f}s "
            f"({report.gc['instances_per_s']:,.0f}/s)")

        say("read latency")
        report.read_latency_ms = await read_latencies(cassandra, args.read_rounds)
        say("roll-up latency")
        report.rollup_latency_ms = await rollup_latencies(cassandra, args.read_rounds)
        say("wide instances: 1 to 1,000 shards, and range reads of 100-shard buckets")
        report.wide_latency_ms = await wide_latencies(cassandra, args.wide_rounds)
        say("wide instances: the cached reads beside the plain row alone")
        report.wide_alone_latency_ms = await wide_alone_latencies(cassandra, 10 * args.wide_rounds)
        say("memory per live instance")
        report.memory_bytes = memory_per_instance(args.memory_instances)

        largest = args.recovery_instances[-1]
        runs = [(instances, True, 6_000) for instances in args.recovery_instances]
        # the largest state again, killed with its last window open, and with a longer session timeout
        runs += [(largest, False, 6_000), (largest, True, 10_000)]
        for instances, quiet, timeout_ms in runs:
            state = "quiet" if quiet else "killed right after a flush (window open)"
            timeout = f"session timeout {timeout_ms // 1000} s" + (" (the default)" if timeout_ms == 6_000 else "")
            say(f"recovery after kill -9 with {instances:,} live instances, {state}, {timeout}")
            result = await recovery(kafka, cassandra, instances, timeout_ms, quiet=quiet)
            report.recovery_s[f"{instances:,} instances, {state}, {timeout}"] = result
            say(f"recovered in {result['seconds']:.1f}s")

        if report.rates["countersink"] < 0.6 * report.rates["raw aiokafka"] and args.profile:
            say("countersink is under 0.6x the raw rate: the consumer run again, its stacks sampled by py-spy")
            profile = STACK / "consumer-stacks.txt"
            await countersink_rate(kafka, cassandra, args.partitions, args.events, "bench-profiled", jvms, profile)
            report.profile = profile_table(profile)
    say("servers stopped")
    return report


def profile_table(path: Path, limit: int = 22) -> str:
    """The functions holding most samples of py-spy's collapsed stacks: own share (the function itself was
    running) and total share (it was on the stack), as a Markdown table."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_frame_name(frame) for frame in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    if not samples:
        raise RuntimeError(f"py-spy recorded no samples in {path}")
    rows = [f"| `{name}` | {n / samples:.1%} | {total[name] / samples:.1%} |" for name, n in own.most_common(limit)]
    return "\n".join([f"{samples:,} samples of the consumer's main thread.", "",
                      "| function | own | total |", "|---|---:|---:|", *rows])


def _frame_name(frame: str) -> str:
    """``apply (<repo>/consumer/protocol.py:212)`` -> ``consumer/protocol.py: apply``: paths relative to the
    repository or to site-packages (``aiokafka/consumer/fetcher.py``), else the last two parts
    (``asyncio/events.py``); py-spy's idle frames stay as they are."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    path = where.rsplit(":", 1)[0]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif path.startswith(f"{ROOT}/"):
        path = path.removeprefix(f"{ROOT}/")
    else:
        path = "/".join(path.split("/")[-2:])
    return f"{path}: {name}"


def stream2_variant(spec: str) -> tuple[str, dict[str, dict[str, object]]]:
    from bench.stream2 import variant

    return variant(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--symbols", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--native-seconds", type=float, default=60.0,
                        help="time budget of the counter-column run (it is measured over what it got through)")
    parser.add_argument("--quix-seconds", type=float, default=240.0, help="time budget of the Quix Streams run")
    parser.add_argument("--quix-python", type=Path, default=QUIX_PYTHON,
                        help="the Python that runs Quix Streams (a virtual environment of its own: `make bench` makes "
                             f"{QUIX_PYTHON.relative_to(ROOT)} from bench/quix-requirements.txt)")
    parser.add_argument("--kstreams-seconds", type=float, default=300.0,
                        help="time budget of the Kafka Streams run (its values are checked only if it finishes)")
    parser.add_argument("--kstreams-threads", type=int, default=1,
                        help="num.stream.threads of the Kafka Streams application (one process, like the others)")
    parser.add_argument("--kstreams-commit-ms", type=int, default=100,
                        help="commit.interval.ms of the Kafka Streams application (100: its exactly-once default)")
    parser.add_argument("--warmup-seconds", type=float, default=40.0,
                        help="Cassandra warm-up before the measured runs (0: none)")
    parser.add_argument("--read-rounds", type=int, default=2_000)
    parser.add_argument("--wide-rounds", type=int, default=150, help="rounds of bench.wide_reads (each reads "
                        "every wide instance and range, a few seconds a round)")
    parser.add_argument("--memory-instances", type=int, default=100_000)
    parser.add_argument("--recovery-instances", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the consumer run sampled by py-spy, made when a target is missed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stream2-events", type=int, default=None,
                        help="page views in the second stream (default: as many as --events, at most 1,000,000; "
                        "0: no second stream)")
    parser.add_argument("--pages", type=int, default=20_000, help="distinct pages of the second stream")
    parser.add_argument("--stream2-variant", type=stream2_variant, action="append", default=[],
                        metavar="SECTION.NAME=VALUE,…", help="the second stream counted again by countersink with "
                        "these settings (repeatable; consumer.flush_spacing=30, cassandra.write_batch_rows=20)")
    parser.add_argument("--shape-events", type=int, default=EVENTS_PER_HOUR,
                        help="events per round of the hot path by shape of definition (default: an hour of the "
                        "stream, so that each round makes its hour's new bucketed instances)")
    parser.add_argument("--quick", action="store_true", help="a small run to try the machinery (200k events)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    if "--quick" in (argv if argv is not None else sys.argv[1:]):  # smaller defaults; explicit options still win
        parser.set_defaults(events=200_000, symbols=10_000, native_seconds=15.0, quix_seconds=60.0, read_rounds=300,
                            wide_rounds=30, kstreams_seconds=90.0, memory_instances=20_000,
                            recovery_instances=[10_000, 100_000], pages=5_000, shape_events=7_200)
    args = parser.parse_args(argv)
    if args.stream2_events is None:
        args.stream2_events = min(args.events, 1_000_000)
    if not args.quix_python.exists():
        parser.error(f"--quix-python {args.quix_python}: no such file (`make bench` makes .venv-quix; or "
                     f"python -m venv .venv-quix && .venv-quix/bin/pip install -r bench/quix-requirements.txt)")
    configure_logging("WARNING", "console")
    command = "python -m bench.pipeline " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        report = asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    from bench.report import write_report

    text = write_report(report, args.out, command.strip())
    print(text)
    stream2_checks = [problem for name in STREAM2_CHECKS for problem in report.stream2.get(name, [])]
    return 0 if not report.checks and not report.kstreams_checks and not stream2_checks else 1


if __name__ == "__main__":
    sys.exit(main())
