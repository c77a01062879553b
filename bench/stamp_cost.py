"""What the partitions' stamps cost a flush: Cassandra's CPU for the same flushes with and without them.

    python -m bench.stamp_cost [--cassandra HOST:PORT] [--keys N] [--counters N] [--rounds N]

Each round writes, through ``CassandraStore.write_shards`` (the consumer's flush), one flush of ``--keys`` keys
with ``--counters`` counters each (states of 40 bytes, as sums and counts are) into two keyspaces of their own:
one as this version writes it (each row of states with its partition's stamp, ``schemas.cql``), one with the
stamps' statements left out of the same batches (what a flush wrote before them). The two alternate, in an
order shuffled each round, so that the machine's noise falls on both alike. Cassandra's CPU is read from
``/proc`` around each flush (Cassandra must run on this machine, found by its port). Prints CPU seconds per
100,000 rows for each, their ratio, and the client's CPU time per flush (this process: the consumer's share).

A third keyspace holds a shape not taken, measured beside them: the stamps as a static map of the partition
(``STATIC_STAMPS``, added to that keyspace's ``shards`` alone), set by the same statement as the row's states,
so that a flushed row is one statement instead of two. It writes its rows without a TTL on the stamps (one
statement has one TTL, and the states of a counter without retention must not expire), which is one of the
reasons it is not the schema (docs/benchmarks.md, "The stamps row").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

from bench.wide_layouts import cassandra_pid, cpu_s
from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings


class UnstampedStore(CassandraStore):
    """The consumer's flush with the stamps' statements taken out of its batches (the flush before them)."""

    def _shard_call(self, group: list[tuple[str, list[object]]], timestamp_us: int
                    ) -> Callable[[], Awaitable[object]]:
        return super()._shard_call([statement for statement in group if "SET stamps" not in statement[0]],
                                   timestamp_us)


STATIC_STAMPS = "static_stamps"
STATIC_STAMPED_CQL = "UPDATE shards SET states = states + ?, static_stamps[?] = ? "  # then the row's WHERE


class StaticStampsStore(CassandraStore):
    """The consumer's flush with each row's stamp set by the row's own statement, in a static map (a prototype:
    rows without retention only)."""

    def _shard_call(self, group: list[tuple[str, list[object]]], timestamp_us: int
                    ) -> Callable[[], Awaitable[object]]:
        merged = []
        for (states_cql, states), (stamp_cql, stamp) in zip(group[::2], group[1::2], strict=True):
            if "SET stamps" not in stamp_cql or "TTL" in states_cql:
                raise ValueError("the static-stamps prototype writes rows without retention only")
            cells, *place, born_us, mutator = states  # the partition, and the key of a bucket (schemas.cql)
            source, stamp = stamp[0], stamp[1]
            merged.append((STATIC_STAMPED_CQL + states_cql[states_cql.index("WHERE"):],
                           [cells, source, stamp, *place, born_us, mutator]))
        return super()._shard_call(merged, timestamp_us)


STORES: dict[str, type[CassandraStore]] = {"with stamps": CassandraStore, "without stamps": UnstampedStore,
                                           "static stamps (not taken)": StaticStampsStore}


def settings_for(host: str, port: int, keyspace: str) -> CassandraSettings:
    return CassandraSettings(contact_points=[host], port=port, keyspace=keyspace,
                             replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")


def flush_writes(keys: int, counters: int, seq: int) -> list[ShardWrite]:
    return [ShardWrite(f"c{c}", f"key-{k}", seq.to_bytes(8, "big") * 5, seq, seq == 1)
            for k in range(keys) for c in range(counters)]


async def run(host: str, port: int, keys: int, counters: int, rounds: int, seed: int) -> dict[str, list[float]]:
    pid = cassandra_pid(port)
    names = {name: f"stampcost_{uuid.uuid4().hex[:8]}" for name in STORES}
    clients: dict[str, CassandraClient] = {}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name, keyspace in names.items():
            async with CassandraClient(settings_for(host, port, keyspace), use_keyspace=False) as admin:
                await admin.ensure_schema()
                if STORES[name] is StaticStampsStore:
                    await admin.execute(f"ALTER TABLE {keyspace}.shards ADD {STATIC_STAMPS} map<blob, bigint> STATIC",
                                        prepared=False)
            clients[name] = CassandraClient(settings_for(host, port, keyspace))
            await clients[name].__aenter__()
        stores = {name: store(clients[name]) for name, store in STORES.items()}
        mutator, rng = uuid.uuid4(), random.Random(seed)
        for seq in range(1, rounds + 2):
            order = list(stores)
            rng.shuffle(order)
            for name in order:
                writes = flush_writes(keys, counters, seq)
                before, started = cpu_s(pid), time.process_time()
                await stores[name].write_shards(mutator, 1_000, 1_000 + seq, writes, source=b"stampsrc")
                took, used = time.process_time() - started, cpu_s(pid) - before
                if seq > 1:  # the first round warms both up, unmeasured
                    cpu[name].append(used)
                    wall[name].append(took)
        return {f"{name} cpu": values for name, values in cpu.items()} | {
            f"{name} wall": values for name, values in wall.items()}
    finally:
        for client in clients.values():
            await client.__aexit__(None, None, None)
        for keyspace in names.values():
            async with CassandraClient(settings_for(host, port, keyspace), use_keyspace=False) as admin:
                await admin.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)


def report(figures: dict[str, list[float]], keys: int) -> str:
    per_row = {name: statistics.median(figures[f"{name} cpu"]) / keys * 100_000 for name in STORES}
    lines = ["| flush | Cassandra CPU s per 100,000 rows (median of rounds) | client CPU ms per flush (median) |",
             "|---|---:|---:|"]
    for name, value in per_row.items():
        lines.append(f"| {name} | {value:.2f} | {statistics.median(figures[f'{name} wall']) * 1000:.1f} |")
    client = {name: statistics.median(figures[f"{name} wall"]) for name in per_row}
    lines.append(f"\nwith ÷ without: {per_row['with stamps'] / per_row['without stamps']:.2f}× Cassandra CPU per row, "
                 f"{client['with stamps'] / client['without stamps']:.2f}× the client's CPU per flush")
    static = "static stamps (not taken)"
    lines.append(f"static stamps ÷ with stamps: {per_row[static] / per_row['with stamps']:.2f}× Cassandra CPU per row, "
                 f"{client[static] / client['with stamps']:.2f}× the client's CPU per flush")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stamp_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", default="127.0.0.1:9042", help="HOST:PORT of a Cassandra on this machine")
    parser.add_argument("--keys", type=int, default=20_000, help="keys per flush")
    parser.add_argument("--counters", type=int, default=3, help="counters per key (cells per row)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    host, port = args.cassandra.rsplit(":", 1)
    figures = asyncio.run(run(host, int(port), args.keys, args.counters, args.rounds, args.seed))
    print(report(figures, args.keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
