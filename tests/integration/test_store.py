"""The consumer's Cassandra store on a real node: shard reads of a replay, many keys to a request."""

from __future__ import annotations

import uuid

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite, StoredShard
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings

pytestmark = pytest.mark.integration


async def test_read_shards_returns_each_instance_of_one_mutator_and_none_for_the_missing(
    cassandra_settings: CassandraSettings,
) -> None:
    """read_shards over two counters and more keys than one request carries finds exactly the mutator's own
    shards, with their offsets, and None where it wrote nothing (another mutator's shard is not its own)."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mine, other = uuid.uuid4(), uuid.uuid4()
        written = [ShardWrite(counter, f"k{i}", f"{counter}-{i}".encode(), 100 + i, True)
                   for counter in ("trades", "shares") for i in range(0, 130, 2)]
        await store.write_shards(mine, 5, written)
        await store.write_shards(other, 5, [ShardWrite("trades", "k1", b"theirs", 7, True)])
        wanted = [(counter, f"k{i}") for counter in ("trades", "shares") for i in range(130)]
        found = await store.read_shards(mine, wanted)
    assert set(found) == set(wanted)
    assert {instance: shard for instance, shard in found.items() if shard is not None} == {
        (w.counter, w.key): StoredShard(w.state, w.through_offset) for w in written}
