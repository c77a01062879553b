"""The batch path (:meth:`Mutator.apply_batch`, with the topic's :class:`FastRoute`) against the reference,
:meth:`Mutator.apply` record by record: same state bytes, dirty sets, outcomes, dead letters and errors."""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from consumer.applying import Applier, BatchApplied, Mutator, Outcome, Record, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from schemas import fast_route
from schemas.definitions import parse_definitions
from schemas.events import APPLY_TO_HEADER, EventRouter
from schemas.fast_route import APPLIED, FastRoute
from schemas.kinds import State, new_state

TOPIC = "t"
MAX_KEY_BYTES = 24  # small, so that long keys, items and ids are common

# Counter bodies the sets are drawn from: every kind, integer and float numbers, coercion, filters on
# strings and on mixed scalars, one and two key fields, no key, shared and separate event ids.
BODIES = [
    'kind = "count"\nkey = ["sym"]\nevent_id = "id"',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nevent_id = "id"',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nnumber = "float"',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\ncoerce = true\nevent_id = "id"\nwhere = { side = ["buy"] }',
    'kind = "min"\nkey = ["sym", "side"]\nvalue = "x"\nnumber = "float"\ncoerce = true',
    'kind = "max"\nkey = ["sym"]\nvalue = "n"',
    'kind = "mean"\nkey = ["side"]\nvalue = "x"\nevent_id = "id"',
    'kind = "variance"\nkey = ["sym"]\nvalue = "n"\nevent_id = "rid"',
    'kind = "distinct"\nkey = ["sym"]\nvalue = "user"\nevent_id = "id"',
    'kind = "distinct"\nkey = ["flag"]\nvalue = "n"\nwhere = { flag = [true, 1, "1"] }',
    'kind = "quantiles"\nkey = ["sym"]\nvalue = "x"\nk = 8',
    'kind = "top_k"\nvalue = "user"\nevent_id = "id"',
    'kind = "count"\nkey = ["sym"]\nevent_id = "id"\nwhere = { side = ["buy", "sell"] }',
    # a mixed topic: counters that want different fields of different events, and ones that require theirs
    'kind = "count"\nkey = ["user"]',
    'kind = "count"\nkey = ["user"]\nrequired = true',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nwhere = { side = ["sell"] }\nrequired = true',
    # time buckets: every format, kept forever or retained (lateness, storable ends), on the record's time
    'kind = "count"\nkey = ["sym"]\nbucket = { field = "ts", size = "1h", format = "epoch_seconds" }\nevent_id = "id"',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nbucket = { field = "ts", size = "1h", format = "epoch_seconds" }\n'
    'retain = "2h"',
    'kind = "count"\nbucket = { field = "iso", size = "1d", format = "iso8601" }',
    'kind = "distinct"\nkey = ["sym"]\nvalue = "user"\nbucket = { field = "iso", size = "1h", format = "iso8601" }\n'
    'retain = "1d"\nwhere = { side = ["buy"] }',
    'kind = "max"\nkey = ["side"]\nvalue = "n"\n'
    'bucket = { field = "@timestamp", size = "1m", format = "epoch_millis" }',
    'kind = "count"\nkey = ["sym"]\nbucket = { field = "ms", size = "15m", format = "epoch_millis" }\nretain = "1h"',
    # exact decimals (every number of the topic then read as a Decimal)
    'kind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"\nevent_id = "id"',
    'kind = "mean"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"\ncoerce = true',
    # dotted paths: keys, values, filters and ids inside an object
    'kind = "count"\nkey = ["meta.a"]\nevent_id = "meta.b"',
    'kind = "sum"\nkey = ["sym", "meta.b"]\nvalue = "meta.a"\nwhere = { "meta.b" = ["buy", 1] }',
    'kind = "distinct"\nkey = ["user"]\nvalue = "meta.a"\nwhere = { "meta.b" = ["sell"] }\nevent_id = "id"',
    # the record as fields: its key, a header, its partition and its time
    'kind = "count"\nkey = ["@key"]\nevent_id = "id"',
    'kind = "sum"\nkey = ["sym", "@header.h"]\nvalue = "n"\nwhere = { "@header.g" = ["x"] }',
    'kind = "count"\nkey = ["@partition", "@timestamp"]\nwhere = { "@key" = ["K1", "a|b"] }',
    'kind = "max"\nkey = ["@header.g"]\nvalue = "@timestamp"\nevent_id = "@header.h"',
    'kind = "top_k"\nvalue = "@header.h"\nevent_id = "id"',
    # fields of the record's key read as a JSON document, in keys, filters, values, ids and buckets
    'kind = "count"\nkey = ["@key.customer"]',
    'kind = "count"\nkey = ["sym"]\nwhere = { "@key.region" = ["x", 1] }',
    'kind = "sum"\nkey = ["@key.o.id", "side"]\nvalue = "@key.n"\nevent_id = "@key.customer"',
    'kind = "count"\nkey = ["@key.region"]\nbucket = { field = "@key.t", size = "1h", format = "epoch_seconds" }',
    # an integer sum taking numbers written as text or as integral non-integers (1e3, "12")
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\ncoerce = true',
]
# Topics the fast path leaves to the router entirely: a field read both as a value and as an object holding
# fields.
ROUTER_ONLY = [
    'kind = "sum"\nkey = ["meta"]\nvalue = "meta.a"',
    'kind = "sum"\nkey = ["@key.o"]\nvalue = "@key.o.id"',
]


def counter_set(bodies: list[str]):  # type: ignore[no-untyped-def]
    text = "".join(f'[[counter]]\nname = "c{i}"\ntopics = ["{TOPIC}"]\n{body}\n\n' for i, body in enumerate(bodies))
    return parse_definitions(text, "differential")


def mutator(counters, window: int, max_event_bytes: int = 400) -> Mutator:  # type: ignore[no-untyped-def]
    # what the router told of events lacking a counter's fields, and of events late for a counter, in order
    skipped: list[tuple[str, str]] = []
    router = EventRouter(counters, max_event_bytes=max_event_bytes, max_depth=6, max_key_bytes=MAX_KEY_BYTES,
                         on_not_applicable=lambda counter, reason: skipped.append((counter, reason)),
                         on_late=lambda counter: skipped.append((counter, "late")))
    router.skipped = skipped  # type: ignore[attr-defined]
    applier = Applier(router, counters, TOPIC, 0, RetryWindow(window))
    entry = MutatorEntry(uuid.uuid4(), "g", TOPIC, 0, "h", 0, 10**18)
    return Mutator(entry, PartitionId("g", TOPIC, 0), applier, -1, -1)


texts = st.one_of(st.sampled_from(["IBM", "MSFT", "a|b", "a\\b", "", "buy", "sell", "1", "true", "é", "x" * 30]),
                  st.text(max_size=30))
scalars = st.one_of(
    texts,
    st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([0, 1, -1, 2**64 - 1, 2**64, -(2**64)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from("ab"), scalars, max_size=2))
FIELDS = ["sym", "n", "x", "id", "rid", "side", "user", "flag", "ts", "meta", "iso", "ms"]
# Event times around 2025-11-26 07:00 UTC, and the edges: before 1970, after 9999, unstorable, not a time.
NOW_S = 1_764_140_400
TIMES = st.sampled_from([NOW_S, NOW_S + 1, NOW_S + 3599, NOW_S + 3600, NOW_S - 1, NOW_S + 900, NOW_S - 7200,
                         NOW_S - 86_400 * 3, NOW_S + 90_000, -5, 0,
                         253_402_300_799, 253_402_300_800, 2**40, 1.5e9, float("inf"), "1764140400", True])
ISO_TIMES = st.sampled_from(["2025-11-26T07:00:00+00:00", "2025-11-26T07:59:59.5Z", "2025-11-26T07:00:00",
                             "2025-11-25T23:30:00-02:00", "2025-11-28T09:00:00+00:00", "nope", "9999-12-31T23:59:59Z",
                             "2025-11-26", 1764140400])
# Record timestamps (ms): none, -1, about the event times, and far from them.
STAMPS = st.none() | st.just(-1) | st.sampled_from([NOW_S * 1000, (NOW_S + 7200) * 1000, (NOW_S - 90_000) * 1000,
                                                    (NOW_S + 86_400 * 2) * 1000, 0]) | st.integers(0, 2**45)


# A key of 13 characters escaped as \u00e9: 26 bytes of UTF-8, over MAX_KEY_BYTES, though 13 characters are not.
ESCAPED_LONG_KEY = b'{"sym": "' + b"\\u00e9" * 13 + b'", "n": 1, "id": "i1"}'


def nested_objects(depth: int) -> bytes:
    """A valid event for every body, nested ``depth + 1`` deep in objects alone (no array: the fast path counts
    braces alone then)."""
    fields = b'"sym": "A", "n": 1, "x": 1.5, "id": "i9", "rid": "r9", "side": "buy", "user": "u1", "flag": true'
    return b"{" + fields + b', "z": ' + b'{"a": ' * depth + b"1" + b"}" * (depth + 1)


@st.composite
def event_bytes(draw: st.DrawFn) -> bytes:
    shape = draw(st.integers(0, 19))
    if shape == 0:
        return draw(st.binary(max_size=40))
    if shape == 1:  # deeply nested, or an array, or a scalar document
        return draw(st.sampled_from([b'{"sym": "A", "z": [[[[[[[1]]]]]]]}', nested_objects(6), nested_objects(5),
                                     b"[1, 2]", b"3", b'"s"', b"null",
                                     b'{"sym": "A", "sym": "B", "n": 1, "id": "i"}', b'{"n": NaN, "sym": "A"}',
                                     b'{"sym": "A", "n": 1' + b" " * 400 + b"}", b'{"sym": "\\ud800", "n": 1}']))
    event = {name: draw(values) for name in draw(st.lists(st.sampled_from(FIELDS), unique=True))}
    if draw(st.booleans()):  # the common shape: valid fields, ids from a small set (so retries happen)
        # At the edges too: keys, ids and items of MAX_KEY_BYTES characters and one more.
        edge = st.sampled_from(["e" * MAX_KEY_BYTES, "e" * (MAX_KEY_BYTES + 1), "|" * (MAX_KEY_BYTES // 2 + 1)])
        event.update(sym=draw(st.sampled_from(["IBM", "MSFT", "a|b", 7, True]) | edge), n=draw(st.integers(-5, 5)),
                     x=draw(st.floats(-10, 10)), id=draw(st.sampled_from(["i1", "i2", "i3", 4, "i5"]) | edge),
                     rid=draw(st.sampled_from(["r1", "r2"])), side=draw(st.sampled_from(["buy", "sell", 1, True])),
                     user=draw(st.sampled_from(["u1", "u2", "u3", 5]) | edge),
                     flag=draw(st.sampled_from([True, 1, "1", 0])), ts=draw(TIMES), iso=draw(ISO_TIMES),
                     ms=draw(TIMES.map(lambda t: t * 1000 if type(t) is int else t)))
        if draw(st.booleans()):
            event["meta"] = {"a": draw(st.sampled_from(["u1", 3, 2.5, "e" * (MAX_KEY_BYTES + 1), None])),
                             "b": draw(st.sampled_from(["buy", "sell", 1, "i7"]))}
    text = json.dumps(event, ensure_ascii=draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")


def outcomes(m: Mutator, records: list[Record]) -> BatchApplied:
    result = BatchApplied()
    for record in records:
        outcome, error = m.apply(record)
        result.count(record, outcome, error)
    return result


def described(result: BatchApplied) -> tuple[int, int, list[tuple[int, str, str, str | None, list[str]]]]:
    """Counts, and each dead letter with every counter's own refusal (each counter decides for itself)."""
    return result.applied, result.duplicates, [
        (r.offset, type(e).__name__, str(e), e.counter,
         [f"{x.counter}: {type(x).__name__} {x}" for x in getattr(e, "refusals", ())])
        for r, e in result.invalid]


# Records' keys and headers: text, not UTF-8, null, repeated names (the last one counts), absent.
RECORD_KEYS = st.sampled_from([None, b"K1", b"K2", b"a|b", b"\xff", b"", b"e" * (MAX_KEY_BYTES + 1),
                               "é".encode() * 13])  # 13 characters, 26 bytes: over MAX_KEY_BYTES
# Keys read as JSON documents (@key.PATH): valid, wrongly typed, null, not objects, escaped, deep, not JSON.
KEY_DOC_VALUES = st.sampled_from(['"c1"', '"c2"', "5", "true", "null", "1.5", '"x"', "1", '"a|b"', "[1]", "{}",
                                  '{"id": "o1"}', '{"id": 7}', '{"id": null}', '"\\u00e9"', '"' + "e" * 30 + '"',
                                  "1764140400", "1e3", "NaN", "9" * 30, "-0", '"2025"'])


@st.composite
def key_documents(draw: st.DrawFn) -> bytes | None:
    """A record's key holding a JSON document (or not quite one)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([b"[1]", b'"s"', b"null", b"{", b'{"customer": "c1"', b"\xef\xbb\xbf{}",
                                     b'{"o": ' * 7 + b"1" + b"}" * 7, b'{"customer": "\xc3\xa9"}']))
    members = [f'"{name}": {draw(KEY_DOC_VALUES)}'
               for name in draw(st.lists(st.sampled_from(["customer", "region", "o", "n", "t", "z"]), unique=True))]
    if draw(st.booleans()):
        members.append(f'"customer": {draw(KEY_DOC_VALUES)}')  # a duplicate name: the last one counts
    return ("{" + ", ".join(members) + "}").encode()


RECORD_KEYS = RECORD_KEYS | key_documents()
HEADERS = st.lists(st.tuples(st.sampled_from(["h", "g", "other"]),
                             st.sampled_from([b"x", b"y", b"i1", None, b"\xff", b"", "é".encode() * 13])),
                    max_size=3)

# Values of the header restricting a record to some counters (a re-published dead letter), drawn onto records.
APPLY_TO_VALUES = st.sampled_from([b"c0", b"c1,c2", b"c0, c3 ,c5", b"", b"zz", b"\xff", None])


def stored(states: Mapping[tuple[str, str], State]) -> dict[tuple[str, str], object]:
    """The states as both paths must leave them: their stored bytes, but a quantiles sketch's count, least and
    greatest values: its compactions draw random bits, so the same values in the same order may keep other
    items (a comparison of bytes failed at random once a sketch compacted)."""
    return {ident: (state._sketch.n, state._sketch.get_min_value(), state._sketch.get_max_value())  # type: ignore[attr-defined]
            if state.kind == "quantiles" else state.to_bytes() for ident, state in states.items()}


def assert_paths_agree(bodies: list[str], events: list[bytes], cuts: list[int], window: int, redelivered: int,
                       max_event_bytes: int = 400, restricted: dict[int, bytes | None] | None = None,
                       stamps: list[int | None] | None = None,
                       parts: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] | None = None) -> None:
    """The differential check: apply_batch and apply, batch by batch, end with the same everything; the
    records of ``restricted`` carry the header restricting them to some counters."""
    counters = counter_set(bodies)
    reference = mutator(counters, window, max_event_bytes)
    batched = mutator(counters, window, max_event_bytes)
    assert batched.applier.fast is not None
    restricted = restricted or {}
    stamps = stamps or []
    parts = parts or [(None, [])]  # each record's key and headers
    records = [Record(offset * 2, raw,  # gaps, as transactions leave
                      stamps[offset % len(stamps)] if stamps else None, parts[offset % len(parts)][0],
                      [("other", b"x"), (APPLY_TO_HEADER, restricted[offset])] if offset in restricted else
                      parts[offset % len(parts)][1])
               for offset, raw in enumerate(events)]
    start = 0
    for size in [*cuts, len(records)]:
        batch = records[max(0, start - redelivered):start + size]  # a redelivery repeats applied records
        expected = outcomes(reference, batch)
        got = batched.apply_batch(batch)
        assert described(got) == described(expected)
        assert batched.dirty == reference.dirty
        assert batched.applied_through == reference.applied_through
        assert batched.state_bytes == reference.state_bytes
        assert batched.instance_bytes == reference.instance_bytes
        assert batched.applier.router.skipped == reference.applier.router.skipped  # type: ignore[attr-defined]
        assert stored(batched.states) == stored(reference.states)
        batched.dirty.clear()  # as a flush takes them
        reference.dirty.clear()
        start += size
        if start >= len(records):
            break


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(st.sampled_from(BODIES), min_size=1, max_size=5),
       events=st.lists(event_bytes(), max_size=60),
       cuts=st.lists(st.integers(1, 12), max_size=10),
       window=st.sampled_from([0, 1, 3, 50]),
       redelivered=st.integers(0, 5),
       restricted=st.dictionaries(st.integers(0, 59), APPLY_TO_VALUES, max_size=4),
       stamps=st.lists(STAMPS, max_size=8),
       parts=st.lists(st.tuples(RECORD_KEYS, HEADERS), max_size=6))
@example(bodies=BODIES[:2], events=[nested_objects(6), nested_objects(5), ESCAPED_LONG_KEY], cuts=[], window=3,
         redelivered=0, restricted={}, stamps=[], parts=[])
def test_batch_path_equals_record_at_a_time(bodies: list[str], events: list[bytes], cuts: list[int], window: int,
                                            redelivered: int, restricted: dict[int, bytes | None],
                                            stamps: list[int | None],
                                            parts: list[tuple[bytes | None, list[tuple[str, bytes | None]]]]) -> None:
    """For any counters and events (valid, invalid, retried, escaped keys, huge numbers, not ASCII, fields
    missing or null for some counters, wrongly typed for others, records restricted to some counters), in
    any batches (some redelivered), apply_batch gives the bytes, dirty sets, outcomes, skips and each
    counter's refusals of apply. Bucketed, decimal and dotted-path counters among them, on records whose
    timestamps make events late, too far in the future or neither."""
    assert_paths_agree(bodies, events, cuts, window, redelivered, restricted=restricted, stamps=stamps, parts=parts)


# Header names that are legal (the rest of the path, dots included) but no identifier: two whose characters differ
# only in punctuation and share a CRC-32, which once named one local for both; a newline and a carriage return,
# which once ended a comment of the generated code and made the rest of the name a line of it; a NUL and a digit
# that is not ASCII, which once made it fail to compile (the consumer did not start).
ODD_HEADER_NAMES = ["h,,++-!~:", "h;;)=-,;(", "h\n        TS = 7", "a\rb", "a\u0000b", "m\u00b2"]


@pytest.mark.parametrize("name", ODD_HEADER_NAMES[2:])
def test_a_header_of_any_name_is_read_by_the_batch_path_as_by_the_router(name: str) -> None:
    """A header's name in a key, a bucket's field, a value and a filter: the batch path is built, and agrees."""
    toml_name = json.dumps(name)[1:-1]
    bodies = [f'kind = "max"\nkey = ["@header.{toml_name}"]\nvalue = "@timestamp"',
              f'kind = "count"\nkey = ["sym"]\nbucket = {{ field = "@header.{toml_name}", size = "1h" }}',
              f'kind = "top_k"\nvalue = "@header.{toml_name}"\nwhere = {{ "@header.{toml_name}" = ["x", "y"] }}']
    parts: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] = [
        (None, [(name, b"x")]), (None, [(name, b"2026-11-22T10:17:00Z")]), (None, [("other", b"x")]),
        (None, [(name, b"y"), (name, b"z")])]
    assert_paths_agree(bodies, [b'{"sym": "IBM"}'] * 8, [3], 3, 1, stamps=[1764140400000], parts=parts)


def test_two_header_names_are_two_fields_whatever_their_characters() -> None:
    assert zlib.crc32(ODD_HEADER_NAMES[0].encode()) == zlib.crc32(ODD_HEADER_NAMES[1].encode())
    bodies = [f'kind = "count"\nkey = ["@header.{name}"]' for name in ODD_HEADER_NAMES[:2]]
    parts: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] = [
        (None, [(ODD_HEADER_NAMES[0], b"x"), (ODD_HEADER_NAMES[1], b"y")])]
    assert_paths_agree(bodies, [b'{"a": 1}'] * 3, [], 0, 0, parts=parts)
    batched = mutator(counter_set(bodies), 0)
    batched.apply_batch([Record(0, b'{"a": 1}', None, None, parts[0][1])])
    assert sorted(batched.states) == [("c0", "x"), ("c1", "y")]


# Events of a mixed topic: three types, each with its own fields, any of them missing, null or wrongly typed.
MIXED_BODIES = [
    'kind = "count"\nkey = ["sym"]\nwhere = { side = ["buy"] }',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nwhere = { side = ["sell"] }\nevent_id = "id"',
    'kind = "count"\nkey = ["user"]',
    'kind = "distinct"\nkey = ["side"]\nvalue = "user"\nrequired = true',
    'kind = "max"\nkey = ["flag"]\nvalue = "x"\nnumber = "float"',
]
mixed_field = st.one_of(st.none(), st.sampled_from(["IBM", "u1", "u2", 3, 2.5, True, [1], {"a": 1}, "x" * 30]))


@st.composite
def mixed_event(draw: st.DrawFn) -> bytes:
    side = draw(st.sampled_from(["buy", "sell", "view", None]))
    fields = {"sym": "IBM", "n": 2, "id": "i1", "user": "u1", "x": 1.5, "flag": True}
    event: dict[str, object] = {} if side is None else {"side": side}
    for name, good in fields.items():
        kind = draw(st.integers(0, 9))  # mostly the good value; else missing, or null or anything
        if kind <= 6:
            event[name] = good
        elif kind == 9:
            event[name] = draw(mixed_field)
    return json.dumps(event).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(mixed_event(), max_size=40), cuts=st.lists(st.integers(1, 8), max_size=6),
       window=st.sampled_from([0, 3]), restricted=st.dictionaries(st.integers(0, 39), APPLY_TO_VALUES, max_size=3))
def test_batch_path_equals_record_at_a_time_on_a_mixed_topic(events: list[bytes], cuts: list[int], window: int,
                                                             restricted: dict[int, bytes | None]) -> None:
    """A topic of several event types whose events lack, null or mistype the fields of some counters: the
    batch path and the router decide alike, counter by counter (updates, skips, refusals)."""
    assert_paths_agree(MIXED_BODIES, events, cuts, window, 1, restricted=restricted)


# --- the nasty inputs: events written as text, so that they hold what json.dumps never writes ----------------

NASTY_MAX_EVENT_BYTES = 16_384  # room for numbers of thousands of digits and long strings
ESCAPES = ['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u0041", "\\u00e9", "\\u0000", "\\u007c",
           "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\uD800\\u0041"]
LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "-0.0", "0e0", "1e2", "1E+2", "-5e0",
            "2.5e1", "3.0", "18446744073709551615", "18446744073709551616", "-18446744073709551616", "true", "false",
            "null", "[]", "{}", "01", "1.", "+1", ".5", "--1", "tru", "nul"]
# Digit counts around the router's limit (4,300) and the fast path's hand-back (fast_route.LONG_DIGITS).
DIGITS = st.sampled_from([4095, 4096, 4097, 4299, 4300, 4301, 5000]) | st.integers(1, 5200)


@st.composite
def huge_number(draw: st.DrawFn) -> str:
    digits = "9" * draw(DIGITS)
    return draw(st.sampled_from(["", "-"])) + digits + draw(st.sampled_from(
        ["", "", ".5", "e3", ".0e-2", "e4300", "e999999999999999999", "e9999999999999999999",
         "e-10000000000000000000"]))


@st.composite
def escaped_string(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(ESCAPES) | st.sampled_from(["IBM", "a", "|", "buy", " ", "u1"]), max_size=6))
    return '"' + "".join(parts) + '"'


nasty_values = st.one_of(
    huge_number(),
    huge_number(),
    st.sampled_from(LITERALS),
    escaped_string(),
    st.integers(0, 6000).map(lambda n: '"' + "x" * n + '"'),  # very long strings
    st.integers(0, 40).map(lambda d: "[" * d + "1" + "]" * d),  # deep nesting
    st.integers(0, 40).map(lambda d: '{"a": ' * d + "1" + "}" * d),
    st.sampled_from(['"IBM"', "1", "-3", "2.5", '"buy"', "true", '"u2"', '"i1"']),  # plain values, to count
)
# Read fields, unread ones, and keys written with escapes (one of them is sym, spelled s\u0079m).
NASTY_KEYS = [*FIELDS, "z", "zz", "s\\u0079m", "sy\\/m", "n\\t", ""]
VALID = ['"sym": "IBM"', '"n": 2', '"x": 1.5', '"id": "i1"', '"rid": "r1"', '"side": "buy"', '"user": "u1"',
         '"flag": true']
WRAPS = [b"\xef\xbb\xbf", b" \n\t", b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]


@st.composite
def nasty_event(draw: st.DrawFn) -> bytes:
    """One event written as text: valid fields (or none), with nasty members anywhere (duplicate keys
    included), perhaps a BOM, whitespace or a byte that is not UTF-8 before, inside or after it."""
    members = list(VALID) if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 3))):
        member = f'"{draw(st.sampled_from(NASTY_KEYS))}": {draw(nasty_values)}'
        members.insert(draw(st.integers(0, len(members))), member)
    text = ("{" + ", ".join(members) + "}").encode()
    wrap, where = draw(st.none() | st.sampled_from(WRAPS)), draw(st.sampled_from(["before", "inside", "after"]))
    if wrap is None:
        return text
    if where == "inside" and members:  # into the first string of the event
        at = text.index(b'"') + 1
        return text[:at] + wrap + text[at:]
    return wrap + text if where == "before" else text + wrap


nasty_arguments = {"bodies": st.lists(st.sampled_from(BODIES), min_size=1, max_size=4),
                   "events": st.lists(nasty_event(), max_size=12),
                   "cuts": st.lists(st.integers(1, 6), max_size=4),
                   "window": st.sampled_from([0, 3]),
                   "redelivered": st.integers(0, 2)}


def _nasty_check(bodies: list[str], events: list[bytes], cuts: list[int], window: int, redelivered: int) -> None:
    assert_paths_agree(bodies, events, cuts, window, redelivered, NASTY_MAX_EVENT_BYTES)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(**nasty_arguments)
@example(bodies=[BODIES[0]], events=[b'{"sym": "A", "z": ' + b"9" * 4301 + b"}"], cuts=[], window=0, redelivered=0)
def test_batch_path_equals_record_at_a_time_on_nasty_inputs(bodies: list[str], events: list[bytes], cuts: list[int],
                                                             window: int, redelivered: int) -> None:
    """Numbers of thousands of digits (in read and unread fields), deep nesting, every escape, duplicate keys,
    BOMs, bytes that are not UTF-8, lone surrogates, long strings, NaN and Infinity, 1e400, -0 and exponents
    in integer fields: apply_batch decides every record as apply does."""
    _nasty_check(bodies, events, cuts, window, redelivered)


DECIMAL_SUM = 'kind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"'
INTEGER_COERCED = 'kind = "sum"\nkey = ["sym"]\nvalue = "n"\ncoerce = true'


@pytest.mark.parametrize(("bodies", "event"), [
    # An exponent past what Decimal holds, on a topic with exact decimals: read, and in a field no one reads.
    ([DECIMAL_SUM], b'{"sym": "A", "x": 1e9999999999999999999}'),
    ([DECIMAL_SUM], b'{"sym": "A", "x": 1.5, "z": 1e9999999999999999999}'),
    ([DECIMAL_SUM], b'{"sym": "A", "x": 1, "note": 2.5e-10000000000000000000}'),
    # An integer counter taking text: more digits than Python converts.
    ([INTEGER_COERCED], b'{"sym": "A", "n": "' + b"1" * 4301 + b'"}'),
    # The same beside exact decimals, where an integral number arrives as a Decimal: int() of 1e200000 took
    # seconds (quadratic in the exponent), of 1e999999999999999999 all the memory, and 1e4300's reason could
    # not be written.
    ([INTEGER_COERCED, DECIMAL_SUM], b'{"sym": "A", "n": 1e4300, "x": 1}'),
    ([INTEGER_COERCED, DECIMAL_SUM], b'{"sym": "A", "n": 1e200000, "x": 1}'),
    ([INTEGER_COERCED, DECIMAL_SUM], b'{"sym": "A", "n": 1e999999999999999999, "x": 1}'),
])
def test_numbers_no_decimal_or_integer_holds_are_decided_alike_at_once(bodies: list[str], event: bytes) -> None:
    """Each crashed (or stalled) a partition on one path or both, and the batch path counted what the router
    crashed on: now both decide each at once, the same way, beside an ordinary event counted."""
    events = [event, b'{"sym": "A", "x": 2, "n": 3}']
    started = time.monotonic()
    assert_paths_agree(bodies, events, [], 0, 0, max_event_bytes=8192)
    assert time.monotonic() - started < 5


def test_the_differential_check_catches_a_planted_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the fast path's hand-back of long digit runs taken out (it then counts an event holding a number
    the router refuses), the nasty differential check fails: it can tell the two paths apart."""
    monkeypatch.setattr(fast_route, "LONG_DIGITS", 10**9)
    planted = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate], derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
        given(**nasty_arguments)(_nasty_check))
    with pytest.raises(AssertionError):
        planted()


@given(events=st.lists(event_bytes(), max_size=30),
       stamps=st.lists(st.none() | st.just(-1) | st.integers(0, 2**45), min_size=30, max_size=30))
@settings(max_examples=50, deadline=None)
def test_topics_the_fast_path_leaves_to_the_router_count_the_same(events: list[bytes], stamps: list[int | None]
                                                                  ) -> None:
    """A topic with a counter reading a field both as a value and as an object holding fields (of the payload or
    of the record's key) has no fast path, and apply_batch is apply, whatever the records' timestamps."""
    for body in ROUTER_ONLY:
        assert FastRoute.build(counter_set([BODIES[0], body]), TOPIC) is None
    counters = counter_set([BODIES[0], *ROUTER_ONLY, BODIES[16]])
    assert FastRoute.build(counters, TOPIC) is None
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    records = [Record(offset, raw, stamp) for (offset, raw), stamp in zip(enumerate(events), stamps, strict=False)]
    assert described(batched.apply_batch(records)) == described(outcomes(reference, records))
    assert stored(batched.states) == stored(reference.states)


def test_the_fast_path_takes_the_common_event() -> None:
    """A plain valid event is prepared by the fast path (not handed to the router), and a retry is dropped."""
    counters = counter_set(BODIES[:2])
    m = mutator(counters, 10)
    fast = m.applier.fast
    assert fast is not None
    raw = b'{"sym": "IBM", "n": 3, "id": "e1"}'
    create = lambda row, index: new_state(counters[row.names[index]])  # noqa: E731
    assert fast.apply_event(raw, None, None, (), fast.new_rows(), lambda counter, event_id: True, [], create) == APPLIED
    result = m.apply_batch([Record(0, raw), Record(1, raw)])
    assert (result.applied, result.duplicates) == (1, 1)
    assert m.states[("c1", "IBM")].value() == 3
    assert m.apply(Record(2, raw)) == (Outcome.DUPLICATE, None)


def test_a_field_name_the_decoder_cannot_take_leaves_the_topic_to_the_router() -> None:
    """A key field named with a quote, a backslash or a control character (msgspec takes none as a field's
    name) gives the topic no fast path, instead of an error when the consumer starts; apply_batch counts."""
    counters = parse_definitions('[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\nkey = ["a\\"b"]\n')
    assert FastRoute.build(counters, TOPIC) is None
    m = mutator(counters, 10)
    assert m.apply_batch([Record(0, b'{"a\\"b": "x"}')]).applied == 1
    assert m.states[("c", "x")].value() == 1


def test_the_fast_path_takes_nested_bucketed_and_decimal_events() -> None:
    """Events of the shapes the router alone used to take (a key inside an object, an hourly bucket on the
    event's time and on the record's, an exact decimal sum) are applied by the fast path itself, to the
    states the router gives."""
    counters = counter_set([
        'kind = "count"\nkey = ["meta.a"]\nbucket = { field = "ts", size = "1h", format = "epoch_seconds" }\n'
        'event_id = "id"\nretain = "1d"',
        'kind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"\nwhere = { "meta.b" = ["buy"] }',
        'kind = "count"\nbucket = { field = "@timestamp", size = "1m", format = "epoch_millis" }',
    ])
    fast = FastRoute.build(counters, TOPIC)
    assert fast is not None
    create = lambda row, index: new_state(counters[row.names[index]])  # noqa: E731
    raw = b'{"sym": "IBM", "x": 0.1, "ts": 1764140400, "id": "e1", "meta": {"a": "u1", "b": "buy"}}'
    rows = fast.new_rows()
    assert fast.apply_event(raw, NOW_S * 1000, None, (), rows, lambda counter, event_id: True, [], create) == APPLIED
    # the record written more than a day after its bucket ended: late for c0, which skips it; the others count it
    assert fast.apply_event(raw, (NOW_S + 3 * 86_400) * 1000, None, (), rows, lambda c, e: True, [],
                            create) == APPLIED
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    records = [Record(i, raw, NOW_S * 1000 + i) for i in range(3)]
    assert described(batched.apply_batch(records)) == described(outcomes(reference, records))
    assert stored(batched.states) == stored(reference.states)
    assert str(batched.states[("c1", "IBM")].value()) == "0.3"
    assert sorted(batched.states) == [("c0", "u1|2025-11-26T07:00Z"), ("c1", "IBM"), ("c2", "2025-11-26T07:00Z")]


def test_the_differential_check_catches_a_planted_bucket_divergence() -> None:
    """A fast path that allowed event times further ahead of their records than the router does would count
    what the router refuses; the differential check tells them apart."""
    counters = counter_set([BODIES[16]])
    batched = mutator(counters, 10)
    batched.applier.fast = FastRoute.build(counters, TOPIC, 400, 6, MAX_KEY_BYTES, max_future_skew_s=10**9)
    reference = mutator(counters, 10)
    records = [Record(0, b'{"sym": "IBM", "ts": 1764140400, "id": "e1"}', (NOW_S - 3 * 86_400) * 1000)]
    assert described(batched.apply_batch(records)) != described(outcomes(reference, records))


def test_the_differential_check_catches_a_planted_decimal_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path reads short decimals alone as passing the router's bounds; with that limit taken out it
    would count a decimal of 150 digits the router refuses, and the check tells the two paths apart."""
    counters = counter_set([BODIES[22]])
    records = [Record(0, b'{"sym": "IBM", "x": 0.' + b"1" * 150 + b', "id": "e1"}')]
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    assert described(batched.apply_batch(records)) == described(outcomes(reference, records))
    monkeypatch.setattr(fast_route, "SHORT_DECIMAL", 10**6)
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    assert described(batched.apply_batch(records)) != described(outcomes(reference, records))


def test_the_fast_path_skips_the_counters_an_event_lacks_fields_of(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event lacking the key of one counter and the value of another is applied by the fast path to the
    others, and the two it does not apply to are told, in the definitions' order, as the router tells them; a
    fast path that did not tell them is caught."""
    counters = counter_set([MIXED_BODIES[0], MIXED_BODIES[1], MIXED_BODIES[2], MIXED_BODIES[4]])
    records = [Record(0, b'{"side": "buy", "sym": "IBM", "x": null, "flag": true}')]
    fast = FastRoute.build(counters, TOPIC)
    assert fast is not None
    create = lambda row, index: new_state(counters[row.names[index]])  # noqa: E731
    raw = records[0].value or b""
    assert fast.apply_event(raw, None, None, (), fast.new_rows(), lambda c, e: True, [], create) == APPLIED
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    assert described(batched.apply_batch(records)) == described(outcomes(reference, records))
    assert batched.applier.router.skipped == reference.applier.router.skipped == [  # type: ignore[attr-defined]
        ("c2", "key_missing"), ("c3", "value_null")]
    monkeypatch.setattr(fast_route, "_report", lambda on_not_applicable, on_late, skipped: None)
    reference, batched = mutator(counters, 10), mutator(counters, 10)
    batched.apply_batch(records)
    outcomes(reference, records)
    assert batched.applier.router.skipped != reference.applier.router.skipped  # type: ignore[attr-defined]


def test_the_differential_check_catches_a_planted_bucket_reuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch path reuses the last bucket an integer time fell in for the times inside it; one that kept it
    for a time past its end would count an event in the wrong hour, and the check tells the two paths apart."""
    counters = counter_set([BODIES[16]])
    records = [Record(i, b'{"sym": "IBM", "ts": %d, "id": "e%d"}' % (NOW_S + 3600 * i, i), None) for i in range(2)]

    def states_of(m: Mutator) -> dict[tuple[str, str], bytes]:
        return stored(m.states)

    reference, batched = mutator(counters, 10), mutator(counters, 10)
    outcomes(reference, records)
    batched.apply_batch(records)
    assert states_of(batched) == states_of(reference)
    widened = fast_route._last_bucket
    monkeypatch.setattr(fast_route, "_last_bucket", lambda last, size, scale, v, found: widened(
        last, size * 2, scale, v, found))
    batched = mutator(counters, 10)
    batched.apply_batch(records)
    assert states_of(batched) != states_of(reference)


def test_the_fast_path_takes_fields_of_the_record_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counters reading fields of the record's key as a JSON document (``@key.PATH``) are applied by the batch
    path itself, as the router applies them; a key document the router refuses (too deep) is handed back, and a
    batch path that read it anyway is caught by the differential check."""
    counters = counter_set([BODIES[0], BODIES[32], BODIES[33], BODIES[34]])
    fast = FastRoute.build(counters, TOPIC, 400, 6, MAX_KEY_BYTES)
    assert fast is not None
    create = lambda row, index: new_state(counters[row.names[index]])  # noqa: E731
    raw = b'{"sym": "IBM", "side": "buy", "id": "e1"}'
    key = b'{"customer": "c1", "region": "x", "o": {"id": "o1"}, "n": 4}'
    assert fast.apply_event(raw, None, key, (), fast.new_rows(), lambda c, e: True, [], create) == APPLIED
    deep = b'{"customer": "c2", "z": ' + b'{"a": ' * 6 + b"1" + b"}" * 7
    records = [Record(0, raw, None, key), Record(1, raw, None, None), Record(2, raw, None, deep),
               Record(3, raw, None, b'{"customer": 5, "region": 1, "o": {"id": 2}, "n": 1.5}')]

    def agree() -> bool:
        reference, batched = mutator(counters, 10), mutator(counters, 10)
        if described(batched.apply_batch(records)) != described(outcomes(reference, records)):
            return False
        return stored(batched.states) == stored(reference.states)

    assert agree()
    reference = mutator(counters, 10)
    outcomes(reference, records)
    assert ("c1", "c1") in reference.states
    assert ("c3", "o1|buy") in reference.states
    monkeypatch.setattr(fast_route, "_key_document", lambda decode, size, depth, digits, key: decode(key))
    assert not agree()


def test_late_events_take_the_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event whose record was written after its bucket's retention (a replay of old records) is skipped by
    the retained counters on the batch path, told to ``on_late`` in the definitions' order among the skips, and
    counted by the others, as the router does; a late event whose key the router refuses is refused by the
    retained counter as the router refuses it. A
    batch path that counted late events is caught."""
    counters = counter_set([BODIES[0], BODIES[17], 'kind = "count"\nkey = ["user"]', BODIES[21]])
    late_ms = (NOW_S + 3 * 86_400) * 1000
    records = [Record(i, b'{"sym": "IBM", "n": %d, "ts": %d, "ms": %d, "id": "e%d"}' % (i, NOW_S, NOW_S * 1000, i),
                      late_ms) for i in range(3)]
    records.append(Record(3, b'{"sym": "' + b"e" * (MAX_KEY_BYTES + 1) + b'", "n": 1, "ts": %d}' % NOW_S, late_ms))
    fast = FastRoute.build(counters, TOPIC, 400, 6, MAX_KEY_BYTES)
    assert fast is not None
    create = lambda row, index: new_state(counters[row.names[index]])  # noqa: E731
    assert fast.apply_event(records[0].value or b"", late_ms, None, (), fast.new_rows(), lambda c, e: True, [],
                            create) == APPLIED

    def compared() -> tuple[bool, list[tuple[str, str]]]:
        reference, batched = mutator(counters, 10), mutator(counters, 10)
        same = (described(batched.apply_batch(records)) == described(outcomes(reference, records))
                and stored(batched.states) == stored(reference.states)
                and batched.applier.router.skipped == reference.applier.router.skipped)  # type: ignore[attr-defined]
        return same, reference.applier.router.skipped  # type: ignore[attr-defined]

    same, told = compared()
    assert same
    assert told[:3] == [("c1", "late"), ("c2", "key_missing"), ("c3", "late")]
    monkeypatch.setattr(fast_route, "_skip", lambda skipped, entry: skipped if entry[2] is None else _skip(
        skipped, entry))
    assert not compared()[0]


_skip = fast_route._skip


# --- mistyped fields: present, of the wrong type or out of range, refused by some counters on the batch path -----

# Per field, values some counters refuse: a string for a number, a list or an object where a key is expected, a
# float or a boolean key, a number too large, an item that is not text, a decimal with an exponent, a time that
# is not one, an event id of the wrong type.
MISTYPED = {
    "sym": ["ten", [1], {"a": 1}, 1.5, False, 2**70, "e" * (MAX_KEY_BYTES + 1)],
    "n": ["ten", "7", [1], {"a": 1}, 2**70, -(2**64), 1.5, True, 1e300],
    "x": ["x", "1.5", [1.5], {"a": 1}, True, 2**70, 1e300, "NaN"],
    "user": [[1], {"a": 1}, 1.5, True, "e" * (MAX_KEY_BYTES + 1)],
    "side": [[1], {"a": "buy"}, 1.5],
    "flag": [[1], {"a": 1}, 2.5],
    "ts": ["x", [1], 1.5e9, True],
    "iso": [5.5, [1], "not a time"],
    "id": [[1], {"a": 1}, 1.5, True],
    "meta": [{"a": [1], "b": "buy"}, {"a": "u1", "b": [1]}, {"a": 1.5, "b": "buy"}],
}
# Written as text: exact decimals with an exponent, huge and negative zero, where a value is expected.
MISTYPED_TEXT = {"x": ["1.5e3", "-0.0", "1E+400", "2.5e-3", "0." + "1" * 60]}


@st.composite
def mistyped_event(draw: st.DrawFn) -> bytes:
    """A valid event (every field a counter reads) with one to three fields present but mistyped."""
    event: dict[str, object] = {"sym": draw(st.sampled_from(["IBM", "MSFT", 7])), "n": draw(st.integers(-5, 5)),
                                "x": draw(st.sampled_from([1.5, -2.25, 3])), "id": draw(st.sampled_from(["i1", "i2"])),
                                "rid": "r1", "side": draw(st.sampled_from(["buy", "sell"])),
                                "user": draw(st.sampled_from(["u1", "u2"])), "flag": True, "ts": NOW_S,
                                "iso": "2025-11-26T07:00:00Z", "ms": NOW_S * 1000, "meta": {"a": "u1", "b": "buy"}}
    texts: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(sorted(MISTYPED)), min_size=1, max_size=3, unique=True)):
        if name in MISTYPED_TEXT and draw(st.booleans()):
            texts[name] = draw(st.sampled_from(MISTYPED_TEXT[name]))
            event[name] = "@"
        else:
            event[name] = draw(st.sampled_from(MISTYPED[name]))
    text = json.dumps(event)
    for name, literal in texts.items():
        text = text.replace(f'"{name}": "@"', f'"{name}": {literal}')
    return text.encode()


mistyped_arguments = {"bodies": st.lists(st.sampled_from(BODIES), min_size=1, max_size=6),
                      "events": st.lists(mistyped_event() | event_bytes(), max_size=30),
                      "cuts": st.lists(st.integers(1, 8), max_size=6),
                      "window": st.sampled_from([0, 3]),
                      "stamps": st.lists(STAMPS, max_size=4)}


def _mistyped_check(bodies: list[str], events: list[bytes], cuts: list[int], window: int,
                    stamps: list[int | None]) -> None:
    assert_paths_agree(bodies, events, cuts, window, 1, stamps=stamps or [NOW_S * 1000])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**mistyped_arguments)
def test_batch_path_equals_record_at_a_time_on_mistyped_fields(bodies: list[str], events: list[bytes],
                                                               cuts: list[int], window: int,
                                                               stamps: list[int | None]) -> None:
    """Events whose fields are present but mistyped for some counters (each shape of ``MISTYPED``): the batch
    path gives each counter's refusal (its error, path and reason, in the definitions' order), the other
    counters' updates and skips, and the outcomes of the router."""
    _mistyped_check(bodies, events, cuts, window, stamps)


REFUSING = counter_set([BODIES[0], BODIES[1], BODIES[8], BODIES[16], BODIES[22]])


def test_mistyped_fields_are_decided_on_the_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value of the wrong type or out of range (an exact decimal with an exponent too large among them), or a
    key part the router refuses, is refused by the counters reading it on the batch path itself (the router is
    not asked), each with the router's error, while the other counters count the record."""
    records = [Record(0, b'{"sym": "IBM", "n": "ten", "x": 1.5, "user": "u1", "id": "e0", "ts": %d}' % NOW_S),
               Record(1, b'{"sym": "IBM", "n": 2, "x": 1.5, "user": [1], "id": "e1", "ts": %d}' % NOW_S),
               Record(2, b'{"sym": [1], "n": 1, "x": 1.5, "user": "u1", "id": "e2", "ts": %d}' % NOW_S),
               Record(3, b'{"sym": "IBM", "n": %d, "x": 1.5, "user": "u1", "id": "e3", "ts": %d}' % (2**70, NOW_S)),
               Record(4, b'{"sym": "IBM", "n": 1, "x": 1.5, "user": "u1", "id": "e0", "ts": %d}' % NOW_S),
               # exact decimals with an exponent: one the decimal sum keeps, one it refuses
               Record(5, b'{"sym": "IBM", "n": 1, "x": 2.5e-3, "user": "u1", "id": "e5", "ts": %d}' % NOW_S),
               Record(6, b'{"sym": "IBM", "n": 1, "x": 1E+400, "user": "u1", "id": "e6", "ts": %d}' % NOW_S)]
    reference, batched = mutator(REFUSING, 10), mutator(REFUSING, 10)
    expected = outcomes(reference, [Record(r.offset, r.value, NOW_S * 1000) for r in records])

    def no_router(self: Mutator, record: Record) -> None:
        raise AssertionError(f"record {record.offset} taken by the router")

    monkeypatch.setattr(Mutator, "apply", no_router)
    got = batched.apply_batch([Record(r.offset, r.value, NOW_S * 1000) for r in records])
    assert described(got) == described(expected)
    assert stored(batched.states) == stored(reference.states)
    refused = {r.offset: [(x.counter, type(x).__name__, x.path) for x in getattr(e, "refusals", ())]
               for r, e in got.invalid}
    assert refused == {0: [("c1", "WrongTypeError", "n")], 1: [("c2", "WrongTypeError", "user")],
                       2: [(c, "WrongTypeError", "sym") for c in ("c0", "c1", "c2", "c3", "c4")],
                       3: [("c1", "ValueOutOfRangeError", "n")], 6: [("c4", "ValueOutOfRangeError", "x")]}
    # 2 is refused by all (invalid), 4 a retry of 0's id, which c0 counted: a duplicate
    assert (got.applied, got.duplicates) == (5, 1)
    assert str(batched.states[("c4", "IBM")].value()) == "4.5025"  # 1.5 three times (0, 1, 3), 0.0025 (5)


def _planted(wrap: Callable[[Any], Any]) -> Any:
    """FastRoute.build, its apply_event and apply_fields wrapped by ``wrap``."""
    build = FastRoute.build.__func__  # type: ignore[attr-defined]

    def planted_build(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        fast = build(cls, *args, **kwargs)
        if fast is not None:
            fast.apply_event, fast.apply_fields = wrap(fast.apply_event), wrap(fast.apply_fields)
        return fast

    return classmethod(planted_build)


def _counted_anyway(apply: Any) -> Any:
    # a refused record counted as applied
    return lambda *args: APPLIED if type(outcome := apply(*args)) is tuple else outcome


def _last_refusal_lost(apply: Any) -> Any:
    # a record refused by two counters or more dead-lettered with the first refusal alone
    return lambda *args: (outcome[0], outcome[1][:1]) if type(outcome := apply(*args)) is tuple else outcome


@pytest.mark.parametrize("wrap", [_counted_anyway, _last_refusal_lost])
def test_the_differential_check_catches_a_planted_refusal_divergence(monkeypatch: pytest.MonkeyPatch,
                                                                     wrap: Callable[[Any], Any]) -> None:
    """A batch path that counted a record some counters refused, or lost a refusal of its dead letter, is told
    apart from the router by the mistyped differential check."""
    monkeypatch.setattr(FastRoute, "build", _planted(wrap))
    planted = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate], derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow])(given(**mistyped_arguments)(_mistyped_check))
    with pytest.raises(AssertionError):
        planted()


ROW_GROUPS = [  # (key paths, bucketed) of each group of ROW_MAKER_COUNTERS
    ((), False), (("sym",), False), (("sym", "side"), False), ((), True), (("sym",), True), (("sym", "side"), True)]
ROW_MAKER_COUNTERS = [
    'kind = "count"', 'kind = "count"\nkey = ["sym"]', 'kind = "count"\nkey = ["sym", "side"]',
    *(f'{body}\nbucket = {{ field = "ts", size = "1h", format = "epoch_seconds" }}' for body in
      ('kind = "count"', 'kind = "count"\nkey = ["sym"]', 'kind = "count"\nkey = ["sym", "side"]'))]
KEY_VALUES = (st.text(alphabet="ab|\\\\x", max_size=30) | st.integers(-(2**70), 2**70) | st.booleans()
              | st.floats(allow_nan=False) | st.none() | st.just(fast_route._UNSET)
              | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@settings(max_examples=300, deadline=None)
@given(group=st.integers(0, len(ROW_GROUPS) - 1), values=st.lists(KEY_VALUES, min_size=2, max_size=2),
       bucket=st.sampled_from(["2025-11-26T07:00Z", "x|y", ""]))
def test_the_row_makers_make_the_rows_the_general_maker_makes(group: int, values: list[Any], bucket: str) -> None:
    """Each key group's generated row maker (its common case written out) and the general one give the same
    row (key, counters, identities), keep it under the same look-up key, and refuse the same values with the
    same error: strings holding the separator or the escape, integers beyond 64 bits, booleans, floats,
    missing and null values, arrays and objects, keys longer than the limit (MAX_KEY_BYTES is small)."""
    counters = counter_set(ROW_MAKER_COUNTERS)
    fast = FastRoute.build(counters, TOPIC, max_key_bytes=MAX_KEY_BYTES)
    assert fast is not None
    paths, bucketed = ROW_GROUPS[group]
    args = (*values[:len(paths)], *([bucket] if bucketed else []))
    made: list[tuple[object, dict[Any, Any]]] = []
    for make in (fast.row_makers[group], lambda rows, values: fast._new_row(group, rows, values)):
        rows: dict[Any, Any] = {}
        try:
            row = make(rows, args)
        except Exception as exc:  # compared, whatever it is
            made.append(((type(exc), str(exc)), rows))
            continue
        made.append((None if row is None else (row.key, row.names, row.idents, row.states, row.touched),
                     {k: v.key for k, v in rows.items()}))
    assert made[0] == made[1]
