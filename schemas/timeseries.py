"""Time-bucketed counters read as time series: which buckets a range holds, how steps group them, and the
instance key of each bucket.

A bucketed counter keeps one instance per key and bucket, the bucket's start in UTC being the last component
of the instance key (``IBM|2026-11-22T10:00Z``, docs/counters.md). Buckets start at multiples of their size
counted from 1970-01-01T00:00Z (sub-day sizes divide a day, so every day's buckets start at midnight). A
range ``[start, end)`` holds the buckets whose start lies in it; a step (a multiple of the bucket size)
groups them the same way, at multiples of the step.

Pure functions: the reader (``countersink.reader``) reads and merges; the CLI and ``serve`` parse.
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import functools
import math
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from schemas.definitions import CounterDefinition
from schemas.errors import CountersinkError, MalformedInstanceKeyError
from schemas.events import decode_instance_key, encode_instance_key, rfc3339_variant
from schemas.kinds import State, merge_states

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"([1-9][0-9]{0,6})([smhdw])")
_RELATIVE = re.compile(r"(?:now)?(?:([+-])([1-9][0-9]{0,6})([smhdw]))?")
# The last instant a bucket key can name (9999-12-31T23:59Z), as the router refuses later event times.
_LAST_SECOND = 253_402_300_799
# The first instant a time given to a reader can name (0001-01-01T00:00Z): Python's datetimes hold no earlier one.
_FIRST_SECOND = -62_135_596_800
# The Gregorian calendar repeats every 400 years, to the day: a bucket's end past 9999 is named 400 years back.
_GREGORIAN_CYCLE_S = 146_097 * 86_400
BUCKET_FORMAT = "%Y-%m-%dT%H:%MZ"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimeRangeError(CountersinkError, ValueError):
    """A time, duration or range that cannot be read: the message says what is expected."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One point of a series or a roll-up: ``[start, end)`` and the buckets it merges (their starts)."""

    start: int
    end: int
    buckets: tuple[int, ...]


def parse_duration(text: str) -> int:
    """Seconds in ``30m``, ``6h``, ``1d``, ``2w``."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise TimeRangeError(f"{text!r} is not a duration like 30m, 6h, 1d or 2w")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_instant(text: str, now: float | None = None) -> int:
    """Epoch seconds of an ISO-8601 time with an offset (``2026-11-22T10:00Z``, ``2026-11-22T11:00+01:00``),
    a date (midnight UTC), ``now``, or a time relative to now (``now-6h``, ``-7d``, ``now+1h``)."""
    given = text.strip()
    relative = _RELATIVE.fullmatch(given.lower())
    if given and relative is not None:
        seconds = time.time() if now is None else now
        if relative.group(1):
            delta = int(relative.group(2)) * _UNITS[relative.group(3)]
            seconds += delta if relative.group(1) == "+" else -delta
        return _readable(text, math.ceil(seconds))
    try:
        when = datetime.fromisoformat(given.replace("z", "Z"))
    except ValueError:
        # A leap second (23:59:60Z) as an event's time gives: the last microsecond of its minute, so a range
        # bound at it is read as at the next whole second (whole_seconds), the bucket holding such an event
        # before it.
        leap = rfc3339_variant(given)
        if leap is not None:
            return _readable(text, whole_seconds(leap))
        raise TimeRangeError(f"{text!r} is not a time: give ISO-8601 with an offset (2026-11-22T10:00Z), a date, "
                             "now, or now-6h / -7d") from None
    if when.tzinfo is None:
        if len(given) > 10:
            raise TimeRangeError(f"{text!r} has no UTC offset: add Z or +hh:mm")
        when = when.replace(tzinfo=UTC)
    return _readable(text, whole_seconds(when))


def whole_seconds(when: datetime) -> int:
    """An aware time as epoch seconds, a fraction of a second rounded up: a range is ``[start, end)`` and buckets
    start on whole seconds, so a bucket starting before 00:00:00.5 is before such a start, and one starting at
    00:00:00 is before such an end. Exact (a float timestamp is not, for microseconds)."""
    since = when - _EPOCH
    return since.days * 86_400 + since.seconds + (1 if since.microseconds else 0)


def instant_seconds(when: object) -> int:
    """Epoch seconds of a range's start or end given as a program gives it: an aware ``datetime``, epoch seconds
    (an int, or a float rounded up as :func:`whole_seconds` says), or text as :func:`parse_instant` reads it."""
    if isinstance(when, str):
        return parse_instant(when)
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise TimeRangeError(f"{when!r} has no time zone: give an aware datetime")
        return _readable(repr(when), whole_seconds(when))
    if isinstance(when, int) and not isinstance(when, bool):
        return _readable(repr(when), when)
    if isinstance(when, float) and math.isfinite(when):
        return _readable(repr(when), math.ceil(when))
    raise TimeRangeError(f"{when!r} is not a time: give an aware datetime, epoch seconds or ISO-8601 text")


def _readable(text: str, seconds: int) -> int:
    """``seconds`` when it falls in the years 1 to 9999 in UTC (every time an event can be counted at lies
    in 1970..9999), else a :class:`TimeRangeError`: ranges are echoed and bucket ends named as UTC times."""
    if not _FIRST_SECOND <= seconds <= _LAST_SECOND:
        raise TimeRangeError(f"{text!r} is outside the times a range can name (0001-01-01T00:00Z to "
                             "9999-12-31T23:59:59Z, in UTC)")
    return seconds


def bucket_seconds(definition: CounterDefinition) -> int:
    if definition.bucket is None:
        raise TimeRangeError(f"counter {definition.name!r} has no time bucket: read it with a plain key")
    return definition.bucket.seconds


def bucket_starts(definition: CounterDefinition, start: int, end: int, max_buckets: int) -> list[int]:
    """The starts of the buckets of ``[start, end)``; refuses an empty range and more than ``max_buckets``."""
    size = bucket_seconds(definition)
    if end <= start:
        raise TimeRangeError(f"the range ends ({utc_text(end)}) before it starts ({utc_text(start)})")
    if end <= 0:
        raise TimeRangeError(f"the range ends ({utc_text(end)}) before 1970, where bucket times start: no bucket "
                             "lies in it")
    first = -(-max(start, 0) // size) * size
    last = min(end, _LAST_SECOND + 1)
    count = max(0, -(-(last - first) // size))
    if count > max_buckets:
        raise TimeRangeError(f"{utc_text(start)} to {utc_text(end)} holds {count} buckets of {definition.bucket.size}"  # type: ignore[union-attr]
                             f"; at most {max_buckets} are read at once (COUNTERSINK_READ__MAX_RANGE_BUCKETS)")
    return [first + i * size for i in range(count)]


def steps(definition: CounterDefinition, starts: list[int], start: int, end: int, step: int | None,
          max_points: int) -> list[Step]:
    """Group bucket starts: one step per bucket without ``step``; with it, one per multiple of ``step`` that
    the range reaches, clipped to the range, at most ``max_points`` of them (a range reaching before 1970 has
    steps where no bucket lies, which the bucket count does not bound). ``step`` must be a multiple of the
    bucket size."""
    size = bucket_seconds(definition)
    if step is None:
        return [Step(s, s + size, (s,)) for s in starts]
    if step <= 0:
        raise TimeRangeError(f"a step of {step} seconds is no step: give a positive whole number of buckets")
    if step % size:
        raise TimeRangeError(f"a step of {_span(step)} is not a whole number of {definition.bucket.size} buckets")  # type: ignore[union-attr]
    grouped: dict[int, list[int]] = {}
    for s in starts:
        grouped.setdefault(s // step * step, []).append(s)
    first, out = start // step * step, []
    count = -(-(end - first) // step)
    if count > max_points:
        raise TimeRangeError(f"{utc_text(start)} to {utc_text(end)} holds {count} steps of {_span(step)}; at most "
                             f"{max_points} points are read at once (COUNTERSINK_READ__MAX_RANGE_BUCKETS)")
    for at in range(first, end, step):
        out.append(Step(max(at, start), min(at + step, end), tuple(grouped.get(at, ()))))
    return out


@dataclasses.dataclass(frozen=True)
class SeriesPoint:
    """One point of a time series: the merged value of the buckets starting in ``[start, end)`` (``None``
    when nothing was counted in any of them), and how many of them hold anything."""

    start: datetime
    end: datetime
    value: object
    buckets_counted: int


def roll_up(groups: list[Step], states: Mapping[int, Sequence[State]]) -> list[SeriesPoint]:
    """Each step's buckets merged (``states``: each bucket's stored states by its start; none for a bucket
    never counted). States merge as CRDTs, so a step reads as the state of its whole stream would: exactly
    for sums, counts, min, max, mean and variance, within the sketch's bounds for distinct, quantiles and
    top-k. All of a step's states merge at once: a week of hourly sketches is one union, not 168."""
    points = []
    for group in groups:
        counted = [start for start in group.buckets if states.get(start)]
        every = [state for start in counted for state in states[start]]
        merged = merge_states(every)
        points.append(SeriesPoint(_utc(group.start), _utc(group.end), None if merged is None else merged.value(),
                                  len(counted)))
    return points


def bucket_key(definition: CounterDefinition, key: str, bucket_start: int) -> str:
    """The instance key of ``key``'s bucket starting at ``bucket_start`` (``key`` as readers give it: the key
    fields' values joined by ``|``, escaped; the empty text for a counter without key fields)."""
    text = time.strftime(BUCKET_FORMAT, time.gmtime(bucket_start))
    return key + "|" + text if definition.key else text



def why_no_series(definition: CounterDefinition, key: str) -> str | None:
    """Why ``key`` names no series of ``definition``, or None when it does: a series is named by a field per key
    field of the counter (escaped and joined by ``|``), without a bucket; a counter without key fields has one,
    named by the empty text. A malformed key (a lone ``\\``) is the caller's to refuse."""
    try:
        fields = decode_instance_key(key)
    except MalformedInstanceKeyError:
        return None
    if not definition.key:
        return None if key == "" else (f"counter {definition.name!r} has no key fields: its one series is named by "
                                       f"the empty text, not {key!r} (serve: /counters/{definition.name}/series)")
    if len(fields) == len(definition.key):
        return None
    return (f"the series of counter {definition.name!r} are named by {len(definition.key)} field"
            f"{'s' if len(definition.key) > 1 else ''} ({' | '.join(definition.key)}), without a bucket, not "
            f"{key!r} ({len(fields)}): a | inside a field is written \\|")


def why_no_instance(definition: CounterDefinition, key: str, doing: str = "read") -> str | None:
    """Why ``key`` can hold nothing of ``definition``, or None when it can: an instance key has a field per key
    field of the counter (escaped and joined by ``|``; the empty text for a counter without key fields) and, for a
    bucketed counter, then a bucket's start as :func:`bucket_key` writes it (``IBM|2026-11-22T10:00Z``), at a
    multiple of the bucket size. ``doing``: what the message tells to do with such a key (``read``, with a range as
    the other way; ``reset``). A malformed key (a lone ``\\``) is the caller's to refuse."""
    try:
        fields = decode_instance_key(key)
    except MalformedInstanceKeyError:
        return None
    if not definition.key and definition.bucket is None and key:
        return (f"counter {definition.name!r} has no key fields: its one instance has the empty key, not {key!r} "
                f"({doing} it without a key)")
    names = [*definition.key, *(["the bucket's start"] if definition.bucket is not None else [])]
    # A bucketed counter's key given without its bucket is told the bucket to add, as one with a wrong bucket is.
    without_bucket = definition.bucket is not None and definition.key and len(fields) == len(definition.key)
    if len(fields) != max(len(names), 1) and not without_bucket:
        shape = " | ".join(names) if names else "the empty text"
        hint = ""
        if len(definition.key) == 1 and definition.bucket is None:
            # Quoted as a shell takes it (repr() doubled the backslash: the key it named was refused again).
            hint = f": {doing} {shlex.quote(encode_instance_key(['|'.join(fields)]))} for one field holding a |"
        return (f"counter {definition.name!r} has instance keys of {len(names) or 1} field"
                f"{'s' if len(names) > 1 else ''} ({shape}), not {key!r} ({len(fields)}): a | inside a field is "
                f"written \\|{hint}")
    if definition.bucket is None:
        return None
    size = definition.bucket.seconds
    given = int(time.time())  # the bucket the time given falls in, else the current one
    named = encode_instance_key(fields if without_bucket else fields[:-1]) if definition.key else ""
    if not without_bucket:
        last = fields[-1]
        try:
            start = _bucket_start_s(last)
        except ValueError:
            start = None
        if start is not None and start < 0:  # no event is counted in a bucket before 1970 (refused as out of range)
            return (f"counter {definition.name!r} counts events from 1970 on: no bucket starts at {last} "
                    f"({doing} {bucket_key(definition, named, 0)!r} or later)")
        if start is not None and utc_text(start) == last and start % size == 0:
            return None
        with contextlib.suppress(TimeRangeError):
            given = parse_instant(last) if start is None else start
    example = bucket_key(definition, named, max(0, given) // size * size)
    other = " or a range (--from and --to; serve: .../series?from=&to=)" if doing == "read" else ""
    return (f"counter {definition.name!r} keeps an instance per {definition.bucket.size} bucket, not {key!r}: "
            f"{doing} {example!r} (the bucket's start, UTC){other}")


def expiry(definition: CounterDefinition, instance_key: str) -> int | None:
    """When the bucket an instance key names reaches the end of its retention (epoch seconds): the bucket's
    end plus ``retain``. ``None`` for a counter kept forever."""
    if definition.bucket is None or definition.retain_seconds is None:
        return None
    start = _bucket_start_s(instance_key[-len("2026-11-22T10:00Z"):])
    return start + definition.bucket.seconds + definition.retain_seconds


@functools.lru_cache(maxsize=4096)
def _bucket_start_s(text: str) -> int:
    """A bucket's start in an instance key, in epoch seconds (ValueError for text that names none). Kept for the
    buckets seen last: a flush asks it of every instance of a retained counter it writes (7 µs by
    ``time.strptime``), and its instances share a few buckets."""
    return calendar.timegm(time.strptime(text, BUCKET_FORMAT))


def _utc(seconds: int) -> datetime:
    """A point's start or end; the end of a bucket reaching past 9999 (no ``datetime`` holds it) is the last
    one held, 9999-12-31T23:59:59.999999Z."""
    return datetime.fromtimestamp(seconds, UTC) if seconds <= _LAST_SECOND else datetime.max.replace(tzinfo=UTC)


def utc_text(seconds: int, *, with_seconds: bool = False) -> str:
    """``seconds`` since 1970 as a UTC time, its year in four digits (``0001``) and past 9999 too: the end
    of a bucket that starts in 9999 (``10000-01-01T00:00Z``)."""
    shift = 0
    if seconds > _LAST_SECOND:  # whole 400-year cycles back into the years a datetime holds
        cycles = (seconds - _LAST_SECOND - 1) // _GREGORIAN_CYCLE_S + 1
        seconds, shift = seconds - cycles * _GREGORIAN_CYCLE_S, cycles * 400
    when = datetime.fromtimestamp(seconds, UTC)
    return f"{when.year + shift:04d}-{when:%m-%dT%H:%M}{f':{when:%S}' if with_seconds else ''}Z"


def _span(seconds: int) -> str:
    return str(timedelta(seconds=seconds))


def iso_datetime(when: datetime, *, with_seconds: bool = True) -> str:
    """An aware time as JSON and people read it, ``2026-11-22T10:00:00Z`` (``2026-11-22T10:00Z`` without its
    seconds), the year in four digits (``0001``: strftime writes ``1``), as :func:`utc_text` names seconds."""
    utc = when.astimezone(UTC)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M}{f':{utc:%S}' if with_seconds else ''}Z"


def iso(seconds: int) -> str:
    """A range's start or end for people and JSON: ``2026-11-22T10:00:00Z``."""
    return utc_text(seconds, with_seconds=True)
