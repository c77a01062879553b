"""The live counters' throughput while a backfill runs beside them, measured in one run on one stack.

    python -m bench.backfill [--history 400000] [--burst 200000] [--partitions 6] [--quick] [--port-offset 0]

It starts its own Kafka and Cassandra (ports 25092 and 25042 plus ``--port-offset``, data under
``.stack/bench-backfill``) and loads ``--history`` trades. A consumer without ``volume`` counts them; a
consumer with ``volume`` (``since = "earliest"``) then takes the partitions over and records their hand-overs
(so the history is what ``countersink backfill volume`` has to count). Twice, from the same state, it stops
the consumer, publishes a burst of ``--burst`` trades and starts the consumer again, timing it from its start
until every partition's last record is flushed: once alone, once with ``countersink backfill volume``
started beside it at the same moment. It prints both rates (events per second, a consumer's start included)
and their ratio, whether the backfill was still running when the live consumer caught up, and checks
``volume`` of a sample of symbols against the truth once the backfill is done. Everything it starts, it
stops.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.pipeline import bench_servers, load, stop_process, trade
from countersink.backfills import read_handovers
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.retry import Backoff, pause_unless_stopped
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers
from stack.loading import child_env, end_offsets, wait_until_flushed

ROOT = Path(__file__).resolve().parents[1]
STACK = servers.STACK_DIR / "bench-backfill"
TOPIC = "bench-backfill-trades"
GROUP = "bench-backfill"
SYMBOLS = 10_000
LIVE = f"""
[[counter]]
name = "trades"
topics = ["{TOPIC}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "shares"
topics = ["{TOPIC}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"
"""
VOLUME = f"""
[[counter]]
name = "volume"
topics = ["{TOPIC}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"
since = "earliest"
"""


def say(message: str) -> None:
    print(f"[bench.backfill {time.strftime('%H:%M:%S')}] {message}", flush=True)


def start(module: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
    with open(STACK / log_name, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", *module], cwd=ROOT, env=env, stdout=log, stderr=log)


async def catch_up(kafka: KafkaSettings, cassandra: CassandraSettings, env: dict[str, str], partitions: int,
                   label: str, beside: list[str] | None = None) -> tuple[float, subprocess.Popen[bytes] | None]:
    """Start the consumer (and ``beside``, a command, at the same moment) and return the seconds until every
    partition's last record is flushed, with the process started beside (still running, or done)."""
    ends = await end_offsets(kafka, {TOPIC: partitions})
    started = time.monotonic()
    consumer = start(["consumer"], env, f"{label}.log")
    other = None if beside is None else start(beside, env, f"{label}-backfill.log")
    try:
        await wait_until_flushed(cassandra, GROUP, ends, 1800)
        return time.monotonic() - started, other
    finally:
        if stop_process(consumer) != 0:
            raise RuntimeError(f"the consumer exited {consumer.returncode}; see {STACK / label}.log")


async def run(args: argparse.Namespace) -> int:
    STACK.mkdir(parents=True, exist_ok=True)
    for old in STACK.glob("*.log"):
        old.unlink()
    shift = args.port_offset
    with bench_servers(STACK, kafka_port=25092 + shift, native_port=25042 + shift, storage_port=25000 + shift,
                       jmx_port=25199 + shift, cluster_name="countersink-bench-backfill") as (kafka_server, _):
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-bench-backfill")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=25042 + shift,
                                      keyspace="countersink_bench_backfill", request_timeout_s=10.0)
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS countersink_bench_backfill", prepared=False)
            await client.ensure_schema()
        await ensure_topics(kafka, {TOPIC: args.partitions})
        before, after = STACK / "live.toml", STACK / "live-and-volume.toml"
        before.write_text(LIVE)
        after.write_text(LIVE + VOLUME)
        rng = random.Random(args.seed)
        events: list[tuple[bytes, bytes]] = []

        def make(i: int) -> tuple[bytes, bytes]:
            events.append(trade(i, rng, SYMBOLS))
            return events[-1]

        def shifted(offset: int, i: int) -> tuple[bytes, bytes]:
            return make(offset + i)

        options: dict[str, object] = {"group_id": GROUP, "health_port": 0, "dead_letter_topic": f"{GROUP}-dlq"}
        old_env = child_env(kafka, cassandra, consumer={**options, "counters_file": before})
        new_env = child_env(kafka, cassandra, consumer={**options, "counters_file": after})
        for env in (old_env, new_env):
            env["COUNTERSINK_LOG_LEVEL"] = "WARNING"
        say(f"loading {args.history:,} trades over {SYMBOLS:,} symbols into {args.partitions} partitions (the history)")
        await load(kafka, TOPIC, args.partitions, args.history, make, "history")
        seconds, _ = await catch_up(kafka, cassandra, old_env, args.partitions, "history")
        say(f"history counted without volume in {seconds:.0f}s; hand-overs of volume recorded by a consumer with it")
        consumer = start(["consumer"], new_env, "handover.log")
        try:
            async with CassandraClient(cassandra) as client:
                pauses = Backoff(first_s=0.2, max_s=1.0).pauses()
                while len(await read_handovers(client, GROUP, "volume")) < args.partitions:
                    await pause_unless_stopped(pauses(), None)
        finally:
            stop_process(consumer)
        rates: dict[str, float] = {}
        backfill: subprocess.Popen[bytes] | None = None
        command = ["countersink.cli", "backfill", "volume", "--counters", str(after), "--group", GROUP]
        for label, beside in (("alone", None), ("beside a backfill", command)):
            await load(kafka, TOPIC, args.partitions, args.burst, functools.partial(shifted, len(events)),
                       f"burst ({label})")
            seconds, other = await catch_up(kafka, cassandra, new_env, args.partitions,
                                            label.replace(" ", "-"), beside)
            rates[label] = args.burst / seconds
            say(f"live consumer {label}: {args.burst:,} trades flushed in {seconds:.1f}s, "
                f"{rates[label]:,.0f} events/s")
            if other is not None:
                backfill = other
                still = other.poll() is None
                say(f"the backfill was {'still running' if still else f'done (exit {other.returncode})'} when the "
                    "live consumer caught up")
        assert backfill is not None
        started = time.monotonic()
        code = await asyncio.to_thread(backfill.wait, 1800)
        say(f"backfill exit {code}, {time.monotonic() - started:.0f}s after the live consumer caught up")
        # volume is the sum of every trade's qty (the history below H by the backfill, the rest live).
        truth: Counter[str] = Counter()
        for _, value in events:
            event = json.loads(value)
            truth[event["symbol"]] += event["qty"]
        sample = sorted(truth)[:: max(1, len(truth) // 200)]
        wrong = 0
        async with CassandraClient(cassandra) as client:
            for symbol in sample:
                state = await read_state(client, "volume", symbol)
                wrong += (0 if state is None else state.value()) != truth[symbol]
        ratio = rates["beside a backfill"] / rates["alone"]
        print(f"live consumer alone: {rates['alone']:,.0f} events/s; beside a backfill: "
              f"{rates['beside a backfill']:,.0f} events/s; ratio {ratio:.2f}")
        print(f"backfill of {args.history:,} history trades: exit {code}; volume checked on {len(sample)} symbols: "
              f"{wrong} wrong")
        return 0 if code == 0 and wrong == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backfill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, help="trades before the counter is added (default 400,000; "
                        "100,000 with --quick)")
    parser.add_argument("--burst", type=int, help="trades the live consumer catches up on, each time (default "
                        "200,000; 50,000 with --quick)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--port-offset", type=int, default=0, metavar="N",
                        help="add N to every port of the run's own Kafka and Cassandra (25092, 25093, 25042, "
                        "25000, 25199)")
    args = parser.parse_args()
    if args.history is None:
        args.history = 100_000 if args.quick else 400_000
    if args.burst is None:
        args.burst = 50_000 if args.quick else 200_000
    configure_logging("WARNING", "console")
    try:
        return asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"[bench.backfill] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
