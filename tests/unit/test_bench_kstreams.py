"""The Kafka Streams part of ``make bench``: its values checked against the truth, and its section of the report
with the countersink ÷ Kafka Streams ratios and their targets."""

from __future__ import annotations

from bench.kstreams import check_totals
from bench.pipeline import Report
from bench.report import _kstreams_section

TRUTH = {"S000001": (3, 30), "S000002": (1, 7), "S000003": (2, 5)}


def test_equal_totals_pass_and_every_difference_is_named() -> None:
    assert check_totals(dict(TRUTH), TRUTH, len(TRUTH)) == []
    wrong = {"S000001": (4, 30), "S000002": (1, 6), "S999999": (1, 1)}
    assert check_totals(wrong, TRUTH, len(TRUTH)) == [
        "trades/S000001: 4 != 3", "shares/S000002: 6 != 7", "trades/S000003: None != 2",
        "shares/S000003: None != 5", "S999999: not published, counted (1, 1)"]
    assert check_totals(wrong, TRUTH, 1) == ["trades/S000001: 4 != 3", "S999999: not published, counted (1, 1)"]


def _report(**kstreams: float) -> Report:
    report = Report(events=1_000_000, cpu_s_per_million=10.0,
                    server_cpu_s_per_million={"Cassandra": 8.0, "Kafka": 2.0})
    report.kstreams = {"events_per_s": 40_000.0, "committed": 1_000_000, "threads": 1,
                       "jvm_cpu_s_per_million": 30.0, "kafka_cpu_s_per_million": 10.0, **kstreams}
    return report


def test_the_section_gives_both_systems_the_ratios_and_the_verdicts() -> None:
    lines = _kstreams_section(_report(symbols_checked=50_000), 80_000.0)
    assert lines[0] == "## Kafka Streams"
    assert "one stream thread, a commit every 100 ms" in lines[2]
    assert "Its count and sum of 50,000 symbols" in lines[2]
    assert "| events/s | 80,000 | 40,000 | 2.00× | ≥ 1.5× | met |" in lines
    assert "| CPU s per million events: the consumer / the Streams JVM | 10.0 | 30.0 | 0.33× | | |" in lines
    # countersink 10 + 8 + 2 against 30 + 10
    assert "| whole pipeline CPU s per million events | 20.0 | 40.0 | 0.50× | ≤ 0.5× | met |" in lines
    slower = _kstreams_section(_report(symbols_checked=50_000), 50_000.0)
    assert "| events/s | 50,000 | 40,000 | 1.25× | ≥ 1.5× | **missed** |" in slower


def test_an_unfinished_or_absent_run_is_said_so() -> None:
    lines = _kstreams_section(_report(committed=1_234, events_per_s=0.0, threads=2), 80_000.0)
    assert "2 stream threads" in lines[2]
    assert "not checked: it committed 1,234 of 1,000,000 events" in lines[2]
    assert "| events/s | 80,000 | 0 | n/a | ≥ 1.5× | not measured |" in lines  # no ratio to nothing
    assert "| whole pipeline CPU s per million events | 20.0 | 40.0 | 0.50× | ≤ 0.5× | not measured |" in lines
    assert _kstreams_section(Report(), 80_000.0) == []
