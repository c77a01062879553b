"""The row-size limit on a real node: the largest combination of counters the default accepts, every sketch
filled to its maximum, flushes as one row and reads back; a row past Cassandra's own limit is refused by it."""

from __future__ import annotations

import uuid

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite, StoredShard
from countersink.cassandra import CassandraClient
from countersink.reader import read_state
from countersink.settings import CassandraSettings
from schemas.definitions import CounterDefinition, parse_definitions
from schemas.errors import RowTooLargeError
from schemas.events import DEFAULT_MAX_KEY_BYTES
from schemas.kinds import State, new_state
from schemas.shard_rows import DEFAULT_MAX_ROW_BYTES, row_groups, state_bound

pytestmark = pytest.mark.integration

LARGEST = """
[[counter]]
name = "top_users"
topics = ["trades"]
kind = "top_k"
key = "symbol"
value = "user"
max_map_size = 4096

[[counter]]
name = "top_desks"
topics = ["trades"]
kind = "top_k"
key = "symbol"
value = "desk"
max_map_size = 1024

[[counter]]
name = "traders"
topics = ["trades"]
kind = "distinct"
key = "symbol"
value = "user"
lg_k = 21

[[counter]]
name = "qty_quantiles"
topics = ["trades"]
kind = "quantiles"
key = "symbol"
value = "qty"
k = 65535

[[counter]]
name = "qty_spread"
topics = ["trades"]
kind = "variance"
number = "decimal"
key = "symbol"
value = "qty"
"""

ONE_MORE = """
[[counter]]
name = "top_sites"
topics = ["trades"]
kind = "top_k"
key = "site"
value = "site"
max_map_size = 1024
"""


def _filled(definition: CounterDefinition) -> State:
    """A state of ``definition`` as large as it gets: every tracked top-k item of the longest length, every
    HLL register in use, a KLL sketch of 2**62 values (as many levels as a stream makes)."""
    state = new_state(definition)
    if definition.kind == "top_k":
        for i in range(3 * (1 << definition.spec.lg_max_map_size) // 4):
            state.apply(f"{definition.name}-{i}-".ljust(DEFAULT_MAX_KEY_BYTES, "x"))
    elif definition.kind == "distinct":
        for i in range(1 << definition.spec.lg_k):
            state.apply(i)
    elif definition.kind == "quantiles":
        for i in range(3 * definition.spec.k):
            state.apply(float(i % 9973))
        while int(state._sketch.n) < 2**62:  # type: ignore[attr-defined]
            state.merge(state.copy())
    else:
        for value in (10**99, -(10**99)):
            state.apply(value)
    return state


async def test_the_largest_accepted_combination_flushes_as_one_row_and_reads_back(
    cassandra_settings: CassandraSettings,
) -> None:
    """Five counters sharing key IBM, within 1 MiB of the default limit at worst and refused with one more top-k
    of one-part keys, filled to their maximum (top-k and HLL exactly at their bounds), are written by the
    flush path in one row and read back: every cell as written, every value as merged."""
    counters = parse_definitions(LARGEST, "largest.toml")
    (group,) = row_groups(counters)
    assert DEFAULT_MAX_ROW_BYTES - 1024 * 1024 < group.bound <= DEFAULT_MAX_ROW_BYTES
    with pytest.raises(RowTooLargeError):
        parse_definitions(LARGEST + ONE_MORE, "largest.toml")
    states = {c.name: _filled(c) for c in counters}
    for name in ("top_users", "top_desks", "traders"):
        assert len(states[name].to_bytes()) == state_bound(counters[name])
    row_bytes = sum(len(s.to_bytes()) for s in states.values())
    assert row_bytes > 6 * 1024 * 1024

    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        mutator = uuid.uuid4()
        writes = [ShardWrite(name, "IBM", state.to_bytes(), 41, True) for name, state in states.items()]
        await store.write_shards(mutator, 5, 7, writes, source=b"test")
        found = await store.read_shards(mutator, 5, [(name, "IBM") for name in states])
        assert found == {(w.counter, w.key): StoredShard(w.state, 41) for w in writes}
        for name, state in states.items():
            read = await read_state(client, name, "IBM")
            assert read is not None
            assert read.value() == state.value(), name


async def test_cassandra_refuses_a_row_past_its_mutation_limit(cassandra_settings: CassandraSettings) -> None:
    """Three top-k sketches of 8192 full of 1 KiB items on one key (18 MiB) are more than Cassandra's default
    max_mutation_size (which also caps a request): the write fails, as every retry of such a flush would. The
    definitions that could make that row are refused when loaded."""
    text = "".join(f'[[counter]]\nname = "top_{i}"\ntopics = ["t"]\nkind = "top_k"\nkey = "k"\nvalue = "v"\n'
                   f"max_map_size = 8192\n" for i in range(3))
    with pytest.raises(RowTooLargeError):
        parse_definitions(text, "too_large.toml")
    counters = parse_definitions(text, "too_large.toml", max_row_bytes=64 * 1024 * 1024)
    blobs = {c.name: _filled(c).to_bytes() for c in counters}
    assert sum(map(len, blobs.values())) > 16 * 1024 * 1024
    async with CassandraClient(cassandra_settings) as client:
        with pytest.raises(Exception, match=r"(?i)too big|too large|mutation"):
            await CassandraStore(client).write_shards(uuid.uuid4(), 5, 7, [
                ShardWrite(name, "k1", blob, 3, True) for name, blob in blobs.items()], source=b"test")
