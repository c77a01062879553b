"""The router's fast path: one topic's events decoded and checked in a shape built for batches.

:class:`EventRouter` is the reference: it parses a whole event into a dict and runs one extractor per counter,
which builds an :class:`~schemas.events.Update` per counter and event. :class:`FastRoute` reaches the same
updates with less work per event:

- one msgspec decoder per topic, reading exactly the fields the topic's counters use, nested ones
  (``user.id``) through nested structs (the rest of the event is skipped, not built into Python objects);
  with a counter keeping exact decimals, numbers with a fraction or an exponent are decoded as Decimals
  directly (exact values checked by the router's converter when one is long or has an exponent);
- counters that share key fields and time bucket share a *row* per key value and bucket, so the key is read,
  escaped and checked once per row and not once per event and counter (:class:`Row` holds the states of
  every counter of that key);
- a bucket's time is computed by :func:`~schemas.events.bucket_time` once per distinct value (an ISO-8601
  text parsed once, a bucket start formatted once), and checked against the record's timestamp (future
  skew, lateness of a retained counter) once per record and bucket; ``@timestamp`` may be the bucket's field;
- the value and event-id checks are the router's own converters, so a value is accepted, refused and
  converted exactly as the router does;
- each counter decides for itself: one the event lacks a key, value or bucket field of (missing or null) is
  skipped, and told to ``on_not_applicable`` as the router tells it; a retained counter whose bucket had
  expired when the record was written skips the event once it has checked it, and is told to ``on_late``;
- a decoded Avro, Protobuf or JSON Schema record is applied by ``apply_fields`` from the decoder's own objects
  (:meth:`fields_of`: floats and Decimals as the router reads them), so exact decimals take the batch path on
  those topics too (``schemas.formats.converter`` hands back the records the router refuses as a whole).

It decides a counter's refusal as the router does: a key part, a bucket time, a value or an event id present
but of the wrong type or out of range, or a key too long, raises the router's own error (its converters and
checks), in the router's order (key, bucket, value, event id); the counter refuses the event (its error, its
name set, kept for the dead letter in the definitions' order: ``apply_event`` returns ``(outcome, refused)``)
and the other counters decide for themselves. It never decides that an event is invalid as a whole, nor the
refusals whose order it cannot keep cheaply. Any event it does not accept as it is — not ASCII, a ``\\u``
escape, deeply bracketed, over the size limit, a long run of digits, an object where its decoder expects none
or none where it expects one, a missing field of a ``required`` counter, a literal its decoder refuses, an
event time too far ahead of its record, a bucket ending after the last storable expiry — makes the generated
``apply_event`` return ``None`` before it changes anything, and the caller routes that event through
:class:`EventRouter`, which gives the documented error. A differential property test holds the two paths to the
same states, dirty sets, outcomes, skips and errors (``tests/unit/test_fast_route.py``, mistyped fields among
them).

A topic gets no fast path (``FastRoute.build`` returns ``None``) when a counter on it reads a field msgspec
cannot name (a quote, a backslash or a control character in it), or one field both as a value and as an object
holding fields (``user`` and ``user.id``); its events all take the router. The record's own parts (``@key``,
``@timestamp``, ``@header.NAME``, ``@partition``) are read on the batch path as the router reads them, and so
are the fields of its key read as a JSON document (``@key.PATH``: a decoder of those fields alone; a key the
payload's checks would hand back leaves its record to the router, :func:`_key_document`). A record carrying
the ``countersink.apply-to`` header (a re-published dead letter) takes the router
(:meth:`~consumer.applying.Mutator.apply_batch` hands it over), which decides it for the counters it names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec

from schemas.definitions import CounterDefinition, CounterSet, payload_path, record_part
from schemas.errors import CountersRefusedError, InvalidEventError, KeyTooLongError, UnstorableTimeError
from schemas.events import (
    _MAX_EPOCH_SECONDS,
    _MISSING,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_FUTURE_SKEW_S,
    DEFAULT_MAX_KEY_BYTES,
    MAX_INTEGER,
    _check_decimal,
    _escape,
    _event_id_converter,
    _key_text,
    _value_converter,
    _where_check,
    bucket_time,
    exact_decimal,
    passes_of,
)
from schemas.kinds import State

_UNSET = msgspec.UNSET
# The router's parser refuses a number whose integer part has more than 4,300 digits ("number out of range"),
# anywhere in the event; msgspec skips a field no counter reads without looking at it. So an event holding
# a run of this many digits (in a number or a string: the test is on bytes) goes to the router, which decides
# it. Only events at least this long can hold one, so the others pay one comparison.
LONG_DIGITS = 4096
_DIGIT_RUN = b"0" * LONG_DIGITS
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
# The longest number text (with a fraction, no exponent) the batch path takes as passing the router's decimal
# checks: any Decimal made of one has at most this many digits and an exponent of at most this size, well inside
# the router's bounds (events.MAX_DECIMAL_DIGITS, MAX_DECIMAL_EXPONENT), so it needs only the zero's sign
# dropped. An event holding a longer number or one with an exponent, in a field the topic's counters read, has
# its exact counters' values checked by the router's converter (which keeps or refuses them as the router does).
SHORT_DECIMAL = 40


def _decimal_text(seen_long: list[bool]) -> Callable[[str], Decimal]:
    """msgspec's float_hook on a topic with exact decimals: the number's exact text as a Decimal, as the router's
    parser reads it; ``seen_long[0]`` set when it is not a short one (read and cleared after each decode)."""
    short = SHORT_DECIMAL

    def decimal_text(text: str) -> Decimal:
        if len(text) > short or "e" in text or "E" in text:
            seen_long[0] = True
        return exact_decimal(text)

    return decimal_text


# Field names msgspec cannot take (as a struct field's name): a topic reading one has no fast path.
_UNNAMEABLE = frozenset('\\"' + "".join(map(chr, range(32))))


class Row:
    """The states of every counter of one key group for one key value, created as events need them.

    ``idents[i]``, ``(names[i], key)``, is the identity of the group's counter ``i`` (``names`` is the group's,
    shared by its rows), made once with the row: the mutator's states and dirty set hold these tuples, not new
    ones per batch; ``states[i]`` its state once an event has been applied to it (``None`` before);
    ``touched`` a bit per counter changed in the batch being applied."""

    __slots__ = ("idents", "key", "names", "states", "touched")

    def __init__(self, key: str, names: tuple[str, ...],
                 idents: tuple[tuple[str, str], ...] | None = None) -> None:
        self.key = key
        self.names = names
        # the generated row makers pass them written out (a tuple display, no comprehension per row)
        self.idents = tuple([(name, key) for name in names]) if idents is None else idents
        self.states: list[State | None] = [None] * len(names)
        self.touched = 0


def _field_parts(path: str) -> tuple[str, ...] | None:
    """The names along a payload path (``user.id``: ``user``, ``id``; ``@@x``: ``@x``), or ``None`` for a path
    of the record (``@key``, ``@header.NAME``, ...) or one holding a name msgspec cannot take."""
    if record_part(path) is not None:
        return None
    return _nameable(tuple(payload_path(path).split(".")))


def _nameable(parts: tuple[str, ...]) -> tuple[str, ...] | None:
    if any(not part or not _UNNAMEABLE.isdisjoint(part) for part in parts):
        return None
    return parts


def _key_doc_parts(path: str) -> tuple[str, ...] | None:
    """The names along ``@key.PATH`` (a field of the record's key read as a JSON document), or ``None`` for any
    other path or one holding a name msgspec cannot take."""
    found = record_part(path)
    if found is None or found[0] != "key" or not found[1]:
        return None
    return _nameable(tuple(found[1].split(".")))


def _key_document(decode: Callable[[bytes], Any], max_bytes: int, max_depth: int, long_digits: int,
                  key: bytes) -> Any:
    """The record's key read as a JSON document, for ``@key.PATH``: the fields counters read, as a struct. The
    router's reading (``schemas.events``: its JSON parser, no exact decimals, the depth bound) is kept by handing
    back (a ValueError, so the router decides the record) every key the payload's checks would hand back: not
    ASCII, a ``\\u`` escape, deeply bracketed, long, a long run of digits, or not an object msgspec reads."""
    raw = bytes(key)
    if (len(raw) > max_bytes or not raw.isascii() or (92 in raw and b"\\u" in raw)
            or raw.count(123) + raw.count(91) > max_depth
            or (len(raw) >= long_digits and b"0" * long_digits in raw.translate(_DIGITS_AS_ZERO))):
        raise ValueError("left to the router")
    return decode(raw)  # msgspec.DecodeError is a ValueError


def _exact(definition: CounterDefinition) -> bool:
    """Whether a counter's values are converted to Decimals (a numeric kind keeping exact decimals)."""
    return definition.kind not in ("distinct", "top_k", "quantiles") and definition.spec.number == "decimal"


def _float_passes(definition: CounterDefinition, local: str) -> str | None:
    """For a counter whose values the router converts to floats (quantiles, or a numeric kind in float mode),
    the test a value passes unchanged: a finite float other than zero (whose sign the router drops), or in
    float mode an integer within the bounds (kept an integer)."""
    finite = f"(type({local}) is float and {local} - {local} == 0.0 and {local})"
    if definition.kind == "quantiles":
        return finite
    if definition.kind in ("distinct", "top_k") or definition.spec.number != "float":
        return None
    return f"{finite} or (type({local}) is int and -{MAX_INTEGER} < {local} < {MAX_INTEGER})"


def _eligible(definition: CounterDefinition) -> bool:
    paths = [*definition.key, *definition.where]
    if definition.value is not None:
        paths.append(definition.value)
    if definition.event_id is not None:
        paths.append(definition.event_id)
    if definition.bucket is not None:
        paths.append(definition.bucket.field)
    return all(_field_parts(path) is not None or _record_local(path) is not None or _key_doc_parts(path) is not None
               for path in paths)


TIMESTAMP = "@timestamp"


def _record_local(path: str) -> tuple[str, str] | None:
    """For a path of the record the batch path reads (``@timestamp``, ``@key``, ``@partition``,
    ``@header.NAME``): the local holding it in ``apply_event`` and the line setting it, as the router reads it
    (absent: ``UNSET``; a key or header that is not UTF-8 raises, and the router decides the event). ``None``
    for a payload path and for ``@key.PATH`` (a field of the key read as JSON: the router's)."""
    found = record_part(path)
    if found is None:
        return None
    part, rest = found
    if part == "timestamp":
        return "TS", "TS = ts if ts is not None and ts >= 0 else UNSET"
    if part == "partition":
        return "PARTITION", ""
    if part == "header":
        # Named by the name's bytes in hex: one local per header name, an identifier whatever the name holds.
        local = "H_" + rest.encode().hex()
        return local, f"{local} = header(headers, {rest!r})"
    if not rest:
        return "KEY", "KEY = None if key is None else text_of(key)"
    return None


def _header(headers: Any, name: str) -> Any:
    """The router's ``@header.NAME``: the last header of that name as text, ``UNSET`` when there is none."""
    found: Any = _UNSET
    for header, value in headers:
        if header == name:
            found = value
    if found is _UNSET or found is None:
        return found
    return _text_of(found)


def _text_of(value: bytes) -> str:
    """A record's key or header as the router reads it, if ASCII (every string the batch path holds is: its
    lengths are its bytes). Else a ValueError, and the router decides the event (UnicodeDecodeError is one)."""
    text = bytes(value).decode("utf-8")
    if not text.isascii():
        raise ValueError("not ASCII: the router's")
    return text


def _last_bucket(last: list[Any], size: int, scale: int, v: Any, found: tuple[Any, int, str]) -> tuple[Any, int, str]:
    """Keep the bucket an integer time ``v`` fell in (``found``: its seconds, start and text) as ``last``: the
    integers from its start to its end (to the last time :func:`~schemas.events.bucket_time` takes, if
    sooner), in the field's unit, fall in it too."""
    if type(v) is int:
        start = found[1]
        last[:] = [start * scale, min(start + size, _MAX_EPOCH_SECONDS) * scale, start, found[2]]
    return found


def _decimal_passes(d: Decimal) -> bool:
    """Whether the router's checks of a Decimal value pass it (then it is kept, the zero's sign dropped)."""
    try:
        _check_decimal("", d)
    except InvalidEventError:
        return False
    return True


def _key_parts(pairs: tuple[tuple[str, Any], ...]) -> None:
    """Raise the router's refusal of the first key part (path, value) it refuses, if any."""
    for path, v in pairs:
        _key_text(path, v)


def _unset_as_missing(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The router's converter of a field for a value read by the batch path: an absent field (msgspec's
    ``UNSET``) is the router's missing one (``MissingFieldError``, not a wrongly typed value)."""

    def converted(v: Any) -> Any:
        return convert(_MISSING if v is _UNSET else v)

    return converted


def _itself(v: Any) -> Any:
    return v


def _absent(role: str, values: tuple[Any, ...]) -> str:
    """Why a counter does not apply to an event: the first of ``values`` (its ``role`` fields, in order) that
    is missing or null, named as the router names it (``key_missing``, ``bucket_null``, ...)."""
    for v in values:
        if v is _UNSET:
            return f"{role}_missing"
        if v is None:
            return f"{role}_null"
    raise AssertionError("no field is absent")


Skipped = list[tuple[int, str, "str | None"]]  # (the counter's place in the definitions, its name, why; None: late)


def _skip(skipped: Skipped | None, entry: tuple[int, str, str | None]) -> Skipped:
    if skipped is None:
        return [entry]
    skipped.append(entry)
    return skipped


Refused = list[tuple[int, InvalidEventError]]  # (the counter's place in the definitions, its refusal)


def _refuse(refused: Refused | None, place: int, counter: str, error: InvalidEventError) -> Refused:
    """Keep a counter's refusal of the event being read, as the router keeps it: its counter named, without
    its traceback (whose frames would make a cycle per refused record)."""
    entry = (place, error.as_refusal_of(counter))
    if refused is None:
        return [entry]
    refused.append(entry)
    return refused


def refusals(refused: Refused) -> CountersRefusedError:
    """The dead letter's error of an event some counters refused (``apply_event``'s second item): each
    counter's own error, in the definitions' order, as :meth:`~consumer.applying.Applier.classify` gives it."""
    return CountersRefusedError(tuple(error for _, error in sorted(refused, key=_place)))


def _place(entry: tuple[int, InvalidEventError]) -> int:
    return entry[0]


def _report(on_not_applicable: Callable[[str, str], None] | None, on_late: Callable[[str], None] | None,
            skipped: Skipped) -> None:
    """Tell the counters an event taken did not apply to (``on_not_applicable``) or was late for (``on_late``),
    in the definitions' order (the router's)."""
    for _, counter, reason in sorted(skipped):
        if reason is None:
            if on_late is not None:
                on_late(counter)
        elif on_not_applicable is not None:
            on_not_applicable(counter, reason)


class _Conflict(Exception):
    """A path that is both a field and an object holding fields (``user`` and ``user.id``) on one topic."""


class _Fields:
    """The payload fields a topic's counters read, as nested msgspec structs: one attribute per name at each
    level (an object at ``user`` holding ``id`` is a struct of its own, present empty when the event lacks
    it), so that reading ``user.id`` is two attribute loads, and a ``user`` that is not an object (a string,
    null) fails the decode: the router decides that event."""

    def __init__(self) -> None:
        self.tree: dict[str, list[Any]] = {}  # name -> [attribute, children (None for a field read)]
        self.count = 0

    def attr(self, path: str, parts: tuple[str, ...] | None = None) -> str:
        """``f0.f3``: the attributes reaching ``path`` (the names ``parts``, when given) from the decoded
        event."""
        if parts is None:
            parts = _field_parts(path)
        assert parts is not None
        node, attrs = self.tree, []
        for i, part in enumerate(parts):
            leaf = i == len(parts) - 1
            entry = node.get(part)
            if entry is None:
                entry = node[part] = [f"f{self.count}", None if leaf else {}]
                self.count += 1
            elif (entry[1] is None) != leaf:
                raise _Conflict(path)
            attrs.append(entry[0])
            node = entry[1]
        return ".".join(attrs)

    def struct(self, tree: dict[str, list[Any]] | None = None, name: str = "TopicFields") -> type:
        fields: list[tuple[str, Any, Any]] = []
        for part, (attr, children) in (self.tree if tree is None else tree).items():
            if children is None:
                fields.append((attr, Any, msgspec.field(default=_UNSET, name=part)))
            else:
                inner = self.struct(children, f"{name}_{attr}")
                fields.append((attr, inner, msgspec.field(default_factory=inner, name=part)))
        return msgspec.defstruct(name, fields)


# What apply_event says of an event it took: applied to a state at least once, wanted by a counter but
# dropped as a publisher retry by all, or wanted by none (filtered out).
APPLIED, DUPLICATE, FILTERED = 1, 2, 0
# apply_event(raw, ts, key, headers, rows, fresh, touched, create): one of the above, or (one of the above,
# refused) for an event some counters refused (a key part or a value of the wrong type or out of range: the
# others decided for themselves; ``refusals(refused)`` is its dead letter's error), or None for an event it
# leaves to the router (nothing changed). ``ts``, ``key``, ``headers``: the record's Kafka timestamp (ms, or
# None), key and headers; ``fresh(counter, event_id)``
# is the retry window's; ``touched`` collects the rows changed; ``create(row, index)`` makes (or finds) the
# state of a row's counter.
ApplyEvent = Callable[[bytes, "int | None", "bytes | None", Any, list[dict[Any, "Row"]], Callable[[str, str], bool],
                       list["Row"], Callable[["Row", int], State]], "int | tuple[int, Refused] | None"]
# apply_fields(event, ts, key, headers, rows, fresh, touched, create): apply_event for fields already read
# (``FastRoute.fields_of``: a decoded Avro, Protobuf or JSON Schema record).
ApplyFields = Callable[[Any, "int | None", "bytes | None", Any, list[dict[Any, "Row"]], Callable[[str, str], bool],
                        list["Row"], Callable[["Row", int], State]], "int | tuple[int, Refused] | None"]


def _converted(local: str, converter: str, namespace: dict[str, Any], indent: str) -> list[str]:
    """Lines converting ``local`` in place with the router's converter ``converter`` (in ``namespace``),
    calling it only for a value it would not return unchanged (:class:`~schemas.events.Passes`): a call per
    field and event costs more than the test. Every string here is ASCII (``apply_event`` takes no other
    event), as ``Passes`` requires."""
    passes = passes_of(namespace[converter])
    if passes is None:
        return [f"{indent}{local} = {converter}({local})"]
    kind = passes.kind.__name__
    if passes.limit is None:
        accepted = f"type({local}) is {kind}"
    elif passes.kind is int:
        accepted = f"type({local}) is int and -{passes.limit} < {local} < {passes.limit}"
    else:
        accepted = f"type({local}) is {kind} and len({local}) <= {passes.limit}"
    return [f"{indent}if not ({accepted}):", f"{indent}    {local} = {converter}({local})"]


class FastRoute:
    """The fast path of one topic: ``apply_event`` is a function generated for the topic's counters.

    The generated source (kept in ``source``, for a reader or a debugger) is the router's extractors and the
    mutator's apply written out for this topic, in two steps. First it reads and checks, per key group, the
    row of the event's key value (and bucket) and, per counter, its filter, whether the event has its key,
    value and bucket fields (if not, the counter skips it), its value through the router's converter and its
    event id; anything refused ends it there, with nothing changed. Then the skips are told and, per counter
    that wants the event, the retry window's decision on its id (once per window group) and the apply to its
    state, with the row marked touched. The row caches (:meth:`new_rows`) belong to whoever applies (a
    mutator)."""

    def __init__(self, counters: list[CounterDefinition], max_event_bytes: int, max_depth: int,
                 max_key_bytes: int, max_future_skew_s: int = DEFAULT_MAX_FUTURE_SKEW_S,
                 on_not_applicable: Callable[[str, str], None] | None = None, partition: int | None = None,
                 on_late: Callable[[str], None] | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self.max_depth = max_depth
        self.max_key_bytes = max_key_bytes
        # A counter keeps exact decimals: every number with a fraction or an exponent is read as a Decimal, for
        # every counter of the topic, as the router's parser reads them then.
        self.decimals = any(definition.number_mode == "decimal" for definition in counters)
        fields = _Fields()
        namespace: dict[str, Any] = {
            "UNSET": _UNSET, "DECODE_ERRORS": (msgspec.DecodeError, msgspec.ValidationError),
            # TypeError: an array or object as a key value, which no dict of rows can hold. Any other error while
            # reading and checking (nothing is changed yet) is the router's to decide, and to dead-letter as a
            # defect (consumer.applying._undecidable) rather than stop the partition.
            "REFUSED": Exception,
            "new_row": self._new_row, "MAX_EVENT_BYTES": max_event_bytes, "MAX_DEPTH": max_depth,
            "LONG_DIGITS": LONG_DIGITS, "DIGIT_RUN": _DIGIT_RUN, "DIGITS_AS_ZERO": _DIGITS_AS_ZERO,
            "MAX_FUTURE_MS": max_future_skew_s * 1000, "absent": _absent, "skip": _skip, "refuse": _refuse,
            "InvalidEventError": InvalidEventError, "UnstorableTimeError": UnstorableTimeError, "key_parts": _key_parts,
            "report": functools.partial(_report, on_not_applicable, on_late), "header": _header,
            "text_of": _text_of,
            "PARTITION": _UNSET if partition is None else partition,
        }

        record_lines: dict[str, str] = {}  # local -> its line, for the parts of the record counters read

        key_fields = _Fields()  # the fields of the record's key read as a JSON document (``@key.PATH``)

        def attr(path: str) -> str:
            """The expression reading ``path`` in ``apply_event``."""
            inside_key = _key_doc_parts(path)
            if inside_key is not None:
                record_lines["KDOC"] = "KDOC = KEY_NONE if key is None else key_document(key)"
                return "KDOC." + key_fields.attr(path, inside_key)
            record = _record_local(path)
            if record is None:
                return "event." + fields.attr(path)
            if record[1]:
                record_lines[record[0]] = record[1]
            return record[0]

        # Counters share a row when they share key fields and time bucket (its field, size, format and
        # retention: the bucket's checks are the row's).
        groups: dict[tuple[Any, ...], list[CounterDefinition]] = {}
        for definition in counters:
            bucket = definition.bucket
            when = None if bucket is None else (bucket.field, bucket.seconds, bucket.format, definition.retain_seconds)
            groups.setdefault((definition.key, when), []).append(definition)
        # per group: its key paths, counters, whether bucketed, and the paths a key too long is refused for
        self._groups = tuple((paths, tuple(d.name for d in members), when is not None,
                              ",".join(paths) or (when[0] if when is not None else ""))
                             for (paths, when), members in groups.items())

        lines = [
            "def apply_event(raw, ts, key, headers, rows, fresh, touched, create):",
            "    # Bytes are searched for an int (one memchr) before a bytes needle (a substring search, costing as",
            "    # much as the decode): most events hold no backslash and no array.",
            "    if (len(raw) > MAX_EVENT_BYTES or not raw.isascii() or (92 in raw and b'\\\\u' in raw)",
            "            or (raw.count(123) + raw.count(91) if 91 in raw else raw.count(123)) > MAX_DEPTH",
            "            or (len(raw) >= LONG_DIGITS and DIGIT_RUN in raw.translate(DIGITS_AS_ZERO))):",
            "        return None",
            "    try:",
            "        event = decode(raw)",
            "    except DECODE_ERRORS:",
            "        return None",
        ]
        if self.decimals:
            # a number not short (SHORT_DECIMAL) in the event: exact values are checked by the router's converter
            lines += ["    long_decimal = SEEN_LONG[0]", "    if long_decimal:", "        SEEN_LONG[0] = False"]
        lines += [
            "    # 1. read and check every counter's key, filter, value and event id: nothing is changed yet. A",
            "    # counter the event lacks a key, value or bucket field of skips it (skipped, told once it is taken).",
            "    try:",
            "        skipped = None",
            "        refused = None",
            "        # RECORD",
        ]
        id_locals: dict[str, str] = {}  # event-id path -> the local holding its text, read once per record
        for definition in counters:
            if definition.event_id is not None and definition.event_id not in id_locals:
                id_locals[definition.event_id] = f"id{len(id_locals)}"
                lines.append(f"        id{len(id_locals) - 1} = None")
        fresh_locals: dict[str, str] = {}  # window group -> the local holding its decision for the record
        applying: list[str] = []
        order = {definition.name: n for n, definition in enumerate(counters)}
        buckets: dict[tuple[Any, ...], int] = {}
        for g, ((paths, when), members) in enumerate(groups.items()):
            # (Paths are the user's text, a header's name any: ascii() keeps each on the comment's line.)
            lines.append(f"        # key group {g}: {ascii(', '.join(paths)) if paths else '(no key)'}"
                         + ("" if when is None else f", bucket {when[1]} s of {when[0]!a}"))
            lines.append(f"        row{g} = None")
            keys = [f"kv{g}_{i}" for i in range(len(paths))]
            lines += [f"        {local} = {attr(path)}" for local, path in zip(keys, paths, strict=True)]
            lines.append(f"        kr{g} = None")
            if keys:
                absent = " or ".join(f"{k} is UNSET or {k} is None" for k in keys)
                lines += [f"        if {absent}:", f"            kr{g} = absent('key', ({', '.join(keys)},))"]
            values = "".join(f"{k}, " for k in keys)
            # Groups of one bucket (field, size, format, retention) share its reading and its time, computed
            # once per record by the first counter that wants the event.
            b = buckets.setdefault(when, len(buckets)) if when is not None else -1
            if when is not None:
                values += f"bt{b}[2], "
            cache_key = values[:-2] if values.count(",") == 1 else f"({values})"
            # Rows are kept by strings and integers alone: a boolean or a float equal to a kept integer (True
            # and 1, 1.0 and 1) would find that integer's row.
            exact = " and ".join(f"(type({k}) is str or type({k}) is int)" for k in keys)
            lookup = f"rows[{g}].get({cache_key})" + (f" if {exact} else None" if exact else "")
            bucket_lines: list[str] = []
            key_pairs = "".join(f"({path!r}, {local}), " for path, local in zip(paths, keys, strict=True))

            def refused_bucket(line: str, indent: str, key_pairs: str = key_pairs) -> list[str]:
                """``line``, computing a bucket's time: a time the router refuses is the counter's refusal
                (after a key part it refuses: the router reads the key first), but a bucket ending too late
                is left to the router, which checks the event's time against its record's first."""
                return [f"{indent}try:", f"{indent}    {line}",
                        f"{indent}except UnstorableTimeError:", f"{indent}    return None",
                        f"{indent}except InvalidEventError:", f"{indent}    key_parts(({key_pairs}))",
                        f"{indent}    raise"]
            if when is not None:
                first = members[0]
                assert first.bucket is not None
                if f"bucket_time{b}" not in namespace:
                    namespace[f"bucket_time{b}"] = bucket_time(first)
                    lines += [f"        bv{b} = {attr(when[0])}",
                              f"        br{b} = None",
                              f"        if bv{b} is UNSET or bv{b} is None:",
                              f"            br{b} = absent('bucket', (bv{b},))",
                              f"        bt{b} = None",
                              f"        late{b} = False"]
                bucket_lines = [f"if bt{b} is None:"]
                if first.bucket.format != "iso8601":
                    # An integer time inside the last bucket an integer time fell in (LAST: its first and
                    # past-the-end values, start and text) is in that bucket: no call.
                    scale = 1000 if first.bucket.format == "epoch_millis" else 1
                    namespace[f"LAST{b}"] = [1, 0, 0, ""]
                    namespace[f"last_bucket{b}"] = functools.partial(
                        _last_bucket, namespace[f"LAST{b}"], first.bucket.seconds, scale)
                    seconds = f"bv{b} // {scale}" if scale > 1 else f"bv{b}"
                    bucket_lines += [
                        f"    last = LAST{b}",
                        f"    if type(bv{b}) is int and last[0] <= bv{b} < last[1]:",
                        f"        bt{b} = ({seconds}, last[2], last[3])",
                        "    else:",
                        *refused_bucket(f"bt{b} = last_bucket{b}(bv{b}, bucket_time{b}(bv{b}))", "        "),
                    ]
                else:
                    # seconds, bucket start, bucket text
                    bucket_lines += refused_bucket(f"bt{b} = bucket_time{b}(bv{b})", "    ")
                # An integer of milliseconds is compared whole, as the router does (not its floored seconds).
                event_ms = (f"(bv{b} if type(bv{b}) is int else bt{b}[0] * 1000)"
                            if first.bucket.format == "epoch_millis" else f"bt{b}[0] * 1000")
                bucket_lines += [
                    "    # the record's checks: an event time too far ahead of it; a bucket past its retention (late)",
                    f"    if ts is not None and ts >= 0 and {event_ms} > ts + MAX_FUTURE_MS:",
                    "        return None",
                ]
                if first.retain_seconds is not None:
                    # late: the group's counters check the event as the router does, then skip it (on_late)
                    namespace[f"KEPT_MS{b}"] = (first.bucket.seconds + first.retain_seconds) * 1000
                    bucket_lines += [f"    if ts is not None and ts >= bt{b}[1] * 1000 + KEPT_MS{b}:",
                                     f"        late{b} = True"]
            for index, definition in enumerate(members):
                c = f"{g}_{index}"
                lines += [f"        # counter {definition.name} ({definition.kind})", f"        want_{c} = False"]
                indent = "        "
                if definition.where:
                    checks = []
                    for n, (path, allowed) in enumerate(definition.where.items()):
                        namespace[f"where_{c}_{n}"] = _where_check(_itself, allowed)
                        checks.append(f"where_{c}_{n}({attr(path)})")
                    lines.append(f"{indent}if {' and '.join(checks)}:")
                    indent += "    "
                # Not applicable: the first of its key, value and bucket fields (in that order) it lacks.
                lines.append(f"{indent}reason = kr{g}")
                if definition.value is not None:
                    lines += [f"{indent}value_{c} = {attr(definition.value)}",
                              f"{indent}if reason is None and (value_{c} is UNSET or value_{c} is None):",
                              f"{indent}    reason = 'value_missing' if value_{c} is UNSET else 'value_null'"]
                if when is not None:
                    lines += [f"{indent}if reason is None:", f"{indent}    reason = br{b}"]
                lines.append(f"{indent}if reason is not None:")
                if definition.required:
                    lines.append(f"{indent}    return None  # required: the router refuses it")
                else:
                    lines.append(f"{indent}    skipped = skip(skipped, ({order[definition.name]}, "
                                 f"{definition.name!r}, reason))")
                lines.append(f"{indent}else:")
                indent += "    "
                retained = when is not None and when[3] is not None
                row_lines = [f"row{g} = ({lookup}) or new_row{g}(rows[{g}], ({values}))"]
                if retained:
                    # a late bucket's key is checked as the router checks it, and no row is kept for it
                    row_lines = [f"if late{b}:", f"    row{g} = new_row{g}({{}}, ({values}))",
                                 "else:", *(f"    {line}" for line in row_lines)]
                # In a try, the bucket, the row (a key part the router refuses raises), the value and the event
                # id: the counter's own refusals, in the router's order (key, bucket, value, id), decided here
                # (refused: each with its counter's place in the definitions), the other counters deciding for
                # themselves.
                lines += [f"{indent}want_{c} = True",
                          f"{indent}try:",
                          f"{indent}    if row{g} is None:",
                          *(f"{indent}        {line}" for line in bucket_lines),
                          *(f"{indent}        {line}" for line in row_lines),
                          f"{indent}        if row{g} is None:",
                          f"{indent}            return None"]
                inner = indent + "    "
                value = "None"
                if definition.value is not None:
                    namespace[f"convert_{c}"] = _value_converter(definition, max_key_bytes)
                    quick = _float_passes(definition, f"value_{c}")
                    if quick is not None:
                        lines += [f"{inner}if not ({quick}):",
                                  f"{inner}    value_{c} = convert_{c}(value_{c})"]
                    elif _exact(definition):
                        # a short Decimal (SHORT_DECIMAL) passes the router's checks; its zero's sign is dropped
                        lines += [f"{inner}if type(value_{c}) is Decimal and not long_decimal:",
                                  f"{inner}    if not value_{c}:",
                                  f"{inner}        value_{c} = value_{c}.copy_abs()",
                                  f"{inner}else:",
                                  *_converted(f"value_{c}", f"convert_{c}", namespace, inner + "    ")]
                    else:
                        lines += _converted(f"value_{c}", f"convert_{c}", namespace, inner)
                    value = f"value_{c}"
                event_id = None
                if definition.event_id is not None:
                    # the router's own rule, after the value: a refused id is the counter's refusal. Read into
                    # a local of its own, so that the next counter sharing the id reads and refuses it too.
                    event_id = id_locals[definition.event_id]
                    check = f"check_{event_id}"
                    namespace[check] = _event_id_converter(definition.event_id, max_key_bytes)
                    converted = _converted("idv", check, namespace, inner + "    ")
                    namespace[check] = _unset_as_missing(namespace[check])
                    lines += [f"{inner}if {event_id} is None:",
                              f"{inner}    idv = {attr(definition.event_id)}",
                              *converted,
                              f"{inner}    {event_id} = idv"]
                elif definition.value is None:
                    lines.append(f"{inner}pass")
                lines += [f"{indent}except InvalidEventError as exc:",
                          f"{indent}    want_{c} = False",
                          f"{indent}    refused = refuse(refused, {order[definition.name]}, {definition.name!r}, exc)"]
                if retained:
                    # after its checks, as the router's extractor: a late event that is also invalid is refused
                    late_entry = f"({order[definition.name]}, {definition.name!r}, None)"
                    lines += [f"{indent}else:",
                              f"{inner}if late{b}:", f"{inner}    want_{c} = False",
                              f"{inner}    skipped = skip(skipped, {late_entry})"]
                applying += self._apply_lines(definition, g, index, value, event_id, fresh_locals)
        # Each changed row is marked once per event, not once per counter; in a finally, so a state changed
        # before an apply that raised is marked all the same, as the router's path marks it.
        marking = ["    finally:"]
        for g in range(len(groups)):
            marking += [f"        if bits{g}:",
                        f"            if not row{g}.touched:",
                        f"                touched.append(row{g})",
                        f"            row{g}.touched |= bits{g}"]
        changed = " or ".join(f"bits{g}" for g in range(len(groups)))
        lines += ["    except REFUSED:", "        return None",
                  "    if skipped is not None:",
                  "        report(skipped)",
                  "    # 2. the publisher-retry window, then the states; bits{g}: the counters of row{g} changed",
                  *(f"    bits{g} = 0" for g in range(len(groups))), "    wanted = False",
                  *(f"    {local} = None" for local in fresh_locals.values()),
                  "    try:", *("    " + line for line in applying), *marking,
                  f"    outcome = APPLIED if {changed} else (DUPLICATE if wanted else FILTERED)",
                  "    if refused is not None:",
                  "        return outcome, refused  # some counters refused it: their errors, for its dead letter",
                  "    return outcome"]
        at = lines.index("        # RECORD")
        lines[at:at + 1] = [f"        {line}" for line in record_lines.values()]
        # apply_fields: the same, from the fields already read (fields_of: a decoded Avro or Protobuf record)
        body = lines[lines.index("    # 1. read and check every counter's key, filter, value and event id: nothing is "
                                 "changed yet. A"):]
        # (a decoded record's Decimals all pass the router's checks: fields_of hands back the others)
        lines += ["", "", "def apply_fields(event, ts, key, headers, rows, fresh, touched, create):",
                  *(["    long_decimal = False"] if self.decimals else []), *body]
        lines += ["", "", *self._fields_of_lines(fields)]
        for g, (paths, names, bucketed, _) in enumerate(self._groups):
            lines += ["", "", *self._row_maker_lines(g, len(paths), names, bucketed)]
        namespace.update(Row=Row, escape=_escape, MAX_KEY_BYTES=max_key_bytes)
        self.source = "\n".join(lines) + "\n"
        topic_struct = fields.struct()
        # The top-level payload fields counters read: all a decoded record need be read for (fields_of).
        self.top_names = frozenset(fields.tree)
        # float_hook: the exact text of every number with a fraction or an exponent, as the router's parser
        # hands it to Decimal when a counter of the topic keeps decimals.
        namespace["SEEN_LONG"] = seen_long = [False]
        namespace["decode"] = msgspec.json.Decoder(
            topic_struct, float_hook=_decimal_text(seen_long) if self.decimals else None).decode
        namespace.update(TopicFields=topic_struct, convert=msgspec.convert, decimal_passes=_decimal_passes,
                         CONVERT_ERRORS=(msgspec.ValidationError, TypeError, ValueError))
        namespace["Decimal"] = Decimal
        if key_fields.tree:
            # The key's document is read as the router reads it: its JSON parser, never exact decimals.
            key_struct = key_fields.struct(name="KeyFields")
            namespace["KEY_NONE"] = key_struct()  # no key: every field of it absent
            namespace["key_document"] = functools.partial(
                _key_document, msgspec.json.Decoder(key_struct).decode, max_event_bytes, max_depth, LONG_DIGITS)
        namespace.update(APPLIED=APPLIED, DUPLICATE=DUPLICATE, FILTERED=FILTERED)
        exec(compile(self.source, f"<fast route of {counters[0].name}>", "exec"), namespace)  # noqa: S102
        self.apply_event: ApplyEvent = namespace["apply_event"]
        self.apply_fields: ApplyFields = namespace["apply_fields"]
        self.fields_of: Callable[[dict[str, Any]], Any] = namespace["fields_of"]
        # per key group, its row maker (the generated ``new_row{g}``), for a reader or a test
        self.row_makers: tuple[Callable[[dict[Any, Row], tuple[Any, ...]], Row | None], ...] = tuple(
            namespace[f"new_row{g}"] for g in range(len(self._groups)))

    @staticmethod
    def _fields_of_lines(fields: _Fields) -> list[str]:
        """``fields_of(decoded)``: a decoded record (a dict, as the router reads it) as the struct ``apply_fields``
        reads, its values the router's own objects, or None for a record left to the router: a field read
        that is not where the struct has it (an object expected), a string that is not ASCII (every string
        ``apply_event`` holds is: its lengths are its bytes), or a Decimal the router's checks refuse (the
        exact counters' lines take a Decimal as passing them)."""
        lines = ["def fields_of(decoded):", "    try:", "        event = convert(decoded, TopicFields)",
                 "    except CONVERT_ERRORS:", "        return None"]

        def leaves(tree: dict[str, list[Any]], prefix: str) -> list[str]:
            found: list[str] = []
            for attr, children in tree.values():
                found += [prefix + attr] if children is None else leaves(children, f"{prefix}{attr}.")
            return found

        for leaf in leaves(fields.tree, "event."):
            lines += [f"    v = {leaf}", "    if type(v) is str:", "        if not v.isascii():",
                      "            return None", "    elif type(v) is Decimal and not decimal_passes(v):",
                      "        return None"]
        lines.append("    return event")
        return lines

    @staticmethod
    def _row_maker_lines(group: int, paths: int, names: tuple[str, ...], bucketed: bool) -> list[str]:
        """``new_row{group}(rows, values)``: :meth:`_new_row` for the group, written out for its common case,
        every key value a string or an integer and the key short enough (a new instance each hour of a
        bucketed counter makes one: the time a bucket adds). Anything else it hands to :meth:`_new_row`."""
        keys = [f"v{i}" for i in range(paths)]
        unpacked = keys + (["bucket"] if bucketed else [])
        lines = [f"def new_row{group}(rows, values):"]
        if unpacked:
            lines.append(f"    {', '.join(unpacked)}, = values")
        for k in keys:
            lines += [f"    if type({k}) is str:",
                      f"        if '|' in {k} or '\\\\' in {k}:",
                      f"            {k} = escape({k})",
                      f"    elif type({k}) is int:",
                      f"        {k} = str({k})",
                      "    else:",
                      f"        return new_row({group}, rows, values)"]
        lines.append(f"    key = {'f' + repr('|'.join('{' + k + '}' for k in unpacked)) if unpacked else repr('')}")
        lines += ["    if len(key) > MAX_KEY_BYTES:",
                  f"        return new_row({group}, rows, values)  # its error, as the router's"]
        idents = "".join(f"({name!r}, key), " for name in names)
        lines.append(f"    row = Row(key, {names!r}, ({idents}))")
        lines += [f"    rows[{'values[0]' if len(unpacked) == 1 else 'values'}] = row", "    return row"]
        return lines

    def _apply_lines(self, definition: CounterDefinition, group: int, index: int, value: str,
                     event_id: str | None, fresh_locals: dict[str, str]) -> list[str]:
        """Step 2 for one counter that wants the event: the window's decision on its event id (one look-up per
        window group and record: counters sharing an id field and a filter share the decision), then its
        state."""
        c, row, indent = f"{group}_{index}", f"row{group}", "        "
        lines = [f"    # counter {definition.name}", f"    if want_{c}:", "        wanted = True"]
        if event_id is not None:
            share = f"{definition.event_id}|{sorted(definition.where.items())!r}"
            fresh = fresh_locals.get(share)
            if fresh is None:
                fresh = fresh_locals[share] = f"fresh{len(fresh_locals)}"
            lines += [f"{indent}if {fresh} is None:",
                      f"{indent}    {fresh} = fresh({definition.name!r}, {event_id})",
                      f"{indent}if {fresh}:"]
            indent += "    "
        lines += [f"{indent}state = {row}.states[{index}]",
                  f"{indent}if state is None:",
                  f"{indent}    state = create({row}, {index})",
                  f"{indent}state.apply({value})",
                  f"{indent}bits{group} |= {1 << index}"]
        return lines

    @classmethod
    def build(cls, counter_set: CounterSet, topic: str, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
              max_depth: int = DEFAULT_MAX_DEPTH, max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
              max_future_skew_s: int = DEFAULT_MAX_FUTURE_SKEW_S,
              on_not_applicable: Callable[[str, str], None] | None = None,
              partition: int | None = None, on_late: Callable[[str], None] | None = None) -> FastRoute | None:
        """The fast path for ``topic``, or ``None`` when a counter on it needs the router.
        ``on_not_applicable(counter, reason)`` is told of each counter an event lacks a field of, as the
        router's is; ``partition`` is the one whose records it applies (``@partition``)."""
        counters = list(counter_set.for_topic(topic))
        if not counters or not all(_eligible(c) for c in counters):
            return None
        try:
            return cls(counters, max_event_bytes, max_depth, max_key_bytes, max_future_skew_s, on_not_applicable,
                       partition, on_late)
        except _Conflict:
            return None

    def new_rows(self) -> list[dict[Any, Row]]:
        """Empty row caches, one per key group, for one mutator."""
        return [{} for _ in self._groups]

    def _new_row(self, group: int, rows: dict[Any, Row], values: tuple[Any, ...]) -> Row | None:
        """The row of key ``values``, kept in ``rows`` when every value is a string or an integer (``True``
        and ``1`` are one dict key but two instance keys: the generated code looks a row up only by strings and
        integers). Raises the router's error for a value that is not a valid key part (the counters of the group
        refuse the event), or a key too long, as the router's. A bucketed group's
        last value is its bucket's text, the key's last component."""
        paths, names, bucketed, key_paths = self._groups[group]
        texts = []
        kept = True  # every value a string or an integer
        for path, v in zip(paths, values, strict=False):  # a bucketed group's values end with the bucket's
            t = type(v)
            if t is str:
                texts.append(_escape(v))
            elif t is int:
                texts.append(str(v))
            elif v is _UNSET or v is None:
                return None
            else:
                kept = False
                texts.append(_escape(_key_text(path, v)))  # raises the router's refusal of a key part
        if bucketed:
            texts.append(values[-1])
        key = "|".join(texts)
        if len(key) > self.max_key_bytes:  # ASCII: characters are bytes
            raise KeyTooLongError(key_paths, f"instance key of {len(key)} bytes exceeds {self.max_key_bytes}")
        row = Row(key, names)
        if kept:
            rows[values[0] if len(values) == 1 else values] = row
        return row

__all__ = ["FastRoute", "Row", "refusals"]
