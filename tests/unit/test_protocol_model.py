"""A stateful model test of the flush / takeover / release / GC protocol (docs/guarantees.md) on one
partition.

Each consumer process is the consumer's own :class:`~consumer.ownership.Ownership` and
:class:`~consumer.flushing.Flushing` (claims, takeovers finishing in the background while records are
applied, flushes, releases, rotations, each retried as the consumer retries it) over :class:`MemoryStore`,
run one storage operation at a time, so hypothesis chooses every interleaving: owners taking over from live,
dead or frozen predecessors, claims from stale reads, zombies resuming mid-flush, any operation failing or
applying with its answer lost, shard writes held in flight and landing late (after takeovers and GC), in any
order, or never. The GC is the fold docs/running.md describes ("Running the GC"), run by up to two workers at
once.

After every step the store must hold only what the log justifies: each visible shard is exactly its
mutator's records from its start to its ``through_offset``; no two shards of an instance cover the same
record; every instance reads between the truth at the committed offset and at the intent offset; the
ownership row's offsets never go back. At the end, with every in-flight write delivered and a final takeover
done, every instance reads exactly the truth of the log up to where the next owner starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from consumer import protocol
from consumer.applying import Applier, Mutator, Record, RecordsLostError, RetryWindow
from consumer.dead_letters import DeadLetters
from consumer.flushing import Flushing
from consumer.ownership import Ownership, PartitionRetry
from consumer.protocol import (
    MIN_LIFETIME_US,
    Claim,
    ClaimUnresolvedError,
    FencedError,
    StaleEntryError,
    Takeover,
    claim,
    finish_take_over,
    flush,
    release,
)
from consumer.storage import MutatorEntry, PartitionId, PartitionRow, ShardWrite, StoredShard
from countersink.retry import is_retriable
from countersink.settings import ConsumerSettings
from countersink.state_cache import ShardRow as CachedRow
from countersink.state_cache import StateCache
from gc_worker.collector import Collector
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.kinds import merge_blobs, new_state, state_from_bytes
from schemas.resets import Epochs, Reset, ResetPosition, control_record, current_epochs, split_cell
from tests.unit.memory_store import (
    BackgroundTask,
    Fault,
    Instance,
    MemoryLog,
    MemoryResets,
    MemoryStore,
    StoreTimeoutError,
    Task,
    retry_pause,
    run,
)

T = TypeVar("T")
COUNTERS = parse_definitions(
    """
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
"""
)
ROUTER = EventRouter(COUNTERS)
TOPIC = "orders"
PID = PartitionId("model", TOPIC, 0)
SYMBOLS = ("IBM", "SAP")
RETRY_WINDOW = 4
MAX_SKEW_US = 500  # machines' clocks disagree by up to this much
GRACE_US = 2 * MAX_SKEW_US  # the GC's grace: larger than any skew
EPOCH_US = 1_000_000_000
MAX_ACTORS = 5
MALFORMED = (
    b"{not json",
    b'{"sym": ["IBM"], "qty": 3, "id": "bad-key"}',  # refused by both counters: a key of the wrong type
    b'{"qty": 1, "id": "no-key"}',  # applies to neither counter (no key): skipped by both
)


# Resets of the model's counters (schemas.resets): all keys or one, epochs rising per counter. A log holds the
# control records of some of them, in any order (two resets run at once), some twice, and forged ones.
RESETS = (
    Reset("r1", "trades", 1),
    Reset("r2", "shares", 2, frozenset({"IBM"})),
    Reset("r3", "trades", 3, frozenset({"SAP"})),
    Reset("r4", "shares", 4),
)
FORGED = Reset("forged", "trades", 9)  # its control record is in the log, its row was never recorded


@dataclasses.dataclass(frozen=True)
class Control:
    """A control record of a reset (or of a forged one) in the log."""

    reset: Reset

    def to_record(self) -> tuple[bytes, list[tuple[str, bytes]]]:
        return control_record(self.reset)


class ProtocolViolation(AssertionError):
    """The store holds something the log does not justify: an event lost or counted twice."""


@dataclasses.dataclass(frozen=True)
class Event:
    sym: str
    qty: int
    event_id: str

    def to_bytes(self) -> bytes:
        return json.dumps({"sym": self.sym, "qty": self.qty, "id": self.event_id}).encode()


Entry = Event | bytes | Control


@st.composite
def logs(draw: st.DrawFn) -> list[Entry]:
    """A partition's log: events on two symbols, publisher retries (the same event again at a new offset,
    sometimes inside the retry window, sometimes beyond it), malformed records and, in some logs, control
    records of resets (some twice, some forged)."""
    entries: list[Entry] = []
    resets = draw(st.sampled_from((False, True)))
    for offset in range(draw(st.integers(6, 30))):
        choice = draw(st.sampled_from(("event", "event", "event", "retry", "malformed", "reset")))
        earlier = [e for e in entries[-2 * RETRY_WINDOW:] if isinstance(e, Event)]
        if choice == "retry" and earlier:
            entries.append(draw(st.sampled_from(earlier)))
        elif choice == "malformed":
            entries.append(draw(st.sampled_from(MALFORMED)))
        elif choice == "reset" and resets:
            entries.append(Control(draw(st.sampled_from((*RESETS, FORGED)))))
        else:
            entries.append(Event(draw(st.sampled_from(SYMBOLS)), draw(st.integers(0, 9)), f"e{offset}"))
    return entries


def counted(entries: Sequence[Entry], offsets: Sequence[int]) -> list[Event | None]:
    """What each offset contributes, computed from the log alone: valid events not repeating an event id
    of the ``RETRY_WINDOW`` records (not offsets) before them; nothing at an offset without a record, nor at
    a control record (a record of the window all the same)."""
    out: list[Event | None] = [None] * (offsets[-1] + 1 if offsets else 0)
    for index, (offset, entry) in enumerate(zip(offsets, entries, strict=True)):
        recent = entries[max(0, index - RETRY_WINDOW):index]
        fresh = isinstance(entry, Event) and all(
            not isinstance(r, Event) or r.event_id != entry.event_id for r in recent)
        out[offset] = entry if fresh and isinstance(entry, Event) else None
    return out


@st.composite
def offsets_of(draw: st.DrawFn, count: int) -> list[int]:
    """Offsets for ``count`` records: consecutive, or with gaps where a real log has transaction markers,
    aborted transactions or compacted records."""
    if not draw(st.booleans()):
        return list(range(count))
    offsets, offset = [], 0
    for _ in range(count):
        offset += draw(st.sampled_from((0, 0, 1, 3)))
        offsets.append(offset)
        offset += 1
    return offsets


async def take_over(store: MemoryStore, source: MemoryLog, new: MutatorEntry,
                    applier_factory: Callable[[], Applier], now_us: int, initial_last_offset: int) -> Takeover:
    """A takeover's two halves back to back, for the scenario tests below: :func:`claim`, then
    :func:`finish_take_over`. (The model runs :class:`Ownership`, which applies records in between.)"""
    claimed = await claim(store, new, initial_last_offset)
    return await finish_take_over(store, source, claimed, applier_factory, lambda: now_us)


def applier() -> Applier:
    return Applier(ROUTER, COUNTERS, TOPIC, PID.partition, RetryWindow(RETRY_WINDOW))


def reset_points(entries: Sequence[Entry], offsets: Sequence[int]) -> dict[str, int]:
    """Where each reset sits in the log: the offset of its first control record."""
    points: dict[str, int] = {}
    for offset, entry in zip(offsets, entries, strict=True):
        if isinstance(entry, Control):
            points.setdefault(entry.reset.reset_id, offset)
    return points


async def collect(store: MemoryStore, now_us: int, epochs: Epochs | None = None) -> None:
    """One run of the real GC (``gc_worker.collector``), one instance at a time so the test drives each step.
    A storage timeout defers the instance, as a replica down does in production. With ``epochs`` (the
    readers'), cells of ended epochs are deleted unfolded."""

    async def epochs_of(counter: str) -> Epochs:
        assert epochs is not None
        return epochs

    await Collector(store, GRACE_US, concurrency=1, epochs_of=None if epochs is None else epochs_of).run(now_us)


CONFIG = ConsumerSettings(group_id=PID.consumer_group, retry_window_records=RETRY_WINDOW,
                          mutator_max_age_s=10**6)
TP = TopicPartition(TOPIC, PID.partition)


class KafkaPositions:
    """The consumer client as ownership uses it: a new partition starts at the log's first offset; pausing,
    resuming and seeking are the loop's business (the model applies from ``applied_through`` on)."""

    def pause(self, *partitions: TopicPartition) -> None:
        pass

    def resume(self, *partitions: TopicPartition) -> None:
        pass

    def seek(self, partition: TopicPartition, offset: int) -> None:
        pass

    async def committed(self, partition: TopicPartition) -> int | None:
        return None

    async def beginning_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, 0)


class DeadLetterTopic:
    """The producer as dead letters use it: every send is acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[bytes | None] = []

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, headers: object = None
                   ) -> Awaitable[None]:
        self.sent.append(value)
        return _acknowledged()


async def _acknowledged() -> None:
    return None


class RetryEachStep(PartitionRetry):
    """The consumer's retry of a partition's step, except that the pause before each new attempt is a point
    where the model decides when (or whether) the process goes on."""

    async def __call__(self, what: str, tp: TopicPartition, step: Callable[[], Awaitable[T]],
                       on_retry: Callable[[], None] | None = None) -> T:
        while True:
            try:
                return await step()
            except Exception as error:
                if not is_retriable(error):
                    raise
                if on_retry is not None:
                    on_retry()
                await retry_pause(what)


@dataclasses.dataclass
class Actor:
    """A consumer process assigned the partition: its :class:`Ownership` and :class:`Flushing`, the step its
    loop is running (a takeover, a flush, a release or a rotation) and the takeovers finishing behind it."""

    name: str
    skew_us: int
    ownership: Ownership = dataclasses.field(init=False)
    flushing: Flushing = dataclasses.field(init=False)
    task: Task | None = None
    background: list[BackgroundTask] = dataclasses.field(default_factory=list)
    gone: bool = False  # dead: it never acts again
    # Kafka has assigned it the partition and not revoked it: no rebalance comes to move the partition on.
    assigned: bool = False
    minted: set[uuid.UUID] = dataclasses.field(default_factory=set)  # the ids of every mutator it made

    @property
    def mutator(self) -> Mutator | None:
        return self.ownership.mutators.get(TP)

    @property
    def applying(self) -> Mutator | None:
        return self.ownership.applying(TP)


FAULTS = st.sampled_from((Fault.NONE, Fault.FAIL, Fault.LOST_ANSWER, Fault.HOLD))
# The store's conditional writes: any of them may apply and time out at its caller.
LWTS = frozenset(("register_mutator", "create_partition", "claim_partition", "open_window", "commit_window",
                  "close_window", "retire_mutator"))
PICK = st.integers(0, 7)
# How many storage operations a task gets through before it (maybe) freezes: often only a few, so that tasks
# stop between any two operations, sometimes enough to finish a flush or a takeover with its replay.
OPS = st.one_of(st.integers(0, 3), st.integers(4, 24))


class ProtocolModel(RuleBasedStateMachine):
    """One partition, its log, consumer processes coming and going, GC workers, and a store that misbehaves.

    Each process is the consumer's own :class:`Ownership` and :class:`Flushing` over the model's store and
    log: its claims, background takeovers, flushes, releases and rotations are production's code, run one
    storage operation at a time."""

    store_class: ClassVar[type[MemoryStore]] = MemoryStore
    log_class: ClassVar[type[MemoryLog]] = MemoryLog
    resets_class: ClassVar[type[MemoryResets]] = MemoryResets
    ownership_class: ClassVar[type[Ownership]] = Ownership
    # At the end, every shard but the final owner's must have been collected.
    check_liveness: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.store = self.store_class()
        self.now_us = EPOCH_US
        self.actors: list[Actor] = []
        self.gc_tasks: list[Task] = []
        self.ids = itertools.count(1)
        self.log = MemoryLog([])
        self.contributions: list[Event | None] = []
        self.checked_rows = 0
        self.resets = self.resets_class()
        self.points: dict[str, int] = {}  # reset id -> offset of its first control record
        self.epochs = Epochs()  # what readers use: every recorded reset
        self.read_cache = StateCache(1 << 20)  # serve's, read through after every step

    # ------------------------------------------------------------------------------------ helpers

    def point(self, counter: str, epoch: int) -> int:
        """The offset of the control record of ``counter``'s reset of ``epoch`` (-1 for epoch 0)."""
        if epoch == 0:
            return -1
        return next(self.points[r.reset_id] for r in RESETS if (r.counter, r.epoch) == (counter, epoch))

    def truth(self, first: int, last: int, cell: str | None = None) -> dict[Instance, int]:
        """What records ``first..last`` make of each instance, after the reset of its current epoch (of
        ``cell``'s epoch, with a cell name: then only the instances of that cell's counter)."""
        values: dict[Instance, int] = {}
        for offset in range(max(first, 0), min(last, len(self.contributions) - 1) + 1):
            event = self.contributions[offset]
            if event is None:
                continue
            for counter, add in (("trades", 1), ("shares", event.qty)):
                if cell is None:
                    epoch = self.epochs.epoch(counter, event.sym)
                else:
                    named, epoch = split_cell(cell)
                    if named != counter:
                        continue
                if offset > self.point(counter, epoch):
                    values[(counter, event.sym)] = values.get((counter, event.sym), 0) + add
        return values

    def readable(self) -> dict[Instance, int]:
        """What a reader sees: merge(tally, every visible shard) of each instance's current epoch."""
        values: dict[Instance, int] = {}
        stored = set(self.store.shards) | set(self.store.tallies)
        for counter, key in sorted({(split_cell(cell)[0], key) for cell, key in stored}):
            snapshot = self.store.snapshot(self.epochs.cell(counter, key), key)
            state = state_from_bytes(snapshot.tally) if snapshot.tally else new_state(COUNTERS[counter])
            for shard in snapshot.shards:
                state.merge(state_from_bytes(shard.state))
            value = state.value()
            assert isinstance(value, int)
            values[(counter, key)] = value
        return values

    def row(self) -> PartitionRow | None:
        return self.store.partitions.get(PID)

    def new_actor(self, skew_us: int) -> Actor:
        actor = Actor(f"owner{len(self.actors)}", skew_us)

        def spawn(finishing: Coroutine[Any, Any, None]) -> BackgroundTask:
            background = BackgroundTask(f"{actor.name}.finish_take_over", finishing)
            actor.background.append(background)
            return background

        def new_id() -> uuid.UUID:
            minted = uuid.UUID(int=next(self.ids))
            actor.minted.add(minted)
            return minted

        retry = RetryEachStep(CONFIG, lambda: None)
        dead_letters = DeadLetters(cast(AIOKafkaProducer, DeadLetterTopic()), CONFIG)
        actor.ownership = self.ownership_class(
            CONFIG, actor.name, ROUTER, COUNTERS, self.store, self.log, cast(AIOKafkaConsumer, KafkaPositions()),
            dead_letters, retry, clock=lambda: self.now_us + actor.skew_us, new_id=new_id, spawn=spawn,
            resets=self.resets)
        actor.flushing = Flushing(self.store, actor.ownership, dead_letters, retry)
        self.actors.append(actor)
        return actor

    def start(self, actor: Actor, label: str, step: Coroutine[Any, Any, Any], ops: int, fault: Fault,
              stop_at: frozenset[str] = frozenset()) -> None:
        actor.task = Task(f"{actor.name}.{label}", step)
        self.drive(actor.task, ops, fault, stop_at)

    def pick(self, candidates: Sequence[Actor], index: int) -> Actor:
        return candidates[index % len(candidates)]

    def live(self) -> list[Actor]:
        return [a for a in self.actors if not a.gone]

    def idle_owners(self) -> list[Actor]:
        """Processes holding a mutator whose loop is free: it may apply, flush, release or rotate."""
        return [a for a in self.live() if a.task is None and a.mutator is not None]

    def applying_owners(self) -> list[Actor]:
        return [a for a in self.idle_owners() if a.applying is not None]

    def running(self) -> list[Task]:
        return ([a.task for a in self.actors if a.task is not None]
                + [b.task for a in self.actors for b in a.background if not b.task.done] + self.gc_tasks)

    def drive(self, task: Task, ops: int, fault: Fault, stop_at: frozenset[str] = frozenset()) -> None:
        """Let ``ops`` storage operations of ``task`` take effect, the last one with ``fault``; the task then
        waits (frozen) at its next operation until a later rule moves it on. The last one is the first
        operation named in ``stop_at``, if one comes within ``ops``."""
        for n in range(ops):
            if task.done:
                # A takeover's claim is done: its background half runs on with the operations left, as it
                # starts at once in the consumer.
                following = [b.task for a in self.actors if a.task is task for b in a.background if not b.task.done]
                if not following:
                    break
                self.after_task_step(task)
                task = following[0]
            last = n == ops - 1 or (task.pending is not None and task.pending.name in stop_at)
            # Any task may freeze between its read of the ownership row and its claim: a claim from a stale
            # read must not apply (the LWT's condition names the window writer as read).
            task.step(fault if last else Fault.NONE)
            if last:
                break
        self.after_task_step(task)

    def after_task_step(self, task: Task) -> None:
        """Act on the end of a task. Ownership and flushing handle every error the protocol raises (a fence, a
        timeout, an expiry): one that reaches the model is a bug."""
        for actor in self.actors:
            if actor.task is task and task.done:
                actor.task = None
                if task.error is not None:
                    raise task.error
            for background in [b for b in actor.background if b.task is task and task.done]:
                actor.background.remove(background)
                if task.error is not None:
                    raise task.error
            self.observe(actor)
        if task in self.gc_tasks and task.done:
            self.gc_tasks.remove(task)
            if task.error is not None and not isinstance(task.error, StoreTimeoutError):
                raise task.error

    def observe(self, actor: Actor) -> None:
        """A hook for mutant stores that need to see the processes' mutators."""

    # ------------------------------------------------------------------------------------ rules

    @initialize(entries=logs(), data=st.data())
    def publish(self, entries: list[Event | bytes], data: st.DataObject) -> None:
        """The log is written; the partition's first owner takes it (from offset 0), sometimes with the answer
        of its registration or of the LWT creating the row lost."""
        offsets = data.draw(offsets_of(len(entries)))
        records = [e.to_record() if isinstance(e, Control) else (e.to_bytes() if isinstance(e, Event) else e, [])
                   for e in entries]
        self.log = self.log_class([value for value, _ in records], offsets, headers=[h for _, h in records])
        self.contributions = counted(entries, offsets)
        # Each reset published was recorded first: readers use them all from the start.
        self.points = reset_points(entries, offsets)
        recorded = [r for r in RESETS if r.reset_id in self.points]
        self.resets.resets = {r.reset_id: r for r in recorded}
        self.epochs = current_epochs(recorded)
        lost = data.draw(st.sampled_from((None, None, "register_mutator", "create_partition")))
        if lost is None:
            self.new_owner(0, 10**6, Fault.NONE)
            return
        self.new_owner(0, 10**6, Fault.LOST_ANSWER, stop_at=frozenset((lost,)))
        first = self.actors[0]
        if first.task is not None:
            self.drive(first.task, 10**6, Fault.NONE)

    @precondition(lambda self: len(self.live()) < MAX_ACTORS)
    @rule(skew=st.sampled_from((0, -MAX_SKEW_US, MAX_SKEW_US)), ops=OPS, fault=FAULTS)
    def new_owner(self, skew: int, ops: int, fault: Fault, stop_at: frozenset[str] = frozenset()) -> None:
        """A process is assigned the partition (the previous owner may be alive, frozen or dead)."""
        actor = self.new_actor(skew)
        actor.assigned = True
        self.start(actor, "take", actor.ownership.take([TP]), ops, fault, stop_at)

    @precondition(lambda self: any(a.task is None and a.mutator is None for a in self.live()))
    @rule(i=PICK, ops=OPS, fault=FAULTS)
    def reassigned(self, i: int, ops: int, fault: Fault) -> None:
        """A process that lost, released or never won the partition is assigned it again."""
        actor = self.pick([a for a in self.live() if a.task is None and a.mutator is None], i)
        actor.assigned = True
        self.start(actor, "take", actor.ownership.take([TP]), ops, fault)

    @precondition(lambda self: bool(self.running()))
    @rule(i=PICK, ops=OPS, fault=FAULTS)
    def advance(self, i: int, ops: int, fault: Fault) -> None:
        """A running (or frozen) task moves on by some storage operations; the last may fail."""
        tasks = self.running()
        self.drive(tasks[i % len(tasks)], ops, fault)

    @precondition(lambda self: bool(self.running()))
    @rule(i=PICK, name=st.one_of(st.none(), st.sampled_from(sorted(LWTS))))
    def lose_an_answer(self, i: int, name: str | None) -> None:
        """A running (or frozen) task's next LWT, or its next one of that ``name`` (a claim, a window's opening,
        commit or close, a registration or a retirement: of a takeover, a flush, a release or a rotation),
        applies and its answer is lost."""
        tasks = self.running()
        self.drive(tasks[i % len(tasks)], 100, Fault.LOST_ANSWER, LWTS if name is None else frozenset((name,)))

    @precondition(lambda self: bool(self.running()))
    @rule(i=PICK)
    def finish(self, i: int) -> None:
        tasks = self.running()
        task = tasks[i % len(tasks)]
        task.finish()
        self.after_task_step(task)

    @precondition(lambda self: bool(self.applying_owners()))
    @rule(i=PICK, n=st.integers(0, 8), ops=OPS, fault=FAULTS)
    def work(self, i: int, n: int, ops: int, fault: Fault) -> None:
        """An owner applies its next ``n`` records, then starts a flush (which may freeze or fail part way and
        is retried, with whatever was applied since, as the consumer retries it)."""
        actor = self.pick(self.applying_owners(), i)
        mutator = actor.applying
        assert mutator is not None
        self.apply_next(mutator, n)
        if ops:
            self.start(actor, "flush", actor.flushing.flush_one(TP, mutator), ops, fault)

    def apply_next(self, mutator: Mutator, n: int) -> None:
        """Apply the next ``n`` records in one batch, as the consumer does (``apply_batch``: the fast path,
        the router for what it does not take); then, as the consumer does with its position, skip the offsets
        without a record (markers) up to the one after."""
        following = [r for r in self.log.records if r.offset > mutator.applied_through]
        run(mutator.applier.learn(following[:n]))
        mutator.apply_batch(following[:n])
        if len(following) > n:
            mutator.skip_to(following[n].offset)

    def flushing_owners(self) -> list[Actor]:
        return [a for a in self.live() if a.applying is not None and a.task is not None
                and a.task.label.endswith(".flush")]

    @precondition(lambda self: bool(self.applying_owners()))
    @rule(i=PICK, n=st.integers(0, 8))
    def begin_flush(self, i: int, n: int) -> None:
        """An owner applies its next ``n`` records and starts a flush that waits at its first storage
        operation, so that records can be applied before its window LWT lands."""
        actor = self.pick(self.applying_owners(), i)
        mutator = actor.applying
        assert mutator is not None
        self.apply_next(mutator, n)
        self.start(actor, "flush", actor.flushing.flush_one(TP, mutator), 0, Fault.NONE)

    @precondition(lambda self: bool(self.flushing_owners()))
    @rule(i=PICK, n=st.integers(1, 8))
    def apply_while_flushing(self, i: int, n: int) -> None:
        """The consumer goes on applying records while a flush of the same mutator is in flight."""
        mutator = self.pick(self.flushing_owners(), i).applying
        assert mutator is not None
        self.apply_next(mutator, n)

    @precondition(lambda self: bool(self.idle_owners()))
    @rule(i=PICK, ops=OPS, fault=FAULTS)
    def begin_release(self, i: int, ops: int, fault: Fault) -> None:
        """The partition is revoked: its owner hands it over (abandoning a takeover still finishing)."""
        actor = self.pick(self.idle_owners(), i)
        actor.assigned = False
        self.start(actor, "release", actor.ownership.release_partition(TP), ops, fault)

    @precondition(lambda self: bool(self.applying_owners()))
    @rule(i=PICK, ops=OPS, fault=FAULTS, lost=st.one_of(st.none(), st.sampled_from(sorted(LWTS))))
    def rotate(self, i: int, ops: int, fault: Fault, lost: str | None) -> None:
        """An owner rotates its mutator: releases it and claims the partition from it for a fresh one. With
        ``lost``, the rotation's first LWT of that name applies and its answer is lost."""
        actor = self.pick(self.applying_owners(), i)
        if lost is not None:
            ops, fault = 100, Fault.LOST_ANSWER
        self.start(actor, "rotate", actor.ownership.rotate(TP, "model"), ops, fault,
                   frozenset(() if lost is None else (lost,)))

    @precondition(lambda self: bool(self.live()))
    @rule(i=PICK)
    def kill(self, i: int) -> None:
        """A process dies: whatever it had not sent is never sent; what it held in flight may still land."""
        actor = self.pick(self.live(), i)
        if actor.task is not None:
            actor.task.abandon()
        for background in actor.background:
            background.task.abandon()
        actor.task, actor.background, actor.gone = None, [], True

    def claiming(self) -> list[Actor]:
        return [a for a in self.live() if a.task is not None and a.task.label.endswith((".take", ".rotate"))]

    @precondition(lambda self: bool(self.claiming()))
    @rule(i=PICK, ops=OPS, fault=FAULTS)
    def stop_while_taking(self, i: int, ops: int, fault: Fault) -> None:
        """A process stops while it takes the partition (a claim, or a rotation's, cancelled where it waits):
        what the cancelled task does on its way out (a registered mutator that can own nothing retires
        unused) takes effect for up to ``ops`` operations, the last with ``fault``; then the process is gone."""
        actor = self.pick(self.claiming(), i)
        task, actor.task = actor.task, None
        assert task is not None
        task.cancel()
        for n in range(ops):
            if task.done:
                break
            task.step(fault if n == ops - 1 else Fault.NONE)
        if not task.done:
            task.abandon()
        elif task.error is not None and not isinstance(task.error, asyncio.CancelledError):
            raise task.error
        for background in actor.background:
            background.task.abandon()
        actor.background, actor.gone = [], True

    @precondition(lambda self: bool(self.store.held))
    @rule(i=PICK)
    def deliver(self, i: int) -> None:
        """A write held in flight lands now (late, possibly after newer writes, takeovers and GC)."""
        self.store.deliver(i % len(self.store.held))

    @precondition(lambda self: bool(self.store.held))
    @rule(i=PICK)
    def lose(self, i: int) -> None:
        """A write held in flight never lands (its caller was never told it did)."""
        self.store.drop(i % len(self.store.held))

    @rule(dt=st.sampled_from((1, 1_000, 2_000_000)))
    def tick(self, dt: int) -> None:
        self.now_us += dt

    @precondition(lambda self: len(self.gc_tasks) < 2)
    @rule(skew=st.sampled_from((0, -MAX_SKEW_US, MAX_SKEW_US)), ops=OPS, fault=FAULTS)
    def start_gc(self, skew: int, ops: int, fault: Fault) -> None:
        task = Task("gc", collect(self.store, self.now_us + skew, self.epochs))
        self.gc_tasks.append(task)
        self.drive(task, ops, fault)

    @precondition(lambda self: bool(self.gc_tasks))
    @rule(i=PICK)
    def kill_gc(self, i: int) -> None:
        self.gc_tasks.pop(i % len(self.gc_tasks)).abandon()

    # ------------------------------------------------------------------------------------ invariants

    def violation(self, message: str) -> ProtocolViolation:
        return ProtocolViolation(f"{message}\nrow: {self.row()}\nheld writes: {len(self.store.held)}"
                                 f"\nreset points: {self.points}, recorded: {self.resets.positions}\n"
                                 f"cells: {sorted(self.store.shards)} tallies: {sorted(self.store.tallies)}")

    @invariant()
    def ownership_row_only_moves_forward(self) -> None:
        history = self.store.row_history
        for before, after in itertools.pairwise(history[max(0, self.checked_rows - 1):]):
            if after.intent_offset < before.intent_offset or after.committed_offset < before.committed_offset:
                raise self.violation(f"partition row went back: {before} -> {after}")
        self.checked_rows = len(history)

    @invariant()
    def every_changed_state_changes_its_stamps(self) -> None:
        # A mutator born below an earlier owner's last write timestamp (a clock behind) would write stamps
        # that lose to that owner's: serve's cache would keep the old merge (schemas.cql, Claimant).
        # A write to a cell no reader reads any more (a late write of an epoch a reset ended) is no miss.
        read = [what for (cell, key), what in self.store.stamp_misses
                if self.epochs.cell(split_cell(cell)[0], key) == cell]
        if read:
            raise self.violation(f"a state changed, its stamps did not: {read[0]}")

    @invariant()
    def a_cached_read_answers_what_a_whole_read_answers(self) -> None:
        """serve's cache, read through after every step as serve would read it at that moment (the stamps; then
        the merge kept, or the rows of the sources that changed, or the whole partition) answers each
        instance's whole merge: no write, late write, hand-over or fold changes an instance under stamps that
        say otherwise, nor changes a row other than the one its source's stamp is carried by."""
        stored = set(self.store.shards) | set(self.store.tallies)
        for counter, key in sorted({(split_cell(cell)[0], key) for cell, key in stored}):
            cell = self.epochs.cell(counter, key)
            tally = self.store.tallies.get((cell, key))
            whole = self.store.stored_rows(cell, key)
            blobs = ([tally.value] if tally else []) + [state for _, state, _ in whole]
            expected = merge_blobs(blobs)
            stamps = self.store.stamps_of(key)
            got = self.read_cache.checked(cell, key, stamps, now=0.0, wall=0.0)
            to_read = None if got is not None else self.read_cache.rows_to_read(cell, key, stamps, now=0.0, wall=0.0)
            if to_read is not None:
                by_row = {row: (state, newest) for row, state, newest in whole}
                found = {row: CachedRow(row, by_row[row][1]) for row in to_read if row in by_row}
                if found:  # none: the read gives no tally either (it comes with a row), and reads whole
                    got = self.read_cache.patched(cell, key, tally.value if tally else None, found,
                                                  {row: by_row[row][0] for row in found}, stamps, None)
            if got is None:
                got = self.read_cache.merged(cell, key, blobs, stamps=stamps, now=0.0,
                                             rows=[CachedRow(row, newest) for row, _, newest in whole])
            if (got is None) != (expected is None) or (got is not None and expected is not None
                                                         and got.value() != expected.value()):
                raise self.violation(f"{cell}/{key}: a cached read answered {got and got.value()}, a whole read "
                                     f"{expected and expected.value()} (stamps {stamps}, rows read by name: "
                                     f"{to_read})")

    @invariant()
    def every_shard_is_what_its_mutator_consumed(self) -> None:
        row = self.row()
        for counter, key in sorted(self.store.shards):
            ranges: list[tuple[int, int, uuid.UUID]] = []
            for shard in self.store.snapshot(counter, key).shards:
                start = self.store.starts.get(shard.mutator)
                if start is None:
                    raise self.violation(f"shard of {shard.mutator}, which never started consuming")
                if row is None or shard.through_offset > row.intent_offset:
                    raise self.violation(f"{counter}/{key} shard of {shard.mutator} is through "
                                         f"{shard.through_offset}, beyond the intent offset")
                expected = self.truth(max(start, self.point(*split_cell(counter)) + 1), shard.through_offset,
                                      counter).get((split_cell(counter)[0], key), 0)
                value = state_from_bytes(shard.state).value()
                if value != expected:
                    raise self.violation(f"{counter}/{key} shard of {shard.mutator} holds {value}, but records "
                                         f"{start}..{shard.through_offset} make {expected}")
                retired = self.store.mutators.get(shard.mutator)
                if retired is not None and retired.retired_us is not None and shard.write_us >= retired.retired_us:
                    raise self.violation(f"shard of {shard.mutator} written at {shard.write_us}, not before its "
                                         f"retire time {retired.retired_us}: the GC could not shadow it")
                if start <= shard.through_offset:
                    ranges.append((start, shard.through_offset, shard.mutator))
            ranges.sort()
            for (_, end, first), (begin, _, second) in itertools.pairwise(ranges):
                if begin <= end:
                    raise self.violation(f"{counter}/{key}: shards of {first} and {second} both hold record {begin}")

    @invariant()
    def an_assigned_process_runs_the_mutator_it_owns(self) -> None:
        """No lost answer leaves the partition paused for good: a process still assigned the partition, whose
        loop is free, holds the mutator of its own that the row names owner (the row names another's only
        when another member claimed it, and a rebalance then moves the partition on)."""
        row = self.row()
        if row is None:
            return
        for actor in self.live():
            if actor.assigned and actor.task is None and row.owner in actor.minted:
                mutator = actor.mutator
                if mutator is None or mutator.id != row.owner or mutator.fenced:
                    raise self.violation(f"{actor.name} is assigned the partition and its mutator {row.owner} owns "
                                         f"it, but it runs {mutator.id if mutator else None}: paused for good")

    @invariant()
    def readable_value_is_between_committed_and_intent(self) -> None:
        row = self.row()
        if row is None:
            return
        low, high, seen = self.truth(0, row.committed_offset), self.truth(0, row.intent_offset), self.readable()
        for instance in sorted(set(low) | set(high) | set(seen)):
            value = seen.get(instance, 0)
            if not low.get(instance, 0) <= value <= high.get(instance, 0):
                raise self.violation(f"{instance} reads {value}; committed truth {low.get(instance, 0)}, "
                                     f"intent truth {high.get(instance, 0)}")

    def teardown(self) -> None:
        """Stop everyone, land every write still in flight, and let one last process take the partition over
        cleanly: then every instance must read exactly the log up to where it starts, before and after a GC."""
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
        last = self.new_actor(0)
        run(last.ownership.take([TP]))
        for background in last.background:
            error = background.task.finish().error
            if error is not None:
                raise error
        assert last.mutator is not None
        assert not last.ownership.takeover_pending(last.mutator)
        start_offset = last.mutator.applied_through + 1
        for phase in ("after the final takeover", "after a full GC"):
            self.every_shard_is_what_its_mutator_consumed()
            expected, seen = self.truth(0, start_offset - 1), self.readable()
            for instance in sorted(set(expected) | set(seen)):
                if expected.get(instance, 0) != seen.get(instance, 0):
                    raise self.violation(f"{phase}, {instance} reads {seen.get(instance, 0)} but records "
                                         f"0..{start_offset - 1} make {expected.get(instance, 0)}")
            self.now_us += 10**9
            run(collect(self.store, self.now_us, self.epochs))
        if self.check_liveness:
            for (counter, key) in sorted(self.store.shards):
                for shard in self.store.snapshot(counter, key).shards:
                    raise self.violation(f"{counter}/{key} shard of {shard.mutator} is never collected "
                                         f"(retired: {self.store.mutators[shard.mutator].retired_us})")


class LivenessModel(ProtocolModel):
    """Also requires that every retired owner's shards are eventually folded into the tally."""

    check_liveness = True


class UnfencedStore(MemoryStore):
    """open_window without its LWT condition: a replaced owner can still open windows."""

    def _may_open(self, row: PartitionRow, mutator: uuid.UUID, seq: int) -> bool:
        return True


class UnfencedModel(ProtocolModel):
    store_class = UnfencedStore


class NoSkipStore(MemoryStore):
    """read_shard forgets through_offset, so a replay re-applies events its writer's shard already holds."""

    async def read_shard(self, counter: str, key: str, mutator: uuid.UUID, born_us: int) -> StoredShard | None:
        stored = await super().read_shard(counter, key, mutator, born_us)
        return None if stored is None else StoredShard(stored.state, -1)


class NoSkipModel(ProtocolModel):
    store_class = NoSkipStore


class OffsetWindowLog(MemoryLog):
    """Rebuilds the publisher-retry window from the last ``count`` offsets instead of records: on a log with
    gaps, a successor's window holds fewer records than its predecessor's had."""

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        return await self.read(topic, partition, before - count, before - 1)


class OffsetWindowModel(ProtocolModel):
    log_class = OffsetWindowLog


class LateSnapshotStore(MemoryStore):
    """Writes each shard as its mutator's state is when the writes are sent, not when the flush began: what
    a flush that read its states after its window LWT would write."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[uuid.UUID, Mutator] = {}

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int,
                           writes: Sequence[ShardWrite], *, source: bytes) -> None:
        owner = self.live.get(mutator)
        if owner is not None:
            writes = [w._replace(state=owner.states[(split_cell(w.counter)[0], w.key)].to_bytes()) for w in writes
                      if (split_cell(w.counter)[0], w.key) in owner.states]
        await super().write_shards(mutator, born_us, timestamp_us, writes, source=source)


class LateSnapshotModel(ProtocolModel):
    store_class = LateSnapshotStore

    def observe(self, actor: Actor) -> None:
        assert isinstance(self.store, LateSnapshotStore)
        for mutator in actor.ownership.mutators.values():
            self.store.live[mutator.id] = mutator


class ImpatientOwnership(Ownership):
    """Lets a mutator flush while its takeover is still finishing in the background."""

    def takeover_pending(self, mutator: Mutator) -> bool:
        return False


class ImpatientModel(ProtocolModel):
    ownership_class = ImpatientOwnership


MODEL_SETTINGS = settings(
    max_examples=400, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# For models that must fail: a fixed seed so the outcome does not vary between runs, no shrinking (the
# point is that a counterexample exists), and one error rather than a group.
MUST_FAIL_SETTINGS = settings(
    MODEL_SETTINGS, max_examples=400, stateful_step_count=40, derandomize=True, database=None, phases=(Phase.generate,),
    report_multiple_bugs=False, print_blob=False,
)


def run_model(model: type[ProtocolModel], config: settings) -> None:
    run_state_machine_as_test(model, settings=config)


def test_every_event_counts_exactly_once() -> None:
    """Under crashes, zombies, failed, lost-answer, held and reordered writes and two GC workers, every
    committed event is counted once, no shard runs ahead of the intent offset, and reads stay in bounds."""
    run_model(ProtocolModel, MODEL_SETTINGS)


def test_every_retired_owner_is_eventually_collected() -> None:
    """Every mutator but the current owner is eventually retired, so the GC folds all of its shards."""
    run_model(LivenessModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_missing_fence() -> None:
    """With open_window's LWT condition removed, the model finds an event counted twice."""
    with pytest.raises(ProtocolViolation):
        run_model(UnfencedModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_missing_through_offset_skip() -> None:
    """With the replay's through_offset skip removed, the model finds an event counted twice."""
    with pytest.raises(ProtocolViolation):
        run_model(NoSkipModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_flush_that_reads_its_states_late() -> None:
    """With shard states read when the writes are sent rather than with the intent offset, records applied
    during the flush are written as if they were not: the model finds one counted twice."""
    with pytest.raises(ProtocolViolation):
        run_model(LateSnapshotModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_flush_before_the_takeover_is_finished() -> None:
    """With ownership letting a claimant flush before its background takeover has replayed the window its
    predecessor left open, the model finds an event lost or counted twice."""
    with pytest.raises(ProtocolViolation):
        run_model(ImpatientModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_retry_window_rebuilt_from_offsets() -> None:
    """With the retry window rebuilt from the last offsets rather than the last records, a log with gaps lets
    a successor count a publisher retry its predecessor dropped: the model finds it counted twice. It takes
    a retry near the window's edge after a takeover, so more examples than the other mutants (it stops at
    the first failure: fewer than 800 examples, 11 s, with the derandomized seed of this version)."""
    with pytest.raises(ProtocolViolation):
        run_model(OffsetWindowModel, settings(MUST_FAIL_SETTINGS, max_examples=2_000))


def test_model_catches_a_birth_below_the_last_writers_timestamps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a claimant born at its own clock's time even when that is behind the partition's last write
    timestamp, its stamps lose to its predecessor's: the model finds a state changed under unchanged stamps
    (what serve's cache would answer stale): either as such, or as a cached read answering other than a whole
    read, whichever invariant meets it first."""
    monkeypatch.setattr(protocol, "_timestamp_floor", lambda row: -1)
    with pytest.raises(ProtocolViolation, match=r"its stamps did not|a cached read answered"):
        run_model(ProtocolModel, MUST_FAIL_SETTINGS)


def _owner(store: MemoryStore, log: MemoryLog, n: int, born_us: int) -> tuple[MutatorEntry, Task]:
    record = MutatorEntry(uuid.UUID(int=n), PID.consumer_group, TOPIC, PID.partition, f"owner{n}",
                           born_us=born_us, expires_us=born_us + 10**12)
    return record, Task(f"owner{n}.take_over", take_over(store, log, record, applier, born_us, -1))


def _consume_and_flush(store: MemoryStore, log: MemoryLog, record: MutatorEntry, result: Takeover,
                       through: int, now_us: int) -> Mutator:
    fresh = applier()
    run(fresh.warm_up(log, result.start_offset))
    mutator = Mutator(record, PID, fresh, applied_through=result.start_offset - 1,
                      flushed_through=result.start_offset - 1)
    for record_ in log.records:
        if result.start_offset <= record_.offset <= through:
            mutator.apply(record_)
    run(flush(store, mutator, now_us))
    return mutator


def test_claim_from_a_stale_read_does_not_rewind_the_partition() -> None:
    """A claimant whose read of the ownership row predates the current owner's takeover must not win the
    claim LWT and restart the partition from the old intent offset (records would be counted twice)."""
    store, log = MemoryStore(), MemoryLog([Event("IBM", 1, f"e{o}").to_bytes() for o in range(6)])
    # A owns the partition, flushes records 0..2 once (flush_seq 1) and dies with that window open.
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 2, EPOCH_US)
    # B starts its takeover: it claims the row (owner B, flush_seq still 1) ...
    b, b_task = _owner(store, log, 2, EPOCH_US + 10)
    while b_task.pending is not None and b_task.pending.name != "read_shard":
        b_task.step()
    # ... and C reads the row now, then pauses before its claim LWT.
    _, c_task = _owner(store, log, 3, EPOCH_US + 20)
    c_task.step()  # read_partition: the birth's floor (above the partition's last write timestamp)
    c_task.step()  # read_gc_cutoff: and above every GC run's cutoff
    c_task.step()  # register_mutator
    c_task.step()  # read_gc_cutoff: no GC run passed the birth meanwhile
    assert c_task.pending is not None
    assert c_task.pending.name == "read_partition"
    c_task.step()  # read_partition: owner B, window A, flush_seq 1, intent 2
    assert c_task.pending is not None
    assert c_task.pending.name == "claim_partition"
    # B finishes its takeover (flush_seq back to 0), consumes 3..5 and flushes once: flush_seq is 1 again.
    _consume_and_flush(store, log, b, b_task.finish().result, 5, EPOCH_US + 30)
    row_before = store.partitions[PID]
    c_task.finish()
    row_after = store.partitions[PID]
    assert c_task.error is not None or row_after.intent_offset >= row_before.intent_offset, (
        f"C claimed from a stale read and rewound the partition: {row_before} -> {row_after}; "
        f"C starts at {c_task.result.start_offset if c_task.result else None} although B's shards hold 3..5")


def _ibm_value(store: MemoryStore) -> int:
    """What a reader of trades/IBM sees: its tally merged with every visible shard."""
    snapshot = store.snapshot("trades", "IBM")
    state = state_from_bytes(snapshot.tally) if snapshot.tally else new_state(COUNTERS["trades"])
    for shard in snapshot.shards:
        state.merge(state_from_bytes(shard.state))
    return cast(int, state.value())


def _stalled_claimant_after_a_gc_run(store: MemoryStore, log: MemoryLog) -> tuple[MutatorEntry, Task]:
    """B chooses its birth, then stalls before its registration lands (a lost answer, a paused process) while
    the owner A counts on, releases the partition (retired after B's birth) and a GC run, its cutoff past
    both, reads the registry without B: it folds A and deletes the rows born below its cutoff at A's retire
    time, which B's writes, stamped from B's birth, would be under. B's claim is then finished."""
    a, a_task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, a, a_task.finish().result, 1, EPOCH_US)
    b, b_task = _owner(store, log, 2, EPOCH_US + 10)
    while b_task.pending is not None and b_task.pending.name != "register_mutator":
        b_task.step()
    for record in log.records[2:4]:
        mutator.apply(record)
    run(flush(store, mutator, EPOCH_US + MIN_LIFETIME_US))
    run(release(store, mutator, EPOCH_US + MIN_LIFETIME_US))
    run(collect(store, EPOCH_US + MIN_LIFETIME_US + 10 * GRACE_US))
    assert _ibm_value(store) == 4
    b_task.finish()
    return b, b_task


def test_a_claimant_registered_after_a_gc_run_passed_its_birth_retires_unused() -> None:
    """The stalled claimant B reads the cutoff the GC run recorded before it read the registry, once
    registered: born below it, B retires unused (ClaimUnresolvedError: the consumer claims with a fresh
    mutator), and a fresh claimant born above the cutoff counts every later record once."""
    store, log = MemoryStore(), _ibm_log(6)
    b, b_task = _stalled_claimant_after_a_gc_run(store, log)
    assert isinstance(b_task.error, ClaimUnresolvedError), b_task.error
    assert store.mutators[b.id].retired_us is not None
    now = EPOCH_US + MIN_LIFETIME_US + 10 * GRACE_US
    c, c_task = _owner(store, log, 3, now)
    _consume_and_flush(store, log, c, c_task.finish().result, 5, now)
    assert _ibm_value(store) == 6
    run(collect(store, now + 10 * MIN_LIFETIME_US))
    assert _ibm_value(store) == 6


def test_without_the_gc_cutoff_a_stalled_claimant_loses_its_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario above loses counts when claimants know no GC cutoff (what the check is for): B claims,
    counts records 4 and 5, and its rows lie under the GC run's deletion."""
    async def no_cutoff(self: MemoryStore) -> int:
        return -1

    monkeypatch.setattr(MemoryStore, "read_gc_cutoff", no_cutoff)
    store, log = MemoryStore(), _ibm_log(6)
    b, b_task = _stalled_claimant_after_a_gc_run(store, log)
    assert b_task.error is None, b_task.error
    _consume_and_flush(store, log, b, b_task.result, 5, EPOCH_US + MIN_LIFETIME_US + 10 * GRACE_US)
    assert _ibm_value(store) < 6


def test_a_claim_cancelled_with_no_claim_unanswered_retires_its_mutator_and_one_unanswered_is_left() -> None:
    """A process stops while it claims. Its mutator registered, no claim sent: it retires unused on the way out
    (no orphan is left for retire-orphans), and the partition's owner is untouched. A claim whose answer was
    lost may have applied: that mutator is left as a crash leaves it, for the next takeover to retire."""
    store, log = MemoryStore(), _ibm_log(2)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    a_task.finish()
    b = MutatorEntry(uuid.UUID(int=2), PID.consumer_group, TOPIC, PID.partition, "owner2", born_us=EPOCH_US + 10,
                     expires_us=EPOCH_US + 10**12)
    b_task = Task("b.claim", protocol.Claimant(b, -1).claim(store))
    while b_task.pending is not None and not (b.id in store.mutators and b_task.pending.name == "read_partition"):
        b_task.step()  # up to its read of the row before the claim: registered, nothing claimed
    assert store.mutators[b.id].retired_us is None
    b_task.cancel()
    b_task.finish()
    assert isinstance(b_task.error, asyncio.CancelledError)
    assert store.mutators[b.id].retired_us is not None
    assert store.partitions[PID].owner == a.id

    c = dataclasses.replace(b, id=uuid.UUID(int=3), host="owner3")
    claimant = protocol.Claimant(c, -1)
    first = Task("c.claim", claimant.claim(store))
    while first.pending is not None and first.pending.name != "claim_partition":
        first.step()
    first.step(Fault.LOST_ANSWER)
    assert isinstance(first.error, StoreTimeoutError)
    again = Task("c.claim.again", claimant.claim(store))
    again.cancel()
    again.finish()
    assert isinstance(again.error, asyncio.CancelledError)
    assert store.partitions[PID].owner == c.id  # it applied: its successor's takeover retires it
    assert store.mutators[c.id].retired_us is None


def _ibm_log(n: int) -> MemoryLog:
    return MemoryLog([Event("IBM", 1, f"e{o}").to_bytes() for o in range(n)])


def _stored(store: MemoryStore, mutator: uuid.UUID) -> tuple[int, int]:
    """(count, through_offset) of ``mutator``'s trades/IBM shard as stored."""
    shard = next(s for s in store.snapshot("trades", "IBM").shards if s.mutator == mutator)
    return state_from_bytes(shard.state).value(), shard.through_offset  # type: ignore[return-value]


def test_a_takeover_refuses_a_record_registered_before() -> None:
    """Retrying take_over with the same record could revive a mutator a later takeover has retired, whose
    writes the GC would then delete. Every takeover needs a fresh record."""
    store, log = MemoryStore(), _ibm_log(3)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    a_task.finish()
    _, b_task = _owner(store, log, 2, EPOCH_US + MIN_LIFETIME_US)
    b_task.finish()
    assert store.mutators[a.id].retired_us is not None  # B's takeover retired A
    again = Task("a.again", take_over(store, log, a, applier, EPOCH_US + 2 * MIN_LIFETIME_US, -1)).finish()
    assert isinstance(again.error, StaleEntryError)
    assert store.partitions[PID].owner == uuid.UUID(int=2)


def test_a_release_whose_retire_answer_was_lost_never_flushes_again() -> None:
    """The retire LWT applied but its answer was lost: the mutator must not flush any more (a write after its
    retire time would be hidden by the GC's deletion). Releasing again only retries the retire."""
    store, log = MemoryStore(), _ibm_log(6)
    record, task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, record, task.finish().result, 2, EPOCH_US)
    releasing = Task("release", release(store, mutator, EPOCH_US + MIN_LIFETIME_US))
    while releasing.pending is not None and releasing.pending.name != "retire_mutator":
        releasing.step()
    releasing.step(Fault.LOST_ANSWER)
    assert isinstance(releasing.error, StoreTimeoutError)
    assert store.mutators[record.id].retired_us is not None
    mutator.apply(log.records[3])
    failed = Task("flush", flush(store, mutator, EPOCH_US + MIN_LIFETIME_US + 1)).finish()
    assert isinstance(failed.error, FencedError)
    assert _stored(store, record.id) == (3, 2)
    run(release(store, mutator, EPOCH_US + MIN_LIFETIME_US + 2))
    assert mutator.released


@pytest.mark.parametrize("opened", [True, False], ids=["window-opened", "window-not-opened"])
def test_a_flush_retried_after_more_records_opens_a_new_window(opened: bool) -> None:
    """A flush fails after (or before) opening window k, then more records are applied and the flush is
    retried. Its shards must not claim the extra records under window k's intent: the retry opens window
    k+1 from the same committed offset, and a successor replaying it counts every record once."""
    store, log = MemoryStore(), _ibm_log(8)
    record, task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, record, task.finish().result, 2, EPOCH_US)  # flush 1: 0..2
    for r in log.records[3:5]:
        mutator.apply(r)
    first = Task("flush2", flush(store, mutator, EPOCH_US + 1))
    assert first.pending is not None
    if opened:
        first.step()  # open_window applies (window 2: 3..4) ...
        first.step(Fault.FAIL)  # ... but the first shard write never lands (the others do)
        first.finish()
    else:
        first.step(Fault.FAIL)  # open_window never applies
    assert isinstance(first.error, StoreTimeoutError)
    for r in log.records[5:7]:
        mutator.apply(r)
    run(flush(store, mutator, EPOCH_US + 2))
    row = store.partitions[PID]
    assert (row.flush_seq, row.committed_offset, row.intent_offset) == ((3, 2, 6) if opened else (2, 2, 6))
    assert _stored(store, record.id) == (7, 6)
    # A successor that finds this window open (the owner died before committing it) replays it exactly.
    _, successor = _owner(store, log, 2, EPOCH_US + MIN_LIFETIME_US)
    assert successor.finish().result.start_offset == 7
    assert _stored(store, record.id) == (7, 6)


def test_a_quiet_partition_leaves_no_window_to_replay() -> None:
    """A flush with nothing new to write records the last window complete, once: a takeover after a crash
    then replays nothing (a flush's window is otherwise closed only by the next flush, which on a quiet
    partition may never come)."""
    store, log = MemoryStore(), _ibm_log(4)
    record, task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, record, task.finish().result, 2, EPOCH_US)  # flush 1: 0..2
    assert store.partitions[PID].window_open
    quiet = Task("flush.quiet", flush(store, mutator, EPOCH_US + 1))
    assert quiet.pending is not None
    assert quiet.pending.name == "commit_window"
    quiet.step(Fault.LOST_ANSWER)  # applied, answer lost: the next quiet flush asks again
    assert isinstance(quiet.error, StoreTimeoutError)
    assert not store.partitions[PID].window_open
    assert run(flush(store, mutator, EPOCH_US + 2)) == 0
    assert mutator.window_committed
    assert Task("flush.again", flush(store, mutator, EPOCH_US + 3)).pending is None  # nothing more to say
    # The owner dies; its successor starts after record 2 without reading a record again.
    _, successor = _owner(store, log, 2, EPOCH_US + MIN_LIFETIME_US)
    result = successor.finish().result
    assert (result.start_offset, result.replayed_records, result.replayed_instances) == (3, 0, 0)
    assert _stored(store, record.id) == (3, 2)


def test_a_quiet_flush_by_a_replaced_owner_is_fenced() -> None:
    """Recording a window complete is fenced like opening one: a replaced owner learns it lost the
    partition and writes nothing."""
    store, log = MemoryStore(), _ibm_log(4)
    record, task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, record, task.finish().result, 2, EPOCH_US)
    _, successor = _owner(store, log, 2, EPOCH_US + MIN_LIFETIME_US)
    successor.finish()
    failed = Task("flush.quiet", flush(store, mutator, EPOCH_US + MIN_LIFETIME_US + 1)).finish()
    assert isinstance(failed.error, FencedError)
    assert mutator.fenced
    assert store.partitions[PID].owner == uuid.UUID(int=2)


def _claimed_mutator(store: MemoryStore, log: MemoryLog, n: int, born_us: int) -> tuple[Mutator, Claim]:
    """A claimant as the consumer runs one: claimed, warmed up, and applying before its takeover is finished."""
    record = MutatorEntry(uuid.UUID(int=n), PID.consumer_group, TOPIC, PID.partition, f"owner{n}",
                           born_us=born_us, expires_us=born_us + 10**12)
    claimed: Claim = run(claim(store, record, -1))
    fresh = applier()
    run(fresh.warm_up(log, claimed.start_offset))
    return Mutator(record, PID, fresh, applied_through=claimed.start_offset - 1,
                   flushed_through=claimed.start_offset - 1), claimed


def test_a_claimant_applies_before_its_takeover_is_finished() -> None:
    """The consumer applies new records while the takeover replays the open window behind them: both the
    replayed window and what was applied meanwhile count once."""
    store, log = MemoryStore(), _ibm_log(6)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 2, EPOCH_US)  # A dies with 0..2's window open
    b, claimed = _claimed_mutator(store, log, 2, EPOCH_US + 10)
    assert claimed.start_offset == 3
    assert not claimed.finished
    for record in log.records[3:]:
        b.apply(record)
    result: Takeover = run(finish_take_over(store, log, claimed, applier, lambda: EPOCH_US + 20))
    assert result.replayed_records == 3
    assert run(flush(store, b, EPOCH_US + 30)) == 2  # trades and shares of IBM
    assert _stored(store, a.id) == (3, 2)
    assert _stored(store, b.id) == (3, 5)


def test_a_takeover_retires_the_windows_writer_at_the_time_its_replay_ended() -> None:
    """A replay can take minutes. The writer's retirement must land within the GC's grace of its time: retired at
    the time the takeover began, it landed later than that, and a GC run whose cutoff was already above it would
    miss it while another saw it, both folding a key at one timestamp with different contents (Cassandra keeps
    the larger bytes: the fold without the writer's shards could win, and its shards were deleted either way)."""
    store, log = MemoryStore(), _ibm_log(6)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 2, EPOCH_US)  # A dies with 0..2's window open
    _, claimed = _claimed_mutator(store, log, 2, EPOCH_US + 10)
    now = [EPOCH_US + 20]
    replay_us = 600 * 10**6

    class SlowLog(MemoryLog):
        async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
            async for records in super().stream(topic, partition, first, last):
                now[0] += replay_us
                yield records

    slow = SlowLog([])
    slow.records = log.records
    result: Takeover = run(finish_take_over(store, slow, claimed, applier, lambda: now[0]))
    assert result.replayed_records == 3
    assert result.retired == (a.id,)
    assert store.mutators[a.id].retired_us == now[0] >= EPOCH_US + 20 + replay_us


def test_a_claimant_fenced_before_finishing_its_takeover_writes_nothing() -> None:
    """B claims and applies, C claims before B's takeover is finished: B's finish is fenced, and what B
    applied in memory is never written; C replays A's window and counts 3..5 itself."""
    store, log = MemoryStore(), _ibm_log(6)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 2, EPOCH_US)
    b, b_claim = _claimed_mutator(store, log, 2, EPOCH_US + 10)
    for record in log.records[3:]:
        b.apply(record)
    c, c_claim = _claimed_mutator(store, log, 3, EPOCH_US + 20)
    lost = Task("b.finish", finish_take_over(store, log, b_claim, applier, lambda: EPOCH_US + 30)).finish()
    assert isinstance(lost.error, FencedError)
    run(finish_take_over(store, log, c_claim, applier, lambda: EPOCH_US + 40))
    for record in log.records[3:]:
        c.apply(record)
    run(flush(store, c, EPOCH_US + 50))
    assert _stored(store, a.id) == (3, 2)
    assert _stored(store, c.id) == (3, 5)
    assert all(shard.mutator != b.id for shard in store.snapshot("trades", "IBM").shards)
    assert store.mutators[b.id].retired_us is not None  # C's finish retired the claimant it fenced


def test_a_rotation_claims_only_from_the_rotating_mutator() -> None:
    """A member that released its mutator and lost the partition meanwhile (a zombie) must not fence the
    rightful owner when it rotates: its claim from itself is refused and the row keeps its owner."""
    store, log = MemoryStore(), _ibm_log(4)
    zombie, task = _owner(store, log, 1, EPOCH_US)
    mutator = _consume_and_flush(store, log, zombie, task.finish().result, 1, EPOCH_US)
    run(release(store, mutator, EPOCH_US + MIN_LIFETIME_US))
    _, rightful = _owner(store, log, 2, EPOCH_US + MIN_LIFETIME_US + 1)
    rightful.finish()
    rotated = MutatorEntry(uuid.UUID(int=3), PID.consumer_group, TOPIC, PID.partition, "zombie",
                            born_us=EPOCH_US + MIN_LIFETIME_US + 2, expires_us=EPOCH_US + 10**12)
    with pytest.raises(FencedError):
        run(claim(store, rotated, -1, from_owner=zombie.id))
    assert store.partitions[PID].owner == uuid.UUID(int=2)


def test_a_replay_hands_every_invalid_record_of_its_window_to_the_dead_letter_hook() -> None:
    """The writer of an open window may have died before its dead letters were delivered: the replay
    passes each invalid record of the window to ``on_invalid`` before it closes the window."""
    store = MemoryStore()
    values = [Event("IBM", 1, "e0").to_bytes(), MALFORMED[0], Event("IBM", 2, "e2").to_bytes(), MALFORMED[1]]
    log = MemoryLog(values, offsets=[0, 2, 3, 7])
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 7, EPOCH_US)  # A dies with 0..7's window open
    _, claimed = _claimed_mutator(store, log, 2, EPOCH_US + 10)
    sent: list[int] = []

    async def dead_letter(record: object, error: object) -> None:
        sent.append(record.offset)  # type: ignore[attr-defined]

    run(finish_take_over(store, log, claimed, applier, lambda: EPOCH_US + 20, on_invalid=dead_letter))
    assert sent == [2, 7]
    assert not store.partitions[PID].window_open


def test_a_replay_whose_records_left_the_log_says_which() -> None:
    """Records of an open window deleted by retention are reported by offset, not silently skipped; with
    ``accept_lost`` the replay counts what is left."""
    store = MemoryStore()
    log = _ibm_log(6)
    a, a_task = _owner(store, log, 1, EPOCH_US)
    _consume_and_flush(store, log, a, a_task.finish().result, 5, EPOCH_US)  # A dies with 0..5's window open
    log.start = 2
    _, claimed = _claimed_mutator(store, log, 2, EPOCH_US + 10)
    with pytest.raises(RecordsLostError) as lost:
        run(finish_take_over(store, log, claimed, applier, lambda: EPOCH_US + 20))
    assert (lost.value.first, lost.value.last) == (0, 1)
    result: Takeover = run(finish_take_over(store, log, claimed, applier, lambda: EPOCH_US + 30, accept_lost=True))
    assert result.replayed_records == 4


class KeepsStateEpochs(Epochs):
    """Epochs whose resets drop no state: a mutator goes on in the new epoch with what it counted before."""

    def clears(self, reset: Reset, counter: str, key: str) -> bool:
        return False

    def copy(self) -> Epochs:
        return self


class ResurrectingResets(MemoryResets):
    """Hands out :class:`KeepsStateEpochs`: at a reset, the next flush writes the pre-reset events again."""

    async def epochs_at(self, topic: str, partition: int, counters: Sequence[str], start: int) -> Epochs:
        found = await super().epochs_at(topic, partition, counters, start)
        return KeepsStateEpochs(found.all_keys, found.by_key, found.applied)


class ResurrectingModel(ProtocolModel):
    resets_class = ResurrectingResets


class ForgetfulResets(MemoryResets):
    """Records no reset position: a successor starting after a control record does not know its reset."""

    async def record_positions(self, positions: Sequence[ResetPosition]) -> None:
        return None


class ForgetfulModel(ProtocolModel):
    resets_class = ForgetfulResets


def test_model_catches_a_reset_that_a_flush_resurrects() -> None:
    """With a reset that switches the epoch but keeps the states counted before it, the model finds a
    pre-reset event read after the reset."""
    with pytest.raises(ProtocolViolation):
        run_model(ResurrectingModel, MUST_FAIL_SETTINGS)


def test_model_catches_a_successor_that_does_not_learn_a_reset() -> None:
    """With no reset position recorded, a successor starting after a control record writes its events in the
    old epoch's cells: the model finds them lost to readers."""
    with pytest.raises(ProtocolViolation):
        run_model(ForgetfulModel, MUST_FAIL_SETTINGS)
