"""``make chaos``: a long run under faults that ends by comparing every counter with the truth.

    python -m bench.chaos [--events 1000000] [--consumers 3] [--kill-every 6] [--seed 1]

It starts its own Kafka and Cassandra (ports 19092 and 19042, data under ``.stack/chaos``), three consumers
and a GC loop, and publishes the events (trades over 500 symbols, with publisher retries and malformed
records) while it injects faults: kill -9 of a random consumer every few seconds (restarted a moment
later), one Kafka broker restart, one Cassandra restart, one zombie (a consumer frozen with SIGSTOP past its
session timeout, then resumed) and one kill -9 of the GC loop. When everything is published and flushed it
stops the consumers, runs GC once, and compares count, integer sum, decimal sum, min and max of every
symbol with the truth computed from what was published. It prints ``lost=N duplicated=M`` (events missing
from, or counted twice in, the trade counts) and the faults injected, and exits 0 only if both are 0 and
every value matches. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers
from stack.loading import child_env, end_offsets, publish, wait_until_flushed

ROOT = Path(__file__).resolve().parents[1]
STACK = servers.STACK_DIR / "chaos"
TOPIC = "chaos-trades"
PARTITIONS = 6
GROUP = "chaos"
SESSION_TIMEOUT_MS = 6000
DEFINITIONS = f"""
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

[[counter]]
name = "notional"
topics = ["{TOPIC}"]
kind = "sum"
number = "decimal"
key = ["symbol"]
value = "price"
event_id = "id"

[[counter]]
name = "smallest"
topics = ["{TOPIC}"]
kind = "min"
key = ["symbol"]
value = "qty"

[[counter]]
name = "largest"
topics = ["{TOPIC}"]
kind = "max"
key = ["symbol"]
value = "qty"
"""


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Truth:
    count: Counter[str] = field(default_factory=Counter)
    qty: Counter[str] = field(default_factory=Counter)
    notional: defaultdict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    smallest: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)

    def expected(self) -> dict[str, dict[str, object]]:
        return {"trades": dict(self.count), "shares": dict(self.qty), "notional": dict(self.notional),
                "smallest": dict(self.smallest), "largest": dict(self.largest)}


def make_events(n: int, rng: random.Random, symbols: int = 500, retries: float = 0.02, malformed: float = 0.001
                ) -> tuple[list[bytes], Truth, int, int]:
    """``n`` distinct trades; a publisher retry (the same bytes again, a few records later) for a fraction of
    them, and some malformed records. Returns the stream, the truth, and how many retries and bad records."""
    truth = Truth()
    stream: list[bytes] = []
    pending: list[tuple[int, bytes]] = []
    resent = bad = 0
    for i in range(n):
        symbol = f"S{rng.randrange(symbols):03d}"
        qty = rng.randrange(1, 10_000)
        price = Decimal(rng.randrange(1, 1_000_000)) / 100
        event = f'{{"id":"{uuid.UUID(int=rng.getrandbits(128)).hex}","symbol":"{symbol}","qty":{qty},"price":{price}}}'
        stream.append(event.encode())
        truth.count[symbol] += 1
        truth.qty[symbol] += qty
        truth.notional[symbol] += price
        truth.smallest[symbol] = min(qty, truth.smallest.get(symbol, qty))
        truth.largest[symbol] = max(qty, truth.largest.get(symbol, qty))
        if rng.random() < retries:
            pending.append((i + rng.randrange(1, 200), stream[-1]))
        while pending and pending[0][0] <= i:
            stream.append(pending.pop(0)[1])
            resent += 1
        if rng.random() < malformed:
            stream.append(rng.choice([b"{not json", b'{"id":"x","symbol":"S001","qty":"many"}', b""]))
            bad += 1
    stream.extend(event for _, event in pending)
    return stream, truth, resent + len(pending), bad


class Fleet:
    """The consumer processes and the GC loop, restartable by slot."""

    def __init__(self, env: dict[str, str], consumers: int) -> None:
        self.env = env
        self.consumers: list[subprocess.Popen[bytes]] = [self._start("consumer", [], f"consumer-{i}")
                                                         for i in range(consumers)]
        self.gc = self._start("gc_worker", ["--every", "3s"], "gc")

    def _start(self, module: str, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(STACK / f"{name}.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=self.env, stdout=log,
                                    stderr=log)

    def restart_consumer(self, slot: int) -> None:
        self.consumers[slot] = self._start("consumer", [], f"consumer-{slot}")

    def revive(self) -> list[tuple[str, int]]:
        """Restart whatever exited on its own, as a supervisor would; returns (name, exit code) of each."""
        exited = []
        for slot, process in enumerate(self.consumers):
            if process.poll() is not None:
                exited.append((f"consumer {slot}", process.returncode))
                self.restart_consumer(slot)
        if self.gc.poll() is not None:
            exited.append(("gc", self.gc.returncode))
            self.restart_gc()
        return exited

    def restart_gc(self) -> None:
        self.gc = self._start("gc_worker", ["--every", "3s"], "gc")

    def stop(self) -> list[int | None]:
        processes = [*self.consumers, self.gc]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        codes = []
        for process in processes:
            try:
                codes.append(process.wait(timeout=60))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


@dataclass
class Faults:
    kills: int = 0
    kafka_restarts: int = 0
    cassandra_restarts: int = 0
    zombies: int = 0
    gc_kills: int = 0
    unexpected_exits: list[tuple[str, int]] = field(default_factory=list)  # not a fault we injected

    @property
    def total(self) -> int:
        return self.kills + self.kafka_restarts + self.cassandra_restarts + self.zombies + self.gc_kills


async def inject(fleet: Fleet, kafka: servers.KafkaServer, cassandra: servers.CassandraNode, faults: Faults,
                 rng: random.Random, kill_every_s: float, done: asyncio.Event) -> None:
    """Faults on a schedule until ``done``: kills throughout, one of each other fault at set moments.
    Server restarts block this loop on purpose: the servers must be started from the main thread."""
    started = time.monotonic()
    plan = {"kafka": 25.0, "zombie": 45.0, "cassandra": 70.0, "gc": 100.0}
    while not done.is_set() or plan:
        await asyncio.sleep(kill_every_s * rng.uniform(0.6, 1.4))
        for name, code in fleet.revive():
            faults.unexpected_exits.append((name, code))
            say(f"{name} exited by itself with code {code}; restarted")
        elapsed = time.monotonic() - started
        if "kafka" in plan and elapsed >= plan["kafka"]:
            del plan["kafka"]
            say("fault: restarting the Kafka broker")
            seconds = kafka.restart(tied_to_parent=True)
            faults.kafka_restarts += 1
            say(f"kafka back after {seconds:.0f}s")
            continue
        if "cassandra" in plan and elapsed >= plan["cassandra"]:
            del plan["cassandra"]
            say("fault: restarting Cassandra (consumers wait and retry their flushes)")
            seconds = cassandra.restart(tied_to_parent=True)
            faults.cassandra_restarts += 1
            say(f"cassandra back after {seconds:.0f}s")
            continue
        if "zombie" in plan and elapsed >= plan["zombie"]:
            del plan["zombie"]
            slot = rng.randrange(len(fleet.consumers))
            frozen = fleet.consumers[slot]
            frozen.send_signal(signal.SIGSTOP)
            say(f"fault: consumer {slot} frozen (SIGSTOP) past its session timeout")
            await asyncio.sleep(SESSION_TIMEOUT_MS / 1000 + 6)
            frozen.send_signal(signal.SIGCONT)
            faults.zombies += 1
            say(f"consumer {slot} resumed (SIGCONT): a zombie until it learns it was replaced")
            continue
        if "gc" in plan and elapsed >= plan["gc"]:
            del plan["gc"]
            fleet.gc.kill()
            fleet.gc.wait()
            faults.gc_kills += 1
            say("fault: GC loop killed (kill -9) and restarted")
            fleet.restart_gc()
            continue
        if done.is_set():
            continue  # only the planned faults are left
        slot = rng.randrange(len(fleet.consumers))
        fleet.consumers[slot].kill()
        fleet.consumers[slot].wait()
        faults.kills += 1
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        fleet.restart_consumer(slot)
        say(f"fault: consumer {slot} killed (kill -9) and restarted ({faults.kills} kills so far)")


async def read_values(cassandra: CassandraSettings, truth: Truth) -> dict[str, dict[str, object]]:
    values: dict[str, dict[str, object]] = {name: {} for name in truth.expected()}
    async with CassandraClient(cassandra) as client:
        for counter in values:
            for symbol in truth.count:
                state = await read_state(client, counter, symbol)
                values[counter][symbol] = None if state is None else state.value()
    return values


def ownership_changes() -> tuple[int, int]:
    """(takeovers, rotations) recorded in the consumers' logs."""
    takeovers = rotations = 0
    for log in STACK.glob("consumer-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"partition_taken_over"' in line:
                takeovers += 1
            elif '"mutator_rotated"' in line:
                rotations += 1
    return takeovers, rotations


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    STACK.mkdir(parents=True, exist_ok=True)
    for old in STACK.glob("*.log"):
        old.unlink()
    # Ports below Linux's ephemeral range (32768-60999): a readiness probe of a port in that range, sent
    # before the server listens, can be given that same port as its own and connect to itself, and the
    # server then fails to bind.
    kafka_server = servers.KafkaServer(port=19092, controller_port=19093, root=STACK / "kafka")
    cassandra_node = servers.CassandraNode(native_port=19042, storage_port=17000, jmx_port=17199,
                                           seeds="127.0.0.1:17000", cluster_name="countersink-chaos",
                                           root=STACK / "cassandra")
    say("starting Kafka and Cassandra")
    kafka_server.start(tied_to_parent=True, wait=False)
    cassandra_node.start(tied_to_parent=True, wait=False)
    fleet: Fleet | None = None
    try:
        kafka_server.wait_ready()
        cassandra_node.wait_ready()
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-chaos")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=19042, keyspace="countersink_chaos",
                                      request_timeout_s=5.0)
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS countersink_chaos", prepared=False)
            await client.ensure_schema()
        await ensure_topics(kafka, {TOPIC: PARTITIONS})
        counters = STACK / "counters.toml"
        counters.write_text(DEFINITIONS)
        stream, truth, retries, bad = make_events(args.events, rng)
        say(f"{args.events} trades over {len(truth.count)} symbols, {retries} publisher retries, {bad} malformed "
            f"records: {len(stream)} records")
        env = child_env(kafka, cassandra, consumer={
            "group_id": GROUP, "counters_file": counters, "dead_letter_topic": "chaos-dead-letter",
            "session_timeout_ms": SESSION_TIMEOUT_MS, "health_port": 0, "mutator_max_age_s": 20,
            "flush_interval_s": 0.5}, gc={"grace_s": 2, "health_port": 0})
        fleet = Fleet(env, args.consumers)
        faults = Faults()
        done = asyncio.Event()
        injector = asyncio.create_task(inject(fleet, kafka_server, cassandra_node, faults, rng, args.kill_every,
                                              done))
        started = time.monotonic()
        chunk = max(1, len(stream) // 100)
        for i in range(0, len(stream), chunk):
            await publish(kafka, TOPIC, stream[i:i + chunk])
            await asyncio.sleep(0.5)
            if i // chunk % 10 == 9:
                say(f"published {min(len(stream), i + chunk)}/{len(stream)} records")
        say(f"all {len(stream)} records published after {time.monotonic() - started:.0f}s; "
            "waiting for the planned faults, then for the consumers")
        done.set()
        await injector
        ends = await end_offsets(kafka, {TOPIC: PARTITIONS})
        await wait_until_flushed(cassandra, GROUP, ends, 600,
                                 lambda behind: say(f"{behind} records not yet flushed"))
        for name, code in fleet.revive():
            faults.unexpected_exits.append((name, code))
        say(f"lag 0 after {time.monotonic() - started:.0f}s; stopping the consumers and the GC loop")
        codes = fleet.stop()
        fleet = None
        await asyncio.sleep(3.5)  # retire times up to 1 s ahead, then the GC grace
        gc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gc_worker", "--once", "--json", "--no-progress", cwd=ROOT,
            env={**env, "COUNTERSINK_LOG_LEVEL": "WARNING"}, stdout=asyncio.subprocess.PIPE)
        out = (await gc.communicate())[0].decode().strip()
        report = json.loads(out.splitlines()[-1]) if out else {}
        say(f"final GC: exit {gc.returncode}, folded {report.get('instances_folded')} instances, "
            f"{report.get('mutators_collected')} mutators collected")
        values = await read_values(cassandra, truth)
        expected = truth.expected()
        counted = {s: int(v or 0) for s, v in values["trades"].items()}  # type: ignore[call-overload]
        lost = sum(max(0, n - counted.get(s, 0)) for s, n in truth.count.items())
        duplicated = sum(max(0, counted.get(s, 0) - n) for s, n in truth.count.items())
        mismatched = [f"{c}/{s}: {values[c].get(s)!r} != {v!r}" for c, by in expected.items() for s, v in by.items()
                      if values[c].get(s) != v]
        takeovers, rotations = ownership_changes()
        say(f"exit codes at stop (consumers, GC loop): {codes}")
        print(f"faults={faults.total} (kill -9: {faults.kills}, kafka restarts: {faults.kafka_restarts}, "
              f"cassandra restarts: {faults.cassandra_restarts}, zombies: {faults.zombies}, "
              f"gc kills: {faults.gc_kills}); partition takeovers: {takeovers - rotations} by rebalance, "
              f"{rotations} by rotation")
        print(f"unexpected exits: {faults.unexpected_exits or 'none'}")
        print(f"checked {sum(len(v) for v in expected.values())} values of {len(expected)} counters "
              f"over {len(truth.count)} symbols; mismatched={len(mismatched)}")
        for line in mismatched[:10]:
            print(f"  {line}")
        print(f"lost={lost} duplicated={duplicated}")
        return 0 if lost == 0 and duplicated == 0 and not mismatched and gc.returncode == 0 else 1
    finally:
        if fleet is not None:
            fleet.stop()
        kafka_server.stop()
        cassandra_node.stop()
        say("servers stopped")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=6.0, help="seconds between kills, on average")
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "big"))
    args = parser.parse_args()
    configure_logging("WARNING", "console")
    say(f"seed {args.seed} (repeat with --seed {args.seed})")
    try:
        return asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"[chaos] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
