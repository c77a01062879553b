"""Reading fetched Kafka records whose header names are not UTF-8.

Kafka's record format gives a header name as bytes; the Java client writes only UTF-8, but librdkafka and Go
clients write any bytes. aiokafka's record reader decodes each name strictly: one such record raises
``UnicodeDecodeError`` out of every fetch of its partition, before countersink sees a record, so the partition
stalls for good. :func:`install` makes aiokafka's fetcher keep each fetch's bytes (:class:`TolerantMemoryRecords`)
and read them through :class:`TolerantPartitionRecords`: aiokafka's own (compiled) reader reads every batch as
before, at no cost, and only when it fails for a header name is that batch read again here, from the record it
failed on, its names decoded with ``surrogateescape``. Such a name equals no name a definition can give (TOML
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
_ENTRY = struct.Struct(">qi")  # every message format's batch starts so: its offset, then its size after these
_LOG_OVERHEAD = _ENTRY.size
_MAGIC_AT = 16
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_DECOMPRESS = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}


class TolerantMemoryRecords(MemoryRecords):  # type: ignore[misc]
    """aiokafka's ``MemoryRecords`` (its compiled reader of a fetch's batches), keeping the fetch's bytes for
    :class:`TolerantPartitionRecords` to read a batch again."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data


class TolerantPartitionRecords(_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's records of one partition's fetch, read on past a batch its reader fails on for a header name.

    aiokafka reads the fetch with one generator (``_unpack_records``: transactions, control batches, the
    records), which dies with the error. The batch it failed in is the first whose next offset is past the
    last record handed out (every earlier batch was read whole); it is read by :func:`read_batch` from there,
    then a new generator reads on from the batch after it, where aiokafka's reader stands."""

    _records_iterator: Iterator[Any]  # None once read to the end, as aiokafka leaves it; never read again then
    next_fetch_offset: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fetched_from = self.next_fetch_offset  # the offset the fetch asked for
        self._read_again_at: tuple[int, int] | None = None  # the last batch read again: where, and from which offset

    def __next__(self) -> Any:
        while True:
            try:
                return next(self._records_iterator)
            except StopIteration:
                self._records_iterator = None  # type: ignore[assignment]
                raise
            except UnicodeDecodeError as exc:  # again for each such batch: each read on starts past the last
                self._records_iterator = self._read_on(exc)

    def _read_on(self, error: UnicodeDecodeError) -> Iterator[Any]:
        found = (_batch_after(self._records.data, self.next_fetch_offset, self._fetched_from)
                 if isinstance(self._records, TolerantMemoryRecords) else None)
        # A broker answers a fetch from the batch holding the offset asked for, so no batch lies wholly before
        # it and the batch found is the one aiokafka failed in. Should that not hold (a batch wholly before it,
        # a batch found without such a name, or the one read on from last time failing again), aiokafka's error
        # stands: the partition stops rather than read a batch twice or skip one.
        if found is None or found[2] == self._read_again_at:
            raise error
        raw, next_offset, self._read_again_at = found
        records = list(read_batch(raw))  # read once: checked, then handed out
        if not any(_not_utf8(name) for record in records for name, _ in record.headers):
            raise error
        log.warning("header_name_not_utf8", topic=self._tp.topic, partition=self._tp.partition,
                    offset=self.next_fetch_offset, error=str(error))
        return self._then(records, next_offset, self._unpack_records())

    def _then(self, records: list[DefaultRecord], next_offset: int, rest: Iterator[Any]) -> Iterator[Any]:
        for record in records:
            if record.offset < self.next_fetch_offset:
                continue  # handed out before the error, or before the offset the fetch started at
            consumer_record = self._consumer_record(self._tp, record)
            self.next_fetch_offset = record.offset + 1
            yield consumer_record
        self.next_fetch_offset = next_offset
        yield from rest


def install() -> None:
    """Make every aiokafka consumer of this process read fetched records as :class:`TolerantPartitionRecords`
    (idempotent). Fails loudly if aiokafka no longer reads them where and as this expects."""
    if _fetcher.PartitionRecords is TolerantPartitionRecords:
        return
    expected = (_fetcher.MemoryRecords is MemoryRecords
                and TolerantPartitionRecords.__bases__ == (_fetcher.PartitionRecords,)
                and all(callable(getattr(_fetcher.PartitionRecords, name, None))
                        for name in ("_unpack_records", "_consumer_record", "__next__")))
    if not expected:
        raise RuntimeError("aiokafka's fetcher no longer reads records as countersink.kafka_records expects: the "
                           "tolerant reader of header names cannot be installed")
    _fetcher.MemoryRecords = TolerantMemoryRecords
    _fetcher.PartitionRecords = TolerantPartitionRecords


def sendable_header_name(name: str) -> str:
    """``name`` as a producer can send it: a name read with undecodable bytes has each replaced by U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if _not_utf8(name) else name


def _not_utf8(name: str) -> bool:
    """Whether ``name`` was read from bytes that are not UTF-8 (its undecodable bytes kept as lone surrogates)."""
    if name.isascii():
        return False
    try:
        name.encode()
    except UnicodeEncodeError:
        return True
    return False


def _batch_after(data: bytes, offset: int, fetched_from: int) -> tuple[memoryview, int, tuple[int, int]] | None:
    """The bytes, next offset and place (where it starts, and ``offset``) of the first v2 batch in ``data``
    whose next offset is past ``offset``; None if there is none, if ``data`` is cut short before it, or if a
    batch before it ends before ``fetched_from`` (no broker answers so)."""
    position = 0
    while position + _BATCH_HEADER.size <= len(data):
        base_offset, size = _ENTRY.unpack_from(data, position)
        end = position + _LOG_OVERHEAD + size
        if end > len(data):
            return None
        if data[position + _MAGIC_AT] == 2:
            next_offset = base_offset + _LAST_OFFSET_DELTA.unpack_from(data, position + _LAST_OFFSET_DELTA_AT)[0] + 1
            if next_offset <= fetched_from:
                return None
            if next_offset > offset:
                return memoryview(data)[position:end], next_offset, (position, offset)
        position = end
    return None


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
            if name is None:
                raise CorruptRecordException(f"a header of the record at offset {base_offset + offset_delta} has "
                                             "no name")
            header, position = _bytes_at(buffer, position)
            headers.append((name.decode("utf-8", "surrogateescape"), header))
        if position != end:
            raise CorruptRecordException(f"the record at offset {base_offset + offset_delta} does not end where "
                                         "its length says")
        timestamp = max_timestamp if log_append_time else first_timestamp + timestamp_delta
        yield DefaultRecord(base_offset + offset_delta, timestamp, timestamp_type, key, value, headers)
    if position != len(buffer):
        raise CorruptRecordException(f"the batch at offset {base_offset} holds more than its {count} records")


def _bytes_at(buffer: memoryview, position: int) -> tuple[bytes | None, int]:
    """A varint length then that many bytes (-1: null)."""
    length, position = decode_varint(buffer, position)
    if length < 0:
        return None, position
    return bytes(buffer[position:position + length]), position + length
