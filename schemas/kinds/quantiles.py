"""``quantiles``: estimated quantiles of a numeric field, with an Apache DataSketches KLL sketch.

Precision is ``k`` (8..65535, default 200). The normalized rank error (the quantile returned for rank
``r`` has a true rank within ``r ± ε`` with 99 % confidence) is ``ε ≈ 2.296/k^0.9723``: 1.33 % at k 200,
0.68 % at k 400. ``count``, ``min`` and ``max`` are exact, and with at most ``k`` values the sketch holds
every value, so quantiles are exact too. Memory grows with ``log(n/k)``: about ``3k`` doubles at most.

KLL compaction keeps a random half of each full level, so two sketches of the same stream are usually not
byte-identical and merging is not idempotent (merging a sketch with itself counts every value twice): the
laws hold on count/min/max exactly and on quantiles within ``ε``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Self

import datasketches as ds

from schemas.errors import CorruptStateError
from schemas.kinds._codec import Reader, blob_size, put_blob
from schemas.kinds.base import HEADER_SIZE, MAX_STATE_BYTES, KindSpec, State, split_header

TAG = 8
VERSIONS = frozenset({1})
MIN_K = 8
MAX_K = 65535
DEFAULT_RANKS = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class QuantilesEstimate:
    """Exact count/min/max (``None`` when empty), and ``(rank, estimated value)`` pairs."""

    count: int
    min: float | None
    max: float | None
    quantiles: tuple[tuple[float, float], ...]
    normalized_rank_error: float


def normalized_rank_error(k: int) -> float:
    """Return ε for ``k``: estimated ranks are within ±ε of the true rank with 99 % confidence."""
    return float(ds.kll_doubles_sketch.get_normalized_rank_error(k, False))


class QuantilesState(State):
    """A KLL doubles sketch."""

    __slots__ = ("_sketch",)
    kind = "quantiles"
    tag = TAG

    def __init__(self, sketch: ds.kll_doubles_sketch) -> None:
        self._sketch = sketch

    def apply(self, value: object) -> None:
        self._sketch.update(value)

    def merge(self, other: Self) -> None:
        if other._sketch.is_empty():
            return
        if int(self._sketch.n) + int(other._sketch.n) > _KLL_MAX_COUNT:
            # The library's merge adds the counts first and spins without end from 2**63 on; no stream gives
            # a counter that many values, so sketches that would reach it are damaged (each passed its check).
            raise CorruptStateError("KLL sketches hold more values together than any stream gives")
        if self._sketch.is_empty() and other._sketch.k == self._sketch.k:
            # The library's merge into an empty sketch may compact again (randomly); a copy keeps
            # new() ⊔ a exactly a.
            self._sketch = ds.kll_doubles_sketch.deserialize(other._sketch.serialize())
            return
        self._sketch.merge(other._sketch)

    def copy(self) -> Self:
        return type(self)(ds.kll_doubles_sketch.deserialize(self._sketch.serialize()))

    def check(self) -> None:
        sketch = self._sketch
        try:
            if not sketch.is_empty():
                sketch.get_quantile(0.5)
        except Exception as exc:  # the C++ library raises several types; all mean a bad body
            raise CorruptStateError(f"KLL body does not read: {exc}") from exc

    def quantile(self, rank: float) -> float | None:
        """Return the estimated value at ``rank`` (0..1), ``None`` when empty."""
        if self._sketch.is_empty():
            return None
        return float(self._sketch.get_quantile(rank))

    def value(self, ranks: tuple[float, ...] = DEFAULT_RANKS) -> QuantilesEstimate:
        sk = self._sketch
        eps = normalized_rank_error(int(sk.k))
        if sk.is_empty():
            return QuantilesEstimate(0, None, None, (), eps)
        pairs = tuple((r, float(sk.get_quantile(r))) for r in ranks)
        return QuantilesEstimate(int(sk.n), float(sk.get_min_value()), float(sk.get_max_value()), pairs, eps)

    def size_bytes(self) -> int:
        # The library allocates room for k items when it makes a sketch: resident at once for a small k, and for a
        # large one (a mapping of 8·k bytes) the pages touched, a few KiB; a sketch grows past that as it fills,
        # about 10 bytes per item retained (resident memory of 20,000 sketches of one value, k 8 to 65,535, and
        # of sketches holding 300 to 5,000 values; a mutator's estimate against resident memory:
        # tests/unit/test_mutator_memory.py).
        sk = self._sketch
        return 128 + max(10 * int(sk.num_retained), min(8 * int(sk.k), 4096) + 512)

    def _body(self) -> bytes:
        out = bytearray()
        put_blob(out, bytes(self._sketch.serialize()))
        return bytes(out)


_KLL_FAMILY = 15
_KLL_MAX_LEVELS = 61
# The most values a sketch may hold: the library's merge spins without end from 2**63 on (far more than any
# stream gives a counter: tests/unit/test_state_bounds.py measures sketches up to 2**62).
_KLL_MAX_COUNT = 2**63 - 1
_KLL_COUNT = struct.Struct("<Q")


def _check_kll_preamble(blob: bytes) -> None:
    """Refuse KLL buffers whose header cannot describe ``blob``, before the C++ reader walks them."""
    if len(blob) < 8 or blob[2] != _KLL_FAMILY or blob[0] not in (2, 5):
        raise CorruptStateError("KLL body does not start with a KLL preamble")
    k = int.from_bytes(blob[4:6], "little")
    if not MIN_K <= k <= MAX_K:
        raise CorruptStateError(f"KLL k {k} is out of range")
    if blob[0] == 5:
        if len(blob) < 20:
            raise CorruptStateError("KLL preamble is truncated")
        levels = blob[18]
        if not 1 <= levels <= _KLL_MAX_LEVELS or len(blob) < 20 + 4 * levels + 16:
            raise CorruptStateError("KLL level table does not fit the body")
        offsets = struct.unpack_from(f"<{levels}I", blob, 20)
        if list(offsets) != sorted(offsets) or len(blob) < 20 + 4 * levels + 16 + 8 * (offsets[-1] - offsets[0]):
            raise CorruptStateError("KLL level offsets do not fit the body")
        # The count must be what the levels weigh (an item of level i stands for 2**i values): the library's
        # reader takes any count, reads it back as the sketch's, and its merge refuses a count its levels do
        # not make, or spins without end on one of 2**63 or more.
        items, stray = divmod(len(blob) - 20 - 4 * levels - 16, 8)
        weight, start = 0, offsets[0]
        for level, end in enumerate((*offsets[1:], offsets[0] + items)):
            weight += (end - start) << level
            start = end
        count = _KLL_COUNT.unpack_from(blob, 8)[0]
        if stray or count != weight or count > _KLL_MAX_COUNT:
            raise CorruptStateError("KLL count does not match its levels")
        # A sketch of n values has at most as many levels as n has bits; the library's merge sizes its work by
        # the count and fills it by the levels, past its end for a body of more levels than its count makes.
        if levels > count.bit_length():
            raise CorruptStateError("KLL has more levels than its count makes")


def new(spec: KindSpec) -> QuantilesState:
    """Return an empty sketch with the definition's ``k``."""
    return QuantilesState(ds.kll_doubles_sketch(spec.k))


def state_from_bytes(data: bytes) -> QuantilesState:
    """Decode bytes written by :meth:`QuantilesState.to_bytes`."""
    state = state_to_merge(data)
    state.check()
    return state


def state_to_merge(data: bytes) -> QuantilesState:
    """:func:`state_from_bytes` without reading the sketch's sorted view (:meth:`QuantilesState.check`), for
    states merged and then checked once (``schemas.kinds.merge_checked``): that check cost 8 µs a sketch of
    2,000 values, four times its decoding."""
    _, body = split_header(data, TAG, VERSIONS)
    r = Reader(body)
    blob = r.blob(MAX_STATE_BYTES)
    r.end()
    _check_kll_preamble(blob)
    try:
        sketch = ds.kll_doubles_sketch.deserialize(blob)
    except Exception as exc:  # the C++ library raises several types; all mean a bad body
        raise CorruptStateError(f"KLL body does not decode: {exc}") from exc
    if not MIN_K <= sketch.k <= MAX_K:
        raise CorruptStateError(f"KLL k {sketch.k} is out of range")
    return QuantilesState(sketch)


_KLL_MIN_LEVEL_WIDTH = 8
_KLL_PREAMBLE_BYTES = 20


def _kll_level_capacity(k: int, depth: int) -> int:
    """Items a KLL level ``depth`` levels below the top holds: ``k·(2/3)^depth`` rounded, as the library
    computes it (in two halves past depth 30, as it does)."""
    if depth > 30:
        half = depth // 2
        return _kll_level_capacity(_kll_level_capacity(k, half), depth - half)
    widened: int = ((2 * k) << depth) // pow(3, depth)
    return (widened + 1) >> 1


def kll_max_bytes(k: int, levels: int = _KLL_MAX_LEVELS) -> int:
    """The longest serialization of a KLL doubles sketch with ``levels`` levels: preamble, level offsets,
    min and max, and every item the levels can hold (never more than their capacities together)."""
    capacity = sum(max(_KLL_MIN_LEVEL_WIDTH, _kll_level_capacity(k, depth)) for depth in range(levels))
    return _KLL_PREAMBLE_BYTES + 4 * levels + 16 + 8 * capacity


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a quantiles counter stores: a KLL sketch of ``k`` at the most levels its reader
    accepts (61: far more than 2**64 values make), each level full."""
    return HEADER_SIZE + blob_size(kll_max_bytes(spec.k))
