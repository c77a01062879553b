"""The batch merge of stored states (``merge_blobs``) and the state cache, held to the reference path: each blob
decoded by ``state_from_bytes`` and merged one by one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersink.state_cache import ShardRow, StateCache
from schemas.errors import CountersinkError
from schemas.kinds import State, merge_blobs, merge_stored, state_from_bytes
from schemas.kinds import sum as sum_kind
from tests.unit.test_kind_laws import ALL, Case, stream

settings.register_profile("wide", max_examples=150, deadline=None)
WIDE = settings.get_profile("wide")
ids = [c.name for c in ALL]


def one_by_one(blobs: list[bytes]) -> State | None:
    """The reference: every blob decoded, then merged into a copy of the first, one at a time."""
    states = [state_from_bytes(blob) for blob in blobs]
    if not states:
        return None
    out = states[0].copy()
    for other in states[1:]:
        out.merge(other)
    return out


def same(case: Case, a: State | None, b: State | None) -> None:
    """Equal values: exactly for every kind but quantiles, whose merges compact at random (count, min and max
    are exact, and every quantile too while no compaction can have happened)."""
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert type(a) is type(b)
    if case.spec.kind != "quantiles":
        assert a.value() == b.value()
        if case.spec.kind not in ("distinct", "top_k", "quantiles"):
            assert a.to_bytes() == b.to_bytes()
        return
    va: Any = a.value()
    vb: Any = b.value()
    assert (va.count, va.min, va.max) == (vb.count, vb.min, vb.max)
    if va.count <= case.spec.k:
        assert va.quantiles == vb.quantiles


def shards(case: Case, data: st.DataObject, most: int = 12) -> list[bytes]:
    streams = data.draw(st.lists(stream(case), min_size=0, max_size=most))
    return [case.fill(values).to_bytes() for values in streams]


@pytest.mark.parametrize("case", ALL, ids=ids)
@WIDE
@given(data=st.data())
def test_batch_merge_equals_merging_one_by_one(case: Case, data: st.DataObject) -> None:
    """merge_blobs of any number of shards of any kind equals decoding and merging them one at a time."""
    blobs = shards(case, data)
    same(case, merge_blobs(blobs), one_by_one(blobs))


def _outcome(merge: Any, blobs: list[bytes]) -> tuple[str, object]:
    try:
        state = merge(blobs)
    except CountersinkError as exc:
        return type(exc).__name__, None
    return "ok", None if state is None else (state.value(), state.to_bytes())


_tagged = st.sampled_from([1, 2]).flatmap(
    lambda tag: st.lists(st.binary(max_size=12).map(lambda body: bytes((tag,)) + body), min_size=1, max_size=6))


@WIDE
@given(blobs=_tagged | st.lists(st.binary(max_size=12), min_size=1, max_size=6))
def test_batch_merge_refuses_what_the_reference_refuses(blobs: list[bytes]) -> None:
    """Bytes of any shape (truncated, trailing bytes, other versions, other modes, mixed kinds): the one-pass
    merge of counts and sums returns what the reference returns, or raises the error it raises."""
    assert _outcome(merge_blobs, blobs) == _outcome(merge_stored, blobs)


def test_the_one_pass_reads_sums_it_reads_itself_and_hands_back_the_rest() -> None:
    """Integer sums of every size merge in one pass; a float sum among them makes it hand back (None)."""
    ints = [sum_kind.IntegerSum(n).to_bytes() for n in (0, 1, -1, 2**62, -(2**300), 127, -128)]
    assert sum_kind.merged_from_bytes(ints).value() == sum(v for v in (0, 1, -1, 2**62, -(2**300), 127, -128))  # type: ignore[union-attr]
    assert sum_kind.merged_from_bytes([*ints, sum_kind.FloatSum(3).to_bytes()]) is None


@pytest.mark.parametrize("case", ALL, ids=ids)
@WIDE
@given(data=st.data())
def test_cache_answers_what_an_uncached_merge_answers(case: Case, data: st.DataObject) -> None:
    """Reads of one instance whose shards change between reads (some flushed again, some added, some folded
    away): the cache's merge is the uncached merge of the bytes read, each time, and it stays in its bound."""
    pool = shards(case, data, most=6) or [case.new().to_bytes()]
    cache = StateCache(data.draw(st.sampled_from([0, 2_000, 1 << 20])))
    for _ in range(data.draw(st.integers(1, 5))):
        read = data.draw(st.lists(st.sampled_from(pool), max_size=8))
        same(case, cache.merged("c", data.draw(st.sampled_from(["k1", "k2"])), read), one_by_one(read))
        assert cache.size_bytes <= cache.max_bytes


def test_cache_reuses_unchanged_bytes_and_decodes_only_what_changed() -> None:
    """The same bytes read again are a hit; one shard flushed again decodes that shard alone; new bytes are
    never answered from an older merge."""
    from schemas.kinds import KindSpec, new_state

    def sketch(values: range) -> bytes:
        state = new_state(KindSpec("distinct"))
        for v in values:
            state.apply(str(v))
        return state.to_bytes()

    first = [sketch(range(i * 100, i * 100 + 100)) for i in range(5)]
    cache = StateCache(1 << 20)
    before = cache.merged("users", "home", first)
    assert cache.merged("users", "home", [bytes(b) for b in first]) is before  # equal bytes, other objects
    assert (cache.hits, cache.partial, cache.misses) == (1, 0, 1)
    flushed = [*first[:4], sketch(range(400, 600))]
    after = cache.merged("users", "home", flushed)
    assert cache.partial == 1
    assert after is not None
    assert before is not None
    assert after.value().estimate == pytest.approx(600, rel=0.05)  # type: ignore[attr-defined]
    assert before.value().estimate == pytest.approx(500, rel=0.05)  # type: ignore[attr-defined]
    assert cache.merged("users", "home", []) is None
    assert len(cache) == 0


def test_cache_evicts_the_least_recently_read_beyond_its_bound() -> None:
    """Entries beyond max_bytes go, least recently read first; an instance larger than the bound is not kept."""
    from schemas.kinds import KindSpec, new_state

    state = new_state(KindSpec("quantiles"))
    for v in range(50):
        state.apply(float(v))
    blob = state.to_bytes()
    measure = StateCache(10**9)
    assert measure.merged("q", "x", [blob, blob]) is not None
    cache = StateCache(3 * measure.size_bytes)  # room for three entries
    for key in ("a", "b", "c", "d", "e"):
        cache.merged("q", key, [blob, blob])
        cache.merged("q", "a", [blob, blob])  # "a" read again each time: never the least recent
        assert cache.size_bytes <= cache.max_bytes
    assert len(cache) == 3
    assert cache.merged("q", "a", [blob, blob]) is not None
    assert cache.hits >= 4
    hits = cache.hits
    assert cache.merged("q", "b", [blob, blob]) is not None
    assert cache.hits == hits
    tiny = StateCache(10)
    assert tiny.merged("q", "big", [blob]) is not None
    assert len(tiny) == 0


@pytest.mark.parametrize(("shards", "key_chars"), [(1, 8), (3, 8), (3, 1024), (20, 8)])
def test_the_bound_holds_what_the_entries_take_in_memory(shards: int, key_chars: int) -> None:
    """``max_bytes`` bounds the memory the entries take, not only their states' bytes: a count of 3 shards was
    counted 57 bytes an entry and took 2,099 (tracemalloc), so 64 MiB of cache took gigabytes. Filled far past its
    bound with entries read as serve reads them (stamps and rows kept), the cache holds at most its bound, give
    or take a tenth."""
    import gc
    import tracemalloc
    import uuid

    from schemas.cql import stamp_source
    from schemas.kinds import KindSpec, new_state

    state = new_state(KindSpec("count"))
    state.apply(1)
    blob = state.to_bytes()
    bound = 2 * 1024 * 1024
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = StateCache(bound)
        for i in range(bound // 200):  # several times what fits
            cache.merged("count", f"{i:0{key_chars}d}", [bytes(bytearray(blob)) for _ in range(shards)],
                         stamps={stamp_source("g", "t", p): 10**15 + p for p in range(shards)}, now=1.0,
                         rows=[ShardRow((10**15 + p, uuid.uuid4()), 10**15 + p + 1) for p in range(shards)])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.size_bytes <= bound
    assert held <= 1.1 * bound, (held, len(cache))


def test_a_long_range_read_does_not_evict_the_instances_read_often() -> None:
    """Buckets met by a range read (scan) are evicted before instances read directly; a bucket read again is
    kept like any other entry."""
    from schemas.kinds import KindSpec, new_state

    def blob(n: int) -> bytes:
        state = new_state(KindSpec("top_k"))
        state.apply(f"item-{n}")
        return state.to_bytes()

    measure = StateCache(10**9)
    measure.merged("t", "x", [blob(0), blob(1)], scan=True)
    cache = StateCache(4 * measure.size_bytes)  # the hot instance whole, and a few buckets' merges
    cache.merged("t", "hot", [blob(0), blob(1)])
    for bucket in range(20):
        cache.merged("t", f"bucket-{bucket}", [blob(bucket), blob(bucket + 1)], scan=True, stamps={b"s": bucket})
        assert cache.size_bytes <= cache.max_bytes
    hits = cache.hits
    cache.merged("t", "hot", [blob(0), blob(1)])
    assert cache.hits == hits + 1
    assert cache.checked("t", "bucket-0", {b"s": 0}, now=0.0, wall=0.0) is not None  # the first ones stay
    assert cache.checked("t", "bucket-19", {b"s": 19}, now=0.0, wall=0.0) is None  # later ones went first


def _sum_blob(value: int) -> bytes:
    from schemas.kinds import KindSpec, new_state

    state = new_state(KindSpec("sum"))
    state.apply(value)
    return state.to_bytes()


def test_a_kept_merge_answers_only_for_the_stamps_read_with_it_while_young_and_not_hidden() -> None:
    """checked() answers the merge kept for a cell and key only when the stamps given equal those read with its
    states, it is younger than max_age_s, and its bucket is not past its retention; never without stamps, nor
    for another cell of the key (another epoch)."""
    cache = StateCache(1 << 20, max_age_s=60.0)
    blobs = [_sum_blob(3), _sum_blob(4)]
    stamps = {b"s1": 10, b"s2": 20}
    merged = cache.merged("views", "home", blobs, stamps=stamps, now=100.0, hidden_at=5_000.0)
    assert merged is not None
    assert merged.value() == 7
    assert cache.checked("views", "home", stamps, now=120.0, wall=1_000.0) is merged
    assert cache.checked("views", "home", {b"s2": 20, b"s1": 10}, now=120.0, wall=1_000.0) is merged  # any order
    assert cache.checked("views", "home", {b"s1": 10, b"s2": 21}, now=120.0, wall=1_000.0) is None  # flushed
    assert cache.checked("views", "home", {b"s1": 10}, now=120.0, wall=1_000.0) is None  # a stamp expired
    assert cache.checked("views@2", "home", stamps, now=120.0, wall=1_000.0) is None  # a reset's epoch
    assert cache.checked("views", "home", None, now=120.0, wall=1_000.0) is None
    assert cache.checked("views", "home", stamps, now=160.0, wall=1_000.0) is None  # too old
    assert cache.checked("views", "home", stamps, now=120.0, wall=5_000.0) is None  # hidden
    assert (cache.hits, cache.checked_hits) == (2, 2)
    # Read again with the same bytes: the entry takes the new read's stamps and time.
    assert cache.merged("views", "home", blobs, stamps={b"s1": 11}, now=200.0) is merged
    assert cache.checked("views", "home", {b"s1": 11}, now=250.0, wall=9_000.0) is merged
    unstamped = StateCache(1 << 20)
    unstamped.merged("views", "home", blobs, now=0.0)
    assert unstamped.checked("views", "home", None, now=1.0, wall=0.0) is None


def test_a_kept_merge_answers_without_stamps_only_within_max_staleness_s_of_its_last_check() -> None:
    """recent() answers a kept merge with no stamps given while its stamps were read (with its states, or found
    unchanged by checked(), counted from when that read was sent) less than max_staleness_s ago, the entry
    younger than max_age_s and not hidden; never with max_staleness_s 0 (the default), nor for another cell."""
    blobs = [_sum_blob(3), _sum_blob(4)]
    stamps = {b"s1": 10}
    assert StateCache(1 << 20).max_staleness_s == 0.0
    strict = StateCache(1 << 20)
    strict.merged("views", "home", blobs, stamps=stamps, now=100.0)
    assert strict.recent("views", "home", now=100.0, wall=0.0) is None
    cache = StateCache(1 << 20, max_age_s=60.0, max_staleness_s=1.0)
    merged = cache.merged("views", "home", blobs, stamps=stamps, now=100.0, hidden_at=5_000.0)
    assert cache.recent("views", "home", now=100.9, wall=0.0) is merged
    assert cache.recent("views@2", "home", now=100.9, wall=0.0) is None  # a reset's epoch
    assert cache.recent("views", "home", now=101.0, wall=0.0) is None  # stale
    assert cache.checked("views", "home", stamps, now=130.2, wall=0.0, sent=130.0) is merged  # read at 130.0
    assert cache.recent("views", "home", now=130.9, wall=0.0) is merged
    assert cache.recent("views", "home", now=131.0, wall=0.0) is None
    assert cache.checked("views", "home", {b"s1": 11}, now=140.2, wall=0.0, sent=140.0) is None  # flushed: no check
    assert cache.recent("views", "home", now=140.5, wall=0.0) is None
    assert cache.recent("views", "home", now=130.5, wall=5_000.0) is None  # hidden
    assert (cache.recent_hits, cache.checked_hits) == (2, 1)
    aged = StateCache(1 << 20, max_age_s=10.0, max_staleness_s=60.0)
    aged.merged("views", "home", blobs, stamps=stamps, now=0.0)
    assert aged.recent("views", "home", now=9.0, wall=0.0) is not None
    assert aged.recent("views", "home", now=10.0, wall=0.0) is None  # past max_age_s whatever the staleness


def test_a_kept_merge_computes_its_value_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """value() answers the value of the merge kept for a cell and key from the entry after the first read asked
    for it (serve's hits then cost no estimate); a new merge of other bytes is computed again, and a state that
    is not the kept merge (another cell's, one never kept) is computed as given."""
    computed: list[int] = []
    plain_value = sum_kind.IntegerSum.value

    def counted(self: sum_kind.IntegerSum) -> int:
        computed.append(1)
        return plain_value(self)

    monkeypatch.setattr(sum_kind.IntegerSum, "value", counted)
    cache = StateCache(1 << 20)
    stamps = {b"s1": 10}
    merged = cache.merged("views", "home", [_sum_blob(3), _sum_blob(4)], stamps=stamps, now=1.0)
    assert merged is not None
    for _ in range(3):
        hit = cache.checked("views", "home", stamps, now=2.0, wall=0.0)
        assert hit is merged
        assert cache.value("views", "home", hit) == 7
    assert len(computed) == 1
    assert cache.value("views@2", "home", merged) == 7  # another cell: not this entry's
    assert len(computed) == 2
    remerged = cache.merged("views", "home", [_sum_blob(3), _sum_blob(5)], stamps={b"s1": 11}, now=3.0)
    assert remerged is not None
    assert remerged is not merged
    assert cache.value("views", "home", remerged) == 8
    assert cache.value("views", "home", remerged) == 8
    assert cache.value("views", "home", merged) == 7  # no longer the kept merge: computed as given
    assert len(computed) == 4


class _Partition:
    """One key's partition as the consumers leave it (schemas.cql): a row per mutator with a cell per counter
    (each cell's write timestamp), each source's stamp, a tally. Timestamps are as the consumers make them, a
    mutator's birth plus its flush number, so that two rows' or two sources' are often equal; a mutator is born
    above every write of its partition's earlier owners."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, str], dict[str, tuple[bytes, int]]] = {}
        self.owner: dict[bytes, tuple[int, str]] = {}  # source -> the row its mutator writes
        self.flushes: dict[tuple[int, str], int] = {}
        self.stamps: dict[bytes, int] = {}
        self.tally: bytes | None = None
        self.totals: dict[tuple[int, str], int] = {}
        self.folds = 0

    def flush(self, source: bytes, counters: list[str], add: int, born_after: int = 0) -> None:
        if source not in self.owner:
            self.hand_over(source, born_after)
        row = self.owner[source]
        self.flushes[row] += 1
        at = row[0] + self.flushes[row]
        cells = self.rows.setdefault(row, {})
        self.totals[row] = self.totals.get(row, 0) + add
        for counter in counters:
            cells[counter] = (_sum_blob(self.totals[row]), at)
        self.stamps[source] = at

    def hand_over(self, source: bytes, born_after: int = 0) -> None:
        """A new mutator of the source's partition, born ``born_after`` µs above its last write (the first
        one of a source: above 1,000)."""
        born = self.stamps.get(source, 1_000) + 1 + born_after
        row = (born, f"m{len(self.flushes)}")
        self.owner[source], self.flushes[row] = row, 0

    def fold(self) -> None:
        """The GC folds the rows of mutators no source writes any more into the tally, with a stamp of its own."""
        retired = [row for row in self.rows if row not in self.owner.values()]
        blobs = ([self.tally] if self.tally else []) + [self.rows[r]["c"][0] for r in retired if "c" in self.rows[r]]
        merged = merge_blobs(blobs)
        self.tally = None if merged is None else merged.to_bytes()
        for row in retired:
            del self.rows[row]
        self.folds += 1
        self.stamps[b"gc"] = 10**9 + self.folds

    def whole(self) -> tuple[list[bytes], list[ShardRow]]:
        """What a whole read of counter ``c`` returns: the tally, then each row with a cell of it, in order."""
        rows = sorted(row for row, cells in self.rows.items() if "c" in cells)
        newest = {row: max(at for _, at in self.rows[row].values()) for row in rows}
        return ([self.tally] if self.tally else []) + [self.rows[r]["c"][0] for r in rows], \
            [ShardRow(r, newest[r]) for r in rows]

    def read(self, cache: StateCache) -> State | None:
        """A read of ``c`` through the cache, as reader._through_cache makes it, with the rows read by name."""
        stamps = dict(self.stamps)
        kept = cache.checked("c", "k", stamps, now=0.0, wall=0.0)
        if kept is not None:
            return kept
        rows = cache.rows_to_read("c", "k", stamps, now=0.0, wall=0.0)
        if rows is not None:
            found = {r: ShardRow(r, max(at for _, at in self.rows[r].values())) for r in rows
                     if r in self.rows and "c" in self.rows[r]}
            patched = cache.patched("c", "k", self.tally if found else None, found,
                                    {r: self.rows[r]["c"][0] for r in found}, stamps, None)
            if patched is not None:
                return patched
        blobs, shard_rows = self.whole()
        return cache.merged("c", "k", blobs, stamps=stamps, now=0.0, rows=shard_rows)


@WIDE
@given(steps=st.lists(st.tuples(st.sampled_from(["flush", "other", "both", "hand over", "fold"]),
                                st.integers(0, 5), st.integers(1, 9), st.integers(0, 3)), max_size=40),
       reads=st.lists(st.booleans(), min_size=40, max_size=40))
def test_reading_only_the_rows_whose_sources_flushed_answers_what_a_whole_read_answers(
        steps: list[tuple[str, int, int, int]], reads: list[bool]) -> None:
    """Six sources flush counter ``c``, another counter of the key, or both; hand their partition to a new
    mutator; the GC folds retired rows: after any step, a read through the cache (the changed rows alone when
    it can place them) answers what a whole uncached read answers, however the rows' and the sources'
    timestamps collide."""
    partition, cache = _Partition(), StateCache(1 << 20)
    for (step, source_at, add, born_after), read in zip(steps, reads, strict=False):
        source = bytes([source_at]) * 8
        if step == "hand over":
            partition.hand_over(source, born_after)
        elif step == "fold":
            partition.fold()
        else:
            partition.flush(source, {"flush": ["c"], "other": ["other"], "both": ["c", "other"]}[step], add,
                            born_after)
        if read:
            got = partition.read(cache)
            want = merge_blobs(partition.whole()[0])
            assert (got is None) == (want is None)
            assert got is None or want is None or got.value() == want.value()


def test_a_read_after_some_sources_flushed_reads_only_their_rows() -> None:
    """Ten sources, two flush again: the rows to read are theirs; read, the merge is the new value. A source
    whose partition changed hands, a new source or a fold's stamp make the read a whole one."""
    partition, cache = _Partition(), StateCache(1 << 20)
    for i in range(10):
        partition.flush(bytes([i]) * 8, ["c"], i + 1, born_after=100 * i)
    assert partition.read(cache).value() == 55  # type: ignore[union-attr]
    partition.flush(b"\x02" * 8, ["c"], 100)
    partition.flush(b"\x07" * 8, ["c", "other"], 1000)
    assert sorted(cache.rows_to_read("c", "k", partition.stamps, now=0.0, wall=0.0) or []) == sorted(
        [partition.owner[b"\x02" * 8], partition.owner[b"\x07" * 8]])
    assert partition.read(cache).value() == 1155  # type: ignore[union-attr]
    assert cache.patched_reads == 1
    partition.flush(b"\x03" * 8, ["other"], 0)  # another counter of the key only: c's cell unchanged
    assert partition.read(cache).value() == 1155  # type: ignore[union-attr]
    assert cache.patched_reads == 2
    old_row = partition.owner[b"\x04" * 8]
    partition.hand_over(b"\x04" * 8)
    partition.flush(b"\x04" * 8, ["c"], 5)  # the new mutator's row: the old one does not carry the new stamp
    assert cache.rows_to_read("c", "k", partition.stamps, now=0.0, wall=0.0) == [old_row]
    assert partition.read(cache).value() == 1160  # type: ignore[union-attr]
    assert cache.patched_reads == 2  # taken whole
    partition.flush(b"\x0b" * 8, ["c"], 1)  # a new source
    assert cache.rows_to_read("c", "k", partition.stamps, now=0.0, wall=0.0) is None
    assert partition.read(cache).value() == 1161  # type: ignore[union-attr]
    partition.fold()
    assert cache.rows_to_read("c", "k", partition.stamps, now=0.0, wall=0.0) is None
    assert partition.read(cache).value() == 1161  # type: ignore[union-attr]
    assert cache.rows_to_read("c", "k", partition.stamps, now=61.0, wall=0.0) is None  # too old


@pytest.mark.parametrize("first", [["c"], ["other"]], ids=["two rows carry it", "two sources have it"])
def test_a_timestamp_two_sources_or_two_rows_share_places_neither(first: list[str]) -> None:
    """Sources 0 and 1 are born at the same microsecond and flush once each: one timestamp is both sources'
    stamp, carried by both rows (or by source 0's alone, source 1's first flush writing another counter). Both
    flush counter c again, at one timestamp again: the read is whole, and counts both."""
    partition, cache = _Partition(), StateCache(1 << 20)
    for i in range(2, 6):
        partition.flush(bytes([i]) * 8, ["c"], 1, born_after=100 * i)
    partition.flush(b"\x00" * 8, ["c"], 10)
    partition.flush(b"\x01" * 8, first, 20)
    assert partition.stamps[b"\x00" * 8] == partition.stamps[b"\x01" * 8]
    before = 4 + 10 + (20 if first == ["c"] else 0)
    assert partition.read(cache).value() == before  # type: ignore[union-attr]
    partition.flush(b"\x00" * 8, ["c"], 100)
    partition.flush(b"\x01" * 8, ["c"], 1000)
    assert cache.rows_to_read("c", "k", partition.stamps, now=0.0, wall=0.0) is None
    assert partition.read(cache).value() == 4 + 110 + 1020  # type: ignore[union-attr]



def _distinct_blob(values: range) -> bytes:
    from schemas.kinds import KindSpec, new_state

    state = new_state(KindSpec("distinct", lg_k=10))
    for v in values:
        state.apply(f"user-{v}")
    return state.to_bytes()


def test_a_range_reads_buckets_are_kept_as_their_merges_alone() -> None:
    """A range read of more sketch buckets than the bound holds whole keeps each bucket's merge alone: read
    again with its stamps unchanged, each answers; changed, it is read whole and answers as an uncached read
    does. An instance read directly keeps its shards (its rows read by name after a flush). An instance too
    large for the bound whole is kept as its merge."""
    shards = {bucket: [_distinct_blob(range(bucket * 1000 + s * 300, bucket * 1000 + s * 300 + 400))
                       for s in range(10)] for bucket in range(24)}
    whole = StateCache(10**9)
    whole.merged("u", "b0", shards[0])
    one_bucket = whole.size_bytes
    cache = StateCache(4 * one_bucket)  # four buckets whole, far more as merges alone
    rows = [ShardRow((s, f"m{s}"), 100 + s) for s in range(10)]
    hot_stamps = {bytes([s]) * 8: 100 + s for s in range(10)}
    cache.merged("u", "hot", shards[0], stamps=hot_stamps, rows=rows)
    for bucket in range(24):
        cache.merged("u", f"b{bucket}", shards[bucket], scan=True, stamps={b"s": bucket})
        assert cache.size_bytes <= cache.max_bytes
    assert cache.stripped == 24  # every bucket kept as its merge alone ...
    assert len(cache) == 25  # ... and the hot instance whole
    for bucket in range(24):
        state = cache.checked("u", f"b{bucket}", {b"s": bucket}, now=0.0, wall=0.0)
        assert state is not None
        assert state.value() == merge_blobs(shards[bucket]).value()  # type: ignore[union-attr]
    # the hot instance kept its shards: a flush of one source is read by name
    flushed = {**hot_stamps, b"\x03" * 8: 500}
    assert cache.rows_to_read("u", "hot", flushed, now=0.0, wall=0.0) == [(3, "m3")]
    # a stripped bucket that changed is read whole, and answers what an uncached read answers
    assert cache.rows_to_read("u", "b5", {b"s": 99}, now=0.0, wall=0.0) is None
    changed = [*shards[5][:-1], _distinct_blob(range(90_000, 91_000))]
    misses = cache.misses
    assert cache.merged("u", "b5", changed, scan=True).value() == merge_blobs(changed).value()  # type: ignore[union-attr]
    assert cache.misses == misses + 1
    # an instance too large for the bound whole is kept as its merge
    tiny = StateCache(one_bucket // 4)
    assert tiny.merged("u", "big", shards[1], stamps={b"s": 1}) is not None
    assert tiny.checked("u", "big", {b"s": 1}, now=0.0, wall=0.0) is not None
    assert tiny.size_bytes <= tiny.max_bytes
