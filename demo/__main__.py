"""``python -m demo`` (``make demo``): start Kafka and Cassandra, run two consumers and a GC loop on a sample
stream of trades, likes and API calls (with publisher retries and malformed events), wait until every record
is counted, and print every counter kind beside the truth computed from the sample, with its shard count.
Then stop the consumers, run GC once and print the table again: the same values from fewer shards. Exits 0
only if every value matches both times (sketches within their stated bounds). Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import TopicPartition

from consumer.protocol import MIN_LIFETIME_US
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics, make_consumer
from countersink.logs import configure_logging
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings, KafkaSettings
from demo.checks import Row, compare
from demo.sample import Truth, make_stream
from stack import servers
from stack.loading import child_env, end_offsets, publish, wait_until_flushed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STACK = servers.STACK_DIR / "demo"
GROUP = "demo"
DEAD_LETTERS = "demo-dead-letter"
PARTITIONS = {"demo-trades": 6, "demo-likes": 3, "demo-api-calls": 2, "demo-views": 2, "demo-purchases": 2,
              "demo-clicks": 1}
GC_GRACE_S = 1.0
EXACT_KINDS = ("sum", "count", "min", "max")


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def start_servers() -> tuple[servers.KafkaServer, servers.CassandraNode]:
    kafka = servers.KafkaServer(port=29092, controller_port=29093, root=STACK / "kafka")
    cassandra = servers.CassandraNode(native_port=29042, storage_port=27000, jmx_port=27199, seeds="127.0.0.1:27000",
                                      cluster_name="countersink-demo", root=STACK / "cassandra")
    say(f"starting Kafka {servers.KAFKA_VERSION} and Cassandra {servers.CASSANDRA_VERSION} (first run fetches jars)")
    started = time.monotonic()
    kafka.start(tied_to_parent=True, wait=False)
    cassandra.start(tied_to_parent=True, wait=False)
    try:
        kafka.wait_ready()
        say(f"kafka ready on {kafka.bootstrap} after {time.monotonic() - started:.0f}s")
        cassandra.wait_ready()
        say(f"cassandra ready on 127.0.0.1:29042 after {time.monotonic() - started:.0f}s")
    except BaseException:
        kafka.stop()
        cassandra.stop()
        raise
    return kafka, cassandra


def demo_env(kafka: KafkaSettings, cassandra: CassandraSettings) -> dict[str, str]:
    # Mutators rotate every 15 s, so the GC loop has retired mutators to fold while the demo runs; one
    # machine has one clock, so a grace of 1 s is enough.
    return child_env(kafka, cassandra, consumer={
        "group_id": GROUP, "counters_file": HERE / "counters.toml", "dead_letter_topic": DEAD_LETTERS,
        "health_port": 0, "mutator_max_age_s": 15}, gc={"grace_s": GC_GRACE_S, "health_port": 0})


async def publish_stream(kafka: KafkaSettings, stream: dict[str, list[bytes]]) -> None:
    total = sum(len(events) for events in stream.values())
    done = 0
    for topic, events in stream.items():
        await publish(kafka, topic, events)
        done += len(events)
        say(f"published {done}/{total} events ({topic}: {len(events)})")


async def wait_for_lag_zero(kafka: KafkaSettings, cassandra: CassandraSettings, timeout_s: float = 300) -> None:
    started = time.monotonic()
    await wait_until_flushed(cassandra, GROUP, await end_offsets(kafka, PARTITIONS), timeout_s,
                             lambda behind: say(f"waiting for the consumers: {behind} records not yet flushed"))
    say(f"lag 0: every record counted and flushed after {time.monotonic() - started:.0f}s")


async def count_dead_letters(kafka: KafkaSettings) -> int:
    consumer = make_consumer(kafka, DEAD_LETTERS, group_id=None, auto_offset_reset="earliest")
    async with consumer:
        tp = TopicPartition(DEAD_LETTERS, 0)
        return int((await consumer.end_offsets([tp]))[tp])


def start_processes(module: str, args: list[str], count: int, env: dict[str, str], log_path: Path
                    ) -> list[subprocess.Popen[bytes]]:
    with open(log_path, "ab") as log:
        return [subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=log, stderr=log)
                for _ in range(count)]


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (a clean release), then SIGKILL after a minute."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def print_table(rows: list[Row], shards: list[int]) -> None:
    width = max(len(r.value_text) for r in rows)
    print(f"{'counter':<17}{'kind':<15}{'key':<17}{'countersink':<{width + 2}}{'truth':<28}{'shards':<8}ok")
    print("-" * (89 + width))
    for r, n in zip(rows, shards, strict=True):
        print(f"{r.counter:<17}{r.kind:<15}{r.key:<17}{r.value_text:<{width + 2}}{r.truth_text:<28}{n:<8}"
              f"{'yes' if r.ok else 'NO'}")


async def read_table(cassandra: CassandraSettings, truth: Truth) -> tuple[list[Row], list[int]]:
    """Every row beside the truth, and how many shards each row's instance is read from."""
    async with CassandraClient(cassandra) as client:
        reader = CounterReader(client)
        rows = await compare(reader, truth)
        shards = [sum([len((await reader.explain(r.counter, key)).shards) for key in r.buckets or (r.instance_key,)])
                  for r in rows]
    return rows, shards


def run_gc_once(env: dict[str, str]) -> int:
    """``countersink gc --once``, its summary shown as it comes."""
    done = subprocess.run([sys.executable, "-m", "gc_worker", "--once", "--no-progress"], cwd=ROOT,
                          env={**env, "COUNTERSINK_LOG_LEVEL": "WARNING"}, stdout=subprocess.PIPE, text=True,
                          check=False)
    for line in done.stdout.splitlines():
        say(f"gc | {line}")
    return done.returncode


async def run() -> int:
    kafka_server, cassandra_node = start_servers()
    consumers: list[subprocess.Popen[bytes]] = []
    gc_loop: list[subprocess.Popen[bytes]] = []
    log_path = STACK / "consumers.log"
    try:
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-demo")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace="countersink_demo")
        env = demo_env(kafka, cassandra)
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.ensure_schema()
        await ensure_topics(kafka, PARTITIONS)
        say(f"topics created: {', '.join(f'{t} ({n} partitions)' for t, n in PARTITIONS.items())}")
        stream, truth = make_stream(trades=20_000, likes=8_000, api_calls=6_000, duplicates=400, malformed=30,
                                    formatted=500)
        consumers.extend(start_processes("consumer", [], 2, env, log_path))
        gc_loop.extend(start_processes("gc_worker", ["--every", "5s"], 1, env, STACK / "gc.log"))
        say(f"two consumers and a GC loop (every 5 s) started (logs: {log_path}, {STACK / 'gc.log'})")
        await publish_stream(kafka, stream)
        await wait_for_lag_zero(kafka, cassandra)
        rows, shards = await read_table(cassandra, truth)
        print()
        print_table(rows, shards)
        dead = await count_dead_letters(kafka)
        print()
        say(f"dead-letter topic {DEAD_LETTERS}: {dead} records (malformed events published: {truth.malformed}); "
            f"publisher retries dropped: {truth.duplicates}")
        failures = [r for r in rows if not r.ok] + ([] if dead >= truth.malformed else ["dead letters"])
        say("every value matches the truth" if not failures else f"{len(failures)} values do NOT match")

        stop_processes(consumers + gc_loop)
        consumers.clear()
        gc_loop.clear()
        say("consumers stopped (every mutator retired) and the GC loop stopped; running GC once")
        await asyncio.sleep(MIN_LIFETIME_US / 1e6 + GC_GRACE_S)  # retire times may be up to 1 s ahead; then the grace
        gc_code = run_gc_once(env)
        after, shards_after = await read_table(cassandra, truth)
        print()
        print_table(after, shards_after)
        print()
        # Exact kinds must read the same digits. A KLL merge is randomized, so a p99 read from a folded tally
        # may differ from one merged from shards; both must lie within the sketch's bound (the ok column).
        same = all(a.value_text == b.value_text for a, b in zip(rows, after, strict=True) if a.kind in EXACT_KINDS)
        say(f"after GC: shards {sum(shards)} -> {sum(shards_after)}; exact values "
            + ("unchanged, sketches within their bounds" if same else "CHANGED"))
        failures += [r for r in after if not r.ok] + ([] if same and gc_code == 0 else ["gc"])
        say("every value matches the truth" if not failures else f"{len(failures)} checks do NOT pass")
        return 0 if not failures else 1
    finally:
        stop_processes(consumers + gc_loop)
        say("stopping the servers")
        kafka_server.stop()
        cassandra_node.stop()


def main(argv: list[str] | None = None) -> int:
    # No options: the parser is there so that --help says what the demo does instead of starting it.
    argparse.ArgumentParser(prog="python -m demo", description=__doc__).parse_args(argv)
    configure_logging("WARNING", "console")  # the demo speaks through its own lines; warnings still show
    try:
        return asyncio.run(run())
    except servers.StackError as exc:
        print(f"[demo] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
