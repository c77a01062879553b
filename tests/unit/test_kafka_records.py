"""Fetched batches holding a header name that is not UTF-8 are read whole, not failed: aiokafka's reader as
before, and the tolerant reader, which reads every record as aiokafka's does, from the first it cannot."""

from __future__ import annotations

import aiokafka.consumer.fetcher as fetcher
import pytest
from aiokafka.record.memory_records import MemoryRecords
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.applying import Record
from consumer.dead_letters import dead_letter_headers
from countersink import kafka_records
from countersink.kafka_records import TolerantMemoryRecords, read_batch, sendable_header_name
from schemas.errors import UnparseableEventError
from tests.record_batches import PLACEHOLDER, RecordSpec, batch_bytes


def as_tuples(records: object) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)) for r in records]


def aiokafka_read(data: bytes) -> list[tuple[object, ...]]:
    memory = MemoryRecords(data)
    read = []
    while memory.has_next():
        batch = memory.next_batch()
        assert batch.validate_crc()
        read += as_tuples(batch)
    return read


def tolerant_read(data: bytes) -> list[tuple[object, ...]]:
    memory = TolerantMemoryRecords(data)
    read = []
    while memory.has_next():
        batch = memory.next_batch()
        assert batch.validate_crc()
        read += as_tuples(batch)
    return read


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
payloads = st.none() | st.binary(max_size=40)
record_specs = st.lists(st.tuples(st.integers(0, 2 ** 41), payloads, payloads,
                                  st.lists(st.tuples(texts, payloads), max_size=3)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(records=record_specs, compression=st.sampled_from([0, 1, 2, 3, 4]), base=st.integers(0, 2 ** 40),
       append_time=st.none() | st.integers(0, 2 ** 41))
def test_the_tolerant_reader_reads_every_batch_as_aiokafka_does(records: list[RecordSpec], compression: int,
                                                                base: int, append_time: int | None) -> None:
    data = batch_bytes(records, compression, base_offset=base, log_append_time=append_time)
    expected = aiokafka_read(data)
    assert as_tuples(read_batch(data)) == expected
    assert tolerant_read(data + data) == expected + expected


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_a_header_name_that_is_no_utf8_is_read_with_its_bytes_escaped(compression: int) -> None:
    records: list[RecordSpec] = [
        (1000, b"k", b"first", [("ok", b"1")]),
        (2000, None, b"second", [(f"x{PLACEHOLDER}y", b"2"), ("n", None)]),
        (3000, b"k", None, []),
    ]
    spoiled = batch_bytes(records, compression, bad_names=True, base_offset=40)
    with pytest.raises(UnicodeDecodeError):
        aiokafka_read(spoiled)  # what stalled the partition
    after = batch_bytes([(4000, b"k", b"fourth", [("ok", b"4")])], compression, base_offset=43)
    read = tolerant_read(spoiled + after)
    assert read == [
        (40, 1000, 0, b"k", b"first", [("ok", b"1")]),
        (41, 2000, 0, None, b"second", [("x\udcc3(y", b"2"), ("n", None)]),
        (42, 3000, 0, b"k", None, []),
        (43, 4000, 0, b"k", b"fourth", [("ok", b"4")]),
    ]


def test_a_control_batch_is_still_read_with_next() -> None:
    data = batch_bytes([(1, b"\x00\x00\x00\x00", b"", [])])
    batch = TolerantMemoryRecords(data).next_batch()
    assert next(batch).key == b"\x00\x00\x00\x00"


def test_the_fetcher_reads_through_the_tolerant_reader_once_installed() -> None:
    kafka_records.install()
    kafka_records.install()
    assert fetcher.MemoryRecords is TolerantMemoryRecords


def test_a_dead_letter_names_such_a_header_as_a_producer_can_send_it() -> None:
    assert sendable_header_name("plain") == "plain"
    assert sendable_header_name("x\udcc3(y") == "x\ufffd(y"
    record = Record(7, b"{", None, None, [("x\udcc3(y", b"2"), ("ok", b"1")])
    headers = dead_letter_headers("t", 0, record, UnparseableEventError("$", "not JSON"))
    assert [(name, value) for name, value in headers if not name.startswith("countersink.")] == [
        ("x\ufffd(y", b"2"), ("ok", b"1")]
    for name, _ in headers:
        name.encode()
