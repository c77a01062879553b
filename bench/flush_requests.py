"""What a flush's requests cost, beside its rows: the client's CPU (its event loop's thread and the Cassandra
driver's threads apart) and Cassandra's, for the same flushes sent in batches of different sizes.

    python -m bench.flush_requests [--cassandra HOST:PORT] [--keys N] [--rounds N] [--batch-rows 1,10,30]

Each round writes, through ``CassandraStore.write_shards`` (the consumer's flush: each key's row of states and
its partition's stamp, several keys to an unlogged batch), one flush of ``--keys`` keys with the page views'
state sizes (a count, a decimal sum and a distinct of a few values: 12, 20 and 40 bytes), once per
``cassandra.write_batch_rows`` value, each into a keyspace of its own, in an order shuffled each round (one
unmeasured round first). The client's CPU is read per thread from ``/proc/self/task`` around each flush (the
thread running the event loop, where rows are encoded and statements bound, and the driver's I/O threads);
Cassandra's from ``/proc`` (it must run on this machine, found by its port). The collector is set as the
consumer sets it. Prints, per batch size, the medians per row and per request.

The default of ``write_batch_rows`` is 10: above 10 partitions an unlogged batch makes Cassandra log a warning
(once a minute) and send one with every answer, and on a cluster a larger batch's coordinator forwards more of
it (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.stamp_cost import settings_for as stamp_cost_settings
from bench.wide_layouts import cassandra_pid, cpu_s, stat_cpu_s
from consumer.cassandra_store import CassandraStore
from consumer.cli import GC_THRESHOLDS
from consumer.storage import ShardWrite
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings

K = TypeVar("K")
# The page views' states of one key: a count, an exact decimal sum, a distinct of a few values (bytes).
STATE_BYTES = {"views": 12, "revenue": 20, "visitors": 40}


def thread_cpu_s() -> tuple[float, float]:
    """CPU seconds of this process's main thread (the event loop's) and of its other threads (the driver's)."""
    main = other = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            used = stat_cpu_s(Path(f"/proc/self/task/{tid}/stat"))
        except OSError:
            continue  # a thread that ended
        if int(tid) == os.getpid():
            main += used
        else:
            other += used
    return main, other


def flush_writes(keys: int, seq: int, bucketed: bool = True) -> list[ShardWrite]:
    """A flush of ``keys`` page-view keys, each of one hour's bucket (``bucketed``) or of none."""
    suffix = "|2025-11-26T07:00Z" if bucketed else ""
    return [ShardWrite(counter, f"/p/{k}{suffix}", seq.to_bytes(4, "big") * (size // 4), seq, seq == 1)
            for k in range(keys) for counter, size in STATE_BYTES.items()]


def settings_for(host: str, port: int, keyspace: str, batch_rows: int) -> CassandraSettings:
    return stamp_cost_settings(host, port, keyspace).model_copy(update={"write_batch_rows": batch_rows})


class _CountingStore(CassandraStore):
    """The consumer's flush, counting the requests each flush sends."""

    requests = 0

    def __init__(self, client: CassandraClient) -> None:
        super().__init__(client)
        self.per_flush: list[int] = []

    def _shard_call(self, group: list[tuple[str, list[object]]], timestamp_us: int
                    ) -> Callable[[], Awaitable[object]]:
        self.requests += 1
        return super()._shard_call(group, timestamp_us)

    async def write_shards(self, *args: Any, **kwargs: Any) -> None:
        self.requests = 0
        await super().write_shards(*args, **kwargs)
        self.per_flush.append(self.requests)


async def open_store(settings: CassandraSettings, client_type: type[Any] = CassandraClient,
                     store_type: type[Any] = CassandraStore) -> Any:
    """A store on a keyspace of its own (``settings.keyspace``), made now: :func:`close_store` drops it."""
    async with client_type(settings, use_keyspace=False) as admin:
        await admin.ensure_schema()
    client = client_type(settings)
    try:
        await client.__aenter__()
    except BaseException:
        await _drop_keyspace(client_type, settings)
        raise
    return store_type(client)


async def close_store(store: Any) -> None:
    """Stop the store's client and drop its keyspace."""
    await store.client.__aexit__(None, None, None)
    await _drop_keyspace(type(store.client), store.client.settings)


async def _drop_keyspace(client_type: type[Any], settings: CassandraSettings) -> None:
    async with client_type(settings, use_keyspace=False) as admin:
        await admin.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepared=False)


async def measure(stores: Mapping[K, Any], keys: int, rounds: int, seed: int, pid: int, bucketed: bool = True
                  ) -> dict[K, dict[str, list[float]]]:
    """One flush of ``keys`` rows (:func:`flush_writes`, ``bucketed`` or not) through each store's
    ``write_shards`` per round, the stores in an order shuffled each round, the first round unmeasured (it warms
    every keyspace up). Per store,
    the CPU seconds of each measured flush: the event loop's thread, the driver's threads, Cassandra's (process
    ``pid``). The collector is set as the consumer sets it meanwhile."""
    figures: dict[K, dict[str, list[float]]] = {name: {"loop": [], "driver": [], "cassandra": []} for name in stores}
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        mutator, rng = uuid.uuid4(), random.Random(seed)
        for seq in range(1, rounds + 2):
            order = list(stores)
            rng.shuffle(order)
            for name in order:
                writes = flush_writes(keys, seq, bucketed)
                (loop_before, driver_before), cassandra_before = thread_cpu_s(), cpu_s(pid)
                await stores[name].write_shards(mutator, 1_000, 1_000 + seq, writes, source=b"flushreq")
                (loop_after, driver_after), cassandra_after = thread_cpu_s(), cpu_s(pid)
                if seq > 1:
                    measured = figures[name]
                    measured["loop"].append(loop_after - loop_before)
                    measured["driver"].append(driver_after - driver_before)
                    measured["cassandra"].append(cassandra_after - cassandra_before)
        return figures
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


async def run(host: str, port: int, keys: int, sizes: Sequence[int], rounds: int, seed: int
              ) -> dict[int, dict[str, list[float]]]:
    stores: dict[int, _CountingStore] = {}
    try:
        for size in sizes:
            settings = settings_for(host, port, f"flushreq_{uuid.uuid4().hex[:8]}", size)
            stores[size] = await open_store(settings, store_type=_CountingStore)
        figures = await measure(stores, keys, rounds, seed, cassandra_pid(port))
        for size, store in stores.items():
            figures[size]["requests"] = [float(n) for n in store.per_flush[1:]]  # the measured flushes'
        return figures
    finally:
        for store in stores.values():
            await close_store(store)


def report(figures: dict[int, dict[str, list[float]]], keys: int) -> str:
    lines = ["| rows per batch | requests per flush | client CPU µs per row: event loop | driver | "
             "Cassandra CPU µs per row | client CPU µs per request | × 10 rows: client per row | Cassandra per row |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    medians = {size: {name: statistics.median(values) for name, values in measured.items()}
               for size, measured in figures.items()}
    reference = medians.get(10)
    for size, m in medians.items():
        client = m["loop"] + m["driver"]
        against = (f"{client / (reference['loop'] + reference['driver']):.2f}× | "
                   f"{m['cassandra'] / reference['cassandra']:.2f}×") if reference else "– | –"
        per_row = {name: m[name] / keys * 1e6 for name in ("loop", "driver", "cassandra")}
        lines.append(f"| {size} | {m['requests']:.0f} | {per_row['loop']:.1f} | {per_row['driver']:.1f} | "
                     f"{per_row['cassandra']:.1f} | {client / m['requests'] * 1e6:.0f} | {against} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flush_requests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", default="127.0.0.1:9042", help="HOST:PORT of a Cassandra on this machine")
    parser.add_argument("--keys", type=int, default=20_000, help="keys (rows) per flush")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-rows", default="1,10,30", help="write_batch_rows values, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    host, port = args.cassandra.rsplit(":", 1)
    sizes = [int(size) for size in args.batch_rows.split(",")]
    figures = asyncio.run(run(host, int(port), args.keys, sizes, args.rounds, args.seed))
    print(f"{args.keys} rows a flush, median of {args.rounds} rounds\n")
    print(report(figures, args.keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
