"""The chaos run's truth for counters reset mid-run (``bench.chaos.reset_truth``): each reset applied at its
points, partition by partition, retries counted nowhere."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bench.chaos import ResetDone, reset_truth, resets_agree
from schemas.resets import CONTROL_HEADER


@dataclass
class Rec:
    offset: int
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


def _trade(event_id: str, symbol: str, qty: int) -> bytes:
    return json.dumps({"id": event_id, "symbol": symbol, "qty": qty, "price": 1.5}).encode()


def _log(*values: bytes | None) -> list[Rec]:
    """A partition: None is a control record."""
    return [Rec(i, b"" if v is None else v, ((CONTROL_HEADER, b"r"),) if v is None else ())
            for i, v in enumerate(values)]


def _reset(counter: str, keys: set[str], points: dict[int, int]) -> ResetDone:
    return ResetDone(counter, 1, frozenset(keys), points, {})


def test_a_reset_counts_only_what_lies_after_its_point_in_each_partition() -> None:
    """trades reset everywhere at offset 2 of partition 0 and 1 of partition 1; shares reset for B only:
    A's shares keep every trade, B's only those after the points."""
    records: Any = {
        0: _log(_trade("a1", "A", 1), _trade("b1", "B", 10), None, _trade("a2", "A", 2), _trade("b2", "B", 20)),
        1: _log(_trade("b3", "B", 30), None, _trade("a3", "A", 3)),
    }
    resets = [_reset("trades", set(), {0: 2, 1: 1}), _reset("shares", {"B"}, {0: 2, 1: 1})]
    trades, shares = reset_truth(records, resets, window=100)
    assert trades == {"A": 2, "B": 1}
    assert shares == {"A": 6, "B": 20}


def test_a_retry_after_the_reset_of_an_event_before_it_counts_nowhere() -> None:
    """The event was before the reset: its retry within the window after the point is still a retry (the
    consumers drop it); beyond the window it counts again, after the point, as the consumers count it."""
    records: Any = {0: _log(_trade("x", "A", 5), None, _trade("x", "A", 5), b"{not json", _trade("y", "A", 7),
                            _trade("z", "B", 1), _trade("x", "A", 5))}
    resets = [_reset("trades", set(), {0: 1})]
    trades, shares = reset_truth(records, resets, window=3)
    assert trades == {"A": 2, "B": 1}  # y, z, and x again 4 records after its last sighting (window 3)
    assert shares == {"A": 17, "B": 1}  # shares was never reset: x, y, x (the retry at 2 dropped)


def test_without_resets_it_is_the_window_rule_alone() -> None:
    """No reset: every fresh trade counts, malformed records and control records count nowhere."""
    records: Any = {0: _log(_trade("x", "A", 5), b"", _trade("x", "A", 5), _trade("z", "B", 1))}
    assert reset_truth(records, [], window=10) == ({"A": 1, "B": 1}, {"A": 5, "B": 1})


def test_the_resets_check_compares_what_both_forms_carry() -> None:
    """reset --json and reset --list --json differ in form (the list adds the request's key and the partitions no
    position was recorded in): the check compared them whole, always disagreed, and its verdict was overwritten
    by the transactional phase's, so it could not fail. Now the same reset agrees, and a changed position, a
    missing reset or a partition without a position disagree."""
    printed = {"counter": "shares", "keys": ["S2", "S1"], "epoch": 1, "id": "shares.1.x", "requested_by": "chaos",
               "requested_at": "2026-11-28T16:00:00.000+00:00",
               "positions": [{"topic": "t", "partition": 1, "offset": 9}, {"topic": "t", "partition": 0, "offset": 4}]}
    listed = {**printed, "keys": ["S1", "S2"], "request_key": "k1", "not_recorded": [],
              "positions": list(reversed(printed["positions"]))}
    assert resets_agree([printed], [listed])
    moved = {**listed, "positions": [{"topic": "t", "partition": 0, "offset": 5}, printed["positions"][0]]}
    assert not resets_agree([printed], [moved])
    assert not resets_agree([printed], [])
    assert not resets_agree([printed], [{**listed, "not_recorded": [{"topic": "t", "partition": 2}]}])
