"""Tombstones a read of one instance scans, and its latency, as mutators rotate and the GC folds them.

    python -m bench.tombstones [--cassandra HOST:PORT] [--rotations N] [--partitions P] [--counters C]

Two keys are written: a hot key (``IBM``) and the keyless instance (partition ``\\``, shared by every keyless
counter of every topic). Each rotation gives each of the P partitions a fresh mutator, as a consumer's
rotation does: the previous one is retired, the new one registered and its first flush written (C sum
counters on both keys, through the store the consumer uses). Births are spread over the rotation period,
one partition after another, so the GC always finds P mutators alive, as in production. The GC
(``gc_worker.collector.Collector`` on Cassandra, grace 0) runs every ``--gc-every`` rotations.

After each GC at a report point, each key is read once with Cassandra's query tracing on: the replica's "Read
N live rows and M tombstone cells" gives the tombstones that read scanned. Then ``--reads`` untraced reads of
one counter through ``CounterReader`` give the latency (median, milliseconds), and the value is checked
against what was written. At the end, ``system_views.tombstones_per_read`` gives the most tombstones any read
of the shards table scanned during the run (the GC's reads included; its buckets round up by up to 20 %).

Tombstones live for the table's ``gc_grace_seconds`` (10 days by default), far longer than the run: after N
rotations a key carries what the last N rotations left, as it does in production after N hourly rotations up
to 240. Cassandra warns at 1,000 tombstones per read and fails the read at 100,000.

Times are virtual (``--period`` apart, starting now): nothing waits. Kafka is not used. The keyspace is
dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import statistics
import sys
import time
import uuid

from consumer.cassandra_store import CassandraStore
from consumer.storage import MutatorEntry, ShardWrite
from countersink.cassandra import CassandraClient, as_dicts
from countersink.logs import configure_logging, quiet_driver_noise
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings, Consistency
from gc_worker.collector import Collector
from gc_worker.store import CassandraGcStore
from schemas.cql import shard_slice, stamp_source
from schemas.kinds import new_state
from schemas.kinds.base import KindSpec

KEYS = {"hot key": "IBM", "keyless": ""}
_READ = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")


@dataclasses.dataclass
class Point:
    """What one report point measured for one key."""

    rotation: int
    key: str
    tag: str
    read_ms: float
    gc_s: float
    live_rows: int | None = None
    tombstones: int | None = None


class Bench:
    """One run in a keyspace of its own."""

    def __init__(self, client: CassandraClient, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.store = CassandraStore(client)
        self.reader = CounterReader(client)
        self.counters = [f"c{i}" for i in range(args.counters)]
        self.live: dict[int, MutatorEntry] = {}
        self.start_us = time.time_ns() // 1000
        self.period_us = int(args.period * 1e6)
        self.written = 0  # events per counter and key, summed over every flush

    def born_us(self, rotation: int, partition: int) -> int:
        return int(self.start_us + rotation * self.period_us + partition * self.period_us // self.args.partitions)

    async def rotate(self, rotation: int) -> None:
        """Every partition retires its mutator and flushes once with a fresh one."""
        async def one(partition: int) -> None:
            born = self.born_us(rotation, partition)
            previous = self.live.get(partition)
            if previous is not None:
                await self.store.retire_mutator(previous.id, born - 1)
            entry = MutatorEntry(uuid.uuid4(), "bench-tombstones", "bench-tombstones", partition, "bench", born,
                                 born + 2 * self.period_us)
            await self.store.register_mutator(entry)
            state = new_state(KindSpec("sum", "integer"))
            state.apply(1)
            writes = [ShardWrite(counter, key, state.to_bytes(), rotation, True)
                      for counter in self.counters for key in KEYS.values()]
            await self.store.write_shards(entry.id, entry.born_us, entry.born_us + 1, writes,
                                          source=stamp_source(entry.consumer_group, entry.topic, entry.partition))
            self.live[partition] = entry

        await asyncio.gather(*(one(p) for p in range(self.args.partitions)))
        self.written += self.args.partitions

    async def gc(self, rotation: int) -> float:
        started = time.perf_counter()
        # Its runs simulate time (a rotation an hour, in a keyspace of its own): ahead of Cassandra's clock.
        collector = Collector(CassandraGcStore(self.client, clock_checked=False), 0, concurrency=16)
        report = await collector.run(self.born_us(rotation + 1, 0) - 1)
        if report.instances_deferred:
            raise RuntimeError(f"the GC deferred instances: {report.deferred}")
        return time.perf_counter() - started

    async def measure(self, rotation: int, gc_s: float) -> list[Point]:
        points = []
        for name, key in KEYS.items():
            tag = uuid.uuid4().hex
            # Unprepared, so that the traced session records this text and its tag.
            await self.client.execute(
                f"SELECT * FROM shards WHERE part = ? AND key = ? /* {tag} */", list(shard_slice(key)),  # noqa: S608
                consistency=Consistency.ONE, prepared=False, tracing=True)
            timings = []
            for _ in range(self.args.reads):
                began = time.perf_counter()
                value = await self.reader.get(self.counters[0], key)
                timings.append(time.perf_counter() - began)
            if value != self.written:
                raise RuntimeError(f"{name} reads {value} after rotation {rotation}, {self.written} written")
            points.append(Point(rotation, name, tag, 1000 * statistics.median(timings), gc_s))
        return points

    async def resolve(self, points: list[Point]) -> None:
        """Each traced read's live rows and tombstones, from ``system_traces`` (written asynchronously)."""
        waiting = {p.tag: p for p in points if p.tombstones is None}
        for _ in range(50):
            if not waiting:
                return
            page: bytes | None = None
            while True:
                result = await self.client.execute(
                    "SELECT session_id, parameters FROM system_traces.sessions", consistency=Consistency.ONE,
                    page_size=5000, page_state=page, prepared=False)
                for row in as_dicts(result):
                    query = (row["parameters"] or {}).get("query", "")
                    tag = next((t for t in waiting if t in query), None)
                    if tag is None:
                        continue
                    events = as_dicts(await self.client.execute(
                        "SELECT activity FROM system_traces.events WHERE session_id = ?", [row["session_id"]],
                        consistency=Consistency.ONE))
                    found = [_READ.search(e["activity"] or "") for e in events]
                    counts = [(int(m.group(1)), int(m.group(2))) for m in found if m]
                    if counts:
                        point = waiting.pop(tag)
                        point.live_rows = max(c[0] for c in counts)
                        point.tombstones = max(c[1] for c in counts)
                if not result.has_more_pages():
                    break
                page = result.page_state()
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no trace found for {len(waiting)} reads")

    async def table_max(self) -> float | None:
        rows = as_dicts(await self.client.execute(
            "SELECT max FROM system_views.tombstones_per_read WHERE keyspace_name = ? AND table_name = 'shards'",
            [self.client.settings.keyspace], consistency=Consistency.ONE, prepared=False))
        return float(rows[0]["max"]) if rows else None


def report_points(rotations: int, every: int) -> set[int]:
    return {r for r in range(1, rotations + 1) if r % every == 0 or r in (1, rotations)}


async def run(args: argparse.Namespace) -> int:
    host, _, port = args.cassandra.rpartition(":")
    keyspace = f"bench_tombstones_{uuid.uuid4().hex[:8]}"
    settings = CassandraSettings(contact_points=[host], port=int(port), keyspace=keyspace)
    async with CassandraClient(settings, use_keyspace=False) as client:
        await client.ensure_schema()
    print(f"keyspace {keyspace}: {args.partitions} partitions, {args.counters} counters, {args.rotations} rotations, "
          f"GC every {args.gc_every}", flush=True)
    print("| rotation | key | live rows | tombstones per read | read ms (p50) | GC s |")
    print("|---:|---|---:|---:|---:|---:|", flush=True)
    try:
        async with CassandraClient(settings) as client:
            bench = Bench(client, args)
            wanted = report_points(args.rotations, args.report_every)
            gc_s = 0.0
            for rotation in range(1, args.rotations + 1):
                await bench.rotate(rotation)
                if rotation % args.gc_every == 0 or rotation in wanted:
                    gc_s = await bench.gc(rotation)
                if rotation in wanted:
                    points = await bench.measure(rotation, gc_s)
                    await bench.resolve(points)
                    for p in points:
                        print(f"| {p.rotation} | {p.key} | {p.live_rows} | {p.tombstones} | {p.read_ms:.2f} | "
                              f"{p.gc_s:.2f} |", flush=True)
            most = await bench.table_max()
            print(f"most tombstones scanned by any read of the shards table (system_views.tombstones_per_read): "
                  f"{most if most is None else int(most)}")
    finally:
        if not args.keep:
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tombstones", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cassandra", metavar="HOST:PORT", default="127.0.0.1:9042",
                        help="Cassandra to use (default: `python -m stack up`'s, 127.0.0.1:9042)")
    parser.add_argument("--rotations", type=int, default=1000, help="rotations of every partition (default 1000)")
    parser.add_argument("--partitions", type=int, default=12, help="partitions writing both keys (default 12)")
    parser.add_argument("--counters", type=int, default=3, help="counters on each key (default 3)")
    parser.add_argument("--gc-every", type=int, default=1, help="run the GC after every N rotations (default 1)")
    parser.add_argument("--report-every", type=int, default=100, help="measure every N rotations (default 100)")
    parser.add_argument("--period", type=float, default=3600.0,
                        help="virtual seconds between two rotations of a partition (default 3600)")
    parser.add_argument("--reads", type=int, default=20, help="timed reads per key and report point (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the keyspace")
    args = parser.parse_args(argv)
    if min(args.rotations, args.partitions, args.counters, args.gc_every, args.report_every, args.reads) < 1:
        parser.error("counts must be at least 1")
    configure_logging("WARNING", "console")
    quiet_driver_noise()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
