"""The consumer's Cassandra store on a real node: shard reads of a replay, many keys to a request, and the
cells of counters sharing a key."""

from __future__ import annotations

import time
import uuid

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import FORGOTTEN, MutatorEntry, ShardWrite, StoredShard
from countersink.cassandra import CassandraClient, as_dicts
from countersink.reader import read_state
from countersink.settings import CassandraSettings
from gc_worker.store import CassandraGcStore
from schemas.cql import STAMP_ROW, STAMP_TTL_S, shard_slice
from schemas.kinds import KindSpec, new_state

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
        await store.write_shards(mine, 3, 5, written, source=b"test")
        await store.write_shards(other, 3, 5, [ShardWrite("trades", "k1", b"theirs", 7, True)], source=b"test")
        wanted = [(counter, f"k{i}") for counter in ("trades", "shares") for i in range(130)]
        found = await store.read_shards(mine, 3, wanted)
    assert set(found) == set(wanted)
    assert {instance: shard for instance, shard in found.items() if shard is not None} == {
        (w.counter, w.key): StoredShard(w.state, w.through_offset) for w in written}


async def test_counters_sharing_a_key_keep_their_own_cells_through_flushes_and_folds(
    cassandra_settings: CassandraSettings,
) -> None:
    """Three counters share key IBM in one row per mutator. A later flush of one counter leaves the others'
    cells as they were; an older write of a cell loses to a newer one; a GC fold of the rows born in a range
    folds every counter of theirs and leaves the rows outside it; the work list names every instance once."""
    async with CassandraClient(cassandra_settings) as client:
        store, gc = CassandraStore(client), CassandraGcStore(client)
        mutator, other = uuid.uuid4(), uuid.uuid4()
        states = {name: new_state(KindSpec("count")) for name in ("trades", "likes", "views")}
        for state in states.values():
            state.apply(1)
        await store.write_shards(mutator, 5, 10, [ShardWrite(name, "IBM", state.to_bytes(), 5, True)
                                                  for name, state in states.items()], source=b"test")
        states["likes"].apply(1)
        await store.write_shards(mutator, 5, 12, [ShardWrite("likes", "IBM", states["likes"].to_bytes(), 9, False)],
                                 source=b"test")
        await store.write_shards(mutator, 5, 9, [ShardWrite("views", "IBM", b"\x02\x01\x09", 7, False)],
                                 source=b"test")  # older
        await store.write_shards(other, 8, 10, [ShardWrite("trades", "IBM", states["trades"].to_bytes(), 3, True)],
                                 source=b"test")
        assert await store.read_shard("likes", "IBM", mutator, 5) == StoredShard(states["likes"].to_bytes(), 9)
        assert await store.read_shard("views", "IBM", mutator, 5) == StoredShard(states["views"].to_bytes(), 5)
        assert await store.read_shard("views", "IBM", mutator, 6) is None  # the row is at its mutator's birth
        assert {name: (await read_state(client, name, "IBM")).value() for name in states} == {  # type: ignore[union-attr]
            "trades": 2, "likes": 2, "views": 1}

        view = await gc.read_key("IBM")
        assert [(s.mutator, s.born_us, sorted(s.states), s.write_us) for s in view.shards] == [
            (mutator, 5, ["likes", "trades", "views"], 12), (other, 8, ["trades"], 10)]
        tallies = {name: (state.to_bytes(), None) for name, state in states.items()}
        await gc.fold("IBM", tallies, [(None, 7)], [], 20)  # the rows born before 7: ``mutator``'s
        after = await gc.read_key("IBM")
        assert [s.mutator for s in after.shards] == [other]
        assert after.tallies == {name: tally for name, (tally, _) in tallies.items()}
        assert after.tally_write_us == dict.fromkeys(states, 20)
        assert {name: (await read_state(client, name, "IBM")).value() for name in states} == {  # type: ignore[union-attr]
            "trades": 2, "likes": 2, "views": 1}
        listed = [instance async for page in gc.read_work(mutator) for instance in page]
        assert sorted(listed) == [("likes", "IBM"), ("trades", "IBM"), ("views", "IBM")]


async def test_a_flush_writes_states_and_stamps_at_its_timestamp_with_their_ttls(
    cassandra_settings: CassandraSettings,
) -> None:
    """Every cell of a flush carries the flush's timestamp (the batch's, not one bound per statement): the
    states and the source's stamp, whose value is that timestamp too; a bucket with retention expires its row
    and stamp together, a row without keeps its states and gives its stamp STAMP_TTL_S."""
    far = int(time.time()) + 7 * 86_400
    async with CassandraClient(cassandra_settings) as client:
        store, mutator = CassandraStore(client), uuid.uuid4()
        await store.write_shards(mutator, 40, 1_234_567, [ShardWrite("kept", "AAPL", b"k", 3, True),
                                                          ShardWrite("hourly", "MSFT", b"h", 3, True, far)],
                                 source=b"src-1")
        rows = {}
        for key in ("AAPL", "MSFT"):
            states = as_dicts(await client.execute(
                "SELECT maxwritetime(states) AS ts, ttl(states) AS ttls FROM shards "
                "WHERE part = ? AND key = ? AND born_us = ? AND mutator = ?", [*shard_slice(key), 40, mutator]))
            stamps = as_dicts(await client.execute(
                "SELECT stamps, maxwritetime(stamps) AS ts, ttl(stamps) AS ttls FROM shards "
                "WHERE part = ? AND key = ? AND born_us = ? AND mutator = ?", [*shard_slice(key), *STAMP_ROW]))
            rows[key] = (states[0], stamps[0])
    for key, (states, stamps) in rows.items():
        assert states["ts"] == stamps["ts"] == 1_234_567, key
        assert stamps["stamps"] == {b"src-1": 1_234_567}, key
    (kept, kept_stamp), (hourly, hourly_stamp) = rows["AAPL"], rows["MSFT"]
    assert kept["ttls"] in ([None], None)  # no retention: the states never expire
    assert STAMP_TTL_S - 60 < kept_stamp["ttls"][0] <= STAMP_TTL_S
    expected_ttl = far + client.settings.retention_grace_s - int(time.time())
    assert abs(hourly["ttls"][0] - expected_ttl) <= 60
    assert abs(hourly_stamp["ttls"][0] - expected_ttl) <= 60


async def test_a_level_beyond_the_keyspaces_replicas_is_refused_not_retried(
        cassandra_settings: CassandraSettings) -> None:
    """On the test keyspace (one replica), a statement or a batch at THREE fails as no retry can help, saying
    why (the driver says only that no host was available); at ONE the same statements run."""
    from countersink.cassandra import CassandraUnavailableError, ConsistencyUnreachableError
    from countersink.settings import Consistency

    async with CassandraClient(cassandra_settings) as client:
        await CassandraStore(client).write_shards(uuid.uuid4(), 1_000, 1_001, [ShardWrite("c", "k", b"", 1, True)],
                                                  source=b"src")
        with pytest.raises(ConsistencyUnreachableError,
                           match=r"^consistency THREE waits for 3 replicas; keyspace \w+ keeps 1 ") as refused:
            await client.execute("SELECT key FROM shards WHERE part = ?", ["k"], consistency=Consistency.THREE)
        assert not isinstance(refused.value, CassandraUnavailableError)  # not retriable
        with pytest.raises(ConsistencyUnreachableError, match=r"^consistency TWO waits for 2 replicas"):
            await client.execute_batch([("DELETE FROM shards WHERE part = ?", ["nothing"])],
                                       consistency=Consistency.TWO)
        assert as_dicts(await client.execute("SELECT key FROM shards WHERE part = ?", ["k"],
                                             consistency=Consistency.ONE))


async def test_a_mutators_recorded_counters_read_back_as_written_none_included(
    cassandra_settings: CassandraSettings,
) -> None:
    """What a takeover replaying a mutator's window reads of it: the counters it recorded; an empty set (it
    counted none), which Cassandra would store as null, reads as empty, not as recorded none; a mutator that
    recorded nothing reads as None, one whose registry row is gone (the record then writes nothing) as FORGOTTEN."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        some, none_counted, unrecorded = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        for mutator in (some, none_counted, unrecorded):
            assert await store.register_mutator(MutatorEntry(mutator, "g", "events", 0, "host", 1_000, 2_000))
        await store.record_start(some, 5, frozenset({"trades", "volume"}))
        await store.record_start(none_counted, 7, frozenset())
        gone = uuid.uuid4()
        await store.record_start(gone, 9, frozenset({"trades"}))  # IF EXISTS: no row is made
        assert await store.read_counted(some) == frozenset({"trades", "volume"})
        assert await store.read_counted(none_counted) == frozenset()
        assert await store.read_counted(unrecorded) is None
        assert await store.read_counted(gone) is FORGOTTEN
        rows = as_dicts(await client.execute("SELECT id FROM mutators WHERE id = ?", [gone]))
        assert rows == []
