"""Event formats per topic: JSON (the default), and Avro, Protobuf and JSON Schema in the Confluent wire format.

A topic's format is declared by a ``[[topic]]`` table of the counters file (:class:`TopicFormat`). A record of
an Avro, Protobuf or JSON Schema topic is ``0x00`` (the magic byte), the writer schema's id (4 bytes, big
endian), for Protobuf the message indexes (a zig-zag varint count, then as many zig-zag varints; a single
``0x00`` means ``[0]``), then the payload. The writer schema comes from a schema registry by that id (the
I/O half, ``countersink.schema_registry``, fills a :class:`SchemaCache` before a batch is routed) or, in the
inline mode, from files named by the topic's table (the id is then not looked up: every record of the topic
is read with the file's schema).

What a decoder hands the counters is what a JSON event would be: a dict of str, int, float, bool, None,
lists and dicts, plus :class:`~decimal.Decimal` for Avro decimals. The mapping is in docs/counters.md
("Avro, Protobuf and JSON Schema topics"); instants become integers of milliseconds since 1970 (UTC).

Everything here is pure except :func:`compile_proto`, which runs ``protoc`` (grpcio-tools) in a child process
with a time limit: a schema from a registry is untrusted input, and parsing it outside this process bounds
what it can cost. Schema texts are bounded in size and nesting before anything parses them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
import functools
import io
import json
import keyword
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from schemas.bounded import nested_deeper_than, read_text_at_most
from schemas.errors import CountersinkError, InvalidEventError, UnparseableEventError

Format = Literal["json", "avro", "protobuf", "json-schema"]
FORMATS: tuple[str, ...] = ("json", "avro", "protobuf", "json-schema")
SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]
SCHEMA_TYPE: dict[str, SchemaType] = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}

MAGIC = 0
HEADER_BYTES = 5
DEFAULT_MAX_SCHEMA_BYTES = 256 * 1024
DEFAULT_MAX_SCHEMA_DEPTH = 32
# Message indexes name a message by its place among nested declarations: deeper than this is not a schema.
MAX_MESSAGE_INDEXES = 16
PROTOC_TIMEOUT_S = 20.0

Decoder = Callable[[bytes], Any]
JsonParser = Callable[[bytes], Any]


# --- errors -------------------------------------------------------------------------------------------------


class UnknownSchemaError(InvalidEventError):
    """Raised when a record names a schema id the registry does not have (it answered 404): a dead letter,
    whose headers carry the id."""

    def __init__(self, schema_id: int) -> None:
        super().__init__("", f"schema id {schema_id} is unknown to the schema registry")
        self.schema_id = schema_id


class SchemaNotLoadedError(CountersinkError):
    """Raised when a record is routed before its writer schema was fetched: a defect of the caller, which must
    load every schema id of a batch (:func:`schema_ids`) first. Retriable: the record is not refused."""

    retriable = True


class SchemaError(CountersinkError):
    """Raised when a schema text cannot be used: too large, too deep, or not a valid schema of its type. For a
    schema from the registry the records that name it are dead letters (:class:`BadSchemaEventError`)."""


class BadSchemaEventError(InvalidEventError):
    """Raised for a record whose writer schema exists but cannot be used (see :class:`SchemaError`)."""

    def __init__(self, schema_id: int, reason: str) -> None:
        super().__init__("", f"schema id {schema_id} cannot be used: {reason}")
        self.schema_id = schema_id


# --- the counters file's [[topic]] tables -------------------------------------------------------------------


class TopicFormat(BaseModel):
    """One ``[[topic]]`` table: the format of a topic's record values, and where its schemas come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=249)
    format: Format = "json"
    # Inline mode: the writer schema is this file (relative paths: from the counters file's folder), and no
    # registry is asked. Avro: a .avsc; Protobuf: a .proto (with ``message``); JSON Schema: a .json.
    schema_file: str | None = None
    # Protobuf, inline mode: the full name of the message the records hold (``shop.Purchase``).
    message: str | None = None
    # Avro: the schema the counters read records as (resolved from each record's writer schema): fields added
    # with defaults read the default from records written before them.
    reader_schema_file: str | None = None
    # JSON Schema: check each record against its writer schema (an invalid record is a dead letter).
    validate_records: bool = Field(default=False, alias="validate")

    @field_validator("name")
    @classmethod
    def _topic_name(cls, v: str) -> str:
        if not (v.isascii() and all(c.isalnum() or c in "._-" for c in v)) or v in (".", ".."):
            raise ValueError(f"{v!r} is not a Kafka topic name")
        return v

    @property
    def registry(self) -> bool:
        """True when the writer schemas come from a registry (a non-JSON format without ``schema_file``)."""
        return self.format != "json" and self.schema_file is None


def parse_topic_tables(entries: object, base: Path | None
                       ) -> tuple[dict[str, TopicFormat], list[tuple[str, str, str]]]:
    """The ``[[topic]]`` tables, by topic, and the problems found as (table, field, reason); schema files are
    read and checked here, relative to ``base``."""
    formats: dict[str, TopicFormat] = {}
    problems: list[tuple[str, str, str]] = []
    if not isinstance(entries, list):
        return formats, [("", "topic", "must be an array of tables ([[topic]])")]
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"[[topic]] {name!r} (#{i + 1})" if isinstance(name, str) else f"[[topic]] #{i + 1}"
        try:
            topic = TopicFormat.model_validate(entry)
        except ValidationError as exc:
            problems += [(label, *_topic_problem(error)) for error in exc.errors()]
            continue
        if topic.name in formats:
            problems.append((label, "name", "the topic has two [[topic]] tables"))
            continue
        if topic.format == "json" and (topic.schema_file or topic.reader_schema_file or topic.message):
            problems.append((label, "format", "a json topic takes no schema_file, reader_schema_file or message"))
            continue
        if topic.reader_schema_file is not None and topic.format != "avro":
            problems.append((label, "reader_schema_file", "reader_schema_file is for avro topics"))
            continue
        if topic.format == "protobuf" and topic.schema_file is not None and not topic.message:
            problems.append((label, "message", "an inline protobuf topic names its message (message = \"pkg.Name\")"))
            continue
        try:
            inline_decoder(topic, base, _json_loads)
        except SchemaError as exc:
            problems.append((label, "schema_file", str(exc)))
            continue
        formats[topic.name] = topic
    return formats, problems



def _topic_problem(error: Any) -> tuple[str, str]:
    """A [[topic]] field and what is wrong with it, from one pydantic error: an unknown field with the fields
    there are (and the nearest), a wrong value with pydantic's own words, never its raw dump."""
    field = ".".join(str(part) for part in error["loc"]) or "topic"
    if error["type"] == "extra_forbidden":
        known = sorted(f.alias or name for name, f in TopicFormat.model_fields.items())
        near = difflib.get_close_matches(field, known, n=1)
        return field, (f"not a field of [[topic]]{f' (did you mean {near[0]}?)' if near else ''}; its fields are "
                       f"{', '.join(known)}")
    return field, str(error["msg"]).removeprefix("Value error, ")

def _read_schema_file(name: str, base: Path | None, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> str:
    path = Path(name) if base is None or Path(name).is_absolute() else base / name
    try:
        return read_text_at_most(path, max_bytes)
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"cannot read schema file {path}: {exc}") from exc


# --- the wire format ----------------------------------------------------------------------------------------


def schema_id_of(raw: bytes | None) -> int | None:
    """The schema id of a Confluent-framed value; None when the value is not framed (empty, short, other magic)."""
    if raw is None or len(raw) < HEADER_BYTES or raw[0] != MAGIC:
        return None
    return int.from_bytes(raw[1:HEADER_BYTES], "big")


def schema_ids(values: Iterable[bytes | None]) -> set[int]:
    """Every schema id a batch of values names: what must be in the cache before the batch is routed."""
    found = set()
    for raw in values:
        if raw is not None and len(raw) >= HEADER_BYTES and raw[0] == MAGIC:
            found.add(int.from_bytes(raw[1:HEADER_BYTES], "big"))
    return found


def split_header(raw: bytes) -> tuple[int, int]:
    """(schema id, offset of what follows the header) of a framed value; refuses an unframed one."""
    if len(raw) < HEADER_BYTES:
        raise UnparseableEventError("", f"{len(raw)} bytes: too short for the schema registry wire format")
    if raw[0] != MAGIC:
        raise UnparseableEventError("", f"magic byte {raw[0]}, not 0: not in the schema registry wire format")
    return int.from_bytes(raw[1:HEADER_BYTES], "big"), HEADER_BYTES


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 varint at ``at`` (at most 10 bytes): (value, next offset)."""
    value = shift = 0
    for i in range(at, min(at + 10, len(raw))):
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise UnparseableEventError("", "truncated or over-long varint in the message indexes")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


_FIRST = (0,)


def read_message_indexes(raw: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """The Protobuf message indexes at ``at`` (after the 5-byte header): (indexes, offset of the payload)."""
    if at < len(raw) and raw[at] == 0:  # [0], the first message: one byte, as most records say it
        return _FIRST, at + 1
    raw_count, at = _varint(raw, at)
    count = _zigzag(raw_count)
    if count == 0:
        return (0,), at
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise UnparseableEventError("", f"{count} message indexes: not a Protobuf message path")
    indexes = []
    for _ in range(count):
        raw_index, at = _varint(raw, at)
        index = _zigzag(raw_index)
        if index < 0:
            raise UnparseableEventError("", f"negative message index {index}")
        indexes.append(index)
    return tuple(indexes), at


def encode_message_indexes(indexes: tuple[int, ...]) -> bytes:
    """What :func:`read_message_indexes` reads (``[0]`` as the single byte 0, as Confluent's serializers do)."""
    if indexes == (0,):
        return b"\x00"
    out = bytearray()
    for n in (len(indexes), *indexes):
        z = (n << 1) ^ (n >> 63)
        while True:
            byte = z & 0x7F
            z >>= 7
            out.append(byte | (0x80 if z else 0))
            if not z:
                break
    return bytes(out)


def frame(schema_id: int, payload: bytes, indexes: tuple[int, ...] | None = None) -> bytes:
    """A value in the wire format (``indexes`` for Protobuf)."""
    head = bytes([MAGIC]) + schema_id.to_bytes(4, "big")
    return head + (encode_message_indexes(indexes) if indexes is not None else b"") + payload


# --- bounds on schema texts ---------------------------------------------------------------------------------


def _check_text(text: str, max_bytes: int) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise SchemaError(f"the schema is larger than {max_bytes} bytes")


def _json_schema_doc(text: str, max_bytes: int, max_depth: int) -> Any:
    _check_text(text, max_bytes)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"the schema is not JSON: {exc}") from exc
    if nested_deeper_than(doc, max_depth):
        raise SchemaError(f"the schema is nested deeper than {max_depth}")
    return doc


# --- decoded values as the counters read them ---------------------------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


def plain(value: Any) -> Any:
    """A decoded Avro value as a JSON event would hold it: instants to milliseconds since 1970 (UTC), dates
    and times to ISO text, UUIDs to text, bytes to lowercase hex; Decimal stays Decimal."""
    t = type(value)
    if t is dict:
        return {k: plain(v) for k, v in value.items()}
    if t is list:
        return [plain(v) for v in value]
    if t is dt.datetime:
        when = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return (when - _EPOCH) // _MS
    if t is dt.date or t is dt.time:
        return value.isoformat()
    if t is uuid.UUID:
        return str(value)
    if t is bytes or t is bytearray:
        return value.hex()
    return value


class _NoSymbol(str):
    """What fastavro reads for an enum index outside the enum's symbols, in place of a symbol (_guard_enums)."""


# One text for every enum: a reader's enum (perhaps of more symbols, or under an alias) holds the writer's marker.
_NO_SYMBOL = _NoSymbol("\0an enum index outside its symbols")


def _guard_enums(*schemas: Any) -> None:
    """Make every enum of the parsed ``schemas`` read an index outside its symbols as a :class:`_NoSymbol`, which
    :func:`_enum_check` refuses: fastavro reads ``symbols[index]``, so a negative index (a malformed record: -1 is one
    byte, 0x01) read as a symbol counted from the end, and the record was counted under it. Each enum's symbols
    are followed by as many markers (a writer's and a reader's alike: the reader finds the marker among its own,
    rather than take its default for it); an index past twice their number still fails in fastavro."""
    seen: set[int] = set()
    stack = list(schemas)
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict) and id(node) not in seen:
            seen.add(id(node))
            if node.get("type") == "enum" and isinstance(node.get("symbols"), list):
                symbols = node["symbols"]
                node["symbols"] = [*symbols, *[_NO_SYMBOL] * len(symbols)]
            stack.extend(node.values())


# A Python object's address in a library's message (``<_io.BytesIO object at 0x7ff725d0e480>``): it differs
# between processes, so a replay's dead letter of the same record would say another reason.
_ADDRESS = re.compile(r"<([A-Za-z_][\w.]*) object at 0x[0-9a-fA-F]+>")


def _without_addresses(exc: BaseException) -> str:
    return _ADDRESS.sub(r"<\1>", str(exc)) or type(exc).__name__


def _no_symbol(value: Any) -> None:
    if type(value) is _NoSymbol:
        raise UnparseableEventError("", f"not an Avro record of its writer schema: {value[1:]}")


def _enum_check(schema: Any, named: Mapping[str, Any], made: dict[str, Any] | None = None
                ) -> Callable[[Any], None] | None:
    """A function raising for a :class:`_NoSymbol` wherever the decoded value of ``schema`` (parsed) can hold an
    enum, looking nowhere else (a walk of the whole record doubled a decode's cost); None when it holds none.
    Each part checks only values of its own type, so a union checks its value with every branch's function."""
    made = {} if made is None else made
    if isinstance(schema, str):
        if schema not in named:
            return None
        if schema in made:  # made, or being made: a type holding itself calls it once made
            return made[schema]  # type: ignore[no-any-return]
        forward: list[Callable[[Any], None] | None] = [None]

        def later(value: Any) -> None:
            if forward[0] is not None:
                forward[0](value)
        made[schema] = later
        forward[0] = made[schema] = _enum_check(named[schema], named, made)
        return forward[0]
    if isinstance(schema, list):
        branches = [c for c in (_enum_check(branch, named, made) for branch in schema) if c is not None]
        if not branches:
            return None

        def union(value: Any) -> None:
            for check in branches:
                check(value)
        return union
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind == "enum":
        return _no_symbol
    if kind in ("record", "error"):  # an error is a record by another name (fastavro reads it as one)
        fields = [(f["name"], c) for f in schema.get("fields", ()) if (c := _enum_check(f["type"], named, made))]
        if not fields:
            return None

        def record(value: Any) -> None:
            if type(value) is dict:
                for name, check in fields:
                    if (item := value.get(name)) is not None:
                        check(item)
        return record
    if kind in ("array", "map"):
        inner = _enum_check(schema.get("items" if kind == "array" else "values"), named, made)
        if inner is None:
            return None
        container: type = list if kind == "array" else dict
        elements: Callable[[Any], Iterable[Any]] = iter if kind == "array" else dict.values

        def each(value: Any) -> None:
            if type(value) is container:
                for item in elements(value):
                    inner(item)
        return each
    # A type written as {"type": {...}} or {"type": "Name"} (a primitive's name checks nothing).
    return _enum_check(kind, named, made) if isinstance(kind, dict | list | str) else None


# --- Avro ---------------------------------------------------------------------------------------------------

# Types after which a decoded value needs :func:`plain` (fastavro hands back datetime, date, UUID and bytes).
_NEEDS_PLAIN = frozenset({"bytes", "fixed", "timestamp-millis", "timestamp-micros", "timestamp-nanos",
                          "local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos", "date",
                          "time-millis", "time-micros", "uuid"})


_ENUM = frozenset({"enum"})
_DECIMAL = frozenset({"decimal"})


def _mentions(doc: object, names: frozenset[str]) -> bool:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, str) and node in names:
            return True
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _records(doc: object) -> bool:
    """Whether an Avro schema is a record, or a union whose branches are all records: several types of event on
    one topic under one subject (a record read from it is the branch written, as a dict)."""
    def record(node: object) -> bool:
        return isinstance(node, dict) and node.get("type") == "record"

    return record(doc) or (isinstance(doc, list) and bool(doc) and all(record(branch) for branch in doc))


_AVRO_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_AVRO_NAMED = ("record", "error", "enum", "fixed")


class _Recursive(Exception):
    """A record type that holds itself, found by :meth:`_AvroShape.depth` (not an error: how it is read)."""


class _AvroShape:
    """What an Avro schema's records can cost the reader. fastavro's compiled reader recurses in C once per
    level (a record a few thousand levels deep overflows the thread's stack: a crash no ``except`` sees), and
    builds a list of as many items as an array's blocks claim, which bytes bound only when an item takes at
    least one. Named types are resolved by full name (their namespace, or the enclosing one), as Avro does."""

    def __init__(self, doc: object, max_depth: int) -> None:
        self.max_depth = max_depth
        self.named: dict[str, dict[str, Any]] = {}
        self.arrays: list[tuple[object, str]] = []  # each array's items, with the namespace they are read in
        self._depths: dict[str, int] = {}
        self._collect(doc, "")

    @staticmethod
    def _full(node: dict[str, Any], space: str) -> str:
        name = str(node.get("name"))
        if "." in name:
            return name
        namespace = node.get("namespace", space)
        return f"{namespace}.{name}" if namespace else name

    def _collect(self, node: object, space: str) -> None:
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, space)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in _AVRO_NAMED and isinstance(node.get("name"), str):
                full = self._full(node, space)
                self.named[full] = node
                if kind in ("record", "error") and isinstance(node.get("fields"), list):
                    for field in node["fields"]:
                        if isinstance(field, dict):
                            self._collect(field.get("type"), full.rpartition(".")[0])
            elif kind == "array":
                self.arrays.append((node.get("items"), space))
                self._collect(node.get("items"), space)
            elif kind == "map":
                self._collect(node.get("values"), space)
            elif isinstance(kind, dict | list):
                self._collect(kind, space)

    def _resolve(self, name: str, space: str) -> str | None:
        if name in _AVRO_PRIMITIVES:
            return None
        for candidate in ([name] if "." in name else [f"{space}.{name}"] if space else []) + [name]:
            if candidate in self.named:
                return candidate
        return None

    def depth(self, node: object, space: str, level: int, holding: frozenset[str]) -> int:
        """How many records, arrays and maps nest in a value of ``node``; raises _Recursive for a record type
        that holds itself, ValueError past ``max_depth`` (a JSON event's limit)."""
        if isinstance(node, str):
            full = self._resolve(node, space)
            return 0 if full is None else self.depth(self.named[full], space, level, holding)
        if isinstance(node, list):
            return max((self.depth(branch, space, level, holding) for branch in node), default=0)
        if not isinstance(node, dict):
            return 0
        kind = node.get("type")
        if kind in ("record", "error", "array", "map") and level > self.max_depth:
            raise ValueError(f"its records nest deeper than {self.max_depth} levels")
        if kind in ("record", "error"):
            full = self._full(node, space)
            if full in holding:
                raise _Recursive(full)
            if full not in self._depths:
                fields = node.get("fields")
                inner = full.rpartition(".")[0]
                self._depths[full] = 1 + max((self.depth(f.get("type"), inner, level + 1, holding | {full})
                                              for f in (fields if isinstance(fields, list) else [])
                                              if isinstance(f, dict)), default=0)
            return self._depths[full]
        if kind == "array":
            return 1 + self.depth(node.get("items"), space, level + 1, holding)
        if kind == "map":
            return 1 + self.depth(node.get("values"), space, level + 1, holding)
        if kind in ("enum", "fixed"):
            return 0
        return self.depth(kind, space, level, holding)

    def empty(self, node: object, space: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a value of this type can take no bytes."""
        if isinstance(node, str):
            full = self._resolve(node, space)
            if full is None:
                return node == "null"
            return full not in seen and self.empty(self.named[full], space, seen | {full})
        if not isinstance(node, dict):
            return False  # a union writes its branch's index: at least a byte
        kind = node.get("type")
        if kind in ("record", "error"):
            full = self._full(node, space)
            inner = full.rpartition(".")[0]
            return all(self.empty(f.get("type"), inner, seen | {full}) for f in node.get("fields") or []
                       if isinstance(f, dict))
        if kind == "fixed":
            return node.get("size") == 0
        if kind in ("enum", "array", "map"):
            return False
        return self.empty(kind, space, seen)


def _avro_shape(doc: object, max_depth: int) -> tuple[str | None, bool]:
    """Why records of the Avro schema ``doc`` could cost the reader without bound (an array whose items can take
    no bytes: a record of a few bytes could claim any number of them; records nested past ``max_depth`` levels),
    or None; and whether a record type holds itself (a list, a tree: read by fastavro's Python reader, whose
    depth Python bounds, and refused past ``max_depth`` as a JSON event is)."""
    shape = _AvroShape(doc, max_depth)
    for items, space in shape.arrays:
        if shape.empty(items, space):
            return ("an array's items can take no bytes, so a record of a few bytes could claim any number of them",
                    False)
    try:
        if shape.depth(doc, "", 1, frozenset()) > max_depth:
            return f"its records nest deeper than {max_depth} levels", False
    except _Recursive:
        return None, True
    except ValueError as exc:
        return str(exc), False
    return None, False


def compile_avro(text: str, reader_text: str | None = None, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                 max_depth: int = DEFAULT_MAX_SCHEMA_DEPTH) -> Decoder:
    """A decoder of Avro payloads written with schema ``text``, read as ``reader_text`` when given (fields the
    writer lacks take the reader's defaults)."""
    import fastavro

    doc = _json_schema_doc(text, max_bytes, max_depth)
    reader_doc = None if reader_text is None else _json_schema_doc(reader_text, max_bytes, max_depth)
    try:
        writer_named: dict[str, Any] = {}
        reader_named: dict[str, Any] = {}
        writer = fastavro.parse_schema(doc, named_schemas=writer_named)
        reader = None if reader_doc is None else fastavro.parse_schema(reader_doc, named_schemas=reader_named)
    except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError, TypeError...
        raise SchemaError(f"not a valid Avro schema: {exc}") from exc
    if not _records(doc):
        raise SchemaError("the Avro schema of a topic's records must be a record, or a union of records (one a type "
                          "of event)")
    recursive = False
    for schema in (doc, reader_doc):
        problem, holds_itself = (None, False) if schema is None else _avro_shape(schema, max_depth)
        if problem is not None:
            raise SchemaError(f"not read: {problem}")
        recursive = recursive or holds_itself
    _read_logical_types_as_json_would()
    enum_check = None
    if _mentions(doc, _ENUM) or (reader_doc is not None and _mentions(reader_doc, _ENUM)):
        _guard_enums(writer, reader)
        # The decoded value has the reader's shape when there is one.
        enum_check = _enum_check(writer, writer_named) if reader is None else _enum_check(reader, reader_named)
    needs_plain = _mentions(doc, _NEEDS_PLAIN) or (reader_doc is not None and _mentions(reader_doc, _NEEDS_PLAIN))
    from fastavro._read_py import schemaless_reader as checked_read

    _bound_python_reader_varints()
    # Records of a type that holds itself nest as deep as their bytes say: the compiled reader's C recursion would
    # crash the process on a deep one; fastavro's Python reader raises RecursionError instead. The compiled reader
    # also reads a varint past 64 bits (no Avro writer writes one) into a wrapped 64-bit number, counted as a
    # value: a record where one may be (nine bytes in a row with their high bit set, and one more: text that is
    # not ASCII, or such a varint) is read by the Python one, which refuses it (about twice the time, for those
    # records alone).
    read = checked_read if recursive else fastavro.schemaless_reader
    overlong = _MAYBE_OVERLONG_VARINT.search
    bytes_io = io.BytesIO

    def decode(payload: bytes) -> Any:
        try:
            stream = bytes_io(payload)
            value = (checked_read if overlong(payload) is not None else read)(stream, writer, reader)
            if stream.tell() != len(payload):  # bytes after the record: not a record of this schema, whole
                raise UnparseableEventError("", f"not an Avro record of its writer schema: "
                                                f"{len(payload) - stream.tell()} bytes after the record")
            if recursive and nested_deeper_than(value, max_depth):
                raise UnparseableEventError("", f"the Avro record is nested deeper than {max_depth}")
            if enum_check is not None:
                enum_check(value)
        except RecursionError as exc:
            raise UnparseableEventError("", "the Avro record is nested too deeply") from exc
        except (MemoryError, UnparseableEventError):
            raise  # the process's, not the record's: a record is bounded by its schema's shape
        except Exception as exc:  # EOFError, SchemaResolutionError, UnicodeDecodeError, ValueError...
            # (EOFError says nothing of itself: a record cut short names its kind of error at least.)
            if type(exc).__name__ == "SchemaResolutionError":  # the pair of schemas, not the record's bytes
                raise UnparseableEventError("", f"its writer schema cannot be read as the topic's reader schema "
                                                f"(reader_schema_file): {exc}") from exc
            raise UnparseableEventError("", f"not an Avro record of its writer schema: {_without_addresses(exc)}"
                                        ) from exc
        return plain(value) if needs_plain else value

    return decode


# Where a varint past 64 bits may be: ten bytes in a row with their high bit set (eleven bytes or more), or nine
# then a tenth holding more than the 64th bit. Elsewhere in a record such bytes are text or numbers' bytes.
_MAYBE_OVERLONG_VARINT = re.compile(rb"[\x80-\xff]{9}[\x02-\xff]")


def _bound_python_reader_varints() -> None:
    """Give fastavro's Python reader (records of a type that holds itself) a decoder that refuses a varint (a long,
    an int, a length, a count, an index) past 64 bits, which no Avro writer writes: its own shifted a
    growing number by each byte, and a record of a 400,000-byte varint took 7 s to refuse, quadratic in its length.
    The reader makes its decoder from its module's ``BinaryDecoder``, replaced once for the process (only
    countersink reads with it); ``tests/unit/test_formats.py`` holds fastavro to that."""
    from fastavro import _read_py
    from fastavro.io.binary_decoder import BinaryDecoder

    if getattr(_read_py, "BinaryDecoder", None) is not BinaryDecoder:
        return  # replaced already

    class BoundedDecoder(BinaryDecoder):
        def read_long(self) -> int:
            number = shift = 0
            for _ in range(10):
                byte = self.fo.read(1)
                if not byte:
                    raise EOFError
                number |= (byte[0] & 0x7F) << shift
                if not byte[0] & 0x80:
                    if number >> 64:  # a tenth byte past the 64th bit
                        break
                    return int((number >> 1) ^ -(number & 1))
                shift += 7
            raise ValueError("a varint of more than 64 bits: no long is that long")

        read_int = read_long

    _read_py.BinaryDecoder = BoundedDecoder  # type: ignore[attr-defined]


# An Avro decimal of more bytes than this holds more than 150 digits, past what any counter takes (the router
# refuses numbers of over 100 digits): read as NaN, refused by a counter that reads it and ignored by the others,
# without converting it (int to Decimal is quadratic in the digits: 5 s for 256 KiB).
_MAX_DECIMAL_BYTES = 64
_DAYS_TO_1970 = dt.date(1970, 1, 1).toordinal()
_DAY_MS = 86_400_000


_DECIMAL_NAN = decimal.Decimal("NaN")
# Room for every digit a decimal of _MAX_DECIMAL_BYTES holds: nothing is rounded.
_EXACT = decimal.Context(prec=2 * 8 * _MAX_DECIMAL_BYTES)


def _avro_decimal(data: bytes, writer_schema: Any = None, reader_schema: Any = None) -> Any:
    """The exact value written, whatever its declared precision (fastavro rounded 123.45 to 123.4 under a
    precision of 4, where the JSON form of the event holds 123.45)."""
    if len(data) > _MAX_DECIMAL_BYTES:
        return _DECIMAL_NAN
    unscaled = int.from_bytes(data, byteorder="big", signed=True)
    try:
        return _EXACT.scaleb(_EXACT.create_decimal(unscaled), -int((writer_schema or {}).get("scale", 0)))
    except (ArithmeticError, ValueError, TypeError):  # a scale past what Decimal holds
        return _DECIMAL_NAN


def _avro_date(days: int, writer_schema: Any = None, reader_schema: Any = None) -> Any:
    """A date as ISO text; its day number when no date holds it (years 1 to 9999): a counter that reads it refuses
    a number where it wants a date, and the others count the event."""
    try:
        return dt.date.fromordinal(days + _DAYS_TO_1970).isoformat()
    except (ValueError, OverflowError):
        return days


def _avro_time(scale: int) -> Callable[..., Any]:
    def read(value: int, writer_schema: Any = None, reader_schema: Any = None) -> Any:
        """A time of day as ISO text; the number when it is not one (negative, or a day or more)."""
        if not 0 <= value < _DAY_MS * scale:
            return value
        micros = value * (1000 // scale)
        return dt.time(micros // 3_600_000_000, micros // 60_000_000 % 60, micros // 1_000_000 % 60,
                       micros % 1_000_000).isoformat()
    return read


def _avro_instant(per_ms: int) -> Callable[..., Any]:
    def read(value: int, writer_schema: Any = None, reader_schema: Any = None) -> int:
        """Milliseconds since 1970 (floored), as plain() made of the datetime fastavro built: any long is one,
        where a datetime past the year 9999 failed the whole record."""
        return value // per_ms
    return read


def _avro_uuid(text: str, writer_schema: Any = None, reader_schema: Any = None) -> str:
    """The text written: a uuid's case and form are the writer's, as in the JSON form of the event."""
    return text


@functools.cache
def _read_logical_types_as_json_would() -> None:
    """Replace fastavro's readers of logical types (its documented extension point, ``LOGICAL_READERS``, one
    table for the process) by readers that never fail a record and read what the JSON form of the event holds:
    a value no logical type holds stays the number or text written, so only a counter that reads it refuses it
    (fastavro failed the whole record, losing it for every counter), and decimals are exact."""
    from fastavro.read import LOGICAL_READERS

    LOGICAL_READERS.update({
        "long-timestamp-millis": _avro_instant(1), "long-local-timestamp-millis": _avro_instant(1),
        "long-timestamp-micros": _avro_instant(1000), "long-local-timestamp-micros": _avro_instant(1000),
        "long-timestamp-nanos": _avro_instant(1_000_000), "long-local-timestamp-nanos": _avro_instant(1_000_000),
        "int-date": _avro_date, "int-time-millis": _avro_time(1), "long-time-micros": _avro_time(1000),
        "bytes-decimal": _avro_decimal, "fixed-decimal": _avro_decimal, "string-uuid": _avro_uuid,
    })


def avro_encoder(text: str, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> Callable[[Any], bytes]:
    """A function from a dict to the Avro payload of schema ``text`` (for ``countersink publish`` and tests);
    raises ValueError for a dict the schema cannot hold."""
    import fastavro
    from fastavro.validation import ValidationError, validate

    doc = _json_schema_doc(text, max_bytes, DEFAULT_MAX_SCHEMA_DEPTH)
    named: dict[str, Any] = {}
    try:
        schema = fastavro.parse_schema(doc, named_schemas=named)
    except Exception as exc:
        raise SchemaError(f"not a valid Avro schema: {exc}") from exc
    with_decimals = _mentions(doc, _DECIMAL)  # a name "decimal" elsewhere only walks a line for nothing

    def encode(event: Any) -> bytes:
        out = io.BytesIO()
        try:
            if with_decimals:
                event = _avro_decimals(schema, event, named)
            # The writer itself converts what it can (1.5 or true for a long is written 1): a value of another
            # type than the schema's is refused instead, as the consumer would not read it as written.
            validate(event, schema, raise_errors=True)
            fastavro.schemaless_writer(out, schema, event, strict_allow_default=True)
        except ValidationError as exc:
            # The field and the types, not the value (a line may hold what a log should not).
            raise ValueError("not a record of the Avro schema: " + "; ".join(
                f"{error.field or 'the record'}: {_avro_datum_kind(error.datum, error.schema)} where the schema has "
                f"{_avro_type_name(error.schema)}" for error in exc.errors[:3])) from None
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise ValueError(f"not a record of the Avro schema: {exc}") from None
        return out.getvalue()

    return encode


def _avro_datum_kind(datum: Any, schema: Any) -> str:
    if datum is None:
        return "nothing"
    if type(datum) is int and schema in ("int", "long"):
        return f"an integer outside {schema}'s range"
    return type(datum).__name__


def _avro_type_name(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("logicalType") or schema.get("name") or schema.get("type"))
    return str(schema)


def _is_decimal(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("logicalType") == "decimal" and schema.get("type") in ("bytes",
                                                                                                         "fixed")


# What a JSON value of each Python type may be written as, without a conversion (a union's other branches).
_AVRO_TAKES = {str: ("string", "enum", "bytes", "fixed"), int: ("int", "long", "float", "double"),
               float: ("float", "double")}


def _avro_type(schema: Any, named: Mapping[str, Any]) -> str:
    schema = named.get(schema, schema) if isinstance(schema, str) else schema
    if isinstance(schema, dict):
        return "decimal" if _is_decimal(schema) else _avro_type(schema.get("type"), named)
    return schema if isinstance(schema, str) else "union"


def _avro_decimals(schema: Any, value: Any, named: Mapping[str, Any]) -> Any:
    """``value`` (from a JSON line) with the text and numbers written where the schema has a decimal made
    :class:`decimal.Decimal`, which is what fastavro writes one from: ``"12.50"``, ``12.5`` and ``12`` are the
    decimals they read as (a JSON number through its shortest text, so 0.1 is 0.1). Anything else is left for
    fastavro to accept or refuse. In a union, a value becomes a decimal only when no other branch takes it."""
    if isinstance(schema, str):
        return _avro_decimals(named[schema], value, named) if schema in named else value
    if isinstance(schema, list):
        if value is None:
            return value
        kinds = [_avro_type(branch, named) for branch in schema]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and "decimal" in kinds:
            takes = _AVRO_TAKES[type(value)]
            if not any(kind in takes for kind in kinds):
                return _decimal_of(value, _scale(next(b for b, k in zip(schema, kinds, strict=True)
                                                      if k == "decimal"), named))
            return value
        wanted = ("record", "map") if isinstance(value, dict) else ("array",) if isinstance(value, list) else ()
        for branch, kind in zip(schema, kinds, strict=True):
            if kind in wanted and (kind != "record" or set(value) <= _field_names(branch, named)):
                return _avro_decimals(branch, value, named)
        return value
    if not isinstance(schema, dict):
        return value
    if _is_decimal(schema):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return _decimal_of(value, _scale(schema, named))
        return value
    form = schema.get("type")
    if form == "record" and isinstance(value, dict):
        fields = {field["name"]: field["type"] for field in schema.get("fields", ())}
        return {name: _avro_decimals(fields[name], item, named) if name in fields else item
                for name, item in value.items()}
    if form == "array" and isinstance(value, list):
        return [_avro_decimals(schema.get("items"), item, named) for item in value]
    if form == "map" and isinstance(value, dict):
        return {name: _avro_decimals(schema.get("values"), item, named) for name, item in value.items()}
    if isinstance(form, (dict, list)):
        return _avro_decimals(form, value, named)
    return value


def _field_names(schema: Any, named: Mapping[str, Any]) -> set[str]:
    schema = named.get(schema, schema) if isinstance(schema, str) else schema
    return {field["name"] for field in schema.get("fields", ())} if isinstance(schema, dict) else set()


def _scale(schema: Any, named: Mapping[str, Any]) -> int:
    schema = named.get(schema, schema) if isinstance(schema, str) else schema
    return int(schema.get("scale", 0))


def _decimal_of(value: str | int | float, scale: int) -> decimal.Decimal:
    try:
        number = decimal.Decimal(repr(value) if isinstance(value, float) else value)
    except (decimal.InvalidOperation, ValueError):
        raise ValueError(f"not a decimal: {str(value)[:40]!r}") from None
    if not number.is_finite():
        raise ValueError(f"not a finite decimal: {str(value)[:40]!r}")
    exponent = number.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > scale:  # written as is, it would be rounded: refused instead
        raise ValueError(f"{str(value)[:40]} has more digits after the point than the decimal's scale ({scale})")
    return number


# --- Protobuf -----------------------------------------------------------------------------------------------


def compile_proto(text: str, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                  timeout_s: float = PROTOC_TIMEOUT_S) -> bytes:
    """The ``FileDescriptorSet`` (serialized, with imports) of one .proto text, by protoc in a child process.
    Imports of Google's well-known types resolve; imports of other files do not (no registry references)."""
    _check_text(text, max_bytes)
    import grpc_tools

    includes = Path(grpc_tools.__file__).parent / "_proto"
    try:
        temporary = tempfile.TemporaryDirectory(prefix="countersink-proto-")
    except OSError as exc:  # the process's fault, not the schema's: raised as such (a record is no dead letter)
        raise OSError(f"no writable temporary folder to compile a .proto schema in (TMPDIR, /tmp: on a read-only "
                      f"root file system, mount one): {exc}") from exc
    with temporary as folder:
        source = Path(folder) / "schema.proto"
        try:
            source.write_text(text, encoding="utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no .proto file holds one
            raise SchemaError(f"the schema text is not UTF-8: {exc.reason} at {exc.start}") from None
        out = Path(folder) / "set.pb"
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"-I{includes}", "--include_imports",
                   f"--descriptor_set_out={out}", "schema.proto"]
        try:
            # The command is ours (this interpreter, a fixed module); only the file it reads is untrusted.
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=folder,  # noqa: S603
                                  check=False, env={"PATH": os.environ.get("PATH", "")})
        except subprocess.TimeoutExpired as exc:
            raise SchemaError(f"protoc took longer than {timeout_s:.0f}s") from exc
        if done.returncode != 0:
            raise SchemaError(f"not a valid .proto file: {done.stderr.strip()[:500]}")
        return out.read_bytes()


class ProtoSchema:
    """The messages of one .proto file, as dynamic message classes, and a decoder per message."""

    def __init__(self, text: str, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(compile_proto(text, max_bytes=max_bytes))
        pool = descriptor_pool.DescriptorPool()
        for file in descriptor_set.file:
            pool.Add(file)
        self.file = pool.FindFileByName("schema.proto")
        # Message indexes count declarations in file order: the file's own list keeps that order.
        source = next(f for f in descriptor_set.file if f.name == "schema.proto")
        self._top = [self.file.message_types_by_name[m.name] for m in source.message_type]
        self._get_class = message_factory.GetMessageClass
        self._decoders: dict[tuple[tuple[int, ...], frozenset[str] | None], Decoder] = {}
        if not self._top:
            raise SchemaError("the .proto file declares no message")

    def descriptor(self, indexes: tuple[int, ...]) -> Any:
        """The message at ``indexes``: the first among the file's messages, the rest among nested ones; None
        when there is none."""
        try:
            found = self._top[indexes[0]]
            for index in indexes[1:]:
                found = found.nested_types[index]
        except IndexError:
            return None
        return found

    def indexes_of(self, full_name: str) -> tuple[int, ...]:
        """The message indexes of the message called ``full_name`` (for the inline mode and publishing)."""
        def walk(messages: list[Any], path: tuple[int, ...]) -> tuple[int, ...] | None:
            for i, message in enumerate(messages):
                if message.full_name == full_name:
                    return (*path, i)
                found = walk(list(message.nested_types), (*path, i))
                if found is not None:
                    return found
            return None

        found = walk(self._top, ())
        if found is None:
            raise SchemaError(f"the .proto file declares no message {full_name!r}")
        return found

    def message_class(self, indexes: tuple[int, ...]) -> Any:
        descriptor = self.descriptor(indexes)
        if descriptor is None:
            raise SchemaError(f"no message at indexes {list(indexes)}")
        return self._get_class(descriptor)

    def encoder(self, indexes: tuple[int, ...]) -> Callable[[Any], bytes]:
        """A function from a JSON-shaped dict (proto3 JSON mapping: enum names, RFC 3339 timestamps) to the
        payload of the message at ``indexes``; raises ValueError for a dict the message cannot hold."""
        from google.protobuf import json_format

        message_class = self.message_class(indexes)

        def encode(event: Any) -> bytes:
            try:
                return bytes(json_format.ParseDict(event, message_class()).SerializeToString())
            except json_format.ParseError as exc:
                raise ValueError(str(exc)) from None

        return encode

    def decoder(self, indexes: tuple[int, ...], only: frozenset[str] | None = None) -> Decoder | None:
        """The decoder of the message at ``indexes``; None when the file has no message there. ``only``: the
        message's fields to read (the others are left out of the dict; each read as when all are)."""
        decode = self._decoders.get((indexes, only))
        if decode is None:
            descriptor = self.descriptor(indexes)
            if descriptor is None:
                return None
            message_class = self._get_class(descriptor)
            # A map's string key is checked for UTF-8 when it is read, not when the record is parsed, unless the
            # file validates (proto3): a record holding one that is not UTF-8 fails the router's whole read, so
            # the batch path must read every map too. A message that can hold a map with string keys is read
            # whole (rare in events; the router reads it whole anyway).
            # A message that can nest deeper than a JSON event may (a type holding itself, as a tree) is checked
            # as read, and read whole: its depth must not depend on the fields read, nor on its bytes (the
            # router's bracket count, which is JSON's, said nothing of a Protobuf record's depth).
            deep = _may_nest_deeper(descriptor, DEFAULT_MAX_SCHEMA_DEPTH)
            whole = only is None or deep or _holds_string_keyed_map(descriptor, set())
            to_dict = _message_reader(descriptor, only=None if whole else only)
            parse = message_class.FromString

            def decode(payload: bytes) -> Any:
                try:
                    message = parse(payload)
                except Exception as exc:  # DecodeError, RecursionError (upb bounds nesting)
                    raise UnparseableEventError("", f"not a Protobuf {descriptor.full_name}: {exc}") from exc
                try:
                    event = to_dict(message)
                except ValueError as exc:  # a map's key that is not UTF-8 (a proto2 file does not check)
                    raise UnparseableEventError("", f"not a Protobuf {descriptor.full_name}: a string is not "
                                                f"UTF-8 ({exc})") from exc
                if deep and nested_deeper_than(event, DEFAULT_MAX_SCHEMA_DEPTH):
                    raise UnparseableEventError("", f"the Protobuf record is nested deeper than "
                                                    f"{DEFAULT_MAX_SCHEMA_DEPTH}")
                return event

            self._decoders[(indexes, only)] = decode
        return decode


def _may_nest_deeper(descriptor: Any, max_depth: int) -> bool:
    """Whether a message of ``descriptor``, read as a dict, can nest deeper than ``max_depth`` levels (a dict or
    list one level each, as a JSON event's): a type that holds itself, at any depth, or fields nested that deep.
    An upper bound (a Timestamp counts as a message, though read as a text)."""
    from google.protobuf.descriptor import FieldDescriptor

    def depth(message: Any, path: frozenset[str]) -> int:
        if message.full_name in path:
            raise _Recursive
        inside = path | {message.full_name}
        deepest = 0
        for field in message.fields:
            is_message = field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP)
            if is_message and field.message_type.GetOptions().map_entry:
                value = field.message_type.fields_by_name["value"]
                below = 1 + (depth(value.message_type, inside) if value.message_type is not None else 0)
            elif is_message:
                below = depth(field.message_type, inside) + (1 if field.is_repeated else 0)
            else:
                below = 1 if field.is_repeated else 0
            deepest = max(deepest, below)
        return 1 + deepest

    try:
        return depth(descriptor, frozenset()) > max_depth
    except _Recursive:
        return True


def _holds_string_keyed_map(descriptor: Any, seen: set[str]) -> bool:
    """Whether a message of ``descriptor`` can hold, at any depth, a map whose keys are strings declared in a file
    that does not check them for UTF-8 when it parses (proto2; editions, whose features may turn the check off)."""
    from google.protobuf.descriptor import FieldDescriptor

    seen.add(descriptor.full_name)
    for field in descriptor.fields:
        if field.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            continue
        inner = field.message_type
        if (inner.GetOptions().map_entry and inner.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
                and _syntax(inner.file) != "proto3"):
            return True
        if inner.full_name not in seen and _holds_string_keyed_map(inner, seen):
            return True
    return False


def _syntax(file: Any) -> str:
    """A .proto file's syntax: ``proto3``, ``editions``, or ``""`` for proto2."""
    from google.protobuf import descriptor_pb2

    return str(descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb).syntax)


_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = frozenset({"google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
                       "google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
                       "google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue"})


def _message_reader(descriptor: Any, readers: dict[str, Callable[[Any], Any]] | None = None,
                    only: frozenset[str] | None = None) -> Callable[[Any], Any]:
    """A function from a message of ``descriptor`` to a dict. A field with presence (proto2 fields, proto3
    ``optional``, members of a oneof, messages) is absent when unset; a proto3 scalar without presence holds
    its value, the default included (the wire cannot tell them apart). Enums are their value's name. ``only``:
    the fields of the message itself to read (the others are left out; each is read as when all are)."""
    if readers is None:
        readers = {}
    full_name = descriptor.full_name
    if only is None and full_name in readers:  # a recursive message: read by the reader being built
        known = readers
        return lambda m: known[full_name](m)
    if only is None:
        readers[full_name] = lambda m: None
    read = _compiled_reader(_message_plan(descriptor, readers, only))
    if only is None:
        readers[full_name] = read
    return read


def _compiled_reader(plan: list[tuple[str, bool, Callable[[Any], Any] | None, bool, bool]]
                     ) -> Callable[[Any], dict[str, Any]]:
    """A reader of the fields of ``plan`` written out as one function, a few lines per field (one loop over the
    plan per message costs more than the reading)."""
    namespace: dict[str, Any] = {}
    lines = ["def read(m):", "    out = {}"]
    for n, (name, presence, convert, repeated, is_map) in enumerate(plan):
        get = f"m.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"getattr(m, {name!r})"
        indent = "    "
        if presence:
            lines.append(f"    if m.HasField({name!r}):")
            indent += "    "
        if convert is not None:
            namespace[f"convert{n}"] = convert
        if is_map:
            value = (f"{{k: convert{n}(v) for k, v in {get}.items()}}" if convert is not None
                     else f"{{k: v for k, v in {get}.items()}}")
        elif repeated:
            value = f"[convert{n}(v) for v in {get}]" if convert is not None else f"list({get})"
        else:
            value = f"convert{n}({get})" if convert is not None else get
        lines.append(f"{indent}out[{name!r}] = {value}")
    lines.append("    return out")
    exec(compile("\n".join(lines) + "\n", "<protobuf reader>", "exec"), namespace)  # noqa: S102
    read: Callable[[Any], dict[str, Any]] = namespace["read"]
    return read


def _message_plan(descriptor: Any, readers: dict[str, Callable[[Any], Any]], only: frozenset[str] | None
                  ) -> list[tuple[str, bool, Callable[[Any], Any] | None, bool, bool]]:
    """How :func:`_message_reader` reads each field of ``descriptor`` (of ``only``, when given): its name,
    whether it has presence, its value's conversion, whether it is repeated, whether it is a map."""
    from google.protobuf.descriptor import FieldDescriptor

    plan: list[tuple[str, bool, Callable[[Any], Any] | None, bool, bool]] = []

    def value_reader(field: Any) -> Callable[[Any], Any] | None:
        # A proto2 group (or an editions DELIMITED field) is a message on the wire of another encoding.
        if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            name = field.message_type.full_name
            if name == _TIMESTAMP:
                return lambda m: m.seconds * 1000 + m.nanos // 1_000_000
            if name in _WRAPPERS:
                inner = _message_reader(field.message_type, readers)
                return lambda m: inner(m).get("value")
            return _message_reader(field.message_type, readers)
        if field.type == FieldDescriptor.TYPE_ENUM:
            values = field.enum_type.values_by_number
            return lambda n: values[n].name if n in values else n
        if field.type == FieldDescriptor.TYPE_BYTES:
            return lambda b: b.hex()
        return None

    for field in descriptor.fields:
        if only is not None and field.name not in only:
            continue
        is_map = (field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)
        if is_map:
            value_field = field.message_type.fields_by_name["value"]
            plan.append((field.name, False, value_reader(value_field), False, True))
            continue
        plan.append((field.name, field.has_presence and not field.is_repeated, value_reader(field),
                     field.is_repeated, False))
    return plan


# --- JSON Schema --------------------------------------------------------------------------------------------


def compile_json_schema(text: str, parse: JsonParser, validate: bool, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                        max_depth: int = DEFAULT_MAX_SCHEMA_DEPTH) -> Decoder:
    """A decoder of JSON payloads of a JSON Schema topic (checked against the schema when ``validate``). The
    schema's numbers are read by ``parse``, as the events' are: on a topic with exact decimals a ``multipleOf``
    of 0.01 is a Decimal, which a Decimal value divides (a float raised TypeError on every such value)."""
    _json_schema_doc(text, max_bytes, max_depth)  # bounded before jsonschema sees it
    validator = _json_schema_validator(text, parse) if validate else None

    def decode(payload: bytes) -> Any:
        try:
            event = parse(payload)
        except ValueError as exc:
            raise UnparseableEventError("", f"not a UTF-8 JSON document: {exc}") from exc
        except RecursionError:  # its message names where the stack ran out, which the caller's depth moves
            raise UnparseableEventError("", "the JSON document is nested too deeply to read") from None
        if validator is not None:
            try:
                # Room for the digits of any number a counter takes (a Decimal % 0.01 of 30 digits needs more
                # than the default 28), not for a million (1e999999 % 3 is refused, not computed).
                with decimal.localcontext(_SCHEMA_CHECKS):
                    error = next(iter(validator.iter_errors(event)), None)
            except MemoryError:
                raise
            except Exception as exc:  # a $ref that resolves nowhere, NaN % 0.01, 1e999999 % 3...
                raise InvalidEventError("", f"its JSON Schema cannot check it: {type(exc).__name__}: "
                                            f"{str(exc)[:200]}") from exc
            if error is not None:
                path = ".".join(str(p) for p in error.absolute_path)
                raise InvalidEventError(path, f"does not match its JSON Schema: {error.message[:300]}")
        return event

    return decode


_SCHEMA_CHECKS = decimal.Context(prec=1_000)


def _multiple_of(validator: Any, factor: Any, instance: Any, schema: Any) -> Any:
    """``multipleOf`` on the numbers as written: jsonschema divides floats (0.07 / 0.01 is 7.000000000000001, so
    0.07 was no multiple of 0.01); a float is taken as its shortest text, as a Decimal, which is exact."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "number"):
        return
    if isinstance(instance, float) or isinstance(factor, float):
        # Exact, however large the quotient (1e300 is a multiple of 0.01); NaN and infinities raise: the record's
        # check cannot decide (its dead letter says so).
        failed = (Fraction(decimal.Decimal(repr(instance))) / Fraction(decimal.Decimal(repr(factor)))
                  ).denominator != 1
    else:
        failed = bool(instance % factor)
    if failed:
        yield ValidationError(f"{instance!r} is not a multiple of {factor}")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """``uniqueItems`` in time linear in the items: jsonschema compares every item with every other when they
    cannot be sorted (objects, or items of several types), and one record of 4,000 small objects took 13 s (a
    megabyte, hours). Each item is hashed as JSON Schema compares it: 1 and 1.0 are one number, true is no number,
    an object's keys are in no order."""
    from jsonschema import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        form = _json_form(item)
        if form in seen:
            yield ValidationError("has non-unique elements")
            return
        seen.add(form)


def _json_form(value: Any) -> Any:
    """A hashable form of a decoded JSON value, equal for values JSON Schema calls equal."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float | decimal.Decimal):
        return ("number", value)  # 1 == 1.0 == Decimal("1.0"), with one hash
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_json_form(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _json_form(item)) for key, item in value.items()))
    return ("other", id(value))


# JSON Schema's patterns are matched by RE2, in time linear in the text: jsonschema matches them with Python's
# backtracking `re`, where one record against a pattern such as ``^(a+)+$`` holds the event loop for minutes (a
# catastrophic pattern is a mistake easily made, and the records are not ours to trust). RE2 runs no
# look-arounds or back-references, so a schema holding one is refused, not matched another way.
_RE2_OPTIONS: Any = None


def ecma_to_re2(pattern: str) -> str:
    """A JSON Schema (ECMA-262) pattern in RE2's syntax, for the escapes RE2 spells otherwise: ``\\uXXXX`` is
    ``\\x{XXXX}``, ``\\cX`` the control character X names, ``[\\b]`` a backspace. Escaped backslashes are
    kept as they are (``\\\\u0061`` is a backslash, then ``u0061``)."""
    if "\\" not in pattern:
        return pattern
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            if escaped == "u" and len(pattern[i + 2:i + 6]) == 4 and all(
                    c in "0123456789abcdefABCDEF" for c in pattern[i + 2:i + 6]):
                out.append("\\x{" + pattern[i + 2:i + 6] + "}")
                i += 6
                continue
            if escaped == "c" and i + 2 < len(pattern) and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
                out.append(f"\\x{{{ord(pattern[i + 2]) % 32:02x}}}")
                i += 3
                continue
            if escaped == "b" and in_class:
                out.append("\\x{08}")
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _linear_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2; :class:`SchemaError` when RE2 cannot run it (look-arounds, back-references,
    a pattern past RE2's memory bound)."""
    global _RE2_OPTIONS
    import re2

    if _RE2_OPTIONS is None:
        options = re2.Options()
        options.log_errors = False  # the refusal is ours to report, once, not RE2's to print on standard error
        _RE2_OPTIONS = options
    try:
        return re2.compile(ecma_to_re2(pattern), _RE2_OPTIONS)
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise SchemaError(f"the pattern {pattern[:200]!r} cannot be matched in linear time ({why[:200]}): "
                          "countersink matches JSON Schema patterns with RE2, which has no look-arounds or "
                          "back-references") from None


class _LinearPatterns:
    """One schema's patterns, compiled by RE2 once (kept as long as its validator), and the keywords that match
    them: ``pattern``, ``patternProperties`` and ``additionalProperties`` (which looks them up). A keyword's
    patterns are one RE2 set, matched in one pass: an RE2 pattern object's ``search`` costs 3.6 µs a call in
    its Python wrapper, a set's ``Match`` 0.7."""

    def __init__(self) -> None:
        self._sets: dict[tuple[str, ...], Any] = {}

    def __call__(self, patterns: tuple[str, ...]) -> Any:
        """The RE2 set of ``patterns``: its ``Match(text)`` lists the indexes of those found in ``text`` (None
        when none is)."""
        found = self._sets.get(patterns)
        if found is None:
            import re2

            for pattern in patterns:
                _linear_pattern(pattern)  # each refused with RE2's reason, which a set does not give
            found = re2.Set.SearchSet(_RE2_OPTIONS)
            for pattern in patterns:
                found.Add(ecma_to_re2(pattern))
            found.Compile()
            self._sets[patterns] = found
        return found

    def pattern(self, validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
        from jsonschema import ValidationError

        if validator.is_type(instance, "string") and not self((pattern,)).Match(instance):
            yield ValidationError(f"{instance[:200]!r} does not match {pattern[:200]!r}")

    def pattern_properties(self, validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object") or not patterns:
            return
        keys = tuple(patterns)
        matcher = self(keys)
        for name, value in instance.items():
            for index in matcher.Match(name) or ():
                yield from validator.descend(value, patterns[keys[index]], path=name, schema_path=keys[index])

    def additional_properties(self, validator: Any, additional: Any, instance: Any, schema: Any) -> Any:
        """The properties neither ``properties`` names nor a ``patternProperties`` pattern matches, checked
        against ``additionalProperties`` (false: none may be there)."""
        from jsonschema import ValidationError

        if not validator.is_type(instance, "object"):
            return
        named = schema.get("properties", {})
        keys = tuple(schema.get("patternProperties", {}))
        matcher = self(keys) if keys else None
        extras = [name for name in instance
                  if name not in named and not (matcher is not None and matcher.Match(name))]
        if validator.is_type(additional, "object"):
            for name in extras:
                yield from validator.descend(instance[name], additional, path=name)
        elif additional is False and extras:
            shown = ", ".join(repr(name[:100]) for name in sorted(extras)[:10])
            yield ValidationError(f"additional properties are not allowed ({shown} "
                                  f"{'was' if len(extras) == 1 else 'were'} unexpected)")

    def compile_all(self, doc: Any) -> None:
        """Compile every pattern of a schema that check_schema accepted, so that one RE2 cannot run refuses the
        schema when it is loaded rather than each record that reaches it. Values (``const``, ``enum``,
        ``default``, ``examples``) are not schemas: a ``pattern`` key there is data."""
        for node in _objects(doc, skip=_NOT_SCHEMAS):
            if isinstance(node.get("pattern"), str):
                self((node["pattern"],))
            if isinstance(node.get("patternProperties"), dict) and node["patternProperties"]:
                self(tuple(node["patternProperties"]))


_NOT_SCHEMAS = frozenset({"const", "enum", "default", "examples"})


def _objects(doc: Any, skip: frozenset[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """Every object of a JSON document, walked (not recursed: a schema is bounded in depth, not in width), but
    those under a key of ``skip``."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(value for key, value in node.items() if key not in skip)
        elif isinstance(node, list):
            stack.extend(node)


def _holds_both(doc: Any, first: str, second: str) -> bool:
    """Whether some object of ``doc`` has key ``first`` and some (maybe another) has key ``second``."""
    found: set[str] = set()
    for node in _objects(doc):
        found.update(key for key in (first, second) if key in node)
    return len(found) == 2


def _integer(drafts: Any, checker: Any, instance: Any) -> bool:
    """JSON Schema's ``integer`` for a number read exactly: on a topic with exact decimals ``2.0`` is a Decimal,
    which jsonschema's check (for an int, or a float with no fraction) refused, where the same record on another
    topic passed. A Decimal is an integer when the draft takes a float of no fraction for one (draft 6 on)."""
    if isinstance(instance, decimal.Decimal):
        return instance.is_finite() and instance == instance.to_integral_value() and drafts.is_type(1.0, "integer")
    return bool(drafts.is_type(instance, "integer"))


def _json_schema_validator(text: str, parse: JsonParser) -> Any:
    """A validator of the JSON Schema ``text`` (already bounded and parsed once), or SchemaError for a text that
    is not one: jsonschema raised TypeError or AttributeError for a schema of ``5`` or a ``$schema`` of ``[]``."""
    import jsonschema

    try:
        doc = parse(text.encode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"the schema is not JSON: {exc}") from exc
    if not isinstance(doc, dict | bool) or (isinstance(doc, dict) and not isinstance(doc.get("$schema", ""), str)):
        raise SchemaError("not a valid JSON Schema: a schema is an object (or true or false) whose $schema is text")
    if _holds_both(doc, "unevaluatedProperties", "patternProperties"):
        # jsonschema's unevaluatedProperties matches patternProperties' patterns itself, with `re`
        raise SchemaError("not a JSON Schema countersink can check: unevaluatedProperties beside patternProperties "
                          "(write additionalProperties instead)")
    try:
        cls = jsonschema.validators.validator_for(doc)
        cls.check_schema(doc)
        patterns = _LinearPatterns()
        validator = jsonschema.validators.extend(cls, {
            "multipleOf": _multiple_of, "pattern": patterns.pattern, "patternProperties": patterns.pattern_properties,
            "additionalProperties": patterns.additional_properties, "uniqueItems": _unique_items},
            type_checker=cls.TYPE_CHECKER.redefine("integer", functools.partial(_integer, cls.TYPE_CHECKER)))(doc)
        patterns.compile_all(doc)
        return validator
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"not a valid JSON Schema: {exc.message}") from exc
    except (MemoryError, SchemaError):
        raise
    except Exception as exc:  # whatever else jsonschema raises on a text it does not expect
        raise SchemaError(f"not a valid JSON Schema: {type(exc).__name__}: {str(exc)[:200]}") from exc


def json_schema_encoder(text: str, *, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> Callable[[Any], bytes]:
    """A function from a dict to its JSON text, checked against the JSON Schema ``text`` (ValueError if not)."""
    _json_schema_doc(text, max_bytes, DEFAULT_MAX_SCHEMA_DEPTH)  # bounded before jsonschema sees it
    validator = _json_schema_validator(text, json.loads)  # numbers as floats, as publish reads a line's

    def encode(event: Any) -> bytes:
        error = next(iter(validator.iter_errors(event)), None)
        if error is not None:
            raise ValueError(f"does not match the JSON Schema at {list(error.absolute_path)}: {error.message[:300]}")
        return json.dumps(event, separators=(",", ":")).encode()

    return encode


# --- writer schemas by id, and a topic's decoder ------------------------------------------------------------


class WriterSchema:
    """One registry schema, compiled for decoding: ``decode(raw, at)`` reads the payload of a record at ``at``
    (just past the 5-byte header)."""

    def __init__(self, schema_id: int, schema_type: str, text: str, topic: TopicFormat, parse: JsonParser,
                 reader_text: str | None = None, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> None:
        self.schema_id = schema_id
        self.proto: ProtoSchema | None = None
        self._decode: Decoder | None = None
        # A JSON Schema record not checked against its schema: its payload is the event's JSON text as it is.
        self.json_text = topic.format == "json-schema" and not topic.validate_records
        wanted = SCHEMA_TYPE[topic.format]
        if schema_type != wanted:
            raise SchemaError(f"a {schema_type} schema on a {topic.format} topic")
        if wanted == "AVRO":
            self._decode = compile_avro(text, reader_text, max_bytes=max_bytes)
        elif wanted == "JSON":
            self._decode = compile_json_schema(text, parse, topic.validate_records, max_bytes=max_bytes)
        else:
            self.proto = ProtoSchema(text, max_bytes=max_bytes)

    def decode(self, raw: bytes, at: int, only: frozenset[str] | None = None) -> Any:
        """``only``: the fields a Protobuf record is read for (every field of the others)."""
        if self.proto is not None:
            indexes, at = read_message_indexes(raw, at)
            decode = self.proto.decoder(indexes, only)
            if decode is None:
                raise UnparseableEventError("", f"schema id {self.schema_id} has no message at {list(indexes)}")
            return decode(raw[at:])
        assert self._decode is not None
        return self._decode(raw[at:] if at else raw)


class SchemaCache:
    """Writer schemas by id, as fetched from the registry: a compiled :class:`WriterSchema`, or the reason it
    cannot be used (404: unknown; or a :class:`SchemaError`). Filled by the I/O layer, read by decoders.

    Bounded: ids come from records, and a producer can name any of 2**31. An id the registry did not know is
    asked again once ``unknown_retry_s`` has passed (a schema registered after its first record was read, on a
    registry whose followers lag, is then used), and past ``max_entries`` the entries no batch has named for
    ``idle_s`` are dropped, least recently named first (a later record naming one fetches it again). An entry
    a holder holds is never dropped: whoever loads records and routes them later (after waiting for a lock, or
    for a server away, which may take longer than ``idle_s``) loads them for a holder of its own, which holds
    the ids of its last load until its next (so at most a batch's ids each)."""

    def __init__(self, *, max_entries: int = 1000, unknown_retry_s: float = 30.0, idle_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Per topic format (an id may be read by topics of different formats or reader schemas).
        self.entries: dict[tuple[str, int], WriterSchema | InvalidEventError] = {}
        self.max_entries = max_entries
        self.unknown_retry_s = unknown_retry_s
        self.idle_s = idle_s
        self._clock = clock
        # When a load last named each entry, least recently first (an OrderedDict: the oldest is taken and an
        # entry moved to the end in constant time, however many a flood of ids made).
        self._named: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._unknown_until: dict[tuple[str, int], float] = {}  # ids the registry did not know: asked again after
        self._held: dict[Hashable, frozenset[tuple[str, int]]] = {}  # by holder: the entries of its last load

    def missing(self, topic: str, ids: Iterable[int], holder: Hashable | None = None) -> list[int]:
        """The ids to fetch before a batch naming ``ids`` is routed: those not cached, and those the registry
        did not know ``unknown_retry_s`` ago. Every id named counts as used now; ``holder`` holds them (and no
        longer those of its last load) until its next load."""
        now = self._clock()
        named = set(ids)
        wanted = []
        for schema_id in named:
            entry = (topic, schema_id)
            until = self._unknown_until.get(entry)
            if entry not in self.entries or (until is not None and now >= until):
                wanted.append(schema_id)
            self._named[entry] = now
            self._named.move_to_end(entry)
        if holder is not None:
            self._held[holder] = frozenset((topic, schema_id) for schema_id in named)
        if len(self.entries) > self.max_entries:
            self._drop_idle(now)
        return sorted(wanted)

    def put(self, topic: str, schema_id: int, entry: WriterSchema | InvalidEventError) -> None:
        key = (topic, schema_id)
        self.entries[key] = entry
        if isinstance(entry, UnknownSchemaError):
            self._unknown_until[key] = self._clock() + self.unknown_retry_s
        else:
            self._unknown_until.pop(key, None)
        self._named.setdefault(key, self._clock())

    def get(self, topic: str, schema_id: int) -> WriterSchema | InvalidEventError | None:
        return self.entries.get((topic, schema_id))

    def release(self, holder: Hashable) -> None:
        """``holder`` routes nothing more (a partition revoked, a replay ended): its entries may be dropped."""
        self._held.pop(holder, None)

    def _drop_idle(self, now: float) -> None:
        holding = frozenset().union(*self._held.values())  # a batch's ids per holder: few, and only when over
        held = []
        while len(self.entries) > self.max_entries and self._named:
            key, named = next(iter(self._named.items()))
            if now - named < self.idle_s:
                break
            del self._named[key]
            if key in holding:
                held.append((key, named))  # set aside, and put back as it was once the others are looked at
                continue
            self.entries.pop(key, None)
            self._unknown_until.pop(key, None)
        for key, named in reversed(held):
            self._named[key] = named
            self._named.move_to_end(key, last=False)


class RegistryDecoder:
    """The decoder of a registry topic's values: header, cached writer schema, payload. Called with ``only``,
    a Protobuf record is read for those fields alone."""

    def __init__(self, topic: TopicFormat, cache: SchemaCache) -> None:
        self.name = topic.name
        self.entries = cache.entries
        # A JSON Schema topic whose records are not checked: their payloads are the events' JSON text.
        self.json_payload = topic.format == "json-schema" and not topic.validate_records

    def __call__(self, raw: bytes, only: frozenset[str] | None = None) -> Any:
        schema_id, at = split_header(raw)
        entry = self.entries.get((self.name, schema_id))
        if entry is None:
            raise SchemaNotLoadedError(f"schema id {schema_id} of topic {self.name} was not loaded before routing")
        if isinstance(entry, InvalidEventError):
            raise entry
        return entry.decode(raw, at, only)

    def json_text(self, raw: bytes) -> bytes | None:
        """The payload of a JSON Schema record whose schema is loaded and does not check it (the event's JSON
        text, not parsed here); None for any other record (the router decides it, or raises)."""
        if len(raw) < HEADER_BYTES or raw[0] != MAGIC:
            return None
        entry = self.entries.get((self.name, int.from_bytes(raw[1:HEADER_BYTES], "big")))
        if type(entry) is not WriterSchema or not entry.json_text:
            return None
        return raw[HEADER_BYTES:]


def registry_decoder(topic: TopicFormat, cache: SchemaCache) -> RegistryDecoder:
    """The decoder of a registry topic's values: header, cached writer schema, payload."""
    return RegistryDecoder(topic, cache)


class InlineDecoder:
    """The decoder of an inline topic (schemas from files; the header's id is not looked up). Called with
    ``only``, a Protobuf record is read for those fields alone."""

    def __init__(self, topic: TopicFormat, base: Path | None, parse: JsonParser,
                 max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> None:
        assert topic.schema_file is not None
        text = _read_schema_file(topic.schema_file, base, max_bytes)
        self.proto: ProtoSchema | None = None
        self.indexes: tuple[int, ...] = ()
        self.payload_decode: Decoder | None = None
        self.json_payload = topic.format == "json-schema" and not topic.validate_records
        if topic.format == "avro":
            reader = None if topic.reader_schema_file is None else _read_schema_file(topic.reader_schema_file,
                                                                                      base, max_bytes)
            self.payload_decode = compile_avro(text, reader, max_bytes=max_bytes)
        elif topic.format == "json-schema":
            self.payload_decode = compile_json_schema(text, parse, topic.validate_records, max_bytes=max_bytes)
        else:
            self.proto = ProtoSchema(text, max_bytes=max_bytes)
            assert topic.message is not None
            self.indexes = self.proto.indexes_of(topic.message)

    def __call__(self, raw: bytes, only: frozenset[str] | None = None) -> Any:
        _, at = split_header(raw)
        if self.proto is not None:
            _, at = read_message_indexes(raw, at)
            decode = self.proto.decoder(self.indexes, only)
            assert decode is not None
            return decode(raw[at:])
        assert self.payload_decode is not None
        return self.payload_decode(raw[at:])

    def json_text(self, raw: bytes) -> bytes | None:
        """The payload of a JSON Schema record of a topic that does not check it; None for any other."""
        if not self.json_payload or len(raw) < HEADER_BYTES or raw[0] != MAGIC:
            return None
        return raw[HEADER_BYTES:]


def inline_decoder(topic: TopicFormat, base: Path | None, parse: JsonParser,
                   max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> InlineDecoder | None:
    """The decoder of an inline topic (schemas from files; the header's id is not looked up); None for a
    JSON or registry topic. Raises :class:`SchemaError` for an unusable file."""
    if topic.schema_file is None:
        if topic.reader_schema_file is not None:
            _read_schema_file(topic.reader_schema_file, base, max_bytes)
        return None
    return InlineDecoder(topic, base, parse, max_bytes)


# --- the batch path for decoded records ----------------------------------------------------------------

# A decoder that can read a record for some fields alone (``only``): RegistryDecoder, InlineDecoder.
ProjectingDecoder = Callable[[bytes, "frozenset[str] | None"], Any]


def projecting(decode: Decoder) -> ProjectingDecoder:
    """``decode`` as a decoder taking ``only`` (ignored by a decoder that cannot read a record for some fields)."""
    if isinstance(decode, RegistryDecoder | InlineDecoder):
        return decode

    def whole(raw: bytes, only: frozenset[str] | None) -> Any:
        return decode(raw)

    return whole


def converter(decode: ProjectingDecoder, max_event_bytes: int, max_depth: int, fields_of: Callable[[Any], Any],
              only: frozenset[str]) -> Callable[[bytes], Any]:
    """A function from a record's value to the fields the topic's counters read (``fields_of``, the fast path's
    :meth:`~schemas.fast_route.FastRoute.fields_of`: the decoded objects themselves, floats and Decimals as they
    are), or None when the record should take the router. The router refuses a record as a whole when it is over
    ``max_event_bytes``, does not decode, is not a record (a dict), or is nested deeper than ``max_depth`` (which
    it looks for only when the record's bytes hold more than ``max_depth`` brackets): every such record, and
    every one ``fields_of`` does not take, is handed back, so the fast path decides only records the router
    would read into the same fields. ``only``: the top-level fields counters read, all a Protobuf record is read
    for (the others cannot change the decision of a record handed back when deep)."""

    def convert(raw: bytes) -> Any:
        if len(raw) > max_event_bytes or raw.count(123) + raw.count(91) > max_depth:
            return None
        try:
            event = decode(raw, only)
            if type(event) is not dict:
                return None
            return fields_of(event)
        except Exception:
            # A refusal, or what no refusal should be (a defect met on these bytes, a schema not loaded): the
            # router decides the record, and dead-letters it or raises as it must (consumer.applying).
            return None

    return convert


def json_text_reader(decode: Any, max_event_bytes: int) -> Callable[[bytes], bytes | None] | None:
    """For a JSON Schema topic whose records are not checked against their schema: a function from a record's
    value to its payload, the event's JSON text, for the JSON fast path (None: the router decides the record).
    Not parsed here: the fast path hands back all the JSON text the router's parser would not read as it does.
    None when the topic's decoder has no such reading."""
    if not isinstance(decode, RegistryDecoder | InlineDecoder) or not decode.json_payload:
        return None
    json_text = decode.json_text

    def read(raw: bytes) -> bytes | None:
        if len(raw) > max_event_bytes:
            return None
        text: bytes | None = json_text(raw)
        return text

    return read


def _json_loads(raw: bytes) -> Any:
    return json.loads(raw)


def decoders(formats: Mapping[str, TopicFormat], cache: SchemaCache, base: Path | None
             ) -> dict[str, Callable[[JsonParser], Decoder]]:
    """For the router: per non-JSON topic, a factory of its decoder from the JSON parser the topic's counters
    need (exact decimals or not; JSON Schema payloads are JSON)."""
    made: dict[str, Callable[[JsonParser], Decoder]] = {}
    for name, topic in formats.items():
        if topic.format == "json":
            continue
        if topic.registry:
            made[name] = functools.partial(_registry, topic, cache)
        else:
            made[name] = functools.partial(_inline, topic, base)
    return made


def _registry(topic: TopicFormat, cache: SchemaCache, parse: JsonParser) -> RegistryDecoder:
    del parse  # a registry topic's JSON Schema payloads are parsed by its WriterSchema (SchemaLoader's parser)
    return registry_decoder(topic, cache)


def _inline(topic: TopicFormat, base: Path | None, parse: JsonParser) -> InlineDecoder:
    decode = inline_decoder(topic, base, parse)
    assert decode is not None
    return decode


__all__ = [
    "FORMATS",
    "BadSchemaEventError",
    "InlineDecoder",
    "RegistryDecoder",
    "SchemaCache",
    "SchemaError",
    "SchemaNotLoadedError",
    "TopicFormat",
    "UnknownSchemaError",
    "WriterSchema",
    "avro_encoder",
    "compile_avro",
    "converter",
    "decoders",
    "frame",
    "inline_decoder",
    "json_schema_encoder",
    "json_text_reader",
    "parse_topic_tables",
    "plain",
    "projecting",
    "read_message_indexes",
    "registry_decoder",
    "schema_id_of",
    "schema_ids",
    "split_header",
]
