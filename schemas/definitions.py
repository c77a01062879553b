"""Counter definitions: which events feed which counter, and how.

A definitions file is TOML with one ``[[counter]]`` table per counter (the fields are documented in
docs/counters.md)::

    [[counter]]
    name = "shares_traded"
    topics = ["trades"]
    kind = "sum"
    key = ["symbol"]
    value = "qty"
    where = { side = "buy" }

A definition is the *meaning* of a counter's stored state. Changing an existing counter's key, value,
filter, bucket or kind in place is not supported: a replay after the change would apply events with the new
meaning to state built with the old one, mixing two meanings in one instance. A changed definition is a
new counter, with a new name.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from datetime import date, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from schemas.bounded import read_text_at_most
from schemas.errors import DefinitionError
from schemas.formats import TopicFormat, parse_topic_tables
from schemas.kinds.base import KindSpec, NumberMode

Kind = Literal["sum", "count", "min", "max", "mean", "variance", "distinct", "quantiles", "top_k"]
TimestampFormat = Literal["iso8601", "epoch_seconds", "epoch_millis"]
WhereScalar = str | int | bool

# Counter names reach CQL (as partition-key values) and metric labels, so they stay plain identifiers.
MAX_NAME_CHARS = 48
NAME_PATTERN = re.compile(rf"^[a-z][a-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}$")
# Kafka's own rule for topic names.
TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Kafka's own topics, which hold no one's events; "." and ".." match the pattern and Kafka refuses them.
KAFKA_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata",
                                   "__share_group_state"})
NOT_COUNTABLE_TOPICS = KAFKA_INTERNAL_TOPICS | {".", ".."}
MAX_PATH_SEGMENTS = 32
MAX_PATH_LENGTH = 256
# A definitions file is read whole: more than this is refused before any of it is parsed.
MAX_DEFINITIONS_BYTES = 16 * 1024 * 1024

_NUMERIC_KINDS = frozenset({"sum", "min", "max", "mean", "variance"})
_DEFAULT_NUMBER: dict[str, NumberMode] = {
    "sum": "integer",
    "min": "integer",
    "max": "integer",
    "mean": "float",
    "variance": "float",
}
# Options a kind accepts beyond the common fields; anything else set on that kind is refused.
_KIND_OPTIONS: dict[str, frozenset[str]] = {
    "sum": frozenset({"number", "coerce"}),
    "min": frozenset({"number", "coerce"}),
    "max": frozenset({"number", "coerce"}),
    "mean": frozenset({"number", "coerce"}),
    "variance": frozenset({"number", "coerce"}),
    "quantiles": frozenset({"k", "coerce"}),
    "distinct": frozenset({"lg_k"}),
    "top_k": frozenset({"max_map_size", "top"}),
    "count": frozenset(),
}
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,6})?([Zz]|[+-]\d\d:\d\d)")
_ALL_OPTIONS = frozenset().union(*_KIND_OPTIONS.values())
_BUCKET_UNITS = {"m": 60, "h": 3600, "d": 86400}
_DEFAULT_MAX_MAP_SIZE = 256
# Validation context of a definition read back from the counter registry: checks added since it was recorded are
# the file's to pass, not the record's (its consumer refuses the file at its next start instead).
RECORDED = "recorded"
_BUCKET_SIZE = re.compile(r"^([1-9][0-9]{0,4})([mhd])$")
_RETAIN = re.compile(r"([1-9][0-9]{0,6})([mhdw])")
_RETAIN_UNITS = {**_BUCKET_UNITS, "w": 7 * 86400}
# Cassandra's longest TTL is 20 years; a bucket's rows must outlive its retention by the grace.
_MAX_RETAIN_SECONDS = 3650 * 86400


class _FieldProblem(ValueError):
    """A cross-field check failed; ``field`` names the field to blame in the :class:`DefinitionError`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


# What of a Kafka record beside its payload a path can name (docs/counters.md, The record as fields).
RECORD_PARTS = ("key", "timestamp", "partition", "header")


def record_part(path: str) -> tuple[str, str] | None:
    """``(part, rest)`` for a path naming a part of the record rather than of its payload: ``@key`` is
    ``("key", "")``, ``@key.user.id`` is ``("key", "user.id")``, ``@header.trace`` is ``("header", "trace")``;
    ``None`` for a payload path. A payload field whose name starts with ``@`` is written with one more
    ``@`` in front (``@@x`` is the payload field ``@x``)."""
    if not path.startswith("@") or path.startswith("@@"):
        return None
    part, _, rest = path[1:].partition(".")
    return part, rest


def payload_path(path: str) -> str:
    """The payload path a (non-record) path names: ``@@x.y`` is ``@x.y``, any other is itself."""
    return path[1:] if path.startswith("@@") else path


def _check_payload_path(path: str, shown: str) -> None:
    segments = path.split(".")
    if len(path) > MAX_PATH_LENGTH or len(segments) > MAX_PATH_SEGMENTS or not all(segments):
        raise ValueError(
            f"{shown!r} is not a field path: dot-separated non-empty names, at most {MAX_PATH_SEGMENTS} "
            f"deep and {MAX_PATH_LENGTH} characters"
        )


def _check_path(path: str) -> str:
    record = record_part(path)
    if record is None:
        _check_payload_path(payload_path(path), path)
        return path
    part, rest = record
    if part not in RECORD_PARTS:
        raise ValueError(f"{path!r} names no part of a record (@key, @key.PATH, @timestamp, @partition, "
                         f"@header.NAME); a payload field named {'@' + part!r} is written {'@' + path!r}")
    if part in ("timestamp", "partition") and rest:
        raise ValueError(f"{path!r}: @{part} has no fields")
    if part == "header" and not (0 < len(rest) <= MAX_PATH_LENGTH):
        raise ValueError(f"{path!r}: a header is named as @header.NAME")
    if part == "key" and rest:
        _check_payload_path(rest, path)
    return path


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Turn TOML's dotted keys (``user.kind = "pro"`` is a nested table) back into field paths. A path given
    twice (``a.b = "x"`` beside ``"a.b" = "y"``: two keys to TOML, one field) or a table of no entries (a filter
    of nothing) is refused: either would drop an entry the file gives, without a word."""
    flat: dict[str, Any] = {}
    for k, v in table.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if not v:
                raise ValueError(f"where.{path} is a table of no entries: give it values, or leave it out")
            inner = _flatten(v, path + ".")
        else:
            inner = {path: v}
        for name, values in inner.items():
            if name in flat:
                raise ValueError(f"where names {name} twice (a dotted key and a quoted one are the same field)")
            flat[name] = values
    return flat


class _DerivedKept(BaseModel):
    """A frozen model whose values derived from its fields are kept once worked out (``cached_property``).

    ``functools.cached_property`` keeps a value in the instance's ``__dict__``, which ``model_copy`` copies
    whole: a copy with other fields would answer with the original's values. A copy forgets them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        for name in _derived_names(type(self)):
            copied.__dict__.pop(name, None)
        return copied


def _derived_names(model: type) -> tuple[str, ...]:
    return tuple(name for klass in model.__mro__ for name, attribute in vars(klass).items()
                 if isinstance(attribute, cached_property))


class Bucket(_DerivedKept):
    """Event-time bucketing: the bucket start (UTC) becomes the last component of the instance key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str
    size: str
    format: TimestampFormat = "iso8601"

    @model_validator(mode="before")
    @classmethod
    def _record_time_in_millis(cls, data: object) -> object:
        # The record's timestamp is milliseconds since 1970, whatever format the payload's times have.
        if isinstance(data, Mapping) and data.get("field") == "@timestamp":
            if data.get("format", "epoch_millis") != "epoch_millis":
                raise ValueError("@timestamp is in epoch_millis: leave format out")
            return {**data, "format": "epoch_millis"}
        return data

    @field_validator("field")
    @classmethod
    def _field_is_path(cls, v: str) -> str:
        _check_path(v)
        record = record_part(v)
        if record is not None and record[0] in ("partition",):
            raise ValueError(f"{v!r} is not a time")
        return v

    @field_validator("size")
    @classmethod
    def _size_is_known(cls, v: str) -> str:
        m = _BUCKET_SIZE.fullmatch(v)
        if m is None:
            raise ValueError(f"bucket size {v!r} is not like 1m, 5m, 1h or 1d")
        seconds = int(m.group(1)) * _BUCKET_UNITS[m.group(2)]
        # Sub-day buckets must tile a UTC day, so every day's buckets start at midnight.
        if seconds < 86400 and 86400 % seconds:
            raise ValueError(f"bucket size {v!r} does not divide a day evenly")
        return v

    @cached_property
    def seconds(self) -> int:
        """Bucket width in seconds (kept: a flush asks it of every instance of a retained counter it writes)."""
        m = _BUCKET_SIZE.fullmatch(self.size)
        assert m is not None
        return int(m.group(1)) * _BUCKET_UNITS[m.group(2)]


class CounterDefinition(_DerivedKept):
    """One counter: which topics feed it, its kind, how an event maps to an instance key and a value.

    Frozen, because a definition is the meaning of stored state: to change it, define a new counter.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    topics: tuple[str, ...] = Field(min_length=1)
    kind: Kind
    key: tuple[str, ...] = ()
    value: str | None = None
    event_id: str | None = None
    where: dict[str, tuple[WhereScalar, ...]] = Field(default_factory=dict)
    bucket: Bucket | None = None
    # How long a bucket is kept after it ends (bucketed counters only): then it disappears whole, and an event
    # that reaches it later is late (docs/counters.md, Retention and late events).
    retain: str | None = None
    number: NumberMode | None = None
    # Options are taken as written, strictly: ``coerce = "no"`` or ``lg_k = "12"`` is a mistake to show, not a
    # value to guess (pydantic's lax mode took "no" for false and "12" for 12).
    coerce: bool | None = Field(default=None, strict=True)
    # A missing or null key, value or bucket field makes the event invalid for this counter (dead-lettered)
    # rather than not for it (skipped): docs/counters.md, One topic, several kinds of event.
    required: bool | None = Field(default=None, strict=True)
    lg_k: int | None = Field(default=None, ge=4, le=21, strict=True)
    k: int | None = Field(default=None, ge=8, le=65535, strict=True)
    max_map_size: int | None = Field(default=None, ge=8, le=65536, strict=True)
    top: int | None = Field(default=None, ge=1, le=1000, strict=True)
    # Where a counter added to a running deployment starts: "earliest" (the log start) or an RFC 3339 time with
    # an offset; unset, from the group's position. Set, the live consumers count it from a hand-over offset
    # in each partition and ``countersink backfill`` counts what comes before (docs/operations.md, Adding a
    # counter with a backfill). Not part of the meaning: it decides where counting starts, not what a state is.
    since: str | None = None

    @field_validator("since", mode="before")
    @classmethod
    def _since_written_as_a_toml_time(cls, v: object) -> object:
        # TOML has times of its own (unquoted): one with an offset is the RFC 3339 time it writes.
        if isinstance(v, datetime):
            if v.tzinfo is None:
                raise ValueError(f"{v.isoformat()} has no offset: write one, like {v.isoformat()}Z")
            return v.isoformat().replace("+00:00", "Z")
        if isinstance(v, date):
            raise ValueError(f"{v.isoformat()} is a date: write a time with its offset, like {v.isoformat()}T00:00:00Z")
        return v

    @field_validator("since")
    @classmethod
    def _since_is_a_start(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not (info.context or {}).get(RECORDED):
            since_ms(v)
        return v

    @property
    def since_ms(self) -> int | None:
        """The start of a ``since`` time in epoch milliseconds; None for ``earliest`` or no ``since``."""
        return None if self.since is None or self.since == "earliest" else since_ms(self.since)

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise ValueError(f"{v!r} must match {NAME_PATTERN.pattern} (it is used in CQL and metric labels)")
        return v

    @field_validator("topics", mode="before")
    @classmethod
    def _topics_list(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    @field_validator("topics")
    @classmethod
    def _topics_are_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for t in v:
            if not TOPIC_PATTERN.fullmatch(t) or t in NOT_COUNTABLE_TOPICS:
                raise ValueError(f"{t!r} is not a Kafka topic name" if t not in KAFKA_INTERNAL_TOPICS
                                 else f"{t!r} is one of Kafka's own topics")
        if len(set(v)) != len(v):
            raise ValueError("a topic is listed twice")
        return v

    @field_validator("key", mode="before")
    @classmethod
    def _key_list(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    @field_validator("key")
    @classmethod
    def _key_paths(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            _check_path(p)
        if len(set(v)) != len(v):
            raise ValueError("a key field is listed twice")
        return v

    @field_validator("value", "event_id")
    @classmethod
    def _single_path(cls, v: str | None) -> str | None:
        return None if v is None else _check_path(v)

    @field_validator("where", mode="before")
    @classmethod
    def _where_table(cls, v: object) -> object:
        if not isinstance(v, Mapping):
            return v
        flat = _flatten(v)
        out: dict[str, object] = {}
        for path, allowed in flat.items():
            _check_path(path)
            items = allowed if isinstance(allowed, list | tuple) else [allowed]
            if not items:
                raise ValueError(f"where.{path} lists no values")
            for item in items:
                # Floats never compare reliably for equality, and TOML dates have no JSON counterpart.
                if type(item) not in (str, int, bool):
                    raise ValueError(f"where.{path}: {item!r} is not a string, integer or boolean")
            out[path] = tuple(items)
        return out

    @model_validator(mode="after")
    def _kind_fits_options(self, info: ValidationInfo) -> CounterDefinition:
        allowed = _KIND_OPTIONS[self.kind]
        for option in sorted(_ALL_OPTIONS - allowed):
            if getattr(self, option) is not None:
                raise _FieldProblem(option, f"{option} does not apply to kind {self.kind}")
        if self.kind == "count":
            if self.value is not None:
                raise _FieldProblem("value", "kind count does not read a value field")
        elif self.value is None:
            raise _FieldProblem("value", f"kind {self.kind} needs a value field")
        if self.max_map_size is not None and self.max_map_size & (self.max_map_size - 1):
            raise _FieldProblem("max_map_size", f"{self.max_map_size} is not a power of two")
        # A definition recorded before this check was written keeps being read (RECORDED: schemas.registry).
        if self.kind == "top_k" and self.top is not None and not (info.context or {}).get(RECORDED):
            # A frequent-items sketch tracks at most 3/4 of its map: a read could never report more.
            size = self.max_map_size or _DEFAULT_MAX_MAP_SIZE
            if self.top > size * 3 // 4:
                wide = 1 << (self.top * 4 // 3 - 1).bit_length()
                raise _FieldProblem("top", f"top {self.top} is more than the {size * 3 // 4} items a max_map_size of "
                                    f"{size} tracks (3/4 of it): lower top, or give a new counter a max_map_size of "
                                    f"at least {wide}")
        if self.retain is not None:
            if self.bucket is None:
                raise _FieldProblem("retain", "retain applies to bucketed counters only (a bucket = { ... })")
            seconds = self.retain_seconds
            if seconds is None or seconds < self.bucket.seconds or seconds > _MAX_RETAIN_SECONDS:
                raise _FieldProblem("retain", f"{self.retain!r} is not a retention like 7d or 2w, at least one "
                                    f"bucket ({self.bucket.size}) and at most 3650d")
        return self

    @cached_property
    def retain_seconds(self) -> int | None:
        """Retention in seconds, ``None`` for a counter kept forever (kept, as the bucket's width)."""
        if self.retain is None:
            return None
        m = _RETAIN.fullmatch(self.retain)
        return None if m is None else int(m.group(1)) * _RETAIN_UNITS[m.group(2)]

    @cached_property
    def spec(self) -> KindSpec:
        """What the kind needs to create an empty state, with per-kind defaults filled in."""
        return KindSpec(
            kind=self.kind,
            number=self.number or _DEFAULT_NUMBER.get(self.kind, "integer"),
            lg_k=self.lg_k or 12,
            k=self.k or 200,
            lg_max_map_size=(self.max_map_size or _DEFAULT_MAX_MAP_SIZE).bit_length() - 1,
            top=self.top or 10,
        )

    @property
    def number_mode(self) -> NumberMode | None:
        """The effective number mode for numeric kinds, ``None`` for the others."""
        return self.spec.number if self.kind in _NUMERIC_KINDS else None


def since_ms(text: str) -> int | None:
    """``since``: None for ``earliest``, else the RFC 3339 time (with its offset) in epoch milliseconds.
    Raises ValueError for anything else."""
    if text == "earliest":
        return None
    if len(text) > 40 or not _RFC3339.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is neither \"earliest\" nor an RFC 3339 time with an offset, like "
                         "2026-11-01T00:00:00Z")
    try:
        at = int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:  # a month 13, an offset of 25 hours: Python's own words name its internals
        raise ValueError(f"{text!r} is not a time: its date, time or offset is out of range") from None
    if at < 0:
        # Kafka looks a time up as a number of milliseconds that may not be negative (-1 and -2 name the log's
        # end and start), and no record is older.
        raise ValueError(f"{text!r} is before 1970-01-01T00:00:00Z, where Kafka's record times start: use "
                         "\"earliest\"")
    return at


class CounterSet:
    """Every counter of one definitions file, indexed by name and by topic."""

    __slots__ = ("_by_name", "_by_topic", "counters", "formats", "schema_base", "source", "topics")

    def __init__(self, counters: tuple[CounterDefinition, ...], source: str = "<string>",
                 formats: Mapping[str, TopicFormat] | None = None, schema_base: Path | None = None) -> None:
        self.source = source
        self.counters = counters
        # The [[topic]] tables (schemas.formats): a topic without one is JSON. Inline schema files are read
        # relative to ``schema_base`` (the counters file's folder).
        self.formats: dict[str, TopicFormat] = dict(formats or {})
        self.schema_base = schema_base
        self._by_name: dict[str, CounterDefinition] = {}
        by_topic: dict[str, list[CounterDefinition]] = {}
        for i, c in enumerate(counters):
            if c.name in self._by_name:
                raise DefinitionError(source, f"{c.name!r} (#{i + 1})", "name", "duplicate counter name")
            self._by_name[c.name] = c
            for t in c.topics:
                by_topic.setdefault(t, []).append(c)
        self._by_topic = {t: tuple(cs) for t, cs in by_topic.items()}
        self.topics: tuple[str, ...] = tuple(sorted(by_topic))

    def format_of(self, topic: str) -> str:
        """The format of the topic's record values: ``json`` unless a [[topic]] table says otherwise."""
        declared = self.formats.get(topic)
        return "json" if declared is None else declared.format

    def for_topic(self, topic: str) -> tuple[CounterDefinition, ...]:
        """Return the counters fed by ``topic`` in file order (empty for an unknown topic)."""
        return self._by_topic.get(topic, ())

    def get(self, name: str) -> CounterDefinition | None:
        """Return the counter called ``name``, or ``None``."""
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> CounterDefinition:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[CounterDefinition]:
        return iter(self.counters)

    def __len__(self) -> int:
        return len(self.counters)

    def __repr__(self) -> str:
        return f"<CounterSet {self.source} {[c.name for c in self.counters]}>"


def _label(entry: object, index: int) -> str:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f"{name!r} (#{index + 1})" if isinstance(name, str) else f"#{index + 1}"


def _definition_errors(exc: ValidationError, source: str, counter: str) -> list[DefinitionError]:
    """One :class:`DefinitionError` per problem pydantic found in one counter."""
    found = []
    for err in exc.errors():
        problem = err.get("ctx", {}).get("error")
        if isinstance(problem, _FieldProblem):
            found.append(DefinitionError(source, counter, problem.field, problem.reason))
            continue
        field = ".".join(str(part) for part in err["loc"])
        found.append(DefinitionError(source, counter, field, err["msg"].removeprefix("Value error, ")))
    return found


def parse_definitions(text: str, source: str = "<string>", *, max_row_bytes: int | None = None,
                      base: Path | None = None) -> CounterSet:
    """Parse definitions from TOML text; ``source`` names the file in every :class:`DefinitionError`.

    Every counter is checked before anything is refused: the error raised carries every problem of the file
    in ``problems``. Counters whose shard rows could outgrow ``max_row_bytes`` (default
    ``schemas.shard_rows.DEFAULT_MAX_ROW_BYTES``) are refused with :class:`RowTooLargeError`."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(source, "", "", f"not valid TOML: {exc}") from exc
    problems = [DefinitionError(source, "", top, "unknown top-level table (expected [[counter]] or [[topic]])")
                for top in doc if top not in ("counter", "topic")]
    formats, format_problems = parse_topic_tables(doc.get("topic", []), base)
    problems += [DefinitionError(source, label, field, reason) for label, field, reason in format_problems]
    entries = doc.get("counter", [])
    if not isinstance(entries, list) or not entries:
        problems.append(DefinitionError(source, "", "counter", "the file defines no [[counter]] tables"))
        entries = []
    counters: list[CounterDefinition] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        try:
            counter = CounterDefinition.model_validate(entry)
        except ValidationError as exc:
            problems += _definition_errors(exc, source, _label(entry, i))
            continue
        if counter.name in names:
            problems.append(DefinitionError(source, _label(entry, i), "name", "duplicate counter name"))
            continue
        names.add(counter.name)
        counters.append(counter)
    from schemas import shard_rows  # it reads the router's limits, and the router reads definitions

    # The row sizes of the counters that pass their own checks are checked whatever the others' problems: a file
    # is mended in one round.
    counter_set = CounterSet(tuple(counters), source, formats, base)
    try:
        shard_rows.check_rows(counter_set, shard_rows.DEFAULT_MAX_ROW_BYTES if max_row_bytes is None else max_row_bytes)
    except DefinitionError as exc:
        if not problems:
            raise
        problems += exc.problems
    if problems:
        first, *more = problems
        raise DefinitionError(first.source, first.counter, first.field, first.reason, tuple(more))
    return counter_set


def load_definitions(path: str | Path, *, max_row_bytes: int | None = None) -> CounterSet:
    """Read and parse a definitions file; an unreadable or invalid file raises :class:`DefinitionError`
    (:func:`parse_definitions` says what ``max_row_bytes`` is)."""
    source = str(path)
    try:
        # A byte-order mark (as some Windows editors save UTF-8) is no TOML: read past it.
        text = read_text_at_most(path, MAX_DEFINITIONS_BYTES).removeprefix("\ufeff")
    except (OSError, UnicodeDecodeError) as exc:
        raise DefinitionError(source, "", "", f"cannot read the file: {exc}") from exc
    return parse_definitions(text, source, max_row_bytes=max_row_bytes, base=Path(path).resolve().parent)
