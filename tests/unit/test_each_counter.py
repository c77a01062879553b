"""Each counter decides for itself on a mixed topic, and paths reach the record's key, time, headers and
partition (docs/counters.md, One topic, several kinds of event; The record as fields)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from consumer.applying import Applier, Mutator, Outcome, Record, RetryWindow
from consumer.dead_letters import dead_letter_headers, plan_republish, refused_by
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.errors import (
    CountersRefusedError,
    DefinitionError,
    MissingFieldError,
    NotRepublishableError,
    UnaddressedEventError,
    UnparseableEventError,
    WrongTypeError,
)
from schemas.events import APPLY_TO_HEADER, EventRouter, RecordFields, Update

# The issue's example: three counters on one topic of several event types.
ISSUE = parse_definitions("""
[[counter]]
name = "page_views"
topics = ["events"]
kind = "count"
key = ["page"]
where = { type = "view" }

[[counter]]
name = "revenue"
topics = ["events"]
kind = "sum"
key = ["sku"]
value = "amount"
where = { type = "purchase" }

[[counter]]
name = "events_by_user"
topics = ["events"]
kind = "count"
key = ["user"]
""")


def applier(counters: Any, topic: str = "events", partition: int = 0) -> Applier:
    return Applier(EventRouter(counters), counters, topic, partition, RetryWindow(10))


def mutator(counters: Any, topic: str = "events") -> Mutator:
    entry = MutatorEntry(uuid.uuid4(), "g", topic, 0, "h", 0, 10**18)
    return Mutator(entry, PartitionId("g", topic, 0), applier(counters, topic), -1, -1)


def raw(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode()


def test_the_issue_example_counts_every_event_for_the_counters_it_applies_to() -> None:
    """A page view without a user is counted by page_views (events_by_user skips it), and a purchase with a
    null amount is counted by events_by_user (revenue skips it): no dead letter, no event lost."""
    skipped: list[tuple[str, str]] = []
    router = EventRouter(ISSUE, on_not_applicable=lambda counter, reason: skipped.append((counter, reason)))
    view = router.decide("events", b'{"type":"view","page":"/a"}')
    assert view.updates == [Update("page_views", "/a", None, None)]
    assert view.refusals == []
    purchase = router.decide("events", b'{"type":"purchase","sku":"k1","amount":null,"user":"u2"}')
    assert purchase.updates == [Update("events_by_user", "u2", None, None)]
    assert purchase.refusals == []
    assert skipped == [("events_by_user", "key_missing"), ("revenue", "value_null")]
    m = mutator(ISSUE)
    result = m.apply_batch([Record(0, b'{"type":"view","page":"/a"}'),
                            Record(1, b'{"type":"purchase","sku":"k1","amount":null,"user":"u2"}'),
                            Record(2, b'{"type":"purchase","sku":"k1","amount":5,"user":"u2"}')])
    assert result.invalid == []
    assert {k: s.value() for k, s in m.states.items()} == {
        ("page_views", "/a"): 1, ("events_by_user", "u2"): 2, ("revenue", "k1"): 5}


def test_a_wrongly_typed_field_is_refused_by_its_counter_alone_and_dead_lettered_once() -> None:
    """A purchase whose amount is text is refused by revenue and counted by events_by_user; it makes one
    dead letter whose headers name revenue and why."""
    record = Record(7, b'{"type":"purchase","sku":"k1","amount":"12","user":"u2"}', 1_795_000_000_000, b"k",
                    [("trace", b"t-1"), ("countersink.note", b"old")])
    outcome, updates, error = applier(ISSUE).classify(record)
    assert outcome is Outcome.APPLIED
    assert updates == [Update("events_by_user", "u2", None, None)]
    assert isinstance(error, CountersRefusedError)
    assert refused_by(error) == ("revenue",)
    headers = dict(dead_letter_headers("events", 0, record, error))
    assert headers["countersink.refused"] == b"revenue"
    assert (headers["countersink.refused.revenue"] or b"").startswith(b"WrongTypeError amount: expected an integer")
    assert headers["countersink.counter"] == b"revenue"
    assert headers["countersink.error"] == b"WrongTypeError"
    assert headers["countersink.source"] == b"events/0/7"
    assert headers["countersink.timestamp"] == b"1795000000000"
    assert headers["trace"] == b"t-1"  # the record's own headers, to re-publish it as it was
    assert "countersink.note" not in headers  # but never headers named as its own


def test_every_refusing_counter_is_named() -> None:
    """Two counters refusing one event are both named, each with its own reason, in definition order."""
    counters = parse_definitions("""
[[counter]]
name = "a"
topics = ["t"]
kind = "sum"
key = ["k"]
value = "n"

[[counter]]
name = "b"
topics = ["t"]
kind = "count"
key = ["k"]
event_id = "id"

[[counter]]
name = "c"
topics = ["t"]
kind = "count"
""")
    record = Record(0, b'{"k": "x", "n": "1"}')
    outcome, updates, error = applier(counters, "t").classify(record)
    assert (outcome, updates) == (Outcome.APPLIED, [Update("c", "", None, None)])
    assert isinstance(error, CountersRefusedError)
    assert error.refused_by == ("a", "b")
    assert [type(r) for r in error.refusals] == [WrongTypeError, MissingFieldError]  # b: its event id is missing
    headers = dict(dead_letter_headers("t", 0, record, error))
    assert headers["countersink.refused"] == b"a,b"
    assert b"event id is missing" in (headers["countersink.refused.b"] or b"")


def test_an_event_refused_by_every_counter_is_invalid() -> None:
    """When no counter applies the event and one refuses it, the outcome is INVALID (one dead letter)."""
    outcome, updates, error = applier(ISSUE).classify(Record(0, b'{"type":"purchase","sku":[1],"amount":1}'))
    assert (outcome, updates) == (Outcome.INVALID, [])
    assert isinstance(error, CountersRefusedError)
    assert error.refused_by == ("revenue",)


def test_whole_event_problems_refuse_it_for_every_counter() -> None:
    """An unparseable event is one dead letter with no counter named: it was refused as a whole."""
    record = Record(0, b"{not json")
    outcome, _, error = applier(ISSUE).classify(record)
    assert outcome is Outcome.INVALID
    assert isinstance(error, UnparseableEventError)
    assert refused_by(error) == ()
    assert "countersink.refused" not in dict(dead_letter_headers("events", 0, record, error))


def test_required_counters_refuse_events_lacking_their_fields() -> None:
    """``required = true``: a missing or null field makes the event invalid for the counter (dead-lettered)."""
    counters = parse_definitions("""
[[counter]]
name = "revenue"
topics = ["t"]
kind = "sum"
key = ["sku"]
value = "amount"
required = true

[[counter]]
name = "all"
topics = ["t"]
kind = "count"
""")
    decision = EventRouter(counters).decide("t", b'{"sku": "k1", "amount": null}')
    assert decision.updates == [Update("all", "", None, None)]
    assert [(type(r), r.counter, r.path) for r in decision.refusals] == [(MissingFieldError, "revenue", "amount")]
    assert decision.not_applicable == []


def test_a_missing_event_id_is_a_refusal_not_a_skip() -> None:
    """A counter that drops retries by event id refuses an event without one (counting it without its id
    would break exactly-once), but skips one that lacks its key, whatever its id."""
    counters = parse_definitions(
        '[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\nevent_id = "id"\n')
    router = EventRouter(counters)
    assert [r.path for r in router.decide("t", b'{"k": "x", "id": null}').refusals] == ["id"]
    assert router.decide("t", b'{"id": 5}').not_applicable == [("c", "key_missing")]
    assert router.decide("t", b'{"k": null}').not_applicable == [("c", "key_null")]


def test_a_missing_field_wins_over_a_wrongly_typed_one() -> None:
    """An event lacking a counter's value does not apply to it, even with a key of the wrong type: the
    decision does not depend on the order the fields are read in."""
    decision = EventRouter(ISSUE).decide("events", b'{"type": "purchase", "sku": [1], "user": "u"}')
    assert decision.refusals == []
    assert decision.not_applicable == [("revenue", "value_missing")]


def test_the_apply_to_header_restricts_a_record_to_the_counters_it_names() -> None:
    """A re-published dead letter carries countersink.apply-to: only the counters it names decide it, the
    router and the batch path alike; a header that is not UTF-8 refuses the record as a whole."""
    event = b'{"type":"purchase","sku":"k1","amount":12,"user":"u2"}'
    decision = EventRouter(ISSUE).decide("events", event, RecordFields(headers=[(APPLY_TO_HEADER, b"revenue")]))
    assert decision.updates == [Update("revenue", "k1", 12, None)]
    m = mutator(ISSUE)
    result = m.apply_batch([Record(0, event, None, None, [(APPLY_TO_HEADER, b"revenue")]),
                            Record(1, event, None, None, [(APPLY_TO_HEADER, b"nobody")]),
                            Record(2, event, None, None, [(APPLY_TO_HEADER, b"\xff")])])
    assert {k: s.value() for k, s in m.states.items()} == {("revenue", "k1"): 12}
    assert [(r.offset, type(e)) for r, e in result.invalid] == [(2, UnparseableEventError)]


@pytest.mark.parametrize("named", [b"", b" , ", None, b"Revenue", b"no such counter,-x"])
def test_an_apply_to_header_naming_no_counter_at_all_is_a_dead_letter(named: bytes | None) -> None:
    """A countersink.apply-to header that is empty (or null), or holds no name a counter can have, would be
    filtered by every counter of every group: the record is refused as a whole, by the router and the batch
    path alike, and the dead letter says why. A well-formed name of no counter here (another group's) is
    still filtered."""
    event = b'{"type":"purchase","sku":"k1","amount":12,"user":"u2"}'
    with pytest.raises(UnaddressedEventError, match="names no counter"):
        EventRouter(ISSUE).decide("events", event, RecordFields(headers=[(APPLY_TO_HEADER, named)]))
    m = mutator(ISSUE)
    result = m.apply_batch([Record(0, event, None, None, [(APPLY_TO_HEADER, named)]),
                            Record(1, event, None, None, [(APPLY_TO_HEADER, b"another_groups_counter")]),
                            Record(2, event, None, None, [(APPLY_TO_HEADER, b"nobody,revenue")])])
    assert {k: s.value() for k, s in m.states.items()} == {("revenue", "k1"): 12}
    assert [(r.offset, type(e)) for r, e in result.invalid] == [(0, UnaddressedEventError)]
    assert result.applied == 1


# --- the record as fields ---------------------------------------------------------------------------------

RECORD = parse_definitions("""
[[counter]]
name = "by_key"
topics = ["r"]
kind = "count"
key = ["@key"]
bucket = { field = "@timestamp", size = "1h" }

[[counter]]
name = "by_key_user"
topics = ["r"]
kind = "sum"
key = ["@key.user_id", "@partition"]
value = "n"

[[counter]]
name = "by_source"
topics = ["r"]
kind = "count"
key = ["@header.source"]
where = { "@header.kind" = "click" }

[[counter]]
name = "literal_at"
topics = ["r"]
kind = "sum"
key = ["@@key"]
value = "@@n.v"
""")
HOUR = 1_795_000_000_000 // 3_600_000 * 3_600_000  # an hour's first millisecond


def decide(event: dict[str, Any], key: bytes | None = None, timestamp_ms: int | None = HOUR + 1234,
           headers: list[tuple[str, bytes | None]] | None = None, partition: int | None = 3) -> Any:
    return EventRouter(RECORD).decide("r", raw(event), RecordFields(timestamp_ms, key, headers or [], partition))


def test_record_key_raw_and_as_a_document_timestamp_bucket_header_and_partition() -> None:
    """@key reads the key's text, @key.user_id the key read as JSON, @timestamp buckets by the record's
    time, @header.NAME reads a header (in where too), @partition the partition."""
    decision = decide({"n": 5}, key=b'{"user_id": 42}', headers=[("kind", b"click"), ("source", b"web")])
    assert decision.updates == [
        Update("by_key", '{"user_id": 42}|2026-11-18T11:00Z', None, None),
        Update("by_key_user", "42|3", 5, None),
        Update("by_source", "web", None, None),
    ]
    assert decision.not_applicable == [("literal_at", "key_missing")]
    other = decide({"n": 1}, key=b"plain", headers=[("kind", b"view"), ("source", b"web")])
    assert [u.counter for u in other.updates] == ["by_key"]
    assert [(r.counter, r.path) for r in other.refusals] == [("by_key_user", "@key")]  # not JSON


def test_record_fields_that_are_absent_do_not_apply() -> None:
    """A record without a key or a timestamp, or a header, is skipped by the counters reading them."""
    decision = decide({"n": 1}, key=None, timestamp_ms=None, headers=[("kind", b"click")])
    assert decision.updates == []
    assert decision.not_applicable == [("by_key", "key_null"), ("by_key_user", "key_missing"),
                                       ("by_source", "key_missing"), ("literal_at", "key_missing")]


def test_a_payload_field_named_with_an_at_sign_is_written_with_two() -> None:
    """``@@key`` is the payload field ``@key``, not the record's key."""
    decision = decide({"@key": "k", "@n": {"v": 2}}, key=b"{}")
    assert Update("literal_at", "k", 2, None) in decision.updates


@pytest.mark.parametrize(("body", "reason"), [
    ('key = ["@offset"]', "names no part of a record"),
    ('key = ["@timestamp.x"]', "has no fields"),
    ('key = ["@header"]', "@header.NAME"),
    ('bucket = { field = "@timestamp", size = "1h", format = "iso8601" }', "epoch_millis"),
    ('bucket = { field = "@partition", size = "1h" }', "not a time"),
])
def test_record_paths_are_checked_when_definitions_load(body: str, reason: str) -> None:
    """A path naming no part of a record, or one that cannot serve, is a definition error."""
    with pytest.raises(DefinitionError, match=reason):
        parse_definitions(f'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\n{body}\n')


def test_counters_reading_the_record_take_the_batch_path() -> None:
    """A topic whose counters read the record (a field of its key read as JSON among them) takes the batch path,
    which counts with the record's key, time, headers and the mutator's partition."""
    m = mutator(RECORD, "r")
    assert m.applier.fast is not None
    m.apply_batch([Record(0, b'{"n": 2}', HOUR, b'{"user_id": "u"}', [("kind", b"click"), ("source", b"app")])])
    assert {k: s.value() for k, s in m.states.items()} == {
        ("by_key", '{"user_id": "u"}|2026-11-18T11:00Z'): 1, ("by_key_user", "u|0"): 2, ("by_source", "app"): 1}


def test_a_republished_dead_letter_goes_back_for_the_counters_that_refused_it() -> None:
    """Re-publishing sends the payload (or the fixed one) to the source partition with the record's key,
    timestamp and headers, restricted to the refusing counters; a whole-event dead letter goes to all."""
    record = Record(7, b'{"type":"purchase","sku":"k1","amount":"12","user":"u2"}', 1_795_000_000_000, b"k",
                    [("trace", b"t-1")])
    _, _, error = applier(ISSUE).classify(record)
    assert error is not None
    headers = dead_letter_headers("events", 2, record, error)
    plan = plan_republish(headers, record.value, b"k", b'{"fixed": 1}', origin="dlq/0/4")
    assert (plan.topic, plan.partition, plan.key, plan.value, plan.timestamp_ms) == (
        "events", 2, b"k", b'{"fixed": 1}', 1_795_000_000_000)
    assert plan.headers == [("trace", b"t-1"), (APPLY_TO_HEADER, b"revenue"),
                            ("countersink.republished-from", b"dlq/0/4")]
    whole = Record(8, b"{oops")
    _, _, error = applier(ISSUE).classify(whole)
    assert error is not None
    plan = plan_republish(dead_letter_headers("events", 0, whole, error), b"{oops", None, b"{}")
    assert APPLY_TO_HEADER not in dict(plan.headers)
    with pytest.raises(NotRepublishableError, match="cut short"):
        plan_republish([*headers, ("countersink.truncated", b"9 bytes cut to 4")], b"{\"ty", b"k")
    with pytest.raises(NotRepublishableError, match="not a dead letter"):
        plan_republish([("trace", b"x")], b"{}", None)


def test_a_republished_fix_refused_whole_stays_meant_for_the_counters_that_refused_the_original() -> None:
    """A fix re-published for ``revenue`` alone that is no JSON is refused whole: its dead letter still names
    ``revenue`` (it named no counter, and the next republish went to every counter: counted twice by those that
    counted the original)."""
    fix = Record(9, b'{"type":"purchase","amount":twelve}', None, b"k",
                 [("trace", b"t-1"), (APPLY_TO_HEADER, b"revenue")])
    _, _, error = applier(ISSUE).classify(fix)
    assert error is not None
    headers = dead_letter_headers("events", 2, fix, error)
    assert ("countersink.refused", b"revenue") in headers
    plan = plan_republish(headers, fix.value, b"k", b'{"type":"purchase","amount":"12"}')
    assert dict(plan.headers)[APPLY_TO_HEADER] == b"revenue"


def test_republish_refuses_a_payload_no_consumer_could_read() -> None:
    """``dead-letters republish --payload`` checks a JSON topic's fix as ``publish`` checks a line (a payload in
    the registry's wire format is sent as it is)."""
    from countersink.dead_letters_cli import _not_an_event

    assert _not_an_event(b'{"k": "z", "v": 7}') is None
    assert _not_an_event(b"\x00\x00\x00\x00\x01\x02") is None
    # The consumer's own parser decides, as publish's: NaN it reads (a counter of that field refuses it), a lone
    # surrogate's escape it refuses whole.
    assert _not_an_event(b'{"k": "z", "v": NaN}') is None
    for bad in (b'{"k": "z", "v": seven}', b"not json", b"\xff\xfe", b"[1]", b'"text"', b'{"k": "\\ud800"}'):
        assert _not_an_event(bad) is not None, bad


def test_the_documented_mixed_topic_is_the_one_tested() -> None:
    """docs/counters.md's mixed-topic definitions are the ones these tests hold to the table there."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "counters.md").read_text()
    section = text.split("### One topic, several kinds of event", 1)[1]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    assert parse_definitions(toml).counters == ISSUE.counters
    decisions = EventRouter(ISSUE).decide("events", b'{"type":"purchase","sku":"k1","amount":"12","user":"u2"}')
    assert decisions.updates == [Update("events_by_user", "u2", None, None)]
    assert [r.counter for r in decisions.refusals] == ["revenue"]


def test_the_documented_record_counter_counts_by_key_field_header_and_hour() -> None:
    """docs/counters.md's record-field example reads the key's field, a header and the record's hour."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "counters.md").read_text()
    toml = text.split("### The record as fields", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    router = EventRouter(parse_definitions(toml))
    decision = router.decide("orders", b"{}", RecordFields(HOUR + 5, b'{"customer": "c7"}', [("region", b"eu")]))
    assert decision.updates == [Update("orders_by_customer_hour", "c7|eu|2026-11-18T11:00Z", None, None)]


@pytest.mark.parametrize("key", ["@key", "@partition", "@header.source", "@@sym", "@key.customer"])
def test_a_topic_reading_the_record_takes_the_batch_path(key: str) -> None:
    """A counter keyed by the record's key, partition, a header, a field of the key read as JSON, or by a payload
    field written with a doubled @ (read by its name, ``@sym``), takes the batch path, and counts what the router
    does."""
    counters = parse_definitions(f'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["{key}"]\n')
    m = mutator(counters, "t")
    assert m.applier.fast is not None
    m.apply_batch([Record(0, b'{"@sym": "A", "@key": "B", "@partition": "C"}', None, b'{"customer": "c7"}',
                          [("source", b"web")])])
    assert {k for _, k in m.states} == {{"@key": '{"customer": "c7"}', "@partition": "0", "@header.source": "web",
                                          "@@sym": "A", "@key.customer": "c7"}[key]}


def test_required_is_not_part_of_a_counters_meaning() -> None:
    """Setting ``required`` keeps the counter's fingerprint (it decides which events arrive, as coerce does),
    and a definition recorded before it existed reads back the same."""
    from schemas.registry import fingerprint, from_record, to_record

    plain, strict = (parse_definitions(f'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\n{extra}')
                     .counters[0] for extra in ("", "required = true\n"))
    assert fingerprint(plain) == fingerprint(strict)
    assert "required" not in to_record(plain)
    assert from_record(to_record(strict)).required is True


def test_a_republished_dead_letter_is_not_taken_for_a_retry_by_a_counter_sharing_its_event_id() -> None:
    """Two counters sharing an event-id field keep one dict of ids: when one counted an event the other
    refused, the event re-published for the other is counted by it (not dropped as a retry of the first's),
    once: re-published twice, the second is dropped."""
    counters = parse_definitions("""
[[counter]]
name = "orders"
topics = ["t"]
kind = "count"
key = ["sku"]
event_id = "id"

[[counter]]
name = "amount"
topics = ["t"]
kind = "sum"
key = ["sku"]
value = "n"
event_id = "id"
""")
    m = mutator(counters, "t")
    fixed = Record(2, b'{"sku": "k", "n": 5, "id": "x"}', None, None, [(APPLY_TO_HEADER, b"amount")])
    result = m.apply_batch([Record(0, b'{"sku": "k", "n": "5", "id": "x"}'),  # amount refuses it
                            Record(1, b'{"sku": "k", "n": "5", "id": "x"}'),  # a retry: dropped, refused again
                            fixed, fixed._replace(offset=3)])
    assert {k: s.value() for k, s in m.states.items()} == {("orders", "k"): 1, ("amount", "k"): 5}
    assert [r.offset for r, _ in result.invalid] == [0, 1]
    assert (result.applied, result.duplicates) == (2, 2)


def test_a_payload_decoded_elsewhere_is_decided_as_json_is() -> None:
    """decide_event takes a payload already decoded into a dict (an Avro or Protobuf record, say) and decides
    it per counter exactly as the same payload as JSON, record fields included; the dict is left as it was."""
    router = EventRouter(RECORD)
    event: dict[str, Any] = {"n": 4, "@key": "k"}
    fields = RecordFields(HOUR, b'{"user_id": 1}', [("source", b"web"), ("kind", b"click")], 2)
    assert router.decide_event("r", event, fields) == router.decide("r", raw(event), fields)
    assert event == {"n": 4, "@key": "k"}
    assert EventRouter(ISSUE).decide_event("events", {"type": "view", "page": "/a"}).updates == [
        Update("page_views", "/a", None, None)]


KEYED = parse_definitions("".join(
    f'[[counter]]\nname = "{name}"\ntopics = ["t"]\nkind = "{kind}"\nkey = ["{key}"]\n'
    + ('value = "q"\n' if kind == "sum" else "") + "\n"
    for name, kind, key in (("by_key", "count", "@key"), ("qty_by_key", "sum", "@key"),
                            ("per_user", "count", "@key.user"), ("qty_per_user", "sum", "@key.user"))))


@pytest.mark.parametrize("batch", [True, False])
def test_every_counter_refusing_a_records_key_is_named_once(batch: bool) -> None:
    """A key that is not UTF-8 (or not JSON) is one error read once and raised to each counter reading the key:
    each took it and named itself on the same object, so the dead letter said ``qty_by_key,qty_by_key,...`` and
    the metrics counted the last counter for all. Each counter's refusal names it, on both paths."""
    m = mutator(KEYED, "t")
    records = [Record(0, b'{"q": 1}', None, b"\xff\xfe"), Record(1, b'{"q": 1}', None, b"plain")]
    if batch:
        invalid = m.apply_batch(records).invalid
    else:
        invalid = [(r, e) for r in records for _, e in (m.apply(r),) if e is not None]
    named = [refused_by(error) for _, error in invalid]
    assert named == [("by_key", "qty_by_key", "per_user", "qty_per_user"), ("per_user", "qty_per_user")]
    headers = dict(dead_letter_headers("t", 0, invalid[0][0], invalid[0][1]))
    assert headers["countersink.refused"] == b"by_key,qty_by_key,per_user,qty_per_user"
    assert headers["countersink.counter"] == b"by_key"


@pytest.mark.parametrize("batch", [True, False])
def test_a_record_without_a_value_is_said_to_be_one(batch: bool) -> None:
    """A null value (a tombstone of a compacted topic) or an empty one was dead-lettered as "not a UTF-8 JSON
    document: EOF while parsing a value": it says what it is, on both paths."""
    m = mutator(KEYED, "t")
    records = [Record(0, None, None, b"k"), Record(1, b"", None, b"k")]
    invalid = m.apply_batch(records).invalid if batch else [(r, e) for r in records for _, e in (m.apply(r),) if e]
    assert [error.reason for _, error in invalid] == ["the record has no value (null: a tombstone, or empty)"] * 2
