"""The line a consumer without a counter exits with when a partition it claims has that counter's hand-over."""

from __future__ import annotations

from pathlib import Path

from consumer.handovers import HandoverRefusedError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_refusal_names_the_counter_and_what_to_do_as_the_docs_show() -> None:
    """One line: the partition, the counter, the two ways out; docs/operations.md shows it word for word."""
    line = HandoverRefusedError("orders", 0, ["shares_traded"]).line
    assert "\n" not in line
    assert "countersink drop shares_traded" in line
    assert "definitions that have shares_traded" in line
    assert f"error: {line}\n" in DOCS.read_text()
