"""bench.key_rows' pure parts: the slotting of keys, the page views' updates, the mutators' flushes and what each
layout writes of a flush."""

from __future__ import annotations

import json
import uuid
import zlib
from collections import Counter
from decimal import Decimal

import pytest

from bench import shapes
from bench.key_rows import (
    BATCH_BYTES,
    BATCH_ROWS,
    MUTATORS,
    NO_BUCKET,
    Flush,
    Written,
    cell_name,
    generate,
    layouts_for,
    partition_of,
    slot_of,
    updates,
)
from schemas.cql import shard_of_cell
from schemas.kinds import merge_blobs


def test_a_slot_is_stable_in_range_and_spreads_keys() -> None:
    keys = [f"/p/{i}" for i in range(20_000)]
    for slots in (1, 16, 256):
        placed = [slot_of(k, slots) for k in keys]
        assert placed == [slot_of(k, slots) for k in keys]  # the same in every mutator and reader
        assert set(placed) == set(range(slots))
        # crc32 spreads 20,000 pages within 25 % of even over 256 slots
        assert max(Counter(placed).values()) <= 1.25 * len(keys) / slots
    assert slot_of("/p/1", 16) == zlib.crc32(b"/p/1") % 16  # not Python's salted hash()
    with pytest.raises(ValueError, match="at least 1"):
        slot_of("/p/1", 0)


def test_a_page_view_updates_seven_keys_and_the_filtered_counters_only_when_met() -> None:
    import random
    rng = random.Random(3)
    rng_late = random.Random(4)
    events = [shapes.event(i, rng, 20_000) for i in range(1_000)]
    events += [shapes.event(i, rng_late, 20_000) for i in range(72_000, 73_000)]  # the second hour
    seen = Counter[str]()
    for value in events:
        event = json.loads(value, parse_float=Decimal)
        out = updates(event)
        counters = [u[0] for u in out]
        seen.update(counters)
        assert len(set(counters)) == len(counters)
        assert ("revenue" in counters) == (event["type"] == "purchase")
        assert ("errors" in counters) == (event["status"] in (500, 503))
        # the seven row keys of bench.stream2's Truth: counters of one key and bucket share one; in a day's
        # first hour a page's hour and day are one instance key (bucket_key names a bucket by its start)
        first_hour = event["ts"] % 86_400 < 3_600
        assert len({(b, k) for _, b, k, _ in out}) == (6 if first_hour else 7)
        assert {b for c, b, _, _ in out if c in ("top_endpoints", "slowest", "bytes")} == {NO_BUCKET}
    assert set(seen) == {"views", "views_by_country", "latency", "top_endpoints", "visitors", "slowest", "bytes",
                         "revenue", "errors"}


def test_the_partition_is_the_topics() -> None:
    assert partition_of("S000042") == zlib.crc32(b"S000042") % MUTATORS


def test_the_mutators_flushes_hold_every_event_once_in_their_last_cells() -> None:
    stream = generate(3_000, 500, 100, seed=5)
    per_mutator = Counter(f.mutator for f in stream.flushes)
    assert set(per_mutator) == set(range(MUTATORS))
    # views per country-hour, summed over every mutator's last cell: every event once
    total = 0
    for (bucket, _key), cells in stream.last.items():
        if "views_by_country" in cells:
            state = merge_blobs([shard_of_cell(c)[0] for c in cells["views_by_country"].values()])
            assert state is not None
            total += int(state.value())  # type: ignore[call-overload]
            assert bucket != NO_BUCKET
    assert total == 3_000
    # schema 3 writes at least one row per (mutator, row key), and here more: flushes every 100 events
    written = sum(len(f.rows) for f in stream.flushes)
    assert stream.floor_rows <= written
    assert stream.floor_rows == len({(f.mutator, bk) for f in stream.flushes for bk in f.rows})


def _flush() -> Flush:
    f = Flush(mutator=3, seq=1)
    for i in range(40):
        f.rows[("2025-11-26T00:00Z", f"/p/{i}")] = {"views": b"\x00" * 8 + b"\x01\x01\x05"}
    f.rows[(NO_BUCKET, "FR")] = {"top_endpoints": b"\x00" * 9 + b"x" * 5_000}
    return f


def test_each_layout_writes_what_its_shape_says() -> None:
    mutators = [uuid.uuid4() for _ in range(MUTATORS)]
    f = _flush()
    rows, smap, sclu, mrows = layouts_for([16], ["rows", "slot map", "slot clustered", "mutator rows"])
    assert [x.name for x in (rows, smap, sclu, mrows)] == ["rows", "slot map 16", "slot clustered 16", "mutator rows"]
    w = Written()
    requests = rows.write(f, "r0/", mutators, w)
    assert (w.rows, w.mutations, w.statements) == (41, 41, 41)
    assert all(len(r) <= BATCH_ROWS for r in requests)
    big = [r for r in requests if any("FR|r0/-" in s[1] for s in r)]
    assert len(big) == 1
    assert len(big[0]) == 1
    assert sum(len(r) for r in requests) == 41
    assert all(
        sum(len(str(p)) for s in r for p in s[1]) < BATCH_BYTES + 500 for r in requests if len(r) > 1)

    w = Written()
    smap.write(f, "r0/", mutators, w)
    slots = {slot_of(f"/p/{i}", 16) for i in range(40)}
    assert w.rows == w.mutations == w.statements == len(slots) + 1  # a row per (bucket, slot)

    w = Written()
    requests = sclu.write(f, "r0/", mutators, w)
    assert (w.rows, w.mutations, w.requests) == (41, len(slots) + 1, len(slots) + 1)
    names = {s[1][2] for r in requests for s in r}
    assert cell_name("views", "/p/7") in names
    assert cell_name("top_endpoints", "FR") in names

    w = Written()
    requests = mrows.write(f, "r0/", mutators, w)
    assert (w.rows, w.mutations) == (41, 2)  # one partition per bucket of the mutator
    assert {s[1][1] for r in requests for s in r} == {mutators[3]}


def test_slot_keyed_rows_are_schema_3s_rows_in_one_mutation_per_slot() -> None:
    mutators = [uuid.uuid4() for _ in range(MUTATORS)]
    f = _flush()
    (keyed,) = layouts_for([16], ["slot keyed"])
    w = Written()
    requests = keyed.write(f, "r0/", mutators, w)
    slots = {slot_of(f"/p/{i}", 16) for i in range(40)}
    assert (w.rows, w.statements) == (41, 41)  # a row per key, as schema 3
    assert w.mutations == w.requests == len(slots) + 1
    for r in requests:  # every batch is of one partition
        assert len({(s[1][2], s[1][3]) for s in r}) == 1
