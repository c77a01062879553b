"""An LWT that applied but whose answer was lost is resolved by reading the ownership row, never by starting
over with a new mutator: the consumer's own :class:`~consumer.ownership.Ownership` over the in-memory store,
each scenario stepped one storage operation at a time."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumer.dead_letters import DeadLetters
from consumer.ownership import Ownership
from consumer.protocol import flush
from countersink.cassandra import CassandraError
from schemas.kinds import state_from_bytes
from tests.unit.memory_store import BackgroundTask, Fault, MemoryLog, MemoryStore, StoreTimeoutError, Task
from tests.unit.test_protocol_model import (
    CONFIG,
    COUNTERS,
    EPOCH_US,
    PID,
    ROUTER,
    TP,
    DeadLetterTopic,
    Event,
    KafkaPositions,
    RetryEachStep,
)


class Process:
    """One consumer process's ownership over ``store``, with its own clock, ids and background takeovers."""

    def __init__(self, store: MemoryStore, log: MemoryLog, first_id: int) -> None:
        self.store = store
        self.now_us = EPOCH_US
        self.ids = iter(range(first_id, first_id + 100))
        self.background: list[BackgroundTask] = []
        self.ops: list[str] = []

        def spawn(finishing: Coroutine[Any, Any, None]) -> BackgroundTask:
            self.background.append(BackgroundTask("finish_take_over", finishing))
            return self.background[-1]

        self.ownership = Ownership(
            CONFIG, "host", ROUTER, COUNTERS, store, log, cast(AIOKafkaConsumer, KafkaPositions()),
            DeadLetters(cast(AIOKafkaProducer, DeadLetterTopic()), CONFIG), RetryEachStep(CONFIG, lambda: None),
            clock=lambda: self.now_us, new_id=lambda: uuid.UUID(int=next(self.ids)), spawn=spawn)

    def run(self, step: Coroutine[Any, Any, Any] | Task, lose: str | None = None) -> Task:
        """Run ``step`` (or a task already started) and every takeover it leaves in the background to the end;
        the first LWT named ``lose`` applies with its answer lost (the retries that follow are acknowledged).
        ``ops`` records every storage operation run."""
        task = step if isinstance(step, Task) else Task("step", step)
        for running in itertools.chain([task], self._backgrounds()):  # takeovers it starts meanwhile too
            while not running.done:
                assert running.pending is not None
                self.ops.append(running.pending.name)
                if running.pending.name == lose:
                    running.step(Fault.LOST_ANSWER)
                    lose = None
                else:
                    running.step()
            assert running.error is None, running.error
        assert lose is None, f"no {lose} to lose"
        return task

    def _backgrounds(self) -> Iterator[Task]:
        while self.background:
            yield self.background.pop(0).task


def _log(n: int) -> MemoryLog:
    return MemoryLog([Event("IBM", 1, f"e{o}").to_bytes() for o in range(n)])


def _owned_and_flushed(store: MemoryStore, log: MemoryLog) -> Process:
    process = Process(store, log, 1)
    process.run(process.ownership.take([TP]))
    mutator = process.ownership.applying(TP)
    assert mutator is not None
    mutator.apply_batch(log.records[:3])
    return process


def test_a_rotation_whose_claim_lost_its_answer_goes_on_with_the_mutator_it_claimed_for() -> None:
    """The claim LWT of a rotation applies and its answer is lost: the retry reads the row, finds the
    mutator it proposed is the owner and carries on with it; the partition is not dropped and paused."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    old = process.ownership.mutators[TP]
    process.now_us += 10**6
    process.run(process.ownership.rotate(TP, "test"), lose="claim_partition")
    new = process.ownership.applying(TP)
    assert new is not None, "the rotation dropped the partition"
    assert store.partitions[PID].owner == new.id != old.id
    assert store.mutators[old.id].retired_us is not None
    # No mutator is left registered that nobody runs or retires: the old one is retired, the new one owns.
    assert {m.id for m in store.mutators.values() if m.retired_us is None} == {new.id}
    assert new.applied_through == 2
    new.apply_batch(log.records[3:])
    process.run(process.ownership.release_partition(TP))
    assert store.partitions[PID].committed_offset == 5


def _unretired(store: MemoryStore) -> set[uuid.UUID]:
    return {m.id for m in store.mutators.values() if m.retired_us is None}


@pytest.mark.parametrize("lost", ["commit_window", "retire_mutator", "register_mutator", "claim_partition",
                                  "close_window"])
def test_a_rotation_that_loses_any_answer_keeps_its_partition(lost: str) -> None:
    """Whichever LWT of a rotation applies with its answer lost, the process ends owning the partition with
    the one fresh mutator it claimed for, the old one retired, and counting goes on exactly."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    old = process.ownership.mutators[TP]
    process.now_us += 10**6
    process.run(process.ownership.rotate(TP, "test"), lose=lost)
    new = process.ownership.applying(TP)
    assert new is not None
    assert store.partitions[PID].owner == new.id == uuid.UUID(int=2)  # no mutator made for a retry
    assert _unretired(store) == {new.id}
    assert store.mutators[old.id].retired_us is not None
    new.apply_batch(log.records[3:])
    process.run(process.ownership.release_partition(TP))
    assert store.partitions[PID].committed_offset == 5
    assert {(s.mutator, s.through_offset) for s in store.snapshot("trades", "IBM").shards} == {
        (old.id, 2), (new.id, 5)}


@pytest.mark.parametrize("lost", ["register_mutator", "create_partition"])
def test_a_first_take_that_loses_its_answer_goes_on_with_its_mutator(lost: str) -> None:
    """The first claim of a partition (its row created) whose registration or create applied with the answer
    lost goes on with the mutator it made: no second one is registered."""
    store, log = MemoryStore(), _log(3)
    process = Process(store, log, 1)
    process.run(process.ownership.take([TP]), lose=lost)
    mutator = process.ownership.applying(TP)
    assert mutator is not None
    assert store.partitions[PID].owner == mutator.id == uuid.UUID(int=1)
    assert set(store.mutators) == {mutator.id}


def test_a_takeover_whose_close_lost_its_answer_does_not_replay_again() -> None:
    """A takeover replays the window its predecessor left open, then its close applies with the answer lost:
    the retry reads the row, sees the window closed by its own mutator, and neither replays nor closes again."""
    store, log = MemoryStore(), _log(6)
    crashed = _owned_and_flushed(store, log)
    mutator = crashed.ownership.mutators[TP]
    crashed.run(flush(store, mutator, EPOCH_US))  # then it dies with that window open
    assert store.partitions[PID].window_open
    successor = Process(store, log, 10)
    successor.now_us += 10**6
    changes = len(store.row_history)
    successor.run(successor.ownership.take([TP]), lose="close_window")
    taken = successor.ownership.applying(TP)
    assert taken is not None
    row = store.partitions[PID]
    assert (row.owner, row.window_mutator, row.committed_offset, row.intent_offset) == (taken.id, taken.id, 2, 2)
    assert len(store.row_history) - changes == 2  # the claim and one close
    # One replay: the key's row (both counters of IBM) is one write.
    assert (successor.ops.count("write_shard"), successor.ops.count("close_window")) == (1, 1)
    assert store.mutators[mutator.id].retired_us is not None
    assert taken.applied_through == 2


def test_a_claim_whose_answer_is_lost_while_another_member_claims_is_retired_and_a_fresh_one_claims() -> None:
    """A claim applies with its answer lost and another member claims from it before the retry reads the row:
    whether it applied cannot be told, so that mutator is retired unused (the other member may have retired it
    too) and never claims again; a fresh one claims the partition."""
    store, log = MemoryStore(), _log(3)
    first = _owned_and_flushed(store, log)
    assert first.ownership.mutators[TP].id == uuid.UUID(int=1)
    second, rival = Process(store, log, 10), Process(store, log, 20)
    taking = Task("take", second.ownership.take([TP]))
    while taking.pending is not None and taking.pending.name != "claim_partition":
        taking.step()
    taking.step(Fault.LOST_ANSWER)  # mutator 10 owns the row; its process does not know
    assert taking.pending is not None
    assert taking.pending.name == "retry_pause"
    rival.run(rival.ownership.take([TP]))  # claims from 10, retires it
    assert store.partitions[PID].owner == uuid.UUID(int=20)
    second.run(taking)
    mutator = second.ownership.applying(TP)
    assert mutator is not None
    assert mutator.id == uuid.UUID(int=11)
    assert store.partitions[PID].owner == mutator.id
    assert store.mutators[uuid.UUID(int=10)].retired_us is not None


def test_a_flush_whose_window_answer_was_lost_then_whose_next_window_failed_goes_on() -> None:
    """Window 2 opens with its answer lost; more records come and the retry opens window 3, which times out
    before applying; the next retry finds window 2 in the row, neither the last flush completed (1) nor the
    last attempted (3). It is this mutator's own window: the owner goes on (it was fenced, and the partition
    paused for good, with its own mutator still the owner), and a successor replaying counts every record
    once."""
    store, log = MemoryStore(), _log(9)
    process = _owned_and_flushed(store, log)
    mutator = process.ownership.mutators[TP]
    process.run(flush(store, mutator, EPOCH_US))  # window 1: records 0..2, complete
    mutator.apply_batch(log.records[3:5])
    first = Task("flush", flush(store, mutator, EPOCH_US + 1))
    first.step(Fault.LOST_ANSWER)  # window 2 (3..4) opens; the answer is lost
    assert isinstance(first.error, StoreTimeoutError)
    mutator.apply_batch(log.records[5:7])
    second = Task("flush", flush(store, mutator, EPOCH_US + 2))
    second.step()  # reads the row: window 2, with an intent older than what is applied now
    assert second.pending is not None
    assert second.pending.name == "open_window"
    second.step(Fault.FAIL)  # window 3 never opens
    assert isinstance(second.error, StoreTimeoutError)
    assert store.partitions[PID].flush_seq == 2
    process.run(flush(store, mutator, EPOCH_US + 3))
    assert not mutator.fenced
    row = store.partitions[PID]
    assert (row.owner, row.flush_seq, row.committed_offset, row.intent_offset) == (mutator.id, 3, 2, 6)
    # The owner dies with that window open: its successor replays 3..6 once.
    successor = Process(store, log, 10)
    successor.now_us += 10**6
    successor.run(successor.ownership.take([TP]))
    assert {(s.mutator, s.through_offset) for s in store.snapshot("trades", "IBM").shards} == {(mutator.id, 6)}
    assert state_from_bytes(store.snapshot("trades", "IBM").shards[0].state).value() == 7


@pytest.mark.parametrize("stopped_at", ["read_partition", "retry_pause"])
def test_a_process_stopped_while_it_claims_leaves_no_orphan(stopped_at: str) -> None:
    """A fresh mutator is registered; the process stops before its claim is sent (at its read of the row, or
    while it waits to try again after that read timed out): the cancelled takeover retires
    the fresh mutator on the way out, so no registered mutator is left that nobody runs or retires (the old
    one, released, is retired; the partition's owner is untouched)."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    old = process.ownership.mutators[TP]
    process.run(process.ownership.release_partition(TP))
    process.now_us += 10**6
    task = Task("take", process.ownership.take([TP]))
    registered = False
    while task.pending is not None:
        registered = registered or len(store.mutators) > 1
        if registered and task.pending.name == "read_partition" and stopped_at == "retry_pause":
            task.step(Fault.FAIL)  # the row unreadable for now: tried again after a pause
            continue
        if registered and task.pending.name == stopped_at:
            break
        task.step()
    assert task.pending is not None
    assert task.pending.name == stopped_at, task.pending
    fresh = [m.id for m in store.mutators.values() if m.id != old.id]
    assert len(fresh) == 1
    task.cancel()
    task.finish()
    assert store.mutators[fresh[0]].retired_us is not None
    assert _unretired(store) == set()
    assert store.partitions[PID].owner == old.id


def test_each_claim_records_where_its_mutator_starts() -> None:
    """A first claim and a rotation's each record their mutator's start offset and the counters it counts (read
    by ``countersink trace``), the rotation's from the first offset its predecessor had not flushed."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    first = process.ownership.mutators[TP]
    assert store.recorded_starts == {first.id: 0}
    process.run(flush(store, first, EPOCH_US))
    process.now_us += 10**6
    process.run(process.ownership.rotate(TP, "test"))
    second = process.ownership.applying(TP)
    assert second is not None
    assert second.id != first.id
    assert store.recorded_starts == {first.id: 0, second.id: 3}
    counted = frozenset(c.name for c in process.ownership.counters.for_topic(TP.topic))
    assert counted  # the counters each counts on the topic, recorded with its start
    assert store.recorded_counters == {first.id: counted, second.id: counted}


def test_a_start_that_cannot_be_recorded_holds_the_takeover_until_it_is() -> None:
    """A takeover replaying a mutator's window decides by its recorded counters which of them that window counts:
    a mutator whose start could not be recorded opens no window. Its takeover retries the write (five timeouts in
    a row here, past the immediate attempts) and stays pending meanwhile, so that nothing flushes the mutator;
    once its start is recorded, it flushes."""

    class UnrecordedFiveTimes(MemoryStore):
        failures = 0

        async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str] = frozenset()
                               ) -> None:
            if self.failures < 5:
                self.failures += 1
                raise StoreTimeoutError("record_start timed out")
            await super().record_start(mutator, start_offset, counters)

    store, log = UnrecordedFiveTimes(), _log(6)
    process = Process(store, log, 1)
    taking = Task("take", process.ownership.take([TP]))  # the claim; its takeover goes on in the background
    while not taking.done:
        taking.step()
    assert taking.error is None, taking.error
    mutator = process.ownership.mutators[TP]
    finishing = process.background.pop(0).task
    pauses = 0
    while not finishing.done:
        assert finishing.pending is not None
        if finishing.pending.name == "retry_pause":
            pauses += 1
            assert process.ownership.takeover_pending(mutator)  # so Flushing.flush_one passes it by
            assert store.recorded_starts == {}
        finishing.step()
    assert finishing.error is None, finishing.error
    assert pauses == 1  # three attempts at once, a pause, then two more and the one that is recorded
    assert store.failures == 5
    assert store.recorded_starts == {mutator.id: 0}
    assert store.recorded_counters[mutator.id] == frozenset(c.name for c in COUNTERS.for_topic(TP.topic))
    assert not process.ownership.takeover_pending(mutator)
    mutator.apply_batch(log.records[:3])
    process.run(flush(store, mutator, EPOCH_US))
    assert store.partitions[PID].intent_offset == 2


def test_a_start_refused_for_good_ends_the_takeover_before_any_window() -> None:
    """An error that retrying cannot mend (a permission refused, say) ends the takeover with that error: the
    mutator never flushes a window whose counters a successor could not read."""

    class Refused(MemoryStore):
        async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str] = frozenset()
                               ) -> None:
            raise CassandraError("User consumer has no MODIFY permission on <table countersink.mutators>")

    store, log = Refused(), _log(6)
    process = Process(store, log, 1)
    with pytest.raises(AssertionError, match="no MODIFY permission"):
        process.run(process.ownership.take([TP]))
    assert store.recorded_starts == {}
    assert PID not in store.partitions or store.partitions[PID].intent_offset < 0


@pytest.mark.parametrize("lost", [StoreTimeoutError("record_start timed out"), ConnectionResetError("reset by peer")],
                         ids=["timeout", "connection-reset"])
def test_a_start_whose_answer_was_lost_is_written_again(lost: Exception) -> None:
    """A timed-out write of a mutator's start (it may have applied or not), or one whose connection was lost, is
    tried again at once: recorded, nothing logged. It was logged unrecorded, and trace then reported that
    mutator's records as before starts were recorded (a lost connection was not retried: the one retry policy,
    ``countersink.retry.is_retriable``, takes OSError as retriable)."""
    from structlog.testing import capture_logs

    class TimesOutOnce(MemoryStore):
        timed_out = 0

        async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str] = frozenset()
                               ) -> None:
            if not self.timed_out:
                self.timed_out += 1
                raise lost
            await super().record_start(mutator, start_offset, counters)

    store, log = TimesOutOnce(), _log(6)
    with capture_logs() as logs:
        process = _owned_and_flushed(store, log)
    mutator = process.ownership.applying(TP)
    assert mutator is not None
    assert store.recorded_starts == {mutator.id: 0}
    assert not [entry for entry in logs if entry["event"] == "start_retry"]  # tried again at once, not after a pause
