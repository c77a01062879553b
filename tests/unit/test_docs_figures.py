"""The benchmark figures in the docs are bench/results/results.json's, rendered by ``python -m bench.docs_figures``."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from bench import docs_figures
from bench.docs_figures import REGION, RENDERERS, load, pages, render, stale

RESULTS = load()


@pytest.mark.parametrize("page", pages(), ids=[page.name for page in pages()])
def test_the_pages_hold_the_figures_results_json_gives(page: Path) -> None:
    """A page whose generated regions differ from results.json fails, saying how to regenerate them."""
    text = page.read_text()
    assert render(text, RESULTS, page.name) == text, (
        f"{page.name}: its figures differ from bench/results/results.json: run `python -m bench.docs_figures` "
        "(after a new `make bench`), never edit a figures region by hand")


def test_every_generator_has_its_region_and_every_region_a_generator() -> None:
    """The four regions (benchmarks table and cost, the known issue, the status row) are in the pages."""
    found = [found["name"] for page in pages() for found in REGION.finditer(page.read_text())]
    assert sorted(found) == sorted(RENDERERS)


def test_the_verdicts_follow_the_figures() -> None:
    """Whether a CPU target is met is computed, so a page cannot say met while the figure misses it."""
    assert "Cassandra's (≤ 8) is missed" in RENDERERS["bench-known-issue"](RESULTS)
    assert RESULTS["report"]["server_cpu_s_per_million"]["Cassandra"] > 8
    better = copy.deepcopy(RESULTS)
    better["report"]["server_cpu_s_per_million"]["Cassandra"] = 7.5
    assert "Cassandra's (≤ 8) is met" in RENDERERS["bench-known-issue"](better)
    assert "the ratio targets are missed" in RENDERERS["bench-status"](better)


def test_a_page_edited_by_hand_is_found_and_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--check`` names a page whose region was edited, and a run puts results.json's figures back."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "bench" / "results").mkdir(parents=True)
    shutil.copy(docs_figures.RESULTS, root / "bench" / "results" / "results.json")
    for page in pages():
        shutil.copy(page, root / page.relative_to(docs_figures.REPO))
    assert stale(root) == []
    page = root / "docs" / "benchmarks.md"
    cell = f"| {load()['report']['rates']['countersink']:,.0f} | 1.00× |"  # countersink's rate, as the page shows it
    assert cell in page.read_text()
    page.write_text(page.read_text().replace(cell, "| 1 | 1.00× |"))
    assert stale(root) == [page]
    page.write_text(render(page.read_text(), load(root / "bench" / "results" / "results.json")))
    assert stale(root) == []
    assert cell in page.read_text()
