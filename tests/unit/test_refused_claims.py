"""A mutator registered for a claim that is refused is retired at once, so the GC collects its registry row."""

from __future__ import annotations

import uuid

import pytest

from consumer.protocol import FencedError, claim
from consumer.storage import MutatorEntry, PartitionId
from tests.unit.memory_store import MemoryStore, run

PID = PartitionId("g", "trades", 0)


def entry(n: int, born_us: int) -> MutatorEntry:
    return MutatorEntry(uuid.UUID(int=n), PID.consumer_group, PID.topic, PID.partition, f"host{n}", born_us,
                        born_us + 10**12)


def test_a_rotation_refused_retires_its_mutator() -> None:
    """A rotation that finds the partition owned by someone else raises FencedError and leaves its new
    mutator retired (it never owned the partition and wrote nothing), while the owner stays as it was."""
    store = MemoryStore()
    owner = entry(1, 1_000)
    run(claim(store, owner, -1))
    stranger, rotated = entry(2, 2_000), entry(3, 3_000)
    with pytest.raises(FencedError):
        run(claim(store, rotated, -1, from_owner=stranger.id))
    assert store.mutators[rotated.id].retired_us == rotated.born_us
    assert store.mutators[owner.id].retired_us is None
    assert store.partitions[PID].owner == owner.id


def test_a_claim_that_wins_is_not_retired() -> None:
    """A claim that takes the partition leaves its mutator unretired: retiring is for refused claims only."""
    store = MemoryStore()
    first, second = entry(1, 1_000), entry(2, 2_000)
    run(claim(store, first, -1))
    run(claim(store, second, -1))
    assert store.mutators[second.id].retired_us is None
