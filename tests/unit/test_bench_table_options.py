"""``bench.table_options``: its variants are one option set each, its groups give counter names the registry
takes, and its table gives each variant's median, spread and ratio to the current table."""

from __future__ import annotations

import re

from bench import stream2, table_options
from bench.table_options import Figures


def test_every_counter_name_of_every_run_is_one_the_registry_takes() -> None:
    """The counters are renamed after the run's group: the longest must still be a valid name (48 characters)."""
    longest = max(stream2.definitions().split('name = "')[1:], key=lambda rest: rest.index('"'))
    counter = longest[:longest.index('"')]
    for round_ in range(10):
        for index in range(len(table_options.VARIANTS)):
            name = stream2.renamed(f"to-{round_}-{index}-pv") + counter
            assert re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name), name


def test_the_table_gives_medians_spreads_and_ratios_to_the_current_table() -> None:
    current = Figures([10.0, 30.0, 12.0], [9.0, 9.0, 9.0], [100.0, 120.0, 110.0], [0.1] * 3, [50_000.0] * 3)
    cheaper = Figures([5.0, 6.0, 7.0], [4.0, 4.0, 4.0], [55.0, 50.0, 60.0], [0.1] * 3, [60_000.0] * 3,
                      problems=["trades/S1: 1 != 2"])
    results = {stream: {"current": current, "no_compression": cheaper} for stream in table_options.STREAMS}
    lines = table_options.table(results, {"current": "", "no_compression": "compression = {'enabled': 'false'}"})
    row = next(line for line in lines if line.startswith("| no_compression |"))
    assert "| 6.0 (5.0–7.0) | 0.50× |" in row
    assert "| 55.0 (50.0–60.0) | 0.50× |" in row
    assert "1 mismatched" in row
    assert "| 12.0 (10.0–30.0) | 1.00× |" in next(line for line in lines if line.startswith("| current |"))
