"""Shared body of ``min`` and ``max``: one value or "no value yet" (``None``), never a made-up 0.

Ties between equal values with different representations are broken so the stored bytes do not depend on
arrival order: decimals by :meth:`Decimal.compare_total` (``1.0`` vs ``1.00``); for doubles the router
already turns ``-0.0`` into ``0.0``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Self

from schemas.errors import CorruptStateError, IncompatibleStateError
from schemas.kinds._codec import DOUBLE_SIZE, MAX_DECIMAL_SIZE, MAX_INT_SIZE, Reader, put_decimal, put_double, put_int
from schemas.kinds.base import (
    HEADER_SIZE,
    NUMBER_MODE_BYTES,
    KindSpec,
    NumberMode,
    State,
    read_number_mode,
    split_header,
)


class ExtremumState(State):
    """Keeps the smallest or largest value seen; subclasses say which."""

    __slots__ = ("_mode", "_v")

    def __init__(self, mode: NumberMode, v: Any = None) -> None:
        self._mode = mode
        self._v = v

    def merge(self, other: Self) -> None:
        if other._mode != self._mode:
            raise IncompatibleStateError(f"cannot merge a {other._mode} {self.kind} into a {self._mode} one")
        if other._v is not None:
            self.apply(other._v)

    def copy(self) -> Self:
        return type(self)(self._mode, self._v)

    def value(self) -> int | Decimal | float | None:
        v: int | Decimal | float | None = self._v
        return v

    def size_bytes(self) -> int:
        return 64 if self._v is None else 96

    def _body(self) -> bytes:
        out = bytearray((NUMBER_MODE_BYTES[self._mode],))
        v = self._v
        if v is None:
            out.append(0)
            return bytes(out)
        out.append(1)
        if self._mode == "integer":
            put_int(out, v)
        elif self._mode == "decimal":
            put_decimal(out, v)
        else:
            put_double(out, v)
        return bytes(out)

    @classmethod
    def _decode(cls, data: bytes, tag: int, versions: frozenset[int]) -> Self:
        _, body = split_header(data, tag, versions)
        r = Reader(body)
        mode = read_number_mode(r, cls.kind)
        present = r.byte()
        v: int | Decimal | float | None
        if present == 0:
            v = None
        elif present != 1:
            raise CorruptStateError(f"{cls.kind} presence byte is {present}")
        elif mode == "integer":
            v = r.int_()
        elif mode == "decimal":
            v = r.decimal()
        else:
            v = r.double()
            if v != v or v in (float("inf"), float("-inf")):
                raise CorruptStateError(f"{cls.kind} holds a non-finite double")
        r.end()
        return cls(mode, v)


class MinState(ExtremumState):
    """Smallest value seen, or ``None``."""

    __slots__ = ()
    kind = "min"
    tag = 3

    def apply(self, value: Any) -> None:
        v = self._v
        if v is None or value < v or (value == v and type(value) is Decimal and value.compare_total(v) < 0):
            self._v = value


class MaxState(ExtremumState):
    """Largest value seen, or ``None``."""

    __slots__ = ()
    kind = "max"
    tag = 4

    def apply(self, value: Any) -> None:
        v = self._v
        if v is None or value > v or (value == v and type(value) is Decimal and value.compare_total(v) > 0):
            self._v = value


_MAX_VALUE_SIZE = {"integer": MAX_INT_SIZE, "decimal": MAX_DECIMAL_SIZE, "float": DOUBLE_SIZE}


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a min or max stores (mode byte, presence byte, value): its reader refuses a longer one."""
    return HEADER_SIZE + 2 + _MAX_VALUE_SIZE[spec.number]
