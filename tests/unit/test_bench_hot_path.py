"""``python -m bench.hot_path --shapes --second-pass`` runs and applies every record twice."""

from __future__ import annotations

import pytest

from bench import hot_path


def test_the_second_pass_applies_every_record_again(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass is not a pass of duplicates: each shape's mutator counts every record of a round twice
    (its retry window emptied between), and the table names each shape measured."""
    applied: list[int] = []
    real = hot_path.batched

    def counting(mutator: hot_path.Mutator, records: list[hot_path.Record]) -> None:
        before = sum(state.value() for (counter, _), state in mutator.states.items() if counter == "trades")
        real(mutator, records)
        applied.append(sum(state.value() for (counter, _), state in mutator.states.items()
                           if counter == "trades") - before)

    monkeypatch.setattr(hot_path, "batched", counting)
    assert hot_path.main(["--shapes", "--second-pass", "--events", "300", "--rounds", "2", "--symbols", "40",
                          "--only", "hourly"]) == 0
    printed = capsys.readouterr().out
    assert "| flat (the bench's) |" in printed
    assert "| hourly bucket |" in printed
    assert applied[2:] == [300] * 8  # after each shape's first round: 2 rounds × 2 passes × 2 shapes
