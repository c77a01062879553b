"""``sum``: the exact total of a numeric field.

Number modes (``number`` in the definition, default ``integer``):

* ``integer``: value is an ``int``, exact at any size.
* ``decimal``: value is a :class:`~decimal.Decimal`, exact (money is never rounded); the exponent of the
  total is the smallest exponent seen, so ``1.50 + 2`` is ``3.50`` whatever the order.
* ``float``: value is a ``float``: the exact sum of the doubles, rounded once. The stored state is exact,
  so merging is associative and commutative bit for bit. A total beyond the double range reads as ±inf.

An empty sum reads as ``0`` (``Decimal(0)``, ``0.0``): a sum over no events is zero, unlike min/max.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import ClassVar, Self

from schemas.errors import CorruptStateError, IncompatibleStateError
from schemas.kinds import _numeric
from schemas.kinds._codec import (
    MAX_DECIMAL_SIZE,
    MAX_FIXED_SIZE,
    MAX_INT_SIZE,
    Reader,
    put_decimal,
    put_fixed,
    put_int,
)
from schemas.kinds.base import (
    HEADER_SIZE,
    NUMBER_MODE_BYTES,
    KindSpec,
    State,
    read_number_mode,
    split_header,
)

TAG = 1
VERSIONS = frozenset({1})


class SumState(State):
    """Base of the three number modes; they share a tag and differ in the body's mode byte."""

    __slots__ = ()
    kind = "sum"
    tag = TAG
    mode: ClassVar[str]

    def _check(self, other: State) -> None:
        if type(other) is not type(self):
            raise IncompatibleStateError(f"cannot merge {type(other).__name__} into {type(self).__name__}")


class IntegerSum(SumState):
    """Exact integer total."""

    __slots__ = ("_total",)
    mode = "integer"

    def __init__(self, total: int = 0) -> None:
        self._total = total

    def apply(self, value: object) -> None:
        self._total += value  # type: ignore[operator]

    def merge(self, other: Self) -> None:
        self._check(other)
        self._total += other._total

    def copy(self) -> Self:
        return type(self)(self._total)

    def value(self) -> int:
        return self._total

    def size_bytes(self) -> int:
        return 56 + self._total.bit_length() // 8

    def _body(self) -> bytes:
        out = bytearray((NUMBER_MODE_BYTES["integer"],))
        put_int(out, self._total)
        return bytes(out)


class DecimalSum(SumState):
    """Exact decimal total; ``None`` inside means no value applied yet, so ``new()`` is a true identity."""

    __slots__ = ("_total",)
    mode = "decimal"

    def __init__(self, total: Decimal | None = None) -> None:
        self._total = total

    def apply(self, value: object) -> None:
        total = self._total
        self._total = value if total is None else _numeric.EXACT.add(total, value)  # type: ignore[assignment,arg-type]

    def merge(self, other: Self) -> None:
        self._check(other)
        if other._total is not None:
            self.apply(other._total)

    def copy(self) -> Self:
        return type(self)(self._total)

    def value(self) -> Decimal:
        return Decimal(0) if self._total is None else self._total

    def size_bytes(self) -> int:
        return 56 if self._total is None else 160

    def _body(self) -> bytes:
        out = bytearray((NUMBER_MODE_BYTES["decimal"],))
        if self._total is None:
            out.append(0)
        else:
            out.append(1)
            put_decimal(out, self._total)
        return bytes(out)


class FloatSum(SumState):
    """Exact sum of doubles held in units of 2**-1074 (see :mod:`schemas.kinds._numeric`)."""

    __slots__ = ("_units",)
    mode = "float"

    def __init__(self, units: int = 0) -> None:
        self._units = units

    def apply(self, value: object) -> None:
        if type(value) is float:
            p, q = value.as_integer_ratio()
            self._units += p << (_numeric.FLOAT_SHIFT + 1 - q.bit_length())
        else:
            self._units += value << _numeric.FLOAT_SHIFT  # type: ignore[operator]

    def merge(self, other: Self) -> None:
        self._check(other)
        self._units += other._units

    def copy(self) -> Self:
        return type(self)(self._units)

    def value(self) -> float:
        return _numeric.ratio_to_float(self._units, 1 << _numeric.FLOAT_SHIFT)

    def size_bytes(self) -> int:
        return 56 + self._units.bit_length() // 8

    def _body(self) -> bytes:
        out = bytearray((NUMBER_MODE_BYTES["float"],))
        put_fixed(out, self._units)
        return bytes(out)


_CLASSES: dict[str, type[SumState]] = {"integer": IntegerSum, "decimal": DecimalSum, "float": FloatSum}


def new(spec: KindSpec) -> SumState:
    """Return an empty sum in the definition's number mode."""
    return _CLASSES[spec.number]()


def state_from_bytes(data: bytes) -> SumState:
    """Decode bytes written by :meth:`SumState.to_bytes` of any supported version."""
    _, body = split_header(data, TAG, VERSIONS)
    r = Reader(body)
    mode = read_number_mode(r, "sum")
    state: SumState
    if mode == "integer":
        state = IntegerSum(r.int_())
    elif mode == "decimal":
        present = r.byte()
        if present not in (0, 1):
            raise CorruptStateError(f"decimal sum presence byte is {present}")
        state = DecimalSum(r.decimal() if present else None)
    else:
        state = FloatSum(r.fixed())
    r.end()
    return state


def merged_from_bytes(blobs: Sequence[bytes]) -> SumState | None:
    """The merge of stored integer sums in one pass, without a state per blob (a wide instance has a shard per
    partition); ``None`` when any blob is not an integer sum, and the caller merges them one by one, which
    says what is wrong. A blob in any form this pass does not read itself is decoded by
    :func:`state_from_bytes`."""
    total = 0
    for blob in blobs:
        size = len(blob) - 4
        # <<TAG, version 1, integer mode, a length under 128 (one varint byte), the zigzag magnitude>>
        if size >= 0 and blob[1] == 1 and blob[2] == 0 and blob[3] == size and size < 0x80:
            z = int.from_bytes(blob[4:], "big")
            total += -((z + 1) >> 1) if z & 1 else z >> 1
            continue
        state = state_from_bytes(blob)
        if type(state) is not IntegerSum:
            return None
        total += state.value()
    return IntegerSum(total)


# The longest total each mode's reader accepts (the decimal one after its presence byte).
_MAX_TOTAL_SIZE = {"integer": MAX_INT_SIZE, "decimal": 1 + MAX_DECIMAL_SIZE, "float": MAX_FIXED_SIZE}


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a sum stores in the definition's number mode: its reader refuses a longer one."""
    return HEADER_SIZE + 1 + _MAX_TOTAL_SIZE[spec.number]
