"""What reading a wide instance costs: one instance with a shard from each of 1, 20, 100, 256 and 1,000
mutators (a counter whose key is not the topic's message key has a shard from every partition), for a sum, a
distinct, a quantiles and a top-k, beside a plain one-row read; and range reads of wide buckets.

    python -m bench.wide_reads [--cassandra HOST:PORT] [--rounds N] [--shards 1,20,100,256,1000]

Without ``--cassandra`` it starts a Cassandra of its own (the benchmark's ports). The shard rows are written
with ``CassandraStore.write_shards``, as the mutators' flushes would leave them, in a keyspace of its own
(dropped at the end). Each shard holds what a mutator's share of a busy instance holds: an integer sum;
2,000 values in a HyperLogLog (lg_k 12, so each sketch is in its dense mode, ~4 KiB); 2,000 values in a KLL
sketch (k 200); 2,000 events over 300 items in a frequent-items sketch (map 256). Then every read is made
``--rounds`` times, all of them interleaved round by round (the plain row first in each round), so that the
machine's noise falls on all alike: each instance through ``read_state`` (what ``get`` and ``serve`` read),
a series of 24 hourly buckets and a roll-up of 168 hourly buckets of 100 shards each through
``CounterReader``. Every value read is checked. Prints p50 and p99 in milliseconds and the ratio of each to
the plain row's; ``make bench`` puts the same rows in its report.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.cassandra import CassandraClient
from countersink.reader import CounterReader, read_state
from countersink.settings import CassandraSettings
from schemas.definitions import parse_definitions
from schemas.kinds import KindSpec, State, new_state
from schemas.timeseries import bucket_key

SHARDS = (1, 20, 100, 256, 1000)
KINDS = ("sum", "distinct", "quantiles", "top_k")
SPECS = {"sum": KindSpec("sum"), "distinct": KindSpec("distinct", lg_k=12),
         "quantiles": KindSpec("quantiles", k=200), "top_k": KindSpec("top_k", lg_max_map_size=8, top=10)}
VALUES_PER_SHARD = 2_000
TOP_K_ITEMS = 300
# Sketches are drawn from a pool (each different): a read's cost does not depend on which sketch a shard holds,
# and filling 20,000 sketches value by value would take longer than the reads.
POOL = 32
HOUR = 3600
START = 1_795_000_000 // 86400 * 86400  # a UTC midnight in November 2026
RANGE_SHARDS = 100
SERIES_HOURS = 24
ROLLUP_HOURS = 168
RANGE_COUNTERS = parse_definitions("""
[[counter]]
name = "wide_range_sum"
topics = ["bench-wide"]
kind = "sum"
key = ["page"]
value = "ms"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "wide_range_distinct"
topics = ["bench-wide"]
kind = "distinct"
key = ["page"]
value = "user"
bucket = { field = "ts", size = "1h" }
""")
PLAIN = "plain row"


def instance_label(kind: str, shards: int) -> str:
    return f"{kind}, {shards:,} shard{'s' if shards > 1 else ''}"


def range_labels() -> list[str]:
    return [f"{'sum' if c.kind == 'sum' else 'distinct'}, {what}" for what in
            (f"series of {SERIES_HOURS} buckets × {RANGE_SHARDS} shards",
             f"roll-up of {ROLLUP_HOURS} buckets × {RANGE_SHARDS} shards") for c in RANGE_COUNTERS]


def _pool(kind: str, rng: random.Random) -> list[bytes]:
    states = []
    for i in range(POOL):
        state = new_state(SPECS[kind])
        if kind == "distinct":
            for v in range(VALUES_PER_SHARD):
                state.apply(f"u{i}-{v}")
        elif kind == "quantiles":
            for _ in range(VALUES_PER_SHARD):
                state.apply(rng.lognormvariate(3.0, 1.0))
        elif kind == "top_k":
            for _ in range(VALUES_PER_SHARD):
                state.apply(f"item-{min(int(rng.paretovariate(1.2)), TOP_K_ITEMS)}")
        states.append(state.to_bytes())
    return states


def _sum_bytes(value: int) -> bytes:
    state = new_state(SPECS["sum"])
    state.apply(value)
    return state.to_bytes()


async def _bounded(calls: list[Callable[[], Awaitable[None]]], at_once: int = 8) -> None:
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()

    await asyncio.gather(*(worker() for _ in range(at_once)))


async def write_shards(client: CassandraClient, shards: tuple[int, ...], seed: int = 7) -> None:
    """Every wide instance and every range bucket, one row per mutator: what ``max(shards)`` mutators' flushes
    leave (mutator ``i`` holds a shard of every instance wider than ``i``)."""
    store = CassandraStore(client)
    rng = random.Random(seed)
    pools = {kind: _pool(kind, rng) for kind in KINDS if kind != "sum"}
    distinct = _pool("distinct", rng)
    born = 1_000_000

    def flush(i: int) -> Callable[[], Awaitable[None]]:
        writes = [ShardWrite(f"wide_{kind}", f"{kind}-{n}", _sum_bytes(i + 1) if kind == "sum"
                             else pools[kind][i % POOL], 1, False)
                  for kind in KINDS for n in shards if i < n]
        if i < RANGE_SHARDS:
            for hour in range(ROLLUP_HOURS):
                for definition in RANGE_COUNTERS:
                    key = bucket_key(definition, "home", START + hour * HOUR)
                    state = _sum_bytes(i + 1) if definition.kind == "sum" else distinct[(i + hour) % POOL]
                    writes.append(ShardWrite(definition.name, key, state, 1, False))
        return lambda: store.write_shards(uuid.uuid4(), born + i, born + 1, writes)

    await _bounded([flush(i) for i in range(max(shards))])


def _check(kind: str, shards: int, state: State | None) -> None:
    value = None if state is None else state.value()
    if kind == "sum":
        ok = value == shards * (shards + 1) // 2
    elif kind == "distinct":
        ok = value is not None and value.estimate > 0  # type: ignore[attr-defined]
    elif kind == "quantiles":
        ok = value is not None and value.count == shards * VALUES_PER_SHARD  # type: ignore[attr-defined]
    else:
        ok = value is not None and value.total_weight == shards * VALUES_PER_SHARD  # type: ignore[attr-defined]
    if not ok:
        raise RuntimeError(f"the {shards}-shard {kind} instance reads {value!r}")


async def wide_latencies(cassandra: CassandraSettings, rounds: int, shards: tuple[int, ...] = SHARDS
                         ) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of the plain row, every wide instance and every range read, ``rounds`` times,
    interleaved."""
    async with CassandraClient(cassandra) as client:
        await write_shards(client, shards)
        await client.execute("CREATE TABLE IF NOT EXISTS plain_values (k text PRIMARY KEY, v bigint)", prepared=False)
        await client.execute("INSERT INTO plain_values (k, v) VALUES ('one', 1)", prepared=False)
        reader = CounterReader(client)
        level = client.settings.read_consistency
        series, rollup = range_labels()[:2], range_labels()[2:]
        timings: dict[str, list[float]] = {PLAIN: []}
        timings.update({instance_label(kind, n): [] for kind in KINDS for n in shards})
        timings.update({name: [] for name in range_labels()})
        async def timed(name: str, read: Awaitable[object]) -> object:
            started = time.perf_counter()
            found = await read
            timings[name].append(time.perf_counter() - started)
            return found

        # One round unmeasured first: statements are prepared, connections and caches warm.
        for measured in [False] + [True] * rounds:
            if not measured:
                saved, timings = timings, {name: [] for name in timings}
            await timed(PLAIN, client.execute("SELECT v FROM plain_values WHERE k = ?", ["one"], consistency=level))
            for kind in KINDS:
                for n in shards:
                    state = await timed(instance_label(kind, n), read_state(client, f"wide_{kind}", f"{kind}-{n}"))
                    _check(kind, n, state)  # type: ignore[arg-type]
            for definition, name in zip(RANGE_COUNTERS, series, strict=True):
                points = await timed(name, reader.series(definition, "home", START, START + SERIES_HOURS * HOUR))
                counted = [p.buckets_counted for p in points]  # type: ignore[attr-defined]
                if counted != [1] * SERIES_HOURS:
                    raise RuntimeError(f"{name}: {counted}")
            for definition, name in zip(RANGE_COUNTERS, rollup, strict=True):
                point: Any = await timed(name, reader.rollup(definition, "home", START, START + ROLLUP_HOURS * HOUR))
                total = ROLLUP_HOURS * RANGE_SHARDS * (RANGE_SHARDS + 1) // 2
                if point.buckets_counted != ROLLUP_HOURS or (definition.kind == "sum" and point.value != total):
                    raise RuntimeError(f"{name}: {point.buckets_counted} buckets, {point.value!r}")
            if not measured:
                timings = saved
    return {name: (1000 * statistics.median(t), 1000 * statistics.quantiles(t, n=100)[98])
            for name, t in timings.items()}


def table(latencies: dict[str, tuple[float, float]]) -> list[str]:
    """The figures as Markdown rows: p50, p99, and each as a multiple of the plain row's."""
    plain50, plain99 = latencies[PLAIN]
    lines = ["| read | p50 ms | p99 ms | p50 × plain row | p99 × plain row |", "|---|---:|---:|---:|---:|"]
    for name, (p50, p99) in latencies.items():
        lines.append(f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / plain50:.1f} | {p99 / plain99:.1f} |")
    return lines


def targets(latencies: dict[str, tuple[float, float]]) -> list[str]:
    """Each 256-shard instance against its targets: ≤ 2× the plain row at p50, ≤ 3× at p99."""
    plain50, plain99 = latencies[PLAIN]
    lines = []
    for kind in KINDS:
        figures = latencies.get(instance_label(kind, 256))
        if figures is not None:
            ok = figures[0] <= 2 * plain50 and figures[1] <= 3 * plain99
            lines.append(f"{kind}, 256 shards: {figures[0] / plain50:.1f}× at p50 (≤ 2), "
                         f"{figures[1] / plain99:.1f}× at p99 (≤ 3): {'met' if ok else 'missed'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wide_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="a running Cassandra (default: start one)")
    parser.add_argument("--rounds", type=int, default=150, help="reads of each instance (default 150)")
    parser.add_argument("--shards", default=",".join(map(str, SHARDS)),
                        help="shard counts of the instances, comma-separated (default %(default)s)")
    args = parser.parse_args(argv)
    shards = tuple(sorted({int(n) for n in args.shards.split(",")} | {RANGE_SHARDS}))
    keyspace = f"bench_wide_{uuid.uuid4().hex[:8]}"

    async def run(host: str, port: int) -> dict[str, tuple[float, float]]:
        settings = CassandraSettings(contact_points=[host], port=port, keyspace=keyspace)
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.ensure_schema()
        try:
            return await wide_latencies(settings, args.rounds, shards)
        finally:
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)

    if args.cassandra:
        host, _, port = args.cassandra.rpartition(":")
        latencies = asyncio.run(run(host, int(port)))
    else:
        from bench.pipeline import ROOT, bench_servers

        with bench_servers(ROOT / ".stack" / "bench-wide", kafka_port=29092, native_port=29042, storage_port=27000,
                           jmx_port=27199, cluster_name="countersink-bench-wide"):
            latencies = asyncio.run(run("127.0.0.1", 29042))
    print("\n".join(table(latencies)))
    print("\n".join(targets(latencies)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
