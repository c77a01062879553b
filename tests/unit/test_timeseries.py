"""Time series of bucketed counters without servers: which buckets a range holds, steps, keys, parsing, and
roll-ups that merge any split of a stream into buckets back into the state of the whole stream."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.definitions import parse_definitions
from schemas.events import EventRouter, apply_updates
from schemas.kinds import State, new_state
from schemas.kinds.distinct import relative_standard_error
from schemas.kinds.quantiles import normalized_rank_error
from schemas.timeseries import (
    Step,
    TimeRangeError,
    bucket_key,
    bucket_starts,
    instant_seconds,
    iso,
    iso_datetime,
    parse_duration,
    parse_instant,
    roll_up,
    steps,
    utc_text,
    why_no_instance,
    why_no_series,
)

HOUR, DAY = 3600, 86400
T0 = 1_795_000_000 // DAY * DAY  # a UTC midnight in November 2026

KINDS = {
    "count": "",
    "sum": 'value = "n"',
    "min": 'value = "n"',
    "max": 'value = "n"',
    "mean": 'value = "n"',
    "variance": 'value = "n"',
    "distinct": 'value = "user"',
    "quantiles": 'value = "n"',
    "top_k": 'value = "user"\ntop = 5',
}


def definitions(bucketed: bool) -> str:
    """One counter of every kind, keyed by page; hourly buckets, or none (the whole stream)."""
    bucket = 'bucket = { field = "ts", size = "1h", format = "epoch_seconds" }\n' if bucketed else ""
    return "".join(f'[[counter]]\nname = "{kind}"\ntopics = ["t"]\nkind = "{kind}"\nkey = ["page"]\n{extra}\n{bucket}\n'
                   for kind, extra in KINDS.items())


BUCKETED = parse_definitions(definitions(True))
DAILY = parse_definitions(definitions(True).replace('size = "1h"', 'size = "1d"'))
WHOLE = parse_definitions(definitions(False))


def test_a_range_holds_the_buckets_starting_in_it() -> None:
    """[start, end) holds each bucket whose start lies in it, at multiples of the size from 1970."""
    hourly = BUCKETED["count"]
    assert bucket_starts(hourly, T0, T0 + 3 * HOUR, 100) == [T0, T0 + HOUR, T0 + 2 * HOUR]
    assert bucket_starts(hourly, T0 + 1, T0 + 3 * HOUR + 1, 100) == [T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]
    assert bucket_starts(hourly, T0 + 1, T0 + HOUR, 100) == []


def test_a_range_of_too_many_buckets_is_refused_with_the_limit_named() -> None:
    """More buckets than allowed: a clear error naming the limit and its setting."""
    with pytest.raises(TimeRangeError, match=r"168 buckets of 1h; at most 100 .*MAX_RANGE_BUCKETS"):
        bucket_starts(BUCKETED["count"], T0, T0 + 7 * DAY, 100)
    with pytest.raises(TimeRangeError, match="before it starts"):
        bucket_starts(BUCKETED["count"], T0, T0, 100)
    with pytest.raises(TimeRangeError, match="before 1970, where bucket times start"):  # printed nothing, exit 0
        bucket_starts(BUCKETED["count"], -10 * DAY, -DAY, 100)
    assert bucket_starts(BUCKETED["count"], -DAY, HOUR, 100) == [0]  # partly before 1970: its buckets from then


def test_an_unbucketed_counter_has_no_range() -> None:
    """Asking a plain counter for a range says it has no bucket."""
    with pytest.raises(TimeRangeError, match="has no time bucket"):
        bucket_starts(WHOLE["count"], T0, T0 + HOUR, 10)


def test_steps_group_buckets_at_multiples_of_the_step_clipped_to_the_range() -> None:
    """Daily steps of hourly buckets from 06:00 on day 1 to 12:00 on day 3: three steps, the first and last
    clipped to the range; a step that is not a whole number of buckets is refused."""
    hourly = BUCKETED["count"]
    start, end = T0 + 6 * HOUR, T0 + 2 * DAY + 12 * HOUR
    starts = bucket_starts(hourly, start, end, 1000)
    grouped = steps(hourly, starts, start, end, DAY, 1000)
    assert [(g.start, g.end, len(g.buckets)) for g in grouped] == [
        (start, T0 + DAY, 18), (T0 + DAY, T0 + 2 * DAY, 24), (T0 + 2 * DAY, end, 12)]
    assert [len(g.buckets) for g in steps(hourly, starts, start, end, None, 1000)] == [1] * 54
    with pytest.raises(TimeRangeError, match="not a whole number of 1h buckets"):
        steps(hourly, starts, start, end, 90 * 60, 1000)


def test_a_series_is_named_by_the_key_fields_alone() -> None:
    """A series key has the counter's key fields, without a bucket; a counter without key fields has one series,
    named by the empty text. Other keys are refused with the shape they should have (a series of them read every
    bucket and answered nothing counted, or, without key fields, the counter's one series under their name)."""
    hourly = BUCKETED["count"]
    keyless = parse_definitions('[[counter]]\nname = "all"\ntopics = ["t"]\nkind = "count"\n'
                                'bucket = { field = "at", size = "1h" }\n', "k.toml")["all"]
    assert why_no_series(hourly, "IBM") is None
    assert why_no_series(hourly, "a\\|b") is None  # one field holding a |
    assert why_no_series(hourly, "") is None  # the instance of an empty key field
    assert "named by 1 field" in (why_no_series(hourly, "IBM|2026-11-22T10:00Z") or "")
    assert why_no_series(keyless, "") is None
    assert "has no key fields" in (why_no_series(keyless, "x") or "")


def test_steps_reaching_before_1970_are_bounded_as_buckets_are() -> None:
    """A range from before 1970 holds few buckets (none lie before it) but one step per step's length from its
    start: hourly steps from 1900 were 613,610 points (a 63 MB answer), from the year 1 more than a server's
    memory. More steps than the bucket limit are refused, as more buckets are."""
    hourly = BUCKETED["count"]
    start, end = parse_instant("1900-01-01"), parse_instant("1970-01-01T02:00Z")
    starts = bucket_starts(hourly, start, end, 1000)
    assert len(starts) == 2
    with pytest.raises(TimeRangeError, match="holds 613610 steps of 1:00:00; at most 1000 points are read at once"):
        steps(hourly, starts, start, end, HOUR, 1000)
    assert len(steps(hourly, starts, parse_instant("1969-12-31T23:00Z"), end, HOUR, 1000)) == 3


def test_bucket_keys_are_the_routers() -> None:
    """The key a range read builds for a bucket is the key the router gave the events of that bucket."""
    router = EventRouter(BUCKETED)
    event = {"page": "a|b", "ts": T0 + 5 * HOUR + 17, "n": 1, "user": "u"}
    routed = {u.key for u in router.route("t", json.dumps(event).encode()) if u.counter == "count"}
    assert routed == {bucket_key(BUCKETED["count"], "a\\|b", T0 + 5 * HOUR)}
    no_key = parse_definitions('[[counter]]\nname = "all"\ntopics = ["t"]\nkind = "count"\n'
                               'bucket = { field = "ts", size = "1d", format = "epoch_seconds" }\n')
    keys = {u.key for u in EventRouter(no_key).route("t", json.dumps({"ts": T0 + 5}).encode())}
    assert keys == {bucket_key(no_key["all"], "", T0)}


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-11-22T10:00Z", int(datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp())),
    ("2026-11-22T11:00+01:00", int(datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp())),
    ("2026-11-22", int(datetime(2026, 11, 22, tzinfo=UTC).timestamp())),
    ("now", 1_000_001), ("NOW-6h", 1_000_001 - 6 * HOUR), ("-7d", 1_000_001 - 7 * DAY), ("now+30m", 1_001_801),
])
def test_instants_are_read_as_a_user_writes_them(text: str, seconds: int) -> None:
    """ISO-8601 with an offset, a date (UTC midnight), now, and times relative to now (a fraction of a second
    rounded up, as for any time: a range is [from, to) and buckets start on whole seconds)."""
    assert parse_instant(text, now=1_000_000.5) == seconds


def test_a_leap_second_bounds_a_range_as_the_event_times_it_names_are_bucketed() -> None:
    """A leap second is a time an event may carry (counted in the last microsecond of its minute), so a range
    bound may name it too: read as the next whole second, the bucket holding such an event before it. Second 60
    of any other minute is refused, as for events."""
    new_year = int(datetime(2017, 1, 1, tzinfo=UTC).timestamp())
    for text in ("2016-12-31T23:59:60Z", "2016-12-31T23:59:60.25z", "2017-01-01T05:29:60+05:30"):
        assert parse_instant(text) == new_year, text
    hourly = parse_definitions('[[counter]]\nname = "views"\ntopics = ["t"]\nkind = "count"\nkey = ["page"]\n'
                               'bucket = { field = "ts", size = "1h" }\n')
    event = {"page": "p", "ts": "2016-12-31T23:59:60Z"}
    routed = {u.key for u in EventRouter(hourly).route("t", json.dumps(event).encode())}
    assert routed == {bucket_key(hourly["views"], "p", new_year - HOUR)}
    with pytest.raises(TimeRangeError, match="is not a time"):
        parse_instant("2016-12-31T23:58:60Z")


@pytest.mark.parametrize("text", ["yesterday", "2026-11-22T10:00", "now-6", "now-0h", "", "6h"])
def test_instants_that_cannot_be_read_are_refused(text: str) -> None:
    """A time without an offset, a relative time without a unit, or words: refused with what to give."""
    with pytest.raises(TimeRangeError):
        parse_instant(text, now=1_000_000)


@pytest.mark.parametrize("text", ["0001-01-01T00:00+01:00", "9999-12-31T23:59-01:00", "now-1000000d",
                                  "now+9999999d"])
def test_instants_outside_the_years_1_to_9999_are_refused_with_the_range_named(text: str) -> None:
    """A time no UTC datetime holds (an offset or a relative time past either end) is a clear refusal, not a
    ValueError from the calendar."""
    with pytest.raises(TimeRangeError, match=r"outside the times a range can name \(0001-01-01T00:00Z to "):
        parse_instant(text, now=1_795_000_000)


def test_the_first_and_last_times_read_as_written() -> None:
    """Both ends of the readable years parse, and are named back with four-digit years."""
    first, last = parse_instant("0001-01-01"), parse_instant("9999-12-31T23:59:59Z")
    assert (iso(first), iso(last)) == ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z")
    with pytest.raises(TimeRangeError, match=r"\(0001-01-01T00:00Z\) before it starts \(0001-01-01T00:00Z\)"):
        bucket_starts(BUCKETED["count"], first, first, 10)


@pytest.mark.parametrize("size", [HOUR, DAY])
def test_a_range_through_the_last_bucket_of_9999_is_read(size: int) -> None:
    """The last bucket starts in 9999 and ends in 10000: a series and a roll-up of it (and a refusal naming
    the range) are answered; the point's end is the latest time a UTC datetime holds."""
    definition = (BUCKETED if size == HOUR else DAILY)["count"]
    start, end = parse_instant("9999-12-31T00:00Z"), parse_instant("9999-12-31T23:59:59Z")
    starts = bucket_starts(definition, start, end, 100)
    assert (len(starts), starts[-1]) == (DAY // size, end + 1 - size)
    state = new_state(definition)
    state.apply(1)
    points = roll_up(steps(definition, starts, start, end, None, 1000), {starts[-1]: [state]})
    assert (points[-1].value, points[-1].end) == (1, datetime.max.replace(tzinfo=UTC))
    assert roll_up(steps(definition, starts, start, end, DAY, 1000), {starts[-1]: [state]})[-1].value == 1
    with pytest.raises(TimeRangeError, match="9999-12-31T00:00Z to 9999-12-31T23:59Z holds"):
        bucket_starts(definition, start, end, 0)
    assert utc_text(starts[-1] + size) == "10000-01-01T00:00Z"


def test_durations() -> None:
    """Steps are written as a count and a unit."""
    assert [parse_duration(t) for t in ("30m", "6h", "1d", "2w", "45s")] == [1800, 6 * HOUR, DAY, 14 * DAY, 45]
    for bad in ("0h", "1y", "h", "1.5h"):
        with pytest.raises(TimeRangeError):
            parse_duration(bad)


EVENTS = st.lists(st.tuples(st.integers(0, 3 * DAY - 1), st.integers(-50, 200), st.integers(0, 40)),
                  min_size=1, max_size=300)


def _states(counters: object, events: list[tuple[int, int, int]]) -> dict[tuple[str, str], State]:
    router, states = EventRouter(counters), {}  # type: ignore[arg-type]
    for offset, n, user in events:
        raw = json.dumps({"page": "home", "ts": T0 + offset, "n": n, "user": f"u{user}"}).encode()
        apply_updates(states, router.route("t", raw), counters)  # type: ignore[arg-type]
    return states


@settings(max_examples=150, deadline=None)
@given(events=EVENTS, step_hours=st.sampled_from([None, 1, 6, 24, 72]))
def test_any_split_into_buckets_merges_back_into_the_whole_stream(events: list[tuple[int, int, int]],
                                                                 step_hours: int | None) -> None:
    """Events spread over three days, counted in hourly buckets and rolled up over the whole range (or per
    step, then the steps merged again), read as the same events counted without buckets: exactly for the
    exact kinds, within the sketches' bounds for distinct, quantiles and top-k."""
    bucketed, whole = _states(BUCKETED, events), _states(WHOLE, events)
    start, end = T0, T0 + 3 * DAY
    for kind in KINDS:
        definition = BUCKETED[kind]
        starts = bucket_starts(definition, start, end, 1000)
        by_start = {s: [state] if (state := bucketed.get((kind, bucket_key(definition, "home", s)))) else []
                    for s in starts}
        if step_hours is not None and kind in ("count", "sum"):
            for point in roll_up(steps(definition, starts, start, end, step_hours * HOUR, 1000), by_start):
                first, last = point.start.timestamp() - T0, point.end.timestamp() - T0
                inside = [n for offset, n, _ in events if first <= offset < last]
                assert point.value == ((len(inside) if kind == "count" else sum(inside)) if inside else None)
        points = roll_up([Step(start, end, tuple(starts))], by_start)
        assert len(points) == 1
        got, expected = points[0].value, whole[(kind, "home")].value()
        assert points[0].buckets_counted == len({offset // HOUR for offset, _, _ in events})
        if kind == "distinct":
            truth = len({user for _, _, user in events})
            bound = 4 * relative_standard_error(definition.spec.lg_k, merged=True) * truth + 1
            assert abs(got.estimate - truth) <= bound  # type: ignore[attr-defined]
        elif kind == "quantiles":
            values = sorted(n for _, n, _ in events)
            assert (got.count, got.min, got.max) == (len(values), values[0], values[-1])  # type: ignore[attr-defined]
            epsilon = normalized_rank_error(definition.spec.k)
            for rank, estimate in got.quantiles:  # type: ignore[attr-defined]
                below = sum(v < estimate for v in values) / len(values)
                at_or_below = sum(v <= estimate for v in values) / len(values)
                assert below - epsilon <= rank <= at_or_below + epsilon + 1 / len(values)
        elif kind == "top_k":
            frequency = Counter(f"u{user}" for _, _, user in events)
            assert got.total_weight == len(events)  # type: ignore[attr-defined]
            for item in got.items:  # type: ignore[attr-defined]
                assert item.lower_bound <= frequency[item.item] <= item.upper_bound
        else:
            assert got == expected


def test_a_key_naming_no_bucket_of_a_bucketed_counter_is_told_what_to_read() -> None:
    """A key without a bucket (or with one not at a bucket's start) can hold nothing of a bucketed counter:
    the reason names the form to read and the ranges; bucket keys as the router writes them pass."""
    hourly, daily = BUCKETED["count"], DAILY["count"]
    no_key = parse_definitions('[[counter]]\nname = "all"\ntopics = ["t"]\nkind = "count"\n'
                               'bucket = { field = "ts", size = "1d", format = "epoch_seconds" }\n')["all"]
    for definition, key in ((hourly, bucket_key(hourly, "a\\|b", T0 + 5 * HOUR)), (daily, bucket_key(daily, "p", T0)),
                            (no_key, bucket_key(no_key, "", T0)), (WHOLE["count"], "home")):
        assert why_no_instance(definition, key) is None, key
    for definition, key in ((hourly, "home"), (hourly, "home|2026-11-22T10:30Z"), (hourly, "a\\|2026-11-22T10:00Z"),
                            (hourly, "2026-11-22T10:00Z"), (daily, "p|2026-11-22T06:00Z"), (no_key, "x")):
        why = why_no_instance(definition, key)
        assert why is not None, key
        assert f"keeps an instance per {definition.bucket.size} bucket, not {key!r}: read " in why  # type: ignore[union-attr]
        reset_why = why_no_instance(definition, key, "reset")
        assert reset_why is not None
        assert ": reset " in reset_why
        assert "range" not in reset_why  # a reset names keys, not ranges


def test_a_bucket_before_1970_names_no_instance() -> None:
    """A bucket key before 1970 (where bucket times start: no event is counted before) is refused for a read
    and a reset, pointing at the first bucket; 1970's first and 9999's last pass."""
    hourly = BUCKETED["count"]
    for key in ("home|0001-01-01T00:00Z", "home|1969-12-31T23:00Z"):
        why = why_no_instance(hourly, key, "reset")
        assert why == (f"counter {hourly.name!r} counts events from 1970 on: no bucket starts at {key[5:]} "
                       "(reset 'home|1970-01-01T00:00Z' or later)"), why
    for key in ("home|1970-01-01T00:00Z", "home|9999-12-31T23:00Z"):
        assert why_no_instance(hourly, key, "reset") is None


def test_a_key_of_other_fields_than_the_counters_is_told_so() -> None:
    """A key with more or fewer fields than the counter's key (a | not escaped inside a field) can hold nothing:
    a read or a reset of it is refused with the fields it needs, and a key read with a time that starts no bucket
    is pointed at the bucket that time falls in."""
    whole, hourly = WHOLE["count"], BUCKETED["count"]
    why = why_no_instance(whole, "a|b", "reset")
    assert why is not None
    assert "has instance keys of 1 field (" in why
    assert "not 'a|b' (2)" in why
    assert "reset 'a\\|b' for one field holding a |" in why  # as a shell takes it: a\|b
    assert why_no_instance(whole, "a\\|b") is None  # one field holding a |
    too_many = why_no_instance(hourly, "a|b|2026-11-22T10:00Z")
    assert too_many is not None
    assert "has instance keys of 2 fields (" in too_many
    assert "the bucket's start)" in too_many
    for time_given in ("2026-11-22T10:30Z", "2026-11-22T10:00:00Z", "2026-11-22T11:59+01:00"):
        hint = why_no_instance(hourly, f"iso|{time_given}")
        assert hint is not None
        assert "read 'iso|2026-11-22T10:00Z' (the bucket's start, UTC)" in hint, hint


def test_a_fraction_of_a_second_is_rounded_up_at_both_ends_of_a_range() -> None:
    """A range is [from, to) and buckets start on whole seconds: from 00:00:00.5 leaves out the bucket starting at
    00:00, and to 00:00:00.000001 keeps it (both were floored: the first bucket read began before the range, and
    the second range was refused as ending before it starts)."""
    assert parse_instant("1970-01-01T00:00:00.5Z") == 1
    assert parse_instant("1970-01-01T00:00:00.000001Z") == 1
    assert parse_instant("2026-11-22T10:00:00Z") == parse_instant("2026-11-22T10:00Z")
    assert parse_instant("now", now=100.25) == 101
    hourly = BUCKETED["count"]
    assert bucket_starts(hourly, parse_instant("1970-01-01T00:00:00.5Z"), 3 * HOUR, 10) == [HOUR, 2 * HOUR]
    assert bucket_starts(hourly, 0, parse_instant("1970-01-01T00:00:00.000001Z"), 10) == [0]


@pytest.mark.parametrize(("given", "seconds"), [
    (0.5, 1), (-0.5, 0), (7200, 7200), (datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC), 1),
    (datetime(2026, 11, 22, 10, tzinfo=UTC), 1_795_341_600), ("1970-01-01T02:00Z", 7200)])
def test_a_program_gives_times_as_datetimes_epoch_seconds_or_text(given: object, seconds: int) -> None:
    assert instant_seconds(given) == seconds


@pytest.mark.parametrize("given", [10**30, -(10**30), True, float("nan"), float("inf"), datetime(2026, 1, 1), None,
                                   b"2026-01-01"])
def test_times_a_range_cannot_name_are_refused_at_once(given: object) -> None:
    """10**30 seconds spun for minutes (its error message named it by stepping back 400 years at a time); a
    bool was one second, a float an AttributeError."""
    with pytest.raises(TimeRangeError):
        instant_seconds(given)
    assert utc_text(10**30).startswith("316887385068")  # named at once all the same


@pytest.mark.parametrize("step", [0, -3600])
def test_a_step_is_positive(step: int) -> None:
    """A step of 0 divided by zero; a negative one answered no point, with buckets counted in the range."""
    hourly = BUCKETED["count"]
    with pytest.raises(TimeRangeError, match="is no step"):
        steps(hourly, [0, HOUR], 0, 2 * HOUR, step, 10)


def test_a_counter_without_key_fields_has_the_empty_key_only() -> None:
    """Any one-field key was read (nothing counted) as if the counter had one key field."""
    keyless = parse_definitions('[[counter]]\nname = "all"\ntopics = ["t"]\nkind = "count"\n')["all"]
    assert why_no_instance(keyless, "") is None
    assert "has no key fields: its one instance has the empty key, not 'x'" in (why_no_instance(keyless, "x") or "")


def test_years_before_1000_have_four_digits() -> None:
    """strftime writes the year 1 as 1: a point starting then read 1-01-01T00:00:00Z beside its range's 0001."""
    assert utc_text(-62_135_596_800) == "0001-01-01T00:00Z"  # why_no_instance compares a key's bucket with it
    assert "no bucket starts at 0001-01-01T00:00Z" in (why_no_instance(BUCKETED["count"], "p|0001-01-01T00:00Z")
                                                       or "")  # read as a time, and refused: before 1970
    assert bucket_key(BUCKETED["count"], "p", T0) == "p|" + utc_text(T0)
    assert iso_datetime(datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00Z"
    assert iso_datetime(datetime(1, 1, 1, tzinfo=UTC), with_seconds=False) == "0001-01-01T00:00Z"
    assert iso_datetime(datetime(2026, 11, 22, 11, 30, tzinfo=UTC)) == "2026-11-22T11:30:00Z"

