"""From raw event bytes to counter updates: the consumer's hot path.

:class:`EventRouter` parses each event once and runs, for every counter on the event's topic, an extractor
compiled when the router is built. Parsing uses pydantic-core's Rust JSON parser (the stdlib parser when a
counter on the topic needs exact decimals); per-event pydantic *model* validation is not used, because a
model cannot express the per-counter filters, dotted paths and buckets without a model per counter, and
``python -m bench.apply`` measures both (a single flat model is faster for one counter; a model per
counter loses once a topic feeds several). An extractor applies the counter's ``where`` filter, reads the
key fields, the value and the event id, checks their types, and returns an :class:`Update`, or ``None``
when the filter does not match.

Each counter decides for itself (:meth:`EventRouter.decide`). An event lacking one of a counter's key,
value or bucket fields (absent or null) does not apply to that counter: it is skipped for it and counted
as such, and the other counters on the topic count it. An event holding a field of the wrong type or out of
range, or lacking the event id of a counter that drops retries by id, is refused by that counter: the
counters that accept it count it, and the event goes once to the dead-letter topic naming every counter
that refused it. A ``required`` counter refuses an event lacking its fields. Only an event that cannot be
read at all (unparseable, oversized, too deep) is refused for every counter. The decision reads the record
alone, so a replay, a rebuild and the fast path decide alike. Filtered-out events are not errors.

Paths reach the payload (``user.id``) or the record around it: ``@key`` (its text), ``@key.PATH`` (the key
read as a JSON document), ``@timestamp`` (its Kafka timestamp in ms), ``@header.NAME`` (a header's text) and
``@partition``; a payload field whose name starts with ``@`` is written with one more (``@@x``).

Instance keys: the key fields' values as text (strings as they are, integers in decimal, booleans as
``true``/``false``), joined by ``|``; inside a component ``\\`` is written ``\\\\`` and ``|`` is written
``\\|``. With a bucket, the bucket start in UTC (``2026-11-22T10:00Z``) is the last component. A counter
with one key field and no bucket therefore has the plain value as its key (``IBM``); ``IBM|2026-11-22T10:00Z``
is the ``1h`` bucket of ``IBM``. A counter without key fields has the key ``""`` (or just the bucket).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from pydantic_core import from_json

from schemas.bounded import nested_deeper_than
from schemas.cql import LAST_EXPIRY_S
from schemas.definitions import NAME_PATTERN, CounterDefinition, CounterSet, payload_path, record_part
from schemas.errors import (
    FutureEventTimeError,
    InvalidEventError,
    KeyTooLongError,
    MalformedInstanceKeyError,
    MissingFieldError,
    OversizedEventError,
    UnaddressedEventError,
    UnparseableEventError,
    UnstorableTimeError,
    ValueOutOfRangeError,
    WrongTypeError,
)
from schemas.kinds import State, new_state

__all__ = [
    "APPLY_TO_HEADER",
    "MAX_DECIMAL_EXPONENT",
    "MAX_INTEGER",
    "Decision",
    "EventRouter",
    "RecordFields",
    "Update",
    "apply_to",
    "apply_updates",
    "decode_instance_key",
    "encode_instance_key",
    "restricted",
]

DEFAULT_MAX_EVENT_BYTES = 1_048_576
DEFAULT_MAX_DEPTH = 32
DEFAULT_MAX_KEY_BYTES = 1024
# How far a bucketed event's time may be ahead of its record's Kafka timestamp (ConsumerSettings).
DEFAULT_MAX_FUTURE_SKEW_S = 86_400
# Single values are bounded so one event cannot make a state or a stored body grow without limit; sums of
# many values are still exact at any size.
MAX_INTEGER = 2**64
MAX_DECIMAL_EXPONENT = 100
MAX_DECIMAL_DIGITS = 100
# 0000-01-01 cannot be formatted by gmtime everywhere; year 10000 cannot be formatted at all.
_MAX_EPOCH_SECONDS = 253_402_300_800

_MISSING: Any = object()
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class Update(NamedTuple):
    """One value for one instance of one counter, from one event."""

    counter: str
    key: str
    value: object
    event_id: str | None


# An extractor reads one counter's update from an event (and the record's Kafka timestamp, in ms, for
# retention): None when the event is filtered out, LATE when it belongs to a bucket past its retention.
Extractor = Callable[[dict[str, Any], "int | None"], "Update | object | None"]
LATE = object()


def _json_type(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int | float | Decimal):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, bytes | bytearray):  # a proto2 string field that is not UTF-8 comes as its bytes
        return "bytes that are not UTF-8 text"
    return "object"


def _escape(component: str) -> str:
    if "|" in component or "\\" in component:
        return component.replace("\\", "\\\\").replace("|", "\\|")
    return component


def encode_instance_key(parts: Iterable[str]) -> str:
    """Join key components into one instance key; :func:`decode_instance_key` is its inverse."""
    return "|".join(_escape(p) for p in parts)


def decode_instance_key(key: str) -> tuple[str, ...]:
    """Split an instance key into its components (``""`` is one empty component).

    Raises :class:`MalformedInstanceKeyError` for a dangling or unknown escape.
    """
    parts: list[str] = []
    current: list[str] = []
    chars = iter(key)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, None)
            if nxt not in ("\\", "|"):
                raise MalformedInstanceKeyError(f"bad escape in instance key {key!r}")
            current.append(nxt)
        elif ch == "|":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return tuple(parts)


# --- field access ---------------------------------------------------------------------------------------


class RecordFields(NamedTuple):
    """What a counter may read of a Kafka record beside its payload (paths ``@key``, ``@timestamp``,
    ``@header.NAME``, ``@partition``): the record's key, Kafka timestamp (ms), headers and partition."""

    timestamp_ms: int | None = None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    partition: int | None = None


# The record's fields ride in the parsed event under this key: no JSON document (and no decoded Avro or
# Protobuf record) has a key that is not a string, so it cannot collide with a payload field.
_RECORD: Any = object()


class _RecordView:
    """One record's fields as the getters read them: the key's text and document decoded once, when first
    read, and any decoding error kept and raised again to every counter that reads it."""

    __slots__ = ("_doc", "_text", "fields", "max_depth")

    def __init__(self, fields: RecordFields, max_depth: int) -> None:
        self.fields = fields
        self.max_depth = max_depth
        self._text: Any = None
        self._doc: Any = None

    def key_text(self) -> Any:
        if self._text is None:
            key = self.fields.key
            if key is None:
                self._text = _NULL
            else:
                try:
                    self._text = bytes(key).decode("utf-8")
                except UnicodeDecodeError:
                    self._text = ValueOutOfRangeError("@key", "the record's key is not UTF-8 text")
        text = self._text
        if type(text) is ValueOutOfRangeError:
            raise text
        return None if text is _NULL else text

    def key_doc(self) -> Any:
        if self._doc is None:
            key = self.fields.key
            if key is None:
                self._doc = _NULL
            else:
                try:
                    doc = from_json(bytes(key))
                except ValueError:
                    doc = WrongTypeError("@key", "the record's key is not a JSON document")
                else:
                    if type(doc) is dict and nested_deeper_than(doc, self.max_depth):
                        doc = WrongTypeError("@key", f"the record's key is nested deeper than {self.max_depth}")
                self._doc = doc
        doc = self._doc
        if type(doc) is WrongTypeError:
            raise doc
        return None if doc is _NULL else doc

    def header(self, name: str) -> Any:
        found: Any = _MISSING
        for header, value in self.fields.headers:
            if header == name:
                found = value  # the last of a name, as Kafka's own clients read it
        if found is _MISSING or found is None:
            return found
        try:
            return bytes(found).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueOutOfRangeError(f"@header.{name}", "header value is not UTF-8 text") from None


_NULL: Any = object()


def _path_getter(parts: tuple[str, ...], prefix: str = "") -> Callable[[Any], Any]:
    """Return a function reading the field ``parts`` from a document; ``_MISSING`` when absent."""
    if len(parts) == 1:
        name = parts[0]

        def get_one(node: Any) -> Any:
            if type(node) is not dict:
                if node is None:
                    return _MISSING
                raise WrongTypeError(prefix.rstrip("."), f"expected an object, got {_json_type(node)}")
            return node.get(name, _MISSING)

        return get_one

    def get(node: Any) -> Any:
        for i, part in enumerate(parts):
            if type(node) is not dict:
                if node is None:
                    return _MISSING
                raise WrongTypeError(prefix + ".".join(parts[:i]), f"expected an object, got {_json_type(node)}")
            node = node.get(part, _MISSING)
            if node is _MISSING:
                return _MISSING
        return node

    return get


def _record_getter(path: str, part: str, rest: str) -> Callable[[dict[str, Any]], Any]:
    if part == "timestamp":
        def timestamp(event: dict[str, Any]) -> Any:
            ms = event[_RECORD].fields.timestamp_ms
            return _MISSING if ms is None or ms < 0 else ms

        return timestamp
    if part == "partition":
        def partition(event: dict[str, Any]) -> Any:
            number = event[_RECORD].fields.partition
            return _MISSING if number is None else number

        return partition
    if part == "header":
        return lambda event: event[_RECORD].header(rest)
    if not rest:
        return lambda event: event[_RECORD].key_text()
    inside = _path_getter(tuple(rest.split(".")), "@key.")
    return lambda event: inside(event[_RECORD].key_doc())


def _getter(path: str) -> Callable[[dict[str, Any]], Any]:
    """Return a function reading ``path`` from a parsed event; ``_MISSING`` when absent. A path naming a part
    of the record (``@key``, ...) reads the :class:`RecordFields` the router put beside the payload."""
    record = record_part(path)
    if record is not None:
        return _record_getter(path, *record)
    parts = tuple(payload_path(path).split("."))
    if len(parts) == 1:
        name = parts[0]
        return lambda event: event.get(name, _MISSING)
    return _path_getter(parts)


def _quiet_getter(path: str) -> Callable[[dict[str, Any]], Any]:
    """Like :func:`_getter`, but a path through a non-object, or a record field that cannot be read, is
    simply absent (for ``where``)."""
    get = _getter(path)

    def quiet(event: dict[str, Any]) -> Any:
        try:
            return get(event)
        except InvalidEventError:
            return _MISSING

    return quiet


# --- value conversion -----------------------------------------------------------------------------------


_OUTSIDE = "not between -2**64 and 2**64 (both excluded)"


def _check_int(path: str, v: int) -> int:
    if -MAX_INTEGER < v < MAX_INTEGER:
        return v
    raise ValueOutOfRangeError(path, f"integer {_int_text(v)} is {_OUTSIDE}")


def _int_text(v: int) -> str:
    # Python refuses to write an integer of more than 4,300 digits (and takes quadratic time before): a
    # reason names a long one by its size.
    return str(v) if v.bit_length() <= 256 else f"{'-' if v < 0 else ''}<{int(v.bit_length() * 0.30103) + 1} digits>"


# An integral value past this many digits is outside ±2**64 (20 digits) whatever they are: refused before
# int() converts it, which for 1e1000000 takes minutes and for 1e999999999999999999 all the memory.
_MAX_INTEGER_DIGITS = 21


class Passes(NamedTuple):
    """What a converter returns unchanged: a value of exactly type ``kind`` (an ``int`` strictly within
    ±``limit``; a ``str`` of ASCII text at most ``limit`` characters long, any length when ``limit`` is
    None). The fast path tests this in line and calls the converter only for anything else."""

    kind: type
    limit: int | None


def _passing(convert: Callable[[Any], Any], passes: Passes) -> Callable[[Any], Any]:
    convert.passes = passes  # type: ignore[attr-defined]
    return convert


def passes_of(convert: Callable[[Any], Any]) -> Passes | None:
    """The :class:`Passes` of a converter, if it declares one."""
    return getattr(convert, "passes", None)


def _check_decimal(path: str, d: Decimal) -> Decimal:
    if not d.is_finite():
        raise ValueOutOfRangeError(path, f"{d} is not a finite number")
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    if abs(exponent) > MAX_DECIMAL_EXPONENT or d.adjusted() > MAX_DECIMAL_EXPONENT:
        raise ValueOutOfRangeError(path, f"{d} has an exponent beyond ±{MAX_DECIMAL_EXPONENT}")
    if len(d.as_tuple().digits) > MAX_DECIMAL_DIGITS:
        raise ValueOutOfRangeError(path, f"decimal has more than {MAX_DECIMAL_DIGITS} digits")
    return d.copy_abs() if d.is_zero() else d


def _check_float(path: str, x: float) -> float:
    if x - x != 0.0:  # true only for inf and nan, and cheaper than math.isfinite's call
        raise ValueOutOfRangeError(path, f"{x} is not a finite number")
    return x if x else 0.0  # -0.0 and 0.0 compare equal; keep one so min/max bytes are order-free


def _wrong(path: str, v: object, wanted: str) -> WrongTypeError:
    return WrongTypeError(path, f"expected {wanted}, got {_json_type(v)} {_short(v)}")


def _short(v: object) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer_converter(path: str, coerce: bool) -> Callable[[Any], int]:
    def convert(v: Any) -> int:
        t = type(v)
        if t is int:
            return _check_int(path, v)
        if coerce:
            if t is str and _INT_TEXT.fullmatch(v):
                if len(v.lstrip("-")) > _MAX_INTEGER_DIGITS:
                    raise ValueOutOfRangeError(path, f"an integer of {len(v.lstrip('-'))} digits is {_OUTSIDE}")
                return _check_int(path, int(v))
            if t is float and v.is_integer():
                return _check_int(path, int(v))
            if t is Decimal and v.is_finite() and v == v.to_integral_value():
                if v.adjusted() >= _MAX_INTEGER_DIGITS:
                    raise ValueOutOfRangeError(path, f"an integer of {v.adjusted() + 1} digits is {_OUTSIDE}")
                return _check_int(path, int(v))
        raise _wrong(path, v, "an integer")

    return _passing(convert, Passes(int, MAX_INTEGER))


def _float_converter(path: str, coerce: bool) -> Callable[[Any], float | int]:
    def convert(v: Any) -> float | int:
        t = type(v)
        if t is float:
            return _check_float(path, v)
        if t is int:
            # Kept as an int: sums and moments add integers exactly in float mode.
            return _check_int(path, v)
        if t is Decimal:
            return _check_float(path, float(v))
        if coerce and t is str and _NUMBER_TEXT.fullmatch(v):
            return _check_float(path, float(v))
        raise _wrong(path, v, "a number")

    return convert


def _real_converter(path: str, coerce: bool) -> Callable[[Any], float]:
    to_number = _float_converter(path, coerce)

    def convert(v: Any) -> float:
        return float(to_number(v))

    return convert


def _decimal_converter(path: str, coerce: bool) -> Callable[[Any], Decimal]:
    def convert(v: Any) -> Decimal:
        t = type(v)
        if t is Decimal:
            return _check_decimal(path, v)
        if t is int:
            # An exact counter holds an integer to the decimals' bounds (100 digits), as it holds 1.0 or 1e30.
            return _check_decimal(path, Decimal(v))
        if t is float:
            # With a decimal counter on the topic, JSON numbers arrive as Decimal; a float here can only
            # be NaN or Infinity.
            _check_float(path, v)
            return _check_decimal(path, Decimal(v))
        if coerce and t is str and _NUMBER_TEXT.fullmatch(v):
            try:
                return _check_decimal(path, Decimal(v))
            except InvalidOperation as exc:
                raise ValueOutOfRangeError(path, f"{_short(v)} is not a decimal") from exc
        raise _wrong(path, v, "a number")

    return convert


def _item_converter(path: str, max_bytes: int | None) -> Callable[[Any], str]:
    """Distinct and top-k items: strings, and integers by their decimal text."""

    def convert(v: Any) -> str:
        t = type(v)
        if t is str:
            s: str = v
        elif t is int:
            s = str(v)
        else:
            raise _wrong(path, v, "a string or an integer")
        if not s.isascii():
            try:
                size = len(s.encode())
            except UnicodeEncodeError as exc:
                raise ValueOutOfRangeError(path, "string is not valid Unicode (lone surrogate)") from exc
        else:
            size = len(s)
        if max_bytes is not None and size > max_bytes:
            raise ValueOutOfRangeError(path, f"item of {size} bytes exceeds {max_bytes}")
        return s

    return _passing(convert, Passes(str, max_bytes))  # ASCII: a character is a byte


def _value_converter(definition: CounterDefinition, max_key_bytes: int) -> Callable[[Any], Any]:
    path = definition.value or ""
    coerce = bool(definition.coerce)
    kind = definition.kind
    if kind == "distinct":
        return _item_converter(path, None)
    if kind == "top_k":
        return _item_converter(path, max_key_bytes)
    if kind == "quantiles":
        return _real_converter(path, coerce)
    mode = definition.spec.number
    if mode == "integer":
        return _integer_converter(path, coerce)
    if mode == "decimal":
        return _decimal_converter(path, coerce)
    return _float_converter(path, coerce)


# --- key components -------------------------------------------------------------------------------------


def _key_text(path: str, v: Any) -> str:
    t = type(v)
    if t is str:
        s: str = v
        return s
    if t is int:
        return str(v)
    if t is bool:
        return "true" if v else "false"
    if v is _MISSING or v is None:
        raise MissingFieldError(path, "key field is missing" if v is _MISSING else "key field is null",
                                "key_missing" if v is _MISSING else "key_null")
    raise _wrong(path, v, "a string, integer or boolean")


def _instant(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.floor(seconds)))


# A leap second, as RFC 3339 writes it: second 60 of the day's last minute in UTC (23:59:60Z, 05:29:60+05:30).
_LEAP_SECOND = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}):60(?:[.,][0-9]+)?")


def rfc3339_variant(text: str) -> datetime | None:
    """A time in the RFC 3339 forms Python's ISO-8601 parser refuses, or None: a lowercase ``z``, and a leap second,
    counted as the last microsecond of its minute (POSIX time has no second for it: it is never a bucket's own)."""
    fixed = text[:-1] + "Z" if text.endswith("z") else text
    leap = _LEAP_SECOND.match(fixed)
    if leap is not None:
        fixed = leap.group(1) + ":59.999999" + fixed[leap.end():]
    try:
        when = datetime.fromisoformat(fixed)
    except ValueError:
        return None
    if leap is not None:
        offset = when.utcoffset()
        if offset is None:
            return None
        # Only the last minute of a UTC day has a 61st second. Worked out from the offset, not by astimezone(),
        # which raises OverflowError for a UTC day before year 1 or after 9999 (0001-01-01T00:59:60+01:00): such a
        # time is refused by the range check, as those times without a leap second are.
        of_day = ((when.hour * 60 + when.minute) * 60 + when.second) * 10**6 + when.microsecond - offset // _MICROSECOND
        if of_day % _DAY_US < _LAST_MINUTE_US:
            return None
    return when


_MICROSECOND = timedelta(microseconds=1)
_DAY_US = 86_400 * 10**6
_LAST_MINUTE_US = 86_340 * 10**6


def _seconds_reader(path: str, fmt: str) -> Callable[[Any], float | int]:
    """A bucket field's value to epoch seconds (not yet range checked); raises for a missing, null or wrongly
    typed value."""
    scale = 1000 if fmt == "epoch_millis" else 1

    def seconds_of(v: Any) -> float | int:
        if v is _MISSING or v is None:
            raise MissingFieldError(path, "bucket timestamp is missing" if v is _MISSING else "is null",
                                    "bucket_missing" if v is _MISSING else "bucket_null")
        t = type(v)
        if fmt == "iso8601":
            if t is not str:
                raise _wrong(path, v, "an ISO-8601 timestamp string")
            when: datetime | None
            try:
                when = datetime.fromisoformat(v)
            except ValueError:
                when = rfc3339_variant(v)
            if when is None:
                raise ValueOutOfRangeError(path, f"{_short(v)} is not an ISO-8601 timestamp")
            if when.tzinfo is None:
                raise ValueOutOfRangeError(path, f"{_short(v)} has no UTC offset")
            # timestamp() rounds to the nearest double: past about 2242 a time a microsecond before a second
            # (2999-12-31T23:59:59.999999Z) rounds up into the next second, bucket or year, landing on it exactly
            # (a whole second is a double; one a microsecond after a second lands on that second, which is
            # right). A time rounded up so is kept just under the second it reached.
            seconds = when.timestamp()
            return math.nextafter(seconds, 0.0) if when.microsecond > 500_000 and seconds.is_integer() else seconds
        if t is int:
            return v // scale if scale > 1 else v  # type: ignore[no-any-return]
        if t is float or t is Decimal:
            x = float(v)
            if x - x != 0.0:
                raise ValueOutOfRangeError(path, f"{v} is not a finite timestamp")
            return x / scale
        raise _wrong(path, v, f"a number of {'milliseconds' if scale > 1 else 'seconds'} since 1970")

    return seconds_of


# Distinct values a bucket-time function keeps (ISO-8601 texts, bucket starts) before it forgets them all.
BUCKET_CACHE = 4096


def bucket_time(definition: CounterDefinition) -> Callable[[Any], tuple[float | int, int, str]]:
    """A bucketed counter's event time without its record: a bucket field's value (not missing nor null) to
    ``(seconds, bucket start, bucket text)``, raising as the router does for a wrongly typed value, a time
    outside 1970..9999 or a bucket Cassandra could not keep. The record's checks (future skew, lateness) are
    the caller's. Pure, so the batch path calls it once per distinct value: an ISO-8601 text is parsed once,
    a bucket start formatted once; an integer time costs two divisions."""
    bucket = definition.bucket
    assert bucket is not None
    path, size, fmt = bucket.field, bucket.seconds, bucket.format
    seconds_of = _seconds_reader(path, fmt)
    scale = 1000 if fmt == "epoch_millis" else 1
    integers = fmt != "iso8601"
    last_end = LAST_EXPIRY_S if definition.retain_seconds is not None else None
    texts: dict[int, str] = {}
    parsed: dict[str, tuple[float | int, int, str]] = {}

    def of(v: Any) -> tuple[float | int, int, str]:
        t = type(v)
        if t is int and integers:
            seconds: float | int = v // scale if scale > 1 else v
        elif t is str:
            hit = parsed.get(v)
            if hit is not None:
                return hit
            seconds = seconds_of(v)
        else:
            seconds = seconds_of(v)
        if not 0 <= seconds < _MAX_EPOCH_SECONDS:
            raise ValueOutOfRangeError(path, "timestamp is outside 1970..9999")
        start = math.floor(seconds) // size * size
        if last_end is not None and start + size > last_end:
            raise UnstorableTimeError(path, "its bucket ends after the last expiry Cassandra stores")
        text = texts.get(start)
        if text is None:
            if len(texts) >= BUCKET_CACHE:
                texts.clear()
            text = texts[start] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(start))
        found = (seconds, start, text)
        if t is str:
            if len(parsed) >= BUCKET_CACHE:
                parsed.clear()
            parsed[v] = found
        return found

    return of


def _bucket_reader(definition: CounterDefinition, max_future_skew_s: int
                   ) -> Callable[[dict[str, Any], int | None], tuple[int, str]]:
    bucket = definition.bucket
    assert bucket is not None
    path = bucket.field
    get = _getter(path)
    size = bucket.seconds
    seconds_of = _seconds_reader(path, bucket.format)
    millis = bucket.format == "epoch_millis"
    last: list[Any] = [None, ""]  # the previous bucket start and its text: events arrive in time order
    max_future_ms = max_future_skew_s * 1000
    # A bucket whose rows expire must end by the last expiry Cassandra stores (the rows then expire with it,
    # before the retention asked: docs/counters.md); a bucket kept forever has no expiry to store.
    last_end = LAST_EXPIRY_S if definition.retain_seconds is not None else None

    def read(event: dict[str, Any], timestamp_ms: int | None) -> tuple[int, str]:
        """The bucket's start (epoch seconds) and its text in the instance key. ``timestamp_ms`` is the record's
        Kafka timestamp: an event time further ahead of it than ``max_future_skew_s`` is refused. Decided
        from the record alone, never from a clock, so a replay days later decides as the first reading did; a
        record without a timestamp (``None`` or -1) is not checked."""
        v = get(event)
        seconds = seconds_of(v)
        if not 0 <= seconds < _MAX_EPOCH_SECONDS:
            raise ValueOutOfRangeError(path, "timestamp is outside 1970..9999")
        # An integer of milliseconds is compared whole: its seconds are floored, which let up to 999 ms past.
        event_ms = v if millis and type(v) is int else seconds * 1000
        if timestamp_ms is not None and timestamp_ms >= 0 and event_ms > timestamp_ms + max_future_ms:
            raise FutureEventTimeError(path, f"event time {_instant(seconds)} is more than {max_future_skew_s} s "
                                       f"after its record's timestamp {_instant(timestamp_ms / 1000)}")
        start = math.floor(seconds) // size * size
        if last_end is not None and start + size > last_end:
            raise UnstorableTimeError(path, f"its bucket ends after {_instant(last_end)}, the last expiry "
                                      "Cassandra stores: none of its rows could be kept until it is over")
        if start != last[0]:
            last[0] = start
            last[1] = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(start))
        text: str = last[1]
        return start, text

    return read


# --- per-counter extractors -----------------------------------------------------------------------------


def _where_check(
    get: Callable[[dict[str, Any]], Any], allowed: tuple[object, ...]
) -> Callable[[dict[str, Any]], bool]:
    if all(type(a) is str for a in allowed):
        strings = frozenset(allowed)

        def string_in(event: dict[str, Any]) -> bool:
            v = get(event)
            return type(v) is str and v in strings

        return string_in
    # Tagging with the type keeps True from matching 1 and 1 from matching 1.0.
    tagged = frozenset((type(a), a) for a in allowed)

    def tagged_in(event: dict[str, Any]) -> bool:
        v = get(event)
        kind = type(v)
        # An array or object never equals a scalar (and cannot be looked up in a set).
        return kind is not list and kind is not dict and (kind, v) in tagged

    return tagged_in


def _where_matcher(where: Mapping[str, tuple[object, ...]]) -> Callable[[dict[str, Any]], bool] | None:
    if not where:
        return None
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for path, allowed in where.items():
        checks.append(_where_check(_quiet_getter(path), allowed))
    if len(checks) == 1:
        return checks[0]
    return lambda event: all(check(event) for check in checks)


def _none(event: dict[str, Any]) -> None:
    return None


def _event_id_converter(path: str, max_bytes: int) -> Callable[[Any], str]:
    """An event id's rule: a string of at most ``max_bytes``, or an integer by its decimal text."""

    def convert(v: Any) -> str:
        t = type(v)
        if t is str:
            if len(v) > max_bytes:
                raise ValueOutOfRangeError(path, f"event id longer than {max_bytes}")
            return v  # type: ignore[no-any-return]
        if t is int:
            return str(v)
        if v is _MISSING or v is None:
            raise MissingFieldError(path, "event id is missing" if v is _MISSING else "event id is null",
                                    "event_id_missing" if v is _MISSING else "event_id_null")
        raise _wrong(path, v, "a string or an integer")

    return _passing(convert, Passes(str, max_bytes))


def _event_id_reader(path: str | None, max_bytes: int) -> Callable[[dict[str, Any]], str | None]:
    if path is None:
        return _none
    get = _getter(path)
    convert = _event_id_converter(path, max_bytes)

    def event_id_of(event: dict[str, Any]) -> str | None:
        return convert(get(event))

    return event_id_of


def _value_reader(definition: CounterDefinition, max_key_bytes: int) -> Callable[[dict[str, Any]], Any]:
    path = definition.value
    if path is None:
        return _none
    get = _getter(path)
    convert = _value_converter(definition, max_key_bytes)

    def value_of(event: dict[str, Any]) -> Any:
        v = get(event)
        if v is _MISSING or v is None:
            raise MissingFieldError(path, "value field is missing" if v is _MISSING else "value field is null",
                                    "value_missing" if v is _MISSING else "value_null")
        return convert(v)

    return value_of


def _compile(definition: CounterDefinition, max_key_bytes: int, max_future_skew_s: int) -> Extractor:
    name = definition.name
    matches = _where_matcher(definition.where)
    key_fields = tuple((p, _getter(p)) for p in definition.key)
    key_paths = ",".join(definition.key) or (definition.bucket.field if definition.bucket else "")
    bucket = _bucket_reader(definition, max_future_skew_s) if definition.bucket is not None else None
    fast_key_chars = max_key_bytes // 4

    def check_key(key: str) -> str:
        if len(key) <= fast_key_chars and key.isascii():
            return key
        try:
            size = len(key.encode())
        except UnicodeEncodeError as exc:
            raise ValueOutOfRangeError(key_paths, "key is not valid Unicode (lone surrogate)") from exc
        if size > max_key_bytes:
            raise KeyTooLongError(key_paths, f"instance key of {size} bytes exceeds {max_key_bytes}")
        return key

    event_id_of = _event_id_reader(definition.event_id, max_key_bytes)
    value_of = _value_reader(definition, max_key_bytes)
    # An event is late when its record was written (its Kafka timestamp) at or after its bucket's expiry:
    # decided from the record alone, so a replay decides as the original did, whatever the clock says.
    kept_ms = ((definition.bucket.seconds + definition.retain_seconds) * 1000
               if definition.bucket is not None and definition.retain_seconds is not None else None)

    # The common shapes get their own closures: one key field, no bucket is most counters.
    if len(key_fields) == 1 and bucket is None:
        ((kpath, kget),) = key_fields

        def extract_one(event: dict[str, Any], timestamp_ms: int | None = None) -> Update | None:
            if matches is not None and not matches(event):
                return None
            key = _escape(_key_text(kpath, kget(event)))
            return Update(name, check_key(key), value_of(event), event_id_of(event))

        return extract_one

    def extract(event: dict[str, Any], timestamp_ms: int | None = None) -> Update | object | None:
        if matches is not None and not matches(event):
            return None
        parts = [_escape(_key_text(p, get(event))) for p, get in key_fields]
        if bucket is not None:
            start, text = bucket(event, timestamp_ms)
            parts.append(text)
            update = Update(name, check_key("|".join(parts)), value_of(event), event_id_of(event))
            if kept_ms is not None and timestamp_ms is not None and timestamp_ms >= start * 1000 + kept_ms:
                return LATE  # after the checks: a late event that is also invalid is dead-lettered
            return update
        return Update(name, check_key("|".join(parts)), value_of(event), event_id_of(event))

    return extract


# --- the router -----------------------------------------------------------------------------------------


def _nonfinite(literal: str) -> float:
    # JSON has no NaN or Infinity; Python's parser accepts them, and the value checks refuse them with
    # the field's path, which is a better dead-letter reason than a parse error.
    return float(literal)


_NOT_A_DECIMAL = Decimal("NaN")


def exact_decimal(text: str) -> Decimal:
    """A JSON number's exact text as a Decimal, as both of the consumer's parsers read numbers on a topic with
    exact decimals; an exponent past what Decimal holds (1e9999999999999999999) is NaN, refused as "not a
    finite number" by a counter that reads it and ignored by the others, as any value they do not read."""
    try:
        return Decimal(text)
    except InvalidOperation:
        return _NOT_A_DECIMAL


_DECIMAL = json.JSONDecoder(parse_constant=_nonfinite, parse_float=exact_decimal)
Parser = Callable[[bytes], Any]


def _parse_fast(raw: bytes) -> Any:
    # pydantic-core's Rust parser (jiter): about 4x faster than json.loads on small events
    # (python -m bench.apply), refuses lone surrogates, and bounds nesting itself.
    return from_json(raw)


def _parse_decimal(raw: bytes) -> Any:
    # The standard parser is the one that can hand every non-integer to Decimal from its exact text.
    return _DECIMAL.decode(raw.decode("utf-8"))


class _CounterPlan(NamedTuple):
    name: str
    extract: Extractor
    # Its key, value and bucket fields (role, getter), read again only when the extractor raised: an event
    # lacking one does not apply to the counter, whatever else is wrong with it.
    needed: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...]
    required: bool


class _TopicPlan(NamedTuple):
    counters: tuple[_CounterPlan, ...]
    parse: Parser
    reads_record: bool  # a counter on the topic reads @key, @timestamp, @header.NAME or @partition
    names: frozenset[str]


def _paths(definition: CounterDefinition) -> list[str]:
    """Every path a definition reads."""
    paths = [*definition.key, *definition.where]
    for path in (definition.value, definition.event_id, definition.bucket.field if definition.bucket else None):
        if path is not None:
            paths.append(path)
    return paths


def _counter_plan(definition: CounterDefinition, max_key_bytes: int, max_future_skew_s: int) -> _CounterPlan:
    needed = [("key", path) for path in definition.key]
    if definition.value is not None:
        needed.append(("value", definition.value))
    if definition.bucket is not None:
        needed.append(("bucket", definition.bucket.field))
    return _CounterPlan(definition.name, _compile(definition, max_key_bytes, max_future_skew_s),
                        tuple((role, _getter(path)) for role, path in needed), bool(definition.required))


def _absent(event: dict[str, Any], needed: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...]) -> str | None:
    """Why an event does not apply to a counter: the first of its key, value and bucket fields (in that
    order) that the event lacks, as ``key_missing``, ``value_null``, ...; ``None`` when it has them all (a
    field there but unreadable, a path through a string say, is there: the counter refuses the event)."""
    for role, get in needed:
        try:
            v = get(event)
        except InvalidEventError:
            continue
        if v is _MISSING:
            return f"{role}_missing"
        if v is None:
            return f"{role}_null"
    return None


class Decision(NamedTuple):
    """What the counters of a topic decided of one event, each for itself.

    ``updates``: one per counter that accepts the event (filtered-out counters and late buckets make none);
    ``refusals``: the error of each counter that refused it (``counter`` set), for one dead letter;
    ``not_applicable``: ``(counter, reason)`` for each counter the event lacks a field of (``key_missing``,
    ``value_null``, ...), skipped for it."""

    updates: list[Update]
    refusals: list[InvalidEventError]
    not_applicable: list[tuple[str, str]]


# A record carrying this header is applied only by the counters it names (comma-separated): a dead letter
# re-published by ``countersink dead-letters republish`` names the counters that refused it, so the counters
# that counted it the first time do not count it again.
APPLY_TO_HEADER = "countersink.apply-to"


def restricted(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    """Whether a record carries :data:`APPLY_TO_HEADER` (then the router decides it, not the fast path)."""
    return any(name == APPLY_TO_HEADER for name, _ in headers)


def apply_to(headers: Sequence[tuple[str, bytes | None]]) -> frozenset[str] | None:
    """The counters a record's :data:`APPLY_TO_HEADER` names, ``None`` when it has none (the last one counts,
    as for any header). Raises :class:`UnparseableEventError` for a value that is not UTF-8 text."""
    found: Any = None
    for name, value in headers:
        if name == APPLY_TO_HEADER:
            found = value or b""
    if found is None:
        return None
    try:
        text = bytes(found).decode("utf-8")
    except UnicodeDecodeError:
        raise UnparseableEventError(f"@header.{APPLY_TO_HEADER}", "header value is not UTF-8 text") from None
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def _addressed(plan: _TopicPlan, topic: str, headers: Sequence[tuple[str, bytes | None]]) -> frozenset[str] | None:
    """The counters a record's :data:`APPLY_TO_HEADER` names (``None`` without the header). Raises
    :class:`UnaddressedEventError` when none of them could be a counter (the header is empty, or holds no
    counter name): every counter would filter the record out, and it would be neither counted nor
    dead-lettered. A well-formed name this topic's counters do not have is another consumer group's counter
    (groups of disjoint counters may share a topic and a keyspace): filtered, as before."""
    only = apply_to(headers)
    if only is None or only & plan.names or any(NAME_PATTERN.fullmatch(name) for name in only):
        return only
    named = ", ".join(repr(name[:60]) for name in sorted(only)[:10]) or "nothing"
    raise UnaddressedEventError(
        f"@header.{APPLY_TO_HEADER}",
        f"names no counter (it names {named}; counter names match {NAME_PATTERN.pattern}, and topic {topic!r} "
        f"has {', '.join(sorted(plan.names)[:20])[:600]})")


class EventRouter:
    """Turns one event into the updates of every counter on its topic: each counter decides for itself."""

    def __init__(
        self,
        counter_set: CounterSet,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        on_late: Callable[[str], None] | None = None,
        max_future_skew_s: int = DEFAULT_MAX_FUTURE_SKEW_S,
        decoders: Mapping[str, Callable[[Parser], Parser]] | None = None,
        on_not_applicable: Callable[[str, str], None] | None = None,
    ) -> None:
        """``decoders``: per topic whose values are not JSON (``schemas.formats.decoders``), a factory of its
        decoder from the JSON parser its counters need; the decoder turns a record's value into the event."""
        self.counter_set = counter_set
        self.on_late = on_late
        self.on_not_applicable = on_not_applicable
        self.max_event_bytes = max_event_bytes
        self.max_depth = max_depth
        self.max_key_bytes = max_key_bytes
        self.max_future_skew_s = max_future_skew_s
        plans: dict[str, _TopicPlan] = {}
        for topic in counter_set.topics:
            counters = counter_set.for_topic(topic)
            decimals = any(c.number_mode == "decimal" for c in counters)
            parse = _parse_decimal if decimals else _parse_fast
            make_decoder = (decoders or {}).get(topic)
            plans[topic] = _TopicPlan(
                tuple(_counter_plan(c, max_key_bytes, max_future_skew_s) for c in counters),
                parse if make_decoder is None else make_decoder(parse),
                any(record_part(path) is not None for c in counters for path in _paths(c)),
                frozenset(c.name for c in counters),
            )
        self._plans = plans

    def decoder_of(self, topic: str) -> Parser | None:
        """The decoder of a topic whose values are not JSON (given as ``decoders``); None for a JSON topic."""
        plan = self._plans.get(topic)
        return None if plan is None or plan.parse in (_parse_fast, _parse_decimal) else plan.parse

    def reads_record(self, topic: str) -> bool:
        """Whether a counter on ``topic`` reads a part of the record beside its payload (``@key``, ...)."""
        plan = self._plans.get(topic)
        return plan is not None and plan.reads_record

    def parse(self, topic: str, raw: bytes) -> dict[str, Any]:
        """Parse and bound one event as the topic's counters need it (decimals kept exact if any need it)."""
        plan = self._plans.get(topic)
        return self._parse(raw, plan.parse if plan is not None else _parse_fast)

    def _parse(self, raw: bytes, parse: Parser) -> dict[str, Any]:
        if not raw:  # said as what it is, not as a parser's complaint about nothing to read
            raise UnparseableEventError("", "the record has no value (null: a tombstone, or empty)")
        if len(raw) > self.max_event_bytes:
            raise OversizedEventError("", f"event of {len(raw)} bytes exceeds {self.max_event_bytes}")
        try:
            event = parse(raw if type(raw) is bytes else bytes(raw))
        # JSON and UTF-8 decoding errors are ValueErrors; a number no hook could read an ArithmeticError
        except (ValueError, ArithmeticError) as exc:
            raise UnparseableEventError("", f"not a UTF-8 JSON document: {exc}") from exc
        except RecursionError:
            # Its message names where the parser's stack ran out, which the caller's depth moves: the router and
            # the batch path wrote two reasons for one record (a decimal topic's parser is recursive).
            raise UnparseableEventError("", f"event is nested deeper than {self.max_depth}") from None
        if type(event) is not dict:
            raise UnparseableEventError("", f"event is a JSON {_json_type(event)}, not an object")
        # Counting brackets (strings included) over-estimates depth, so only events that might be too
        # deep pay for the walk.
        if raw.count(b"{") + raw.count(b"[") > self.max_depth and nested_deeper_than(event, self.max_depth):
            raise UnparseableEventError("", f"event is nested deeper than {self.max_depth}")
        return event

    def decide(self, topic: str, raw: bytes, record: RecordFields | None = None) -> Decision:
        """What each counter on ``topic`` decides of one raw (JSON) event; see :meth:`decide_event`.

        Raises an :class:`InvalidEventError` (``counter`` None) when the event is invalid as a whole:
        unparseable, oversized or too deep. Then no counter applies it."""
        plan = self._plans.get(topic)
        if plan is None:
            return Decision([], [], [])
        return self._decide(plan, topic, self._parse(raw, plan.parse), record)

    def decide_record(self, topic: str, raw: bytes, timestamp_ms: int | None, key: bytes | None = None,
                      headers: Sequence[tuple[str, bytes | None]] = (), partition: int | None = None) -> Decision:
        """:meth:`decide` for a record given by its parts (the consumer's hot path: the parts are gathered
        only for a topic whose counters read them)."""
        plan = self._plans.get(topic)
        if plan is None:
            return Decision([], [], [])
        event = self._parse(raw, plan.parse)
        only = _addressed(plan, topic, headers) if headers else None
        if not plan.reads_record:
            return self._each_counter(plan, event, timestamp_ms, only)
        return self._with_record(plan, event, RecordFields(timestamp_ms, key, headers, partition), only)

    def decide_event(self, topic: str, event: dict[str, Any], record: RecordFields | None = None) -> Decision:
        """What each counter on ``topic`` decides of one event already decoded into a dict (JSON, or a
        decoded Avro, Protobuf or JSON Schema record), read beside ``record``'s key, time, headers and
        partition. Each counter, in the definitions file's order:

        - filtered out by its ``where``: no update;
        - lacks a key, value or bucket field (absent or null): not applicable, skipped for it
          (``not_applicable``, and ``on_not_applicable`` hears it), unless the counter is ``required``;
        - finds a field of the wrong type or out of range, a missing event id, or (``required``) a missing
          field: it refuses the event (``refusals``);
        - else its update (none for a bucket past its retention: ``on_late`` hears the counter's name).

        A record whose ``countersink.apply-to`` header names counters is decided by those counters only (the
        others filter it out). The decision depends on the record alone, never on a clock or on what came
        before: a replay, a rebuild and the fast path decide alike."""
        plan = self._plans.get(topic)
        if plan is None:
            return Decision([], [], [])
        return self._decide(plan, topic, event, record)

    def _decide(self, plan: _TopicPlan, topic: str, event: dict[str, Any], record: RecordFields | None
                ) -> Decision:
        if record is None:
            record = RecordFields()
        only = _addressed(plan, topic, record.headers) if record.headers else None
        if not plan.reads_record:
            return self._each_counter(plan, event, record.timestamp_ms, only)
        return self._with_record(plan, event, record, only)

    def _with_record(self, plan: _TopicPlan, event: dict[str, Any], record: RecordFields,
                     only: frozenset[str] | None) -> Decision:
        event[_RECORD] = _RecordView(record, self.max_depth)
        try:
            return self._each_counter(plan, event, record.timestamp_ms, only)
        finally:
            del event[_RECORD]

    def _each_counter(self, plan: _TopicPlan, event: dict[str, Any], timestamp_ms: int | None,
                      only: frozenset[str] | None) -> Decision:
        updates: list[Update] = []
        refusals: list[InvalidEventError] = []
        skipped: list[tuple[str, str]] = []
        for name, extract, needed, required in plan.counters:
            if only is not None and name not in only:
                continue
            try:
                update = extract(event, timestamp_ms)
            except InvalidEventError as exc:
                reason = None if required else _absent(event, needed)
                if reason is not None:
                    skipped.append((name, reason))
                    if self.on_not_applicable is not None:
                        self.on_not_applicable(name, reason)
                    continue
                # Kept for the dead letter without its traceback: the frames it holds (this one, with the
                # refusals list) would make a cycle that lives until the next collection, per refused record.
                refusals.append(exc.as_refusal_of(name))
                continue
            if update is None:
                continue
            if update is LATE:
                if self.on_late is not None:
                    self.on_late(name)
                continue
            updates.append(update)  # type: ignore[arg-type]
        return Decision(updates, refusals, skipped)

    def route(self, topic: str, raw: bytes, timestamp_ms: int | None = None) -> list[Update]:
        """The updates of the counters that accept one event (:meth:`decide`, for a record with this
        timestamp and no key, headers or partition); ``[]`` for a topic no counter reads.

        All or nothing, for callers that apply events without a dead-letter topic (benchmarks): raises the
        first refusal when any counter refuses the event, and then no update is returned."""
        decision = self.decide(topic, raw, RecordFields(timestamp_ms))
        if decision.refusals:
            raise decision.refusals[0]
        return decision.updates


def apply_updates(
    states: MutableMapping[tuple[str, str], State],
    updates: Iterable[Update],
    counter_set: CounterSet,
    touched: set[tuple[str, str]] | None = None,
) -> int:
    """Apply updates to in-memory states keyed by ``(counter, instance key)``, creating missing ones; the
    consumer's mutators apply every record this way.

    ``touched``, when given, collects the identities of every state changed (the mutator's dirty set).
    Returns the bytes of the states created (their size when new), for a memory estimate.
    """
    created_bytes = 0
    for counter, key, value, _ in updates:
        ident = (counter, key)
        state = states.get(ident)
        if state is None:
            state = states[ident] = new_state(counter_set[counter])
            created_bytes += state.size_bytes()
        state.apply(value)
        if touched is not None:
            touched.add(ident)
    return created_bytes
