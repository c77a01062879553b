"""A record whose decision raises what no refusal should (a defect met on its bytes) is a dead letter, on the
batch path and the router alike, and the records after it are counted: deciding a record is pure, so raising
would stop its partition at every restart. What is not the record's (a server, the process) still raises."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from consumer.applying import Applier, Mutator, Outcome, Record, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from countersink.metrics import METRICS
from schemas import events
from schemas.definitions import parse_definitions
from schemas.errors import UndecidableRecordError
from schemas.events import EventRouter
from schemas.formats import SchemaCache, SchemaNotLoadedError, WriterSchema, decoders, frame
from tests.unit.test_each_counter import mutator as mutator_of
from tests.unit.test_formats import avro_bytes

COUNTERS = """
[[counter]]
name = "clicks_hourly"
topics = ["clicks"]
kind = "count"
key = ["page"]
bucket = { field = "at", size = "1h" }
"""

# A leap second takes the parser's slower way (events.rfc3339_variant), made to raise below.
RECORDS = [Record(0, b'{"page": "home", "at": "2016-12-31T22:00:00Z"}', None),
           Record(1, b'{"page": "home", "at": "2016-12-31T23:59:60Z"}', None),
           Record(2, b'{"page": "home", "at": "2016-12-31T23:30:00Z"}', None)]


def _mutator() -> Mutator:
    return mutator_of(parse_definitions(COUNTERS), "clicks")


def _defect(text: str) -> None:
    raise OverflowError("date value out of range")


@pytest.mark.parametrize("path", ["batch", "router"])
def test_a_record_whose_decision_raises_is_a_dead_letter_and_the_next_is_counted(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "rfc3339_variant", _defect)
    mutator = _mutator()
    said = METRICS.registry.get_sample_value("countersink_records_undecidable_total", {"topic": "clicks"}) or 0.0
    if path == "batch":
        assert mutator.applier.fast is not None
        result = mutator.apply_batch(RECORDS)
        assert (result.applied, len(result.invalid)) == (2, 1)
        ((record, error),) = result.invalid
    else:
        outcomes = [mutator.apply(record) for record in RECORDS]
        assert [outcome for outcome, _ in outcomes] == [Outcome.APPLIED, Outcome.INVALID, Outcome.APPLIED]
        record, error = RECORDS[1], outcomes[1][1]
    assert record.offset == 1
    assert isinstance(error, UndecidableRecordError)
    assert "OverflowError: date value out of range" in error.reason
    assert METRICS.registry.get_sample_value("countersink_records_undecidable_total", {"topic": "clicks"}) == said + 1
    assert mutator.applied_through == 2
    assert len(mutator.states) == 2  # the hours of 22:00 and 23:00, one event each
    assert [state.to_bytes() for state in mutator.states.values()] == [
        state.to_bytes() for state in _counted_without_the_leap_second().states.values()]


def _counted_without_the_leap_second() -> Mutator:
    mutator = _mutator()
    mutator.apply_batch([RECORDS[0], RECORDS[2]])
    return mutator


@pytest.mark.parametrize("error", [SchemaNotLoadedError("schema id 7 was not loaded"), ConnectionResetError("reset"),
                                   MemoryError()], ids=["retriable", "os", "memory"])
def test_what_is_not_the_records_still_raises(error: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    def raising(text: str) -> None:
        raise error

    monkeypatch.setattr(events, "rfc3339_variant", raising)
    for apply in (lambda m: m.apply_batch(RECORDS), lambda m: [m.apply(r) for r in RECORDS]):
        with pytest.raises(type(error)):
            apply(_mutator())


AVRO_COUNTERS = """
[[topic]]
name = "views"
format = "avro"

[[counter]]
name = "views_by_page"
topics = ["views"]
kind = "count"
key = ["page"]
"""

VIEW = {"type": "record", "name": "View", "fields": [{"name": "page", "type": "string"}]}


@pytest.mark.parametrize("path", ["batch", "router"])
def test_a_decoded_record_whose_decoding_raises_is_a_dead_letter(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for a record of a registry topic whose decoder raises what no refusal should: the batch path
    let it out of its converter (formats.converter caught refusals alone)."""
    counters = parse_definitions(AVRO_COUNTERS)
    cache = SchemaCache()
    schema = WriterSchema(1, "AVRO", json.dumps(VIEW), counters.formats["views"], json.loads)
    cache.put("views", 1, schema)
    applier = Applier(EventRouter(counters, decoders=decoders(counters.formats, cache, None)), counters, "views", 0,
                      RetryWindow(10))
    views = Mutator(MutatorEntry(uuid.uuid4(), "g", "views", 0, "h", 0, 10**18), PartitionId("g", "views", 0),
                    applier, -1, -1)
    assert applier.convert is not None  # decoded records take the batch path

    records = [Record(offset, frame(1, avro_bytes(VIEW, {"page": page})), None)
               for offset, page in enumerate(["/a", "/boom", "/a"])]
    decode = schema.decode

    def defective(raw: bytes, at: int, only: frozenset[str] | None = None) -> Any:
        event = decode(raw, at, only)
        if event["page"] == "/boom":
            raise IndexError("a defect of the decoder")
        return event

    monkeypatch.setattr(schema, "decode", defective)
    if path == "batch":
        result = views.apply_batch(records)
        assert (result.applied, [(r.offset, type(e)) for r, e in result.invalid]) == (2, [(1, UndecidableRecordError)])
    else:
        outcomes = [views.apply(record) for record in records]
        assert [outcome for outcome, _ in outcomes] == [Outcome.APPLIED, Outcome.INVALID, Outcome.APPLIED]
        assert isinstance(outcomes[1][1], UndecidableRecordError)
    assert views.applied_through == 2
