"""Cassandra's CPU for the same flushes written in each candidate shard layout, measured side by side.

    python -m bench.layouts [--keys N] [--rounds N]

Every layout receives the same flushes of ``make bench``'s three counters (count, sum, distinct) over one key
each: a first flush of every key (so every instance is new to the GC's work list), then a second of 46% of the
keys, which is how many rows per instance ``make bench``'s consumer writes. Rows carry states of the sizes
that stream produces. Layouts are interleaved round after round, each in a table of its own, so they see the
same state of the machine. It prints Cassandra's and this process's CPU seconds per 100,000 keys flushed, and
each layout's ratio to today's. It starts its own Cassandra on the benchmark's port (29042).

Layouts (the work list is one row per new instance, in single-partition batches of 100, unless it says
"per flush": one row per flush and per 64 KiB, holding the new instances):

- ``instance rows``: one partition per (counter, key), a row per mutator, 10 rows per batch (schema 1).
- ``instance rows, 30 per batch``: the same, 30 rows (and partitions) per batch.
- ``key rows, a row per counter``: one partition per key, a row per (counter, mutator), 10 keys per batch.
- ``one row per key, a cell per counter``: one partition per key, one row per mutator, each counter's state
  one cell of a map, 10 keys per batch (schema 2).
- ``one row per key, one blob``: the same, with every counter's state in one blob.
- ``... clustered by birth``: schema 3, rows at (the mutator's birth time, the mutator), so that the GC can
  delete by ranges of births.

``--only NAME`` (repeatable) measures only the layouts whose name contains NAME.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

from bench import pipeline as bp
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings

COUNTERS = ("trades", "shares", "buyers")
STATE_BYTES = {"trades": 3, "shares": 6, "buyers": 43}  # 7 events of make bench's stream, as stored
BATCH_ROWS = 10  # the consumer's default write_batch_rows
WORK_CHUNK_BYTES = 64 * 1024
WORKERS = 128  # half the client's default in-flight slots, as the consumer's flush uses
COMPACTION = "compaction = {'class': 'UnifiedCompactionStrategy', 'scaling_parameters': 'L4'}"

TABLES = {
    "instance_shards": "counter text, key text, mutator uuid, tally blob STATIC, state blob, through_offset bigint, "
                       "PRIMARY KEY ((counter, key), mutator)",
    "instance_work": "mutator uuid, counter text, key text, PRIMARY KEY ((mutator), counter, key)",
    "flush_work": "mutator uuid, seq bigint, chunk int, instances blob, PRIMARY KEY ((mutator), seq, chunk)",
    "key_shards": "key text, counter text, mutator uuid, state blob, through_offset bigint, "
                  "PRIMARY KEY ((key), counter, mutator)",
    "key_rows": "key text, mutator uuid, states blob, through_offset bigint, PRIMARY KEY ((key), mutator)",
    "key_cells": "key text, mutator uuid, tallies map<text, blob> STATIC, states map<text, blob>, "
                 "PRIMARY KEY ((key), mutator)",
    "key_cells_born": "key text, born_us bigint, mutator uuid, tallies map<text, blob> STATIC, "
                      "states map<text, blob>, PRIMARY KEY ((key), born_us, mutator)",
}

Flush = list[str]  # the keys one flush writes (each for all three counters)


async def run_bounded(calls: Sequence[Callable[[], Awaitable[object]]]) -> None:
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()

    await asyncio.gather(*(worker() for _ in range(min(len(calls), WORKERS))))


def batches(client: CassandraClient, statements: list[tuple[str, list[object]]], rows: int = BATCH_ROWS
            ) -> list[Callable[[], Awaitable[object]]]:
    return [functools.partial(client.execute_batch, statements[i:i + rows])
            for i in range(0, len(statements), rows)]


def work_per_flush(client: CassandraClient, mutator: uuid.UUID, seq: int, new: list[tuple[str, str]]
                   ) -> list[Callable[[], Awaitable[object]]]:
    calls, chunk, size, number = [], [], 0, 0
    for counter, key in new:
        chunk.append(f"{counter}\x00{key}")
        size += len(counter) + len(key) + 2
        if size >= WORK_CHUNK_BYTES:
            calls.append(functools.partial(
                client.execute, "INSERT INTO flush_work (mutator, seq, chunk, instances) VALUES (?, ?, ?, ?)",
                [mutator, seq, number, "\n".join(chunk).encode()]))
            chunk, size, number = [], 0, number + 1
    if chunk:
        calls.append(functools.partial(
            client.execute, "INSERT INTO flush_work (mutator, seq, chunk, instances) VALUES (?, ?, ?, ?)",
            [mutator, seq, number, "\n".join(chunk).encode()]))
    return calls


def work_list(client: CassandraClient, mutator: uuid.UUID, seq: int, new: list[tuple[str, str]], *,
              per_flush: bool) -> list[Callable[[], Awaitable[object]]]:
    if per_flush:
        return work_per_flush(client, mutator, seq, new)
    work = "INSERT INTO instance_work (mutator, counter, key) VALUES (?, ?, ?)"
    rows = [(work, [mutator, counter, key]) for counter, key in new]
    return [functools.partial(client.execute_batch, rows[i:i + 100]) for i in range(0, len(rows), 100)]


def state(counter: str, rng: random.Random) -> bytes:
    return rng.randbytes(STATE_BYTES[counter])


async def instance_rows(client: CassandraClient, mutator: uuid.UUID, seq: int, keys: Flush, new: bool,
                        rng: random.Random, *, work_list_per_flush: bool, rows: int = BATCH_ROWS) -> None:
    cql = "INSERT INTO instance_shards (counter, key, mutator, state, through_offset) VALUES (?, ?, ?, ?, ?)"
    # the consumer groups rows in the order its dirty set gives them: instances of one counter, then the next
    statements = [(cql, [counter, key, mutator, state(counter, rng), seq]) for counter in COUNTERS for key in keys]
    calls = batches(client, statements, rows)
    if new:
        calls += work_list(client, mutator, seq, [(counter, key) for counter in COUNTERS for key in keys],
                           per_flush=work_list_per_flush)
    await run_bounded(calls)


async def key_shards(client: CassandraClient, mutator: uuid.UUID, seq: int, keys: Flush, new: bool,
                     rng: random.Random, keys_per_batch: int = BATCH_ROWS // 3) -> None:
    cql = "INSERT INTO key_shards (key, counter, mutator, state, through_offset) VALUES (?, ?, ?, ?, ?)"
    # a key's three rows next to each other, so a batch holds whole partitions where it can
    statements = [(cql, [key, counter, mutator, state(counter, rng), seq]) for key in keys for counter in COUNTERS]
    calls = batches(client, statements, 3 * keys_per_batch)
    if new:
        calls += work_per_flush(client, mutator, seq, [(counter, key) for key in keys for counter in COUNTERS])
    await run_bounded(calls)


async def key_rows(client: CassandraClient, mutator: uuid.UUID, seq: int, keys: Flush, new: bool,
                   rng: random.Random) -> None:
    cql = "INSERT INTO key_rows (key, mutator, states, through_offset) VALUES (?, ?, ?, ?)"
    statements = [(cql, [key, mutator, b"".join(state(counter, rng) for counter in COUNTERS), seq]) for key in keys]
    calls = batches(client, statements)
    if new:
        calls += work_per_flush(client, mutator, seq, [("*", key) for key in keys])
    await run_bounded(calls)


async def key_cells(client: CassandraClient, mutator: uuid.UUID, seq: int, keys: Flush, new: bool,
                    rng: random.Random, *, work_list_per_flush: bool, by_birth: bool = False) -> None:
    if by_birth:
        cql = "UPDATE key_cells_born USING TIMESTAMP ? SET states = states + ? WHERE key = ? AND born_us = ? " \
              "AND mutator = ?"
        where: list[object] = [1_795_000_000_000_000, mutator]
    else:
        cql = "UPDATE key_cells USING TIMESTAMP ? SET states = states + ? WHERE key = ? AND mutator = ?"
        where = [mutator]
    statements = [(cql, [seq, {counter: seq.to_bytes(8, "big") + state(counter, rng) for counter in COUNTERS},
                         key, *where]) for key in keys]
    calls = batches(client, statements)
    if new:
        calls += work_list(client, mutator, seq, [(counter, key) for key in keys for counter in COUNTERS],
                           per_flush=work_list_per_flush)
    await run_bounded(calls)


LAYOUTS: dict[str, Callable[..., Awaitable[None]]] = {
    "instance rows": functools.partial(instance_rows, work_list_per_flush=False),
    "instance rows, 30 per batch": functools.partial(instance_rows, work_list_per_flush=False, rows=30),
    "key rows, a row per counter": functools.partial(key_shards, keys_per_batch=10),
    "one row per key, a cell per counter": functools.partial(key_cells, work_list_per_flush=False),
    "one row per key, a cell per counter, work list per flush": functools.partial(key_cells,
                                                                                  work_list_per_flush=True),
    "one row per key, one blob, work list per flush": key_rows,
    "one row per key, a cell per counter, work list per flush, clustered by birth": functools.partial(
        key_cells, work_list_per_flush=True, by_birth=True),
}


def flushes(keys: int, rng: random.Random) -> list[tuple[Flush, bool]]:
    everything = [f"S{i:06d}" for i in range(keys)]
    again = rng.sample(everything, int(keys * 0.46))
    return [(everything, True), (again, False)]


async def run(keys: int, rounds: int, only: Sequence[str] = ()) -> None:
    layouts = {name: write for name, write in LAYOUTS.items() if not only or any(part in name for part in only)}
    bp.STACK.mkdir(parents=True, exist_ok=True)
    with bp.bench_servers(bp.STACK, kafka_port=29092, native_port=29042, storage_port=27000, jmx_port=27199,
                          cluster_name="countersink-bench") as (_, cassandra_node):
        assert cassandra_node.process is not None
        settings = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace="layouts",
                                     replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS layouts", prepared=False)
            await client.execute(f"CREATE KEYSPACE layouts WITH replication = {settings.replication}", prepared=False)
            for table, columns in TABLES.items():
                await client.execute(f"CREATE TABLE layouts.{table} ({columns}) WITH {COMPACTION}", prepared=False)
        totals: dict[str, list[float]] = {name: [0.0, 0.0] for name in layouts}
        async with CassandraClient(settings) as client:
            for round_ in range(rounds + 1):  # round 0 warms the JVM and the prepared statements up
                for name, write in layouts.items():
                    rng = random.Random(round_)
                    mutator = uuid.uuid4()
                    server_before, client_before = bp.proc_cpu_s(cassandra_node.process.pid), time.process_time()
                    for seq, (flush, new) in enumerate(flushes(keys, rng), start=1):
                        await write(client, mutator, seq, flush, new, rng)
                    await asyncio.sleep(2)  # let the memtable flushes and compactions it caused be counted
                    server = bp.proc_cpu_s(cassandra_node.process.pid) - server_before
                    own = time.process_time() - client_before
                    if round_:
                        totals[name][0] += server
                        totals[name][1] += own
                    print(f"round {round_}: {name}: Cassandra {server:.1f} CPU s, client {own:.1f} CPU s", flush=True)
        baseline = next(iter(totals.values()))[0]
        print(f"\nCPU s per 100,000 keys flushed ({keys:,} keys, 3 counters, {rounds} rounds):")
        for name, (server, own) in totals.items():
            per = 100_000 / keys / rounds
            print(f"  {name:58} Cassandra {server * per:6.2f}  client {own * per:6.2f}  "
                  f"Cassandra ratio {server / baseline:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.layouts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="measure only the layouts whose name contains NAME (repeatable); ratios are to the "
                             "first measured")
    args = parser.parse_args(argv)
    asyncio.run(run(args.keys, args.rounds, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
