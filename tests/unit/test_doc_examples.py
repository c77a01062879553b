"""The worked example of docs/counters.md: the values stated there are the values computed here."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from schemas.definitions import parse_definitions
from schemas.events import EventRouter, apply_updates
from schemas.kinds import State

TOML = """
[[counter]]
name = "shares_bought"
topics = ["trades"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "trade_id"
where = { side = "buy" }

[[counter]]
name = "notional"
topics = ["trades"]
kind = "sum"
number = "decimal"
key = "symbol"
value = "price"

[[counter]]
name = "trades_per_hour"
topics = ["trades"]
kind = "count"
key = "symbol"
bucket = { field = "ts", size = "1h" }

[[counter]]
name = "low_price"
topics = ["trades"]
kind = "min"
number = "decimal"
key = "symbol"
value = "price"

[[counter]]
name = "high_price"
topics = ["trades"]
kind = "max"
number = "float"
key = "symbol"
value = "price"

[[counter]]
name = "avg_qty"
topics = ["trades"]
kind = "mean"
key = "symbol"
value = "qty"

[[counter]]
name = "qty_spread"
topics = ["trades"]
kind = "variance"
key = "symbol"
value = "qty"

[[counter]]
name = "traders"
topics = ["trades"]
kind = "distinct"
key = "symbol"
value = "user.id"
lg_k = 12

[[counter]]
name = "qty_quantiles"
topics = ["trades"]
kind = "quantiles"
key = "symbol"
value = "qty"
k = 200

[[counter]]
name = "top_traders"
topics = ["trades"]
kind = "top_k"
value = "user.id"
max_map_size = 256
top = 2
"""
TRADES: list[dict[str, Any]] = [
    {"trade_id": "t1", "symbol": "IBM", "side": "buy", "qty": 100, "price": 181.25,
     "ts": "2026-11-22T10:17:03Z", "user": {"id": "alice"}},
    {"trade_id": "t2", "symbol": "IBM", "side": "sell", "qty": 40, "price": 181.40,
     "ts": "2026-11-22T10:45:10Z", "user": {"id": "bob"}},
    {"trade_id": "t3", "symbol": "IBM", "side": "buy", "qty": 60, "price": 180.95,
     "ts": "2026-11-22T11:02:00Z", "user": {"id": "alice"}},
    {"trade_id": "t4", "symbol": "SAP", "side": "buy", "qty": 10, "price": 120.10,
     "ts": "2026-11-22T11:30:00Z", "user": {"id": "carol"}},
]  # fmt: skip


@pytest.fixture(scope="module")
def states() -> dict[tuple[str, str], State]:
    cs = parse_definitions(TOML, "README.md")
    router = EventRouter(cs)
    out: dict[tuple[str, str], State] = {}
    for trade in TRADES:
        apply_updates(out, router.route("trades", json.dumps(trade).encode()), cs)
    return out


EXPECTED: list[tuple[str, str, str]] = [
    ("shares_bought", "IBM", "160"),
    ("shares_bought", "SAP", "10"),
    ("notional", "IBM", repr(Decimal("543.60"))),
    ("trades_per_hour", "IBM|2026-11-22T10:00Z", "2"),
    ("trades_per_hour", "IBM|2026-11-22T11:00Z", "1"),
    ("trades_per_hour", "SAP|2026-11-22T11:00Z", "1"),
    ("low_price", "IBM", repr(Decimal("180.95"))),
    ("high_price", "IBM", "181.4"),
    ("avg_qty", "IBM", "66.66666666666667"),
    (
        "qty_spread",
        "IBM",
        "MomentsValue(count=3, mean=66.66666666666667, variance=622.2222222222222, "
        "stddev=24.94438257849294, sample_variance=933.3333333333334)",
    ),
    (
        "qty_spread",
        "SAP",
        "MomentsValue(count=1, mean=10.0, variance=0.0, stddev=0.0, sample_variance=None)",
    ),
    (
        "traders",
        "IBM",
        "DistinctEstimate(estimate=2.000000004967054, lower_bound=2.0, upper_bound=2.0001997319422404)",
    ),
    (
        "qty_quantiles",
        "IBM",
        "QuantilesEstimate(count=3, min=40.0, max=100.0, quantiles=((0.5, 60.0), (0.9, 100.0), "
        "(0.99, 100.0)), normalized_rank_error=0.013294757464848584)",
    ),
    (
        "top_traders",
        "",
        "TopKEstimate(items=(TopKItem(item='alice', estimate=2, lower_bound=2, upper_bound=2), "
        "TopKItem(item='bob', estimate=1, lower_bound=1, upper_bound=1)), total_weight=4, apriori_error=1)",
    ),
]


@pytest.mark.parametrize(("counter", "key", "value"), EXPECTED, ids=[f"{c}/{k}" for c, k, _ in EXPECTED])
def test_documented_value(states: dict[tuple[str, str], State], counter: str, key: str, value: str) -> None:
    """Each value printed in the worked example is what the four example trades produce."""
    assert repr(states[(counter, key)].value()) == value


def test_instances_are_exactly_the_documented_ones(states: dict[tuple[str, str], State]) -> None:
    """The example creates 20 instances; no sell trade reaches shares_bought."""
    assert len(states) == 20
    assert states[("shares_bought", "IBM")].value() == 100 + 60


WORKED_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "counters.md"


def test_the_page_shows_the_definitions_and_events_checked_here() -> None:
    """docs/counters.md's worked example holds exactly this file and these four trades, so it cannot drift."""
    section = WORKED_EXAMPLE.read_text().split("### Worked example", 1)[1]
    toml_block = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    json_block = re.search(r"```json\n(.*?)```", section, re.DOTALL)
    assert toml_block is not None
    assert json_block is not None
    assert toml_block.group(1).strip() == TOML.strip()
    assert [json.loads(line) for line in json_block.group(1).splitlines()] == TRADES
