"""The window rule: a takeover replaying its predecessor W's open window counts a counter from that window only
if W counted it, as W recorded (``Ownership._replayed_for``); from its own start offset otherwise."""

from __future__ import annotations

import types
import uuid
from typing import cast

import pytest

from consumer.protocol import Claim
from consumer.storage import FORGOTTEN, Forgotten, MutatorEntry, PartitionRow
from schemas.cql import COUNTED_NONE, counters_recorded
from tests.unit.memory_store import MemoryLog, MemoryStore, run
from tests.unit.test_lost_answers import Process

WRITER = uuid.UUID(int=99)
WRITER_BORN_US = 1_000


def _claim_replaying_the_writers_window() -> Claim:
    row = PartitionRow(owner=WRITER, window_mutator=WRITER, window_born_us=WRITER_BORN_US, flush_seq=3,
                       committed_offset=4, intent_offset=9)
    return cast(Claim, types.SimpleNamespace(row=row))


@pytest.mark.parametrize(("recorded", "volume_registered_us", "replayed"), [
    (frozenset({"trades", "volume"}), WRITER_BORN_US - 1, {"trades", "volume"}),
    (frozenset({"trades"}), WRITER_BORN_US - 1, {"trades"}),
    # W recorded volume, but volume was registered again after W was born (dropped and defined anew): the volume
    # W counted is another counter's
    (frozenset({"trades", "volume"}), WRITER_BORN_US + 1, {"trades"}),
    # W counted none of the topic's counters (every one dropped while it ran): none is counted from its window
    (frozenset(), WRITER_BORN_US - 1, set()),
    # W recorded none (a version before counters were recorded): it may have counted any, even one registered
    # after it was born (a version before the registry counted its counters before they were registered)
    (None, WRITER_BORN_US + 1, {"trades", "volume"}),
    # W's registry row is gone: the GC folded W, whose window the takeover that retired it replayed, and forgot it;
    # whatever is written at W's timestamps now is hidden by the fold's tombstone, so nothing is counted from it
    (FORGOTTEN, WRITER_BORN_US - 1, set()),
    (FORGOTTEN, WRITER_BORN_US + 1, set()),
], ids=["both", "one", "registered-again", "counted-none", "unrecorded", "forgotten", "forgotten-new-counter"])
def test_a_window_counts_the_counters_its_writer_counted(recorded: frozenset[str] | Forgotten | None,
                                                          volume_registered_us: int, replayed: set[str]) -> None:
    store = MemoryStore()
    if recorded is not FORGOTTEN:
        store.mutators[WRITER] = MutatorEntry(WRITER, "g", "trades", 0, "host", WRITER_BORN_US, WRITER_BORN_US + 10**9,
                                              retired_us=WRITER_BORN_US + 1)
    if isinstance(recorded, frozenset):
        store.recorded_counters[WRITER] = recorded
    ownership = Process(store, MemoryLog([]), 1).ownership
    ownership.registered_us = {"trades": WRITER_BORN_US - 1, "volume": volume_registered_us}
    found = run(ownership._replayed_for(_claim_replaying_the_writers_window(), ["trades", "volume"]))
    assert found == replayed


@pytest.mark.parametrize(("column", "read"), [
    (None, None),
    ([], None),
    ([COUNTED_NONE], frozenset()),
    (["trades", "volume"], frozenset({"trades", "volume"})),
    ({COUNTED_NONE, "trades"}, frozenset({"trades"})),
])
def test_the_recorded_counters_column_reads_as_recorded(column: list[str] | None, read: frozenset[str] | None
                                                         ) -> None:
    """An empty set is stored as null, which reads as recorded none: a mutator counting none records the name no
    counter has instead."""
    assert counters_recorded(column) == read
