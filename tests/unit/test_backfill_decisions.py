"""What a counter with ``since`` changes in a mutator: the hand-over offset splits the counting of its records
between the live mutators and the backfill, in the batch path as in the record path."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid

import pytest
from aiokafka import TopicPartition

from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.dead_letters import refused_by
from consumer.storage import MutatorEntry, PartitionId
from countersink.backfills import CounterDroppedDuringBackfillError, Span, backfill_partition
from countersink.commands.backfill import _instant, _offsets
from schemas.definitions import parse_definitions
from schemas.errors import DefinitionError, InvalidEventError
from schemas.events import EventRouter
from schemas.resets import Epochs, Reset, control_record
from tests.unit.memory_store import MemoryLog, MemoryResets, MemoryStore, run

COUNTERS = parse_definitions("""
[[counter]]
name = "trades"
topics = ["orders"]
kind = "count"
key = ["sym"]
event_id = "id"

[[counter]]
name = "shares"
topics = ["orders"]
kind = "sum"
key = ["sym"]
value = "qty"
event_id = "id"
since = "2026-11-01T00:00:00+01:00"
""")
ROUTER = EventRouter(COUNTERS)
# Ten trades of IBM, qty = offset + 1; offset 7 repeats the event id of offset 2 (a publisher retry).
RECORDS = [Record(o, json.dumps({"sym": "IBM", "qty": o + 1, "id": f"e{2 if o == 7 else o}"}).encode())
           for o in range(10)]


def _mutator(applier: Applier) -> Mutator:
    entry = MutatorEntry(uuid.uuid4(), "g", "orders", 0, "h", 1, 2)
    return Mutator(entry, PartitionId("g", "orders", 0), applier, applied_through=-1, flushed_through=-1)


def _values(mutator: Mutator) -> dict[str, object]:
    return {counter: state.value() for (counter, _), state in sorted(mutator.states.items())}


def test_since_is_earliest_or_a_time_with_its_offset() -> None:
    """``since`` takes "earliest" or an RFC 3339 time with its offset; anything else is refused by name."""
    assert COUNTERS["shares"].since_ms == 1_793_487_600_000  # 2026-10-31T23:00:00Z
    assert COUNTERS["trades"].since is None
    for bad in ("yesterday", "2026-11-01", "2026-11-01T00:00:00", "0"):
        text = f'[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "count"\nsince = "{bad}"\n'
        with pytest.raises(DefinitionError, match="since"):
            parse_definitions(text)


@pytest.mark.parametrize(("written", "reason"), [
    ('"2026-11-01T00:00:00+25:00"', "out of range"),  # Python's message named timedelta's bounds
    ('"2026-13-01T00:00:00Z"', "out of range"),
    ('"1969-12-31T23:59:59.999Z"', "before 1970"),  # -1 ms: Kafka's look-up refuses it (and -1 names the log end)
    ('"0001-01-01T00:00:00+01:00"', "before 1970"),
    ("2026-11-01T00:00:00", "has no offset"),  # TOML's own times, unquoted
    ("2026-11-01", "is a date"),
])
def test_since_outside_what_kafka_looks_up_is_refused_saying_why(written: str, reason: str) -> None:
    """A time Kafka cannot look up, or one without its offset, is refused naming ``since`` and why."""
    text = f'[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "count"\nsince = {written}\n'
    with pytest.raises(DefinitionError, match="since") as info:
        parse_definitions(text)
    assert reason in str(info.value)


def test_progress_lines_say_a_partition_with_nothing_to_count_has_no_offsets() -> None:
    # A reprocess from a time after a partition's last record (or a hand-over at the partition's first offset)
    # counts nothing there: not "offsets 41387..41386".
    assert _offsets(41_387, 41_387) == "no offsets"
    assert _offsets(41_387, 41_388) == "offsets 41387..41387"
    assert _offsets(0, 20_000) == "offsets 0..19999"


def test_since_written_as_a_toml_time_is_its_rfc_3339_text() -> None:
    """An unquoted TOML time with its offset is the time it writes (UTC as Z), the same instant as the text."""
    for written, text in (("2026-11-01T00:00:00Z", "2026-11-01T00:00:00Z"),
                          ("2026-11-01T01:00:00+01:00", "2026-11-01T01:00:00+01:00")):
        definition = parse_definitions(f'[[counter]]\nname = "a"\ntopics = ["t"]\nkind = "count"\nsince = {written}\n')
        assert (definition["a"].since, definition["a"].since_ms) == (text, 1_793_491_200_000)


@pytest.mark.parametrize("batch", [True, False])
def test_a_live_mutator_counts_the_counter_from_its_handover_on(batch: bool) -> None:
    """Hand-over 5: trades counts every record, shares only those at 5 and after; the retry at 7 of the event
    at 2 is dropped by both, as a mutator without the hand-over drops it."""
    applier = Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100))
    applier.start_counting({"shares": 5})
    mutator = _mutator(applier)
    if batch:
        mutator.apply_batch(RECORDS)
    else:
        for record in RECORDS:
            mutator.apply(record)
    assert _values(mutator) == {"shares": 6 + 7 + 9 + 10, "trades": 9}


def test_a_backfill_keeps_its_counter_only_and_the_two_sides_add_up() -> None:
    """A backfill applier over [0, 5) keeps shares only; with the live side from 5 on it makes what one
    mutator counting shares everywhere makes."""
    backfill = _mutator(Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), only=frozenset({"shares"})))
    assert backfill.applier.fast is None
    backfill.apply_batch(RECORDS[:5])
    live_applier = Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100))
    live_applier.start_counting({"shares": 5})
    live = _mutator(live_applier)
    live.apply_batch(RECORDS)
    whole = _mutator(Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100)))
    whole.apply_batch(RECORDS)
    assert _values(backfill) == {"shares": 1 + 2 + 3 + 4 + 5}
    assert _values(backfill)["shares"] + _values(live)["shares"] == _values(whole)["shares"]  # type: ignore[operator]


def test_a_reprocess_writes_the_epoch_it_is_given() -> None:
    """``epochs_from``: the states go to the reset's epoch's cell, whatever the log holds before its point."""
    applier = Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), only=frozenset({"shares"}),
                      epochs_from=Epochs({"shares": 3}, {}, {("shares", 3)}))
    assert applier.epochs.cell("shares", "IBM") == "shares@3"
    assert applier.epochs.cell("trades", "IBM") == "trades"


def test_a_reprocess_does_not_count_what_a_later_reset_moved_on() -> None:
    """Two resets at once: a reprocess of shares into epoch 3 meets, before its own point, the control record of
    a later reset (epoch 4, IBM only). What follows it for IBM belongs to epoch 4, which the live mutators
    count from that control record on: the reprocess counts IBM only before it (SAP throughout), so nothing is
    counted twice."""
    later = Reset("r4", "shares", 4, frozenset({"IBM"}))
    value, headers = control_record(later)
    records = [Record(0, b'{"sym": "IBM", "qty": 1, "id": "a"}'), Record(1, b'{"sym": "SAP", "qty": 2, "id": "b"}'),
               Record(2, value, headers=tuple(headers)),
               Record(3, b'{"sym": "IBM", "qty": 4, "id": "c"}'), Record(4, b'{"sym": "SAP", "qty": 8, "id": "d"}')]
    applier = Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), MemoryResets([later]),
                      only=frozenset({"shares"}), epochs_from=Epochs({"shares": 3}, {}, {("shares", 3)}))
    mutator = _mutator(applier)
    asyncio.run(applier.learn(records))
    mutator.apply_batch(records)
    assert {key: state.value() for (_, key), state in mutator.states.items()} == {"SAP": 2 + 8}
    assert applier.epochs.cell("shares", "IBM") == "shares@4"


def test_a_backfill_writes_nothing_once_its_counter_is_dropped() -> None:
    """The backfill looks at the registry before each flush and before its release: once the look says the
    counter is dropped it stops, and nothing is written after (``countersink drop`` deletes the counter's cells
    once every writer has looked; a later write would bring them back)."""
    store, log = MemoryStore(), MemoryLog([record.value for record in RECORDS])
    pid = PartitionId("g.backfill.shares", "orders", 0)
    seen: list[object] = []

    async def look() -> None:
        if len(seen) == 2:
            seen.append((store.partitions[pid], repr(store.shards)))
            raise CounterDroppedDuringBackfillError("counter 'shares' is dropped")
        seen.append(None)

    def applier() -> Applier:
        return Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), only=frozenset({"shares"}))

    with pytest.raises(CounterDroppedDuringBackfillError):
        run(backfill_partition(store, log, applier, Span("orders", 0, 0, 10), pid.consumer_group, "h",
                               flush_interval_s=0.0, flush_max_dirty=1, on_progress=lambda *_: None,
                               clock=lambda: 10**15, before_write=look))
    row, shards = seen[-1]  # type: ignore[misc]
    assert row.intent_offset >= 2  # two flushes were written before the drop was seen
    assert (store.partitions[pid], repr(store.shards)) == (row, shards)


class Sink:
    """The dead letters a backfill queues and sends, and whether each was delivered before the next write."""

    def __init__(self) -> None:
        self.queued: list[tuple[int, tuple[str, ...]]] = []
        self.delivered = 0

    def queue(self, tp: TopicPartition, record: Record, error: InvalidEventError) -> None:
        self.queued.append((record.offset, refused_by(error)))

    async def send(self, tp: TopicPartition, record: Record, error: InvalidEventError) -> None:
        self.queue(tp, record, error)

    async def deliver(self) -> None:
        self.delivered = len(self.queued)


def test_a_backfill_dead_letters_what_its_counter_refuses_below_the_handover() -> None:
    """Below H no live consumer sent the backfilled counter's refusals: the backfill sends them, restricted to
    it (a qty of the wrong type: shares refuses it, trades counted it), and delivered before its last write;
    a record refused whole (not JSON) is not sent again (every live consumer sent it)."""
    values = [record.value for record in RECORDS[:4]]
    values[1] = b'{"sym": "IBM", "qty": "lots", "id": "w"}'
    values[2] = b"{not json"
    store, log, sink = MemoryStore(), MemoryLog(values), Sink()

    def applier() -> Applier:
        return Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), only=frozenset({"shares"}))

    run(backfill_partition(store, log, applier, Span("orders", 0, 0, 4), "g.backfill.shares", "h",
                           flush_interval_s=0.0, flush_max_dirty=1, on_progress=lambda *_: None,
                           clock=lambda: 10**15, dead_letters=sink))
    assert sink.queued == [(1, ("shares",))]
    assert sink.delivered == 1


def test_a_backfill_whose_claims_are_spent_pauses_longer_each_time_then_gives_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim whose mutator was registered too late for the GC's cutoff (spent, retired unused) is made again
    by a fresh mutator after a pause that doubles each time (as the live consumer's retries do), and the
    backfill fails after 20 in a row; a claim that then succeeds counts the span and starts the pauses over."""
    from consumer.protocol import Claimant, ClaimUnresolvedError

    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    claim = Claimant.claim
    spent_first = [2]

    async def spent(self: Claimant, store: MemoryStore) -> object:
        if spent_first[0] > 0:
            spent_first[0] -= 1
            raise ClaimUnresolvedError("born not after the cutoff")
        return await claim(self, store)

    monkeypatch.setattr(Claimant, "claim", spent)

    def applier() -> Applier:
        return Applier(ROUTER, COUNTERS, "orders", 0, RetryWindow(100), only=frozenset({"shares"}))

    def backfill(store: MemoryStore) -> int:
        return run(backfill_partition(store, MemoryLog([r.value for r in RECORDS[:4]]), applier,
                                      Span("orders", 0, 0, 4), "g.backfill.shares", "h", flush_interval_s=0.0,
                                      flush_max_dirty=1, on_progress=lambda *_: None, clock=lambda: 10**15,
                                      pause=pause))

    store = MemoryStore()
    assert backfill(store) == 0
    assert store.shards  # the span counted, by the third mutator
    assert len(pauses) == 2
    assert 0.08 <= pauses[0] <= 0.12
    assert 0.16 <= pauses[1] <= 0.24
    pauses.clear()
    spent_first[0] = 10**6
    with pytest.raises(ClaimUnresolvedError):
        backfill(MemoryStore())
    assert len(pauses) == 19
    assert all(later > earlier for earlier, later in itertools.pairwise(pauses[:6]))
    assert max(pauses) <= 6.0


def test_a_backfill_compares_since_as_the_instant_it_names() -> None:
    """The file's since and the recorded one agree when they name one instant, however written; a record made
    before times before 1970 were refused is compared by its text."""
    assert _instant("2026-11-01T01:00:00+01:00") == _instant("2026-11-01T00:00:00Z")
    assert _instant("2026-11-01T00:00:00Z") != _instant("2026-11-01T00:00:01Z")
    assert _instant("earliest") is None
    assert _instant("1960-01-01T00:00:00Z") == "1960-01-01T00:00:00Z"


def _states_after(text: str, records: list[Record], starts: dict[str, int], path: str) -> dict[tuple[str, str], object]:
    """Each instance's state after ``records`` (quantiles by count, min and max: a KLL sketch compacts at random,
    so two runs of one path differ in their bytes), through the batch path or the record path."""
    from bench.shapes import TOPIC

    counters = parse_definitions(text)
    mutator = Mutator(MutatorEntry(uuid.uuid4(), "g", TOPIC, 0, "h", 0, 10**18), PartitionId("g", TOPIC, 0),
                      Applier(EventRouter(counters), counters, TOPIC, 0, RetryWindow(1000), starts=starts), -1, -1)
    if path == "batch":
        for first in range(0, len(records), 500):
            mutator.apply_batch(records[first:first + 500])
    else:
        for record in records:
            mutator.apply(record)
    return {ident: (lambda v: (v.count, v.min, v.max))(state.value()) if ident[0] == "latency" else state.to_bytes()
            for ident, state in mutator.states.items()}


def test_every_shape_counts_from_its_handovers_as_if_the_records_began_there() -> None:
    """Every live mutator counts each counter from its hand-over now, with since or without: on every shape of
    the bench (nested keys, buckets, exact decimals, each kind, the page views' nine counters with filters),
    hand-overs at H over the whole stream make the states of the records from H on, and hand-overs at 0 those of
    no hand-over, by either path."""
    import random

    from bench.shapes import SHAPES, TOPIC, event

    rng = random.Random(5)
    records = [Record(i, event(i, rng, 50)) for i in range(1500)]
    for name, text in SHAPES.items():
        names = [c.name for c in parse_definitions(text).for_topic(TOPIC)]
        plain = _states_after(text, records, {}, "batch")
        from_h = _states_after(text, [r for r in records if r.offset >= 611], {}, "batch")
        for path in ("batch", "record"):
            assert _states_after(text, records, dict.fromkeys(names, 0), path) == plain, (name, path)
            assert _states_after(text, records, dict.fromkeys(names, 611), path) == from_h, (name, path)


def test_a_reprocess_plan_of_a_reset_that_did_not_make_the_epoch_is_no_backfill(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reprocess records its plan under the epoch it means to claim, then claims it: one that lost the epoch
    to another reset (or was killed before its claim, and another reset took the epoch) left a plan that readers
    told of as a backfill under way forever, pointing at a reprocess that would reset every key again."""
    from countersink import backfills

    lost = {("orders", p): backfills.Handover("orders", p, None, 0, None, "trades.3.lost", "2026-11-01T00:00:00Z")
            for p in range(2)}
    ours = {("orders", p): backfills.Handover("orders", p, None, 0, None, "trades.3.made", "2026-11-01T00:00:00Z")
            for p in range(2)}
    plans = {"lost": lost, "ours": ours}
    which = ["lost"]

    async def read_handovers(client: object, group: str, cell: str) -> dict[object, backfills.Handover]:
        return plans[which[0]] if cell == "trades@3" else {}

    monkeypatch.setattr(backfills, "read_handovers", read_handovers)
    assert run(backfills.backfill_state(None, "trades", "g", None, 3, "trades.3.made")) is None  # type: ignore[arg-type]
    which[0] = "ours"
    told = run(backfills.backfill_state(None, "trades", "g", None, 3, "trades.3.made"))  # type: ignore[arg-type]
    assert told is not None
    assert told.startswith("backfilling: 0 of 2 partitions done")


def test_a_backfills_look_at_the_registry_is_as_old_as_the_reads_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A look taken as of when its read returned was younger than it is by the read's time (up to the request
    timeout): ``countersink drop`` waits out looks of ``registry_check_s`` at most, and a backfill went on
    writing on a look older than that."""
    import types

    from countersink import backfills
    from countersink.registry import CounterRegistry

    now = [1000.0]
    reads: list[float] = []

    async def refused(self: CounterRegistry, names: list[str]) -> dict[str, str]:
        reads.append(now[0])
        now[0] += 4.0  # the read takes four seconds
        return {}

    monkeypatch.setattr(backfills.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(CounterRegistry, "refused", refused)
    client = types.SimpleNamespace(settings=types.SimpleNamespace(replay_read_consistency=None, read_consistency=None))
    look = backfills.registry_look(client, "trades", check_s=10.0)  # type: ignore[arg-type]
    run(look())
    now[0] = 1000.0 + 5.0 + 0.5  # half of check_s after the read began, not yet after it returned
    run(look())
    assert reads == [1000.0, 1005.5]


@pytest.mark.parametrize(("reached", "told"), [
    ("", "nothing was reset: to count again, run countersink reprocess trades --from earliest"),
    ("planned", "nothing was reset: to count again, run countersink reprocess trades --from earliest"),
    ("published", "the counter reads the new epoch, which holds only what is counted again: run countersink "
                  "reprocess trades --from earliest (a new epoch, which supersedes this one)"),
    ("positions", "resume it: countersink backfill trades (it counts what is left)"),
    ("end orders/0", "resume it: countersink backfill trades (it counts what is left)"),
])
def test_a_reprocess_interrupted_says_what_to_run_next(monkeypatch: pytest.MonkeyPatch, reached: str,
                                                        told: str) -> None:
    """Ctrl-C ended a reprocess with exit 130 and no word: the counter may then read only what was counted
    again, and the operator had to find out which command goes on."""
    from structlog.testing import capture_logs

    from countersink.commands.backfill import Backfill
    from countersink.settings import Settings

    command = Backfill(Settings(), COUNTERS, "trades")

    async def interrupted(since: str, wait_s: int) -> int:
        if reached:
            command._reached(reached)
        raise asyncio.CancelledError

    monkeypatch.setattr(command, "_reprocess", interrupted)
    with capture_logs() as logs, pytest.raises(asyncio.CancelledError):
        run(command.reprocess("earliest", 30))
    assert [(e["step"], e["next_step"]) for e in logs if e["event"] == "reprocess_interrupted"] == [
        (reached or "none", told)]
