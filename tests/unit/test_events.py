"""Events to updates: routing, filters, instance keys, and a named error for every invalid event."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.definitions import parse_definitions
from schemas.errors import (
    InvalidEventError,
    KeyTooLongError,
    MalformedInstanceKeyError,
    MissingFieldError,
    OversizedEventError,
    UnparseableEventError,
    ValueOutOfRangeError,
    WrongTypeError,
)
from schemas.events import EventRouter, Update, apply_updates, decode_instance_key, encode_instance_key
from schemas.kinds import State

DEFS = parse_definitions(
    """
[[counter]]
name = "shares"
topics = ["trades"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "trade_id"
where = { side = "buy" }

[[counter]]
name = "notional"
topics = ["trades"]
kind = "sum"
number = "decimal"
key = ["symbol", "user.id"]
value = "price"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "trades"
topics = ["trades"]
kind = "count"

[[counter]]
name = "price_max"
topics = ["trades"]
kind = "max"
number = "float"
key = "symbol"
value = "price"

[[counter]]
name = "pages"
topics = ["clicks"]
kind = "top_k"
value = "page"
where = { internal = false }

[[counter]]
name = "users"
topics = ["clicks"]
kind = "distinct"
key = "site"
value = "user"
bucket = { field = "at", size = "1d", format = "epoch_millis" }

[[counter]]
name = "qty_loose"
topics = ["loose"]
kind = "sum"
value = "qty"
coerce = true
"""
)
ROUTER = EventRouter(DEFS)
TRADE: dict[str, Any] = {
    "symbol": "IBM",
    "qty": 100,
    "side": "buy",
    "price": 123.45,
    "ts": "2026-11-22T10:17:00Z",
    "trade_id": "t-1",
    "user": {"id": 42},
}


def route(topic: str, event: dict[str, Any] | bytes) -> list[Update]:
    raw = event if isinstance(event, bytes) else json.dumps(event).encode()
    return ROUTER.route(topic, raw)


def invalid(topic: str, event: dict[str, Any] | bytes) -> InvalidEventError:
    with pytest.raises(InvalidEventError) as info:
        route(topic, event)
    return info.value


def test_event_becomes_one_update_per_matching_counter() -> None:
    """One trade feeds every counter on its topic, with keys, values and event ids."""
    assert route("trades", TRADE) == [
        Update("shares", "IBM", 100, "t-1"),
        Update("notional", "IBM|42|2026-11-22T10:00Z", Decimal("123.45"), None),
        Update("trades", "", None, None),
        Update("price_max", "IBM", 123.45, None),
    ]


def test_decimal_counter_gets_the_exact_decimal_text() -> None:
    """A decimal counter sees 0.1 as Decimal('0.1'), not the nearest double."""
    (update,) = [u for u in route("trades", {**TRADE, "price": 0.1}) if u.counter == "notional"]
    assert update.value == Decimal("0.1")


def test_a_decimal_counter_holds_an_integer_to_the_decimals_bounds() -> None:
    """An exact counter takes an integer past 2**64 as it takes 1e30 or a decimal of 100 digits; past 100 digits
    it is refused as such a decimal is."""
    exact = EventRouter(parse_definitions('[[counter]]\nname = "notional"\ntopics = ["t"]\nkind = "sum"\n'
                                          'number = "decimal"\nkey = "symbol"\nvalue = "price"\n', "test"))
    big = 10**40 + 1
    (update,) = exact.route("t", json.dumps({"symbol": "IBM", "price": big}).encode())
    assert update.value == Decimal(big)
    with pytest.raises(ValueOutOfRangeError, match="more than 100 digits"):
        exact.route("t", json.dumps({"symbol": "IBM", "price": 10**100}).encode())


def test_an_event_too_deep_for_the_parser_is_refused_for_one_reason_at_any_stack_depth() -> None:
    """A decimal topic's parser recurses, and its RecursionError names where the stack ran out ("while decoding
    a JSON object" or "array"), which the caller's depth moves: the router and the batch path, called from
    different depths, wrote two reasons for one record. The reason is the depth bound's now."""
    from schemas.errors import UnparseableEventError

    exact = EventRouter(parse_definitions('[[counter]]\nname = "notional"\ntopics = ["t"]\nkind = "sum"\n'
                                          'number = "decimal"\nkey = "symbol"\nvalue = "price"\n', "test"))
    raw = b'{"symbol":"IBM","z":' + b'[{"a":' * 5000 + b"1" + b"}]" * 5000 + b"}"

    def reason(frames: int) -> str:
        if frames:
            return reason(frames - 1)
        with pytest.raises(UnparseableEventError) as refused:
            exact.route("t", raw)
        return str(refused.value)

    assert {reason(n) for n in range(4)} == {"<event>: event is nested deeper than 32"}


def test_where_filters_without_error() -> None:
    """An event that does not match ``where`` is skipped for that counter, not rejected."""
    updates = route("trades", {**TRADE, "side": "sell"})
    assert "shares" not in {u.counter for u in updates}
    assert "trades" in {u.counter for u in updates}


def test_where_does_not_confuse_booleans_with_numbers() -> None:
    """``internal = false`` matches JSON false only, not 0, and a missing field does not match."""
    assert [
        u.counter
        for u in route("clicks", {"page": "/", "internal": False, "site": "a", "user": "u", "at": 0})
    ] == [
        "pages",
        "users",
    ]
    assert [
        u.counter for u in route("clicks", {"page": "/", "internal": 0, "site": "a", "user": "u", "at": 0})
    ] == ["users"]
    assert [u.counter for u in route("clicks", {"page": "/", "site": "a", "user": "u", "at": 0})] == ["users"]


def test_epoch_millis_bucket_and_integer_items() -> None:
    """Epoch-millisecond buckets start at UTC midnight; integer items count by their decimal text."""
    (_, users) = route(
        "clicks", {"page": "/", "internal": False, "site": "a|b", "user": 7, "at": 1_795_000_000_000}
    )
    assert users == Update("users", "a\\|b|2026-11-18T00:00Z", "7", None)


def test_unknown_topic_gives_no_updates() -> None:
    """Events on a topic no counter reads are ignored, even when they are not JSON."""
    assert ROUTER.route("other", b"not json") == []


@pytest.mark.parametrize(
    ("event", "error", "counter", "path", "reason"),
    [
        ({**TRADE, "qty": "500"}, WrongTypeError, "shares", "qty", "expected an integer, got string"),
        ({**TRADE, "qty": 5.0}, WrongTypeError, "shares", "qty", "expected an integer"),
        ({**TRADE, "qty": True}, WrongTypeError, "shares", "qty", "got boolean"),
        ({**TRADE, "qty": 2**70}, ValueOutOfRangeError, "shares", "qty", "not between -2**64 and 2**64"),
        ({**TRADE, "symbol": 1.5}, WrongTypeError, "shares", "symbol", "string, integer or boolean"),
        ({**TRADE, "trade_id": None}, MissingFieldError, "shares", "trade_id", "event id"),
        ({**TRADE, "trade_id": [1]}, WrongTypeError, "shares", "trade_id", "got array"),
        ({**TRADE, "user": 5}, WrongTypeError, "notional", "user", "expected an object"),
        ({**TRADE, "ts": "2026-11-22T10:17:00"}, ValueOutOfRangeError, "notional", "ts", "no UTC offset"),
        ({**TRADE, "ts": "yesterday"}, ValueOutOfRangeError, "notional", "ts", "not an ISO-8601"),
        ({**TRADE, "ts": 1_795_000_000}, WrongTypeError, "notional", "ts", "ISO-8601 timestamp string"),
        ({**TRADE, "price": "1.5"}, WrongTypeError, "notional", "price", "expected a number"),
        ({**TRADE, "price": 1e300}, ValueOutOfRangeError, "notional", "price", "exponent"),
        ({**TRADE, "symbol": "x" * 2000}, KeyTooLongError, "shares", "symbol", "exceeds 1024"),
    ],
)
def test_invalid_event_raises_named_error(
    event: dict[str, Any], error: type[InvalidEventError], counter: str, path: str, reason: str
) -> None:
    """Each kind of bad field gives its named error with the counter, the field path and the reason."""
    err = invalid("trades", event)
    assert type(err) is error
    assert (err.counter, err.path) == (counter, path)
    assert reason in err.reason


@pytest.mark.parametrize(
    ("raw", "error", "reason"),
    [
        (b"{", UnparseableEventError, "not a UTF-8 JSON"),
        (b"\xff\xfe", UnparseableEventError, "not a UTF-8 JSON"),
        (b"[1, 2]", UnparseableEventError, "JSON array, not an object"),
        (b'{"a":' + b"[" * 40 + b"]" * 40 + b"}", UnparseableEventError, "nested deeper than 32"),
        (b"[" * 100_000 + b"]" * 100_000, UnparseableEventError, "nested deeper than 32"),  # past the parser's stack
        (b" " * 1_048_577, OversizedEventError, "exceeds 1048576"),
    ],
)
def test_unusable_event_raises_named_error(raw: bytes, error: type[InvalidEventError], reason: str) -> None:
    """Unparseable, too deep or too large events are named errors for the whole event (path "")."""
    err = invalid("trades", raw)
    assert type(err) is error
    assert (err.path, err.counter) == ("", None)
    assert reason in err.reason


def test_non_finite_numbers_are_out_of_range() -> None:
    """NaN and Infinity literals are refused with the field's path, not silently counted."""
    raw = json.dumps({**TRADE, "price": float("nan")}).encode()
    assert b"NaN" in raw
    err = invalid("trades", raw)
    assert (type(err), err.path) == (ValueOutOfRangeError, "price")


def test_lone_surrogate_in_key_is_refused() -> None:
    """A key that cannot be encoded as UTF-8 is a named error, not a driver crash later."""
    err = invalid("trades", b'{"symbol": "\\ud800", "qty": 1, "side": "buy", "trade_id": "t"}')
    assert (type(err), err.path) == (ValueOutOfRangeError, "symbol")


@pytest.mark.parametrize(
    ("event", "skipped"),
    [
        ({k: v for k, v in TRADE.items() if k != "qty"}, [("shares", "value_missing")]),
        ({**TRADE, "qty": None}, [("shares", "value_null")]),
        ({**TRADE, "symbol": None}, [("shares", "key_null"), ("notional", "key_null"), ("price_max", "key_null")]),
        ({**TRADE, "user": {}}, [("notional", "key_missing")]),
        ({**TRADE, "user": {"id": None}}, [("notional", "key_null")]),
    ],
)
def test_missing_field_skips_only_its_counter(event: dict[str, Any], skipped: list[tuple[str, str]]) -> None:
    """An event lacking a counter's key or value field (absent or null) is skipped by that counter, with a
    reason, and counted by the others."""
    decision = ROUTER.decide("trades", json.dumps(event).encode())
    assert decision.refusals == []
    assert decision.not_applicable == skipped
    assert {u.counter for u in decision.updates} == {"shares", "notional", "trades", "price_max"} - {
        name for name, _ in skipped}


def test_coerce_allows_numeric_strings_only_when_asked() -> None:
    """``coerce = true`` turns "500" into 500 and integral floats into ints; other text stays an error."""
    assert route("loose", {"qty": "500"}) == [Update("qty_loose", "", 500, None)]
    assert route("loose", {"qty": 7.0}) == [Update("qty_loose", "", 7, None)]
    assert type(invalid("loose", {"qty": "5 apples"})) is WrongTypeError


def test_apply_updates_creates_and_mutates_states() -> None:
    """apply_updates creates missing states from definitions and applies every update in place."""
    states: dict[tuple[str, str], State] = {}
    touched: set[tuple[str, str]] = set()
    for qty in (1, 2, 3):
        apply_updates(states, route("trades", {**TRADE, "qty": qty}), DEFS, touched)
    assert states[("shares", "IBM")].value() == 6
    assert states[("trades", "")].value() == 3
    assert states[("notional", "IBM|42|2026-11-22T10:00Z")].value() == Decimal("370.35")
    assert touched == set(states)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), max_size=5))
def test_instance_key_encoding_round_trips(parts: list[str]) -> None:
    """decode(encode(parts)) gives the parts back, whatever characters they hold."""
    key = encode_instance_key(parts)
    assert decode_instance_key(key) == (tuple(parts) if parts else ("",))


def test_single_plain_component_is_its_own_key() -> None:
    """A key without separators or backslashes is written as it is."""
    assert encode_instance_key(["IBM"]) == "IBM"
    assert encode_instance_key(["a|b", "c\\d"]) == "a\\|b|c\\\\d"


@pytest.mark.parametrize("key", ["a\\", "a\\x"])
def test_malformed_instance_key_is_refused(key: str) -> None:
    """A dangling or unknown escape is a MalformedInstanceKeyError."""
    with pytest.raises(MalformedInstanceKeyError):
        decode_instance_key(key)


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=200)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
    ).map(lambda v: json.dumps(v).encode())
)
def test_any_input_gives_updates_or_a_named_error(raw: bytes) -> None:
    """No input crashes the router: it returns updates or raises an InvalidEventError."""
    for topic in ("trades", "clicks", "loose"):
        try:
            updates = ROUTER.route(topic, raw)
        except InvalidEventError as err:
            reason = err.reason
        else:
            reason = "" if all(isinstance(u, Update) for u in updates) else "not updates"
        assert isinstance(reason, str)
        assert reason != "not updates"
