"""A mutator's memory estimate: kept up to date by each flush from the states it wrote, not all it holds."""

from __future__ import annotations

import json
import uuid

from consumer.applying import MEASURED_BYTES, ROW_BYTES, Applier, Mutator, Record, RetryWindow
from consumer.protocol import claim, finish_take_over, flush
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.kinds import State
from tests.unit.memory_store import MemoryLog, MemoryStore, run

COUNTERS = parse_definitions("""
[[counter]]
name = "views"
topics = ["t"]
kind = "count"
key = ["page"]

[[counter]]
name = "visitors"
topics = ["t"]
kind = "distinct"
key = ["page"]
value = "user"

[[counter]]
name = "latency"
topics = ["t"]
kind = "quantiles"
key = ["page"]
value = "ms"
""")


def _owner(store: MemoryStore) -> Mutator:
    """A mutator that has taken the partition over, as the consumer's first owner does."""
    entry = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", born_us=1_000, expires_us=10**15)

    def applier() -> Applier:
        return Applier(EventRouter(COUNTERS), COUNTERS, "t", 0, RetryWindow(0))

    run(finish_take_over(store, MemoryLog([]), run(claim(store, entry, -1)), applier, 1_000))
    return Mutator(entry, PartitionId("g", "t", 0), applier(), applied_through=-1, flushed_through=-1)


def _records(first: int, pages: list[str], users: int) -> list[Record]:
    return [Record(first + i, json.dumps({"page": pages[i % len(pages)], "user": f"u{i % users}",
                                          "ms": i % 97}).encode())
            for i in range(len(pages) * users)]


def _held(mutator: Mutator) -> int:
    """What the states hold now, measured one by one."""
    return sum(state.size_bytes() for state in mutator.states.values())


def test_after_each_flush_the_estimate_equals_the_states_measured_one_by_one() -> None:
    """Sketches grow as they fill; after a flush the estimate is the sum of every state's size, as a full
    measurement would give, whether a page was written by this flush or an earlier one."""
    store = MemoryStore()
    mutator = _owner(store)
    mutator.apply_batch(_records(0, ["home", "about", "docs"], 400))
    run(flush(store, mutator, 2_000))
    assert mutator.state_bytes == _held(mutator)
    mutator.apply_batch(_records(mutator.applied_through + 1, ["docs"], 3_000))  # only docs grows
    run(flush(store, mutator, 3_000))
    assert mutator.state_bytes == _held(mutator)
    rows = sum(len(cache) for cache in mutator.rows or [])
    assert mutator.memory_bytes() == _held(mutator) + rows * ROW_BYTES + 6 * MEASURED_BYTES


def test_a_flush_measures_only_the_states_it_wrote() -> None:
    """A flush after one page changed measures that page's sketches, not the thousand others held."""
    store = MemoryStore()
    mutator = _owner(store)
    mutator.apply_batch(_records(0, [f"p{i}" for i in range(1_000)], 2))
    run(flush(store, mutator, 2_000))
    mutator.apply_batch(_records(mutator.applied_through + 1, ["p7"], 50))
    measured: list[State] = []
    for state in mutator.states.values():
        original = type(state).size_bytes

        def spy(self: State, original=original) -> int:  # type: ignore[no-untyped-def]
            measured.append(self)
            return original(self)

        state.__class__ = type(f"Spied{type(state).__name__}", (type(state),), {"size_bytes": spy, "__slots__": ()})
    run(flush(store, mutator, 3_000))
    assert {id(s) for s in measured} == {id(mutator.states[("visitors", "p7")]),
                                         id(mutator.states[("latency", "p7")])}
