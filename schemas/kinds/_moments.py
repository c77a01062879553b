"""Shared body of ``mean`` and ``variance``: exact power sums ``n, Σx, Σx²``.

Chan et al.'s parallel algorithm merges ``(n, mean, M2)`` with ``M2 = M2a + M2b + δ²·na·nb/n``; done in
floating point that merge is neither associative nor exactly commutative, so two mutators that split a
stream differently would store different bits. Kept as exact power sums (ints, exact decimals, or binary
fixed point, see :mod:`schemas.kinds._numeric`) the same merge is plain addition: exact, order-free and
bit-identical. ``M2 = Σx² − (Σx)²/n`` is then computed in exact rational arithmetic, so there is no
cancellation, and the mean and variance a reader sees are the exact values rounded once to a double.
``stddev`` is ``sqrt`` of that variance (within one ulp of the exact root).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Self

from schemas.errors import CorruptStateError, IncompatibleStateError
from schemas.kinds import _numeric
from schemas.kinds._codec import (
    MAX_DECIMAL_SIZE,
    MAX_FIXED_SIZE,
    MAX_INT_SIZE,
    MAX_UVARINT_SIZE,
    Reader,
    put_decimal,
    put_fixed,
    put_int,
    put_uvarint,
)
from schemas.kinds.base import (
    HEADER_SIZE,
    NUMBER_MODE_BYTES,
    KindSpec,
    NumberMode,
    State,
    read_number_mode,
    split_header,
)

_ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class MomentsValue:
    """Value of a ``variance`` counter; every statistic is ``None`` until it is defined."""

    count: int
    mean: float | None
    variance: float | None
    stddev: float | None
    sample_variance: float | None


class PowerSums(State):
    """``n``, ``Σx`` and, when ``squares`` is set, ``Σx²``, all exact."""

    __slots__ = ("_mode", "_n", "_s1", "_s2")
    squares: ClassVar[bool]

    def __init__(self, mode: NumberMode, n: int = 0, s1: Any = 0, s2: Any = 0) -> None:
        self._mode = mode
        self._n = n
        zero: Any = _ZERO if mode == "decimal" else 0
        self._s1 = s1 if n else zero
        self._s2 = s2 if n else zero

    def apply(self, value: Any) -> None:
        self._n += 1
        mode = self._mode
        if mode == "float":
            self._s1 += _numeric.float_units(value)
            if self.squares:
                self._s2 += _numeric.float_square_units(value)
        elif mode == "integer":
            self._s1 += value
            if self.squares:
                self._s2 += value * value
        else:
            exact = _numeric.EXACT
            self._s1 = exact.add(self._s1, value) if self._n > 1 else value
            if self.squares:
                sq = exact.multiply(value, value)
                self._s2 = exact.add(self._s2, sq) if self._n > 1 else sq

    def merge(self, other: Self) -> None:
        if other._mode != self._mode:
            raise IncompatibleStateError(f"cannot merge a {other._mode} {self.kind} into a {self._mode} one")
        if not other._n:
            return
        if not self._n:
            # Keeps the decimal exponents of ``other`` as they are, so merging into new() is an identity.
            self._n, self._s1, self._s2 = other._n, other._s1, other._s2
            return
        self._n += other._n
        if self._mode == "decimal":
            self._s1 = _numeric.EXACT.add(self._s1, other._s1)
            self._s2 = _numeric.EXACT.add(self._s2, other._s2)
        else:
            self._s1 += other._s1
            self._s2 += other._s2

    def copy(self) -> Self:
        return type(self)(self._mode, self._n, self._s1, self._s2)

    def size_bytes(self) -> int:
        if self._mode == "float":
            return 96 + (int(self._s1).bit_length() + int(self._s2).bit_length()) // 8
        return 128

    def _ratios(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Σx and Σx² as exact ``(numerator, denominator)`` pairs."""
        if self._mode == "float":
            return (self._s1, 1 << _numeric.FLOAT_SHIFT), (self._s2, 1 << _numeric.SQUARE_SHIFT)
        return _numeric.as_ratio(self._s1), _numeric.as_ratio(self._s2)

    def _mean(self) -> float | None:
        if not self._n:
            return None
        (a, b), _ = self._ratios()
        return _numeric.ratio_to_float(a, b * self._n)

    def _body(self) -> bytes:
        out = bytearray((NUMBER_MODE_BYTES[self._mode],))
        put_uvarint(out, self._n)
        sums = (self._s1, self._s2) if self.squares else (self._s1,)
        for s in sums:
            if self._mode == "decimal":
                put_decimal(out, s)
            elif self._mode == "float":
                put_fixed(out, s)
            else:
                put_int(out, s)
        return bytes(out)

    @classmethod
    def _decode(cls, data: bytes, tag: int, versions: frozenset[int]) -> Self:
        _, body = split_header(data, tag, versions)
        r = Reader(body)
        mode = read_number_mode(r, cls.kind)
        n = r.uvarint()
        read = {"decimal": r.decimal, "float": r.fixed, "integer": r.int_}[mode]
        s1 = read()
        s2 = read() if cls.squares else (_ZERO if mode == "decimal" else 0)
        r.end()
        if n == 0 and (s1 or s2):
            raise CorruptStateError(f"empty {cls.kind} with non-zero sums")
        return cls(mode, n, s1, s2)


class MeanState(PowerSums):
    """Exact ``n`` and ``Σx``; the value is the mean as a float, ``None`` when empty."""

    __slots__ = ()
    kind = "mean"
    tag = 5
    squares = False

    def value(self) -> float | None:
        return self._mean()


class VarianceState(PowerSums):
    """Exact ``n``, ``Σx`` and ``Σx²``; the value is a :class:`MomentsValue`."""

    __slots__ = ()
    kind = "variance"
    tag = 6
    squares = True

    def value(self) -> MomentsValue:
        n = self._n
        if not n:
            return MomentsValue(0, None, None, None, None)
        (a, b), (c, d) = self._ratios()
        # n·Σx² − (Σx)² over n², with Σx = a/b and Σx² = c/d: (n·c·b² − a²·d) / (n²·b²·d)
        m2_numerator = n * c * b * b - a * a * d
        variance = _numeric.ratio_to_float(m2_numerator, n * n * b * b * d)
        sample = _numeric.ratio_to_float(m2_numerator, n * (n - 1) * b * b * d) if n > 1 else None
        return MomentsValue(n, self._mean(), variance, math.sqrt(variance), sample)


_MAX_SUM_SIZE = {"integer": MAX_INT_SIZE, "decimal": MAX_DECIMAL_SIZE, "float": MAX_FIXED_SIZE}


def max_power_sums_bytes(spec: KindSpec, *, squares: bool) -> int:
    """The largest state a mean (``squares`` False) or a variance stores: mode byte, ``n``, then one or two
    sums, each as long as its reader accepts."""
    return HEADER_SIZE + 1 + MAX_UVARINT_SIZE + (2 if squares else 1) * _MAX_SUM_SIZE[spec.number]
