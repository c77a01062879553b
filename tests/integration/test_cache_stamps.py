"""Serve's state cache answers from a kept merge only while the partition's stamps are unchanged (schemas.cql), on
real Cassandra: a claimant whose clock is behind is born above its partition's last write, so its writes change
the stamps; a bucket past its retention, a dropped counter's keys and a changed bucket of a range are read anew."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.protocol import Claimant
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient, as_dicts
from countersink.commands.drop import sweep
from countersink.reader import CounterReader, read_stamps, read_state
from countersink.resets import RESET_SETTLE_S, EpochsCache, reset_counter
from countersink.settings import CassandraSettings, Consistency, KafkaSettings
from countersink.state_cache import StateCache
from schemas.cql import STAMP_ROW, STAMP_TTL_S, shard_slice, stamp_source
from schemas.definitions import parse_definitions
from schemas.kinds import KindSpec, new_state
from schemas.timeseries import bucket_key

pytestmark = pytest.mark.integration
HOUR = 3600
DAY_START = 1_795_000_000 // 86400 * 86400  # a UTC midnight
# An hourly sum, written here by the tests' own flushes (no consumer reads its topic).
HOURLY_VIEWS = parse_definitions("""
[[counter]]
name = "views"
topics = ["pages"]
kind = "sum"
key = ["page"]
value = "n"
bucket = { field = "ts", size = "1h" }
""")["views"]


async def _flushed_by_each(store: CassandraStore, partitions: int, *also: str
                           ) -> tuple[str, list[uuid.UUID], list[bytes]]:
    """A new instance of ``hits`` that the mutator of each of ``partitions`` flushed once (its shard holds i + 1),
    with a shard of each counter of ``also`` (1) in the same rows: its key, the mutators and their sources."""
    key = f"home-{uuid.uuid4().hex[:8]}"
    mutators = [uuid.uuid4() for _ in range(partitions)]
    sources = [stamp_source("g", "views", i) for i in range(partitions)]
    for i, mutator in enumerate(mutators):
        await store.write_shards(mutator, 1_000 + i, 2_000 + i, [
            ShardWrite("hits", key, _sum(i + 1), 1, True), *(ShardWrite(c, key, _sum(1), 1, True) for c in also)],
                                 source=sources[i])
    return key, mutators, sources


def _spied(client: CassandraClient) -> list[str]:
    """The statements ``client`` executes from now on, in the order sent (until ``_unspied``)."""
    asked: list[str] = []
    execute = client.execute

    async def spied(statement: str, *args: object, **kwargs: object) -> object:
        asked.append(statement)
        return await execute(statement, *args, **kwargs)  # type: ignore[arg-type]

    client.execute = spied  # type: ignore[method-assign]
    return asked


def _unspied(client: CassandraClient) -> None:
    del client.execute  # the instance's spy: the class's method again


def _sum(value: int) -> bytes:
    state = new_state(KindSpec("sum"))
    state.apply(value)
    return state.to_bytes()


async def test_a_claimant_behind_the_last_writers_clock_writes_stamps_that_change(
        cassandra_settings: CassandraSettings) -> None:
    """The partition's first owner's clock is 10 s ahead; the next claimant's is right. It is born above the
    first's last write timestamp (not at its own clock's time, which is below), so its flush changes the
    source's stamp and a cached read sees it."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        pid = PartitionId("g", f"t{uuid.uuid4().hex[:8]}", 0)
        source = stamp_source(pid.consumer_group, pid.topic, pid.partition)
        ahead = time.time_ns() // 1000 + 10_000_000
        first = MutatorEntry(uuid.uuid4(), pid.consumer_group, pid.topic, 0, "ahead", ahead, ahead + 10**9)
        claimed = await Claimant(first, -1).claim(store)
        assert claimed.new == first
        assert await store.open_window(pid, first.id, first.born_us, 1, -1, 4)
        await store.write_shards(first.id, first.born_us, first.born_us + 1, [ShardWrite("hits", "home", _sum(5), 4,
                                                                                         True)], source=source)
        cache = StateCache(1 << 20)
        assert (await read_state(client, "hits", "home", cache=cache)).value() == 5  # type: ignore[union-attr]

        now = time.time_ns() // 1000
        second = MutatorEntry(uuid.uuid4(), pid.consumer_group, pid.topic, 0, "right", now, now + 10**9)
        taken = await Claimant(second, -1).claim(store)
        assert taken.new.born_us == first.born_us + 2 > now  # the first's window (seq 1) plus one
        assert taken.new.expires_us - taken.new.born_us == second.expires_us - second.born_us
        born = taken.new.born_us
        await store.write_shards(second.id, born, born + 1, [ShardWrite("hits", "home", _sum(7), 9, True)],
                                 source=source)
        assert (await read_stamps(client, ["home"]))["home"] == {source: born + 1}
        assert (await read_state(client, "hits", "home", cache=cache)).value() == 12  # type: ignore[union-attr]
        assert cache.checked_hits == 0


async def test_a_bucket_past_its_retention_is_hidden_through_the_cache(cassandra_settings: CassandraSettings) -> None:
    """A kept merge is not answered once its bucket's retention has passed, although no stamp changed."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        expires = int(time.time()) + 3
        await store.write_shards(uuid.uuid4(), 1_000, 1_001, [ShardWrite("hourly", "home|h", _sum(3), 1, True,
                                                                         expires)], source=b"src")
        cache = StateCache(1 << 20)
        for _ in range(2):
            assert (await read_state(client, "hourly", "home|h", cache=cache)).value() == 3  # type: ignore[union-attr]
        assert cache.checked_hits == 1
        # Cassandra's TTLs count whole seconds of its own clock: a second more than the expiry is past it.
        await asyncio.sleep(max(0.0, expires - time.time()) + 1.5)
        assert await read_state(client, "hourly", "home|h", cache=cache) is None
        assert await read_state(client, "hourly", "home|h") is None


async def test_every_key_of_a_slots_batch_is_stamped_with_its_rows_ttls(cassandra_settings: CassandraSettings) -> None:
    """An hour's keys flushed together share their slots' partitions, whose batches stamp all their keys in one
    statement a TTL: each key's stamps row holds the source's cell at the flush's timestamp, expiring with its
    latest row (a stamp's own TTL for a key with a row that does not expire), and a kept merge of any of them
    is read anew once another flush stamps it."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        hour = "2026-11-22T10:00Z"
        far = int(time.time()) + 2 * 86_400
        pages = [f"/p{i}|{hour}" for i in range(400)]  # about 25 keys a slot: each slot is its own batches
        writes = [ShardWrite("views", key, _sum(i), 1, True, far) for i, key in enumerate(pages)]
        writes += [ShardWrite("kept", key, _sum(1), 1, True) for key in pages[:50]]
        written_s = int(time.time())
        await store.write_shards(uuid.uuid4(), 1_000, 1_001, writes, source=b"src")
        assert await read_stamps(client, pages) == {key: {b"src": 1_001} for key in pages}
        ttls = {}
        for key in (pages[0], pages[49], pages[50], pages[399]):
            part, stored = shard_slice(key)
            (row,) = as_dicts(await client.execute(
                "SELECT stamps, ttl(stamps) AS ttls FROM shards WHERE part = ? AND key = ? AND born_us = ? "
                "AND mutator = ?", [part, stored, *STAMP_ROW]))
            assert row["stamps"] == {b"src": 1_001}
            (ttls[key],) = row["ttls"]
        retention = far + client.settings.retention_grace_s - written_s
        for key in (pages[50], pages[399]):  # the bucket's rows alone: their TTL
            assert retention - 60 < ttls[key] <= retention, ttls
        # A row that does not expire too: its stamp's own TTL, the later of the two (both written at the flush's
        # timestamp, Cassandra keeps the cell that lives longer).
        assert retention < STAMP_TTL_S
        for key in (pages[0], pages[49]):
            assert STAMP_TTL_S - 60 < ttls[key] <= STAMP_TTL_S, ttls
        cache = StateCache(1 << 20)
        assert (await read_state(client, "views", pages[399], cache=cache)).value() == 399  # type: ignore[union-attr]
        await store.write_shards(uuid.uuid4(), 2_000, 2_001, [ShardWrite("views", key, _sum(1), 1, True, far)
                                                              for key in pages], source=b"other")
        assert (await read_state(client, "views", pages[399], cache=cache)).value() == 400  # type: ignore[union-attr]
        assert cache.checked_hits == 0


async def test_a_dropped_counters_keys_are_read_anew_through_the_cache(cassandra_settings: CassandraSettings) -> None:
    """The drop's sweep stamps each key it deleted from: a kept merge of the dropped counter is not answered."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        for i in range(3):
            await store.write_shards(uuid.uuid4(), 1_000 + i, 1_001 + i,
                                     [ShardWrite("gone", "home", _sum(2), 1, True),
                                      ShardWrite("kept", "home", _sum(1), 1, True)], source=bytes([i]) * 8)
        cache = StateCache(1 << 20)
        for _ in range(2):
            assert (await read_state(client, "gone", "home", cache=cache)).value() == 6  # type: ignore[union-attr]
        progress = await sweep(client, "gone", 100, asyncio.Event(), lambda *_: None)
        assert progress.cells_deleted == 3
        assert await read_state(client, "gone", "home", cache=cache) is None
        assert (await read_state(client, "kept", "home", cache=cache)).value() == 3  # type: ignore[union-attr]


async def test_a_drop_hides_the_cells_of_a_mutator_whose_clock_runs_ahead(
        cassandra_settings: CassandraSettings) -> None:
    """A consumer whose clock runs a minute ahead writes its shards at that clock's born_us + flush: the sweep's
    deletes, stamped by its own clock, left them visible (a name dropped, released and defined anew read them
    back, and the GC folded them into its tally). Each cell is deleted above its row's newest write."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        ahead_us = int(time.time() * 1e6) + 60_000_000
        writes = [ShardWrite("ahead", "home", _sum(10), 1, True), ShardWrite("other", "home", _sum(4), 1, True)]
        await store.write_shards(uuid.uuid4(), ahead_us, ahead_us + 1, writes, source=b"a" * 8)
        progress = await sweep(client, "ahead", 100, asyncio.Event(), lambda *_: None)
        assert progress.cells_deleted == 1
        assert await read_state(client, "ahead", "home") is None
        assert (await read_state(client, "other", "home")).value() == 4  # type: ignore[union-attr]


async def test_a_fold_read_before_a_drop_lands_hidden_after_it(cassandra_settings: CassandraSettings) -> None:
    """A GC run reads an instance of a counter holding shards and no tally; the drop's sweep deletes the shards;
    the run's fold then lands, at its own earlier timestamp: the tally it writes stays hidden (the sweep deleted
    the key's tally cells whether its read saw one or not), so a name defined again does not read it back."""
    from gc_worker.store import CassandraGcStore

    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        await store.write_shards(uuid.uuid4(), 1_000, 1_001, [ShardWrite("folded_late", "home", _sum(2), 1, True)],
                                 source=b"s" * 8)
        progress = await sweep(client, "folded_late", 100, asyncio.Event(), lambda *_: None)
        assert progress.cells_deleted == 1
        folded_at = int(time.time() * 1e6) - 10_000_000  # the fold's timestamp: before the sweep
        await CassandraGcStore(client).fold("home", {"folded_late": (_sum(2), None)}, [], [], folded_at)
        assert await read_state(client, "folded_late", "home") is None


async def test_a_series_through_the_cache_reads_only_the_buckets_that_changed(
        cassandra_settings: CassandraSettings) -> None:
    """24 hourly buckets of 5 shards each: a second series answers every bucket from the kept merges after
    reading their stamps; after a flush of one bucket, that bucket alone is read again, with its new value."""
    definition, start = HOURLY_VIEWS, DAY_START
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mutators = [uuid.uuid4() for _ in range(5)]
        for i, mutator in enumerate(mutators):
            await store.write_shards(mutator, 1_000 + i, 1_001 + i, [
                ShardWrite("views", bucket_key(definition, "home", start + hour * HOUR), _sum(hour), 1, True)
                for hour in range(24)], source=mutator.bytes[:8])
        cache = StateCache(1 << 20)
        reader = CounterReader(client, cache=cache)
        expected = [5 * hour for hour in range(24)]
        assert [p.value for p in await reader.series(definition, "home", start, start + 24 * HOUR)] == expected
        assert cache.checked_hits == 0
        assert [p.value for p in await reader.series(definition, "home", start, start + 24 * HOUR)] == expected
        assert cache.checked_hits == 24
        await store.write_shards(mutators[2], 1_002, 1_004, [
            ShardWrite("views", bucket_key(definition, "home", start + 7 * HOUR), _sum(100), 2, False)],
            source=mutators[2].bytes[:8])
        expected[7] += 100 - 7
        assert [p.value for p in await reader.series(definition, "home", start, start + 24 * HOUR)] == expected
        assert cache.checked_hits == 24 + 23
        assert (await reader.rollup(definition, "home", start, start + 24 * HOUR)).value == sum(expected)


@pytest.mark.parametrize(("kept_s", "cached"), [(None, True), (0.001, True), (0.001, False)])
async def test_a_read_made_once_a_reset_returned_knows_it_with_serves_kept_epochs(
        cassandra_settings: CassandraSettings, kafka_settings: KafkaSettings, topic_factory, kept_s: float | None,
        cached: bool) -> None:
    """serve keeps each counter's resets for EPOCHS_KEPT_S; reset_counter returns RESET_SETTLE_S after recording
    the reset at the earliest, so a read right after it returned reads the new epoch (nothing counted yet). With
    the resets never kept (every read guesses them from the last read, and reads them alongside the states), the
    same, with the state cache or without."""
    topic = await topic_factory(partitions=2)
    definition = parse_definitions(f"""
[[counter]]
name = "hits"
topics = ["{topic}"]
kind = "sum"
key = ["page"]
value = "n"
""")["hits"]
    async with CassandraClient(cassandra_settings) as client:
        await CassandraStore(client).write_shards(uuid.uuid4(), 1_000, 1_001, [ShardWrite("hits", "home", _sum(5), 1,
                                                                                         True)], source=b"src")
        epochs = EpochsCache(client) if kept_s is None else EpochsCache(client, kept_s=kept_s)
        reader = CounterReader(client, cache=StateCache(1 << 20) if cached else None, epochs=epochs)
        assert await reader.get("hits", "home") == 5
        assert await reader.get("hits", "home") == 5  # its epochs and its merge kept (or guessed)
        started = time.monotonic()
        done = await reset_counter(client, kafka_settings, definition, [], "test", Consistency.ONE, Consistency.ONE)
        assert time.monotonic() - started >= RESET_SETTLE_S
        assert done.reset.epoch == 1
        if kept_s is not None:  # with nothing cached, so that the read guesses the cell it reads the states of
            reader = CounterReader(client, cache=StateCache(1 << 20) if cached else None, epochs=epochs)
        assert await reader.get("hits", "home") is None


async def test_a_read_after_some_sources_flushed_reads_their_rows_alone(cassandra_settings: CassandraSettings) -> None:
    """Twelve partitions' mutators hold shards of one instance; after two of them flush it again (one also
    another counter of the key, a third only the other counter), a read through the cache asks for those rows by
    name and answers what an uncached read does; a claimant's new row makes the next read a whole one."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        key, mutators, sources = await _flushed_by_each(store, 12, "pages")
        cache = StateCache(1 << 20)
        assert (await read_state(client, "hits", key, cache=cache)).value() == 78  # type: ignore[union-attr]
        await store.write_shards(mutators[3], 1_003, 3_003, [ShardWrite("hits", key, _sum(40), 2, False),
                                                             ShardWrite("pages", key, _sum(2), 2, False)],
                                 source=sources[3])
        await store.write_shards(mutators[8], 1_008, 3_008, [ShardWrite("hits", key, _sum(9 + 50), 2, False)],
                                 source=sources[8])
        await store.write_shards(mutators[5], 1_005, 3_005, [ShardWrite("pages", key, _sum(2), 2, False)],
                                 source=sources[5])
        asked = _spied(client)
        assert (await read_state(client, "hits", key, cache=cache)).value() == 78 + 36 + 50  # type: ignore[union-attr]
        assert cache.patched_reads == 1
        by_name = [s for s in asked if "(born_us, mutator) IN" in s]
        assert len(by_name) == 1
        assert by_name[0].count("(?, ?)") == 3 + 1  # the rows that changed, and the key's tally row
        assert [s for s in asked if "AS cell" in s] == by_name  # no whole read
        _unspied(client)
        assert (await read_state(client, "hits", key)).value() == 164  # type: ignore[union-attr]

        # Partition 3's next owner writes a row of its own: the old row does not carry the stamp, read whole.
        claimant = uuid.uuid4()
        await store.write_shards(claimant, 4_000, 4_001, [ShardWrite("hits", key, _sum(1), 3, True)],
                                 source=sources[3])
        assert (await read_state(client, "hits", key, cache=cache)).value() == 165  # type: ignore[union-attr]
        assert cache.patched_reads == 1


async def test_a_read_of_what_the_cache_does_not_keep_is_one_request(cassandra_settings: CassandraSettings) -> None:
    """The stamps are read before the states only for instances whose merge the cache keeps: a first read of an
    instance, or of the buckets of a range, is the states' read alone (it returns the stamps too); a second read
    of each is the stamps' alone (a hit); and a range too large for the cache to keep is the states' read alone
    every time, not the stamps' and then the states'."""
    definition, start = HOURLY_VIEWS, DAY_START
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        key = f"home-{uuid.uuid4().hex[:8]}"
        for i in range(3):
            mutator = uuid.uuid4()
            await store.write_shards(mutator, 1_000 + i, 2_000 + i, [
                ShardWrite("hits", key, _sum(i + 1), 1, True),
                *(ShardWrite("views", bucket_key(definition, key, start + hour * HOUR), _sum(hour), 1, True)
                  for hour in range(24))], source=mutator.bytes[:8])
        asked = _spied(client)
        def stamps_reads() -> int:
            return sum(statement.startswith("SELECT part, key, stamps FROM shards") for statement in asked)

        epochs = EpochsCache(client, kept_s=600)  # kept throughout: each read is the requests counted below
        reader = CounterReader(client, cache=StateCache(1 << 20), epochs=epochs)
        assert await reader.get("hits", key) == 6  # the counter's resets read, not yet kept: sent with the stamps
        asked.clear()
        reader = CounterReader(client, cache=StateCache(1 << 20), epochs=epochs)  # a cache keeping nothing yet
        assert await reader.get("hits", key) == 6
        assert len(asked) == 1
        assert stamps_reads() == 0
        assert await reader.get("hits", key) == 6
        assert len(asked) == 2
        assert stamps_reads() == 1
        assert reader.cache is not None
        assert reader.cache.checked_hits == 1

        expected = [3 * hour for hour in range(24)]
        asked.clear()
        assert [p.value for p in await reader.series(definition, key, start, start + 24 * HOUR)] == expected
        assert stamps_reads() == 0
        assert [p.value for p in await reader.series(definition, key, start, start + 24 * HOUR)] == expected
        assert stamps_reads() == 2  # each bucket in a partition of its own: twelve to a request (partition_groups)
        assert reader.cache.checked_hits == 1 + 24

        small = StateCache(5000)  # room for the merges of a few buckets (each ~1 KB with its overhead), not 24
        reader = CounterReader(client, cache=small, epochs=epochs)
        asked.clear()
        assert [p.value for p in await reader.series(definition, key, start, start + 24 * HOUR)] == expected
        assert stamps_reads() == 0
        held = len(small)
        assert 0 < held < 24
        asked.clear()
        assert [p.value for p in await reader.series(definition, key, start, start + 24 * HOUR)] == expected
        # the stamps of the buckets kept alone, in one request, and those buckets answered from the cache
        assert held <= 12
        assert stamps_reads() == 1
        assert small.checked_hits == held


@pytest.mark.parametrize("cached", [True, False])
async def test_a_series_read_while_its_resets_are_guessed_knows_a_reset(
        cassandra_settings: CassandraSettings, kafka_settings: KafkaSettings, topic_factory, cached: bool) -> None:
    """serve's range read of a counter whose resets it no longer keeps reads its buckets in their cells of the
    resets it read last while it reads the resets again: after a reset, every bucket is read in the new epoch
    (nothing counted there yet), none answered from the guessed cells; before it, the buckets' values."""
    topic = await topic_factory(partitions=1)
    definition = parse_definitions(f"""
[[counter]]
name = "visits"
topics = ["{topic}"]
kind = "sum"
key = ["page"]
value = "n"
bucket = {{ field = "ts", size = "1h" }}
""")["visits"]
    start = DAY_START
    async with CassandraClient(cassandra_settings) as client:
        await CassandraStore(client).write_shards(uuid.uuid4(), 1_000, 1_001, [
            ShardWrite("visits", bucket_key(definition, "home", start + hour * HOUR), _sum(hour + 1), 1, True)
            for hour in range(6)], source=b"src")
        events: list[str] = []
        execute = client.execute

        async def spied(statement: str, *args: object, **kwargs: object) -> object:
            what = "resets" if "FROM resets" in statement else "shards" if "FROM shards" in statement else "other"
            events.append(f"{what} sent")
            try:
                return await execute(statement, *args, **kwargs)  # type: ignore[arg-type]
            finally:
                events.append(f"{what} answered")

        client.execute = spied  # type: ignore[method-assign]
        epochs = EpochsCache(client, kept_s=0.001)  # never kept: each read guesses them from the last
        reader = CounterReader(client, cache=StateCache(1 << 20) if cached else None, epochs=epochs)
        for _ in range(2):
            events.clear()
            points = await reader.series(definition, "home", start, start + 6 * HOUR)
            assert [p.value for p in points] == [1, 2, 3, 4, 5, 6]
        # the second series: the buckets' requests sent with the resets read, not after it answered
        assert events.index("shards sent") < events.index("resets answered"), events
        # two of the six buckets reset, then the whole counter
        hours = [bucket_key(definition, "home", start + hour * HOUR) for hour in (1, 4)]
        await reset_counter(client, kafka_settings, definition, hours, "test", Consistency.ONE, Consistency.ONE)
        reader = CounterReader(client, cache=StateCache(1 << 20) if cached else None, epochs=epochs)
        points = await reader.series(definition, "home", start, start + 6 * HOUR)
        assert [p.value for p in points] == [1, None, 3, 4, None, 6]
        await reset_counter(client, kafka_settings, definition, [], "test", Consistency.ONE, Consistency.ONE)
        points = await reader.series(definition, "home", start, start + 6 * HOUR)
        assert [p.value for p in points] == [None] * 6
        assert (await reader.rollup(definition, "home", start, start + 6 * HOUR)).value is None


async def test_with_max_staleness_a_kept_merge_answers_without_a_request_until_the_bound(
        cassandra_settings: CassandraSettings) -> None:
    """serve's reads with max_staleness_s 3: the read after a flush answers the kept merge without any request,
    missing that flush, until 3 s after the read that last found the stamps unchanged; then the flush is read
    (rows by name) and answered without a request again. With the default 0, the same flush is read at once."""
    staleness = 3.0
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        key, mutators, sources = await _flushed_by_each(store, 4)
        stale = CounterReader(client, cache=StateCache(1 << 20, max_staleness_s=staleness), epochs=EpochsCache(client))
        strict = CounterReader(client, cache=StateCache(1 << 20), epochs=EpochsCache(client))
        assert await strict.get("hits", key) == 10
        read_at = time.monotonic()
        assert await stale.get("hits", key) == 10
        await store.write_shards(mutators[2], 1_002, 3_002, [ShardWrite("hits", key, _sum(30), 2, False)],
                                 source=sources[2])
        asked = _spied(client)
        assert await stale.get_many("hits", [key]) == {key: 10}  # the flush missed, within the bound
        assert time.monotonic() - read_at < staleness  # (else the read above was not within it)
        assert asked == []
        assert stale.cache.recent_hits == 1  # type: ignore[union-attr]
        assert await strict.get("hits", key) == 37  # the default reads the stamps: sees it at once
        asked.clear()
        await asyncio.sleep(staleness - (time.monotonic() - read_at) + 0.05)
        assert await stale.get("hits", key) == 37
        assert any("(born_us, mutator) IN" in s for s in asked)  # only the flushed row read again
        asked.clear()
        assert await stale.get("hits", key) == 37
        assert asked == []
        _unspied(client)
