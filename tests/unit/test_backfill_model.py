"""The protocol model (``tests/unit/test_protocol_model.py``) with a backfill among its rules.

``shares`` has ``since = "earliest"``: the live processes (the consumer's own :class:`Ownership`) count it from
its hand-over offset H, recorded once by the first mutator that gets to it (an LWT that may fail or apply with
its answer lost, like every other); ``countersink backfill``'s own :func:`backfill_partition` runs, one storage
operation at a time, in a group of its own over [0, H): started any time H is recorded, killed at any step,
two at once, its writes held, reordered or lost, its mutators folded by the GC. Resets are in the logs too.
After the counter is added, processes still running the definitions without it claim the partition too (a
rolling deploy, in any order with the new processes' claims, proposals and confirmations of H): each must
refuse the partition (and exit) once a hand-over is there, before it counts anything.

Beside the model's invariants (each shard is exactly its mutator's records, shards of an instance never hold
the same record, reads stay between what the committed and the intent offsets justify), a live mutator's
``shares`` shard holds only records from H on, and a backfill's only records below H. At the end, once one
last backfill has run to completion after the final takeover, every instance reads exactly the log. The
mutants: a backfill that stops one record short of H (a gap), and a hand-over recorded without IF NOT EXISTS,
so that each live mutator records its own start and the backfill reads a later one than the first live
mutator counted from (an overlap); a claim that does not read the hand-overs (a process without the counter
counts past H); and, played step by step, a proposal counted from at once (the race its confirmation closes).
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Collection
from typing import Any, ClassVar, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from consumer.applying import Applier, RetryWindow
from consumer.dead_letters import DeadLetters
from consumer.flushing import Flushing
from consumer.handovers import Recorded
from consumer.protocol import ClaimUnresolvedError, FencedError
from consumer.storage import PartitionId, PartitionRow
from countersink.backfills import Span, backfill_group, backfill_partition
from schemas.definitions import CounterSet, parse_definitions
from schemas.events import EventRouter
from schemas.kinds import state_from_bytes
from schemas.resets import current_epochs, split_cell
from tests.unit.memory_store import Fault, Instance, MemoryLog, MemoryStore, StoreTimeoutError, Task, run
from tests.unit.test_protocol_model import (
    CONFIG,
    FAULTS,
    MAX_ACTORS,
    MODEL_SETTINGS,
    MUST_FAIL_SETTINGS,
    OPS,
    PICK,
    PID,
    RESETS,
    RETRY_WINDOW,
    TOPIC,
    TP,
    Actor,
    Control,
    DeadLetterTopic,
    Event,
    KafkaPositions,
    ProtocolModel,
    ProtocolViolation,
    RetryEachStep,
    collect,
    counted,
    reset_points,
    run_model,
)

BEFORE = parse_definitions(
    """
[[counter]]
name = "trades"
topics = ["orders"]
kind = "count"
key = ["sym"]
event_id = "id"
"""
)
COUNTERS_TEXT = """
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
since = "earliest"
"""
COUNTERS = parse_definitions(COUNTERS_TEXT)
ROUTER = EventRouter(COUNTERS)
ROUTER_BEFORE = EventRouter(BEFORE)
# shares added without since: no backfill; it is counted from its hand-over on.
WITHOUT_SINCE = parse_definitions(COUNTERS_TEXT.replace('since = "earliest"\n', ""))
ROUTER_WITHOUT_SINCE = EventRouter(WITHOUT_SINCE)
BACKFILLED = "shares"
BACKFILL_GROUP = backfill_group(PID.consumer_group, BACKFILLED)
BACKFILL_PID = PartitionId(BACKFILL_GROUP, TOPIC, PID.partition)


async def _no_pause(seconds: float) -> None:
    """The model steps every task's storage operations itself, with no event loop and a clock of its own: a
    spent claim is made again at the next step (the pause between them is the scheduler's choice)."""


class MemoryHandovers:
    """:class:`consumer.handovers.HandoverBook` over the model's store: each write an LWT behind the store's fault
    gate (it may fail, or apply with its answer lost), the partition's read a read behind it."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.recorded: dict[tuple[str, str, str, int], Recorded] = {}

    def confirmed_at(self, where: tuple[str, str, str, int]) -> int | None:
        found = self.recorded.get(where)
        return found.offset if found is not None and found.confirmed else None

    async def confirmed(self, group: str, topic: str, partition: int, counters: Collection[str]) -> dict[str, int]:
        await self.store._read("read_confirmed", partition)
        return {c: offset for c in counters if (offset := self.confirmed_at((group, c, topic, partition))) is not None}

    def record(self, where: tuple[str, str, str, int], offset: int, mutator: uuid.UUID) -> Recorded:
        """INSERT ... IF NOT EXISTS: the first proposal stays."""
        return self.recorded.setdefault(where, Recorded(offset, mutator, confirmed=False))

    async def propose(self, group: str, topic: str, partition: int, counter: str, offset: int,
                      mutator: uuid.UUID) -> Recorded:
        fault = await self.store._lwt("propose_handover", counter)
        found = self.record((group, counter, topic, partition), offset, mutator)
        self.store._answer(fault, True)
        return found

    async def supersede(self, group: str, topic: str, partition: int, counter: str, offset: int,
                        mutator: uuid.UUID, proposed_by: uuid.UUID) -> Recorded:
        fault = await self.store._lwt("supersede_handover", counter)
        where = (group, counter, topic, partition)
        found = self.recorded[where]
        if found.mutator == proposed_by and not found.confirmed:
            found = self.recorded[where] = Recorded(offset, mutator, confirmed=False)
        self.store._answer(fault, True)
        return found

    async def confirm(self, group: str, topic: str, partition: int, counter: str, mutator: uuid.UUID) -> Recorded:
        fault = await self.store._lwt("confirm_handover", counter)
        where = (group, counter, topic, partition)
        found = self.recorded[where]
        if found.mutator == mutator and not found.confirmed:
            found = self.recorded[where] = dataclasses.replace(found, confirmed=True)
        self.store._answer(fault, True)
        return found

    async def foreign(self, group: str, topic: str, partition: int, known: Collection[str]) -> list[str]:
        await self.store._read("read_handovers", partition)
        return sorted({c for (g, c, t, p) in self.recorded if (g, t, p) == (group, topic, partition)} - set(known))


class PerGroupHistoryStore(MemoryStore):
    """Keeps the history of the live group's ownership row only: the backfill's row moves on its own."""

    def _set_row(self, pid: PartitionId, row: PartitionRow) -> None:
        if pid == PID:
            super()._set_row(pid, row)
        else:
            self.partitions[pid] = row


class BackfillModel(ProtocolModel):
    """The protocol model with a counter backfilled beside the live processes (module docstring)."""

    store_class = PerGroupHistoryStore
    handovers_class: ClassVar[type[MemoryHandovers]] = MemoryHandovers
    end_shift: ClassVar[int] = 0  # where the backfill stops, from H: a mutant shifts it
    # The definitions of the processes started once shares is added, and whether shares is backfilled below H.
    after: ClassVar[tuple[EventRouter, CounterSet]] = (ROUTER, COUNTERS)
    backfilled: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.handovers = self.handovers_class(self.store)
        self.backfills: list[Task] = []
        self.finished_backfills = 0
        self.added = False  # the live processes started since have shares among their definitions
        self.old_next = False  # the next process started runs the definitions without shares (a rolling deploy)
        self.old: set[str] = set()  # the processes running the definitions without shares
        self.refused = 0  # processes that refused the partition and exited
        self.counted_from: int | None = None  # where shares is counted from, when no hand-over says so

    # ------------------------------------------------------------------------------------ helpers

    @property
    def handover(self) -> int | None:
        """Where shares is counted from by the live processes: its recorded hand-over (or, for a mutant that
        records none, where the scenario says the first process with it counted from)."""
        recorded = self.handovers.confirmed_at((PID.consumer_group, BACKFILLED, TOPIC, PID.partition))
        return self.counted_from if recorded is None else recorded

    def new_actor(self, skew_us: int) -> Actor:
        actor = super().new_actor(skew_us)
        retry = RetryEachStep(CONFIG, lambda: None)
        dead_letters = DeadLetters(cast(AIOKafkaProducer, DeadLetterTopic()), CONFIG)
        # Before shares is added, the deployment counts trades only; after, a process may still run the old
        # definitions (a rolling deploy: not every process is restarted yet, or one is rolled back).
        old = not self.added or self.old_next
        router, counters = (ROUTER_BEFORE, BEFORE) if old else self.after
        if old:
            self.old.add(actor.name)
        actor.ownership = self.ownership_class(
            CONFIG, actor.name, router, counters, self.store, self.log, cast(AIOKafkaConsumer, KafkaPositions()),
            dead_letters, retry, clock=actor.ownership.clock, new_id=actor.ownership.new_id,
            spawn=actor.ownership.spawn, resets=self.resets, handovers=self.handovers)
        actor.flushing = Flushing(self.store, actor.ownership, dead_letters, retry)
        return actor

    def backfill(self, handover: int) -> Any:
        def applier() -> Applier:
            return Applier(ROUTER, COUNTERS, TOPIC, PID.partition, RetryWindow(RETRY_WINDOW), self.resets,
                           only=frozenset({BACKFILLED}))

        span = Span(TOPIC, PID.partition, 0, handover + self.end_shift)
        return backfill_partition(self.store, self.log, applier, span, BACKFILL_GROUP, "backfill",
                                  flush_interval_s=0.0, flush_max_dirty=1,
                                  on_progress=lambda *_: None, clock=lambda: self.now_us, pause=_no_pause)

    def running(self) -> list[Task]:
        return super().running() + self.backfills

    def after_task_step(self, task: Task) -> None:
        if task in self.backfills:
            if task.done:
                self.backfills.remove(task)
                # A run that fails (a timeout, fenced by another run, a lost claim answer) exits; the next goes on.
                if task.error is not None and not isinstance(
                        task.error, StoreTimeoutError | FencedError | ClaimUnresolvedError):
                    raise task.error
                self.finished_backfills += task.error is None
            return
        super().after_task_step(task)

    def observe(self, actor: Actor) -> None:
        """A process that refused the partition (a hand-over of a counter it lacks) exits: it never acts again."""
        super().observe(actor)
        if actor.ownership.refusal is not None and not actor.gone:
            if actor.name not in self.old:
                raise self.violation(f"{actor.name} runs the definitions with shares and refused the partition")
            if actor.task is not None:
                actor.task.abandon()
            for background in actor.background:
                background.task.abandon()
            actor.task, actor.background, actor.gone = None, [], True
            self.refused += 1

    def is_backfill(self, mutator: uuid.UUID) -> bool:
        entry = self.store.mutators.get(mutator)
        return entry is not None and entry.consumer_group == BACKFILL_GROUP

    def shares_only(self, values: dict[Instance, int]) -> dict[Instance, int]:
        return {i: v for i, v in values.items() if i[0] == BACKFILLED}

    # ------------------------------------------------------------------------------------ rules

    @precondition(lambda self: not self.added)
    @rule()
    def add_the_counter(self) -> None:
        """shares is added to the definitions: every process running the old ones is killed (kill -9: the
        windows they left open are replayed by processes that know shares), and every process started from
        now on counts it from its hand-over offset."""
        for actor in self.live():
            if actor.task is not None:
                actor.task.abandon()
            for background in actor.background:
                background.task.abandon()
            actor.task, actor.background, actor.gone = None, [], True
        self.added = True

    @precondition(lambda self: self.added and len(self.live()) < MAX_ACTORS)
    @rule(skew=st.sampled_from((0, 2_000_000)), ops=OPS, fault=FAULTS)
    def old_owner(self, skew: int, ops: int, fault: Fault) -> None:
        """A process still running the definitions without shares is assigned the partition after shares was
        added (a rolling deploy, in any order with the new processes' claims and hand-overs)."""
        self.old_next = True
        try:
            self.new_owner(skew, ops, fault)
        finally:
            self.old_next = False

    @precondition(lambda self: self.added and len(self.live()) < MAX_ACTORS)
    @rule(at=st.sampled_from(("read_handovers", "propose_handover", "read_partition")))
    def new_owner_frozen_in_its_handover(self, at: str) -> None:
        """A process with shares is assigned the partition and freezes in its takeover right after the
        operation ``at`` (its look at the hand-overs, its proposal, its check that it still owns the
        partition), so that other processes claim, look and count in between."""
        self.new_owner(0, 10**6, Fault.NONE, stop_at=frozenset((at,)))

    @precondition(lambda self: self.backfilled and self.handover is not None and len(self.backfills) < 2)
    @rule(ops=OPS, fault=FAULTS)
    def start_backfill(self, ops: int, fault: Fault) -> None:
        """``countersink backfill shares`` starts (a second may run at once: they fence each other)."""
        assert self.handover is not None
        task = Task("backfill", self.backfill(self.handover))
        self.backfills.append(task)
        self.drive(task, ops, fault)

    @precondition(lambda self: bool(self.backfills))
    @rule(i=PICK)
    def kill_backfill(self, i: int) -> None:
        """kill -9 of a backfill run: what it held in flight may still land."""
        self.backfills.pop(i % len(self.backfills)).abandon()

    # ------------------------------------------------------------------------------------ invariants

    @invariant()
    def every_shard_is_what_its_mutator_consumed(self) -> None:
        """Each visible shard is exactly its mutator's records from its start to its through offset, live
        ``shares`` shards from H on, backfill shards below H; no two shards of an instance hold one record."""
        live_row, backfill_row, handover = self.row(), self.store.partitions.get(BACKFILL_PID), self.handover
        for cell, key in sorted(self.store.shards):
            counter, epoch = split_cell(cell)
            ranges: list[tuple[int, int, uuid.UUID]] = []
            for shard in self.store.snapshot(cell, key).shards:
                start = self.store.starts.get(shard.mutator)
                if start is None:
                    raise self.violation(f"shard of {shard.mutator}, which never started consuming")
                backfill = self.is_backfill(shard.mutator)
                row = backfill_row if backfill else live_row
                if row is None or shard.through_offset > row.intent_offset:
                    raise self.violation(f"{cell}/{key} shard of {shard.mutator} is through "
                                         f"{shard.through_offset}, beyond its group's intent offset")
                first = start
                if counter == BACKFILLED and not backfill:
                    if handover is None:
                        raise self.violation(f"{cell}/{key}: live shard of {shard.mutator} with no hand-over recorded")
                    first = max(first, handover)
                if backfill and counter != BACKFILLED:
                    raise self.violation(f"{cell}/{key}: the backfill wrote {counter}")
                expected = self.truth(max(first, self.point(counter, epoch) + 1), shard.through_offset,
                                      cell).get((counter, key), 0)
                value = state_from_bytes(shard.state).value()
                if value != expected:
                    raise self.violation(f"{cell}/{key} shard of {shard.mutator}{' (backfill)' if backfill else ''} "
                                         f"holds {value}, but records {first}..{shard.through_offset} make {expected}")
                if first <= shard.through_offset:
                    ranges.append((first, shard.through_offset, shard.mutator))
            ranges.sort()
            for (_, end, one), (begin, _, other) in itertools.pairwise(ranges):
                if begin <= end:
                    raise self.violation(f"{cell}/{key}: shards of {one} and {other} both hold record {begin}")

    @invariant()
    def readable_value_is_between_committed_and_intent(self) -> None:
        """trades as in the model; shares between what the live group's offsets justify from H on plus what
        the backfill's offsets justify below H."""
        row = self.row()
        if row is None:
            return
        seen = self.readable()
        low, high = dict(self.truth(0, row.committed_offset)), dict(self.truth(0, row.intent_offset))
        for part in (low, high):
            for instance in list(self.shares_only(part)):
                del part[instance]
        handover, backfill_row = self.handover, self.store.partitions.get(BACKFILL_PID)
        for bounds, offset_of in ((low, "committed_offset"), (high, "intent_offset")):
            parts = []
            if handover is not None:
                parts.append(self.shares_only(self.truth(handover, getattr(row, offset_of))))
            if backfill_row is not None:
                parts.append(self.shares_only(self.truth(0, getattr(backfill_row, offset_of))))
            for part in parts:
                for instance, value in part.items():
                    bounds[instance] = bounds.get(instance, 0) + value
        for instance in sorted(set(low) | set(high) | set(seen)):
            value = seen.get(instance, 0)
            if not low.get(instance, 0) <= value <= high.get(instance, 0):
                raise self.violation(f"{instance} reads {value}; committed truth {low.get(instance, 0)}, "
                                     f"intent truth {high.get(instance, 0)} (hand-over {handover})")

    def teardown(self) -> None:
        """Everyone stops, every write in flight lands, one last process takes the partition over and one last
        backfill runs to its end: every instance then reads exactly the log up to where the last owner starts,
        before and after a GC."""
        for task in self.backfills:
            task.abandon()
        self.backfills = []
        for actor in self.actors:
            if actor.task is not None:
                actor.task.abandon()
            for background in actor.background:
                background.task.abandon()
        for task in self.gc_tasks:
            task.abandon()
        while self.store.held:
            self.store.deliver(0)
        if not self.log.records:
            return
        if not self.added:
            self.add_the_counter()
        last = self.new_actor(0)
        run(last.ownership.take([TP]))
        for background in last.background:
            error = background.task.finish().error
            if error is not None:
                raise error
        assert last.mutator is not None
        handover = self.handover
        if handover is None:
            raise self.violation("the final takeover recorded no hand-over")
        if self.backfilled:
            run(self.backfill(handover))
        start_offset = last.mutator.applied_through + 1
        for phase in ("after the final takeover and backfill", "after a full GC"):
            self.every_shard_is_what_its_mutator_consumed()
            expected, seen = self.truth(0, start_offset - 1), self.readable()
            if not self.backfilled:  # shares counted from where the first process with it started, not before
                expected = {i: v for i, v in expected.items() if i[0] != BACKFILLED} | self.shares_only(
                    self.truth(handover, start_offset - 1))
            for instance in sorted(set(expected) | set(seen)):
                if expected.get(instance, 0) != seen.get(instance, 0):
                    raise self.violation(f"{phase}, {instance} reads {seen.get(instance, 0)} but records "
                                         f"0..{start_offset - 1} make {expected.get(instance, 0)} (hand-over "
                                         f"{handover})")
            self.now_us += 10**9
            run(collect(self.store, self.now_us, self.epochs))


class GapModel(BackfillModel):
    """The backfill stops one record short of the hand-over offset."""

    end_shift = -1


class LastStartWinsHandovers(MemoryHandovers):
    """The hand-over written without IF NOT EXISTS: each live mutator records (and counts from) its own start."""

    def record(self, where: tuple[str, str, str, int], offset: int, mutator: uuid.UUID) -> Recorded:
        self.recorded[where] = Recorded(offset, mutator, confirmed=True)
        return self.recorded[where]

    async def confirmed(self, group: str, topic: str, partition: int, counters: Collection[str]) -> dict[str, int]:
        return {}  # nothing is looked up before writing


class OverlapModel(BackfillModel):
    handovers_class = LastStartWinsHandovers


class UnguardedHandovers(MemoryHandovers):
    """A claim that does not look at the partition's hand-overs: a process without shares counts past H."""

    async def foreign(self, group: str, topic: str, partition: int, known: Collection[str]) -> list[str]:
        await self.store._read("read_handovers", partition)
        return []


class UnguardedModel(BackfillModel):
    handovers_class = UnguardedHandovers


class ConfirmedAtOnceHandovers(MemoryHandovers):
    """A hand-over counted from as soon as it is proposed, without the proposer checking that it still owns the
    partition: a process without shares that claimed in between, and looked before the proposal landed,
    counts past H."""

    def record(self, where: tuple[str, str, str, int], offset: int, mutator: uuid.UUID) -> Recorded:
        return self.recorded.setdefault(where, Recorded(offset, mutator, confirmed=True))


class ConfirmedAtOnceModel(BackfillModel):
    handovers_class = ConfirmedAtOnceHandovers


def test_a_backfill_joins_the_live_mutators_with_no_gap_and_no_overlap() -> None:
    """Under every fault of the model, kill -9 of backfill runs and of live processes, two backfills at once,
    resets and the GC, every event of the backfilled counter is counted exactly once: below H by the
    backfill, from H on by the live mutators."""
    run_model(BackfillModel, settings(MODEL_SETTINGS, max_examples=200))


def test_model_catches_a_backfill_that_stops_short_of_the_handover() -> None:
    """A gap at the hand-over: the record just below H is counted by nobody."""
    with pytest.raises(ProtocolViolation):
        run_model(GapModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_handover_recorded_by_every_mutator() -> None:
    """An overlap at the hand-over: without IF NOT EXISTS a later live mutator moves H on, and the backfill counts
    records an earlier live mutator counted."""
    with pytest.raises(ProtocolViolation):
        run_model(OverlapModel, MUST_FAIL_SETTINGS)



def counting_before_shares(model_class: type[BackfillModel]) -> BackfillModel:
    """Twelve records; a process of the deployment before shares claims the partition and counts three; then
    shares is added to the definitions."""
    model = model_class()
    entries = [Event("IBM", 1 + i % 5, f"e{i}") for i in range(12)]
    model.log = MemoryLog([e.to_bytes() for e in entries])
    model.contributions = counted(entries, list(range(len(entries))))
    model.new_owner(0, 10**6, Fault.NONE)  # the deployment before shares
    model.work(0, 3, 10**6, Fault.NONE)
    model.add_the_counter()
    return model


def rolling_deploy_after_a_handover(model_class: type[BackfillModel]) -> BackfillModel:
    """A process with shares claims the partition and records H; then a process still without shares is
    assigned it (a rolling deploy), counts four records and releases it; then the model's teardown (a last
    process with shares, one backfill to the end) checks every value against the log."""
    model = counting_before_shares(model_class)
    model.new_owner(0, 10**6, Fault.NONE)  # proposes and confirms H = 3
    model.work(0, 2, 10**6, Fault.NONE)
    model.old_owner(0, 10**6, Fault.NONE)  # still without shares, assigned the partition after H
    old = [i for i, actor in enumerate(model.live()) if actor.name in model.old]
    if old:  # not refused: it counts on without shares, and releases the partition
        model.work(old[0], 4, 10**6, Fault.NONE)
        model.begin_release(old[0], 10**6, Fault.NONE)
    model.teardown()
    return model


def test_a_process_without_the_counter_assigned_after_a_handover_loses_nothing() -> None:
    """The rolling deploy step by step: the process without shares refuses the partition, and every value is
    exact once a process with shares and the backfill have run."""
    model = rolling_deploy_after_a_handover(BackfillModel)
    assert model.handover == 3
    assert model.refused == 1


def test_the_rolling_deploy_loses_records_without_the_claims_look_at_the_handovers() -> None:
    """The same rolling deploy with the mutant that does not look: the process without shares counts past H, and
    shares loses those records. Played step by step: the random search found this mutant alone, but not always
    after the rest of the unit suite had run in the same process."""
    with pytest.raises(ProtocolViolation):
        rolling_deploy_after_a_handover(UnguardedModel)


def rolling_deploy_race(model_class: type[BackfillModel]) -> BackfillModel:
    """A process with shares claims the partition and freezes after its look at the hand-overs; a process still
    without shares claims it from it, looks (nothing recorded yet) and finishes its takeover; the first then
    proposes its start as H; the second counts four records and releases the partition; then the model's
    teardown (a last process with shares, one backfill to the end) checks every value against the log."""
    model = counting_before_shares(model_class)
    model.new_owner_frozen_in_its_handover("read_handovers")
    model.old_owner(0, 10**6, Fault.NONE)
    model.advance(0, 10**6, Fault.NONE)  # the first one's proposal lands after the second one looked
    model.work(0, 4, 10**6, Fault.NONE)  # the process without shares counts on (it saw no hand-over)
    model.begin_release(0, 10**6, Fault.NONE)  # and hands over cleanly: no window left open to replay
    model.teardown()
    return model


def test_a_proposal_that_lands_after_a_claim_without_the_counter_is_superseded() -> None:
    """The rolling-deploy race: a hand-over proposed by a mutator that lost the partition to a process without
    the counter is never confirmed; the next mutator with the counter supersedes it with its own start, past
    everything the process without it counted, and the backfill counts up to there: every value is exact."""
    model = rolling_deploy_race(BackfillModel)
    assert model.handover is not None
    assert model.handover >= 3 + 4


def test_the_race_loses_records_when_a_proposal_is_counted_from_at_once() -> None:
    """The same race with the mutant that counts from a proposal at once: the records the process without
    the counter flushed after H are counted by nobody for shares."""
    with pytest.raises(ProtocolViolation):
        rolling_deploy_race(ConfirmedAtOnceModel)


def test_a_reset_read_by_a_process_without_the_counter_is_placed_for_the_one_with_it() -> None:
    """A reset of shares whose control record (offset 0) is applied and flushed by a process still without shares
    (its command died before recording where it sits): the process records its position all the same, so the
    first process with shares, starting past it (H = 1), counts IBM in the reset's epoch, where it is read. Without
    that position it counted IBM into the epoch before the reset, which nobody reads: the events from H on were
    lost for shares (found by the model with seed 57982584209550448250945462413003032383)."""
    model = BackfillModel()
    reset = next(r for r in RESETS if r.counter == BACKFILLED)
    entries: list[Event | Control] = [Control(reset)] + [Event("IBM", 1 + i, f"e{i}") for i in range(6)]
    offsets = list(range(len(entries)))
    records = [e.to_record() if isinstance(e, Control) else (e.to_bytes(), []) for e in entries]
    model.log = MemoryLog([value for value, _ in records], offsets, headers=[h for _, h in records])
    model.contributions = counted(entries, offsets)
    model.points = reset_points(entries, offsets)
    model.resets.resets = {reset.reset_id: reset}
    model.epochs = current_epochs([reset])
    model.new_owner(0, 10**6, Fault.NONE)  # the deployment before shares
    model.work(0, 1, 10**6, Fault.NONE)  # applies the control record and commits it
    model.add_the_counter()
    model.new_owner(0, 10**6, Fault.NONE)  # proposes and confirms H = 1
    assert model.handover == 1
    model.work(0, 6, 10**6, Fault.NONE)
    model.begin_release(0, 10**6, Fault.NONE)  # commits its window: no replay puts IBM right afterwards
    row = model.row()
    assert row is not None
    assert row.committed_offset == 6
    model.readable_value_is_between_committed_and_intent()
    model.teardown()


class AddedWithoutSinceModel(BackfillModel):
    """shares is added without since: nothing is backfilled, and it is counted from where the first process with
    it started in the partition (its hand-over there)."""

    after = (ROUTER_WITHOUT_SINCE, WITHOUT_SINCE)
    backfilled = False


class UnrecordedHandovers(MemoryHandovers):
    """A counter without since records no hand-over (every counter here has none): as before every counter had one."""

    def record(self, where: tuple[str, str, str, int], offset: int, mutator: uuid.UUID) -> Recorded:
        return Recorded(offset, mutator, confirmed=True)


class UnrecordedWithoutSinceModel(AddedWithoutSinceModel):
    handovers_class = UnrecordedHandovers


def test_a_process_without_a_counter_added_without_since_refuses_a_partition_it_is_counted_in() -> None:
    """The rolling deploy step by step, shares added without since: the process still without it refuses the
    partition once a process with it has counted there, and shares reads every record from where that one
    counted from: H = 3, its start offset. The window the process before shares left open (records 0..2) is
    replayed into that process's shards, where shares has none to add to (it never counted it)."""
    model = rolling_deploy_after_a_handover(AddedWithoutSinceModel)
    assert model.handover == 3
    assert model.refused == 1


def test_a_counter_added_without_since_loses_records_when_it_records_no_handover() -> None:
    """The same rolling deploy when only a counter with since records hand-overs: the process without shares
    counts four records past where shares is counted from, and shares loses them, silently."""
    def deploy() -> BackfillModel:
        model = counting_before_shares(UnrecordedWithoutSinceModel)
        model.counted_from = 0  # the first process with shares counts from there (the window it replays)
        model.new_owner(0, 10**6, Fault.NONE)
        model.work(0, 2, 10**6, Fault.NONE)
        model.old_owner(0, 10**6, Fault.NONE)
        old = [i for i, actor in enumerate(model.live()) if actor.name in model.old]
        assert old, "nothing recorded: the process without shares is not refused"
        model.work(old[0], 4, 10**6, Fault.NONE)
        model.begin_release(old[0], 10**6, Fault.NONE)
        model.teardown()
        return model

    with pytest.raises(ProtocolViolation, match=r"after the final takeover and backfill, \('shares', '\w+'\) reads"):
        deploy()


def test_a_process_without_a_counter_added_without_since_loses_nothing_in_the_race() -> None:
    """The rolling-deploy race, shares without since: the proposal of the process with shares that lost the
    partition to one without it is superseded by the next one with shares, which starts past everything the
    one without it counted; shares reads every record from there."""
    model = rolling_deploy_race(AddedWithoutSinceModel)
    assert model.handover is not None
    assert model.handover >= 3 + 4



def test_a_counter_added_without_since_is_counted_exactly_from_its_handover() -> None:
    """Under every fault of the model, kill -9 of processes with and without shares in any order (a rolling
    deploy), resets and the GC: shares, added without since and never backfilled, counts every record from its
    hand-over on exactly once, and none before it."""
    run_model(AddedWithoutSinceModel, settings(MODEL_SETTINGS, max_examples=200))


class DroppedShares:
    """The store of a process that found shares dropped from the registry since it started: every other call is
    the shared store's, and no state of shares is written (the Cassandra store's ``refused``)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int, writes: Any, *,
                           source: bytes) -> None:
        await self._store.write_shards(mutator, born_us, timestamp_us,
                                       [w for w in writes if split_cell(w.counter)[0] != BACKFILLED], source=source)


class DefinedAgainModel(AddedWithoutSinceModel):
    """shares was dropped and the drop forgotten (its hand-overs deleted), then defined again without since,
    while processes that started before the drop still run: they have shares in their definitions, found it
    dropped (they write none of it) and must count it nowhere, as a process whose definitions lack it."""

    def new_actor(self, skew_us: int) -> Actor:
        actor = super().new_actor(skew_us)
        if actor.name in self.old:
            store = cast(MemoryStore, DroppedShares(self.store))
            retry = RetryEachStep(CONFIG, lambda: None)
            dead_letters = DeadLetters(cast(AIOKafkaProducer, DeadLetterTopic()), CONFIG)
            actor.ownership = self.ownership_class(
                CONFIG, actor.name, ROUTER_WITHOUT_SINCE, WITHOUT_SINCE, store, self.log,
                cast(AIOKafkaConsumer, KafkaPositions()), dead_letters, retry, clock=actor.ownership.clock,
                new_id=actor.ownership.new_id, spawn=actor.ownership.spawn, resets=self.resets,
                handovers=self.handovers)
            actor.ownership.dropped.add(BACKFILLED)
            actor.flushing = Flushing(store, actor.ownership, dead_letters, retry)
        return actor


def test_a_process_that_found_a_counter_dropped_refuses_it_once_defined_again() -> None:
    """The rolling deploy step by step, the old processes holding shares dropped: once a process with the new
    shares has recorded its hand-over, an old one assigned the partition refuses it, where it had taken the
    hand-over for its own and counted on without writing shares (a review lost 4,644 of 17,322 events so)."""
    model = rolling_deploy_after_a_handover(DefinedAgainModel)
    assert model.handover == 3
    assert model.refused == 1


def test_a_counter_defined_again_is_counted_exactly_beside_processes_that_found_it_dropped() -> None:
    """Under every fault of the model, with processes that found shares dropped claiming in any order with those
    of the new shares: it counts every record from its hand-over on exactly once."""
    run_model(DefinedAgainModel, settings(MODEL_SETTINGS, max_examples=100))


def replayed_again_after_a_fold(model_class: type[BackfillModel], *, forgotten: bool = False) -> BackfillModel:
    """A process of the deployment before shares counts three records and dies with its flush's window open; the
    next one replays that window, retires its writer W and is fenced before closing it; the GC folds W's shards
    (W is retired) and deletes them by a range at a later timestamp (and, ``forgotten``, deletes W's registry row
    days later, as it forgets a collected mutator); shares is added, and the first process with it replays W's
    window again: what it would write into W's shards lands at W's timestamps, under the GC's deletion."""
    model = model_class()
    entries = [Event("IBM", 1 + i % 5, f"e{i}") for i in range(12)]
    model.log = MemoryLog([e.to_bytes() for e in entries])
    model.contributions = counted(entries, list(range(len(entries))))
    model.new_owner(0, 10**6, Fault.NONE)
    first = model.live()[0]
    assert first.mutator is not None
    model.apply_next(first.mutator, 3)
    model.start(first, "flush", first.flushing.flush_one(TP, first.mutator), 10**6, Fault.NONE,
                stop_at=frozenset(("commit_window",)))  # its shards written, its window not committed
    model.new_owner(0, 10**6, Fault.NONE, stop_at=frozenset(("retire_mutator",)))  # replays, retires W: no close
    model.tick(10**9)
    model.start_gc(0, 10**6, Fault.NONE)
    if forgotten:
        assert first.mutator.id in model.store.collected
        del model.store.mutators[first.mutator.id]
        del model.store.recorded_counters[first.mutator.id]
    model.teardown()
    return model


def test_a_counter_added_without_since_is_not_counted_into_a_window_the_gc_has_folded() -> None:
    """The first process with shares counts it from its start offset, not from the window it replays: the window's
    writer never counted shares, and shares written into W's shards after the fold would read as nothing (it
    did: the records of that window were lost for shares)."""
    model = replayed_again_after_a_fold(AddedWithoutSinceModel)
    assert model.handover == 3


def test_a_counter_added_without_since_is_not_counted_into_the_window_of_a_writer_the_gc_has_forgotten() -> None:
    """The same, with W's registry row forgotten by the GC before shares is added: nothing says what W counted, and
    whatever is written at its timestamps is hidden. shares was taken to have been counted by W, counted from its
    window into its shards, and those records read as nothing; it is now counted from the start offset."""
    model = replayed_again_after_a_fold(AddedWithoutSinceModel, forgotten=True)
    assert model.handover == 3


class StartRecordedLateStore(PerGroupHistoryStore):
    """The first mutator's start times out more often than it is tried again at once (three attempts)."""

    start_failures = 4

    async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str] = frozenset()
                           ) -> None:
        if self.start_failures:
            self.start_failures -= 1
            raise StoreTimeoutError("record_start timed out")
        await super().record_start(mutator, start_offset, counters)


class StartRecordedLateModel(AddedWithoutSinceModel):
    store_class = StartRecordedLateStore


def test_a_window_is_never_opened_by_a_mutator_whose_counters_are_unrecorded() -> None:
    """The window rule reads the counters W recorded: W whose start could not be recorded (four timeouts in a row)
    was taken to have counted any, so shares, which W never counted, was counted from W's window and written
    into W's shards under the GC's fold of W, and those records read as nothing. W now records its counters
    before its first window, retrying as long as it takes: shares is counted from the start offset."""
    model = replayed_again_after_a_fold(StartRecordedLateModel)
    assert model.store.start_failures == 0
    assert model.handover == 3
