"""What a read of one instance scans after many rotations and GC runs, on the real Cassandra: the tombstones
the GC leaves must not grow with the rotations, the partitions or the counters (docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest

from bench.tombstones import Bench, Point
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings

pytestmark = pytest.mark.integration

PARTITIONS, COUNTERS, ROTATIONS = 6, 3, 30


async def test_a_read_scans_a_bounded_number_of_tombstones_however_many_rotations(
    cassandra_settings: CassandraSettings,
) -> None:
    """Six partitions rotate their mutators 30 times, each writing three counters on a hot key and on the
    keyless instance, with a GC run after every rotation: a traced read of either key scans at most two
    tombstones (one range tombstone, as Cassandra merges them) after 10 rotations and after 30, and every
    value stays exact. Schema 2 left a tombstone per counter and folded mutator: 522 per read after 30."""
    args = argparse.Namespace(partitions=PARTITIONS, counters=COUNTERS, period=3600.0, reads=1)
    measured: list[Point] = []
    async with CassandraClient(cassandra_settings) as client:
        bench = Bench(client, args)
        for rotation in range(1, ROTATIONS + 1):
            await bench.rotate(rotation)
            await bench.gc(rotation)  # raises if the GC deferred anything
            if rotation in (10, ROTATIONS):
                points = await bench.measure(rotation, 0.0)  # raises unless each key reads what was written
                await bench.resolve(points)
                measured.extend(points)
    assert [(p.rotation, p.key) for p in measured] == [
        (10, "hot key"), (10, "keyless"), (ROTATIONS, "hot key"), (ROTATIONS, "keyless")]
    # The live rows: each partition's current mutator, the tally row and the stamps row.
    assert {p.live_rows for p in measured} == {PARTITIONS + 2}
    assert all(p.tombstones is not None and p.tombstones <= 2 for p in measured), [
        (p.rotation, p.key, p.tombstones) for p in measured]
