"""Avro, Protobuf and JSON Schema topics: the wire format, the type mapping, the inline mode and the bounds."""

from __future__ import annotations

import io
import json
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from countersink.settings import SchemaRegistrySettings
from schemas.definitions import parse_definitions
from schemas.errors import DefinitionError, InvalidEventError, UnparseableEventError
from schemas.events import EventRouter
from schemas.formats import (
    SCHEMA_TYPE,
    ProtoSchema,
    SchemaCache,
    SchemaError,
    SchemaNotLoadedError,
    TopicFormat,
    UnknownSchemaError,
    WriterSchema,
    avro_encoder,
    compile_avro,
    compile_json_schema,
    decoders,
    encode_message_indexes,
    frame,
    read_message_indexes,
    registry_decoder,
    schema_id_of,
    schema_ids,
    split_header,
)
from tests.unit.test_fast_route import BODIES, stored
from tests.unit.test_fast_route import FIELDS as FAST_ROUTE_FIELDS
from tests.unit.test_fast_route import described as fast_route_described
from tests.unit.test_fast_route import outcomes as fast_route_outcomes
from tests.unit.test_fast_route import values as fast_route_values

V1 = {"type": "record", "name": "View", "namespace": "shop", "fields": [
    {"name": "page", "type": "string"},
    {"name": "n", "type": "long"},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "user", "type": "string", "default": "anon"}]}

PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Other { int32 x = 1; }
message Purchase {
  string sku = 1;
  int64 amount = 2;
  optional string user = 3;
  enum Kind { VIEW = 0; BUY = 1; }
  Kind kind = 4;
  google.protobuf.Timestamp at = 5;
  message Where { string city = 1; }
  Where where = 6;
  map<string, int64> tags = 7;
  bytes blob = 8;
}
"""


def avro_bytes(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


# --- the wire format ----------------------------------------------------------------------------------------


def test_header_gives_the_schema_id_and_refuses_other_framing() -> None:
    """The magic byte 0 and a big-endian id are read; a short value or another magic byte is unparseable."""
    raw = frame(258, b"payload")
    assert raw[:5] == b"\x00\x00\x00\x01\x02"
    assert split_header(raw) == (258, 5)
    assert schema_id_of(raw) == 258
    assert schema_ids([raw, frame(7, b""), None, b"{}", b"\x01\x00\x00\x00\x09"]) == {258, 7}
    with pytest.raises(UnparseableEventError, match="too short"):
        split_header(b"\x00\x00")
    with pytest.raises(UnparseableEventError, match="magic byte 123"):
        split_header(b'{"a": 1}')


@pytest.mark.parametrize("indexes", [(0,), (1,), (0, 2), (3, 0, 1), (200, 70000)])
def test_message_indexes_round_trip(indexes: tuple[int, ...]) -> None:
    """Message indexes encode as zig-zag varints (``[0]`` as one zero byte) and read back whole."""
    encoded = encode_message_indexes(indexes)
    if indexes == (0,):
        assert encoded == b"\x00"
    assert read_message_indexes(b"hdr" + encoded + b"rest", 3) == (indexes, 3 + len(encoded))


def test_message_indexes_are_bounded() -> None:
    """A count past the bound, a negative index or a truncated varint is unparseable, not a crash."""
    with pytest.raises(UnparseableEventError, match="message indexes"):
        read_message_indexes(encode_message_indexes(tuple(range(17))), 0)
    with pytest.raises(UnparseableEventError, match="negative"):
        read_message_indexes(b"\x02\x01", 0)  # one index, zig-zag 1 = -1
    with pytest.raises(UnparseableEventError, match="varint"):
        read_message_indexes(b"\x02\xff", 0)


# --- Avro ------------------------------------------------------------------------------------------------------


def test_avro_v1_record_reads_with_the_reader_schema_default() -> None:
    """A v1 record read with a v2 reader schema gets the added field's default; a v2 record keeps its value."""
    decode = compile_avro(json.dumps(V1), json.dumps(V2))
    assert decode(avro_bytes(V1, {"page": "/a", "n": 3})) == {"page": "/a", "n": 3, "user": "anon"}
    decode_v2 = compile_avro(json.dumps(V2), json.dumps(V2))
    assert decode_v2(avro_bytes(V2, {"page": "/b", "n": 1, "user": "u1"})) == {"page": "/b", "n": 1, "user": "u1"}
    # A reader schema adding a field without a default cannot read v1: the pair is said, not the record's bytes.
    no_default = {**V2, "fields": [*V1["fields"], {"name": "who", "type": "string"}]}
    with pytest.raises(UnparseableEventError, match=r"cannot be read as the topic's reader schema.*who"):
        compile_avro(json.dumps(V1), json.dumps(no_default))(avro_bytes(V1, {"page": "/a", "n": 3}))


def test_avro_types_map_onto_what_counters_read() -> None:
    """long -> int, double -> float, decimal -> Decimal, timestamps -> epoch ms, date -> ISO text, bytes -> hex,
    enum -> its symbol, uuid -> text, nested record -> dict, union -> its value."""
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "l", "type": "long"},
        {"name": "d", "type": "double"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "raw", "type": "bytes"},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["VIEW", "BUY"]}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "where", "type": {"type": "record", "name": "W", "fields": [{"name": "city", "type": "string"}]}},
        {"name": "maybe", "type": ["null", "long"]},
    ]}
    import datetime as dt
    import uuid

    record = {"l": 2**40, "d": 1.5, "price": Decimal("12.34"),
              "at": dt.datetime(2026, 11, 26, 5, 0, 0, 123000, tzinfo=dt.UTC),
              "at_us": dt.datetime(2026, 11, 26, 5, 0, 0, 123456, tzinfo=dt.UTC),
              "day": dt.date(2026, 11, 26), "raw": b"\x00\xff", "kind": "BUY",
              "id": uuid.UUID("12345678-1234-5678-1234-567812345678"), "where": {"city": "Oslo"}, "maybe": None}
    decoded = compile_avro(json.dumps(schema))(avro_bytes(schema, record))
    assert decoded == {"l": 2**40, "d": 1.5, "price": Decimal("12.34"), "at": 1_795_669_200_123,
                       "at_us": 1_795_669_200_123, "day": "2026-11-26", "raw": "00ff", "kind": "BUY",
                       "id": "12345678-1234-5678-1234-567812345678", "where": {"city": "Oslo"}, "maybe": None}
    assert type(decoded["l"]) is int
    assert type(decoded["d"]) is float


def test_avro_garbage_is_unparseable() -> None:
    """A payload that is not a record of the writer schema is unparseable (a dead letter), never a crash."""
    decode = compile_avro(json.dumps(V1))
    with pytest.raises(UnparseableEventError, match="Avro"):
        decode(b"\x08ab")  # a string of 4 bytes with 2 present


def test_schema_bounds_refuse_large_and_deep_schemas() -> None:
    """A schema text over the size bound, or nested deeper than the depth bound, is refused before parsing."""
    with pytest.raises(SchemaError, match="larger than"):
        compile_avro(json.dumps({**V1, "doc": "x" * 5000}), max_bytes=4096)
    deep: dict[str, Any] = {"type": "record", "name": "R0", "fields": []}
    node = deep
    for i in range(1, 40):
        child: dict[str, Any] = {"type": "record", "name": f"R{i}", "fields": []}
        node["fields"].append({"name": "f", "type": child})
        node = child
    with pytest.raises(SchemaError, match="deeper"):
        compile_avro(json.dumps(deep))
    with pytest.raises(SchemaError, match="not a valid Avro schema"):
        compile_avro(json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}))
    with pytest.raises(SchemaError, match="must be a record"):
        compile_avro(json.dumps("long"))
    with pytest.raises(SchemaError, match="must be a record, or a union of records"):
        compile_avro(json.dumps(["null", V1]))


def test_a_union_of_records_holds_several_types_of_event() -> None:
    """A topic's schema may be a union of records (one subject, several types of event): each record reads as
    the branch it was written with, and a dict no branch holds cannot be published."""
    view = {"type": "record", "name": "View", "fields": [{"name": "page", "type": "string"}]}
    purchase = {"type": "record", "name": "Purchase", "fields": [
        {"name": "sku", "type": "string"}, {"name": "coupon", "type": ["null", "string"], "default": None}]}
    text = json.dumps([view, purchase])
    encode, decode = avro_encoder(text), compile_avro(text)
    assert decode(encode({"page": "/a"})) == {"page": "/a"}
    assert decode(encode({"sku": "k1"})) == {"sku": "k1", "coupon": None}
    assert decode(encode({"sku": "k1", "coupon": "X"})) == {"sku": "k1", "coupon": "X"}
    with pytest.raises(ValueError, match="not a record of the Avro schema"):
        encode({"page": 5})


def test_a_json_line_of_another_type_than_the_avro_schemas_is_refused_not_converted() -> None:
    """fastavro's writer converts what it can (1.5 or true for a long is written 1, true for a double 1.0), which
    changed the value counted in silence: a value of another type is refused, naming the field and the types
    (never the value), as is a long past 2**63 (an OverflowError without a line before)."""
    encode = avro_encoder(json.dumps({"type": "record", "name": "V", "fields": [
        {"name": "n", "type": "long"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "f", "type": "double"}]}))
    assert encode({"n": 1, "at": 2, "f": 3}) == encode({"n": 1, "at": 2, "f": 3.0})  # an integer is a double
    for event, reason in (({"n": 1.5, "at": 2, "f": 3.0}, "V.n: float where the schema has long"),
                          ({"n": True, "at": 2, "f": 3.0}, "V.n: bool where the schema has long"),
                          ({"n": 1, "at": 1.9, "f": 3.0}, "V.at: float where the schema has timestamp-millis"),
                          ({"n": 1, "at": 2, "f": True}, "V.f: bool where the schema has double"),
                          ({"n": 2**63, "at": 2, "f": 3.0}, "V.n: an integer outside long's range"),
                          ({"n": 1, "at": 2}, "V.f: nothing where the schema has double")):
        with pytest.raises(ValueError, match=re.escape(reason)):
            encode(event)


def test_bytes_after_an_avro_record_refuse_it() -> None:
    """fastavro reads a record and stops: bytes after it (a record of another schema, a payload cut and glued)
    were ignored and the record counted. They refuse it whole."""
    text = json.dumps({"type": "record", "name": "T", "fields": [{"name": "sym", "type": "string"}]})
    payload = avro_encoder(text)({"sym": "IBM"})
    decode = compile_avro(text)
    assert decode(payload) == {"sym": "IBM"}
    with pytest.raises(UnparseableEventError, match="2 bytes after the record"):
        decode(payload + b"\x00\x01")


def test_an_enum_index_outside_its_symbols_is_refused_not_read_from_the_end() -> None:
    """fastavro reads an enum as ``symbols[index]``: a malformed record's index -1 (the byte 0x01) read as the
    last symbol and was counted under it. An index outside the symbols is the record's refusal, in a field or an
    array, with a reader schema whose enum has a default too (which it must not take for it)."""
    enum = {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL", "HOLD"]}
    writer = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "side", "type": enum}, {"name": "log", "type": {"type": "array", "items": "Side"}}]})
    reader = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "side", "type": {**enum, "symbols": ["BUY", "SELL", "HOLD", "SHORT"], "default": "BUY"}},
        {"name": "log", "type": {"type": "array", "items": "Side"}}]})
    for decode in (compile_avro(writer), compile_avro(writer, reader)):
        assert decode(b"\x04\x02\x02\x00") == {"side": "HOLD", "log": ["SELL"]}
        for malformed in (b"\x01\x00", b"\x05\x00", b"\x06\x00", b"\x00\x02\x01\x00", b"\x7f\x00"):
            with pytest.raises(UnparseableEventError, match="not an Avro record of its writer schema"):
                decode(malformed)
    # Where else an enum sits: a later branch of a union of records naming it, a map's values, a type holding
    # itself; only those places are looked at, and each is found.
    view = {"type": "record", "name": "View", "fields": [{"name": "side", "type": enum}]}
    order = {"type": "record", "name": "Order", "fields": [
        {"name": "sides", "type": {"type": "map", "values": "Side"}},
        {"name": "next", "type": ["null", "Order"], "default": None}]}
    decode = compile_avro(json.dumps([view, order]))
    assert decode(b"\x00\x02") == {"side": "SELL"}
    assert decode(b"\x02\x02\x02a\x04\x00\x00") == {"sides": {"a": "HOLD"}, "next": None}
    for malformed in (b"\x00\x01", b"\x02\x02\x02a\x01\x00\x00", b"\x02\x00\x02\x02\x02a\x01\x00\x00"):
        with pytest.raises(UnparseableEventError, match="an enum index outside its symbols"):
            decode(malformed)


def test_an_enum_inside_an_error_type_is_checked_too() -> None:
    """An Avro ``error`` is a record by another name: an enum in one was not looked at, and an index outside its
    symbols was counted by the counters not reading it (the others refused a marker as a key)."""
    text = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "sym", "type": "string"},
        {"name": "e", "type": {"type": "error", "name": "Err", "fields": [
            {"name": "k", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}}]}}]})
    decode = compile_avro(text)
    assert decode(b"\x06IBM\x02") == {"sym": "IBM", "e": {"k": "B"}}
    with pytest.raises(UnparseableEventError, match="an enum index outside its symbols"):
        decode(b"\x06IBM\x01")


def test_a_dead_letters_reason_names_no_memory_address() -> None:
    """fastavro says "cannot read double from <_io.BytesIO object at 0x7ff725d0e480>": the address differs between
    processes, so a replay's dead letter of the same record said another reason."""
    text = json.dumps({"type": "record", "name": "R", "fields": [{"name": "x", "type": "double"}]})
    with pytest.raises(UnparseableEventError) as refused:
        compile_avro(text)(b"\x00\x01")
    assert " at 0x" not in refused.value.reason
    assert "<_io.BytesIO>" in refused.value.reason or "BytesIO" not in refused.value.reason


def test_a_json_line_writes_an_avro_decimal_from_text_or_a_number() -> None:
    """``publish --format avro`` reads JSON lines, which hold no decimal type: a decimal field (bytes or fixed,
    in a record, an array, a map or a union) is written from a text or a number as the decimal it reads as; one
    with more digits after the point than its scale, or no decimal at all, is refused by name, never rounded."""
    money = {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}
    fixed = {"type": "fixed", "name": "Cents", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 2}
    text = json.dumps({"type": "record", "name": "Sale", "fields": [
        {"name": "price", "type": money},
        {"name": "tip", "type": ["null", fixed], "default": None},
        {"name": "note", "type": ["null", "string", money], "default": None},
        {"name": "parts", "type": {"type": "array", "items": "Cents"}, "default": []},
        {"name": "taxes", "type": {"type": "map", "values": "Cents"}, "default": {}}]})
    encode, decode = avro_encoder(text), compile_avro(text)
    assert decode(encode({"price": "12.5", "tip": 0.1, "parts": [1, "2.25"], "taxes": {"vat": "3"}})) == {
        "price": Decimal("12.50"), "tip": Decimal("0.10"), "note": None, "parts": [Decimal("1.00"),
                                                                                      Decimal("2.25")],
        "taxes": {"vat": Decimal("3.00")}}
    assert decode(encode({"price": 7, "note": "7.5"}))["note"] == "7.5"  # the union's string branch takes a text
    assert decode(encode({"price": "-99999999999999999.99"}))["price"] == Decimal("-99999999999999999.99")
    for price, reason in (("1.234", "more digits after the point than the decimal's scale \\(2\\)"),
                          ("abc", "not a decimal: 'abc'"), ("NaN", "not a finite decimal"),
                          (True, "Sale.price: bool where the schema has decimal")):
        with pytest.raises(ValueError, match=reason):
            encode({"price": price})


# --- Protobuf --------------------------------------------------------------------------------------------------


def test_protobuf_messages_decode_to_dicts() -> None:
    """Indexes pick the message; int64 -> int, enum -> name, Timestamp -> epoch ms, nested -> dict, map -> dict,
    bytes -> hex; an unset optional or message field is absent, an unset proto3 scalar holds its default."""
    proto = ProtoSchema(PROTO)
    indexes = proto.indexes_of("shop.Purchase")
    assert indexes == (1,)
    assert proto.indexes_of("shop.Purchase.Where") == (1, 0)
    message = proto.message_class(indexes)(sku="k1", amount=2**40, kind=1, blob=b"\x01", tags={"a": 5})
    message.at.seconds = 1_795_237_200
    message.at.nanos = 123_000_000
    message.where.city = "Oslo"
    decode = proto.decoder(indexes)
    assert decode is not None
    assert decode(message.SerializeToString()) == {
        "sku": "k1", "amount": 2**40, "kind": "BUY", "at": 1_795_237_200_123, "where": {"city": "Oslo"},
        "tags": {"a": 5}, "blob": "01"}
    assert decode(proto.message_class(indexes)(user="u").SerializeToString()) == {
        "sku": "", "amount": 0, "user": "u", "kind": "VIEW", "tags": {}, "blob": ""}


def test_protobuf_bad_schema_and_payload() -> None:
    """A .proto protoc refuses is a SchemaError; a payload that is not the message is unparseable."""
    with pytest.raises(SchemaError, match=r"not a valid \.proto"):
        ProtoSchema("syntax = \"proto3\"; message { }")
    proto = ProtoSchema(PROTO)
    decode = proto.decoder((1,))
    assert decode is not None
    with pytest.raises(UnparseableEventError, match="Protobuf"):
        decode(b"\xff\xff\xff")
    assert proto.decoder((9,)) is None


def test_protobuf_writer_schema_reads_framed_records() -> None:
    """A registry Protobuf schema reads the message the record's indexes name."""
    topic = TopicFormat(name="p", format="protobuf")
    writer = WriterSchema(3, "PROTOBUF", PROTO, topic, json.loads)
    assert writer.proto is not None
    other = writer.proto.message_class((0,))(x=7)
    assert writer.decode(frame(3, other.SerializeToString(), (0,)), 5) == {"x": 7}
    with pytest.raises(UnparseableEventError, match="no message"):
        writer.decode(frame(3, b"", (5,)), 5)


# --- JSON Schema -----------------------------------------------------------------------------------------------


def test_json_schema_records_validate_when_asked() -> None:
    """A JSON Schema payload is JSON; with validation, a record against its schema is invalid with the path."""
    schema = json.dumps({"type": "object", "properties": {"amount": {"type": "integer"}}})
    assert compile_json_schema(schema, json.loads, False)(b'{"amount": "x"}') == {"amount": "x"}
    checked = compile_json_schema(schema, json.loads, True)
    assert checked(b'{"amount": 3}') == {"amount": 3}
    with pytest.raises(InvalidEventError, match="does not match") as refused:
        checked(b'{"amount": "x"}')
    assert refused.value.path == "amount"
    with pytest.raises(UnparseableEventError):
        checked(b"{nope")


# --- the cache, and the router ----------------------------------------------------------------------------------


def test_the_schema_cache_asks_an_unknown_id_again_and_stays_bounded() -> None:
    """An id the registry did not know is fetched again once ``unknown_retry_s`` has passed (it was unknown for
    the process's life); past ``max_entries`` the entries no load named for ``idle_s`` go, least recently named
    first, never one named within ``idle_s`` (a batch loaded is routed before that)."""
    now = [0.0]
    cache = SchemaCache(max_entries=3, unknown_retry_s=30.0, idle_s=120.0, clock=lambda: now[0])
    topic = TopicFormat(name="views", format="avro")
    known = WriterSchema(1, "AVRO", json.dumps(V1), topic, json.loads)
    assert cache.missing("views", [1, 2]) == [1, 2]
    cache.put("views", 1, known)
    cache.put("views", 2, UnknownSchemaError(2))
    now[0] = 29.0
    assert cache.missing("views", [1, 2]) == []
    now[0] = 31.0
    assert cache.missing("views", [1, 2]) == [2]  # asked again; meanwhile still a dead letter
    assert isinstance(cache.get("views", 2), UnknownSchemaError)
    cache.put("views", 2, known)
    now[0] = 100.0
    assert cache.missing("views", [2]) == []  # known now: never asked again
    for schema_id in range(10, 20):  # a producer naming ids nobody registered
        assert cache.missing("views", [schema_id]) == [schema_id]
        cache.put("views", schema_id, UnknownSchemaError(schema_id))
    assert len(cache.entries) == 12  # all named within idle_s: none dropped
    now[0] = 151.5  # id 1 last named at 31, 2 and 10..19 at 100
    assert cache.missing("views", [19]) == [19]  # unknown for 51.5 s: asked again
    cache.put("views", 19, UnknownSchemaError(19))
    assert ("views", 1) not in cache.entries
    assert len(cache.entries) == 11
    now[0] = 300.0
    assert cache.missing("views", [2]) == []
    assert set(cache.entries) == {("views", 2), ("views", 19), ("views", 18)}  # the 3 most recently named


def test_schemas_a_holder_loaded_stay_until_it_routes_them() -> None:
    """Whoever loads a batch and routes it only after a wait (the live loop behind a rebalance that waits out a
    flush to a server away, a replay looking up resets) holds its ids: a flood of other ids past
    ``max_entries`` and ``idle_s`` drops others, never those, until the holder's next load or its release
    (the batch's records were routed into SchemaNotLoadedError, and the consumer stopped, without it)."""
    now = [0.0]
    cache = SchemaCache(max_entries=2, idle_s=120.0, clock=lambda: now[0])
    topic = TopicFormat(name="views", format="avro")
    decode = registry_decoder(topic, cache)
    record = frame(1, avro_bytes(V1, {"page": "/a", "n": 1}))
    assert cache.missing("views", [1], holder="partition 0") == [1]
    cache.put("views", 1, WriterSchema(1, "AVRO", json.dumps(V1), topic, json.loads))
    assert cache.missing("views", [5]) == [5]
    cache.put("views", 5, UnknownSchemaError(5))
    now[0] = 500.0  # the batch naming id 1 waits; meanwhile a flood of ids nobody registered
    for schema_id in range(10, 20):
        assert cache.missing("views", [schema_id], holder="partition 1") == [schema_id]
        cache.put("views", schema_id, UnknownSchemaError(schema_id))
        now[0] += 200.0
    assert decode(record) == {"page": "/a", "n": 1}  # held: still there
    assert ("views", 5) not in cache.entries  # held by nobody: dropped
    assert ("views", 10) not in cache.entries  # held by partition 1 until its next load only
    assert ("views", 19) in cache.entries
    cache.missing("views", [19], holder="partition 0")  # partition 0's next batch names another id
    cache.missing("views", [20])
    cache.put("views", 20, UnknownSchemaError(20))
    assert ("views", 1) not in cache.entries  # no longer held, idle: dropped
    cache.release("partition 1")
    now[0] += 200.0
    cache.release("partition 0")
    cache.missing("views", [21])
    cache.put("views", 21, UnknownSchemaError(21))
    assert cache.missing("views", [21]) == []
    assert set(cache.entries) == {("views", 20), ("views", 21)}  # released, idle: 19 dropped


def test_registry_decoder_reads_from_the_cache_only() -> None:
    """An id not loaded is a retriable SchemaNotLoadedError; an id the registry does not know is a dead letter
    with the id; a loaded one decodes."""
    topic = TopicFormat(name="views", format="avro")
    cache = SchemaCache()
    decode = registry_decoder(topic, cache)
    record = frame(1, avro_bytes(V1, {"page": "/a", "n": 1}))
    with pytest.raises(SchemaNotLoadedError):
        decode(record)
    assert SchemaNotLoadedError.retriable
    cache.put("views", 1, WriterSchema(1, "AVRO", json.dumps(V1), topic, json.loads))
    cache.put("views", 2, UnknownSchemaError(2))
    assert decode(record) == {"page": "/a", "n": 1}
    with pytest.raises(UnknownSchemaError) as unknown:
        decode(frame(2, b""))
    assert unknown.value.schema_id == 2
    assert cache.missing("views", [1, 2, 3]) == [3]


def test_writer_schema_of_another_type_is_refused() -> None:
    """A PROTOBUF schema id on an avro topic cannot be used."""
    with pytest.raises(SchemaError, match="PROTOBUF schema on a avro topic"):
        WriterSchema(1, "PROTOBUF", PROTO, TopicFormat(name="t", format="avro"), json.loads)


COUNTERS = """
[[topic]]
name = "views"
format = "avro"
schema_file = "view.avsc"
reader_schema_file = "view_v2.avsc"

[[counter]]
name = "views_by_page"
topics = ["views"]
kind = "count"
key = ["page"]

[[counter]]
name = "views_by_user"
topics = ["views"]
kind = "sum"
key = ["user"]
value = "n"
"""


def test_inline_mode_counts_from_schema_files(tmp_path: Path) -> None:
    """The inline mode reads a topic's records with schemas from files beside the counters file: no registry,
    and the v2 reader schema's default fills records of v1."""
    (tmp_path / "view.avsc").write_text(json.dumps(V1))
    (tmp_path / "view_v2.avsc").write_text(json.dumps(V2))
    counters = parse_definitions(COUNTERS, base=tmp_path)
    assert counters.format_of("views") == "avro"
    assert counters.format_of("elsewhere") == "json"
    router = EventRouter(counters, decoders=decoders(counters.formats, SchemaCache(), counters.schema_base))
    updates = router.route("views", frame(99, avro_bytes(V1, {"page": "/a", "n": 4})))
    assert [(u.counter, u.key, u.value) for u in updates] == [
        ("views_by_page", "/a", None), ("views_by_user", "anon", 4)]
    with pytest.raises(UnparseableEventError, match="magic"):
        router.route("views", b'{"page": "/a"}')


def test_nested_avro_fields_are_read_by_dotted_paths() -> None:
    """A nested record is a dict, so a counter keyed by ``where.city`` reads it."""
    schema = {"type": "record", "name": "E", "fields": [
        {"name": "where", "type": {"type": "record", "name": "W", "fields": [{"name": "city", "type": "string"}]}}]}
    counters = parse_definitions("""
[[topic]]
name = "e"
format = "avro"

[[counter]]
name = "by_city"
topics = ["e"]
kind = "count"
key = ["where.city"]
""")
    cache = SchemaCache()
    cache.put("e", 5, WriterSchema(5, "AVRO", json.dumps(schema), counters.formats["e"], json.loads))
    router = EventRouter(counters, decoders=decoders(counters.formats, cache, None))
    updates = router.route("e", frame(5, avro_bytes(schema, {"where": {"city": "Oslo"}})))
    assert [(u.key, u.value) for u in updates] == [("Oslo", None)]


@pytest.mark.parametrize(("table", "problem"), [
    ('name = "t"\nformat = "xml"', "format"),
    ('name = "t"\nformat = "json"\nschema_file = "x.avsc"', "json topic takes no"),
    ('name = "t"\nformat = "protobuf"\nschema_file = "x.proto"', "names its message"),
    ('name = "t"\nformat = "avro"\nschema_file = "missing.avsc"', "cannot read schema file"),
    ('name = "bad name"\nformat = "avro"', "not a Kafka topic name"),
    ('name = "vues-é"\nformat = "avro"', "not a Kafka topic name"),
])
def test_topic_tables_are_checked(table: str, problem: str, tmp_path: Path) -> None:
    """A [[topic]] table with an unknown format, misplaced or unreadable schema files is refused at load."""
    text = f"[[topic]]\n{table}\n\n[[counter]]\nname = \"c\"\ntopics = [\"t\"]\nkind = \"count\"\n"
    with pytest.raises(DefinitionError) as refused:
        parse_definitions(text, base=tmp_path)
    assert problem in str(refused.value) + " ".join(str(p) for p in refused.value.problems)


def test_registry_settings_trust_answers_only_over_tls_when_asked(tmp_path: Path) -> None:
    """With a CA file the URL must be https; credentials over http are refused unless allowed."""
    ca = tmp_path / "ca.pem"
    with pytest.raises(ValidationError, match="only over TLS"):
        SchemaRegistrySettings(url="http://registry:8081", ca_file=ca)
    assert SchemaRegistrySettings(url="https://registry:8081", ca_file=ca).ca_file == ca
    with pytest.raises(ValidationError, match="in the clear"):
        SchemaRegistrySettings.model_validate({"url": "http://registry:8081", "username": "u", "password": "p"})
    settings = SchemaRegistrySettings.model_validate(
        {"url": "http://r:1", "username": "u", "password": "hunter2", "allow_insecure": True})
    assert "hunter2" not in repr(settings)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(["avro", "protobuf", "json-schema"]))
def test_any_bytes_are_routed_or_refused_by_name(payload: bytes, format_: str) -> None:
    """Whatever follows a known schema id, the router returns updates or raises an InvalidEventError subclass:
    never another exception (a record can only be counted or dead-lettered)."""
    router = _ROUTERS[format_]
    # The bare payload too, unless it reads as a frame naming another id (which the cache would lack).
    bare = [payload] if schema_id_of(payload) in (None, 1) else []
    for raw in (frame(1, payload), frame(1, payload, (0,)), *bare):
        try:
            router.route("t", raw)
        except InvalidEventError:
            continue


def _routers() -> dict[str, EventRouter]:
    made = {}
    for format_, kind, text in (("avro", "AVRO", json.dumps(V1)), ("protobuf", "PROTOBUF", PROTO),
                                ("json-schema", "JSON", json.dumps({"type": "object"}))):
        counters = parse_definitions(f'[[topic]]\nname = "t"\nformat = "{format_}"\n\n'
                                     '[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\n')
        cache = SchemaCache()
        cache.put("t", 1, WriterSchema(1, kind, text, counters.formats["t"], json.loads))
        made[format_] = EventRouter(counters, decoders=decoders(counters.formats, cache, None))
    return made


_ROUTERS = _routers()


def test_a_registry_topic_without_a_registry_url_is_refused_at_start(tmp_path: Path) -> None:
    """``consume`` on a counters file with a registry topic and no registry URL stops with exit 2 and one
    settings_refused line naming the setting, before connecting anywhere."""
    import os
    import subprocess
    import sys

    counters = tmp_path / "counters.toml"
    counters.write_text('[[topic]]\nname = "t"\nformat = "avro"\n\n[[counter]]\nname = "c"\ntopics = ["t"]\n'
                        'kind = "count"\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    done = subprocess.run([sys.executable, "-m", "countersink.cli", "consume", "--counters", str(counters)],
                          cwd=Path(__file__).resolve().parents[2], env={**clean, "COUNTERSINK_LOG_FORMAT": "json"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    (line,) = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert line["event"] == "settings_refused"
    assert "COUNTERSINK_SCHEMA_REGISTRY__URL" in line["error"]


# --- the batch path on decoded records --------------------------------------------------------------------------

# An Avro decimal of up to 120 digits: the router refuses more than 100 (events.MAX_DECIMAL_DIGITS).
_SCALAR = ["null", "boolean", "long", "double", "string",
           {"type": "bytes", "logicalType": "decimal", "precision": 120, "scale": 4}]
_ANY_FIELD = [*_SCALAR, {"type": "array", "items": _SCALAR}, {"type": "map", "values": _SCALAR}]
DIFFERENTIAL_AVRO = {"type": "record", "name": "Any", "fields": [
    {"name": name, "type": _ANY_FIELD, "default": None} for name in FAST_ROUTE_FIELDS]}


def _formats_mutator(counters: Any, format_: str, window: int) -> Mutator:
    cache = SchemaCache()
    text = json.dumps(DIFFERENTIAL_AVRO) if format_ == "avro" else json.dumps({"type": "object"})
    cache.put("t", 1, WriterSchema(1, SCHEMA_TYPE[format_], text, counters.formats["t"], json.loads))
    router = EventRouter(counters, max_event_bytes=400, max_depth=6, max_key_bytes=24,
                         decoders=decoders(counters.formats, cache, None))
    applier = Applier(router, counters, "t", 0, RetryWindow(window))
    entry = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", 0, 10**18)
    return Mutator(entry, PartitionId("g", "t", 0), applier, -1, -1)


def _avro_record(event: dict[str, Any]) -> bytes | None:
    try:
        return frame(1, avro_bytes(DIFFERENTIAL_AVRO, {name: event.get(name) for name in FAST_ROUTE_FIELDS}))
    except (ValueError, TypeError, OverflowError, UnicodeEncodeError):
        return None  # not a record of the schema (an integer past 64 bits, a lone surrogate)


_decimal_values = st.decimals(allow_nan=False, allow_infinity=False, places=4) | st.sampled_from(
    [Decimal("0.0000"), Decimal("-0.0000"), Decimal("9" * 96 + ".0000"), Decimal("9" * 97 + ".0000"),
     Decimal("1" * 110 + ".0001")])


@st.composite
def decoded_event(draw: st.DrawFn) -> dict[str, Any]:
    """Any fields with any values, or (half the time) the common shape: valid fields, ids from a small set;
    exact decimals among them (Avro's decimal type: four places, up to 120 digits)."""
    event: dict[str, Any] = dict(draw(st.dictionaries(st.sampled_from(FAST_ROUTE_FIELDS),
                                                      fast_route_values | _decimal_values)))
    if draw(st.booleans()):
        event.update(sym=draw(st.sampled_from(["IBM", "MSFT", "a|b", 7, True])), n=draw(st.integers(-5, 5)),
                     x=draw(st.floats(-10, 10) | _decimal_values), id=draw(st.sampled_from(["i1", "i2", "i3", 4])),
                     rid=draw(st.sampled_from(["r1", "r2"])), side=draw(st.sampled_from(["buy", "sell", 1, True])),
                     user=draw(st.sampled_from(["u1", "u2", 5])), flag=draw(st.sampled_from([True, 1, "1", 0])))
    return event


DECODED_ARGUMENTS = {
    "bodies": st.lists(st.sampled_from(BODIES), min_size=1, max_size=4),
    "events": st.lists(decoded_event(), max_size=25),
    "format_": st.sampled_from(["avro", "json-schema"]),
    "window": st.integers(0, 5),
    "cut": st.integers(0, 25),
}


def _decoded_check(bodies: list[str], events: list[dict[str, Any]], format_: str, window: int, cut: int) -> None:
    table = f'[[topic]]\nname = "t"\nformat = "{format_}"\n\n'
    counters = parse_definitions(table + "".join(
        f'[[counter]]\nname = "c{i}"\ntopics = ["t"]\n{body}\n\n' for i, body in enumerate(bodies)))
    if format_ == "avro":
        encoded = [_avro_record(event) for event in events]
    else:
        encoded = [frame(1, json.dumps(event, default=str).encode("utf-8", "surrogatepass")) for event in events]
    records = [Record(offset, raw) for offset, raw in enumerate(r for r in encoded if r is not None)]
    reference, batched = _formats_mutator(counters, format_, window), _formats_mutator(counters, format_, window)
    # JSON Schema records not checked, no exact decimals: their JSON text as it is; else the decoded fields
    assert (batched.applier.transcode is not None) == (format_ == "json-schema" and not batched.applier.fast.decimals)
    assert (batched.applier.convert is None) == (batched.applier.transcode is not None)
    for batch in (records[:cut], records[cut:]):
        expected = fast_route_outcomes(reference, batch)
        assert fast_route_described(batched.apply_batch(batch)) == fast_route_described(expected)
        assert batched.dirty == reference.dirty
        assert stored(batched.states) == stored(reference.states)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**DECODED_ARGUMENTS)
def test_decoded_records_take_the_fast_path_as_the_router_decides(
        bodies: list[str], events: list[dict[str, Any]], format_: str, window: int, cut: int) -> None:
    """Avro and JSON Schema records on the batch path (decoded, as JSON text, through the JSON fast path) end
    with the same states, dirty sets, outcomes and dead letters as record at a time through the router."""
    _decoded_check(bodies, events, format_, window, cut)


def test_a_decoded_topic_with_exact_decimals_takes_the_batch_path() -> None:
    """An Avro double is a float to the router, and an Avro decimal a Decimal: the batch path reads the decoded
    objects themselves, so an exact sum of both counts what the router does, without asking it."""
    counters = parse_definitions('[[topic]]\nname = "t"\nformat = "avro"\n\n[[counter]]\nname = "c"\n'
                                 'topics = ["t"]\nkind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"\n')
    mutator = _formats_mutator(counters, "avro", 0)
    assert mutator.applier.convert is not None
    x = 0.1
    records = [_avro_record({"sym": "IBM", "x": x}), _avro_record({"sym": "IBM", "x": Decimal("0.25")})]
    routed: list[object] = []
    original = mutator.applier.router.decide_record
    mutator.applier.router.decide_record = lambda *args, **kwargs: routed.append(args) or original(  # type: ignore[method-assign]
        *args, **kwargs)
    assert mutator.apply_batch([Record(i, r) for i, r in enumerate(records) if r is not None]).applied == 2
    assert routed == []
    # the double's exact value, as the router reads it, and the decimal's
    assert Decimal(x) == Decimal("0.1000000000000000055511151231257827021181583404541015625")
    assert mutator.states[("c", "IBM")].value() == Decimal("0.3500000000000000055511151231257827021181583404541015625")


def test_the_fast_path_reads_decoded_records() -> None:
    """A plain Avro record is applied by the fast path (the router is not asked), and one holding a NaN is refused
    there by the counter, with the router's error."""
    counters = parse_definitions('[[topic]]\nname = "t"\nformat = "avro"\n\n[[counter]]\nname = "c"\n'
                                 'topics = ["t"]\nkind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "float"\n')
    mutator = _formats_mutator(counters, "avro", 0)
    plain_record = _avro_record({"sym": "IBM", "x": 1.5})
    nan_record = _avro_record({"sym": "IBM", "x": float("nan")})
    assert plain_record is not None
    assert nan_record is not None
    routed: list[object] = []
    original = mutator.applier.router.decide_record

    def decide_record(*args: Any, **kwargs: Any) -> Any:
        routed.append(args)
        return original(*args, **kwargs)

    mutator.applier.router.decide_record = decide_record  # type: ignore[method-assign]
    assert mutator.apply_batch([Record(0, plain_record)]).applied == 1
    assert routed == []
    result = mutator.apply_batch([Record(1, nan_record)])
    assert routed == []
    assert [type(r).__name__ for _, e in result.invalid for r in e.refusals] == ["ValueOutOfRangeError"]  # type: ignore[attr-defined]


def test_the_decoded_differential_check_catches_a_planted_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a batch path that reads booleans as integers (the router refuses ``true`` where it takes ``1``), the
    differential check above fails: it can tell the two paths apart."""
    import msgspec

    real_convert = msgspec.convert

    def bools_as_ints(value: Any) -> Any:
        if type(value) is bool:
            return int(value)
        if type(value) is dict:
            return {k: bools_as_ints(v) for k, v in value.items()}
        if type(value) is list:
            return [bools_as_ints(v) for v in value]
        return value

    monkeypatch.setattr(msgspec, "convert", lambda value, kind: real_convert(bools_as_ints(value), kind))
    planted = settings(max_examples=300, deadline=None, database=None, phases=[Phase.generate], derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow])(given(**DECODED_ARGUMENTS)(_decoded_check))
    with pytest.raises(AssertionError):
        planted()


def test_the_decoded_differential_check_catches_a_planted_decimal_divergence(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    """The batch path takes an Avro decimal the router's checks pass, and hands back one they refuse (more than
    100 digits) and a string that is not ASCII (a key of 13 characters and 26 bytes, over the limit of 24); one
    that took every decimal would count what the router refuses, and the check tells the two paths apart."""
    from schemas import fast_route

    counters = parse_definitions('[[topic]]\nname = "t"\nformat = "avro"\n\n' + "".join(
        f'[[counter]]\nname = "c{i}"\ntopics = ["t"]\n{body}\n\n' for i, body in enumerate(
            ['kind = "sum"\nkey = ["sym"]\nvalue = "x"\nnumber = "decimal"', 'kind = "count"\nkey = ["sym"]'])))
    events = [{"sym": "IBM", "x": Decimal("1.5")}, {"sym": "IBM", "x": Decimal("1" * 110 + ".0001")},
              {"sym": "é" * 13, "x": Decimal("2")}, {"sym": "é", "x": 2.5}]
    records = [Record(i, raw) for i, raw in enumerate(_avro_record(e) for e in events) if raw is not None]
    assert len(records) == 4

    def described_states(m: Mutator) -> tuple[object, dict[tuple[str, str], bytes]]:
        return fast_route_described(m.apply_batch(records)), stored(m.states)

    reference = _formats_mutator(counters, "avro", 0)
    expected = fast_route_described(fast_route_outcomes(reference, records)), stored(reference.states)
    assert described_states(_formats_mutator(counters, "avro", 0)) == expected
    assert [letter[0] for letter in expected[0][2]] == [1, 2]  # the long decimal and the long key are refused
    monkeypatch.setattr(fast_route, "_decimal_passes", lambda d: True)
    assert described_states(_formats_mutator(counters, "avro", 0)) != expected


DIFFERENTIAL_PROTO = """
syntax = "proto3";
message Meta { string a = 1; string b = 2; }
message Node { Node next = 1; string v = 2; }
message Event {
  string sym = 1;
  int64 n = 2;
  double x = 3;
  optional string id = 4;
  string side = 5;
  optional string user = 6;
  optional bool flag = 7;
  Meta meta = 8;
  Node deep = 9;
  string unread = 10;
  map<string, int64> tags = 11;
}
"""
_PROTO_BODIES = [
    'kind = "count"\nkey = ["sym"]\nevent_id = "id"',
    'kind = "sum"\nkey = ["sym"]\nvalue = "n"\nevent_id = "id"',
    'kind = "sum"\nkey = ["side"]\nvalue = "x"\nnumber = "decimal"',
    'kind = "distinct"\nkey = ["meta.a"]\nvalue = "user"\nwhere = { "meta.b" = ["buy"] }',
    'kind = "max"\nkey = ["flag"]\nvalue = "x"\nnumber = "float"',
    'kind = "count"\nkey = ["user", "sym"]\nrequired = true',
]


@st.composite
def proto_event(draw: st.DrawFn) -> dict[str, Any]:
    """A message of DIFFERENTIAL_PROTO as its constructor's arguments: any of its fields, set or not, unread ones
    deep."""
    strings = st.sampled_from(["IBM", "a|b", "", "buy", "sell", "é" * 13, "x" * 30, "u1"])
    fields = {"sym": strings, "n": st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 5),
              "x": st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: f == f),
              "id": st.sampled_from(["i1", "i2", "e" * 30]), "side": strings, "user": strings,
              "flag": st.booleans(), "meta": st.fixed_dictionaries({}, optional={"a": strings, "b": strings}),
              "deep": st.integers(0, 9).map(lambda d: json.loads('{"next": ' * d + '{"v": "{{{{{{{{[["}' + "}" * d)),
              "unread": st.sampled_from(["{" * 10, "[", "plain"]), "tags": st.dictionaries(strings, st.integers(0, 9))}
    names = draw(st.lists(st.sampled_from(list(fields)), unique=True))
    return {name: draw(fields[name]) for name in names}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(st.sampled_from(_PROTO_BODIES), min_size=1, max_size=4), events=st.lists(proto_event(),
                                                                                               max_size=15))
def test_protobuf_records_take_the_batch_path_as_the_router_decides(bodies: list[str],
                                                                    events: list[dict[str, Any]]) -> None:
    """Protobuf records on the batch path, read for the fields counters use alone (deep or bracket-laden unread
    fields included, which the router looks at for depth), end as record at a time through the router."""
    counters = parse_definitions('[[topic]]\nname = "t"\nformat = "protobuf"\n\n' + "".join(
        f'[[counter]]\nname = "c{i}"\ntopics = ["t"]\n{body}\n\n' for i, body in enumerate(bodies)))
    mutators = []
    for _ in range(2):
        cache = SchemaCache()
        cache.put("t", 1, WriterSchema(1, "PROTOBUF", DIFFERENTIAL_PROTO, counters.formats["t"], json.loads))
        router = EventRouter(counters, max_event_bytes=400, max_depth=6, max_key_bytes=24,
                             decoders=decoders(counters.formats, cache, None))
        entry = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", 0, 10**18)
        mutators.append(Mutator(entry, PartitionId("g", "t", 0), Applier(router, counters, "t", 0, RetryWindow(3)),
                                -1, -1))
    reference, batched = mutators
    assert batched.applier.convert is not None
    message_class = _proto_class()
    records = [Record(i, frame(1, message_class(**event).SerializeToString(), (2,)))
               for i, event in enumerate(events)]
    expected = fast_route_outcomes(reference, records)
    assert fast_route_described(batched.apply_batch(records)) == fast_route_described(expected)
    assert stored(batched.states) == stored(reference.states)


def test_the_protobuf_differential_check_catches_a_planted_depth_divergence(monkeypatch: pytest.MonkeyPatch
                                                                            ) -> None:
    """A record whose unread field is nested deeper than the router takes (its bytes holding brackets, so the
    router looks) is handed back by the batch path; one that did not look would count it, and the differential
    check above tells the two paths apart."""
    from schemas import formats

    deep = {"sym": "IBM", "id": "i1", "deep": json.loads('{"next": ' * 8 + '{"v": "{{{{{{{{[["}' + "}" * 8)}
    check = test_protobuf_records_take_the_batch_path_as_the_router_decides.hypothesis.inner_test  # type: ignore[attr-defined]
    check(bodies=[_PROTO_BODIES[0]], events=[deep, {"sym": "IBM", "id": "i2"}])
    real = formats.converter
    monkeypatch.setattr(formats, "converter", lambda decode, size, depth, fields_of, only: real(
        decode, size, 10**9, fields_of, only))
    with pytest.raises(AssertionError):
        check(bodies=[_PROTO_BODIES[0]], events=[deep, {"sym": "IBM", "id": "i2"}])


_PROTO_CLASSES: list[Any] = []


def _proto_class() -> Any:
    if not _PROTO_CLASSES:  # protoc runs once
        _PROTO_CLASSES.append(ProtoSchema(DIFFERENTIAL_PROTO).message_class((2,)))
    return _PROTO_CLASSES[0]


# --- records any producer can write: bounded, and read as their JSON form -------------------------------------


def _record(*fields: dict[str, Any], name: str = "E") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": "sym", "type": "string"}, *fields]}


@pytest.mark.parametrize(("fields", "problem"), [
    # fastavro built as many items as an array's blocks claimed: 2^62 items of no bytes in a record of 20 bytes.
    ([{"name": "marks", "type": {"type": "array", "items": "null"}}], "items can take no bytes"),
    ([{"name": "marks", "type": {"type": "array", "items": {"type": "fixed", "name": "Z", "size": 0}}}],
     "items can take no bytes"),
    ([{"name": "marks", "type": {"type": "array", "items": {"type": "record", "name": "Nothing", "fields": [
        {"name": "n", "type": "null"}]}}}], "items can take no bytes"),
])
def test_avro_schemas_whose_records_are_unbounded_are_refused(fields: list[dict[str, Any]], problem: str) -> None:
    """A schema whose records could hold any number of items in a few bytes is not read: a SchemaError, so each
    of its records is a dead letter (BadSchemaEventError) instead of an exhausted memory, looping on one record."""
    with pytest.raises(SchemaError, match=problem):
        compile_avro(json.dumps(_record(*fields)))


def _nested(depth: int) -> bytes:
    """A record of the linked list below, ``depth`` records deep."""
    return b"\x06IBM" + b"\x02\x06IBM" * (depth - 1) + b"\x00"


LINKED = _record({"name": "next", "type": ["null", "E"], "default": None})


def test_a_record_type_holding_itself_is_read_and_bounded_by_its_records_depth() -> None:
    """A list or a tree (legal, common) is read; fastavro's compiled reader recursed in C once per level, so a
    16 KB record 8,000 deep crashed the process (on every restart). Such a schema is read by its Python reader:
    a record deeper than 32 is refused as a JSON event is, one far deeper too, without a crash."""
    decode = compile_avro(json.dumps(LINKED))
    assert decode(_nested(3)) == {"sym": "IBM", "next": {"sym": "IBM", "next": {"sym": "IBM", "next": None}}}
    assert decode(_nested(32))["sym"] == "IBM"
    for depth in (33, 8_000):
        with pytest.raises(UnparseableEventError, match="nested"):
            decode(_nested(depth))


def test_avro_nesting_past_32_levels_is_refused_even_through_named_types() -> None:
    """Each record type refers to the previous one by name: the schema text is flat, its records 40 deep. 32
    levels are read, as a JSON event of 32 is."""
    def chain(levels: int) -> dict[str, Any]:
        types: list[dict[str, Any]] = [{"type": "record", "name": "L1", "fields": [{"name": "v", "type": "long"}]}]
        for level in range(2, levels + 1):
            types.append({"type": "record", "name": f"L{level}", "fields": [{"name": "down", "type": f"L{level - 1}"}]})
        return {"type": "record", "name": "Holder", "fields": [{"name": f"t{i}", "type": t}
                                                                 for i, t in enumerate(types)]}

    with pytest.raises(SchemaError, match="deeper than 32"):
        compile_avro(json.dumps(chain(32)))  # Holder, then 32 records: 33 levels
    compile_avro(json.dumps(chain(31)))
    shallow = {"type": "record", "name": "Holder", "fields": [
        {"name": "t0", "type": {"type": "record", "name": "A", "fields": [{"name": "v", "type": "long"}]}},
        {"name": "again", "type": "A"}, {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}}]}
    compile_avro(json.dumps(shallow))  # a named type used twice, and items of a union (a byte each): read


def test_named_types_of_two_namespaces_are_two_types() -> None:
    """``a.Event`` holding a ``b.Event`` is no type holding itself (names were matched by their last part)."""
    schema = {"type": "record", "name": "Event", "namespace": "a", "fields": [
        {"name": "inner", "type": {"type": "record", "name": "Event", "namespace": "b", "fields": [
            {"name": "v", "type": "long"}]}}]}
    assert compile_avro(json.dumps(schema))(b"\x04") == {"inner": {"v": 2}}


def test_avro_logical_values_no_type_holds_stay_what_was_written() -> None:
    """An instant past the year 9999, a date or time out of range, a uuid that is none or in capitals: fastavro
    failed the whole record (lost for every counter, where the JSON form of the event is counted); they are now
    the number or text written, refused only by a counter that reads them. Decimals are exact, whatever the
    declared precision (123.45 under precision 4 was 123.4); one of more than 64 bytes is NaN, at once."""
    schema = _record(
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "at_ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}})
    plain_schema = json.loads(json.dumps(schema))
    for field in plain_schema["fields"][1:]:
        field["type"] = field["type"]["type"]  # the same bytes, written without logical types
    decode = compile_avro(json.dumps(schema))

    def read(**values: Any) -> dict[str, Any]:
        record = {"sym": "IBM", "at": 0, "at_us": 0, "at_ns": 0, "day": 0, "t": 0, "id": "x", "price": b"\x00",
                  **values}
        return decode(avro_bytes(plain_schema, record))  # type: ignore[no-any-return]

    assert read(at=253_402_300_800_000)["at"] == 253_402_300_800_000  # the year 10000
    assert read(at_us=-1)["at_us"] == -1  # floored to the millisecond, as before
    assert read(at_ns=1_700_000_000_123_456_789)["at_ns"] == 1_700_000_000_123  # milliseconds, as the others
    assert read(day=20_418)["day"] == "2025-11-26"
    assert read(day=3_000_000)["day"] == 3_000_000  # past 9999
    assert read(t=45_296_789)["t"] == "12:34:56.789000"
    assert read(t=-1)["t"] == -1  # was read as 00:00:00.999
    assert read(t=86_400_000)["t"] == 86_400_000
    assert read(id="order-17")["id"] == "order-17"
    assert read(id="A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A13")["id"] == "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A13"
    assert read(price=(12345).to_bytes(2, "big", signed=True))["price"] == Decimal("123.45")
    assert read(price=(-123456789).to_bytes(4, "big", signed=True))["price"] == Decimal("-1234567.89")
    huge = read(price=b"\x7f" + b"\xff" * (1 << 20))["price"]  # 1 MiB: took minutes to convert
    assert isinstance(huge, Decimal)
    assert huge.is_nan()


def test_json_schema_checks_that_cannot_decide_refuse_the_record_not_the_process() -> None:
    """A $ref that resolves nowhere, NaN against multipleOf, 1e999999 % 3: the check raised out of the decoder
    (a crash loop, or the batch path crashing where the router refused); each is now the record's dead letter.
    On a topic with exact decimals the schema's numbers are Decimals as the events' are, so a value of 1.5
    against multipleOf 0.01 is checked (Decimal / float raised TypeError)."""
    from schemas.events import _parse_decimal

    dangling = json.dumps({"type": "object", "properties": {"x": {"$ref": "#/definitions/Amount"}},
                           "$defs": {"Amount": {"type": "integer"}}})
    with pytest.raises(InvalidEventError, match="cannot check it"):
        compile_json_schema(dangling, json.loads, True)(b'{"x": 5}')
    cents = json.dumps({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.01}}})
    checked = compile_json_schema(cents, json.loads, True)
    assert checked(b'{"x": 2.5}') == {"x": 2.5}
    # The numbers as written: 0.07 / 0.01 in floats is 7.000000000000001, and 0.07 was refused.
    assert checked(b'{"x": 0.07}') == {"x": 0.07}
    assert checked(b'{"x": 1e300}') == {"x": 1e300}
    assert checked(b'{"x": 1' + b"0" * 400 + b"}") == {"x": 10**400}
    with pytest.raises(InvalidEventError, match=r"is not a multiple of 0\.01"):
        checked(b'{"x": 0.075}')
    for value in (b"NaN", b"Infinity"):
        with pytest.raises(InvalidEventError, match="cannot check it"):
            checked(b'{"x": ' + value + b"}")
    exact = compile_json_schema(cents, _parse_decimal, True)
    assert exact(b'{"x": 1.5}') == {"x": Decimal("1.5")}
    big = b'{"x": 100000000000000000000000000000.05}'  # past the default 28 digits of a Decimal context
    assert exact(big) == {"x": Decimal("100000000000000000000000000000.05")}
    with pytest.raises(InvalidEventError, match="does not match"):
        exact(b'{"x": 1.505}')
    # A number of no fraction is an integer (draft 6 on), read exactly or not: 2.0 on a topic with exact decimals
    # is a Decimal, which the integer check refused.
    whole = json.dumps({"properties": {"q": {"type": "integer"}}})
    for parse in (json.loads, _parse_decimal):
        assert compile_json_schema(whole, parse, True)(b'{"q": 2.0}')["q"] == 2
        assert compile_json_schema(whole, parse, True)(b'{"q": 1e2}')["q"] == 100
        with pytest.raises(InvalidEventError, match="is not of type 'integer'"):
            compile_json_schema(whole, parse, True)(b'{"q": 2.5}')
    draft4 = json.dumps({"$schema": "http://json-schema.org/draft-04/schema#",
                         "properties": {"q": {"type": "integer"}}})
    for parse in (json.loads, _parse_decimal):  # draft 4 takes no float for an integer: nor a Decimal
        with pytest.raises(InvalidEventError, match="is not of type 'integer'"):
            compile_json_schema(draft4, parse, True)(b'{"q": 2.0}')
    thirds = compile_json_schema(json.dumps({"properties": {"x": {"multipleOf": 3}}}), _parse_decimal, True)
    with pytest.raises(InvalidEventError, match="cannot check it"):
        thirds(b'{"x": 1e999999}')


def test_json_schema_patterns_take_linear_time() -> None:
    """A pattern that backtracks (``^(a+)+$``) held the event loop for minutes on one record of 40 characters
    (2**40 ways to split them): patterns, patternProperties and additionalProperties' look-ups are matched by
    RE2 now, the same answers in microseconds. This test would not end without it."""
    slow = "^(a+)+$"
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": slow}},
              "patternProperties": {slow: {"type": "integer"}}}
    decode = compile_json_schema(json.dumps(schema), json.loads, True)
    hostile = "a" * 40 + "b"
    with pytest.raises(InvalidEventError, match="does not match"):
        decode(json.dumps({"s": hostile}).encode())
    assert decode(json.dumps({"s": "aaa", hostile: "not checked", "aa": 1}).encode())["aa"] == 1
    with pytest.raises(InvalidEventError, match="is not of type 'integer'"):
        decode(b'{"aa": "x"}')
    closed = compile_json_schema(json.dumps({"type": "object", "properties": {"p": {}}, "patternProperties": {
        slow: {}}, "additionalProperties": False}), json.loads, True)
    assert closed(json.dumps({"p": 1, "aaaa": 2}).encode()) == {"p": 1, "aaaa": 2}
    with pytest.raises(InvalidEventError, match=r"additional properties are not allowed \('\w+b' was unexpected"):
        closed(json.dumps({"p": 1, hostile: 2}).encode())
    typed_extras = compile_json_schema(json.dumps({"additionalProperties": {"type": "integer"}}), json.loads, True)
    with pytest.raises(InvalidEventError, match="is not of type 'integer'"):
        typed_extras(b'{"n": "5"}')
    names = compile_json_schema(json.dumps({"propertyNames": {"pattern": "^[a-z]+$"}}), json.loads, True)
    with pytest.raises(InvalidEventError, match="does not match"):
        names(b'{"AB": 1}')


def test_a_recursive_avro_record_with_a_varint_longer_than_a_long_is_refused_at_its_eleventh_byte() -> None:
    """Records of a type that holds itself are read by fastavro's Python reader, which read a varint of any length,
    shifting a growing number by each byte: a record of a 400,000-byte varint took 7 s to refuse (quadratic). A
    varint of more than ten bytes is refused at once now; the longest longs (ten bytes) are read as before."""
    node = json.dumps({"type": "record", "name": "Node", "fields": [
        {"name": "n", "type": "long"}, {"name": "next", "type": ["null", "Node"], "default": None}]})
    decode = compile_avro(node)
    for n in (-(2**63), 2**63 - 1, 0):
        assert decode(avro_bytes(json.loads(node), {"n": n, "next": {"n": 1, "next": None}})) == {
            "n": n, "next": {"n": 1, "next": None}}
    with pytest.raises(UnparseableEventError, match="a varint of more than 64 bits"):
        decode(b"\xff" * 400_000 + b"\x01\x00")
    with pytest.raises(UnparseableEventError, match="a varint of more than 64 bits"):
        decode(b"\x02\x02" + b"\x80" * 10 + b"\x01\x00")  # the nested record's long


_WIDE = {"type": "record", "name": "Wide", "fields": [
    {"name": "s", "type": "string"}, {"name": "n", "type": "long"}, {"name": "i", "type": "int"},
    {"name": "d", "type": "double"}, {"name": "b", "type": "bytes"},
    {"name": "f", "type": {"type": "fixed", "name": "F", "size": 3}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "a", "type": {"type": "array", "items": "string"}},
    {"name": "m", "type": {"type": "map", "values": "long"}},
    {"name": "u", "type": ["null", "string", "long"]}]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=st.text(max_size=12), n=st.integers(-(2**63), 2**63 - 1), i=st.integers(-(2**31), 2**31 - 1),
       d=st.floats(allow_nan=False), b=st.binary(max_size=16), f=st.binary(min_size=3, max_size=3),
       a=st.lists(st.text(max_size=6), max_size=3), u=st.none() | st.text(max_size=5) | st.integers(0, 2**40))
def test_an_avro_record_with_ten_high_bytes_in_a_row_reads_as_the_compiled_reader_reads_it(
        s: str, n: int, i: int, d: float, b: bytes, f: bytes, a: list[str], u: Any) -> None:
    """A record holding ten bytes in a row with their high bit set (text that is not ASCII, large numbers, bytes) is
    read by fastavro's Python reader, which refuses a varint longer than a long: the same value as the compiled
    reader's, whichever reads it. An eleven-byte long (the compiled reader wrapped it to a number, counted) is
    refused."""
    record = {"s": s + "東京都の天気", "n": n, "i": i, "d": d, "b": b, "f": f, "e": "B", "a": a, "m": {s: n}, "u": u}
    from unittest import mock

    from schemas import formats

    raw = avro_bytes(_WIDE, record)
    # the compiled reader for every record
    with mock.patch.object(formats, "_MAYBE_OVERLONG_VARINT", re.compile(rb"(?!)")):
        compiled = compile_avro(json.dumps(_WIDE))
    assert compile_avro(json.dumps(_WIDE))(raw) == compiled(raw)
    flat = {"type": "record", "name": "T", "fields": [{"name": "sym", "type": "string"}, {"name": "n", "type": "long"}]}
    decode = compile_avro(json.dumps(flat))
    for text in (b"\x06IBM", "東京都の天気".encode()):  # what the record's text is decides nothing
        sym = bytes([len(text) * 2]) + text
        with pytest.raises(UnparseableEventError, match="a varint of more than 64 bits"):
            decode(sym + b"\x80" * 10 + b"\x01")  # eleven bytes
        with pytest.raises(UnparseableEventError, match="a varint of more than 64 bits"):
            decode(sym + b"\xff" * 9 + b"\x7f")  # ten, past the 64th bit: wrapped by one reader, 70 bits by the other
        assert decode(sym + b"\xff" * 9 + b"\x01")["n"] == -(2**63)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 2.5, -1.0]) | st.sampled_from("ab"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xy"), inner, max_size=2),
    max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(_JSON_VALUES, max_size=6), numbers=st.sampled_from(["float", "decimal"]))
def test_json_schema_unique_items_decides_as_jsonschema_does(items: list[Any], numbers: str) -> None:
    """``uniqueItems`` is checked by hashing each item as JSON Schema compares it (jsonschema compared every item
    with every other: one record of 4,000 small objects took 13 s, a megabyte hours): the same answer as
    jsonschema's own for any items, 1 and 1.0 one number, true no number, keys in any order."""
    import jsonschema

    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    parse = json.loads if numbers == "float" else (lambda raw: json.loads(raw, parse_float=Decimal))
    raw = json.dumps({"a": items}).encode()
    expected = jsonschema.Draft202012Validator(schema).is_valid(parse(raw))
    decode = compile_json_schema(json.dumps(schema), parse, True)
    if expected:
        assert decode(raw) == parse(raw)
    else:
        with pytest.raises(InvalidEventError, match="has non-unique elements"):
            decode(raw)


def test_json_schema_unique_items_of_many_objects() -> None:
    """Many distinct objects pass, one repeated at the end (keys in another order) is found."""
    schema = json.dumps({"properties": {"tags": {"type": "array", "uniqueItems": True}}})
    decode = compile_json_schema(schema, json.loads, True)
    tags = [{"a": i, "b": [i, {"c": None}]} for i in range(50_000)]
    assert len(decode(json.dumps({"tags": tags}).encode())["tags"]) == 50_000
    with pytest.raises(InvalidEventError, match="tags: does not match its JSON Schema: has non-unique elements"):
        decode(json.dumps({"tags": [*tags, {"b": [7, {"c": None}], "a": 7}]}).encode())


def test_json_schema_patterns_take_ecma_escapes() -> None:
    """JSON Schema patterns are ECMA-262: \\uXXXX and [\\b] are spelt otherwise in RE2, which refused them (a
    schema valid before refused whole); they are translated, an escaped backslash kept as it is."""
    schema = {"properties": {"s": {"pattern": "^\\u0061+\\u00e9$"}, "t": {"pattern": "^\\\\u0061$"},
                             "b": {"pattern": "^[\\b]$"}}}
    decode = compile_json_schema(json.dumps(schema), json.loads, True)
    assert decode(json.dumps({"s": "aaé", "t": "\\u0061", "b": "\b"}).encode())
    with pytest.raises(InvalidEventError, match="does not match"):
        decode(json.dumps({"s": "b"}).encode())
    with pytest.raises(InvalidEventError, match="does not match"):
        decode(json.dumps({"t": "a"}).encode())


@pytest.mark.parametrize(("schema", "reason"), [
    ({"properties": {"s": {"pattern": "(?=a)b"}}}, "cannot be matched in linear time"),
    ({"patternProperties": {"(a)\\1": {}}}, "cannot be matched in linear time"),
    ({"unevaluatedProperties": False, "patternProperties": {"^x": {}}}, "unevaluatedProperties beside"),
])
def test_a_json_schema_re2_cannot_run_is_refused_when_loaded(schema: dict[str, Any], reason: str) -> None:
    """A look-around or back-reference has no linear-time match, and jsonschema's unevaluatedProperties matches
    patternProperties with `re` itself: such a schema is refused (its records dead letters naming why), not
    matched by a backtracking engine. A pattern key inside a value (const) is data, not refused."""
    with pytest.raises(SchemaError, match=reason):
        compile_json_schema(json.dumps(schema), json.loads, True)
    data = {"properties": {"s": {"const": {"pattern": "(?=a)"}}}}
    assert compile_json_schema(json.dumps(data), json.loads, True)(b'{"s": {"pattern": "(?=a)"}}')


@pytest.mark.parametrize("text", ["5", "null", '{"$schema": []}', '{"$schema": 5}', "[1]"])
def test_a_json_schema_that_is_none_is_a_schema_error(text: str) -> None:
    """jsonschema raised TypeError or AttributeError for these (out of the schema loader, or a bare traceback for
    a schema file); each is a SchemaError, the records of its id dead letters."""
    with pytest.raises(SchemaError, match="not a valid JSON Schema"):
        compile_json_schema(text, json.loads, True)


def test_protobuf_groups_decode_to_dicts_and_a_lone_surrogate_is_a_schema_error() -> None:
    """A proto2 group (and an editions DELIMITED field) is read as a nested message is: a dict (it was the
    message object itself, which a where list could not hash: a crash); a schema text holding a lone surrogate
    is a SchemaError, not a UnicodeEncodeError out of the loader."""
    proto = ProtoSchema('syntax = "proto2";\nmessage Event { optional string sym = 1; '
                        "optional group Info = 2 { optional int32 level = 3; } }")
    decode = proto.decoder((0,))
    assert decode is not None
    assert decode(bytes.fromhex("0a0349424d13180314")) == {"sym": "IBM", "info": {"level": 3}}
    with pytest.raises(SchemaError, match="not UTF-8"):
        ProtoSchema('syntax = "proto3";\n// note \ud800\nmessage E { string sym = 1; }')


def test_an_avro_record_cut_short_names_its_error() -> None:
    """A record that ends before its fields do raised EOFError(), and its reason ended in nothing."""
    with pytest.raises(UnparseableEventError, match="writer schema: EOFError"):
        compile_avro(json.dumps(V1))(b"")


PROTO2_MAP = 'syntax = "proto2";\nmessage Event { optional string sym = 1; map<string, string> m = 2; }\n'


@pytest.mark.parametrize("body", ['kind = "count"\nkey = ["sym"]', 'kind = "count"\nkey = ["m.k"]'])
def test_a_proto2_map_key_that_is_not_utf8_is_refused_alike_on_both_paths(body: str) -> None:
    """A proto2 file checks no map key for UTF-8 when a record is parsed; reading one that is not UTF-8 fails.
    The router reads the whole record and dead-letters it; the batch path read only the fields counters use, so it
    counted the record (a counter not reading the map), or raised out of the batch (one reading it: the partition
    stopped on the record at every start). Both now refuse it whole; a map value that is not UTF-8 (a proto2 string
    read as bytes) is decided alike too."""
    counters = parse_definitions('[[topic]]\nname = "t"\nformat = "protobuf"\n\n'
                                 f'[[counter]]\nname = "c"\ntopics = ["t"]\n{body}\n\n')
    mutators = []
    for _ in range(2):
        cache = SchemaCache()
        cache.put("t", 1, WriterSchema(1, "PROTOBUF", PROTO2_MAP, counters.formats["t"], json.loads))
        router = EventRouter(counters, decoders=decoders(counters.formats, cache, None))
        entry = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", 0, 10**18)
        mutators.append(Mutator(entry, PartitionId("g", "t", 0), Applier(router, counters, "t", 0, RetryWindow(3)),
                                -1, -1))
    reference, batched = mutators

    def entry_of(key: bytes, value: bytes) -> bytes:
        inner = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(value)]) + value
        return b"\x12" + bytes([len(inner)]) + inner

    payloads = [b"\x0a\x03IBM" + entry_of(b"\xff", b"v"), b"\x0a\x03IBM" + entry_of(b"k", b"\xff"),
                b"\x0a\x03IBM" + entry_of(b"k", b"v")]
    records = [Record(i, frame(1, payload, (0,))) for i, payload in enumerate(payloads)]
    expected = fast_route_described(fast_route_outcomes(reference, records))
    assert fast_route_described(batched.apply_batch(records)) == expected
    assert "a string is not UTF-8" in str(expected)  # the first record, dead-lettered whole
    if body.endswith('["m.k"]'):  # the map value read as bytes, named as such (it read "got object")
        assert "expected a string, integer or boolean, got bytes that are not UTF-8 text" in str(expected)
    assert stored(batched.states) == stored(reference.states)


def test_a_protobuf_record_is_bounded_in_depth_as_a_json_event_whatever_its_bytes() -> None:
    """A message type holding itself nests as deep as its bytes say. Its depth was looked at only when the bytes
    held more than 32 '{' or '[' (the router's JSON shortcut): 50 levels were counted, unless a string field held
    braces. It is checked as read, read whole (the batch path reads some fields only), refused past 32 levels."""
    proto = ProtoSchema('syntax = "proto3";\nmessage Event { string sym = 1; Node meta = 2; }\n'
                        'message Node { string a = 1; Node sub = 2; }\n')
    message_class = proto.message_class((0,))

    def nested(levels: int, sym: str) -> bytes:
        event = message_class(sym=sym)
        node = event.meta
        node.a = "a"
        for _ in range(levels):
            node = node.sub
            node.a = "z"
        return bytes(event.SerializeToString())

    for only in (None, frozenset({"sym"})):
        decode = proto.decoder((0,), only)
        assert decode is not None
        assert decode(nested(10, "IBM"))["sym"] == "IBM"
        for sym in ("IBM", "{" * 40):
            with pytest.raises(UnparseableEventError, match="the Protobuf record is nested deeper than 32"):
                decode(nested(50, sym))
    flat = ProtoSchema('syntax = "proto3";\nmessage Event { string sym = 1; repeated string tags = 2; }\n')
    decode = flat.decoder((0,), frozenset({"sym"}))
    assert decode is not None
    assert decode(bytes(flat.message_class((0,))(sym="IBM", tags=["a"]).SerializeToString())) == {"sym": "IBM"}
