"""Kafka record batches (format v2) as a producer writes them, and as some write them that aiokafka cannot:
for tests of what countersink reads from a fetch."""

from __future__ import annotations

import struct

from aiokafka import codec
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_HEADER_SIZE = 61
_CONTROL = 0x20
_ENCODE = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
# In a header name, replaced by as many bytes that are no UTF-8 (FF ...): a text no other part of a test's batch
# holds (two bytes such as 01 02 are also a null value followed by one header).
PLACEHOLDER = "\x7f<not-utf8>\x7f"
NOT_UTF8 = b"\xff<not-utf8>\xff"
ESCAPED = NOT_UTF8.decode("utf-8", "surrogateescape")  # the name as read
REPLACED = NOT_UTF8.decode("utf-8", "replace")  # the name as a dead letter carries it

Header = tuple[str, bytes | None]
RecordSpec = tuple[int, bytes | None, bytes | None, list[Header]]


def batch_bytes(records: list[RecordSpec], compression: int = 0, bad_names: bool = False,
                base_offset: int = 0, log_append_time: int | None = None, producer_id: int = -1,
                transactional: bool = False, control: bool = False) -> bytes:
    """A v2 batch of ``records`` (timestamp, key, value, headers) as a producer writes it. ``bad_names``: each
    header name's :data:`PLACEHOLDER` becomes :data:`NOT_UTF8`, which no producer can write."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(transactional),
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=10 ** 7)
    for delta, (timestamp, key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=timestamp, key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    body = bytes(raw[_HEADER_SIZE:])
    if bad_names:
        body = body.replace(PLACEHOLDER.encode(), NOT_UTF8)
    if compression:
        body = _ENCODE[compression](body)
    raw = raw[:_HEADER_SIZE] + body
    struct.pack_into(">q", raw, 0, base_offset)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    attributes = struct.unpack_from(">h", raw, _ATTRIBUTES_OFFSET)[0] | compression
    if log_append_time is not None:
        attributes |= 0x08
        struct.pack_into(">q", raw, 35, log_append_time)
    if control:
        attributes |= _CONTROL
    struct.pack_into(">h", raw, _ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", raw, _CRC_OFFSET, calc_crc32c(bytes(raw[_ATTRIBUTES_OFFSET:])))
    return bytes(raw)


def transaction_marker(offset: int, producer_id: int, commit: bool) -> bytes:
    """The control batch a transaction's coordinator writes to end it: commit or abort."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    return batch_bytes([(1, key, struct.pack(">hi", 0, 0), [])], base_offset=offset, producer_id=producer_id,
                       transactional=True, control=True)
