"""The wide instances' part of ``make bench``'s report: the full mix, then the cached reads alone beside the plain
row, each with its verdicts against the targets (256 shards ≤ 2× the plain row at p50, ≤ 3× at p99)."""

from __future__ import annotations

from bench.pipeline import Report
from bench.report import _wide_section
from bench.wide_reads import CACHED, KINDS, PLAIN, STAMPS_ALONE, instance_label


def _alone(cached_p50: float) -> dict[str, tuple[float, float]]:
    return {PLAIN: (0.30, 0.60), instance_label("sum", 256) + STAMPS_ALONE: (0.48, 0.90),
            **{instance_label(kind, n) + CACHED: (cached_p50 if n == 256 else 0.33, 0.90)
               for kind in KINDS for n in (1, 256)}}


def test_the_cached_reads_alone_are_reported_with_their_verdicts() -> None:
    report = Report(wide_latency_ms={PLAIN: (0.40, 1.0), instance_label("sum", 256) + CACHED: (1.0, 2.0)},
                    wide_alone_latency_ms=_alone(0.51))
    lines = _wide_section(report)
    alone = lines[lines.index(next(line for line in lines if "--alone" in line)):]
    assert "- sum, 256 shards, cached: 2.50× at p50 (≤ 2), 2.00× at p99 (≤ 3): missed" in lines  # the mix
    for kind in KINDS:
        assert f"- {kind}, 256 shards, cached: 1.70× at p50 (≤ 2), 1.50× at p99 (≤ 3): met" in alone
    slower = _wide_section(Report(wide_latency_ms=report.wide_latency_ms, wide_alone_latency_ms=_alone(0.66)))
    assert "- top_k, 256 shards, cached: 2.20× at p50 (≤ 2), 1.50× at p99 (≤ 3): missed" in slower
    # Just over the target reads as over it, not as a missed "2.0×".
    edge = _wide_section(Report(wide_latency_ms=report.wide_latency_ms, wide_alone_latency_ms=_alone(0.603)))
    assert "- quantiles, 256 shards, cached: 2.01× at p50 (≤ 2), 1.50× at p99 (≤ 3): missed" in edge


def test_a_run_without_the_reads_alone_reports_the_mix_only() -> None:
    lines = _wide_section(Report(wide_latency_ms={PLAIN: (0.40, 1.0)}))
    assert lines
    assert not any("--alone" in line for line in lines)
