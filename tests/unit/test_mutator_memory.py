"""A mutator's memory estimate: kept up to date by each flush from the states it wrote, not all it holds."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from consumer.applying import MEASURED_BYTES, ROW_BYTES, Applier, Mutator, Record, RetryWindow, instance_bytes
from consumer.protocol import claim, finish_take_over, flush
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.kinds import State
from schemas.resets import Reset
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

    run(finish_take_over(store, MemoryLog([]), run(claim(store, entry, -1)), applier, lambda: 1_000))
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
    instances = sum(instance_bytes(key) for _, key in mutator.states)
    assert mutator.memory_bytes() == _held(mutator) + instances + rows * ROW_BYTES + 6 * MEASURED_BYTES


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


def test_a_reset_gives_back_what_its_instances_were_estimated_at() -> None:
    """A reset drops the states it covers: the estimate falls by their states and their keys, to what the
    instances left hold."""
    store = MemoryStore()
    mutator = _owner(store)
    mutator.apply_batch(_records(0, ["home", "a-much-longer-page-name" * 20], 50))
    assert mutator.instance_bytes == sum(instance_bytes(key) for _, key in mutator.states)
    for counter in ("views", "visitors", "latency"):
        mutator.reset(Reset(f"r-{counter}", counter, 1), mutator.applied_through)
    assert (mutator.states, mutator.state_bytes, mutator.instance_bytes) == ({}, 0, 0)


# Run in a process of its own (resident memory measured from a fresh heap): a mutator applies ``events`` records,
# each a new instance of every counter, on the batch path or record at a time; prints the estimate and the
# growth of resident memory, in bytes.
_MEASURE = """
import gc, json, sys, uuid
from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
text, events, key_bytes, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "batch"
window, id_bytes = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 5 else (0, 0)
counters = parse_definitions(text)
mutator = Mutator(MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", 0, 10**18), PartitionId("g", "t", 0),
                  Applier(EventRouter(counters), counters, "t", 0, RetryWindow(window)), -1, -1)
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
gc.collect()
before = resident()
for start in range(0, events, 1000):
    records = [Record(i, json.dumps({"u": f"{i:08d}".ljust(key_bytes, "k") if key_bytes else "k", "v": i % 1000,
                                     "ts": 1_600_000_000 + i * 3600, "id": f"{i:08d}".ljust(id_bytes, "e")}).encode())
               for i in range(start, start + 1000)]
    if batch:
        mutator.apply_batch(records)
    else:
        for record in records:
            mutator.apply(record)
gc.collect()
print(mutator.memory_bytes(), resident() - before)
"""

_KEYED = """
[[counter]]
name = "hourly"
topics = ["t"]
kind = "count"
key = ["u"]
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }

""" + (_TOTAL := """
[[counter]]
name = "total"
topics = ["t"]
kind = "sum"
key = ["u"]
value = "v"
""")

_QUANTILES = """
[[counter]]
name = "latency"
topics = ["t"]
kind = "quantiles"
key = ["u"]
value = "v"
k = {k}
"""


def _estimate_and_growth(*args: str) -> tuple[int, int]:
    """The estimate and the resident growth of a fresh process running _MEASURE with ``args``."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, check=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    estimate, grown = map(int, done.stdout.split())
    return estimate, grown


@pytest.mark.parametrize("id_bytes", [36, 990])
def test_the_estimate_follows_resident_memory_whatever_the_event_ids(id_bytes: int) -> None:
    """The publisher-retry window of 60,000 records holds an id of each, as long as its publisher made it: the
    estimate within 0.6× to 1.6× what the process grew by (ids near max_key_bytes were estimated at a seventh
    of what they take), one key throughout (key_bytes 0) so that the ids are what grows."""
    estimate, grown = _estimate_and_growth(_TOTAL + 'event_id = "id"\n', "60000", "0", "batch", "60000",
                                           str(id_bytes))
    assert 0.6 <= estimate / grown <= 1.6, (estimate, grown, estimate / grown)


@pytest.mark.parametrize(("text", "key_bytes", "path"), [
    (_KEYED, 12, "batch"),
    (_KEYED, 990, "batch"),  # keys near max_key_bytes: their strings are most of what an instance holds
    (_KEYED, 990, "router"),
    (_QUANTILES.replace("{k}", "200"), 12, "batch"),  # a sketch allocates room for k items when made
    (_QUANTILES.replace("{k}", "65535"), 12, "batch"),
])
def test_the_estimate_follows_resident_memory_whatever_the_keys_and_sketches(text: str, key_bytes: int,
                                                                            path: str) -> None:
    """Rotation bounds memory only as well as the estimate follows it: 60,000 new instances per counter, the
    estimate within 0.6× to 1.6× what the process grew by (long keys were estimated at a fifth of it, and a
    quantiles sketch of k = 65,535 at a fifteenth)."""
    estimate, grown = _estimate_and_growth(text, "60000", str(key_bytes), path)
    assert 0.6 <= estimate / grown <= 1.6, (estimate, grown, estimate / grown)
