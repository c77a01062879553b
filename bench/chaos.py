"""``make chaos``: a long run under faults that ends by comparing every counter with the truth.

    python -m bench.chaos [--quick] [--events 1000000] [--tx-events 20000] [--poison-events 20000]
                          [--mixed-events 10000] [--consumers 3] [--kill-every 6] [--seed 1] [--no-resets]
                          [--no-backfill] [--port-offset 0]

It starts its own Kafka and Cassandra (ports 19092 and 19042 plus ``--port-offset``, data under
``.stack/chaos``), three consumers
and a GC loop, and publishes the events (trades over 500 symbols, with publisher retries and malformed
records) while it injects faults: kill -9 of a random consumer every few seconds (restarted a moment
later), one Kafka broker restart, one Cassandra restart, one zombie (a consumer frozen with SIGSTOP past its
session timeout, then resumed) and one kill -9 of the GC loop. When everything is published and flushed it
stops the consumers, runs GC once, and compares count, integer sum, decimal sum, min and max of every
symbol with the truth computed from what was published.

Meanwhile a transactional producer publishes ``--tx-events`` trades to a second topic in transactions of 1
to 8 records, about a tenth of them aborted once and then sent again, with publisher retries 1 to 150
records after the original in the same partition (the consumers' retry window is 200 records in this run)
and malformed records. Its truth is computed from the topic as a read_committed consumer reads it back,
retries within the window excluded; the read-back is checked against the publisher's own log (no aborted
record visible, every committed one there). Every malformed record committed there must be on the
dead-letter topic.

A third topic carries the poison phase: ``--poison-events`` ordinary trades with about 5% poison mixed in
(event times past 2038 or a year ahead on a counter kept 30 days, numbers of thousands of digits, nesting
past the bound, keys over the bound, escapes, duplicate fields, invalid UTF-8). Its truth is what a single
owner decides: every record read back and routed, in offset order, through the reference router. Every
value must match it, every record it refuses must reach the dead-letter topic (and no other), and every
poison record that must be refused must be refused by it; a partition that stalls never reaches lag 0.

A fourth topic carries the mixed phase: ``--mixed-events`` page views, purchases and sign-ups for five
counters (filters, a ``required`` counter, an ``event_id`` counter, and one keyed by the record key and
bucketed by the hour of the record time), about a sixth of their fields absent, null or of a wrong type, some
record keys absent or not UTF-8, and a hundredth of the records not JSON. Its truth is computed per counter
from the records read back, without countersink's router (``tests/integration/per_counter_truth.py``): every
value over every key an event can name must match it, and every record some counter refuses must reach the
dead-letter topic (and no other).

While the plain trades are published (a third of them out, consumers being killed), ``countersink reset``
resets ``trades`` (every key) and ``shares`` of some symbols, and later ``shares`` of a few of them again.
Each reset's points are the offsets its printed result gives in each partition (checked against what
``countersink reset --list`` reads from the resets tables at the end). The truth of those two counters is
then computed from the plain topic as read back: per partition in offset order, a trade counts when no
record within the retry window before it carried its id (a retry counts nowhere, whatever the reset) and
when it lies after the latest reset point of its instance in that partition.

Half way through the plain stream a counter is added with ``since = "earliest"`` (``volume``, the shares by
symbol): the consumers are restarted one by one with the new definitions (kill -9 each, a rolling restart:
one still running the old definitions that is assigned a partition whose hand-over is recorded exits 2, and
is restarted with the new ones, as a supervisor would), then ``countersink backfill volume`` runs, is killed
with kill -9 at its first progress line and is run again until it finishes (again after any failure while a
server restarts). ``volume`` must equal every trade of the topic, retries counted once and no reset applied.

It prints ``lost=N duplicated=M`` (events missing from, or counted twice in, the trade counts of both
topics), ``dead_letters_missing=N`` and the faults injected, and exits 0 only if all three are 0 and every
value matches. ``--quick`` is the short run CI makes: 40,000 plain, 6,000 transactional, 4,000 poison-
phase trades and 3,000 mixed events, the one-off faults sooner. Everything it starts, it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError

from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics, make_consumer, make_producer
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings
from schemas.definitions import parse_definitions
from schemas.errors import InvalidEventError
from schemas.events import EventRouter, RecordFields, apply_updates
from schemas.kinds import State
from schemas.resets import control_reset_id
from stack import servers
from stack.loading import child_env, end_offsets, publish, wait_until_flushed

ROOT = Path(__file__).resolve().parents[1]
STACK = servers.STACK_DIR / "chaos"
TOPIC = "chaos-trades"
PARTITIONS = 6
GROUP = "chaos"
DEAD_LETTERS = "chaos-dead-letter"
SESSION_TIMEOUT_MS = 6000
# The one-off faults, in seconds after the consumers start.
FAULTS_AT = {"kafka": 25.0, "zombie": 45.0, "cassandra": 70.0, "gc": 100.0}
QUICK_FAULTS_AT = {"kafka": 10.0, "zombie": 20.0, "cassandra": 40.0, "gc": 55.0}
# The transactional phase: its own topic, counters and producer.
TX_TOPIC = "chaos-tx-trades"
TX_PREFIX = "tx_"
TX_ID = "countersink-chaos-tx"
ATTEMPT_HEADER = "chaos-attempt"
RETRY_WINDOW = 200  # the consumers' retry_window_records while the transactional phase runs
RETRY_DISTANCE = 150  # a transactional publisher retry comes at most this many records after the original
COUNTERS = """
[[counter]]
name = "{prefix}trades"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "{prefix}shares"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"

[[counter]]
name = "{prefix}notional"
topics = ["{topic}"]
kind = "sum"
number = "decimal"
key = ["symbol"]
value = "price"
event_id = "id"

[[counter]]
name = "{prefix}smallest"
topics = ["{topic}"]
kind = "min"
key = ["symbol"]
value = "qty"

[[counter]]
name = "{prefix}largest"
topics = ["{topic}"]
kind = "max"
key = ["symbol"]
value = "qty"
"""


def definitions(topic: str, prefix: str = "") -> str:
    """The five counters (count, integer sum, decimal sum, min, max by symbol) of one topic."""
    return COUNTERS.format(topic=topic, prefix=prefix)


DEFINITIONS = definitions(TOPIC)


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Truth:
    count: Counter[str] = field(default_factory=Counter)
    qty: Counter[str] = field(default_factory=Counter)
    notional: defaultdict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    smallest: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)

    def add(self, symbol: str, qty: int, price: Decimal) -> None:
        """One trade counted: every counter moves."""
        self.count[symbol] += 1
        self.qty[symbol] += qty
        self.notional[symbol] += price
        self.see(symbol, qty)

    def see(self, symbol: str, qty: int) -> None:
        """One trade seen again (a retry the counts drop): min and max have no event id and take it anyway."""
        self.smallest[symbol] = min(qty, self.smallest.get(symbol, qty))
        self.largest[symbol] = max(qty, self.largest.get(symbol, qty))

    def expected(self, prefix: str = "") -> dict[str, dict[str, object]]:
        """Counter name (as :func:`definitions` names it with ``prefix``) -> symbol -> value."""
        return {f"{prefix}trades": dict(self.count), f"{prefix}shares": dict(self.qty),
                f"{prefix}notional": dict(self.notional), f"{prefix}smallest": dict(self.smallest),
                f"{prefix}largest": dict(self.largest)}


def trade(rng: random.Random, symbols: int) -> tuple[str, int, Decimal, bytes]:
    """One distinct trade: symbol, quantity, price and its JSON with a fresh random id."""
    symbol = f"S{rng.randrange(symbols):03d}"
    qty = rng.randrange(1, 10_000)
    price = Decimal(rng.randrange(1, 1_000_000)) / 100
    event = f'{{"id":"{uuid.UUID(int=rng.getrandbits(128)).hex}","symbol":"{symbol}","qty":{qty},"price":{price}}}'
    return symbol, qty, price, event.encode()


def make_events(n: int, rng: random.Random, symbols: int = 500, retries: float = 0.02, malformed: float = 0.001
                ) -> tuple[list[bytes], Truth, int, int]:
    """``n`` distinct trades; a publisher retry (the same bytes again, a few records later) for a fraction of
    them, and some malformed records. Returns the stream, the truth, and how many retries and bad records."""
    truth = Truth()
    stream: list[bytes] = []
    pending: list[tuple[int, bytes]] = []
    resent = bad = 0
    for i in range(n):
        symbol, qty, price, event = trade(rng, symbols)
        stream.append(event)
        truth.add(symbol, qty, price)
        if rng.random() < retries:
            pending.append((i + rng.randrange(1, 200), stream[-1]))
        while pending and pending[0][0] <= i:
            stream.append(pending.pop(0)[1])
            resent += 1
        if rng.random() < malformed:
            # refused by every counter (a symbol of no key's type): a wrongly typed qty alone would be refused by
            # the counters reading qty and counted by the others, each counter deciding for itself
            stream.append(rng.choice([b"{not json", b'{"id":"x","symbol":["S001"],"qty":"many"}', b""]))
            bad += 1
    stream.extend(event for _, event in pending)
    return stream, truth, resent + len(pending), bad


# ------------------------------------------------------------------------------ the transactional phase


@dataclass
class Transaction:
    records: list[tuple[int, bytes]]  # (partition, value) in the order sent
    abort_first: bool  # sent once and aborted, then sent again in a new transaction


@dataclass
class TxPlan:
    transactions: list[Transaction]
    malformed: set[bytes]  # the values of the malformed records; every other record is a valid trade
    events: int
    retries: int
    bad: int

    @property
    def records(self) -> int:
        return sum(len(tx.records) for tx in self.transactions)


def malformed_record(rng: random.Random) -> bytes:
    """Invalid JSON, JSON that is not an object, or a trade whose symbol no counter takes as a key (so every
    counter refuses it: a wrongly typed value alone is refused by the counters reading it, counted by the rest)."""
    tag = uuid.UUID(int=rng.getrandbits(128)).hex
    return rng.choice([
        f'{{"id":"{tag}","symbol":"S0', "", f'["{tag}"]',
        f'{{"id":"{tag}","symbol":["S001"],"qty":"many","price":1.5}}',
        f'{{"id":"{tag}","symbol":2.5,"qty":2.5,"price":1.5}}',
        f'{{"id":"{tag}","symbol":{{"s":"S003"}},"qty":3,"price":"free"}}',
    ]).encode()


def make_transactions(n: int, rng: random.Random, symbols: int = 100, partitions: int = PARTITIONS,
                      retries: float = 0.08, malformed: float = 0.004, aborted: float = 0.1) -> TxPlan:
    """``n`` distinct trades, each in a partition of its own choosing, cut into transactions of 1 to 8
    records; about a tenth of the transactions are to be aborted once before they are sent again.

    A fraction of the trades is sent again (a publisher retry, the same bytes to the same partition)
    ``RETRY_DISTANCE`` records later at most in that partition, counting only records that are committed,
    half of them in the last fifth of that distance: close to the edge of the consumers'
    ``RETRY_WINDOW``, where a window rebuilt from the wrong records lets a retry through."""
    position = [0] * partitions  # records planned so far in each partition
    due: list[list[tuple[int, int, bytes]]] = [[] for _ in range(partitions)]  # (position, order, value)
    sequence: list[tuple[int, bytes]] = []
    bad: set[bytes] = set()
    made = resent = bad_count = 0
    while made < n or any(due):
        p = rng.randrange(partitions)
        queue = due[p]
        if queue and (queue[0][0] <= position[p] or made >= n):
            value = heapq.heappop(queue)[2]
            resent += 1
        elif made >= n:
            continue
        elif rng.random() < malformed:
            value = malformed_record(rng)
            bad.add(value)
            bad_count += 1
        else:
            value = trade(rng, symbols)[3]
            made += 1
            if rng.random() < retries:
                low = 1 if rng.random() < 0.5 else RETRY_DISTANCE * 4 // 5
                heapq.heappush(queue, (position[p] + rng.randint(low, RETRY_DISTANCE), len(sequence), value))
        sequence.append((p, value))
        position[p] += 1
    transactions = []
    i = 0
    while i < len(sequence):
        size = rng.randint(1, 8)
        transactions.append(Transaction(sequence[i:i + size], rng.random() < aborted))
        i += size
    return TxPlan(transactions, bad, made, resent, bad_count)


@dataclass
class TxLog:
    """What the transactional publisher did. Each attempt (one transaction sent) tags its records with its
    number in the ``ATTEMPT_HEADER`` header, so reading the topic back shows which attempts were committed."""

    sizes: dict[int, int] = field(default_factory=dict)  # attempt -> records sent
    # attempt -> "committed" (its commit returned), "aborted" (aborted on purpose, or failed before its
    # commit was asked for: the next producer with the same transactional id aborts it), "unknown" (its
    # commit failed: the coordinator may have committed it all the same)
    fates: dict[int, str] = field(default_factory=dict)
    committed: int = 0
    aborted: int = 0
    failures: list[str] = field(default_factory=list)


async def start_transactional(kafka: KafkaSettings, attempts: int = 30) -> AIOKafkaProducer:
    """A started transactional producer; a restarting broker refuses connections for a while."""
    for attempt in range(1, attempts + 1):
        producer = make_producer(kafka, transactional_id=TX_ID, linger_ms=0)
        try:
            await producer.start()
            return producer
        except KafkaError:
            await stop_quietly(producer)
            if attempt == attempts:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


async def stop_quietly(producer: AIOKafkaProducer) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(30):
            await producer.stop()


async def publish_transactions(kafka: KafkaSettings, plan: TxPlan, log: TxLog) -> None:
    """Send every transaction of the plan with one transactional producer, aborting those marked so once
    first. A transaction that fails (the broker restarts, the event loop stalls past the transaction
    timeout) is sent again by a new producer with the same transactional id, which aborts what the old one
    left open."""
    producer: AIOKafkaProducer | None = None
    attempt = 0
    started = time.monotonic()
    try:
        for number, tx in enumerate(plan.transactions, 1):
            if number % max(1, len(plan.transactions) // 4) == 0:
                say(f"transaction {number}/{len(plan.transactions)} ({log.aborted} aborted first so far)")
            abort = tx.abort_first
            while True:
                attempt += 1
                log.sizes[attempt] = len(tx.records)
                log.fates[attempt] = "aborted"
                header = [(ATTEMPT_HEADER, str(attempt).encode())]
                try:
                    if producer is None:
                        producer = await start_transactional(kafka)
                    async with asyncio.timeout(120):
                        await producer.begin_transaction()
                        deliveries = [await producer.send(TX_TOPIC, value, partition=p, headers=header)
                                      for p, value in tx.records]
                        await asyncio.gather(*deliveries)  # in the log, aborted or not
                        if abort:
                            await producer.abort_transaction()
                        else:
                            log.fates[attempt] = "unknown"
                            await producer.commit_transaction()
                except (KafkaError, IllegalOperation, TimeoutError) as exc:
                    log.failures.append(f"attempt {attempt}: {type(exc).__name__}: {exc}")
                    say(f"transaction attempt {attempt} failed ({type(exc).__name__}: {exc}); "
                        "sending it again with a new producer")
                    if producer is not None:
                        await stop_quietly(producer)
                        producer = None
                    await asyncio.sleep(1.0)
                    continue
                if abort:
                    abort = False
                    log.aborted += 1
                    continue
                log.fates[attempt] = "committed"
                log.committed += 1
                break
        say(f"all {len(plan.transactions)} transactions committed after {time.monotonic() - started:.0f}s")
    finally:
        if producer is not None:
            await stop_quietly(producer)


async def read_topic(kafka: KafkaSettings, topic: str, partitions: int, within_s: float = 300.0
                     ) -> dict[int, list[ConsumerRecord[bytes, bytes]]]:
    """Every record of the topic as a read_committed consumer sees it (aborted records and transaction
    markers skipped), by partition, in offset order."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: dict[int, list[ConsumerRecord[bytes, bytes]]] = {p: [] for p in range(partitions)}
    consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False, isolation_level="read_committed")
    async with consumer:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)  # the last stable offsets: every transaction is finished
        deadline = time.monotonic() + within_s
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read back to its end offsets {ends} after {within_s:.0f}s")
            for tp, batch in (await consumer.getmany(*tps, timeout_ms=1000, max_records=10_000)).items():
                records[tp.partition].extend(batch)
    return records


@dataclass
class TxTruth:
    truth: Truth
    last_offsets: dict[int, int]  # partition -> offset of its last committed record
    malformed: dict[str, bytes]  # countersink.source (topic/partition/offset) -> value, of committed bad records
    committed_records: int = 0
    retries_dropped: int = 0  # a repeated id within the window: the counts drop it
    retries_counted: int = 0  # a repeated id further back than the window: counted again
    aborted_visible: int = 0  # records of an attempt that was aborted
    committed_missing: int = 0  # records of an attempt whose commit returned
    torn: list[int] = field(default_factory=list)  # attempts only partly visible
    unknown_committed: int = 0  # attempts whose commit failed and that were committed all the same
    unknown: int = 0


def committed_truth(records: dict[int, list[ConsumerRecord[bytes, bytes]]], plan: TxPlan, log: TxLog,
                    window: int) -> TxTruth:
    """The truth from what was committed, as read back: per partition, record number ``k`` (aborted records
    and markers take no number) repeating an event id last seen at number ``j`` is dropped when
    ``k - j <= window``, as the consumers' publisher-retry window does (docs/guarantees.md, "Publisher retries").
    Also checks the read-back against the publisher's log: all of a committed attempt, none of an aborted
    one, and all or nothing of the others."""
    result = TxTruth(Truth(), {}, {})
    seen: Counter[int] = Counter()
    for partition, batch in records.items():
        last_number: dict[str, int] = {}
        for number, record in enumerate(batch):
            headers = dict(record.headers)
            seen[int(headers[ATTEMPT_HEADER])] += 1
            result.committed_records += 1
            result.last_offsets[partition] = record.offset
            value = record.value or b""
            if value in plan.malformed:
                result.malformed[f"{TX_TOPIC}/{partition}/{record.offset}"] = value
                continue
            event = json.loads(value, parse_float=Decimal)
            symbol, qty, price = event["symbol"], event["qty"], Decimal(event["price"])
            previous = last_number.get(event["id"])
            last_number[event["id"]] = number
            if previous is not None and number - previous <= window:
                result.retries_dropped += 1
                result.truth.see(symbol, qty)
                continue
            if previous is not None:
                result.retries_counted += 1
            result.truth.add(symbol, qty, price)
    for attempt, size in log.sizes.items():
        visible, fate = seen[attempt], log.fates[attempt]
        if visible not in (0, size):
            result.torn.append(attempt)
        elif fate == "aborted":
            result.aborted_visible += visible
        elif fate == "committed":
            result.committed_missing += size - visible
        else:
            result.unknown += 1
            result.unknown_committed += visible == size
    return result


async def read_dead_letters(kafka: KafkaSettings, topic: str, within_s: float = 300.0) -> dict[str, list[bytes]]:
    """countersink.source -> the values dead-lettered from it (at least once each, maybe more)."""
    tp = TopicPartition(topic, 0)
    found: defaultdict[str, list[bytes]] = defaultdict(list)
    consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False)
    async with consumer:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + within_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read back to its end offset {end} after {within_s:.0f}s")
            for record in (await consumer.getmany(tp, timeout_ms=1000, max_records=10_000)).get(tp, []):
                source = dict(record.headers).get("countersink.source", b"").decode()
                found[source].append(record.value or b"")
    return found


# ------------------------------------------------------------------------------ the poison phase

POISON_TOPIC = "chaos-poison"
POISON_PREFIX = "poison_"
POISON_DEFINITIONS = f"""
[[counter]]
name = "{POISON_PREFIX}trades"
topics = ["{POISON_TOPIC}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "{POISON_PREFIX}shares"
topics = ["{POISON_TOPIC}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"

[[counter]]
name = "{POISON_PREFIX}hourly"
topics = ["{POISON_TOPIC}"]
kind = "count"
key = ["symbol"]
bucket = {{ field = "at", size = "1h" }}
retain = "30d"
event_id = "id"
"""
# Content that must never stall a partition, each with what a single owner must decide: "refused" (the
# record goes to the dead-letter topic, and the counters that refuse it do not move: each counter decides for
# itself) or "either" (the reference router decides).
# Every case is a JSON template; {id}, {now}, {ahead} and {case} are filled in per record (the ``case`` field, which no
# counter reads, names it in the truth).
_HEAD = '{{"case":"{case}","id":"{id}",'
POISON_CASES: dict[str, tuple[str, str]] = {
    # Times whose retained bucket's expiry cannot be stored (Cassandra 5 refuses expiries past 2038).
    "far_future_2040": ("refused", _HEAD + '"symbol":"P1","qty":1,"at":"2040-01-01T00:00:00Z"}}'),
    "far_future_9999": ("refused", _HEAD + '"symbol":"P1","qty":1,"at":"9999-12-31T23:59:59Z"}}'),
    "just_past_2038": ("refused", _HEAD + '"symbol":"P1","qty":1,"at":"2038-01-19T03:14:08Z"}}'),
    # A time a month ahead of the record: further than any bucketed counter takes.
    "month_ahead": ("refused", _HEAD + '"symbol":"P1","qty":1,"at":"{ahead}"}}'),
    # A bucket long past its retention: late for the hourly counter, counted by the others.
    "long_past": ("either", _HEAD + '"symbol":"P2","qty":2,"at":"1971-01-01T00:00:00Z"}}'),
    # A number far past every parser's comfort in a field no counter reads, and in the summed field.
    "huge_unread_integer": ("either", _HEAD + '"symbol":"P3","qty":3,"at":"{now}","pad":' + "9" * 5000 + "}}"),
    "huge_value": ("refused", _HEAD + '"symbol":"P3","qty":' + "1" * 40 + ',"at":"{now}"}}'),
    "huge_float_value": ("refused", _HEAD + '"symbol":"P3","qty":1e400,"at":"{now}"}}'),
    # Nesting past the router's bound (32) in a field no counter reads, and just inside it.
    "too_deep": ("refused", _HEAD + '"symbol":"P4","qty":4,"at":"{now}","pad":' + "[" * 40 + "]" * 40 + "}}"),
    "deep_but_legal": ("either", _HEAD + '"symbol":"P4","qty":4,"at":"{now}","pad":' + "[" * 20 + "]" * 20 + "}}"),
    # A key over the 1 KiB bound, and legal keys full of escapes.
    "oversize_key": ("refused", _HEAD + '"symbol":"' + "K" * 5000 + '","qty":5,"at":"{now}"}}'),
    "escaped_key": ("either", _HEAD + '"symbol":"P5\\\\|\\"\\u00e9\\ud83d\\ude00\\u0001","qty":5,"at":"{now}"}}'),
    "duplicate_field": ("either", _HEAD + '"symbol":"P6","symbol":"P7","qty":6,"at":"{now}"}}'),
    "lone_surrogate": ("either", _HEAD + '"symbol":"P8\\ud800","qty":7,"at":"{now}"}}'),
    "invalid_utf8": ("refused", _HEAD + '"symbol":"P9\udcff","qty":8,"at":"{now}"}}'),
}


def poison_stream(n: int, rng: random.Random, now: float, share: float = 0.05) -> tuple[list[bytes], Counter[str]]:
    """``n`` ordinary trades with times in the last day, and about ``share`` as many poison records drawn
    from :data:`POISON_CASES` (every case at least once). Returns the records and the cases drawn."""
    drawn: Counter[str] = Counter()
    stream: list[bytes] = []
    cases = list(POISON_CASES)
    forced = list(cases)
    for _ in range(n):
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - rng.uniform(0, 86_400)))
        symbol = f"S{rng.randrange(50):02d}"
        event_id = uuid.UUID(int=rng.getrandbits(128)).hex
        stream.append(f'{{"id":"{event_id}","symbol":"{symbol}","qty":{rng.randrange(1, 1000)},"at":"{at}"}}'
                      .encode())
        if forced or rng.random() < share:
            case = forced.pop() if forced else rng.choice(cases)
            drawn[case] += 1
            text = POISON_CASES[case][1].format(
                id=uuid.UUID(int=rng.getrandbits(128)).hex, case=case,
                now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                ahead=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 30 * 86_400)))
            stream.append(text.encode("utf-8", "surrogateescape"))
    rng.shuffle(stream)
    return stream, drawn


@dataclass
class PoisonTruth:
    """What one owner reading the poison topic from its start decides, record by record."""

    values: dict[str, dict[str, object]]  # counter -> instance key -> value, as read_values takes them
    refused: dict[str, bytes]  # countersink.source -> value, of the records the dead-letter topic must hold
    accepted_poison: list[str]  # poison records that must be refused and were not


_POISON_CASE = re.compile(rb'"case":"([a-z0-9_]+)"')


def poison_truth(records: dict[int, list[ConsumerRecord[bytes, bytes]]], definitions_text: str) -> PoisonTruth:
    """Route every record of the poison topic through the reference router, in offset order per partition,
    as a single owner with no faults would: the oracle the consumers' results are held to. Also lists the
    poison records that must be refused and were accepted (the oracle itself would be wrong)."""
    counter_set = parse_definitions(definitions_text)
    router = EventRouter(counter_set)
    states: dict[tuple[str, str], State] = {}
    refused: dict[str, bytes] = {}
    accepted_poison: list[str] = []
    for partition, batch in records.items():
        for record in batch:
            value = record.value or b""
            try:
                decision = router.decide(POISON_TOPIC, value, RecordFields(record.timestamp, record.key,
                                                                           record.headers, partition))
            except InvalidEventError:
                refused[f"{POISON_TOPIC}/{partition}/{record.offset}"] = value
                continue
            # Each counter decides for itself: the ones that accept a record count it, even when another
            # refuses it (then it is dead-lettered once, naming the refusing counters).
            apply_updates(states, decision.updates, counter_set)  # every event id is new: no retries here
            if decision.refusals:
                refused[f"{POISON_TOPIC}/{partition}/{record.offset}"] = value
                continue
            case = _POISON_CASE.search(value)
            if case is not None and POISON_CASES[case[1].decode()][0] == "refused":
                accepted_poison.append(case[1].decode())
    values: dict[str, dict[str, object]] = defaultdict(dict)
    for (counter, key), state in states.items():
        values[counter][key] = state.value()
    return PoisonTruth(dict(values), refused, accepted_poison)


def compare_poison(values: dict[str, dict[str, object]], truth: PoisonTruth) -> tuple[int, int, list[str]]:
    """(lost, duplicated, mismatched values) of the poison topic's counters against the single owner's."""
    counted = {k: int(v or 0) for k, v in values[f"{POISON_PREFIX}trades"].items()}  # type: ignore[call-overload]
    expected = {k: int(v) for k, v in truth.values.get(f"{POISON_PREFIX}trades", {}).items()}  # type: ignore[call-overload]
    lost = sum(max(0, n - counted.get(k, 0)) for k, n in expected.items())
    duplicated = sum(max(0, counted.get(k, 0) - n) for k, n in expected.items())
    mismatched = [f"{c}/{k!r}: {values[c].get(k)!r} != {v!r}" for c, by_key in truth.values.items()
                  for k, v in by_key.items() if values[c].get(k) != v]
    return lost, duplicated, mismatched


# ------------------------------------------------------------------------------ the mixed phase

MIXED_TOPIC = "chaos-mixed"
MIXED_PREFIX = "mixed_"
MIXED_DEFINITIONS = f"""
[[counter]]
name = "{MIXED_PREFIX}views"
topics = ["{MIXED_TOPIC}"]
kind = "count"
key = ["page"]
where = {{ type = "view" }}

[[counter]]
name = "{MIXED_PREFIX}revenue"
topics = ["{MIXED_TOPIC}"]
kind = "sum"
key = ["sku"]
value = "amount"
where = {{ type = "purchase" }}

[[counter]]
name = "{MIXED_PREFIX}biggest"
topics = ["{MIXED_TOPIC}"]
kind = "max"
key = ["sku"]
value = "amount"
where = {{ type = "purchase" }}
required = true

[[counter]]
name = "{MIXED_PREFIX}users_hourly"
topics = ["{MIXED_TOPIC}"]
kind = "count"
key = ["@key"]
bucket = {{ field = "@timestamp", size = "1h" }}

[[counter]]
name = "{MIXED_PREFIX}signups"
topics = ["{MIXED_TOPIC}"]
kind = "count"
key = ["country", "plan"]
where = {{ type = "signup" }}
event_id = "id"
"""
# A field's value spoiled: absent, null, or of a type its counters refuse ("12" is a key like any other).
MIXED_SPOILED: list[object] = ["absent", None, "12", [1], {"a": 1}, 1.5]
# Record keys: users; no key (not applicable to the @key counter); not UTF-8 (refused by it).
MIXED_KEYS: list[bytes | None] = [b"u1", b"u2", b"u3", None, b"\xff"]
MIXED_KEY_WEIGHTS = [6, 6, 6, 2, 1]
# Every instance key (but the hours of users_hourly) an event can name, so that a count the truth does not
# hold (an event counted by a counter that should have skipped or refused it) is seen.
MIXED_VOCABULARY = {
    f"{MIXED_PREFIX}views": ["/a", "/b", "/c", "12"],
    f"{MIXED_PREFIX}revenue": ["k1", "k2", "k3", "12"],
    f"{MIXED_PREFIX}biggest": ["k1", "k2", "k3", "12"],
    f"{MIXED_PREFIX}signups": [f"{c}|{p}" for c in ("fr", "de", "12") for p in ("free", "pro", "12")],
}


def mixed_stream(n: int, rng: random.Random) -> tuple[list[bytes], list[bytes | None]]:
    """``n`` page views, purchases and sign-ups on one topic, about one field in six spoiled, and a
    hundredth as many records that are not JSON; with their record keys."""
    values: list[bytes] = []
    keys: list[bytes | None] = []
    for i in range(n):
        kind = rng.choice(["view", "purchase", "signup"])
        event: dict[str, object] = {"type": kind}
        if kind == "view":
            event["page"] = rng.choice(["/a", "/b", "/c"])
        elif kind == "purchase":
            event.update(sku=rng.choice(["k1", "k2", "k3"]), amount=rng.randrange(1, 500))
        else:
            event.update(country=rng.choice(["fr", "de"]), plan=rng.choice(["free", "pro"]), id=f"s{i}")
        for name in list(event):
            if name != "type" and rng.random() < 1 / 6:
                # An event id spoiled as a valid id would repeat one far apart: a publisher retry for the
                # counters' window but not for the truth's, which takes the window to hold the whole stream.
                spoiled = rng.choice([s for s in MIXED_SPOILED if name != "id" or s != "12"])
                if spoiled == "absent":
                    del event[name]
                else:
                    event[name] = spoiled
        values.append(json.dumps(event).encode())
        keys.append(rng.choices(MIXED_KEYS, MIXED_KEY_WEIGHTS)[0])
    for _ in range(n // 100):
        at = rng.randrange(len(values) + 1)
        values.insert(at, b"{not json")
        keys.insert(at, b"u1")
    return values, keys


@dataclass
class MixedTruth:
    """What each counter of the mixed topic must hold, and the records that must be dead-lettered."""

    values: dict[str, dict[str, object]]  # counter -> instance key -> value (None: nothing counted)
    refused: dict[str, bytes]  # countersink.source -> value
    skipped: int  # (record, counter) pairs not applicable


def mixed_truth(records: dict[int, list[ConsumerRecord[bytes, bytes]]]) -> MixedTruth:
    """The per-counter truth of the mixed topic as read back, computed without countersink's router
    (``tests/integration/per_counter_truth.py``), over every key an event can name."""
    from tests.integration.per_counter_truth import TruthRecord, per_counter_truth

    sources: list[str] = []
    truth_records: list[TruthRecord] = []
    hours: set[str] = set()
    for partition, batch in records.items():
        for record in batch:
            sources.append(f"{MIXED_TOPIC}/{partition}/{record.offset}")
            truth_records.append(TruthRecord(record.value or b"", record.key, record.timestamp,
                                             list(record.headers), partition))
            hours.add(time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(record.timestamp // 1000)))
    truth = per_counter_truth(parse_definitions(MIXED_DEFINITIONS), MIXED_TOPIC, truth_records)
    vocabulary = {**MIXED_VOCABULARY, f"{MIXED_PREFIX}users_hourly": [
        f"{user}|{hour}" for user in ("u1", "u2", "u3") for hour in sorted(hours)]}
    values: dict[str, dict[str, object]] = {}
    for counter, held in truth.values.items():
        values[counter] = {key: held.get(key) for key in {*vocabulary[counter], *held}}
    refused = {sources[i]: truth_records[i].value for i in truth.refused}
    return MixedTruth(values, refused, sum(truth.skipped.values()))


def compare_mixed(values: dict[str, dict[str, object]], truth: MixedTruth) -> tuple[int, int, list[str]]:
    """(lost, duplicated, mismatched values) of the mixed topic's count counters against the truth."""
    lost = duplicated = 0
    for counter in (f"{MIXED_PREFIX}views", f"{MIXED_PREFIX}users_hourly", f"{MIXED_PREFIX}signups"):
        for key, expected in truth.values[counter].items():
            want, got = int(expected or 0), int(values[counter].get(key) or 0)  # type: ignore[call-overload]
            lost += max(0, want - got)
            duplicated += max(0, got - want)
    mismatched = [f"{c}/{k!r}: {values[c].get(k)!r} != {v!r}" for c, by_key in truth.values.items()
                  for k, v in by_key.items() if values[c].get(k) != v]
    return lost, duplicated, mismatched


# ------------------------------------------------------------------------------ resets of the plain phase

# (counter, how many symbols: 0 for every key, when: the share of the plain stream published first)
RESETS: tuple[tuple[str, int, float], ...] = (("trades", 0, 0.35), ("shares", 40, 0.35), ("shares", 8, 0.6))


@dataclass
class ResetDone:
    """One reset as ``countersink reset --json`` printed it: its keys (empty: every key) and its points."""

    counter: str
    epoch: int
    keys: frozenset[str]
    points: dict[int, int]  # partition -> the control record's offset there
    printed: dict[str, object]


@dataclass
class Resets:
    """The resets the run made, and what went wrong making them (a harness failure, not countersink's)."""

    done: list[ResetDone] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _reset_command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "countersink.cli", "reset", *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=120, check=False)


async def reset_when(published: asyncio.Event, env: dict[str, str], counter: str, keys: list[str],
                     resets: Resets) -> None:
    """Once ``published`` is set, reset ``counter`` (``keys``, or every key) with the CLI, as an operator
    would, with one idempotency key on every attempt: a refusal (Kafka or Cassandra restarting) is tried again,
    and an attempt cut short after it recorded the reset is completed by the next (the same reset, printed)."""
    await published.wait()
    request_key = f"chaos-{counter}-{uuid.uuid4().hex}"
    for attempt in range(1, 31):
        done = await asyncio.to_thread(_reset_command, env, counter, *keys, "--json", "--idempotency-key",
                                       request_key)
        if done.returncode == 0:
            printed = json.loads(done.stdout.decode().strip().splitlines()[-1])
            printed.pop("warning", None)  # positions not recorded by the command: its mutators record them
            points = {int(p["partition"]): int(p["offset"]) for p in printed["positions"] if p["topic"] == TOPIC}
            resets.done.append(ResetDone(counter, int(printed["epoch"]), frozenset(printed["keys"]), points,
                                         printed))
            what = f"{len(keys)} keys of {counter}" if keys else f"every key of {counter}"
            say(f"reset {what}: epoch {printed['epoch']}, points {dict(sorted(points.items()))}"
                + (f" (attempt {attempt})" if attempt > 1 else ""))
            return
        why = (done.stderr.decode(errors="replace").strip().splitlines() or [""])[-1][-300:]
        say(f"reset of {counter} did not complete (attempt {attempt}, exit {done.returncode}: {why}); trying again "
            "in 2s with its idempotency key")
        await asyncio.sleep(2.0)
    resets.failures.append(f"reset of {counter} did not complete in 30 attempts")


def reset_truth(records: dict[int, list[ConsumerRecord[bytes, bytes]]], resets: list[ResetDone], window: int
                ) -> tuple[Counter[str], Counter[str]]:
    """The counts (``trades``) and integer sums (``shares``) by symbol of the plain topic as read back, each
    reset applied at its points: per partition in offset order, every record (control records and malformed
    ones too) takes a number; a trade whose id a record within ``window`` numbers before carried is a retry,
    counted nowhere; any other counts in an instance unless a reset of that instance lies at a later offset
    of its partition."""
    trades: Counter[str] = Counter()
    shares: Counter[str] = Counter()

    def after_last_reset(counter: str, symbol: str, partition: int, offset: int) -> bool:
        return all(offset > r.points[partition] for r in resets
                   if r.counter == counter and (not r.keys or symbol in r.keys))

    for partition, batch in records.items():
        last_number: dict[str, int] = {}
        for number, record in enumerate(batch):
            if control_reset_id(list(record.headers)) is not None:
                continue
            try:
                event = json.loads(record.value or b"", parse_float=Decimal)
            except ValueError:
                continue
            if not isinstance(event, dict) or not isinstance(event.get("symbol"), str) \
                    or not isinstance(event.get("qty"), int):
                continue  # malformed: refused by every counter (make_events)
            previous = last_number.get(event["id"])
            last_number[event["id"]] = number
            if previous is not None and number - previous <= window:
                continue
            symbol = event["symbol"]
            if after_last_reset("trades", symbol, partition, record.offset):
                trades[symbol] += 1
            if after_last_reset("shares", symbol, partition, record.offset):
                shares[symbol] += event["qty"]
    return trades, shares


def resets_agree(printed: list[dict[str, Any]], listed: list[dict[str, Any]]) -> bool:
    """Whether ``reset --list --json`` (``listed``) holds the resets as ``reset --json`` printed them: the
    members both carry, positions in any order; the list's partitions without a recorded position must be none
    (it also carries the request's idempotency key, which the reset does not print)."""
    def shown(item: dict[str, Any]) -> tuple[Any, ...]:
        positions = sorted((str(p["topic"]), int(p["partition"]), int(p["offset"])) for p in item["positions"])
        return (str(item["counter"]), int(item["epoch"]), item["id"], sorted(item["keys"]),
                item["requested_by"], item["requested_at"], positions, item.get("not_recorded") or [])

    return sorted(map(shown, printed)) == sorted(map(shown, listed))


async def report_resets(env: dict[str, str], resets: Resets) -> bool:
    """Print the resets made; True when all were made and the resets tables hold each as it was printed."""
    for failure in resets.failures:
        print(f"reset failed: {failure}")
    recorded: list[dict[str, Any]] = []
    for counter in sorted({r.counter for r in resets.done}):
        listed = await asyncio.to_thread(_reset_command, env, counter, "--list", "--json")
        recorded += json.loads(listed.stdout.decode().strip().splitlines()[-1]) if listed.returncode == 0 else []
    agree = resets_agree([r.printed for r in resets.done], recorded)
    print(f"resets ({TOPIC}): {len(resets.done)} of {len(RESETS)} made under kill -9 ("
          + ", ".join(f"{r.counter} epoch {r.epoch}, {f'{len(r.keys)} keys' if r.keys else 'every key'}"
                      for r in resets.done)
          + f"); the resets tables {'hold each as printed' if agree else 'DISAGREE with what was printed'}")
    return agree and not resets.failures and len(resets.done) == len(RESETS)


# ------------------------------------------------------------------------------ a backfill in the run

BACKFILLED = "volume"
BACKFILL_AT = 0.5  # the share of the plain stream published when the counter is added
BACKFILL_DEFINITION = f"""
[[counter]]
name = "{BACKFILLED}"
topics = ["{TOPIC}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"
since = "earliest"
"""
COUNTERS_FILE_VARIABLE = "COUNTERSINK_CONSUMER__COUNTERS_FILE"


@dataclass
class Backfill:
    """What the backfill phase did: the roll, the runs of ``countersink backfill`` (exit codes, -9 for the one
    killed) and what went wrong in the harness."""

    rolled: int = 0
    runs: list[int] = field(default_factory=list)
    finished: bool = False
    failures: list[str] = field(default_factory=list)


async def backfill_when(reached: asyncio.Event, fleet: Fleet, added: Path, backfill: Backfill) -> None:
    """Once ``reached`` is set: the consumers roll to the definitions with ``volume`` (kill -9 and a restart
    each, a few seconds apart, while the injector goes on killing), then ``countersink backfill volume`` runs:
    killed with kill -9 at its first progress line, then run again until it exits 0."""
    await reached.wait()
    fleet.env = {**fleet.env, COUNTERS_FILE_VARIABLE: str(added)}
    say(f"{BACKFILLED} (since = \"earliest\") added: rolling the consumers to the new definitions")
    for slot in range(len(fleet.consumers)):
        fleet.restart_consumer(slot)  # kill -9 of what runs there, then the new definitions
        backfill.rolled += 1
        await asyncio.sleep(3.0)
    command = [sys.executable, "-m", "countersink.cli", "backfill", BACKFILLED, "--counters", str(added),
               "--group", GROUP, "--wait-s", "600"]
    with open(STACK / "backfill.log", "ab") as log:
        # A run that ends before its first progress line (exit 1: a server the injector restarted went away
        # under it) is started again, until one is killed there: the kill is the fault this phase is for.
        for _ in range(5):
            first = subprocess.Popen(command, cwd=ROOT, env=fleet.env, stdout=subprocess.PIPE, stderr=log)
            assert first.stdout is not None
            while True:
                line = (await asyncio.to_thread(first.stdout.readline)).decode()
                log.write(line.encode())
                if not line or "counted through offset" in line:
                    break
            if first.poll() is None:
                first.kill()
                say(f"fault: countersink backfill {BACKFILLED} killed (kill -9) at its first progress line")
            backfill.runs.append(await asyncio.to_thread(first.wait))
            if backfill.runs[-1] in (-9, 0):
                break
            say(f"countersink backfill {BACKFILLED} exited {backfill.runs[-1]} before its first progress line "
                "(a server restarting?); started again in 3s, to be killed")
            await asyncio.sleep(3.0)
        for attempt in range(1, 31):
            again = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, env=fleet.env, stdout=log,
                                            stderr=log, timeout=900, check=False)
            backfill.runs.append(again.returncode)
            if again.returncode == 0:
                backfill.finished = True
                say(f"countersink backfill {BACKFILLED} finished (run {attempt + 1})")
                return
            say(f"countersink backfill {BACKFILLED} exited {again.returncode} (a server restarting?); again in 3s")
            await asyncio.sleep(3.0)
    backfill.failures.append(f"countersink backfill {BACKFILLED} did not finish in 31 runs")


def report_backfill(backfill: Backfill, refused: int) -> bool:
    """Print the backfill phase; True when it ran as planned (the roll, a run killed, one finished; a run that a
    server restart ended before it could be killed is said in the exit codes, and another was killed)."""
    print(f"backfill ({BACKFILLED}, since earliest): {backfill.rolled} consumers rolled to the new definitions "
          f"under kill -9, {refused} exits 2 of consumers with the old definitions refused a partition; "
          f"countersink backfill runs: exit codes {backfill.runs}")
    for failure in backfill.failures:
        print(f"backfill failed: {failure}")
    return backfill.finished and not backfill.failures and -9 in backfill.runs


class Fleet:
    """The consumer processes and the GC loop, restartable by slot."""

    def __init__(self, env: dict[str, str], consumers: int) -> None:
        self.env = env
        self.consumers: list[subprocess.Popen[bytes]] = [self._start("consumer", [], f"consumer-{i}")
                                                         for i in range(consumers)]
        # The definitions file each slot's process was started with (the backfill phase changes env's).
        self.definitions = [env.get(COUNTERS_FILE_VARIABLE) for _ in range(consumers)]
        self.refused = 0  # exits 2 of a process with older definitions than the fleet's (a refused partition)
        self.gc = self._start("gc_worker", ["--every", "3s"], "gc")

    def _start(self, module: str, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(STACK / f"{name}.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=self.env, stdout=log,
                                    stderr=log)

    def restart_consumer(self, slot: int) -> None:
        """Start the slot's consumer with the fleet's settings now; one still running there is killed (kill -9)
        first: two tasks (the injector, the roll) may restart a slot, and none is left running untracked."""
        running = self.consumers[slot]
        if running.poll() is None:
            running.kill()
            running.wait()
        self.consumers[slot] = self._start("consumer", [], f"consumer-{slot}")
        self.definitions[slot] = self.env.get(COUNTERS_FILE_VARIABLE)

    def revive(self) -> list[tuple[str, int]]:
        """Restart whatever exited on its own, as a supervisor would; returns (name, exit code) of each but the
        exits 2 of a process with older definitions than the fleet's (refused: counted in ``refused``)."""
        exited = []
        for slot, process in enumerate(self.consumers):
            if process.poll() is not None:
                if process.returncode == 2 and self.definitions[slot] != self.env.get(COUNTERS_FILE_VARIABLE):
                    self.refused += 1
                    say(f"consumer {slot} (old definitions) refused a partition with a hand-over: exit 2, "
                        "restarted with the new definitions")
                else:
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
                 rng: random.Random, kill_every_s: float, done: asyncio.Event, at: dict[str, float]) -> None:
    """Faults on a schedule until ``done``: kills throughout, one of each other fault at the second ``at``
    gives it. Server restarts block this loop on purpose: the servers must be started from the main thread."""
    started = time.monotonic()
    plan = dict(at)
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


async def read_values(cassandra: CassandraSettings, expected: dict[str, dict[str, object]]
                      ) -> dict[str, dict[str, object]]:
    values: dict[str, dict[str, object]] = {name: {} for name in expected}
    async with CassandraClient(cassandra) as client:
        for counter, by_symbol in expected.items():
            for symbol in by_symbol:
                state = await read_state(client, counter, symbol)
                values[counter][symbol] = None if state is None else state.value()
    return values


def compare(values: dict[str, dict[str, object]], truth: Truth, prefix: str = "") -> tuple[int, int, list[str]]:
    """(lost, duplicated, mismatched values) of one topic's counters against its truth."""
    counted = {s: int(v or 0) for s, v in values[f"{prefix}trades"].items()}  # type: ignore[call-overload]
    lost = sum(max(0, n - counted.get(s, 0)) for s, n in truth.count.items())
    duplicated = sum(max(0, counted.get(s, 0) - n) for s, n in truth.count.items())
    # An instance with nothing counted since a reset emptied it reads as nothing counted (None).
    mismatched = [f"{c}/{s}: {values[c].get(s)!r} != {v!r}" for c, by in truth.expected(prefix).items()
                  for s, v in by.items() if values[c].get(s) != v and not (v == 0 and values[c].get(s) is None)]
    return lost, duplicated, mismatched


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


async def publish_plain(kafka: KafkaSettings, stream: list[bytes], topic: str = TOPIC,
                        keys: list[bytes | None] | None = None,
                        milestones: list[tuple[float, asyncio.Event]] | None = None) -> None:
    """A plain stream, a hundredth at a time, half a second apart (keyed by ``keys`` when given); each
    milestone's event is set once that share of the stream is published."""
    chunk = max(1, len(stream) // 100)
    for i in range(0, len(stream), chunk):
        await publish(kafka, topic, stream[i:i + chunk], keys=None if keys is None else keys[i:i + chunk])
        for share, reached in milestones or []:
            if min(len(stream), i + chunk) >= share * len(stream):
                reached.set()
        await asyncio.sleep(0.5)
        if i // chunk % 10 == 9:
            say(f"published {min(len(stream), i + chunk)}/{len(stream)} records to {topic}")


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    STACK.mkdir(parents=True, exist_ok=True)
    for old in STACK.glob("*.log"):
        old.unlink()
    # Ports below Linux's ephemeral range (32768-60999): a readiness probe of a port in that range, sent
    # before the server listens, can be given that same port as its own and connect to itself, and the
    # server then fails to bind.
    shift = args.port_offset
    kafka_server = servers.KafkaServer(port=19092 + shift, controller_port=19093 + shift, root=STACK / "kafka")
    cassandra_node = servers.CassandraNode(native_port=19042 + shift, storage_port=17000 + shift,
                                           jmx_port=17199 + shift, seeds=f"127.0.0.1:{17000 + shift}",
                                           cluster_name="countersink-chaos", root=STACK / "cassandra")
    say("starting Kafka and Cassandra")
    kafka_server.start(tied_to_parent=True, wait=False)
    cassandra_node.start(tied_to_parent=True, wait=False)
    fleet: Fleet | None = None
    transactional = args.tx_events > 0
    poisoned = args.poison_events > 0
    mixing = args.mixed_events > 0
    try:
        kafka_server.wait_ready()
        cassandra_node.wait_ready()
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-chaos")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=19042 + shift, keyspace="countersink_chaos",
                                      request_timeout_s=5.0)
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS countersink_chaos", prepared=False)
            await client.ensure_schema()
        await ensure_topics(kafka, {TOPIC: PARTITIONS, **({TX_TOPIC: PARTITIONS} if transactional else {}),
                                    **({POISON_TOPIC: PARTITIONS} if poisoned else {}),
                                    **({MIXED_TOPIC: PARTITIONS} if mixing else {})})
        counters = STACK / "counters.toml"
        counters.write_text(DEFINITIONS + (definitions(TX_TOPIC, TX_PREFIX) if transactional else "")
                            + (POISON_DEFINITIONS if poisoned else "") + (MIXED_DEFINITIONS if mixing else ""))
        stream, truth, retries, bad = make_events(args.events, rng)
        say(f"{args.events} trades over {len(truth.count)} symbols, {retries} publisher retries, {bad} malformed "
            f"records: {len(stream)} records")
        consumer: dict[str, object] = {
            "group_id": GROUP, "counters_file": counters, "dead_letter_topic": DEAD_LETTERS,
            "session_timeout_ms": SESSION_TIMEOUT_MS, "health_port": 0, "mutator_max_age_s": 20,
            "flush_interval_s": 0.5}
        # Its own random numbers, so that a seed gives the same plain stream and faults as before this phase.
        plan = make_transactions(args.tx_events, random.Random(f"tx-{args.seed}"))
        tx_log = TxLog()
        if transactional:
            # The plain stream's retries come at most ~210 records later across all six partitions and so
            # far fewer in their own (54 at most in a 1M-event stream, seed 11): well inside this window too.
            consumer["retry_window_records"] = RETRY_WINDOW
            aborts = sum(tx.abort_first for tx in plan.transactions)
            say(f"transactional phase on {TX_TOPIC}: {plan.events} trades, {plan.retries} publisher retries 1 to "
                f"{RETRY_DISTANCE} records later in their partition (retry window {RETRY_WINDOW} records), "
                f"{plan.bad} malformed records: {plan.records} records in {len(plan.transactions)} "
                f"transactions of 1 to 8, {aborts} of them aborted once first")
        poison, drawn = poison_stream(args.poison_events, random.Random(f"poison-{args.seed}"), time.time())
        if poisoned:
            say(f"poison phase on {POISON_TOPIC}: {args.poison_events} trades and {sum(drawn.values())} poison "
                f"records ({', '.join(f'{case} {n}' for case, n in sorted(drawn.items()))})")
        mixed, mixed_keys = mixed_stream(args.mixed_events, random.Random(f"mixed-{args.seed}"))
        if mixing:
            say(f"mixed phase on {MIXED_TOPIC}: {len(mixed)} records, views, purchases and sign-ups for five counters "
                "(one by record key and hour of record time), about a sixth of their fields absent, null or of a "
                "wrong type, some keys absent or not UTF-8, a hundredth not JSON")
        env = child_env(kafka, cassandra, consumer=consumer, gc={"grace_s": 2, "health_port": 0})
        fleet = Fleet(env, args.consumers)
        faults = Faults()
        done = asyncio.Event()
        injector = asyncio.create_task(inject(fleet, kafka_server, cassandra_node, faults, rng, args.kill_every,
                                              done, QUICK_FAULTS_AT if args.quick else FAULTS_AT))
        started = time.monotonic()
        resets = Resets()
        milestones: list[tuple[float, asyncio.Event]] = []
        resetters = []
        if args.resets:
            symbols = sorted(truth.count)
            reset_rng = random.Random(f"resets-{args.seed}")
            chosen = reset_rng.sample(symbols, max(n for _, n, _ in RESETS))
            for counter, n, share in RESETS:
                reached = asyncio.Event()
                milestones.append((share, reached))
                resetters.append(reset_when(reached, env, counter, sorted(reset_rng.sample(chosen, n)) if n else [],
                                            resets))
        backfill = Backfill()
        if args.backfill:
            added = STACK / "counters-backfill.toml"
            added.write_text(counters.read_text() + BACKFILL_DEFINITION)
            reached = asyncio.Event()
            milestones.append((BACKFILL_AT, reached))
            resetters.append(backfill_when(reached, fleet, added, backfill))
        publishers = [publish_plain(kafka, stream, milestones=milestones), *resetters]
        if transactional:
            publishers.append(publish_transactions(kafka, plan, tx_log))
        if poisoned:
            publishers.append(publish_plain(kafka, poison, POISON_TOPIC))
        if mixing:
            publishers.append(publish_plain(kafka, mixed, MIXED_TOPIC, mixed_keys))
        await asyncio.gather(*publishers)
        published = (len(stream) + (plan.records if transactional else 0) + (len(poison) if poisoned else 0)
                     + (len(mixed) if mixing else 0))
        say(f"all {published} records published after "
            f"{time.monotonic() - started:.0f}s; waiting for the planned faults, then for the consumers")
        done.set()
        await injector
        ends = await end_offsets(kafka, {TOPIC: PARTITIONS, **({POISON_TOPIC: PARTITIONS} if poisoned else {}),
                                         **({MIXED_TOPIC: PARTITIONS} if mixing else {})})
        committed: TxTruth | None = None
        if transactional:
            committed = committed_truth(await read_topic(kafka, TX_TOPIC, PARTITIONS), plan, tx_log, RETRY_WINDOW)
            # A transactional partition ends with a commit marker, which no consumer sees as a record: its
            # last record is what must be flushed.
            ends.update({TopicPartition(TX_TOPIC, p): offset + 1 for p, offset in committed.last_offsets.items()})
        await wait_until_flushed(cassandra, GROUP, ends, 600,
                                 lambda behind: say(f"{behind} records not yet flushed"))
        for name, code in fleet.revive():
            faults.unexpected_exits.append((name, code))
        say(f"lag 0 after {time.monotonic() - started:.0f}s; stopping the consumers and the GC loop")
        codes = fleet.stop()
        fleet_refused = fleet.refused
        fleet = None
        await asyncio.sleep(3.5)  # retire times up to 1 s ahead, then the GC grace
        gc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gc_worker", "--once", "--json", "--no-progress", cwd=ROOT,
            env={**env, "COUNTERSINK_LOG_LEVEL": "WARNING"}, stdout=asyncio.subprocess.PIPE)
        out = (await gc.communicate())[0].decode().strip()
        report = json.loads(out.splitlines()[-1]) if out else {}
        say(f"final GC: exit {gc.returncode}, folded {report.get('instances_folded')} instances, "
            f"{report.get('mutators_collected')} mutators collected")
        window = int(consumer.get("retry_window_records", ConsumerSettings().retry_window_records))  # type: ignore[call-overload]
        plain = await read_topic(kafka, TOPIC, PARTITIONS) if args.resets or args.backfill else {}
        if args.backfill:
            # Every trade of the topic, retries within the window once, no reset (volume is never reset).
            volume_truth = reset_truth(plain, [], window)[1]
            volume_expected: dict[str, dict[str, object]] = {BACKFILLED: {s: volume_truth[s] for s in truth.smallest}}
            volume_values = await read_values(cassandra, volume_expected)
        if args.resets:
            reset_trades, reset_shares = reset_truth(plain, resets.done, window)
            # Every symbol, 0 included: a count in an instance a reset emptied is a duplicate.
            truth.count = Counter({s: reset_trades[s] for s in truth.smallest})
            truth.qty = Counter({s: reset_shares[s] for s in truth.smallest})
        expected = truth.expected()
        if committed is not None:
            expected.update(committed.truth.expected(TX_PREFIX))
        values = await read_values(cassandra, expected)
        poisoned_truth: PoisonTruth | None = None
        if poisoned:
            poisoned_truth = poison_truth(await read_topic(kafka, POISON_TOPIC, PARTITIONS), POISON_DEFINITIONS)
            poison_values = await read_values(cassandra, poisoned_truth.values)
        mixed_expected: MixedTruth | None = None
        if mixing:
            mixed_expected = mixed_truth(await read_topic(kafka, MIXED_TOPIC, PARTITIONS))
            mixed_values = await read_values(cassandra, mixed_expected.values)
        lost, duplicated, mismatched = compare(values, truth)
        takeovers, rotations = ownership_changes()
        say(f"exit codes at stop (consumers, GC loop): {codes}")
        print(f"faults={faults.total} (kill -9: {faults.kills}, kafka restarts: {faults.kafka_restarts}, "
              f"cassandra restarts: {faults.cassandra_restarts}, zombies: {faults.zombies}, "
              f"gc kills: {faults.gc_kills}); partition takeovers: {takeovers - rotations} by rebalance, "
              f"{rotations} by rotation")
        print(f"unexpected exits: {faults.unexpected_exits or 'none'}")
        harness_ok = True
        if args.resets:
            harness_ok = await report_resets(env, resets)
        if args.backfill:
            harness_ok = report_backfill(backfill, fleet_refused) and harness_ok
            counted = {s: int(v or 0) for s, v in volume_values[BACKFILLED].items()}  # type: ignore[call-overload]
            b_lost = sum(max(0, n - counted.get(s, 0)) for s, n in volume_truth.items())
            b_duplicated = sum(max(0, counted.get(s, 0) - n) for s, n in volume_truth.items())
            b_mismatched = [f"{BACKFILLED}/{s}: {volume_values[BACKFILLED].get(s)!r} != {v!r}"
                            for s, v in volume_expected[BACKFILLED].items()
                            if volume_values[BACKFILLED].get(s) != v
                            and not (v == 0 and volume_values[BACKFILLED].get(s) is None)]
            print(f"backfill phase ({BACKFILLED}): lost={b_lost} duplicated={b_duplicated} "
                  f"mismatched={len(b_mismatched)} over {len(volume_expected[BACKFILLED])} symbols")
            for line in b_mismatched[:10]:
                print(f"  {line}")
            lost, duplicated, mismatched = lost + b_lost, duplicated + b_duplicated, mismatched + b_mismatched
        if committed is not None:
            tx_lost, tx_duplicated, tx_mismatched = compare(values, committed.truth, TX_PREFIX)
            print(f"plain phase ({TOPIC}): lost={lost} duplicated={duplicated} mismatched={len(mismatched)}")
            print(f"transactional phase ({TX_TOPIC}): {tx_log.committed} transactions committed, {tx_log.aborted} "
                  f"aborted and sent again, {len(tx_log.failures)} failed and sent again "
                  f"({committed.unknown_committed} of {committed.unknown} whose commit failed were committed); "
                  f"read back {committed.committed_records} committed records: "
                  f"{committed.retries_dropped} retries within the {RETRY_WINDOW}-record window, "
                  f"{committed.retries_counted} beyond it")
            print(f"transactional phase ({TX_TOPIC}): lost={tx_lost} duplicated={tx_duplicated} "
                  f"mismatched={len(tx_mismatched)}")
            # Not countersink's doing, but without them the truth above means nothing.
            read_back = not (committed.aborted_visible or committed.committed_missing or committed.torn)
            harness_ok = harness_ok and read_back  # the resets' and the backfill's checks above count too
            if not read_back:
                print(f"read-back disagrees with the publisher: aborted records visible={committed.aborted_visible}"
                      f", committed records missing={committed.committed_missing}, attempts partly visible="
                      f"{committed.torn[:10]}")
            lost, duplicated, mismatched = lost + tx_lost, duplicated + tx_duplicated, mismatched + tx_mismatched
        print(f"checked {sum(len(v) for v in expected.values())} values of {len(expected)} counters "
              f"over {len(truth.count) + (len(committed.truth.count) if committed else 0)} symbols; "
              f"mismatched={len(mismatched)}")
        for line in mismatched[:10]:
            print(f"  {line}")
        if poisoned_truth is not None:
            p_lost, p_duplicated, p_mismatched = compare_poison(poison_values, poisoned_truth)
            print(f"poison phase ({POISON_TOPIC}): lost={p_lost} duplicated={p_duplicated} "
                  f"mismatched={len(p_mismatched)} over {sum(map(len, poisoned_truth.values.values()))} instances; "
                  f"{len(poisoned_truth.refused)} records refused by a single owner")
            for line in p_mismatched[:10]:
                print(f"  {line[:300]}")
            if poisoned_truth.accepted_poison:
                print(f"poison the reference router accepted: {sorted(set(poisoned_truth.accepted_poison))}")
                harness_ok = False
            lost, duplicated, mismatched = lost + p_lost, duplicated + p_duplicated, mismatched + p_mismatched
        if mixed_expected is not None:
            m_lost, m_duplicated, m_mismatched = compare_mixed(mixed_values, mixed_expected)
            print(f"mixed phase ({MIXED_TOPIC}): lost={m_lost} duplicated={m_duplicated} "
                  f"mismatched={len(m_mismatched)} over {sum(map(len, mixed_expected.values.values()))} instances of "
                  f"5 counters; {mixed_expected.skipped} (record, counter) pairs not applicable, "
                  f"{len(mixed_expected.refused)} records refused by some counter (per-counter truth)")
            for line in m_mismatched[:10]:
                print(f"  {line}")
            lost, duplicated, mismatched = lost + m_lost, duplicated + m_duplicated, mismatched + m_mismatched
        missing: list[str] = []
        dead = await read_dead_letters(kafka, DEAD_LETTERS) if committed or poisoned_truth or mixed_expected else {}
        if mixed_expected is not None:
            m_missing = [s for s, value in mixed_expected.refused.items() if value not in dead.get(s, [])]
            m_unexpected = [s for s in dead if s.startswith(f"{MIXED_TOPIC}/") and s not in mixed_expected.refused]
            print(f"mixed phase: dead_letters_missing={len(m_missing)} dead_letters_unexpected={len(m_unexpected)}")
            for source in (m_missing + m_unexpected)[:10]:
                print(f"  {source}")
            missing += m_missing + m_unexpected
        if poisoned_truth is not None:
            p_missing = [s for s, value in poisoned_truth.refused.items() if value not in dead.get(s, [])]
            p_unexpected = [s for s in dead if s.startswith(f"{POISON_TOPIC}/") and s not in poisoned_truth.refused]
            print(f"poison phase: dead_letters_missing={len(p_missing)} dead_letters_unexpected={len(p_unexpected)}")
            for source in (p_missing + p_unexpected)[:10]:
                print(f"  {source}")
            missing += p_missing + p_unexpected
        if committed is not None:
            tx_missing = [s for s, value in committed.malformed.items() if value not in dead.get(s, [])]
            unexpected = [source for source in dead if source.startswith(f"{TX_TOPIC}/")
                          and source not in committed.malformed]
            print(f"dead_letters_missing={len(tx_missing)} dead_letters_unexpected={len(unexpected)} "
                  f"({len(committed.malformed)} malformed records committed to {TX_TOPIC}; "
                  f"{sum(len(dead[s]) for s in committed.malformed if s in dead)} dead letters from them)")
            for source in (tx_missing + unexpected)[:10]:
                print(f"  {source}")
            missing += tx_missing + unexpected
        print(f"lost={lost} duplicated={duplicated}")
        return 0 if (lost == 0 and duplicated == 0 and not mismatched and not missing and harness_ok
                     and gc.returncode == 0) else 1
    finally:
        if fleet is not None:
            fleet.stop()
        kafka_server.stop()
        cassandra_node.stop()
        say("servers stopped")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, help="plain trades (default 1,000,000; 40,000 with --quick)")
    parser.add_argument("--tx-events", type=int,
                        help="trades published in transactions (default 20,000; 6,000 with --quick; 0 skips them)")
    parser.add_argument("--poison-events", type=int,
                        help="trades on the poison topic, with about 5%% poison records mixed in (far-future "
                             "times, huge numbers, deep nesting, oversize keys, bad UTF-8); default 20,000, "
                             "4,000 with --quick; 0 skips them")
    parser.add_argument("--mixed-events", type=int,
                        help="records on the mixed topic: three types of event, five counters, spoiled fields "
                             "(default 10,000; 3,000 with --quick; 0 skips them)")
    parser.add_argument("--quick", action="store_true",
                        help="a CI-sized run: fewer events, the one-off faults sooner (about 4 minutes on 2 cores)")
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--kill-every", type=float,
                        help="seconds between kills, on average (default 6; 4 with --quick)")
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "big"))
    parser.add_argument("--no-resets", dest="resets", action="store_false",
                        help="make no reset during the plain phase (its truth is then the stream's own)")
    parser.add_argument("--no-backfill", dest="backfill", action="store_false",
                        help="add no counter with since half way (no rolling restart, no countersink backfill)")
    parser.add_argument("--port-offset", type=int, default=0, metavar="N",
                        help="add N to every port of the run's own Kafka and Cassandra (19092, 19093, 19042, 17000, "
                             "17199), to run beside another stack on the same machine")
    args = parser.parse_args()
    if args.events is None:
        args.events = 40_000 if args.quick else 1_000_000
    if args.tx_events is None:
        args.tx_events = 6_000 if args.quick else 20_000
    if args.poison_events is None:
        args.poison_events = 4_000 if args.quick else 20_000
    if args.mixed_events is None:
        args.mixed_events = 3_000 if args.quick else 10_000
    if args.kill_every is None:
        args.kill_every = 4.0 if args.quick else 6.0
    configure_logging("WARNING", "console")
    say(f"seed {args.seed} (repeat with --seed {args.seed})")
    try:
        return asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"[chaos] error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
