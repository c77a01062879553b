"""``count``: how many events matched the counter; the value field is not read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from schemas.kinds._codec import MAX_UVARINT_SIZE, Reader, put_uvarint
from schemas.kinds.base import HEADER_SIZE, KindSpec, State, split_header

TAG = 2
VERSIONS = frozenset({1})


class CountState(State):
    """Exact event count (an int)."""

    __slots__ = ("_n",)
    kind = "count"
    tag = TAG

    def __init__(self, n: int = 0) -> None:
        self._n = n

    def apply(self, value: object = None) -> None:
        self._n += 1

    def merge(self, other: Self) -> None:
        self._n += other._n

    def copy(self) -> Self:
        return type(self)(self._n)

    def value(self) -> int:
        return self._n

    def size_bytes(self) -> int:
        return 48

    def _body(self) -> bytes:
        out = bytearray()
        put_uvarint(out, self._n)
        return bytes(out)


def new(spec: KindSpec) -> CountState:
    """Return a count of zero."""
    return CountState()


def state_from_bytes(data: bytes) -> CountState:
    """Decode bytes written by :meth:`CountState.to_bytes`."""
    _, body = split_header(data, TAG, VERSIONS)
    r = Reader(body)
    state = CountState(r.uvarint())
    r.end()
    return state


def merged_from_bytes(blobs: Sequence[bytes]) -> CountState:
    """The merge of stored counts in one pass, without a state per blob; a blob in any form this pass does
    not read itself is decoded by :func:`state_from_bytes` (which says what is wrong with it)."""
    total = 0
    for blob in blobs:
        # <<TAG, version 1, a count under 128 (one varint byte)>>
        if len(blob) == 3 and blob[1] == 1 and blob[2] < 0x80:
            total += blob[2]
        else:
            total += state_from_bytes(blob).value()
    return CountState(total)


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a count stores: its reader refuses a longer one."""
    return HEADER_SIZE + MAX_UVARINT_SIZE
