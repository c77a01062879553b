"""What the counter registry treats as a counter's meaning, and how readers print values by kind."""

from __future__ import annotations

import pytest

from countersink.read_cli import _render
from schemas import registry
from schemas.definitions import CounterDefinition, parse_definitions
from schemas.kinds.distinct import DistinctEstimate
from schemas.kinds.top_k import TopKEstimate, TopKItem

BASE = '[[counter]]\nname = "c"\ntopics = ["t"]\nkind = "distinct"\nkey = "symbol"\nvalue = "user"\n'


def _one(text: str) -> CounterDefinition:
    return parse_definitions(text, "f.toml")["c"]


@pytest.mark.parametrize("change", ['topics = ["t", "u"]', 'event_id = "id"', "lg_k = 12"])
def test_what_does_not_change_the_meaning(change: str) -> None:
    """Topics, the event id, and a default written out keep the fingerprint."""
    text = BASE.replace('topics = ["t"]\n', "") if change.startswith("topics") else BASE
    assert registry.fingerprint(_one(text + change + "\n")) == registry.fingerprint(_one(BASE))


@pytest.mark.parametrize(("change", "field"), [('key = "user"', "key"), ('value = "other"', "value"),
                                               ("lg_k = 14", "lg_k"), ('where = { side = "buy" }', "where")])
def test_what_changes_the_meaning(change: str, field: str) -> None:
    """The key, value, where and sketch size are the meaning: each change is named with old and new."""
    lines = [line for line in BASE.splitlines() if line.split(" = ")[0] != change.split(" = ")[0]]
    changed = _one("\n".join(lines) + "\n" + change + "\n")
    assert registry.fingerprint(changed) != registry.fingerprint(_one(BASE))
    assert [c.split(":")[0] for c in registry.changes(_one(BASE), changed)] == [field]


RETAINED = 'bucket = { field = "ts", size = "1h" }\nretain = "30d"\n'


def test_a_retention_change_is_refused_saying_to_define_a_new_counter() -> None:
    """Retention 30d recorded, 60d asked: refused, naming the change and saying to define a new counter;
    the same retention written as 720h is no change."""
    recorded = _one(BASE + RETAINED)
    reason = registry.refusal(recorded, _one(BASE + RETAINED.replace("30d", "60d")), "host-a")
    assert reason is not None
    assert 'retain: "30d" -> "60d"' in reason
    assert "registered by host-a" in reason
    assert "define a new counter (a new name) with the new retention" in reason
    assert registry.refusal(recorded, _one(BASE + RETAINED.replace("30d", "720h")), "host-a") is None


def test_fingerprints_without_retention_are_the_ones_recorded_before_it_counted() -> None:
    """A counter without retention keeps the fingerprint of the meaning before retention was part of it (so
    nothing recorded earlier is refused); a recorded meaning equal to the new one is never refused, whatever
    fingerprint it was recorded with."""
    assert registry.fingerprint(_one(BASE)) == "493a0d7c12b63c55701c3852f7a4cd87d611bb98e7426dfa55cf001aafd75024"
    retained = _one(BASE + RETAINED)
    assert registry.refusal(retained, retained, "host-a") is None


SAME = 'where = { side = ["buy", "sell"] }\nbucket = { field = "ts", size = "1h" }\n'


@pytest.mark.parametrize("written", [
    'where = { side = ["sell", "buy"] }\nbucket = { field = "ts", size = "60m" }\n',
    'where = { side = ["buy", "sell", "buy"] }\nbucket = { field = "ts", size = "1h" }\n',
    'bucket = { field = "ts", size = "1h" }\nwhere = { side = ["sell", "buy"] }\n',
])
def test_one_meaning_written_another_way_is_no_change(written: str) -> None:
    """A where list is a set and a bucket is its width: ``60m`` for ``1h``, a list reordered or with a value
    repeated, is the definition recorded (accepted at start), whichever of the two was recorded first."""
    recorded = _one(BASE + SAME)
    assert registry.refusal(recorded, _one(BASE + written), "host-a") is None
    assert registry.refusal(_one(BASE + written), recorded, "host-a") is None
    assert registry.fingerprint(_one(BASE + written)) == registry.fingerprint(recorded)


def test_a_day_bucket_written_in_hours_is_no_change_and_other_widths_are() -> None:
    """``24h`` is ``1d``; ``2d``, ``25h`` and ``1440m`` keep what they mean (the last is ``1d`` too)."""
    day = _one(BASE + 'bucket = { field = "ts", size = "1d" }\n')
    for size, same in (("24h", True), ("1440m", True), ("2d", False), ("12h", False)):
        other = _one(BASE + f'bucket = {{ field = "ts", size = "{size}" }}\n')
        assert (registry.refusal(day, other, "host-a") is None) is same, size


def test_where_values_of_other_types_stay_apart() -> None:
    """``true`` and ``1`` (and ``"1"``) are different values to match: a list of one is not a list of another."""
    lists = ("[true]", "[1]", '["1"]')
    for old in lists:
        for new in lists:
            recorded, asked = _one(BASE + f"where = {{ flag = {old} }}\n"), _one(BASE + f"where = {{ flag = {new} }}\n")
            assert (registry.refusal(recorded, asked, "host-a") is None) is (old == new), (old, new)


def test_canonical_definitions_keep_the_fingerprints_recorded_before() -> None:
    """Written in its canonical form (sorted where lists, a bucket in its largest unit), a definition's fingerprint
    is the one recorded before buckets and where lists were normalized: nothing recorded is read again."""
    fingerprint = registry.fingerprint(_one(BASE + SAME))
    assert fingerprint == "d3eb0847a8f978dcbde73f0c0eb10d6d9ee6eea23247f38f03c131fb21be8396"


def test_a_record_round_trips() -> None:
    """The stored JSON gives back the same definition."""
    definition = _one(BASE + 'where = { side = ["buy", "sell"] }\nbucket = { field = "ts", size = "1h" }\n')
    assert registry.from_record(registry.to_record(definition)) == definition


def test_values_are_printed_by_kind() -> None:
    """Sketches print with their bounds in words; nothing counted says so."""
    assert _render(DistinctEstimate(2.000000004967054, 2.0, 2.0001997319422404)) == "about 2 (between 2 and 2.0002)"
    top = TopKEstimate((TopKItem("alice", 2, 2, 2), TopKItem("bob", 1, 1, 3)), 4, 1)
    assert _render(top) == "alice 2, bob 1 [1..3] (of 4)"
    # An item that does not print (written by whoever may publish) cannot move the terminal or forge a line.
    forged = TopKEstimate((TopKItem("\x1b[2K\rfake", 3, 3, 3), TopKItem("x\ntop 'admin': 999999 (of 1)", 1, 1, 1)),
                          4, 0)
    assert _render(forged) == "$'\\x1b[2K\\x0dfake' 3, $'x\\x0atop \\'admin\\': 999999 (of 1)' 1 (of 4)"
    assert _render(forged).isprintable()
    assert _render(None) == "(nothing counted)"
    assert _render(160) == "160"
