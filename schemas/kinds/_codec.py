"""Byte encoding shared by the kinds: LEB128 varints, zigzag big integers, IEEE doubles, decimals.

Every reader checks lengths before it allocates, because state bytes can come from other processes and
other versions, and a corrupt length must become :class:`CorruptStateError`, not a 4 GiB allocation.
"""

import struct
import zlib
from decimal import Decimal

from schemas.errors import CorruptStateError

_DOUBLE = struct.Struct(">d")

# 600 bytes hold a 4,800-bit integer: more than the 2×1074+1024-bit fixed-point sums of squares of any
# finite double, so a longer integer can only be corruption.
MAX_INT_BYTES = 600
_MAX_UVARINT_BYTES = 10
# A decimal's exponent beyond this is corrupt (no supported value has one: single values are within ±100).
MAX_DECIMAL_EXPONENT = 1_000_000


def uvarint_size(n: int) -> int:
    """Bytes :func:`put_uvarint` writes for ``n``."""
    return max(1, (n.bit_length() + 6) // 7)


def int_size(n: int) -> int:
    """Bytes :func:`put_int` writes for ``n``."""
    size = ((n << 1 if n >= 0 else ((-n) << 1) - 1).bit_length() + 7) // 8
    return uvarint_size(size) + size


# The longest encodings the readers below accept: a longer one is refused as corrupt, so no stored state holds
# one. They bound the stored size of a kind's state (each kind's ``max_stored_bytes``).
MAX_UVARINT_SIZE = _MAX_UVARINT_BYTES
MAX_INT_SIZE = uvarint_size(MAX_INT_BYTES) + MAX_INT_BYTES
MAX_FIXED_SIZE = MAX_INT_SIZE + uvarint_size(MAX_INT_BYTES * 8)
MAX_DECIMAL_SIZE = MAX_INT_SIZE + int_size(MAX_DECIMAL_EXPONENT)
DOUBLE_SIZE = 8


def blob_size(size: int) -> int:
    """Bytes :func:`put_blob` writes for a blob of ``size`` bytes."""
    return uvarint_size(size) + 4 + size


def put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def put_int(out: bytearray, n: int) -> None:
    """Append a signed integer of any size: zigzag, then length-prefixed big-endian magnitude."""
    z = n << 1 if n >= 0 else ((-n) << 1) - 1
    size = (z.bit_length() + 7) // 8
    put_uvarint(out, size)
    out += z.to_bytes(size, "big")


def put_fixed(out: bytearray, n: int) -> None:
    """Append a binary fixed-point integer as odd mantissa and trailing-zero count.

    Sums of doubles are held in units of 2**-1074, so 100.0 is a 1,081-bit integer that is mostly
    trailing zeros; this stores it in three bytes instead of 136, and the form is still canonical.
    """
    shift = (n & -n).bit_length() - 1 if n else 0
    put_int(out, n >> shift)
    put_uvarint(out, shift)


def put_blob(out: bytearray, blob: bytes) -> None:
    """Append a length-prefixed, CRC-32-checked blob (a sketch library's own serialization).

    The sketch libraries' readers trust their input more than a store should: the KLL reader crashes the
    process on some truncated buffers. A blob whose length or checksum does not match is refused here,
    before the library sees it.
    """
    put_uvarint(out, len(blob))
    out += zlib.crc32(blob).to_bytes(4, "big")
    out += blob


def put_double(out: bytearray, x: float) -> None:
    out += _DOUBLE.pack(x)


def put_decimal(out: bytearray, d: Decimal) -> None:
    sign, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"non-finite decimal {d!r} cannot be stored")
    coefficient = int("".join(map(str, digits))) if digits else 0
    put_int(out, -coefficient if sign else coefficient)
    put_int(out, exponent)


class Reader:
    """A cursor over a state body; every read raises :class:`CorruptStateError` on short or bad input."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = bytes(data)
        self._pos = 0

    def byte(self) -> int:
        if self._pos >= len(self._data):
            raise CorruptStateError("state body is truncated")
        b = self._data[self._pos]
        self._pos += 1
        return b

    def uvarint(self) -> int:
        n = 0
        for i in range(_MAX_UVARINT_BYTES):
            b = self.byte()
            n |= (b & 0x7F) << (7 * i)
            if b < 0x80:
                return n
        raise CorruptStateError("varint longer than 64 bits")

    def take(self, size: int) -> bytes:
        if size < 0 or self._pos + size > len(self._data):
            raise CorruptStateError(f"state body is truncated: wanted {size} bytes")
        chunk = self._data[self._pos : self._pos + size]
        self._pos += size
        return chunk

    def int_(self) -> int:
        size = self.uvarint()
        if size > MAX_INT_BYTES:
            raise CorruptStateError(f"integer of {size} bytes exceeds the {MAX_INT_BYTES}-byte limit")
        z = int.from_bytes(self.take(size), "big")
        return z >> 1 if not z & 1 else -((z + 1) >> 1)

    def fixed(self) -> int:
        mantissa = self.int_()
        shift = self.uvarint()
        if shift > MAX_INT_BYTES * 8:
            raise CorruptStateError(f"fixed-point shift {shift} is out of range")
        return mantissa << shift

    def blob(self, limit: int) -> bytes:
        size = self.uvarint()
        if size > limit:
            raise CorruptStateError(f"blob of {size} bytes exceeds the {limit}-byte limit")
        crc = int.from_bytes(self.take(4), "big")
        blob = self.take(size)
        if zlib.crc32(blob) != crc:
            raise CorruptStateError("blob checksum does not match: the state is corrupt")
        return blob

    def double(self) -> float:
        value: float = _DOUBLE.unpack(self.take(8))[0]
        return value

    def decimal(self) -> Decimal:
        coefficient = self.int_()
        exponent = self.int_()
        if abs(exponent) > MAX_DECIMAL_EXPONENT:
            raise CorruptStateError(f"decimal exponent {exponent} is out of range")
        sign = 1 if coefficient < 0 else 0
        digits = tuple(int(c) for c in str(abs(coefficient)))
        return Decimal((sign, digits, exponent))

    def rest(self) -> bytes:
        chunk = self._data[self._pos :]
        self._pos = len(self._data)
        return chunk

    def end(self) -> None:
        if self._pos != len(self._data):
            raise CorruptStateError(f"{len(self._data) - self._pos} unexpected bytes after the state body")
