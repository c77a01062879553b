"""Rows holding many keys: what the page views' flushes cost Cassandra in layouts below schema 3's floor.

    python -m bench.key_rows [--cassandra HOST:PORT] [--events N] [--flush-events N] [--rounds N]
                             [--slots 16,256] [--reads N]

A prototype, to judge a layout by (docs/benchmarks.md, "Rows holding many keys"), not the product's store.
The page views of ``bench.shapes`` (``--events``, ``--pages`` pages, keyed by user as ``bench.stream2``
publishes them) are counted by the nine counters of ``bench.shapes.PAGE_VIEWS`` in 12 mutators (one per
Kafka partition: ``crc32(user) % 12``), each flushing the instances it changed every ``--flush-events`` of
its events (and once at the end). The states are real: each mutator keeps a ``schemas.kinds`` state per
counter and instance, and a flush writes the bytes of each changed one (``shard_cell``: offset, then state).
Those flushes are written, in a keyspace ``keyrows_*`` of this machine's Cassandra (dropped at the end), in:

- ``rows`` (schema 3): a partition per instance key (its bucket in it, as ``page|hour``), a row per
  (birth, mutator), a ``states`` map cell per counter: a flush writes a row per key it changed.
- ``slot map S``: a partition per (bucket, slot), ``slot = crc32(key) % S`` (:func:`slot_of`), a row per
  (birth, mutator) whose ``cells`` map holds ``counter \\0 key`` -> cell for every key of the slot: a flush
  writes a row per (bucket, slot) it changed. Read with ``cells[?]``: one element of each mutator's row.
- ``slot clustered S``: the same partitions, a row per (key, birth, mutator): clustered by the key first, so
  that one instance is one clustering slice (``name = ?``); a flush writes one partition update per
  (bucket, slot), as one single-partition batch of its rows.
- ``slot keyed S``: the same partitions, schema 3's rows in them: a row per (key, birth, mutator) holding a
  ``states`` cell per counter (as many rows as ``rows``), a flush's rows of one slot one single-partition
  batch (one mutation); an instance is one clustering slice (``key = ?``).
- ``mutator rows``: a partition per (bucket, mutator), a row per key (``name``): a flush writes one
  partition update per bucket; an instance is read from every live mutator's partition (``mutator IN ?``).

Statements are grouped as the consumer groups rows (``write_batch_rows`` 10), and never into a multi-
partition batch over 4 KiB (Cassandra's warning threshold is 5 KiB, its failure 50 KiB); a slot's rows
are one single-partition batch (one mutation). Rounds write the same flushes under a new bucket prefix
(new partitions), layouts in an order shuffled each round; Cassandra's CPU (``/proc``) is read around each
layout's writes, and 2 s after; this process's CPU (building the statements and sending them: what the
consumer's flush pays beside encoding the states) around the writes. A request that times out is retried (up to
3 times, counted), as a flush retries its batches.

Reads (``--reads`` of each, interleaved in an order shuffled each round, beside a plain one-row read): one
instance of each row key's shape from the last round (a page-hour's views, a country-hour's views, an
endpoint-hour's latency quantiles, a page-day's visitors, a country's top endpoints), merged, every count
checked against what the mutators flushed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from bench import shapes
from bench.wide_layouts import cassandra_pid, cpu_s, interleaved
from countersink.cassandra import CassandraClient, CassandraUnavailableError
from countersink.settings import CassandraSettings
from schemas.cql import shard_cell, shard_of_cell
from schemas.definitions import parse_definitions
from schemas.kinds import State, merge_blobs, new_state

MUTATORS = 12
SEP = "\x00"
NO_BUCKET = "-"
BATCH_ROWS = 10  # the consumer's default write_batch_rows
BATCH_BYTES = 4096  # a multi-partition batch stays under Cassandra's 5 KiB warning
SLOT_BATCH_ROWS = 250  # rows of one partition per single-partition batch (a mutation): 1,000 timed out once
WORKERS = 64
BORN_US = 1_795_000_000 * 1_000_000
COMPACTION = "compaction = {'class': 'UnifiedCompactionStrategy', 'scaling_parameters': 'L4'}"
PLAIN = "plain row"

Statement = tuple[str, list[object]]


def slot_of(key: str, slots: int) -> int:
    """The slot of an instance key among ``slots``: stable across processes and runs (crc32 of its UTF-8),
    so that every mutator puts a key in the same partition and a reader finds it there."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    return zlib.crc32(key.encode()) % slots


def partition_of(user: str, partitions: int = MUTATORS) -> int:
    """The Kafka partition of a page view keyed by ``user`` (as ``bench.pipeline.load`` places it)."""
    return zlib.crc32(user.encode()) % partitions


def cell_name(counter: str, key: str) -> str:
    """A key's cell in a row holding many keys: the counter, NUL, the instance key (without its bucket)."""
    return f"{counter}{SEP}{key}"


def updates(event: dict[str, Any]) -> list[tuple[str, str, str, object]]:
    """(counter, bucket, key, value) of each of the nine PAGE_VIEWS counters one page view updates (a counter
    whose filter the event does not meet is absent)."""
    ts = event["ts"]
    hour = time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(ts - ts % 3600))
    day = time.strftime("%Y-%m-%dT00:00Z", time.gmtime(ts))
    page, country, endpoint = event["page"], event["user"]["country"], event["endpoint"]
    latency = float(event["latency_ms"])
    out: list[tuple[str, str, str, object]] = [
        ("views", hour, page, None),
        ("views_by_country", hour, country, None),
        ("latency", hour, endpoint, latency),
        ("top_endpoints", NO_BUCKET, country, endpoint),
        ("visitors", day, page, event["user"]["id"]),
        ("slowest", NO_BUCKET, endpoint, latency),
        ("bytes", NO_BUCKET, f"{endpoint}|{event['status']}", float(event["bytes"])),
    ]
    if event["type"] == "purchase":
        out.append(("revenue", hour, country, event["amount"]))
    if event["status"] in (500, 503):
        out.append(("errors", hour, endpoint, None))
    return out


@dataclass
class Flush:
    """One mutator's flush: (bucket, key) -> counter -> shard cell."""

    mutator: int
    seq: int
    rows: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)


@dataclass
class Stream:
    events: int
    flushes: list[Flush]
    # (bucket, key) -> counter -> mutator -> the last cell it flushed: what a read must merge
    last: dict[tuple[str, str], dict[str, dict[int, bytes]]]
    floor_rows: int  # distinct (mutator, bucket, key): schema 3's rows whatever the flush schedule


def generate(events: int, pages: int, flush_events: int, seed: int) -> Stream:
    """The page views counted by 12 mutators, each flushing every ``flush_events`` of its events."""
    definitions = {d.name: d for d in parse_definitions(shapes.PAGE_VIEWS).counters}
    rng = random.Random(seed)
    states: list[dict[tuple[str, str, str], State]] = [{} for _ in range(MUTATORS)]
    dirty: list[set[tuple[str, str, str]]] = [set() for _ in range(MUTATORS)]
    seen = [0] * MUTATORS
    seqs = [0] * MUTATORS
    flushes: list[Flush] = []
    last: dict[tuple[str, str], dict[str, dict[int, bytes]]] = {}
    touched: set[tuple[int, str, str]] = set()

    def flush(m: int, offset: int) -> None:
        seqs[m] += 1
        f = Flush(m, seqs[m])
        for counter, bucket, key in sorted(dirty[m]):
            cell = shard_cell(states[m][(counter, bucket, key)].to_bytes(), offset)
            f.rows.setdefault((bucket, key), {})[counter] = cell
            last.setdefault((bucket, key), {}).setdefault(counter, {})[m] = cell
        dirty[m].clear()
        flushes.append(f)

    for i in range(events):
        value = shapes.event(i, rng, pages)
        event = json.loads(value, parse_float=Decimal)
        m = partition_of(event["user"]["id"])
        for counter, bucket, key, v in updates(event):
            state = states[m].get((counter, bucket, key))
            if state is None:
                state = states[m][(counter, bucket, key)] = new_state(definitions[counter])
            state.apply(v)
            dirty[m].add((counter, bucket, key))
            touched.add((m, bucket, key))
        seen[m] += 1
        if seen[m] % flush_events == 0:
            flush(m, i)
    for m in range(MUTATORS):
        if dirty[m]:
            flush(m, events)
    return Stream(events, flushes, last, len(touched))


@dataclass
class Written:
    statements: int = 0  # CQL statements (a batch's each counted)
    requests: int = 0  # requests sent (a batch is one)
    rows: int = 0  # CQL rows written
    mutations: int = 0  # partition updates (a single-partition batch is one)
    bytes: int = 0  # partition keys, clustering keys, cell names and cells of every statement
    timeouts: int = 0  # requests retried after a timeout


class Layout:
    """How one shape writes a flush and reads one instance."""

    def __init__(self, name: str, slots: int = 0) -> None:
        self.name = name
        self.slots = slots
        self.table = "t_" + "".join(c if c.isalnum() else "_" for c in name.replace(" ", "_")).lower()

    @property
    def columns(self) -> str:
        if self.name == "rows":
            return ("key text, born_us bigint, mutator uuid, states map<text, blob>, "
                    "PRIMARY KEY ((key), born_us, mutator)")
        if self.name.startswith("slot map"):
            return ("bucket text, slot int, born_us bigint, mutator uuid, cells map<text, blob>, "
                    "PRIMARY KEY ((bucket, slot), born_us, mutator)")
        if self.name.startswith("slot clustered"):
            return ("bucket text, slot int, name text, born_us bigint, mutator uuid, cell blob, "
                    "PRIMARY KEY ((bucket, slot), name, born_us, mutator)")
        if self.name.startswith("slot keyed"):
            return ("bucket text, slot int, key text, born_us bigint, mutator uuid, states map<text, blob>, "
                    "PRIMARY KEY ((bucket, slot), key, born_us, mutator)")
        return "bucket text, mutator uuid, name text, cell blob, PRIMARY KEY ((bucket, mutator), name)"

    def write(self, flush: Flush, prefix: str, mutators: list[uuid.UUID], written: Written
              ) -> list[list[Statement]]:
        """The requests (each a list of statements: one, or a batch) of one flush."""
        t, mutator, born = self.table, mutators[flush.mutator], BORN_US + flush.mutator
        requests: list[list[Statement]]
        if self.name == "rows":
            cql = (f"UPDATE {t} USING TIMESTAMP ? SET states = states + ? WHERE key = ? "  # noqa: S608
                   "AND born_us = ? AND mutator = ?")
            statements: list[tuple[int, Statement]] = []
            for (bucket, key), cells in flush.rows.items():
                row_key = f"{key}|{prefix}{bucket}"
                size = len(row_key) + sum(len(c) + len(v) for c, v in cells.items())
                statements.append((size, (cql, [flush.seq, cells, row_key, born, mutator])))
                written.rows += 1
                written.mutations += 1
                written.bytes += size
            return self._grouped(statements, written)
        if self.name.startswith("slot keyed"):
            cql = (f"UPDATE {t} USING TIMESTAMP ? SET states = states + ? WHERE bucket = ? AND slot = ? "  # noqa: S608
                   "AND key = ? AND born_us = ? AND mutator = ?")
            keyed: dict[tuple[str, int], list[Statement]] = {}
            for (bucket, key), cells in flush.rows.items():
                slot = slot_of(key, self.slots)
                keyed.setdefault((prefix + bucket, slot), []).append(
                    (cql, [flush.seq, cells, prefix + bucket, slot, key, born, mutator]))
                written.bytes += len(prefix + bucket) + 4 + len(key) + sum(len(c) + len(v) for c, v in cells.items())
            requests = []
            for group in keyed.values():
                written.rows += len(group)
                requests.extend(_single_partition_batches(group, written))
            return requests
        by_partition: dict[tuple[str, Any], dict[str, bytes]] = {}
        for (bucket, key), cells in flush.rows.items():
            part = (prefix + bucket, slot_of(key, self.slots) if self.slots else mutator)
            row = by_partition.setdefault(part, {})
            for counter, cell in cells.items():
                row[cell_name(counter, key)] = cell
        if self.name.startswith("slot map"):
            cql = (f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ? WHERE bucket = ? AND slot = ? "  # noqa: S608
                   "AND born_us = ? AND mutator = ?")
            statements = []
            for (bucket, slot), cells in by_partition.items():
                size = len(bucket) + 4 + sum(len(c) + len(v) for c, v in cells.items())
                statements.append((size, (cql, [flush.seq, cells, bucket, slot, born, mutator])))
                written.rows += 1
                written.mutations += 1
                written.bytes += size
            return self._grouped(statements, written)
        requests = []
        for (bucket, part), cells in by_partition.items():
            if self.name.startswith("slot clustered"):
                cql = (f"INSERT INTO {t} (bucket, slot, name, born_us, mutator, cell) VALUES (?, ?, ?, ?, ?, ?) "  # noqa: S608
                       "USING TIMESTAMP ?")
                rows: list[Statement] = [(cql, [bucket, part, name, born, mutator, cell, flush.seq])
                                         for name, cell in cells.items()]
            else:
                cql = f"INSERT INTO {t} (bucket, mutator, name, cell) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"  # noqa: S608
                rows = [(cql, [bucket, part, name, cell, flush.seq]) for name, cell in cells.items()]
            # each statement carries its partition key
            written.bytes += sum(len(bucket) + (4 if self.slots else 16) + len(n) + len(c) for n, c in cells.items())
            written.rows += len(rows)
            requests.extend(_single_partition_batches(rows, written))
        return requests

    @staticmethod
    def _grouped(statements: list[tuple[int, Statement]], written: Written) -> list[list[Statement]]:
        """Up to BATCH_ROWS statements of different partitions per unlogged batch, under BATCH_BYTES; a larger
        statement alone."""
        requests: list[list[Statement]] = []
        group: list[Statement] = []
        size = 0
        for n, statement in statements:
            if group and (len(group) == BATCH_ROWS or size + n > BATCH_BYTES):
                requests.append(group)
                group, size = [], 0
            group.append(statement)
            size += n
        if group:
            requests.append(group)
        written.statements += len(statements)
        written.requests += len(requests)
        return requests

    async def read(self, client: CassandraClient, counter: str, bucket: str, key: str,
                   mutators: list[uuid.UUID]) -> list[bytes]:
        """The cells of one instance (``bucket`` with its round's prefix)."""
        t = self.table
        if self.name == "rows":
            result = await client.execute(f"SELECT states[?] FROM {t} WHERE key = ?",  # noqa: S608
                                          [counter, f"{key}|{bucket}"])
        elif self.name.startswith("slot map"):
            result = await client.execute(f"SELECT cells[?] FROM {t} WHERE bucket = ? AND slot = ?",  # noqa: S608
                                          [cell_name(counter, key), bucket, slot_of(key, self.slots)])
        elif self.name.startswith("slot keyed"):
            result = await client.execute(f"SELECT states[?] FROM {t} WHERE bucket = ? AND slot = ? AND key = ?",  # noqa: S608
                                          [counter, bucket, slot_of(key, self.slots), key])
        elif self.name.startswith("slot clustered"):
            result = await client.execute(f"SELECT cell FROM {t} WHERE bucket = ? AND slot = ? AND name = ?",  # noqa: S608
                                          [bucket, slot_of(key, self.slots), cell_name(counter, key)])
        else:
            result = await client.execute(f"SELECT cell FROM {t} WHERE bucket = ? AND mutator IN ? AND name = ?",  # noqa: S608
                                          [bucket, mutators, cell_name(counter, key)])
        return [row.as_tuple()[0] for row in result if row.as_tuple()[0] is not None]


def layouts_for(slots: Iterable[int], names: Iterable[str]) -> list[Layout]:
    out: list[Layout] = []
    for name in names:
        if name in ("slot map", "slot clustered", "slot keyed"):
            out += [Layout(f"{name} {s}", s) for s in slots]
        else:
            out.append(Layout(name))
    return out


async def bounded(calls: list[Callable[[], Awaitable[object]]]) -> None:
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()

    await asyncio.gather(*(worker() for _ in range(min(len(calls), WORKERS))))


RETRIES = 3


def request(client: CassandraClient, statements: list[Statement], written: Written
            ) -> Callable[[], Awaitable[object]]:
    """One request, retried up to RETRIES times on a timeout as a flush retries its batches (the writes carry
    their timestamps, so a retry writes the same cells); each retry is counted in ``written.timeouts``."""
    call = (functools.partial(client.execute, *statements[0]) if len(statements) == 1
            else functools.partial(client.execute_batch, statements))

    async def attempt() -> object:
        for tried in range(RETRIES + 1):
            try:
                return await call()
            except CassandraUnavailableError:
                if tried == RETRIES:
                    raise
                written.timeouts += 1
        raise AssertionError("unreachable")
    return attempt


async def write_stream(client: CassandraClient, layout: Layout, stream: Stream, prefix: str,
                       mutators: list[uuid.UUID]) -> Written:
    """Every flush, in the order the mutators made them; a flush's requests run concurrently, the flushes of
    different mutators too (up to 12 at a time, as 12 consumers would)."""
    written = Written()
    by_mutator: list[list[list[list[Statement]]]] = [[] for _ in range(MUTATORS)]
    for f in stream.flushes:
        by_mutator[f.mutator].append(layout.write(f, prefix, mutators, written))

    async def consumer(flushes: list[list[list[Statement]]]) -> None:
        for requests in flushes:
            await bounded([request(client, r, written) for r in requests])

    await asyncio.gather(*(consumer(f) for f in by_mutator))
    return written


def instances(stream: Stream) -> list[tuple[str, str, str, str]]:
    """(label, counter, bucket, key) of the instances read: the one of each shape with the most shards."""
    wanted = [("views, page-hour", "views", "T"), ("views, country-hour", "views_by_country", "T"),
              ("latency quantiles, endpoint-hour", "latency", "T"), ("visitors, page-day", "visitors", "00:00Z"),
              ("top endpoints, country", "top_endpoints", NO_BUCKET)]
    out: list[tuple[str, str, str, str]] = []
    for label, counter, bucket_mark in wanted:
        best = max(((len(c[counter]), b, k) for (b, k), c in stream.last.items()
                    if counter in c and bucket_mark in b), key=lambda x: x[0])
        out.append((label, counter, best[1], best[2]))
    return out


async def measure_reads(client: CassandraClient, layouts: list[Layout], stream: Stream, prefix: str,
                        mutators: dict[str, list[uuid.UUID]], rounds: int, seed: int) -> dict[str, tuple[float, float]]:
    await client.execute("CREATE TABLE IF NOT EXISTS plain_values (k text PRIMARY KEY, v bigint)", prepared=False)
    await client.execute("INSERT INTO plain_values (k, v) VALUES ('one', 1)", prepared=False)

    async def plain() -> None:
        await client.execute("SELECT v FROM plain_values WHERE k = ?", ["one"])

    def reader(layout: Layout, counter: str, bucket: str, key: str) -> Callable[[], Awaitable[None]]:
        expected = stream.last[(bucket, key)][counter]
        want = merge_blobs([shard_of_cell(c)[0] for c in expected.values()])

        async def read() -> None:
            cells = await layout.read(client, counter, prefix + bucket, key, mutators[layout.name])
            if len(cells) != len(expected):
                raise RuntimeError(f"{layout.name}: {counter} {key}: {len(cells)} shards, not {len(expected)}")
            state = merge_blobs([shard_of_cell(c)[0] for c in cells])
            if counter.startswith("views") and (state is None or want is None or state.value() != want.value()):
                raise RuntimeError(f"{layout.name}: {counter} {key} reads {state and state.value()}")
        return read

    reads: dict[str, Callable[[], Awaitable[None]]] = {PLAIN: plain}
    for label, counter, bucket, key in instances(stream):
        shards = len(stream.last[(bucket, key)][counter])
        for layout in layouts:
            reads[f"{layout.name}: {label} ({shards} shards)"] = reader(layout, counter, bucket, key)
    return await interleaved(reads, rounds, seed)


async def run(args: argparse.Namespace) -> None:
    host, _, port = args.cassandra.rpartition(":")
    pid = args.cassandra_pid or cassandra_pid(int(port))
    started = time.perf_counter()
    stream = generate(args.events, args.pages, args.flush_events, args.seed)
    print(f"{args.events:,} page views, {len(stream.flushes):,} flushes of 12 mutators every "
          f"{args.flush_events:,} events, generated in {time.perf_counter() - started:.0f} s; schema 3's floor "
          f"(distinct mutator and row key): {stream.floor_rows / args.events:.3f} rows per event", flush=True)
    layouts = layouts_for(args.slots, args.layouts)
    keyspace = f"keyrows_{uuid.uuid4().hex[:8]}"
    settings = CassandraSettings(contact_points=[host], port=int(port), keyspace=keyspace)
    cpu: dict[str, list[float]] = {layout.name: [] for layout in layouts}
    own: dict[str, list[float]] = {layout.name: [] for layout in layouts}
    written: dict[str, Written] = {}
    try:
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                                 "{'class': 'SimpleStrategy', 'replication_factor': 1}", prepared=False)
            for layout in layouts:
                await client.execute(f"CREATE TABLE {keyspace}.{layout.table} ({layout.columns}) WITH {COMPACTION}",
                                     prepared=False)
        async with CassandraClient(settings) as client:
            rng = random.Random(args.seed)
            mutators: dict[str, list[uuid.UUID]] = {}
            prefix = ""
            for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
                order = list(layouts)
                rng.shuffle(order)
                prefix = f"r{round_}/"
                for layout in order:
                    mutators[layout.name] = [uuid.uuid4() for _ in range(MUTATORS)]
                    before, own_before = cpu_s(pid), time.process_time()
                    w = await write_stream(client, layout, stream, prefix, mutators[layout.name])
                    own_spent = time.process_time() - own_before
                    await asyncio.sleep(2)
                    spent = cpu_s(pid) - before
                    written[layout.name] = w
                    print(f"round {round_}: {layout.name}: Cassandra {spent:.1f} CPU s, {w.rows:,} rows, "
                          f"{w.mutations:,} mutations, {w.requests:,} requests, {w.timeouts} retried after a timeout, "
                          f"this process {own_spent:.1f} CPU s",
                          flush=True)
                    if round_:
                        cpu[layout.name].append(spent)
                        own[layout.name].append(own_spent)
            per_m = 1_000_000 / args.events
            print(f"\n| layout | rows per event | mutations per event | statements per event | requests per event "
                  f"| bytes per event | Cassandra CPU s per million events (median; min-max of {args.rounds}) "
                  "| × rows | Cassandra CPU µs per row | per mutation | writer's CPU s per million events |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            base = statistics.median(cpu[layouts[0].name])
            for layout in layouts:
                w, c = written[layout.name], cpu[layout.name]
                med = statistics.median(c)
                print(f"| {layout.name} | {w.rows / args.events:.3f} | {w.mutations / args.events:.3f} | "
                      f"{w.statements / args.events:.3f} | {w.requests / args.events:.3f} | "
                      f"{w.bytes / args.events:.0f} | {med * per_m:.1f} ({min(c) * per_m:.1f}-{max(c) * per_m:.1f}) | "
                      f"{med / base:.2f} | {1e6 * med / w.rows:.1f} | {1e6 * med / w.mutations:.1f} | "
                      f"{statistics.median(own[layout.name]) * per_m:.1f} |")
            if args.reads:
                # the last round's data (one prefix for all), each layout read with its own mutator ids
                latencies = await measure_reads(client, layouts, stream, prefix, mutators, args.reads, args.seed)
                plain50, plain99 = latencies[PLAIN]
                print(f"\n| read ({args.reads} each) | p50 ms | p99 ms | p50 × plain row | p99 × plain row |"
                      "\n|---|---:|---:|---:|---:|")
                for name, (p50, p99) in latencies.items():
                    print(f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / plain50:.1f} | {p99 / plain99:.1f} |")
    finally:
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)



def _single_partition_batches(rows: list[Statement], written: Written) -> list[list[Statement]]:
    """One partition's statements in batches of at most SLOT_BATCH_ROWS, each a mutation and a request."""
    batches = [rows[i:i + SLOT_BATCH_ROWS] for i in range(0, len(rows), SLOT_BATCH_ROWS)]
    written.mutations += len(batches)
    written.statements += len(rows)
    written.requests += len(batches)
    return batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.key_rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", default="127.0.0.1:9042")
    parser.add_argument("--cassandra-pid", type=int, help="the Cassandra process (default: found by its port)")
    parser.add_argument("--events", type=int, default=240_000)
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--flush-events", type=int, default=1_000, help="events of a mutator between its flushes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=200, help="reads of each instance (0: none)")
    parser.add_argument("--slots", default=[16, 256], type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--layouts", default=["rows", "slot map", "slot clustered", "slot keyed", "mutator rows"],
                        type=lambda s: s.split(","))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
