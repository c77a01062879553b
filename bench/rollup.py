"""What a roll-up of a bucketed counter costs to read: 24 and 168 hourly buckets, each with a shard from each
of 12 partitions, for a ``sum`` and a ``distinct`` (HyperLogLog lg_k 12, 2,000 values per shard).

    python -m bench.rollup [--cassandra HOST:PORT] [--rounds N]

Without ``--cassandra`` it starts a Cassandra of its own (the benchmark's ports). The shard rows are written
directly, as 12 consumers' flushes would leave them, in a keyspace of their own; then each roll-up is read
``--rounds`` times, the four interleaved so that the machine's noise falls on all of them alike, through
``CounterReader.rollup`` (every bucket read at once, ``range_concurrency`` at a time). Prints p50 and p99 in
milliseconds; ``make bench`` puts the same rows in its report.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from countersink.cassandra import CassandraClient
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings
from schemas.cql import stamp_source
from schemas.definitions import parse_definitions
from schemas.timeseries import bucket_key

HOUR = 3600
SHARDS = 12
START = 1_795_000_000 // 86400 * 86400  # a UTC midnight in November 2026
COUNTERS = parse_definitions("""
[[counter]]
name = "rollup_sum"
topics = ["bench-rollup"]
kind = "sum"
key = ["symbol"]
value = "qty"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "rollup_distinct"
topics = ["bench-rollup"]
kind = "distinct"
key = ["symbol"]
value = "user"
bucket = { field = "ts", size = "1h" }
""")
CASES = [(name, hours) for name in ("rollup_sum", "rollup_distinct") for hours in (24, 168)]


def label(counter: str, hours: int) -> str:
    return f"{'sum' if counter == 'rollup_sum' else 'distinct'}, {hours} hourly buckets × {SHARDS} shards"


async def write_buckets(client: CassandraClient, hours: int) -> None:
    """Every bucket of both counters, with one shard per partition: what 12 consumers' flushes leave."""
    from consumer.cassandra_store import CassandraStore
    from consumer.storage import MutatorEntry, ShardWrite
    from schemas.kinds import new_state

    store = CassandraStore(client)
    for partition in range(SHARDS):
        entry = MutatorEntry(uuid.uuid4(), "bench-rollup", "bench-rollup", partition, "bench", 1_000_000, 9_000_000)
        await store.register_mutator(entry)
        writes = []
        for hour in range(hours):
            for definition in COUNTERS:
                state = new_state(definition)
                for i in range(2_000 if definition.kind == "distinct" else 20):
                    state.apply(f"u{partition}-{hour}-{i}" if definition.kind == "distinct" else i)
                writes.append(ShardWrite(definition.name, bucket_key(definition, "IBM", START + hour * HOUR),
                                         state.to_bytes(), 1, True))
        await store.write_shards(entry.id, entry.born_us, entry.born_us + 1, writes,
                                 source=stamp_source(entry.consumer_group, entry.topic, entry.partition))


async def rollup_latencies(cassandra: CassandraSettings, rounds: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each roll-up, read ``rounds`` times, interleaved."""
    async with CassandraClient(cassandra) as client:
        await write_buckets(client, max(hours for _, hours in CASES))
        reader = CounterReader(client)
        timings: dict[str, list[float]] = {label(*case): [] for case in CASES}
        for _ in range(rounds):
            for counter, hours in CASES:
                started = time.perf_counter()
                point = await reader.rollup(COUNTERS[counter], "IBM", START, START + hours * HOUR)
                timings[label(counter, hours)].append(time.perf_counter() - started)
                if point.buckets_counted != hours:
                    raise RuntimeError(f"{counter} rolled up {point.buckets_counted} buckets, not {hours}")
    return {name: (1000 * statistics.median(t), 1000 * statistics.quantiles(t, n=100)[98])
            for name, t in timings.items()}


def print_table(latencies: dict[str, tuple[float, float]]) -> None:
    print("| roll-up | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for name, (p50, p99) in latencies.items():
        print(f"| {name} | {p50:.1f} | {p99:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="a running Cassandra (default: start one)")
    parser.add_argument("--rounds", type=int, default=50, help="reads of each roll-up (default 50)")
    args = parser.parse_args(argv)
    keyspace = f"bench_rollup_{uuid.uuid4().hex[:8]}"

    async def run(host: str, port: int) -> dict[str, tuple[float, float]]:
        settings = CassandraSettings(contact_points=[host], port=port, keyspace=keyspace)
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.ensure_schema()
        try:
            return await rollup_latencies(settings, args.rounds)
        finally:
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)

    if args.cassandra:
        host, _, port = args.cassandra.rpartition(":")
        print_table(asyncio.run(run(host, int(port))))
        return 0
    from bench.pipeline import ROOT, bench_servers

    with bench_servers(ROOT / ".stack" / "bench-rollup", kafka_port=29092, native_port=29042, storage_port=27000,
                       jmx_port=27199, cluster_name="countersink-bench-rollup"):
        print_table(asyncio.run(run("127.0.0.1", 29042)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
