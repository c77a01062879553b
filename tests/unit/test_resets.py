"""Resets' pure core (schemas.resets): cell names, epochs of instances, control records and the truth rule."""

from __future__ import annotations

import json
import uuid

import pytest

from consumer.applying import Applier, Mutator, Outcome, Record, ResetNotLearnedError, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.resets import (
    CONTROL_HEADER,
    Epochs,
    Reset,
    cell_name,
    control_record,
    control_reset_id,
    counts_after_resets,
    current_epochs,
    epochs_at,
    new_reset_id,
    row_of_reset_id,
    split_cell,
)
from tests.unit.memory_store import MemoryResets, run

COUNTERS = parse_definitions("""
[[counter]]
name = "trades"
topics = ["orders"]
kind = "count"
key = ["sym"]
""")
WHOLE = Reset("trades.1.a", "trades", 1)
IBM = Reset("trades.2.b", "trades", 2, frozenset({"IBM"}))


def test_a_cell_name_is_the_counter_before_any_reset_and_names_its_epoch_after() -> None:
    """Epoch 0 is the counter's own cell (data from before resets existed); others carry the epoch."""
    assert cell_name("trades", 0) == "trades"
    assert cell_name("trades", 3) == "trades@3"
    assert split_cell("trades@3") == ("trades", 3)
    assert split_cell("trades") == ("trades", 0)


def test_an_instance_takes_the_greatest_epoch_of_the_resets_covering_it() -> None:
    """A reset of one key and a later reset of all keys: each instance reads the greatest covering epoch,
    whatever order the control records were met in; a second control record of a reset is ignored."""
    later = Reset("trades.3.c", "trades", 3)
    for order in ([WHOLE, IBM, later], [later, IBM, WHOLE]):
        epochs = Epochs()
        for reset in order:
            assert epochs.apply(reset)
        assert not epochs.apply(IBM)
        assert (epochs.epoch("trades", "IBM"), epochs.epoch("trades", "SAP")) == (3, 3)
    assert current_epochs([WHOLE, IBM]).cell("trades", "IBM") == "trades@2"
    assert current_epochs([WHOLE, IBM]).cell("trades", "SAP") == "trades@1"
    assert not current_epochs([IBM]).clears(WHOLE, "trades", "IBM")  # IBM is at 2 already: 1 changes nothing


def test_a_successor_knows_the_resets_recorded_below_its_start() -> None:
    """epochs_at applies exactly the resets whose position lies below the start offset."""
    epochs = epochs_at([WHOLE, IBM], {"trades.1.a": 10, "trades.2.b": 20}, 15)
    assert (epochs.epoch("trades", "IBM"), epochs.applied) == (1, {("trades", 1)})
    assert epochs_at([WHOLE], {"trades.1.a": 10}, 10).epoch("trades", "IBM") == 0


def test_a_reset_id_names_its_row_and_anything_else_names_none() -> None:
    reset_id = new_reset_id("trades", 7)
    assert row_of_reset_id(reset_id) == ("trades", 7)
    # "\u00b2" (a superscript two) is a digit to str.isdigit and not to int(): it raised out of the consumer.
    for forged in ("", "x", "trades.seven.x", "trades.1", ".1.x", "a.1.b.c", "trades.\u00b2.x", "trades.\u0663.x"):
        assert row_of_reset_id(forged) is None


def test_a_control_record_names_its_reset_in_its_header() -> None:
    value, headers = control_record(WHOLE)
    assert control_reset_id(headers) == "trades.1.a"
    assert b'"epoch":1' in value
    assert control_reset_id([("other", b"x")]) is None
    assert control_reset_id([(CONTROL_HEADER, None)]) == ""


def test_the_truth_rule_counts_what_lies_after_each_partitions_point() -> None:
    """The rule a checker applies: after the point of the current epoch's reset in that partition."""
    points = {("trades.1.a", "orders", 0): 5, ("trades.2.b", "orders", 0): 8}
    rule = counts_after_resets
    assert not rule([WHOLE, IBM], points, "trades", "SAP", "orders", 0, 5)
    assert rule([WHOLE, IBM], points, "trades", "SAP", "orders", 0, 6)
    assert not rule([WHOLE, IBM], points, "trades", "IBM", "orders", 0, 7)
    assert rule([WHOLE, IBM], points, "trades", "IBM", "orders", 0, 9)
    assert not rule([WHOLE], points, "trades", "IBM", "orders", 1, 100)  # no control record there
    assert rule([], points, "trades", "IBM", "orders", 1, 0)


def _mutator(resets: MemoryResets) -> Mutator:
    applier = Applier(EventRouter(COUNTERS), COUNTERS, "orders", 0, RetryWindow(4), resets)
    entry = MutatorEntry(uuid.UUID(int=1), "g", "orders", 0, "h", 0, 10**12)
    return Mutator(entry, PartitionId("g", "orders", 0), applier, applied_through=-1, flushed_through=-1)


def _records(resets: list[Reset | str]) -> list[Record]:
    records = []
    for offset, item in enumerate(["IBM", "SAP", *resets, "IBM", "SAP", "IBM"]):
        if isinstance(item, Reset):
            value, headers = control_record(item)
            records.append(Record(offset, value, headers=headers))
        else:
            records.append(Record(offset, f'{{"sym": "{item}"}}'.encode()))
    return records


@pytest.mark.parametrize("batch", [True, False], ids=["apply_batch", "apply"])
def test_a_mutator_drops_the_states_a_reset_covers_and_writes_the_new_epoch(batch: bool) -> None:
    """At a control record the mutator drops what it counted of the instances covered, in the batch path as in
    the record-at-a-time one, and records where the reset sits."""
    mutator = _mutator(MemoryResets([IBM]))
    records = _records([IBM])
    run(mutator.applier.learn(records))
    if batch:
        mutator.apply_batch(records)
    else:
        for record in records:
            mutator.apply(record)
    assert {i: s.value() for i, s in mutator.states.items()} == {("trades", "IBM"): 2, ("trades", "SAP"): 2}
    assert (mutator.cell("trades", "IBM"), mutator.cell("trades", "SAP")) == ("trades@2", "trades")
    assert [(p.reset_id, p.offset) for p in mutator.positions] == [("trades.2.b", 2)]


def test_a_forged_control_record_is_invalid_and_an_unlooked_one_is_a_bug() -> None:
    """A control record naming no recorded reset is refused (dead-lettered); one the applier was never told
    to look up raises rather than guess."""
    mutator = _mutator(MemoryResets([]))
    records = _records([IBM])
    with pytest.raises(ResetNotLearnedError):
        mutator.apply_batch(records)
    mutator = _mutator(MemoryResets([]))
    run(mutator.applier.learn(records))
    outcomes = [mutator.apply(record)[0] for record in records]
    assert outcomes[2] is Outcome.INVALID
    assert mutator.states[("trades", "IBM")].value() == 3


def test_a_recorded_reset_of_a_counter_kept_elsewhere_is_passed_over() -> None:
    """A consumer whose definitions lack the counter reset (another deployment's counter on a shared topic)
    skips its control record: no dead letter, no state dropped."""
    other = Reset("volume.1.x", "volume", 1)
    mutator = _mutator(MemoryResets([other]))
    records = _records([other])
    run(mutator.applier.learn(records))
    outcomes = [mutator.apply(record)[0] for record in records]
    assert outcomes[2] is Outcome.FILTERED
    assert mutator.states[("trades", "IBM")].value() == 3


def test_a_partition_added_after_a_reset_holds_only_what_comes_after_it() -> None:
    """A partition the topic did not have when the reset was recorded got no control record: a mutator
    starting there writes the reset's epoch from its first record, and the truth rule counts all of it."""
    reset = Reset("trades.1.a", "trades", 1, partitions=(("orders", 2),))
    assert epochs_at([reset], {}, 0, "orders", 2).epoch("trades", "IBM") == 1
    assert epochs_at([reset], {}, 0, "orders", 1).epoch("trades", "IBM") == 0  # its control record is to come
    assert counts_after_resets([reset], {}, "trades", "IBM", "orders", 2, 0)
    assert not counts_after_resets([reset], {}, "trades", "IBM", "orders", 1, 0)


def test_a_topic_the_counter_was_given_after_a_reset_holds_only_what_comes_after_it() -> None:
    """A topic added to the counter's topics after the reset was recorded got no control record, and the counter
    counts in it only from its hand-over there, later: a mutator starting there writes the reset's epoch (it
    wrote the old epoch, which no reader reads, for good), and the truth rule counts all of it. A reset recorded
    before partitions were names none: a partition without a control record then counts nothing yet."""
    reset = Reset("trades.1.a", "trades", 1, partitions=(("orders", 2),))
    assert epochs_at([reset], {}, 0, "other", 5).epoch("trades", "IBM") == 1
    assert counts_after_resets([reset], {}, "trades", "IBM", "other", 5, 0)
    older = Reset("trades.1.b", "trades", 1)
    assert epochs_at([older], {}, 0, "other", 5).epoch("trades", "IBM") == 0
    assert not counts_after_resets([older], {}, "trades", "IBM", "other", 5, 0)


def test_a_reset_of_a_counter_with_the_longest_name_is_applied() -> None:
    """A control header was read up to 64 characters: the id of a reset of a counter named with 30 characters or
    more was cut, matched no recorded reset, and its control record was dead-lettered as forged by every
    consumer (the counter read the new, empty epoch for good). The longest id is read whole."""
    name = "n" * 48
    counters = parse_definitions(f'[[counter]]\nname = "{name}"\ntopics = ["orders"]\nkind = "count"\nkey = ["sym"]\n')
    longest = Reset(new_reset_id(name, 10**18 - 1), name, 10**18 - 1)
    assert control_reset_id(control_record(longest)[1]) == longest.reset_id
    reset = Reset(new_reset_id(name, 1), name, 1)
    resets = MemoryResets([reset])
    applier = Applier(EventRouter(counters), counters, "orders", 0, RetryWindow(4), resets)
    mutator = Mutator(MutatorEntry(uuid.UUID(int=1), "g", "orders", 0, "h", 0, 10**12), PartitionId("g", "orders", 0),
                      applier, applied_through=-1, flushed_through=-1)
    value, headers = control_record(reset)
    records = [Record(0, b'{"sym": "IBM"}'), Record(1, value, headers=headers), Record(2, b'{"sym": "IBM"}')]
    run(applier.learn(records))
    outcomes = [mutator.apply(record)[0] for record in records]
    assert Outcome.INVALID not in outcomes
    assert mutator.cell(name, "IBM") == f"{name}@1"
    assert [state.value() for state in mutator.states.values()] == [1]  # the record after the reset alone
    assert [position.reset_id for position in mutator.positions] == [reset.reset_id]


def test_a_reset_is_superseded_by_a_later_one_resetting_every_key_it_does() -> None:
    """A later reset of every key, or of a superset of its keys, supersedes a reset; an earlier one, one of
    other keys, or one of another counter does not; a reset of every key is superseded only by another such."""
    from schemas.resets import superseding

    some = Reset("c-2", "c", 2, frozenset({"a"}))
    every = Reset("c-1", "c", 1)
    later = [Reset("c-3", "c", 3, frozenset({"b"})), Reset("c-4", "c", 4, frozenset({"a", "b"})),
             Reset("d-5", "d", 5), Reset("c-6", "c", 6)]
    assert superseding(some, later) == later[3]
    assert superseding(some, later[:3]) == later[1]
    assert superseding(some, later[:1]) is None
    assert superseding(some, [every]) is None  # earlier
    assert superseding(every, later[:3]) is None
    assert superseding(every, later) == later[3]


def test_a_control_record_of_many_long_keys_stays_small_enough_to_publish() -> None:
    """A reset of a thousand keys of a kilobyte of text that is not ASCII listed them all in its control record:
    three megabytes of escaped JSON, past the 1 MiB a producer sends, so the reset, recorded first, could never
    be completed. The value counts them instead; the record's header still names the reset."""
    keys = frozenset(f"{i:04d}" + "é" * 510 for i in range(1000))  # 1,024 bytes each, the most a key holds
    reset = Reset(new_reset_id("trades", 7), "trades", 7, keys)
    value, headers = control_record(reset)
    assert len(value) <= 1024
    assert json.loads(value) == {"countersink": "reset", "id": reset.reset_id, "counter": "trades", "epoch": 7,
                                 "key_count": 1000}
    assert control_reset_id(headers) == reset.reset_id
    few = Reset(new_reset_id("trades", 8), "trades", 8, frozenset({"IBM", "MSFT"}))
    assert json.loads(control_record(few)[0])["keys"] == ["IBM", "MSFT"]
