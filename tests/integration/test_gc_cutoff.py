"""Each GC run records its cutoff before it reads the mutator registry, and a claimant reads it once
registered (consumer.protocol.Claimant): a mutator whose registration a run missed is never born below that
run's cutoff. Against a real Cassandra: the column added to an older keyspace, the cutoff that only rises, and
a claimant whose registration lands after a run retired unused."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.protocol import Claimant, ClaimUnresolvedError
from consumer.storage import MutatorEntry, PartitionId
from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import CassandraSettings
from gc_worker.collector import Collector
from gc_worker.store import CassandraGcStore, GcClockAheadError

GRACE_US = 500_000


def _entry(born_us: int, partition: int = 0) -> MutatorEntry:
    return MutatorEntry(id=uuid.uuid4(), consumer_group="g", topic="t", partition=partition, host="test",
                        born_us=born_us, expires_us=born_us + 10**9)


async def _run_gc(client: CassandraClient, now_us: int) -> None:
    await Collector(CassandraGcStore(client), GRACE_US).run(now_us)


async def test_a_keyspace_from_before_the_cutoff_gets_its_column_and_runs_only_raise_it(
        cassandra_settings: CassandraSettings, keyspace_factory: Callable[..., Awaitable[CassandraSettings]]) -> None:
    """``ensure_schema`` adds ``gc_runs.cutoff_us`` to a keyspace made before it; a run records now - grace, a
    dry run nothing, and a run with an earlier clock does not lower it."""
    async with CassandraClient(cassandra_settings) as client:
        await client.execute("ALTER TABLE gc_runs DROP cutoff_us", prepared=False)
        assert not await client.schema_complete()
        await client.ensure_schema()
        assert await client.schema_complete()
    # (Cassandra hides cells of a dropped column written before the drop, as a cutoff's timestamp is: the values
    # are checked in a keyspace that never lost the column.)
    async with CassandraClient(await keyspace_factory()) as client:
        store = CassandraStore(client)
        assert await store.read_gc_cutoff() == -1
        now = int(time.time() * 1e6)
        await Collector(CassandraGcStore(client), GRACE_US, dry_run=True).run(now)
        assert await store.read_gc_cutoff() == -1
        await _run_gc(client, now)
        assert await store.read_gc_cutoff() == now - GRACE_US
        await _run_gc(client, now - 10**6)  # a worker whose clock is behind
        assert await store.read_gc_cutoff() == now - GRACE_US
        # One whose clock is ahead by more than the grace folds nothing and records nothing: nothing would lower
        # its cutoff again, and every claimant would be born ahead of time.
        with pytest.raises(GcClockAheadError, match="ahead of Cassandra's"):
            await _run_gc(client, int(time.time() * 1e6) + 10 * 10**6)
        assert await store.read_gc_cutoff() == now - GRACE_US


async def test_a_claimant_is_born_above_the_cutoff_and_one_registered_after_a_run_passed_it_retires_unused(
        cassandra_settings: CassandraSettings) -> None:
    """A claimant whose clock says a time at or below the last run's cutoff is born above it. One that chose
    its birth before a run, whose registration then lands after that run read the registry, reads the run's
    cutoff once registered: it retires unused (the consumer claims with a fresh mutator)."""
    async with CassandraClient(cassandra_settings) as client:
        now = int(time.time() * 1e6)
        await _run_gc(client, now)
        cutoff = now - GRACE_US
        behind = Claimant(_entry(cutoff - 10**6), -1)
        claimed = await behind.claim(CassandraStore(client))
        assert claimed.new.born_us == cutoff + 1

        class RegisteredAfterARun(CassandraStore):
            """A registration that lands only after a GC run has read the registry."""

            async def register_mutator(self, record: MutatorEntry) -> bool:
                await _run_gc(client, int(time.time() * 1e6))
                return await super().register_mutator(record)

        await asyncio.sleep(1.1)  # the late claimant chose its birth 1 s before the run, past the first cutoff
        late = Claimant(_entry(now + 1, partition=1), -1)
        with pytest.raises(ClaimUnresolvedError, match="not after the cutoff"):
            await late.claim(RegisteredAfterARun(client))
        rows = as_dicts(await client.execute("SELECT retired_us FROM mutators WHERE id = ?", [late.new.id]))
        assert len(rows) == 1
        assert rows[0]["retired_us"] is not None, rows
        assert await CassandraStore(client).read_partition(PartitionId("g", "t", 1)) is None

