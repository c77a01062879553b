"""The hot path by shape of definition in ``make bench``'s report: every shape's row, and #32's target judged on the
slowest of flat's counters read another way (not on a kind's shape nor the page views, which change the
counters)."""

from __future__ import annotations

import pytest

from bench import shapes
from bench.hot_path import slowest_shape
from bench.pipeline import Report
from bench.report import shapes_section


def _measured(**batch_us: float) -> dict[str, dict[str, float]]:
    figures = {name: 3.0 for name in shapes.SHAPES} | {shapes.FLAT: 3.0, "page views (9 counters)": 9.0,
                                                        "kind: count, sum, variance": 4.5} | batch_us
    return {name: {"batch": us, "router": 3 * us, "taken": 1.0, "updates": 7.24 if "page" in name else 3.0}
            for name, us in figures.items()}


def _keyed(**by_key: float) -> dict[str, float]:
    names = {"hourly": "hourly bucket", "nested": "nested key (user.id)", "decimal": "exact decimal sum"}
    return {names[key]: us for key, us in by_key.items()}


def test_the_target_is_judged_on_the_slowest_variant_of_flat() -> None:
    """The page views (3×) and the variance's shape (1.5×) are not flat's counters: the hourly bucket, at 1.2×
    flat, is the slowest variant and meets the target; at 1.4× it misses it."""
    results = _measured(**_keyed(hourly=3.6, nested=3.3, decimal=3.45))
    assert slowest_shape(results) == ("hourly bucket", pytest.approx(1.2))
    lines = shapes_section(Report(hot_path_shapes=results, hot_path_shape_events=72_000))
    assert "| the slowest of flat's counters read another way (hourly bucket) ÷ flat, batch path | 1.20× | " \
           "≤ 1.3× | met |" in lines
    assert any("(an hour of the stream" in line for line in lines)
    table = next(line for line in lines if line.startswith("| shape |"))
    assert all(f"| {name} |" in table for name in results)
    slower = shapes_section(Report(hot_path_shapes=_measured(**_keyed(decimal=4.2)), hot_path_shape_events=7_200))
    assert "| the slowest of flat's counters read another way (exact decimal sum) ÷ flat, batch path | 1.40× | " \
           "≤ 1.3× | **missed** |" in slower
    assert any("(0.1 hours of the stream" in line for line in slower)


def test_a_run_without_the_shapes_reports_nothing_of_them() -> None:
    assert shapes_section(Report()) == []
