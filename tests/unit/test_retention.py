"""Retention of bucketed counters without servers: what a definition may say, which events are late (decided
from the record alone), and what a flush writes for a bucket past its retention."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.applying import Applier, Mutator, Outcome, Record, RetryWindow
from consumer.protocol import claim, finish_take_over, flush
from consumer.storage import MutatorEntry, PartitionId
from schemas import registry, timeseries
from schemas.cql import LAST_EXPIRY_S
from schemas.definitions import CounterDefinition, parse_definitions
from schemas.errors import DefinitionError
from schemas.events import EventRouter
from tests.unit.memory_store import MemoryLog, MemoryStore, run

HOUR = 3600
T0 = int(datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp())  # a bucket start
RETAINED = """
[[counter]]
name = "views"
topics = ["t"]
kind = "count"
key = ["page"]
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }
retain = "2h"
"""
COUNTERS = parse_definitions(RETAINED + """
[[counter]]
name = "views_forever"
topics = ["t"]
kind = "count"
key = ["page"]
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }
""")


def _raw(ts: int) -> bytes:
    return json.dumps({"page": "home", "ts": ts}).encode()


@pytest.mark.parametrize(("body", "complaint"), [
    ('key = ["page"]\nretain = "7d"', "bucketed counters only"),
    ('bucket = { field = "ts", size = "1d" }\nretain = "12h"', r"at least one bucket \(1d\)"),
    ('bucket = { field = "ts", size = "1h" }\nretain = "7 days"', "is not a retention"),
    ('bucket = { field = "ts", size = "1h" }\nretain = "4000d"', "at most 3650d"),
])
def test_retention_that_cannot_be_kept_is_refused(body: str, complaint: str) -> None:
    """retain needs a bucket, at least one bucket's length, a duration like 7d, and at most ten years."""
    with pytest.raises(DefinitionError, match=complaint):
        parse_definitions(f'[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\n{body}\n')


def test_retention_is_in_weeks_days_hours_or_minutes_and_part_of_the_meaning() -> None:
    """2w is 14 days, and the same retention as 14d. A bucket's rows expire with the retention they were
    written under, so retention is part of the registry's fingerprint: setting, changing or removing it is a
    changed meaning, written in its largest whole unit."""
    def kept(retain: str) -> CounterDefinition:
        return parse_definitions('[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "count"\n'
                                 f'bucket = {{ field = "ts", size = "1d" }}\nretain = "{retain}"\n')["c"]

    two_weeks, fourteen_days, three_days = kept("2w"), kept("14d"), kept("3d")
    assert two_weeks.retain_seconds == fourteen_days.retain_seconds == 14 * 86400
    assert registry.fingerprint(two_weeks) == registry.fingerprint(fourteen_days)
    assert registry.fingerprint(two_weeks) != registry.fingerprint(three_days)
    forever = COUNTERS["views_forever"].model_copy(update={"name": "views"})
    assert registry.fingerprint(COUNTERS["views"]) != registry.fingerprint(forever)
    assert registry.changes(forever, COUNTERS["views"]) == ['retain: null -> "2h"']
    assert registry.changes(COUNTERS["views"], forever) == ['retain: "2h" -> null']


def test_an_event_is_late_when_its_record_was_written_after_its_bucket_expired() -> None:
    """The 10:00 bucket, kept 2h after it ends, expires at 13:00: a record written at 12:59:59.999 counts,
    one written at 13:00 does not (for the counter with retention only) and is reported late; a record
    without a timestamp counts."""
    late: list[str] = []
    router = EventRouter(COUNTERS, on_late=late.append)
    expiry_ms = (T0 + 3 * HOUR) * 1000
    assert {u.counter for u in router.route("t", _raw(T0 + 17), expiry_ms - 1)} == {"views", "views_forever"}
    assert late == []
    assert {u.counter for u in router.route("t", _raw(T0 + 17), expiry_ms)} == {"views_forever"}
    assert late == ["views"]
    assert {u.counter for u in router.route("t", _raw(T0 + 17), None)} == {"views", "views_forever"}


def test_lateness_does_not_depend_on_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay a year later decides exactly as the first reading did: the router never reads the clock."""
    record = (_raw(T0 + 5), (T0 + 2 * HOUR) * 1000)
    first = EventRouter(COUNTERS).route("t", *record)
    monkeypatch.setattr(time, "time", lambda: T0 + 365 * 86400.0)
    monkeypatch.setattr(time, "time_ns", lambda: (T0 + 365 * 86400) * 10**9)
    assert EventRouter(COUNTERS).route("t", *record) == first


def test_a_late_event_is_neither_counted_nor_invalid() -> None:
    """A mutator takes a late event as filtered: nothing applied, nothing for the dead-letter topic; an event
    that is late and also invalid is still invalid."""
    retained = parse_definitions(RETAINED)
    applier = Applier(EventRouter(retained), retained, "t", 0, RetryWindow(10))
    entry = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", born_us=1, expires_us=10**18)
    mutator = Mutator(entry, PartitionId("g", "t", 0), applier, applied_through=-1, flushed_through=-1)
    late_at = (T0 + 3 * HOUR) * 1000
    assert mutator.apply(Record(0, _raw(T0 + 1), late_at)) == (Outcome.FILTERED, None)
    outcome, error = mutator.apply(Record(1, b'{"page": "home", "ts": "noon"}', late_at))
    assert outcome is Outcome.INVALID
    assert error is not None
    assert mutator.states == {}


def test_a_flush_marks_each_write_with_its_buckets_expiry_and_a_replay_does_too() -> None:
    """Shard writes of a counter with retention carry the expiry of their bucket (its end plus retain); those
    of a counter kept forever carry none; a successor's replay of the same window writes the same."""
    store, log = MemoryStore(), MemoryLog([_raw(T0 + 60)], [0])
    written: list[tuple[str, int | None]] = []
    original = store.write_shards

    async def spy(mutator: uuid.UUID, born_us: int, timestamp_us: int, writes: list, *, source: bytes) -> None:  # type: ignore[type-arg]
        written.extend((w.counter, w.expires_at) for w in writes)
        await original(mutator, born_us, timestamp_us, writes, source=source)

    store.write_shards = spy  # type: ignore[method-assign]

    def applier() -> Applier:
        return Applier(EventRouter(COUNTERS), COUNTERS, "t", 0, RetryWindow(10))

    entry = MutatorEntry(uuid.UUID(int=1), "g", "t", 0, "h", born_us=1_000, expires_us=10**15)
    run(finish_take_over(store, log, run(claim(store, entry, -1)), applier, lambda: 1_000))
    mutator = Mutator(entry, PartitionId("g", "t", 0), applier(), applied_through=-1, flushed_through=-1)
    mutator.apply_batch(log.records)
    run(flush(store, mutator, 2_000))
    expected = [("views", T0 + 3 * HOUR), ("views_forever", None)]
    assert sorted(written) == expected
    assert timeseries.expiry(COUNTERS["views"], f"home|{timeseries.iso(T0)[:16]}Z") == T0 + 3 * HOUR
    written.clear()
    successor = MutatorEntry(uuid.UUID(int=2), "g", "t", 0, "h", born_us=10**9, expires_us=10**15)
    run(finish_take_over(store, log, run(claim(store, successor, -1)), applier, lambda: 10**9))  # replays 0..0
    assert sorted(written) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=(LAST_EXPIRY_S - 4 * HOUR) // HOUR), min_size=1,
                max_size=50), st.sampled_from(["home", "a|b", "x" * 100, ""]))
def test_a_buckets_expiry_is_its_end_plus_retain_whatever_buckets_came_before(hours: list[int], page: str) -> None:
    """The expiry of a key's bucket, read from the key (the bucket's start is kept for the buckets seen last: a
    flush asks it of every retained instance), is the bucket's end plus retain, for buckets seen before or not,
    and after more distinct buckets than are kept (the test's buckets run into the thousands)."""
    definition = COUNTERS["views"]
    for hour in hours:
        start = hour * HOUR
        key = timeseries.bucket_key(definition, page.replace("|", "\\|"), start)
        assert timeseries.expiry(definition, key) == start + HOUR + 2 * HOUR
