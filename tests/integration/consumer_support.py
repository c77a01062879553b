"""Helpers for consumer tests: definitions, event streams with known truth, waiting, reading values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient
from countersink.kafka import make_admin, make_consumer
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env

DEFINITIONS = """
[[counter]]
name = "trades_count"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "trade_id"

[[counter]]
name = "shares_traded"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "trade_id"

[[counter]]
name = "notional"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "price"
number = "decimal"
event_id = "trade_id"
"""


REPO = Path(__file__).resolve().parents[2]


def start_consumer(kafka: KafkaSettings, cassandra: CassandraSettings, log: Path, **consumer: object
                   ) -> subprocess.Popen[bytes]:
    """``python -m consumer`` as a child process with these consumer settings, logging to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "consumer"], cwd=REPO,
                                env=child_env(kafka, cassandra, consumer={"health_port": 0, **consumer}),
                                stdout=out, stderr=out)


async def wait_until_started(log: Path, process: subprocess.Popen[bytes], within_s: float = 90) -> None:
    """Until ``process`` has joined its group (its ``consumer_started`` line in ``log``): a signal sent
    before then tests the process's start-up rather than the scenario."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"consumer {process.pid} exited with {process.returncode}"
        text = await asyncio.to_thread(log.read_text, errors="replace")
        # Whole lines only: the last one may be half-written.
        started = [json.loads(line) for line in text.splitlines()
                   if '"consumer_started"' in line and line.rstrip().endswith("}")]
        if any(entry.get("host", "").endswith(f":{process.pid}") for entry in started):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"consumer {process.pid} did not start within {within_s} s")


def write_definitions(directory: Path, topic: str) -> Path:
    path = directory / "counters.toml"
    path.write_text(DEFINITIONS.replace("{topic}", topic))
    return path


@dataclass
class Truth:
    """What the counters must say, computed from what was produced, independently of countersink."""

    count: Counter[str] = field(default_factory=Counter)
    qty: Counter[str] = field(default_factory=Counter)
    notional: defaultdict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    malformed: int = 0
    produced: int = 0


def make_events(n: int, *, symbols: int = 20, duplicates: int = 0, malformed: int = 0,
                seed: int = 7) -> tuple[list[bytes], Truth]:
    """``n`` distinct trades, plus ``duplicates`` re-sends of earlier ones and ``malformed`` bad records."""
    rng = random.Random(seed)
    truth = Truth()
    events: list[bytes] = []
    for _ in range(n):
        symbol = f"S{rng.randrange(symbols):03d}"
        qty = rng.randrange(1, 1000)
        price = Decimal(rng.randrange(1, 100_000)) / 100
        # price as a JSON number written from its exact decimal text
        events.append(f'{{"trade_id": "{uuid.uuid4().hex}", "symbol": "{symbol}", "qty": {qty}, "price": {price}}}'
                      .encode())
        truth.count[symbol] += 1
        truth.qty[symbol] += qty
        truth.notional[symbol] += price
    for _ in range(duplicates):  # a publisher retry: same event id, shortly after the original
        position = rng.randrange(len(events))
        events.insert(min(len(events), position + rng.randrange(1, 50)), events[position])
    # Each refused by every counter (each dead-lettered once, none counted): a key of the wrong type is refused by
    # all three counters, where a text quantity would be refused by shares_traded alone.
    bad = [b"{not json", b'{"trade_id": "x", "symbol": ["S001"]}', b'{"trade_id": "y", "symbol": 1.5, "qty": 7}',
           b"", b"[1, 2]"]
    for i in range(malformed):
        events.insert(rng.randrange(len(events) + 1), bad[i % len(bad)])
    truth.malformed = malformed
    truth.produced = len(events)
    return events, truth


async def read_values(cassandra: CassandraSettings, truth: Truth) -> dict[str, dict[str, object]]:
    values: dict[str, dict[str, object]] = {"trades_count": {}, "shares_traded": {}, "notional": {}}
    async with CassandraClient(cassandra) as client:
        for counter in values:
            for symbol in truth.count:
                state = await read_state(client, counter, symbol)
                values[counter][symbol] = None if state is None else state.value()
    return values


def expected_values(truth: Truth) -> dict[str, dict[str, object]]:
    return {
        "trades_count": dict(truth.count),
        "shares_traded": dict(truth.qty),
        "notional": dict(truth.notional),
    }


async def read_topic(kafka: KafkaSettings, topic: str, at_least: int, within_s: float = 20,
                     then_s: float = 0.0) -> list[Any]:
    """Every partition of ``topic`` from its start, until ``at_least`` records came or ``within_s`` passed;
    then ``then_s`` more seconds, for whatever should not have come."""
    records: list[Any] = []
    async with make_consumer(kafka, topic, group_id=None, auto_offset_reset="earliest") as consumer:
        deadline = time.monotonic() + within_s
        while len(records) < at_least and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            records.extend(r for batch in batches.values() for r in batch)
        if then_s:
            batches = await consumer.getmany(timeout_ms=int(then_s * 1000))
            records.extend(r for batch in batches.values() for r in batch)
    return records


@contextlib.asynccontextmanager
async def running(service: ConsumerService) -> AsyncIterator[ConsumerService]:
    """The service started and its loop running for the body; then stopped as a shutdown stops it."""
    await service.start()
    runner = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.request_stop()
        await runner
        await service.stop()


async def create_again(kafka: KafkaSettings, topic: str, partitions: int = 1) -> None:
    """Delete ``topic`` and create it again under its name (a new topic id, offsets from 0)."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while True:  # the deletion completes in the background: a create before it ends is refused
            try:
                await admin.create_topics([NewTopic(topic, partitions, 1)])
                return
            except TopicAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
