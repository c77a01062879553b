"""A topic deleted and created again under its name: the consumer's own :class:`~consumer.ownership.Ownership`
over the in-memory store stops the partition without writing what it applied, at a flush's check, at a
release and at a claim (countersink.topic_ids)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection
from typing import Any

import pytest

from consumer.protocol import flush
from countersink.topic_ids import TopicRecreatedError
from tests.unit.memory_store import MemoryStore, Task
from tests.unit.test_lost_answers import Process, _log, _owned_and_flushed
from tests.unit.test_protocol_model import EPOCH_US, PID, TP

COUNTED, NEW = uuid.UUID(int=1), uuid.UUID(int=2)


class KafkaIds:
    """Kafka's answer: the topic stands for the one counted until ``recreate``; ``away`` fails every check."""

    def __init__(self) -> None:
        self.recreated = False
        self.away = False
        self.asked: list[tuple[set[str], float | None]] = []

    async def changed(self, topics: Collection[str], within_s: float | None = None) -> dict[str, TopicRecreatedError]:
        self.asked.append((set(topics), within_s))
        if self.away:
            raise TimeoutError
        if not self.recreated:
            return {}
        return {topic: TopicRecreatedError(topic, COUNTED, NEW) for topic in topics}


def _checked(process: Process) -> KafkaIds:
    kafka = KafkaIds()
    process.ownership.topic_ids = kafka
    return kafka


def test_a_flush_check_that_finds_the_topic_created_again_stops_the_partition_unwritten() -> None:
    """Records applied since the last flush are not written: some may be the new topic's, at the old one's
    offsets. The mutator is fenced (it never writes again) and the partition is stopped, paused."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)  # applied 0..2
    kafka = _checked(process)
    mutator = process.ownership.mutators[TP]
    process.run(flush(store, mutator, EPOCH_US))
    process.run(process.ownership.check_topics())
    assert process.ownership.applying(TP) is mutator  # the same topic: nothing changes
    mutator.apply_batch(log.records[3:])
    kafka.recreated = True
    process.run(process.ownership.check_topics())
    assert kafka.asked[-1][0] == {TP.topic}
    assert kafka.asked[-1][1] is not None  # bounded: a flush does not wait out Kafka's timeout
    assert TP not in process.ownership.mutators
    assert mutator.fenced
    assert isinstance(process.ownership.stopped[TP], TopicRecreatedError)
    row = store.partitions[PID]
    assert row.intent_offset == 2
    assert {s.through_offset for s in store.snapshot("trades", "IBM").shards} == {2}
    # A release after it (the rebalance that follows) writes nothing either.
    process.run(process.ownership.release_partition(TP))
    assert store.partitions[PID] == row
    assert {s.through_offset for s in store.snapshot("trades", "IBM").shards} == {2}


def test_a_check_that_cannot_be_made_stops_nothing_and_writes_nothing() -> None:
    """Kafka away: the check says so (the loop then starts no flush), and a rotation due meanwhile waits."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    mutator = process.ownership.mutators[TP]
    kafka = _checked(process)
    kafka.away = True
    assert process.run(process.ownership.check_topics()).result is False
    assert process.ownership.applying(TP) is mutator
    assert not process.ownership.stopped
    process.run(process.ownership.rotate(TP, "test"))
    assert process.ownership.applying(TP) is mutator
    assert PID not in store.partitions or store.partitions[PID].intent_offset == -1
    assert not store.snapshot("trades", "IBM").shards
    kafka.away = False
    assert process.run(process.ownership.check_topics()).result is True


def test_a_rotation_checks_before_its_release_writes() -> None:
    """A rotation's release flushes what was applied since the last flush: a topic created again meanwhile stops
    the partition instead, nothing of it written."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    mutator = process.ownership.mutators[TP]
    process.run(flush(store, mutator, EPOCH_US))
    mutator.apply_batch(log.records[3:])
    _checked(process).recreated = True
    process.now_us += 10**6
    process.run(process.ownership.rotate(TP, "test"))
    assert TP not in process.ownership.mutators
    assert isinstance(process.ownership.stopped[TP], TopicRecreatedError)
    assert store.partitions[PID].intent_offset == 2
    assert {s.through_offset for s in store.snapshot("trades", "IBM").shards} == {2}


def test_a_release_of_a_partition_whose_topic_was_created_again_writes_nothing() -> None:
    """``release`` checks the revoked partitions' topics first (as here), then releases each."""
    store, log = MemoryStore(), _log(6)
    process = _owned_and_flushed(store, log)
    kafka = _checked(process)
    kafka.recreated = True
    process.run(process.ownership.check_topics([TP]))
    process.run(process.ownership.release_partition(TP))
    assert store.partitions[PID].intent_offset == -1  # as claimed: no flush of the records applied
    assert not store.snapshot("trades", "IBM").shards


def test_a_claim_of_a_topic_created_again_neither_replays_nor_counts() -> None:
    """The predecessor crashed with a window open; the topic is then created again. The successor's claim
    finds the new id before its takeover replays that window (records of the new topic at the old offsets)."""
    store, log = MemoryStore(), _log(6)
    crashed = _owned_and_flushed(store, log)
    crashed.run(flush(store, crashed.ownership.mutators[TP], EPOCH_US))  # then it dies with that window open
    assert store.partitions[PID].window_open
    successor = Process(store, log, 10)
    kafka = _checked(successor)
    kafka.recreated = True
    successor.now_us += 10**6
    successor.run(successor.ownership.take([TP]))
    assert successor.ownership.applying(TP) is None
    assert isinstance(successor.ownership.stopped[TP], TopicRecreatedError)
    assert "write_shard" not in successor.ops
    assert store.partitions[PID].window_open  # left as the crash left it


async def _one_after_another(*steps: Any, return_exceptions: bool = False) -> list[Any]:
    """``asyncio.gather`` as the stepped harness can run it: each release in turn."""
    done: list[Any] = []
    for step in steps:
        try:
            done.append(await step)
        except Exception as exc:
            if not return_exceptions:
                raise
            done.append(exc)
    return done


def test_a_release_kafka_cannot_check_writes_nothing_and_ends_a_takeover_still_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Revoked while its takeover replays a crashed owner's window, with Kafka away: nothing is written, and the
    takeover ends with the partition (it would replay for a partition another member owns, and could stop it
    here); the next owner finds the window as the crash left it."""
    monkeypatch.setattr(asyncio, "gather", _one_after_another)
    store, log = MemoryStore(), _log(6)
    crashed = _owned_and_flushed(store, log)
    crashed.run(flush(store, crashed.ownership.mutators[TP], EPOCH_US))  # then it dies with that window open
    successor = Process(store, log, 10)
    kafka = _checked(successor)
    successor.now_us += 10**6
    taking = Task("take", successor.ownership.take([TP]))
    while not taking.done:
        taking.step()
    mutator = successor.ownership.mutators[TP]
    takeover = successor.ownership._takeovers[mutator.id]
    assert not takeover.done()
    kafka.away = True
    releasing = Task("release", successor.ownership.release([TP]))
    while not releasing.done:
        releasing.step()
    assert releasing.error is None, releasing.error
    assert mutator.fenced
    assert takeover.cancelled()
    assert mutator.id not in successor.ownership._takeovers
    assert store.partitions[PID].window_open
    assert not store.snapshot("trades", "IBM").shards or {
        s.mutator for s in store.snapshot("trades", "IBM").shards} == {uuid.UUID(int=1)}
