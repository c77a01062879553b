"""Fetched batches holding a header name that is not UTF-8 are read whole, not failed: aiokafka's reader reads
every batch as before, and a batch it fails on is read again from the record it failed on, as aiokafka reads a
batch, through the fetcher's own reading of a partition's fetch (transactions, control batches, offsets)."""

from __future__ import annotations

from typing import Any

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.applying import Record
from consumer.dead_letters import dead_letter_headers
from countersink import kafka_records
from countersink.kafka_records import TolerantMemoryRecords, TolerantPartitionRecords, read_batch, sendable_header_name
from schemas.errors import UnparseableEventError
from tests.record_batches import ESCAPED, PLACEHOLDER, REPLACED, RecordSpec, batch_bytes, transaction_marker

TP = TopicPartition("events", 0)
AIOKAFKA_PARTITION_RECORDS = TolerantPartitionRecords.__bases__[0]  # the fetcher's, whether installed or not
Read = list[tuple[object, ...]]


def as_tuples(records: Any) -> Read:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)) for r in records]


def fetched(data: bytes, *, tolerant: bool = True, fetch_offset: int = 0, committed_only: bool = False,
            aborted: list[tuple[int, int]] | None = None) -> tuple[Read, int]:
    """The records the fetcher hands out of one partition's fetch ``data``, and where it fetches next."""
    records_class, partition_class = ((TolerantMemoryRecords, TolerantPartitionRecords) if tolerant
                                      else (MemoryRecords, AIOKAFKA_PARTITION_RECORDS))
    partition = partition_class(TP, records_class(data), aborted, fetch_offset, None, None, True,
                                READ_COMMITTED if committed_only else READ_UNCOMMITTED)
    return as_tuples(partition), partition.next_fetch_offset


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
payloads = st.none() | st.binary(max_size=40)
record_specs = st.lists(st.tuples(st.integers(0, 2 ** 41), payloads, payloads,
                                  st.lists(st.tuples(texts, payloads), max_size=3)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(records=record_specs, compression=st.sampled_from([0, 1, 2, 3, 4]), base=st.integers(0, 2 ** 40),
       append_time=st.none() | st.integers(0, 2 ** 41))
def test_the_batch_reader_reads_every_batch_as_aiokafka_does(records: list[RecordSpec], compression: int,
                                                             base: int, append_time: int | None) -> None:
    data = batch_bytes(records, compression, base_offset=base, log_append_time=append_time)
    after = batch_bytes(records, compression, base_offset=base + len(records), log_append_time=append_time)
    expected, _ = fetched(data, tolerant=False)
    assert as_tuples(read_batch(data)) == expected
    assert fetched(data + after) == fetched(data + after, tolerant=False)


def _spoiled(base: int, compression: int) -> tuple[bytes, Read]:
    """A batch of three records, the second with a header name that is no UTF-8, and what reading it gives."""
    data = batch_bytes([
        (1000, b"k", b"first", [("ok", b"1")]),
        (2000, None, b"second", [(f"x{PLACEHOLDER}y", b"2"), ("n", None)]),
        (3000, b"k", None, []),
    ], compression, bad_names=True, base_offset=base)
    return data, [
        (base, 1000, 0, b"k", b"first", [("ok", b"1")]),
        (base + 1, 2000, 0, None, b"second", [(f"x{ESCAPED}y", b"2"), ("n", None)]),
        (base + 2, 3000, 0, b"k", None, []),
    ]


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_a_header_name_that_is_no_utf8_is_read_with_its_bytes_escaped(compression: int) -> None:
    spoiled, spoiled_read = _spoiled(40, compression)
    with pytest.raises(UnicodeDecodeError):
        fetched(spoiled, tolerant=False)  # what stalled the partition: every fetch of it failed
    after = batch_bytes([(4000, b"k", b"fourth", [("ok", b"4")])], compression, base_offset=43)
    fourth = (43, 4000, 0, b"k", b"fourth", [("ok", b"4")])
    assert fetched(spoiled + after) == ([*spoiled_read, fourth], 44)
    # a fetch from the middle of the batch, as after a commit there
    assert fetched(spoiled + after, fetch_offset=42) == ([spoiled_read[2], fourth], 44)
    # another such batch right after the first
    second, second_read = _spoiled(43, compression)
    after = batch_bytes([(4000, b"k", b"fourth", [("ok", b"4")])], compression, base_offset=46)
    assert fetched(spoiled + second + after) == ([*spoiled_read, *second_read, (46, *fourth[1:])], 47)


def test_an_aborted_transaction_with_such_a_name_is_skipped_and_a_committed_one_read() -> None:
    aborted = batch_bytes([(1, None, b"aborted", [(PLACEHOLDER, b"a")])], bad_names=True, base_offset=0,
                          producer_id=7, transactional=True)
    committed = batch_bytes([(2, None, b"kept", [(PLACEHOLDER, b"c")])], bad_names=True, base_offset=2,
                            producer_id=8, transactional=True)
    data = aborted + transaction_marker(1, 7, commit=False) + committed + transaction_marker(3, 8, commit=True)
    assert fetched(data, committed_only=True, aborted=[(7, 0)]) == ([(2, 2, 0, None, b"kept", [(ESCAPED, b"c")])], 4)
    assert fetched(data) == ([(0, 1, 0, None, b"aborted", [(ESCAPED, b"a")]),
                              (2, 2, 0, None, b"kept", [(ESCAPED, b"c")])], 4)


@pytest.mark.parametrize("compression", [0, 1])
def test_message_formats_0_and_1_are_read_as_aiokafka_reads_them(compression: int) -> None:
    """A log written before message format 2 (no headers) holds such batches."""
    old = []
    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=compression, batch_size=10 ** 6)
        for offset in range(3):
            builder.append(offset + 3 * magic, timestamp=1000 + offset if magic else None, key=b"k",
                           value=b"old %d" % offset)
        old.append(bytes(builder.build()))
    data = old[0] + old[1]
    assert fetched(data) == fetched(data, tolerant=False)
    assert [record[0] for record in fetched(data)[0]] == [0, 1, 2, 3, 4, 5]


def test_the_fetcher_reads_through_the_tolerant_reader_once_installed() -> None:
    kafka_records.install()
    kafka_records.install()
    assert fetcher.MemoryRecords is TolerantMemoryRecords
    assert fetcher.PartitionRecords is TolerantPartitionRecords


def test_a_dead_letter_names_such_a_header_as_a_producer_can_send_it() -> None:
    assert sendable_header_name("plain") == "plain"
    assert sendable_header_name(f"x{ESCAPED}y") == f"x{REPLACED}y" == "x\ufffd<not-utf8>\ufffdy"
    record = Record(7, b"{", None, None, [(f"x{ESCAPED}y", b"2"), ("ok", b"1")])
    headers = dead_letter_headers("t", 0, record, UnparseableEventError("$", "not JSON"))
    assert [(name, value) for name, value in headers if not name.startswith("countersink.")] == [
        (f"x{REPLACED}y", b"2"), ("ok", b"1")]
    for name, _ in headers:
        name.encode()


def test_a_batch_holding_more_than_its_record_count_is_refused_as_aiokafka_refuses_it() -> None:
    import struct

    from aiokafka.errors import CorruptRecordException
    from aiokafka.record.util import calc_crc32c

    data = bytearray(batch_bytes([(1, None, b"one", []), (2, None, b"two", [])]))
    struct.pack_into(">i", data, 57, 1)  # the record count: one, where two follow
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    with pytest.raises(CorruptRecordException):
        fetched(bytes(data), tolerant=False)
    with pytest.raises(CorruptRecordException):
        list(read_batch(bytes(data)))
