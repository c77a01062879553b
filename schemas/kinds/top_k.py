"""``top_k``: the most frequent values of a field, with an Apache DataSketches frequent-items sketch.

Precision is ``max_map_size`` (a power of two, 8..65536, default 256); the sketch tracks up to 3/4 of it.
Every reported frequency ``f̂`` brackets the true frequency: ``lower_bound ≤ f ≤ upper_bound``, and the
gap is at most the a-priori error ``ε·W`` with ``ε = 3.5/max_map_size`` (1.37 % of the total weight ``W``
at 256). These are deterministic guarantees, not probabilities. While fewer distinct values than the map
holds have been seen, every frequency is exact.

``top`` (default 10) is how many items :meth:`TopKState.value` reports, heaviest first, ties by item.
Items are strings (integers by their decimal text). Merging is not idempotent (a self-merge doubles every
frequency) and the serialized map depends on insertion order; the laws hold on the bounds.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Self

import datasketches as ds

from schemas.errors import CorruptStateError
from schemas.kinds._codec import Reader, blob_size, put_blob, put_uvarint, uvarint_size
from schemas.kinds.base import HEADER_SIZE, MAX_STATE_BYTES, KindSpec, State, split_header

TAG = 9
VERSIONS = frozenset({1})
MIN_LG_MAP = 3
MAX_LG_MAP = 16
MAX_TOP = 1000
_NO_FALSE_NEGATIVES = ds.frequent_items_error_type.NO_FALSE_NEGATIVES
# DataSketches' frequent-items preamble for a non-empty sketch: preamble longs, serial version, family,
# lg max map size, lg current map size, flags, unused, active items, unused, stream weight, offset.
_PREAMBLE = struct.Struct("<BBBBBBHIIqq")
_FAMILY = 10


def _sketch_bytes(sk: ds.frequent_strings_sketch) -> bytes:
    """Serialize, keeping the weight and error of a sketch whose purge removed every item.

    The C++ library treats "no active items" as empty (apache/datasketches-cpp#527): it would serialize
    such a sketch as a fresh one, dropping its total weight and its error offset, after which the bounds
    of unseen items would read 0 and no longer cover their true counts. This writes the library's own
    non-empty layout with zero items, which its reader accepts.
    """
    raw = bytes(sk.serialize())
    weight = int(sk.total_weight)
    if sk.num_active_items or not weight:
        return raw
    offset = int(sk.get_upper_bound(""))  # with no tracked items every item's upper bound is the offset
    return _PREAMBLE.pack(4, 1, _FAMILY, raw[3], raw[4], 0, 0, 0, 0, weight, offset)


@dataclass(frozen=True, slots=True)
class TopKItem:
    """One item with its estimated frequency and guaranteed bounds."""

    item: str
    estimate: int
    lower_bound: int
    upper_bound: int


@dataclass(frozen=True, slots=True)
class TopKEstimate:
    """Heaviest items first; ``apriori_error`` bounds ``upper_bound - lower_bound`` of every item."""

    items: tuple[TopKItem, ...]
    total_weight: int
    apriori_error: int


def apriori_error(lg_max_map_size: int) -> float:
    """Return ε: frequency bounds are at most ``ε × total weight`` apart."""
    return float(ds.frequent_strings_sketch.get_epsilon_for_lg_size(lg_max_map_size))


class TopKState(State):
    """A frequent-strings sketch plus the number of items to report."""

    __slots__ = ("_sketch", "_top")
    kind = "top_k"
    tag = TAG

    def __init__(self, sketch: ds.frequent_strings_sketch, top: int) -> None:
        self._sketch = sketch
        self._top = top

    def apply(self, value: object) -> None:
        self._sketch.update(value)

    def merge(self, other: Self) -> None:
        theirs = other._sketch
        if theirs.num_active_items:
            self._sketch.merge(theirs)
            return
        if not theirs.total_weight:
            return
        # ``theirs`` was purged to no items; the library's merge would skip it (see _sketch_bytes), so
        # add its weight and offset to ours by hand, exactly as the library's merge would.
        mine = _sketch_bytes(self._sketch)
        if len(mine) < _PREAMBLE.size:
            self._sketch = ds.frequent_strings_sketch.deserialize(_sketch_bytes(theirs))
            return
        fields = list(_PREAMBLE.unpack_from(mine))
        fields[-2] += int(theirs.total_weight)
        fields[-1] += int(theirs.get_upper_bound(""))
        patched = _PREAMBLE.pack(*fields) + mine[_PREAMBLE.size :]
        self._sketch = ds.frequent_strings_sketch.deserialize(patched)

    def copy(self) -> Self:
        return type(self)(ds.frequent_strings_sketch.deserialize(_sketch_bytes(self._sketch)), self._top)

    def check(self) -> None:
        try:
            # The reader does not check that items are UTF-8; listing them does, so a bad item fails here.
            self._sketch.get_frequent_items(_NO_FALSE_NEGATIVES)
        except Exception as exc:  # the C++ library raises several types; all mean a bad body
            raise CorruptStateError(f"frequent-items body does not decode: {exc}") from exc

    def bounds(self, item: str) -> tuple[int, int]:
        """Return the guaranteed ``(lower, upper)`` frequency bounds of any item, tracked or not."""
        return int(self._sketch.get_lower_bound(item)), int(self._sketch.get_upper_bound(item))

    def value(self) -> TopKEstimate:
        sk = self._sketch
        rows = sorted(sk.get_frequent_items(_NO_FALSE_NEGATIVES), key=lambda r: (-r[1], r[0]))
        items = tuple(TopKItem(str(i), int(e), int(lo), int(hi)) for i, e, lo, hi in rows[: self._top])
        return TopKEstimate(items, int(sk.total_weight), math.ceil(float(sk.epsilon) * int(sk.total_weight)))

    def size_bytes(self) -> int:
        # The map holds its slots plus Python-side strings; serialized size tracks the strings' share.
        return 256 + int(self._sketch.get_serialized_size_bytes()) * 2

    def _body(self) -> bytes:
        out = bytearray()
        put_uvarint(out, self._top)
        put_blob(out, _sketch_bytes(self._sketch))
        return bytes(out)


def new(spec: KindSpec) -> TopKState:
    """Return an empty sketch with the definition's map size and ``top``."""
    return TopKState(ds.frequent_strings_sketch(spec.lg_max_map_size), spec.top)


def state_from_bytes(data: bytes) -> TopKState:
    """Decode bytes written by :meth:`TopKState.to_bytes`."""
    state = state_to_merge(data)
    state.check()
    return state


def state_to_merge(data: bytes) -> TopKState:
    """:func:`state_from_bytes` without listing the sketch's items (:meth:`TopKState.check`), for states merged
    and then checked once (``schemas.kinds.merge_checked``): listing cost 21 µs a sketch of 100 items, fifteen
    times its decoding. An item that is not UTF-8 and that the merge keeps fails the merge's check."""
    _, body = split_header(data, TAG, VERSIONS)
    r = Reader(body)
    top = r.uvarint()
    if not 1 <= top <= MAX_TOP:
        raise CorruptStateError(f"top_k top {top} is out of range")
    raw = r.blob(MAX_STATE_BYTES)
    r.end()
    try:
        sketch = ds.frequent_strings_sketch.deserialize(raw)
    except Exception as exc:  # the C++ library raises several types; all mean a bad body
        raise CorruptStateError(f"frequent-items body does not decode: {exc}") from exc
    return TopKState(sketch, top)


# DataSketches' frequent items: a 32-byte preamble, then a count (8 bytes) and a length-prefixed string (4 bytes
# and the item) per item it tracks; it tracks at most 3/4 of its map before it purges.
_FREQUENT_PREAMBLE_BYTES = 32


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a top_k counter stores: as many items as its map tracks (3/4 of
    ``max_map_size``), each of ``max_item_bytes`` (the router refuses longer items)."""
    tracked = 3 * (1 << spec.lg_max_map_size) // 4
    sketch = _FREQUENT_PREAMBLE_BYTES + tracked * (8 + 4 + max_item_bytes)
    return HEADER_SIZE + uvarint_size(spec.top) + blob_size(sketch)
