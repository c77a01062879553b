"""Event times that storage cannot hold, or that lie too far ahead of their record, are refused for their counter
with a named error (never a crash at flush), decided from the record alone; and no row asks Cassandra for an
expiry past what it stores (2038-01-19T03:14:07Z in its default compatibility mode) or a TTL over 20 years."""

from __future__ import annotations

import asyncio
import calendar
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.settings import CassandraSettings, ConsumerSettings
from schemas.cql import (
    CASSANDRA_EXPIRY_LIMIT_S,
    EXPIRY_MARGIN_S,
    LAST_EXPIRY_S,
    MAX_TTL_S,
    STAMP_ROW,
    STAMP_TTL_S,
    row_ttl,
)
from schemas.definitions import parse_definitions
from schemas.errors import FutureEventTimeError, UnstorableTimeError, ValueOutOfRangeError
from schemas.events import DEFAULT_MAX_FUTURE_SKEW_S, EventRouter

DAY = 86_400
NOW = calendar.timegm((2026, 11, 25, 12, 0, 0))
Y2040 = calendar.timegm((2040, 1, 1, 0, 0, 0))
Y9999 = calendar.timegm((9999, 12, 31, 23, 0, 0))
Y1 = -62_135_596_800  # 0001-01-01T00:00:00Z


def _counters(retain: str | None, fmt: str = "epoch_seconds", topic: str = "t"):  # type: ignore[no-untyped-def]
    retained = f'retain = "{retain}"\n' if retain else ""
    return parse_definitions(f'[[counter]]\nname = "views"\ntopics = ["{topic}"]\nkind = "count"\nkey = ["page"]\n'
                             f'bucket = {{ field = "ts", size = "1h", format = "{fmt}" }}\n{retained}')


def _raw(ts: object) -> bytes:
    return json.dumps({"page": "home", "ts": ts}).encode()


def test_the_storage_limit_is_cassandras_with_a_days_margin() -> None:
    """The last expiry countersink writes is a day before 2038-01-19T03:14:07Z, and Cassandra's TTL cap is 20
    years."""
    assert time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(CASSANDRA_EXPIRY_LIMIT_S)) == "2038-01-19T03:14:07Z"
    assert LAST_EXPIRY_S == CASSANDRA_EXPIRY_LIMIT_S - EXPIRY_MARGIN_S
    assert EXPIRY_MARGIN_S == DAY
    assert MAX_TTL_S == 630_720_000


@pytest.mark.parametrize(("expires_at", "now", "ttl"), [
    (NOW + 30 * DAY, NOW, 30 * DAY),  # far from every bound: the expiry asked
    (NOW, NOW, None),  # expired: not written
    (NOW - 1, NOW, None),
    (NOW + 1, NOW, 1),
    (Y2040, NOW, LAST_EXPIRY_S - NOW),  # past what Cassandra stores: the last expiry it stores
    (Y9999, NOW, LAST_EXPIRY_S - NOW),
    (LAST_EXPIRY_S, NOW, LAST_EXPIRY_S - NOW),
    (LAST_EXPIRY_S + 1, NOW, LAST_EXPIRY_S - NOW),
    (Y2040, LAST_EXPIRY_S, None),  # from 2038-01-18T03:14:07Z on, no expiring row can be written at all
    (Y2040, 0, MAX_TTL_S),  # never more than 20 years
])
def test_row_ttl(expires_at: int, now: int, ttl: int | None) -> None:
    """The TTL asked for a row: its expiry, or the last one Cassandra stores, or nothing once either passed."""
    assert row_ttl(expires_at, now) == ttl


@given(expires_at=st.integers(-(2**40), 2**40), now=st.integers(0, 2**32))
def test_every_ttl_is_one_cassandra_takes(expires_at: int, now: int) -> None:
    """Any expiry, any clock: a TTL is positive, at most 20 years, and ends a day before Cassandra's limit."""
    ttl = row_ttl(expires_at, now)
    if ttl is not None:
        assert 1 <= ttl <= MAX_TTL_S
        assert now + ttl <= CASSANDRA_EXPIRY_LIMIT_S - EXPIRY_MARGIN_S
        assert now + ttl <= expires_at


class RecordingClient:
    """Stands in for CassandraClient: records every request instead of sending it."""

    def __init__(self) -> None:
        self.settings = CassandraSettings(retention_grace_s=3600)
        self.statements: list[tuple[str, Sequence[Any]]] = []
        self.stamps = 0

    async def execute(self, cql_text: str, params: Sequence[Any], **_: object) -> None:
        if "UPDATE shards" in cql_text:
            self.statements.append((cql_text, params))
            self.stamps += "SET stamps" in cql_text

    async def execute_batch(self, statements: Sequence[tuple[str, Sequence[Any]]], **_: object) -> None:
        for cql_text, params in statements:
            await self.execute(cql_text, params)


def test_a_flush_never_asks_for_an_expiry_past_what_cassandra_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retain = "3650d" bucket in 2028 (expiry in 2038) is written with a TTL ending at the last expiry
    Cassandra stores, not refused; a bucket with a near expiry keeps its own; a row without one has no TTL."""
    in_2028 = calendar.timegm((2028, 6, 1, 0, 0, 0))
    monkeypatch.setattr(time, "time", lambda: float(in_2028))
    client = RecordingClient()
    writes = [ShardWrite("decade", "home|2028-06-01T00:00Z", b"s", 1, False, in_2028 + 3650 * DAY),
              ShardWrite("month", "home|2028-06-01T00:00Z", b"s", 1, False, in_2028 + 30 * DAY),
              ShardWrite("forever", "home", b"s", 1, False)]
    born_us = in_2028 * 1_000_000
    asyncio.run(CassandraStore(client).write_shards(uuid.uuid4(), born_us, 1, writes, source=b"test"))  # type: ignore[arg-type]
    # Each row of states and its key's stamp (the same TTL, or a stamp's own for the row without one).
    ttls = sorted(params[0] for cql, params in client.statements if "USING TTL ?" in cql)
    assert ttls == sorted([30 * DAY + 3600, 30 * DAY + 3600, LAST_EXPIRY_S - in_2028, LAST_EXPIRY_S - in_2028])
    assert [cql for cql, _ in client.statements if "USING TTL ?" not in cql and "SET stamps" in cql] == [
        f"UPDATE shards USING TTL {STAMP_TTL_S} SET stamps[?] = ? WHERE part = ? AND key = '' "
        f"AND born_us = {STAMP_ROW[0]} AND mutator = {STAMP_ROW[1]}"]
    assert sum("USING TTL" not in cql for cql, _ in client.statements) == 1  # the states kept forever
    assert client.stamps == 3


def test_an_event_time_past_what_storage_keeps_is_refused_for_its_counter() -> None:
    """On a counter with retain, an event whose bucket would end after the last expiry Cassandra stores is
    refused with UnstorableTimeError naming the counter (its record dated alike, so that the time is not
    merely in the future); a counter kept forever stores no expiry and counts it."""
    stamp_2040 = Y2040 * 1000
    with pytest.raises(UnstorableTimeError) as refused:
        EventRouter(_counters("30d")).route("t", _raw(Y2040), stamp_2040)
    assert refused.value.counter == "views"
    assert refused.value.path == "ts"
    assert [u.key for u in EventRouter(_counters(None)).route("t", _raw(Y2040), stamp_2040)] == [
        "home|2040-01-01T00:00Z"]


def test_the_last_storable_bucket_is_the_one_ending_by_the_last_expiry() -> None:
    """The hourly bucket ending at or before 2038-01-18T03:14:07Z counts; the one holding that instant does
    not: no row of it could be kept until it is over."""
    router = EventRouter(_counters("3650d"), max_future_skew_s=10**12)
    last_whole = (LAST_EXPIRY_S // 3600 - 1) * 3600
    assert [u.key for u in router.route("t", _raw(last_whole), None)] == ["home|2038-01-18T02:00Z"]
    with pytest.raises(UnstorableTimeError):
        router.route("t", _raw(last_whole + 3600), None)


def test_a_decade_of_retention_still_counts_in_2028_and_after() -> None:
    """retain = "3650d" asks for expiries past 2038 from 2028-01-21 on: the events still count (their rows
    expire at the last expiry Cassandra stores)."""
    for year in (2028, 2030, 2037):
        at = calendar.timegm((year, 6, 1, 0, 0, 0))
        assert len(EventRouter(_counters("3650d")).route("t", _raw(at + 5), at * 1000)) == 1


@pytest.mark.parametrize("fmt", ["epoch_seconds", "epoch_millis", "iso8601"])
def test_an_event_time_beyond_the_future_skew_of_its_record_is_refused(fmt: str) -> None:
    """An event time up to max_future_skew_s after its record's Kafka timestamp counts; one second more is
    refused with FutureEventTimeError naming the counter, in every timestamp format."""
    def written(seconds: int) -> object:
        if fmt == "epoch_millis":
            return seconds * 1000
        if fmt == "iso8601":
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
        return seconds

    router = EventRouter(_counters(None, fmt))
    assert DEFAULT_MAX_FUTURE_SKEW_S == DAY == ConsumerSettings().max_future_skew_s
    assert len(router.route("t", _raw(written(NOW + DAY)), NOW * 1000)) == 1
    with pytest.raises(FutureEventTimeError) as refused:
        router.route("t", _raw(written(NOW + DAY + 1)), NOW * 1000)
    assert refused.value.counter == "views"
    assert "after its record's timestamp" in refused.value.reason


@pytest.mark.parametrize("batch", [False, True])
def test_an_epoch_millis_time_a_millisecond_past_the_future_skew_is_refused(batch: bool) -> None:
    """An integer of milliseconds is compared whole with its record's timestamp: its whole seconds were, which
    let up to 999 ms past the skew count where the same time written in seconds or ISO-8601 was refused. The
    batch path decides as the router does."""
    import uuid as uuid_module

    from consumer.applying import Applier, Mutator, Record, RetryWindow
    from consumer.storage import MutatorEntry, PartitionId

    counters = _counters(None, "epoch_millis")
    mutator = Mutator(MutatorEntry(uuid_module.uuid4(), "g", "t", 0, "h", 0, 10**18), PartitionId("g", "t", 0),
                      Applier(EventRouter(counters), counters, "t", 0, RetryWindow(0)), -1, -1)
    limit = (NOW + DAY) * 1000
    records = [Record(i, _raw(limit + past), NOW * 1000) for i, past in enumerate([0, 1, 999, 1000])]
    if batch:
        refused = [(record.offset, type(error).__name__) for record, error in mutator.apply_batch(records).invalid]
    else:
        refused = [(record.offset, type(error).__name__) for record in records
                   for _, error in [mutator.apply(record)] if error is not None]
    assert refused == [(1, "CountersRefusedError"), (2, "CountersRefusedError"), (3, "CountersRefusedError")]
    with pytest.raises(FutureEventTimeError):
        EventRouter(counters).route("t", _raw(limit + 1), NOW * 1000)
    assert [state.value() for state in mutator.states.values()] == [1]


def test_the_future_skew_is_a_setting() -> None:
    """max_future_skew_s moves the bound: 0 refuses any time after the record's."""
    router = EventRouter(_counters(None), max_future_skew_s=0)
    assert len(router.route("t", _raw(NOW), NOW * 1000)) == 1
    with pytest.raises(FutureEventTimeError):
        router.route("t", _raw(NOW + 1), NOW * 1000)


def test_a_record_without_a_timestamp_is_not_checked_for_the_future() -> None:
    """A record without a timestamp (None, or Kafka's -1) has nothing to compare with: its time counts if
    storage can hold it."""
    for stamp in (None, -1):
        assert len(EventRouter(_counters(None)).route("t", _raw(Y9999), stamp)) == 1
        assert len(EventRouter(_counters("30d")).route("t", _raw(NOW), stamp)) == 1
        with pytest.raises(UnstorableTimeError):
            EventRouter(_counters("30d")).route("t", _raw(Y9999), stamp)


@pytest.mark.parametrize(("ts", "error"), [
    (Y9999, FutureEventTimeError), (Y1, ValueOutOfRangeError), ("9999-12-31T23:59:59Z", FutureEventTimeError),
    ("0001-01-01T00:00:00Z", ValueOutOfRangeError), (Y2040, FutureEventTimeError)])
def test_years_9999_and_1_are_refused(ts: object, error: type[Exception]) -> None:
    """Year 9999 is too far ahead of a record written now, year 1 before any bucket: both refused by name."""
    fmt = "iso8601" if isinstance(ts, str) else "epoch_seconds"
    with pytest.raises(error) as refused:
        EventRouter(_counters("30d", fmt)).route("t", _raw(ts), NOW * 1000)
    assert refused.value.counter == "views"  # type: ignore[attr-defined]


def test_the_decision_does_not_depend_on_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay days (or years) later refuses exactly what the first reading refused and counts what it
    counted: the bounds are the record's timestamp and storage's fixed limit, never the clock."""
    records = [(_raw(NOW + DAY), NOW * 1000), (_raw(NOW + DAY + 1), NOW * 1000), (_raw(Y2040), Y2040 * 1000),
               (_raw(NOW), NOW * 1000)]

    def decisions() -> list[object]:
        router = EventRouter(_counters("30d"))
        out: list[object] = []
        for raw, stamp in records:
            try:
                out.append(router.route("t", raw, stamp))
            except ValueOutOfRangeError as exc:
                out.append(type(exc).__name__)
        return out

    first = decisions()
    assert [type(d).__name__ if isinstance(d, list) else d for d in first] == [
        "list", "FutureEventTimeError", "UnstorableTimeError", "list"]
    for later in (NOW + 10 * DAY, LAST_EXPIRY_S + DAY):
        monkeypatch.setattr(time, "time", lambda at=later: float(at))
        monkeypatch.setattr(time, "time_ns", lambda at=later: at * 10**9)
        assert decisions() == first


@pytest.mark.parametrize("year", [2026, 2300, 3000, 9999])
def test_a_time_a_microsecond_before_the_hour_is_in_that_hour_in_any_year(year: int) -> None:
    """An ISO-8601 time is floored to its bucket exactly: a float timestamp rounds a microsecond before the hour
    up into the next one past about 2242 (and 9999-12-31T23:59:59.999999Z out of the years counted)."""
    router = EventRouter(_counters(None, "iso8601"))
    text = f"{year}-12-31T23:59:59.999999Z"
    (update,) = router.route("t", _raw(text), None)
    assert update.key == f"home|{year}-12-31T23:00Z"
    (after,) = router.route("t", _raw(f"{year}-12-31T23:00:00.000001Z"), None)  # rounds down onto the hour
    assert after.key == f"home|{year}-12-31T23:00Z"


@pytest.mark.parametrize(("text", "bucket"), [
    ("2016-12-31T23:59:60Z", "2016-12-31T23:00Z"), ("2017-01-01T00:59:60.5+01:00", "2016-12-31T23:00Z"),
    ("2017-01-01T05:29:60+05:30", "2016-12-31T23:00Z"),
    ("2026-11-22T10:15:00z", "2026-11-22T10:00Z"), ("2026-11-22t10:15:00.25z", "2026-11-22T10:00Z")])
def test_rfc3339_leap_seconds_and_a_lowercase_z_are_times(text: str, bucket: str) -> None:
    """RFC 3339 allows a leap second (hh:59:60) and a lowercase t and z, which Python's parser refuses: a leap
    second counts in the minute it ends, and the lowercase letters read as the capitals."""
    (update,) = EventRouter(_counters(None, "iso8601")).route("t", _raw(text), None)
    assert update.key == f"home|{bucket}"


@pytest.mark.parametrize("text", ["2016-12-31T23:58:60Z", "2016-12-31T22:59:60Z", "2016-12-31T23:59:61Z",
                                  "2016-12-31T23:59:60", "2017-01-01T05:59:60+05:30"])
def test_a_sixtieth_second_elsewhere_is_no_time(text: str) -> None:
    """Only a UTC day's last minute has a 61st second, and a time without an offset stays refused."""
    with pytest.raises(ValueOutOfRangeError):
        EventRouter(_counters(None, "iso8601")).route("t", _raw(text), None)


@pytest.mark.parametrize(("text", "reason"), [
    ("0001-01-01T00:59:60+01:00", "outside 1970..9999"), ("0001-01-01T00:59:60.5+01:00", "outside 1970..9999"),
    ("9999-12-31T23:59:60-01:00", "not an ISO-8601 timestamp")])
def test_a_leap_second_of_a_utc_day_outside_the_calendar_is_refused_not_raised(text: str, reason: str) -> None:
    """A leap second whose UTC day is before year 1 or after 9999 is refused as any time outside the years counted
    (or as no time, when its minute is not a UTC day's last): it raised OverflowError out of the router and the
    batch path alike, and the record stopped its partition at every restart."""
    with pytest.raises(ValueOutOfRangeError, match=reason):
        EventRouter(_counters(None, "iso8601")).route("t", _raw(text), None)
