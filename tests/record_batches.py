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
_ENCODE = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
PLACEHOLDER = "\x01\x02"  # two bytes in UTF-8, replaced by two that are no UTF-8

Header = tuple[str, bytes | None]
RecordSpec = tuple[int, bytes | None, bytes | None, list[Header]]


def batch_bytes(records: list[RecordSpec], compression: int = 0, bad_names: bool = False,
                base_offset: int = 0, log_append_time: int | None = None) -> bytes:
    """A v2 batch of ``records`` (timestamp, key, value, headers) as a producer writes it. ``bad_names``: each
    header name's :data:`PLACEHOLDER` becomes the bytes ``C3 28`` (no UTF-8), which no producer can write."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=10 ** 7)
    for delta, (timestamp, key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=timestamp, key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    body = bytes(raw[_HEADER_SIZE:])
    if bad_names:
        body = body.replace(PLACEHOLDER.encode(), b"\xc3\x28")
    if compression:
        body = _ENCODE[compression](body)
    raw = raw[:_HEADER_SIZE] + body
    struct.pack_into(">q", raw, 0, base_offset)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    attributes = struct.unpack_from(">h", raw, _ATTRIBUTES_OFFSET)[0] | compression
    if log_append_time is not None:
        attributes |= 0x08
        struct.pack_into(">q", raw, 35, log_append_time)
    struct.pack_into(">h", raw, _ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", raw, _CRC_OFFSET, calc_crc32c(bytes(raw[_ATTRIBUTES_OFFSET:])))
    return bytes(raw)
