"""Reading fetched Kafka records whose header names are not UTF-8.

Kafka's record format gives a header name as bytes; the Java client writes only UTF-8, but librdkafka and Go
clients write any bytes. aiokafka's record reader decodes each name strictly: one such record raises
``UnicodeDecodeError`` out of every fetch of its partition, before countersink sees a record, so the partition
stalls for good. :func:`install` makes aiokafka's fetcher read through :class:`TolerantMemoryRecords`: a batch is
read by aiokafka's own (compiled) reader as before, and only a batch it fails to read for a header name is read
again here, its names decoded with ``surrogateescape``. Such a name equals no name a definition can give (TOML
and JSON text hold no lone surrogates), so ``@header.NAME`` never reads it; the record is counted as any other.
:func:`sendable_header_name` gives a dead letter a name a producer can send.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
from aiokafka import codec
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecord
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import decode_varint

from countersink.logs import get_logger

log = get_logger(__name__)

# Record batch v2 (KIP-98): baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc
# uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64, producerId int64,
# producerEpoch int16, baseSequence int32, recordCount int32; then the records (compressed as a whole).
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # baseOffset and batchLength: a batch's size is batchLength + 12
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_DECOMPRESS = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}


def install() -> None:
    """Make every aiokafka consumer of this process read fetched records through :class:`TolerantMemoryRecords`
    (idempotent). Fails loudly if aiokafka no longer reads them where this expects."""
    current = getattr(_fetcher, "MemoryRecords", None)
    if current is TolerantMemoryRecords:
        return
    if current is not MemoryRecords:
        raise RuntimeError("aiokafka's fetcher no longer reads records with MemoryRecords: the tolerant reader of "
                           "header names cannot be installed")
    _fetcher.MemoryRecords = TolerantMemoryRecords


def sendable_header_name(name: str) -> str:
    """``name`` as a producer can send it: a name read with undecodable bytes has each replaced by U+FFFD."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return name


class TolerantMemoryRecords:
    """aiokafka's ``MemoryRecords`` over a fetch response's bytes, whose v2 batches fall back to
    :func:`read_batch` when aiokafka's reader fails on a header name."""

    __slots__ = ("_data", "_position", "_records")

    def __init__(self, data: bytes) -> None:
        self._records = MemoryRecords(data)
        self._data = data
        self._position = 0

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None:
            return None
        start = self._position
        base_offset, length = struct.unpack_from(">qi", self._data, start)
        self._position = start + _LOG_OVERHEAD + length
        if base_offset != batch.base_offset:
            # Not where this expected the batch to start: leave every later batch to aiokafka alone.
            self._position = len(self._data) + 1
            return batch
        if getattr(batch, "magic", 2) != 2:
            return batch  # message formats 0 and 1 have no headers
        return _TolerantBatch(batch, memoryview(self._data)[start:self._position])


class _TolerantBatch:
    """One v2 batch: aiokafka's, read again by :func:`read_batch` from the first record it cannot read."""

    __slots__ = ("_batch", "_raw")

    def __init__(self, batch: Any, raw: memoryview) -> None:
        self._batch = batch
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __next__(self) -> Any:  # the fetcher reads a control batch's first record with next()
        return next(self._batch)

    def __iter__(self) -> Iterator[Any]:
        read_through = -1
        try:
            for record in self._batch:
                read_through = record.offset
                yield record
        except UnicodeDecodeError as exc:
            log.warning("header_name_not_utf8", base_offset=self._batch.base_offset, after_offset=read_through,
                        error=str(exc))
            for record in read_batch(self._raw):
                if record.offset > read_through:
                    yield record


def read_batch(raw: memoryview | bytes) -> Iterator[DefaultRecord]:
    """The records of one v2 batch, header names decoded with ``surrogateescape``; the batch's checksum is
    aiokafka's to check (the fetcher does, before reading it)."""
    (base_offset, _length, _epoch, magic, _crc, attributes, _last_delta, first_timestamp, max_timestamp,
     _producer, _producer_epoch, _sequence, count) = _BATCH_HEADER.unpack_from(raw)
    if magic != 2:
        raise CorruptRecordException(f"not a v2 record batch (magic {magic})")
    body: bytes = bytes(raw[_BATCH_HEADER.size:])
    compression = attributes & _CODEC_MASK
    if compression:
        body = _DECOMPRESS[compression](body)
    log_append_time = bool(attributes & _LOG_APPEND_TIME)
    timestamp_type = 1 if log_append_time else 0
    buffer = memoryview(body)
    position = 0
    for _ in range(count):
        length, position = decode_varint(buffer, position)
        end = position + length
        position += 1  # attributes: unused
        timestamp_delta, position = decode_varint(buffer, position)
        offset_delta, position = decode_varint(buffer, position)
        key, position = _bytes_at(buffer, position)
        value, position = _bytes_at(buffer, position)
        header_count, position = decode_varint(buffer, position)
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(header_count):
            name, position = _bytes_at(buffer, position)
            header, position = _bytes_at(buffer, position)
            headers.append(((name or b"").decode("utf-8", "surrogateescape"), header))
        if position != end:
            raise CorruptRecordException(f"the record at offset {base_offset + offset_delta} does not end where "
                                         "its length says")
        timestamp = max_timestamp if log_append_time else first_timestamp + timestamp_delta
        yield DefaultRecord(base_offset + offset_delta, timestamp, timestamp_type, key, value, headers)


def _bytes_at(buffer: memoryview, position: int) -> tuple[bytes | None, int]:
    """A varint length then that many bytes (-1: null)."""
    length, position = decode_varint(buffer, position)
    if length < 0:
        return None, position
    return bytes(buffer[position:position + length]), position + length
