"""What recording every counter's hand-over costs the first claims of a deployment, and what later claims pay.

    python -m bench.first_claims [--cassandra HOST:PORT] [--counters N] [--partitions N]

A keyspace of its own, dropped at the end. Every partition is claimed at once, as a consumer group starting
(or the first start after an upgrade from a version that recorded hand-overs for counters with ``since``
only) claims them: each runs ``consumer.handovers.learn_handovers`` over ``--counters`` counters, through the
consumer's own ``CassandraHandovers`` (proposal, check that the claimant still owns the partition, confirmation:
the check is answered from memory here, the claimant owning it). A step that fails is tried again, as the
consumer's retry does. It then does the same claims again, which find every hand-over confirmed. Prints both
times and the failures retried.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence
from types import SimpleNamespace

from bench.stamp_cost import settings_for
from consumer.handovers import learn_handovers
from consumer.storage import PartitionId
from countersink.backfills import CassandraHandovers
from countersink.cassandra import CassandraClient

ATTEMPTS = 20


class Owned:
    """The store's ownership read, answered from memory: each partition is owned by its claimant."""

    def __init__(self, owners: dict[int, uuid.UUID]) -> None:
        self.owners = owners

    async def read_partition(self, pid: PartitionId) -> SimpleNamespace:
        return SimpleNamespace(owner=self.owners[pid.partition])


async def claim_all(book: CassandraHandovers, counters: int, partitions: int,
                    owners: dict[int, uuid.UUID]) -> tuple[float, list[str]]:
    failures: list[str] = []
    names = [f"c{i}" for i in range(counters)]

    async def proposals(missing: Sequence[str]) -> dict[str, int]:
        return dict.fromkeys(missing, 100)

    async def claim(partition: int) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await learn_handovers(book, Owned(owners), PartitionId("g", "t", partition),  # type: ignore[arg-type]
                                      names, proposals, owners[partition])
                return
            except Exception as exc:
                failures.append(type(exc).__name__)
                if attempt == ATTEMPTS:
                    raise
                await asyncio.sleep(0.1 * attempt)

    started = time.perf_counter()
    await asyncio.gather(*(claim(p) for p in range(partitions)))
    return time.perf_counter() - started, failures


async def run(host: str, port: int, counters: int, partitions: int) -> str:
    keyspace = f"firstclaims_{uuid.uuid4().hex[:8]}"
    settings = settings_for(host, port, keyspace)
    try:
        async with CassandraClient(settings, use_keyspace=False) as admin:
            await admin.ensure_schema()
        async with CassandraClient(settings) as client:
            book = CassandraHandovers(client, "bench.first_claims")
            owners = {p: uuid.uuid4() for p in range(partitions)}
            first, failed = await claim_all(book, counters, partitions, owners)
            again, failed_again = await claim_all(book, counters, partitions, owners)
    finally:
        async with CassandraClient(settings, use_keyspace=False) as admin:
            await admin.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)
    return (f"{counters} counters over {partitions} partitions, claimed at once: first claims {first:.1f} s "
            f"({len(failed)} steps retried: {', '.join(sorted(set(failed))) or 'none'}); again {again:.2f} s "
            f"({len(failed_again)} retried)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", default="127.0.0.1:9042", help="HOST:PORT")
    parser.add_argument("--counters", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=256)
    args = parser.parse_args(argv)
    host, _, port = args.cassandra.rpartition(":")
    print(asyncio.run(run(host, int(port), args.counters, args.partitions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
