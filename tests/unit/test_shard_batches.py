"""How a flush's shard rows are grouped into requests: the counters of one key in one row, the rows of one
partition (a bucket's slot) in single-partition batches, partitions of a row or a few several per unlogged batch
within Cassandra's warning thresholds (10 partitions, 5 KiB), every row sent exactly once."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas.cql as cql_module
from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.settings import CassandraSettings
from schemas.cql import (
    SHARD_SLOTS,
    STAMP_ROW,
    STAMP_TTL_S,
    instances_of_work,
    key_of_partition,
    partition_groups,
    partition_key,
    shard_cell,
    shard_of_cell,
    shard_slice,
    slice_key,
    work_chunk,
)
from schemas.errors import CorruptStateError, MalformedInstanceKeyError
from schemas.events import encode_instance_key


class RecordingClient:
    """Stands in for CassandraClient: records every request instead of sending it."""

    def __init__(self, batch_rows: int) -> None:
        self.settings = CassandraSettings(write_batch_rows=batch_rows)
        self.requests: list[list[tuple[str, Sequence[Any]]]] = []
        self.timestamps: list[int | None] = []  # each request's timestamp (a batch's, for its statements)

    async def execute(self, cql_text: str, params: Sequence[Any], **_: object) -> None:
        self.requests.append([(cql_text, params)])
        self.timestamps.append(None)

    async def execute_batch(self, statements: Sequence[tuple[str, Sequence[Any]]], *,
                            timestamp_us: int | None = None, **_: object) -> None:
        self.requests.append(list(statements))
        self.timestamps.append(timestamp_us)


def all_requests(writes: list[ShardWrite], batch_rows: int = 10) -> list[list[tuple[str, Sequence[Any]]]]:
    client = RecordingClient(batch_rows)
    asyncio.run(CassandraStore(client).write_shards(uuid.uuid4(), 0, 1, writes, source=b"src"))  # type: ignore[arg-type]
    return client.requests


def shard_requests(writes: list[ShardWrite], batch_rows: int = 10) -> list[list[tuple[str, Sequence[Any]]]]:
    """The requests holding shard rows, each with its states' statements alone."""
    return [[s for s in request if "SET states" in s[0]] for request in all_requests(writes, batch_rows)
            if any("SET states" in s[0] for s in request)]


def test_each_partition_written_is_stamped_in_the_same_request() -> None:
    """Beside each row of states, the same request stamps the partition (schemas.cql): its stamps row, the
    source's cell, the same timestamp as the states, the timestamp as the value, the row's TTL when it has one."""
    far = int(time.time()) + 86_400
    writes = [*(write(i) for i in range(25)), ShardWrite("hourly", "S000001", b"h", 7, False, far)]
    client = RecordingClient(10)
    asyncio.run(CassandraStore(client).write_shards(uuid.uuid4(), 0, 1, writes, source=b"src"))  # type: ignore[arg-type]
    shard_batches = [(request, at) for request, at in zip(client.requests, client.timestamps, strict=True)
                     if any("SET states" in cql for cql, _ in request)]
    assert len(shard_batches) == 3
    stamp_row = f"born_us = {STAMP_ROW[0]} AND mutator = {STAMP_ROW[1]}"
    for request, at in shard_batches:
        assert at == 1  # the flush's timestamp, for every statement of the batch
        assert all("USING TIMESTAMP" not in cql for cql, _ in request)
        states = [(cql, params) for cql, params in request if "SET states" in cql]
        stamps = [(cql, params) for cql, params in request if "SET stamps" in cql]
        assert len(stamps) == len(states)
        for (stamp_cql, stamp), (state_cql, state) in zip(stamps, states, strict=True):
            assert stamp_row in stamp_cql
            assert place_of(stamp_cql, stamp) == place_of(state_cql, state)  # the key's place
            end = len(stamp) - bound_place(stamp_cql)
            assert stamp[end - 2:end] == [b"src", 1]  # the source's cell, the timestamp
            if "TTL ?" in state_cql:
                assert ("TTL ?" in stamp_cql, stamp[0]) == (True, state[0])  # the row's TTL
            else:
                assert f"TTL {STAMP_TTL_S} " in stamp_cql  # a stamp's own
                assert len(stamp) == 2 + bound_place(stamp_cql)


def place_of(cql: str, params: Sequence[Any]) -> tuple[str, str]:
    """The partition and clustering key a statement writes: bound, or the empty key in its text (a key without
    a bucket); a row's states end with its birth and mutator, a stamp with the place."""
    end = len(params) - (2 if "SET states" in cql else 0)
    return (params[end - 1], "") if "key = ''" in cql else (params[end - 2], params[end - 1])


def key_of(cql: str, params: Sequence[Any]) -> str:
    return slice_key(*place_of(cql, params))


def stamped(cql: str, params: Sequence[Any]) -> list[str]:
    """The keys a stamp statement stamps: one, or every key of a single-partition batch (``key IN ?``)."""
    if "key IN ?" in cql:
        return [slice_key(params[-2], stored) for stored in params[-1]]
    return [slice_key(*place_of(cql, params))]


def bound_place(cql: str) -> int:
    """How many values of a statement's place are bound: its partition, and the key of a bucket."""
    return 1 if "key = ''" in cql else 2


def cells_of(cql: str, params: Sequence[Any]) -> dict[str, bytes]:
    return params[len(params) - 3 - bound_place(cql)]  # the cells, the place, the birth and the mutator


def write(i: int, state_bytes: int = 40) -> ShardWrite:
    return ShardWrite("trades", f"S{i:06d}", bytes(state_bytes), 7, False)


def test_rows_go_ten_to_a_request_and_each_exactly_once() -> None:
    """Shard rows go ten to a request, each exactly once."""
    requests = shard_requests([write(i) for i in range(95)])
    assert [len(r) for r in requests] == [10] * 9 + [5]
    assert sorted(key_of(cql, params) for r in requests for cql, params in r) == [f"S{i:06d}" for i in range(95)]


def test_a_batch_stays_under_four_kib() -> None:
    """A batch of shard rows stays under 4 KiB."""
    requests = shard_requests([write(i, state_bytes=1500) for i in range(7)])
    assert [len(r) for r in requests] == [2, 2, 2, 1]
    assert all(sum(len(cell) for cql, params in r for cell in cells_of(cql, params).values()) <= 4096
               for r in requests)


def test_a_large_state_goes_alone() -> None:
    """A state too large to share a batch is sent alone."""
    requests = shard_requests([write(0), write(1, state_bytes=10_000), write(2)])
    assert [len(r) for r in requests] == [1, 1, 1]


def test_one_row_per_request_when_batching_is_off() -> None:
    """With write_batch_rows 1, each row is its own request."""
    assert [len(r) for r in shard_requests([write(i) for i in range(3)], batch_rows=1)] == [1, 1, 1]


def test_the_counters_of_one_key_share_one_row() -> None:
    """Three counters of one key are one statement on one row, each with its own cell, state and offset."""
    writes = [ShardWrite(counter, "IBM", counter.encode(), offset, True)
              for counter, offset in (("trades", 7), ("shares", 8), ("buyers", 9))]
    writes.append(ShardWrite("trades", "MSFT", b"t", 7, True))
    requests = shard_requests(writes)
    statements = [statement for r in requests for statement in r]
    assert sorted(key_of(*s) for s in statements) == ["IBM", "MSFT"]
    ibm = next(cells_of(*s) for s in statements if key_of(*s) == "IBM")
    assert {counter: shard_of_cell(cell) for counter, cell in ibm.items()} == {
        "trades": (b"trades", 7), "shares": (b"shares", 8), "buyers": (b"buyers", 9)}


def test_counters_of_one_key_with_different_expiries_get_their_own_ttls() -> None:
    """Cells that expire at different times go in separate statements, each with its TTL."""
    far = int(time.time()) + 86_400
    writes = [ShardWrite("kept", "IBM", b"k", 1, False), ShardWrite("hourly", "IBM", b"h", 1, False, far),
              ShardWrite("daily", "IBM", b"d", 1, False, far + 3600)]
    statements = [(cql, params) for r in shard_requests(writes) for cql, params in r]
    assert len(statements) == 3
    plain = [(cql, params) for cql, params in statements if "TTL" not in cql]
    assert [set(cells_of(*s)) for s in plain] == [{"kept"}]
    ttls = {next(iter(cells_of(cql, p))): p[0] for cql, p in statements if "TTL" in cql}
    assert set(ttls) == {"hourly", "daily"}
    assert ttls["daily"] - ttls["hourly"] == 3600


def work_requests(writes: list[ShardWrite]) -> list[tuple[str, Sequence[Any]]]:
    client = RecordingClient(10)
    asyncio.run(CassandraStore(client).write_shards(uuid.uuid4(), 0, 1, writes, source=b"test"))  # type: ignore[arg-type]
    return [s for request in client.requests for s in request if "mutator_work" in s[0]]


def test_the_work_list_is_a_row_per_thousand_new_instances_named_by_content() -> None:
    """Only first writes enter the work list, a thousand to a row; a repeated flush names its rows alike."""
    writes = [ShardWrite(counter, f"k|{i}\u00e9\"\n", b"s", 1, i % 3 != 0)
              for i in range(1800) for counter in ("trades", "buyers")]
    rows = work_requests(writes)
    assert [len(instances_of_work(params[2])) for _, params in rows] == [1000, 1000, 400]
    listed = [i for _, params in rows for i in instances_of_work(params[2])]
    assert sorted(listed) == sorted((w.counter, w.key) for w in writes if w.first_write)
    assert [params[1] for _, params in work_requests(writes)] == [params[1] for _, params in rows]
    assert len({params[1] for _, params in rows}) == 3


@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=40)), max_size=6))
def test_a_work_row_is_named_as_earlier_versions_named_it(instances: list[tuple[str, str]]) -> None:
    """A work row's bytes, and so its name, are those earlier versions wrote (json.dumps, compact, non-ASCII as
    itself): a replay by a newer consumer of a window an older one flushed names the same row."""
    body = json.dumps(instances, ensure_ascii=False, separators=(",", ":")).encode()
    assert work_chunk(instances) == (hashlib.blake2b(body, digest_size=16).digest(), body)
    assert instances_of_work(body) == instances


def test_cells_and_work_rows_refuse_corrupt_bytes() -> None:
    """A truncated shard cell or an undecodable work row is a CorruptStateError, not a wrong number."""
    assert shard_of_cell(shard_cell(b"\x02\x01", -1)) == (b"\x02\x01", -1)
    with pytest.raises(CorruptStateError):
        shard_of_cell(b"\x00" * 8)
    with pytest.raises(CorruptStateError):
        instances_of_work(b'[["trades"]]')
    with pytest.raises(CorruptStateError):
        instances_of_work(b"\xff")


_BUCKETS = st.sampled_from(["2026-11-22T10:00Z", "2026-11-22T11:00Z", "0001-01-01T00:00Z", "10000-01-01T00:00Z"])


def _instance_key(components: tuple[list[str], str | None]) -> str:
    parts, bucket = components
    return encode_instance_key([*parts, bucket] if bucket else parts)


@given(st.lists(st.tuples(st.lists(st.text(max_size=4), max_size=3), st.none() | _BUCKETS), min_size=2,
                max_size=8, unique_by=_instance_key))
def test_every_instance_key_has_its_own_place_in_a_non_empty_partition(
        components: list[tuple[list[str], str | None]]) -> None:
    """Cassandra refuses an empty partition key: every instance key, the keyless "" included, bucketed or not,
    maps to a non-empty partition, no two keys to the same place (partition and clustering key), and back; a
    bucket's keys to that bucket's slots, any other key to a partition of its own."""
    keys = [_instance_key(c) for c in components]
    places = [shard_slice(key) for key in keys]
    assert all(part for part, _ in places)
    assert len(set(places)) == len(keys)
    assert [slice_key(*place) for place in places] == keys
    for (parts, bucket), (part, stored) in zip(components, places, strict=True):
        if bucket is not None:
            assert part.rsplit("#", 1)[0] == bucket
            assert 0 <= int(part.rsplit("#", 1)[1]) < SHARD_SLOTS
            assert stored == partition_key(encode_instance_key([*parts, bucket]))
        elif not encode_instance_key(parts).endswith("Z"):  # (a key may end like a bucket without being one)
            assert (part, stored) == (partition_key(encode_instance_key(parts)), "")


@given(st.lists(st.tuples(st.text(max_size=3), st.none() | _BUCKETS), max_size=60, unique=True),
       st.integers(min_value=1, max_value=30))
def test_the_reads_of_many_keys_name_each_key_once_and_its_place(keys: list[tuple[str, str | None]],
                                                                per_request: int) -> None:
    """partition_groups' requests (``part IN ? AND key IN ?``) cover every key's place, name each key once
    and at most per_request keys each, and cross the partitions of keys alone in theirs by a dozen at most."""
    instance_keys = [encode_instance_key([text, bucket] if bucket else [text]) for text, bucket in keys]
    groups = partition_groups(instance_keys, per_request)
    named = [(part, stored) for parts, stored_keys in groups for part in parts for stored in stored_keys]
    assert {shard_slice(key) for key in instance_keys} <= set(named)
    assert sum(len(stored) if stored != [""] else len(parts) for parts, stored in groups) == len(instance_keys)
    for parts, stored in groups:
        assert max(len(parts), len(stored)) <= per_request
        assert len(parts) == 1 or len(stored) == 1 or max(len(parts), len(stored)) <= 12


def test_the_rows_of_a_buckets_slot_go_in_single_partition_batches() -> None:
    """A flush's rows of one bucket share its slots' partitions: each partition of many rows is its own batches
    (250 rows at most, each row with its stamp, every statement naming that partition); partitions of a row or
    a few share unlogged batches of ten partitions at most; every row is sent once."""
    keys = [f"page{i}|2026-11-22T10:00Z" for i in range(8000)] + [f"S{i}" for i in range(15)]
    requests = all_requests([ShardWrite("views", key, b"v", 1, True) for key in keys])
    shard_batches = [r for r in requests if any("SET states" in cql for cql, _ in r)]
    sent = [key_of(cql, params) for r in shard_batches for cql, params in r if "SET states" in cql]
    assert sorted(sent) == sorted(keys)
    def parts(request: list[tuple[str, Sequence[Any]]]) -> set[str]:
        return {place_of(cql, params)[0] for cql, params in request}

    single = [r for r in shard_batches if len(parts(r)) == 1 and len(r) > 2]
    assert set.union(*map(parts, single)) == {f"2026-11-22T10:00Z#{slot}" for slot in range(SHARD_SLOTS)}
    for request in single:
        states = [key_of(cql, params) for cql, params in request if "SET states" in cql]
        stamps = [(cql, params) for cql, params in request if "SET stamps" in cql]
        assert len(states) <= 250
        # statements of 25 keys at most stamp every key of the batch: the source's cell, the flush's timestamp,
        # a stamp's TTL
        assert len(stamps) == -(-len(states) // 25)
        for cql, params in stamps:
            assert f"TTL {STAMP_TTL_S} " in cql
            assert "key IN ?" in cql
            assert params[:2] == [b"src", 1]
            assert len(params[-1]) <= 25
        assert [key for cql, params in stamps for key in stamped(cql, params)] == states
    assert sum(key_of(cql, params) != "" for r in single for cql, params in r if "SET states" in cql) == 8000
    assert all(len(parts(r)) <= 10 for r in shard_batches if r not in single)


@pytest.mark.parametrize(("keys", "batch_rows"), [(6000, 10), (40, 4)])
def test_a_keys_rows_of_different_expiries_travel_in_one_request(keys: int, batch_rows: int) -> None:
    """A key whose counters expire at different times has a row (and a stamp) per expiry: all of them go in one
    request, in a bucket's partition split at 250 keys as in batches shared by keys of partitions of their own
    (the same stamp in each: a read between two requests would see the first and keep it under stamps the
    second does not change)."""
    far = int(time.time()) + 86_400
    names = [f"p{i}|2026-11-22T10:00Z" for i in range(keys)] + [f"S{i}" for i in range(keys)]
    writes = [ShardWrite(counter, key, b"s", 1, True, expiry) for key in names
              for counter, expiry in (("kept", None), ("hourly", far), ("daily", far + 3600))]
    requests = all_requests(writes, batch_rows)
    where: dict[str, set[int]] = {}
    stamps: dict[str, list[int | None]] = {}  # each key's stamps' TTLs (None: a stamp's own)
    for index, request in enumerate(requests):
        for cql, params in request:
            if "SET states" in cql:
                where.setdefault(key_of(cql, params), set()).add(index)
            elif "SET stamps" in cql:
                for key in stamped(cql, params):
                    where.setdefault(key, set()).add(index)
                    stamps.setdefault(key, []).append(params[0] if "TTL ?" in cql else None)
    assert set(where) == set(names)
    assert set(stamps) == set(names)  # every key stamped
    assert all(len(at) == 1 for at in where.values())
    for at in stamps.values():  # a stamp per row, with the row's TTL: a stamp's own, the hour's, the day's
        assert (at.count(None), len(at)) == (1, 3)
        hourly, daily = sorted(ttl for ttl in at if ttl is not None)
        assert (daily - hourly, hourly > 86_000) == (3600, True)
    assert max(len(r) for r in requests) <= 250 * 3 * 2
    assert sum("SET states" in cql for r in requests for cql, _ in r) == 3 * len(names)


def test_the_keyless_instance_is_written_to_its_own_partition() -> None:
    """A counter with no key fields is written to partition "\\", beside a keyed counter's row; the one
    string that would alias it is not an instance key."""
    requests = shard_requests([ShardWrite("all_trades", "", b"a", 3, True), ShardWrite("trades", "IBM", b"t", 3, True)])
    assert sorted(place_of(*s) for r in requests for s in r) == [("IBM", ""), ("\\", "")]
    assert sorted(key_of(*s) for r in requests for s in r) == ["", "IBM"]
    assert key_of_partition("\\") == ""
    with pytest.raises(MalformedInstanceKeyError):
        partition_key("\\")


def test_the_rows_written_are_counted_one_per_key_not_per_shard() -> None:
    """countersink_shard_rows_written_total grows by the rows sent: the counters of one key share a row."""
    from countersink.metrics import METRICS

    before = METRICS.shard_rows_written._value.get()
    writes = [write(i) for i in range(25)] + [ShardWrite("shares", f"S{i:06d}", bytes(8), 7, False) for i in range(5)]
    requests = shard_requests(writes)
    assert sum(len(r) for r in requests) == 25
    assert METRICS.shard_rows_written._value.get() - before == 25


def test_the_bucket_partitions_shard_slice_keeps_are_bounded_and_each_key_is_written_at_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """shard_slice keeps the slots' partitions of the buckets it met (a flush meets a few), emptied when full:
    every flush writes each key at its place (a bucket's start, then the slot of the key's digest) whatever
    was kept, and a key whose end only looks like a bucket's start is a partition of its own."""
    monkeypatch.setattr(cql_module, "_BUCKETS_KEPT", 3)
    monkeypatch.setattr(cql_module, "_BUCKET_PARTS", {})
    client = RecordingClient(10)
    store = CassandraStore(client)  # type: ignore[arg-type]
    keys = ([f"p{i}|2026-11-22T{i % 7:02d}:00Z" for i in range(12)] + [f"S{i}" for i in range(12)]
            + ["q|2026-11-22T10:00Z|x", "q|2026-1a-22T10:00Z", "q|12026-11-22T10:00Z", "2026-11-22T10:00Z"])
    expected = {key: (f"{bucket}#{zlib.crc32(key.encode()) % SHARD_SLOTS}", key)
                if re.fullmatch(r"\d{4,5}-\d\d-\d\dT\d\d:\d\dZ", bucket) else (key, "")
                for key in keys for bucket in (key[key.rfind("|") + 1:],)}
    assert sum(place[1] != "" for place in expected.values()) == 14
    for flush in range(3):
        client.requests.clear()
        asyncio.run(store.write_shards(uuid.uuid4(), 0, 1, [ShardWrite("v", key, b"s", flush, True) for key in keys],
                                       source=b"src"))
        assert len(cql_module._BUCKET_PARTS) <= 3
        written = [(key_of(cql, params), place_of(cql, params)) for request in client.requests
                   for cql, params in request if "SET states" in cql]
        assert sorted(written) == sorted(expected.items())
