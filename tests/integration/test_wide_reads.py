"""Wide instances (a shard from each of hundreds of mutators) on real Cassandra: read as the merge of what was
written, with and without the state cache, and a read after a flush sees it (in ``serve`` too)."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.cassandra import CassandraClient
from countersink.reader import CounterReader, read_state
from countersink.settings import CassandraSettings
from countersink.state_cache import StateCache
from schemas.cql import TALLY_ROW, shard_slice
from schemas.kinds import KindSpec, State, new_state, state_from_bytes
from tests.integration.serve_support import running_serve

pytestmark = pytest.mark.integration
SHARDS = 256
SPECS = {"sum": KindSpec("sum"), "distinct": KindSpec("distinct"), "quantiles": KindSpec("quantiles", k=200),
         "top_k": KindSpec("top_k", lg_max_map_size=6, top=5)}


def _state(kind: str, i: int, rng: random.Random) -> State:
    state = new_state(SPECS[kind])
    for _ in range(rng.randint(1, 40)):
        value = {"sum": rng.randint(-10**12, 10**12), "distinct": f"u{rng.randint(0, 20_000)}",
                 "quantiles": rng.uniform(-1e6, 1e6), "top_k": f"p{min(int(rng.paretovariate(1.1)), 90)}"}[kind]
        state.apply(value)
    return state


def _reference(blobs: list[bytes]) -> State:
    out = state_from_bytes(blobs[0])
    for blob in blobs[1:]:
        out.merge(state_from_bytes(blob))
    return out


def _same(kind: str, read: State | None, expected: State) -> None:
    assert read is not None
    if kind == "quantiles":
        a: Any = read.value()
        b: Any = expected.value()
        assert (a.count, a.min, a.max) == (b.count, b.min, b.max)
    else:
        assert read.value() == expected.value()


async def _flush(store: CassandraStore, mutator: uuid.UUID, born_us: int, seq: int, counter: str, key: str,
                 blob: bytes) -> None:
    # Each mutator here stands for a partition's (schemas.cql: a stamp source each).
    await store.write_shards(mutator, born_us, born_us + seq, [ShardWrite(counter, key, blob, seq, True)],
                             source=mutator.bytes[:8])


async def test_256_shards_read_as_the_merge_of_what_was_written(cassandra_settings: CassandraSettings) -> None:
    """An instance of every sketch kind and a sum, each with a tally and 256 shards: read_state (batch merge),
    read_state with a cache (twice: miss, then hit) and CounterReader.get equal the one-by-one merge of the
    written bytes."""
    rng = random.Random(36)
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mutators = [uuid.uuid4() for _ in range(SHARDS)]
        written: dict[str, list[bytes]] = {}
        for kind in SPECS:
            tally = _state(kind, -1, rng).to_bytes()
            await client.execute("UPDATE shards SET tallies = tallies + ? WHERE part = ? AND key = ? AND born_us = ? "
                                 "AND mutator = ?", [{f"wide_{kind}": tally}, *shard_slice(f"{kind}-wide"), *TALLY_ROW])
            written[kind] = [tally]
            for i, mutator in enumerate(mutators):
                blob = _state(kind, i, rng).to_bytes()
                written[kind].append(blob)
                await _flush(store, mutator, 1_000 + i, 1, f"wide_{kind}", f"{kind}-wide", blob)
        cache = StateCache(64 << 20)
        for kind, blobs in written.items():
            expected = _reference(blobs)
            _same(kind, await read_state(client, f"wide_{kind}", f"{kind}-wide"), expected)
            _same(kind, await read_state(client, f"wide_{kind}", f"{kind}-wide", cache=cache), expected)
            _same(kind, await read_state(client, f"wide_{kind}", f"{kind}-wide", cache=cache), expected)
            value = await CounterReader(client, cache=cache).get(f"wide_{kind}", f"{kind}-wide")
            assert value == (await read_state(client, f"wide_{kind}", f"{kind}-wide", cache=cache)).value()  # type: ignore[union-attr]
        assert (cache.hits, cache.misses) == (3 * len(SPECS), len(SPECS))
        assert cache.checked_hits == 3 * len(SPECS)  # the stamps alone read


async def test_a_read_after_a_flush_sees_it_through_the_cache(cassandra_settings: CassandraSettings) -> None:
    """With the cache holding a wide instance's merge, a flush of one shard (acknowledged) is seen by the next
    read, for a sum and for a sketch; a flush that adds a shard, too."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mutators = [uuid.uuid4() for _ in range(50)]
        for i, mutator in enumerate(mutators):
            total = new_state(SPECS["sum"])
            total.apply(1)
            users = new_state(SPECS["distinct"])
            users.apply(f"u{i}")
            await _flush(store, mutator, 1_000 + i, 1, "hits", "home", total.to_bytes())
            await _flush(store, mutator, 1_000 + i, 1, "users", "home", users.to_bytes())
        cache = StateCache(1 << 20)
        reader = CounterReader(client, cache=cache)
        assert await reader.get("hits", "home") == 50
        assert (await reader.get("users", "home")).estimate == pytest.approx(50)  # type: ignore[attr-defined]
        assert await reader.get("hits", "home") == 50
        assert cache.hits == 1
        total = new_state(SPECS["sum"])
        total.apply(11)
        users = new_state(SPECS["distinct"])
        for user in ("u7", "x1", "x2"):
            users.apply(user)
        await _flush(store, mutators[7], 1_007, 2, "hits", "home", total.to_bytes())
        await _flush(store, mutators[7], 1_007, 2, "users", "home", users.to_bytes())
        assert await reader.get("hits", "home") == 60
        assert (await reader.get("users", "home")).estimate == pytest.approx(52)  # type: ignore[attr-defined]
        await _flush(store, uuid.uuid4(), 5_000, 1, "hits", "home", total.to_bytes())
        assert await reader.get("hits", "home") == 71


async def test_serve_reads_a_flush_acknowledged_after_it_cached(cassandra_settings: CassandraSettings,
                                                                 tmp_path: Path) -> None:
    """`serve` (state cache on, its default) answers a wide instance, then the same after a shard of it is
    flushed again: the new value, at once; /metrics counts the reads the cache answered and those it did not."""
    import aiohttp

    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mutators = [uuid.uuid4() for _ in range(SHARDS)]
        for i, mutator in enumerate(mutators):
            state = new_state(SPECS["sum"])
            state.apply(i)
            await _flush(store, mutator, 1_000 + i, 1, "views", "home", state.to_bytes())
        counters = tmp_path / "counters.toml"
        counters.write_text('[[counter]]\nname = "views"\nkind = "sum"\ntopics = ["pages"]\nkey = ["page"]\n'
                            'value = "n"\n')
        async with running_serve(cassandra_settings, counters) as base, aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(base + "/counters/views/home") as one:
                    assert (await one.json())["value"] == sum(range(SHARDS))
            state = new_state(SPECS["sum"])
            state.apply(1_000_000)
            await _flush(store, mutators[100], 1_100, 2, "views", "home", state.to_bytes())
            async with http.get(base + "/counters/views/home") as one:
                assert (await one.json())["value"] == sum(range(SHARDS)) - 100 + 1_000_000
            async with http.get(base + "/metrics") as metrics:
                text = await metrics.text()
            assert 'countersink_serve_state_cache_reads_total{outcome="checked"} 1.0' in text
            assert 'countersink_serve_state_cache_reads_total{outcome="patched"} 1.0' in text  # one shard flushed
            assert 'countersink_serve_state_cache_reads_total{outcome="miss"} 1.0' in text


async def test_the_benchs_instances_written_again_are_the_same_rows(cassandra_settings: CassandraSettings) -> None:
    """make bench writes its wide instances for the mix of reads, then again for the cached reads alone, in one
    keyspace: the second write rewrites the first's rows (mutators drawn from the seed), so each instance still
    holds as many shards as it is named for."""
    from bench.wide_reads import KINDS, Shards, _check

    async with CassandraClient(cassandra_settings) as client:
        await Shards(client, (1, 4)).write()
        await Shards(client, (1, 3)).write()
        for kind in KINDS:
            for shards in (1, 4):
                _check(kind, shards, await read_state(client, f"wide_{kind}", f"{kind}-{shards}"))


async def test_the_first_reads_through_the_cache_are_measured_and_checked(cassandra_settings: CassandraSettings
                                                                           ) -> None:
    """``bench.wide_reads --cold`` reads every kind's instances through an empty cache, the resets kept and read
    alongside, each value checked against what was written, beside the plain row."""
    from bench.wide_reads import COLD_GUESSED, COLD_KEPT, KINDS, PLAIN, cold_latencies, instance_label

    latencies = await cold_latencies(cassandra_settings, 3, (1, 3))
    assert set(latencies) == {PLAIN} | {instance_label(kind, n) + which for kind in KINDS for n in (1, 3)
                                        for which in (COLD_KEPT, COLD_GUESSED)}
    assert all(p50 > 0 for p50, _ in latencies.values())
