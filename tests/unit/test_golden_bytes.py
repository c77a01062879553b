"""Golden state bytes: every kind and format version written once stays readable, byte for byte."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.errors import CorruptStateError, UnknownStateTagError, UnsupportedStateVersionError
from schemas.kinds import (
    KINDS,
    KindSpec,
    kind_of_bytes,
    merge_blobs,
    merge_stored,
    new_state,
    state_from_bytes,
    state_to_merge,
)
from schemas.kinds._codec import Reader, put_blob
from schemas.kinds.base import MAX_STATE_BYTES
from schemas.kinds.quantiles import _kll_level_capacity
from tests.golden.make_golden import VECTORS, build

GOLDEN = Path(__file__).parent.parent / "golden"
FILES = sorted(GOLDEN.glob("*_v*.json"))


def _load(path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def test_every_vector_and_kind_has_a_golden_file() -> None:
    """Each fixed input set has a golden file, and every kind has at least one."""
    names = {_load(p)["name"] for p in FILES}
    assert names == set(VECTORS)
    assert {spec.kind for spec, _, _ in VECTORS.values()} == set(KINDS)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_vector_decodes_to_its_value(path: Path) -> None:
    """Stored golden bytes decode, through the registry, to the value recorded when they were written."""
    doc = _load(path)
    state = state_from_bytes(bytes.fromhex(str(doc["hex"])))
    assert repr(state.value()) == doc["value"]
    assert kind_of_bytes(bytes.fromhex(str(doc["hex"]))) == state.kind


def _encodable(path: Path) -> bool:
    """A vector the current writer must reproduce byte for byte: deterministic kind, current version.

    Older versions and randomized sketches (KLL compaction) are decode-only: the test above covers them.
    """
    doc = _load(path)
    spec, inputs, deterministic = VECTORS[str(doc["name"])]
    return deterministic and build(spec, inputs).version == doc["version"]


ENCODABLE = [path for path in FILES if _encodable(path)]


def test_most_golden_vectors_are_byte_exact() -> None:
    """Only randomized or superseded vectors are decode-only; the byte-exact set is not silently empty."""
    assert len(ENCODABLE) >= len(FILES) - 2


@pytest.mark.parametrize("path", ENCODABLE, ids=[p.stem for p in ENCODABLE])
def test_fixed_inputs_encode_to_golden_bytes(path: Path) -> None:
    """The same fixed inputs still encode to the golden bytes (deterministic kinds, current version)."""
    doc = _load(path)
    spec, inputs, _ = VECTORS[str(doc["name"])]
    state = build(spec, inputs)
    # Bytes first: reading a KLL sketch sorts its buffer in place, which is a different (valid) encoding.
    assert state.to_bytes().hex() == doc["hex"]
    assert repr(state.value()) == doc["value"]


KIND_SAMPLES = {name: new_state(KindSpec(name)).to_bytes() for name in KINDS}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_wrong_tag_is_unknown_tag_error(kind: str) -> None:
    """A kind's reader refuses another kind's tag, and the registry refuses an unknown tag."""
    raw = KIND_SAMPLES[kind]
    other = next(b for k, b in KIND_SAMPLES.items() if k != kind)
    with pytest.raises(UnknownStateTagError):
        KINDS[kind].state_from_bytes(other)
    with pytest.raises(UnknownStateTagError):
        state_from_bytes(bytes((250,)) + raw[1:])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unknown_version_is_unsupported_version_error(kind: str) -> None:
    """A known tag with a format version this build cannot read is a different, named error."""
    raw = KIND_SAMPLES[kind]
    with pytest.raises(UnsupportedStateVersionError):
        state_from_bytes(raw[:1] + bytes((99,)) + raw[2:])


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_truncated_bytes_are_corrupt_state_error(path: Path) -> None:
    """Every truncation of a golden vector is CorruptStateError, never another exception."""
    raw = bytes.fromhex(str(_load(path)["hex"]))
    for cut in range(len(raw)):
        try:
            state_from_bytes(raw[:cut])
        except CorruptStateError:
            continue
        # A prefix may happen to be a valid shorter state (a varint that ends early); it must then
        # decode to something, not crash.
        assert cut >= 2


def test_oversized_bytes_are_refused_before_reading() -> None:
    """State larger than the limit is refused from its length alone."""
    with pytest.raises(CorruptStateError):
        state_from_bytes(bytes((1, 1)) + bytes(MAX_STATE_BYTES))


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=64))
def test_garbage_bodies_are_corrupt_state_error(kind: str, body: bytes) -> None:
    """A valid header followed by random bytes either decodes or raises CorruptStateError."""
    raw = KIND_SAMPLES[kind][:2] + body
    try:
        state = state_from_bytes(raw)
    except CorruptStateError:
        return
    state.value()
    state.to_bytes()


def _sketch_blob(kind: str) -> tuple[bytes, bytes]:
    state = new_state(KindSpec(kind))
    for i in range(300):
        state.apply(float(i) if kind == "quantiles" else str(i))
    return _sketch_blob_of(state.to_bytes(), kind)


def _sketch_blob_of(raw: bytes, kind: str) -> tuple[bytes, bytes]:
    """A stored sketch state's bytes before its blob (header, top-k's ``top``), and the blob itself."""
    reader = Reader(raw[2:])
    prefix = raw[:2]
    if kind == "top_k":
        prefix += bytes((reader.uvarint(),))
    return prefix, reader.blob(MAX_STATE_BYTES)


def _drawn_damage(kind: str, data: st.DataObject) -> tuple[bytes, bytes]:
    """A sound state of ``kind`` and the same with its sketch cut and up to four bytes changed (drawn), its
    checksum taken after."""
    prefix, blob = _sketch_blob(kind)
    damaged = bytearray(blob[: data.draw(st.integers(0, len(blob)))])
    for _ in range(data.draw(st.integers(0, 4)) if damaged else 0):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    out, sound = bytearray(prefix), bytearray(prefix)
    put_blob(out, bytes(damaged))
    put_blob(sound, blob)
    return bytes(sound), bytes(out)


@pytest.mark.parametrize("kind", ["distinct", "quantiles", "top_k"])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_damaged_sketch_with_valid_checksum_is_corrupt_state_error(kind: str, data: st.DataObject) -> None:
    """A sketch blob damaged before its checksum was taken decodes or raises CorruptStateError."""
    _, damaged = _drawn_damage(kind, data)
    try:
        state = state_from_bytes(damaged)
    except CorruptStateError:
        return
    state.value()


@pytest.mark.parametrize("kind", ["distinct", "quantiles", "top_k"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_damaged_sketch_merged_with_others_is_corrupt_state_error_or_reads(kind: str, data: st.DataObject) -> None:
    """Reads and the GC decode the states they merge without the checks of every item (state_to_merge) and
    check the merge once: a sketch damaged before its checksum was taken, merged before or after a sound one,
    merges and reads, or raises CorruptStateError, never the library's own error."""
    blobs = list(_drawn_damage(kind, data))
    if data.draw(st.booleans()):
        blobs.reverse()
    for merge in (merge_stored, merge_blobs):
        try:
            merged = merge(blobs)
        except CorruptStateError:
            continue
        assert merged is not None
        merged.value()
        merged.to_bytes()


def _damaged(kind: str, damage: Callable[[bytearray], None]) -> tuple[bytes, bytes]:
    """A sound state of ``kind`` and the same with its sketch damaged by ``damage``, checksum taken after."""
    state = new_state(KindSpec(kind))
    for i in range(300):
        state.apply(float(i) if kind == "quantiles" else f"item-{i % 40:02d}")
    raw = state.to_bytes()
    prefix, blob = _sketch_blob_of(raw, kind)
    damaged = bytearray(blob)
    damage(damaged)
    out = bytearray(prefix)
    put_blob(out, bytes(damaged))
    return raw, bytes(out)


def _refused_by_every_merge(sound: bytes, damaged: bytes) -> None:
    """``damaged`` alone, after ``sound`` and before it: CorruptStateError from the GC's merge and a read's."""
    for blobs in ([damaged], [sound, damaged], [damaged, sound]):
        for merge in (merge_stored, merge_blobs):
            with pytest.raises(CorruptStateError):
                merge(blobs)


@pytest.mark.parametrize(("at", "value"), [(12, 236), (8, 0), (15, 128), (15, 255)])
def test_a_kll_sketch_whose_count_its_levels_do_not_make_is_corrupt_read_alone_or_merged(at: int, value: int
                                                                                        ) -> None:
    """A KLL count (bytes 8 to 15 of its preamble) that its levels' weights do not add up to: the library's
    reader takes it and reads it back as the count (1,013,612,282,156 for the first case), its merge refuses
    it, and one of 2**63 or more (byte 15 at 128 or above) makes its merge spin without end. Every way a state
    is decoded (alone, as a takeover's replay does; for a merge, either order, as reads and the GC do) refuses
    it as CorruptStateError before the library sees it."""
    def count_damaged(blob: bytearray) -> None:
        blob[at] = value

    sound, damaged = _damaged("quantiles", count_damaged)
    with pytest.raises(CorruptStateError, match="count"):
        state_from_bytes(damaged)
    with pytest.raises(CorruptStateError, match="count"):
        state_to_merge(damaged)
    _refused_by_every_merge(sound, damaged)
    assert merge_stored([sound, sound]).value().count == 600  # type: ignore[union-attr]


def test_a_top_k_item_that_is_not_utf8_is_corrupt_alone_and_for_the_gc_and_for_a_read_when_kept() -> None:
    """The frequent-items reader does not check that items are UTF-8; listing them does. A state decoded alone
    lists them at once, and so does the GC for each state it folds (it deletes the shards after: a damaged one
    must stop it). A read lists its merge once: an item the merge keeps fails it, one it purges is gone."""
    def spoil_an_item(blob: bytearray) -> None:
        at = bytes(blob).index(b"item-07")
        blob[at:at + 7] = b"\xff\xfe-07\xc3("

    sound, damaged = _damaged("top_k", spoil_an_item)
    with pytest.raises(CorruptStateError):
        state_from_bytes(damaged)
    state_to_merge(damaged)
    _refused_by_every_merge(sound, damaged)
    # Beside a sketch of more items than its map keeps, which the merge may purge the damaged item for: the GC
    # still stops; a read refuses the merge or reads one whose items are all text.
    crowded = new_state(KindSpec("top_k"))
    for i in range(3000):
        crowded.apply(f"other-{i % 600}")
    for blobs in ([damaged, crowded.to_bytes()], [crowded.to_bytes(), damaged]):
        with pytest.raises(CorruptStateError):
            merge_stored(blobs)
        try:
            merged = merge_blobs(blobs)
        except CorruptStateError:
            continue
        assert merged is not None
        assert all(item.item.startswith(("other-", "item-")) for item in merged.value().items)  # type: ignore[attr-defined]
    assert [item.item for item in merge_stored([sound, sound]).value().items][:1] == ["item-00"]  # type: ignore[union-attr]


def _crafted_kll(levels: int, values: list[float], k: int = 200) -> bytes:
    """A stored quantiles state whose KLL body has ``levels`` levels, all but the first empty, holding
    ``values`` (its count theirs): the library's own layout, built by hand, checksum taken after."""
    capacity = sum(max(8, _kll_level_capacity(k, depth)) for depth in range(levels))
    offsets = [capacity - len(values)] + [capacity] * (levels - 1)
    body = (struct.pack("<BBBBHBBQHBB", 5, 1, 15, 0, k, 8, 0, len(values), k, levels, 0)
            + struct.pack(f"<{levels}I", *offsets) + struct.pack("<dd", min(values), max(values))
            + struct.pack(f"<{len(values)}d", *values))
    out = bytearray(new_state(KindSpec("quantiles", k=k)).to_bytes()[:2])
    put_blob(out, body)
    return bytes(out)


def test_a_kll_body_of_more_levels_than_its_count_makes_is_corrupt_before_the_library_merges_it() -> None:
    """The library's merge sizes its work by the count and fills it by the levels: a body of ten values over 30
    levels passed every check, and merging it wrote past the end of that work (a segfault, in a subprocess:
    it took the interpreter down). Every decoding refuses it now; the same values on one level decode."""
    assert state_from_bytes(_crafted_kll(1, [float(i) for i in range(10)])).value().count == 10  # type: ignore[attr-defined]
    for levels in (5, 30, 61):
        crafted = _crafted_kll(levels, [float(i) for i in range(10)])
        for decode in (state_from_bytes, state_to_merge):
            with pytest.raises(CorruptStateError, match="levels"):
                decode(crafted)
        for merge in (merge_stored, merge_blobs):
            with pytest.raises(CorruptStateError):
                merge([crafted, crafted])


def test_kll_sketches_whose_counts_add_up_past_two_to_the_63_do_not_merge() -> None:
    """Each of two sketches of 2**62 values passes its check, and the library's merge of them spins without end
    (it adds the counts first); a merge refuses them instead. Up to that, they merge."""
    state = new_state(KindSpec("quantiles"))
    for i in range(600):
        state.apply(float(i % 977))
    while int(state._sketch.n) * 2 <= 2**62:  # type: ignore[attr-defined]
        state.merge(state.copy())
    half = state.to_bytes()  # 600 * 2**52: two of them stay under 2**63, four do not
    assert merge_stored([half, half]) is not None
    for merge in (merge_stored, merge_blobs):
        with pytest.raises(CorruptStateError, match="more values"):
            merge([half, half, half, half])
