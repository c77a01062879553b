"""The benchmark figures the docs quote, rendered from ``bench/results/results.json``: never typed twice.

A page holds a generated region as ``<!-- figures:begin NAME -->...<!-- figures:end -->`` (on lines of their
own, or inline in a table cell); ``python -m bench.docs_figures`` rewrites every region of README.md and
docs/*.md from results.json, and ``--check`` only says which are out of date (exit 1).
``tests/unit/test_docs_figures.py`` fails when a page differs from what this renders.

Figures of older runs that results.json does not hold are kept here with the commit of their run (the
"before" figures of ``bench/report.py`` and ``EARLIER``), so that a page never states them undated.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "results.json"
WIDTH = 110
REGION = re.compile(r"<!-- figures:begin (?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- figures:end -->", re.DOTALL)

# Figures of `make bench` runs before the one in results.json, each from bench/results/REPORT.md at its commit.
EARLIER = {
    "b3521e5": {"consumer_cpu": 33.2, "cassandra_cpu": 23.2},
    "bda413a": {"consumer_cpu": 15.4, "cassandra_cpu": 19.9, "raw": 333_363},
    "44fbecb": {"consumer_cpu": 9.9, "cassandra_cpu": 7.3, "rows_per_event": 0.26},
}
CONSUMER_CPU_TARGET = 10.0  # CPU s per million events (bench/report.py's cost table)
CASSANDRA_CPU_TARGET = 8.0
LABELS = {  # results.json's system names, as the benchmarks page shows them
    "raw aiokafka": "raw aiokafka (`getmany`, discard)",
    "countersink": "countersink (count, sum, distinct; exactly-once)",
    "countersink, flush_spacing 4": "countersink with `flush_spacing` 4",
    "countersink, 2 processes": "countersink, two consumer processes",
    "Cassandra counter columns": "Cassandra counter columns (count and sum)",
    "Quix Streams (exactly-once)": "Quix Streams, exactly-once (count and sum)",
}


def load(path: Path = RESULTS) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _figures(results: dict[str, Any]) -> dict[str, Any]:
    r = results["report"]
    rates = r["rates"]
    cs = rates["countersink"]
    two = r["notes"].get("countersink, 2 processes", "")
    found = re.search(r"consumers ([0-9.]+), Cassandra ([0-9.]+)", two)
    consumer, cassandra = r["cpu_s_per_million"], r["server_cpu_s_per_million"]["Cassandra"]
    total = consumer + cassandra + r["server_cpu_s_per_million"].get("Kafka", 0.0)
    recovery = r["recovery_s"]
    quiet = next(v for k, v in recovery.items() if k.startswith("1,000,000 instances, quiet") and "(the default)" in k)
    after_flush = next(v for k, v in recovery.items() if "right after a flush" in k)
    default = [v["seconds"] for k, v in recovery.items() if "(the default)" in k]
    return {
        "cs": cs, "raw": rates["raw aiokafka"], "native": rates["Cassandra counter columns"],
        "quix": rates["Quix Streams (exactly-once)"], "two": rates["countersink, 2 processes"],
        "consumer": consumer, "cassandra": cassandra, "kafka": r["server_cpu_s_per_million"].get("Kafka", 0.0),
        "total": total, "ceiling": 2 * 1e6 / total, "rows": r["rows_per_event"],
        "two_consumers": float(found[1]) if found else None, "two_cassandra": float(found[2]) if found else None,
        "quiet": quiet, "after_flush": after_flush, "worst_default": max(default), "checks": r["checks"],
        "hot": (r["hot_path_us"]["batch, collector tuned"]["keys repeating"],
                r["hot_path_us"]["record at a time"]["keys repeating"]),
        "rollup_168_distinct": r["rollup_latency_ms"].get("distinct, 168 hourly buckets × 12 shards", [None])[0],
    }


def throughput_table(results: dict[str, Any]) -> str:
    rates = results["report"]["rates"]
    cs = rates["countersink"]
    rows = [f"| {LABELS.get(name, name)} | {rate:,.0f} | {rate / cs:.2f}× |" for name, rate in rates.items()]
    return "\n".join(["| | events/s | ratio to countersink |", "|---|---:|---:|", *rows])


def cost_paragraph(results: dict[str, Any]) -> str:
    f = _figures(results)
    older = EARLIER
    return (
        f"The consumer used {f['consumer']:.1f} CPU s per million events ({older['b3521e5']['consumer_cpu']} at "
        f"b3521e5, {older['bda413a']['consumer_cpu']} at bda413a, {older['44fbecb']['consumer_cpu']} at 44fbecb) "
        f"and Cassandra {f['cassandra']:.1f} ({older['b3521e5']['cassandra_cpu']}, "
        f"{older['bda413a']['cassandra_cpu']}, {older['44fbecb']['cassandra_cpu']}), Kafka {f['kafka']:.1f}; it "
        f"wrote {f['rows']:.2f} shards per event, three to a row. Those {f['total']:.1f} CPU s per million events "
        "are the whole pipeline's cost on the machine's two cores, whichever process spends them: at most about "
        f"{round(f['ceiling'], -3):,.0f} events per second. Two consumer processes reached {f['two']:,.0f}, with "
        f"the consumers at {f['two_consumers']} and Cassandra at {f['two_cassandra']} CPU s per million events in "
        "their run (Cassandra's figure is its CPU during the run; compaction it leaves for later is not in it). "
        f"Reaching 0.3× raw consumption ({round(0.3 * f['raw'], -3):,.0f} events per second in this run) would "
        f"take about {2 * 1e6 / (0.3 * f['raw']):.0f} CPU s per million events in total, about what Cassandra "
        f"alone spends. Its figure moves between runs: {older['44fbecb']['cassandra_cpu']} at 44fbecb (at "
        f"{older['44fbecb']['rows_per_event']} shards per event) and {f['cassandra']:.1f} here. Runs differ on this "
        f"shared machine: bda413a's run measured raw aiokafka at {older['bda413a']['raw']:,} events per second, "
        f"this one at {f['raw']:,.0f}. With 1M live instances, a quiet consumer killed with `kill -9` is replaced "
        f"and applying again in {f['quiet']['seconds']:.1f} s; one killed right after a flush in "
        f"{f['after_flush']['seconds']:.1f} s, and the replacement's first flush lands after "
        f"{f['after_flush']['flushed_s']:.1f} s, once it has replayed that "
        f"{f['after_flush']['replayed_instances']:,.0f}-instance window in the background. The same run checked "
        f"2,000 symbols: {len(f['checks'])} mismatched values. Compare ratios within one run, not rates across runs."
    )


def _verdict(value: float, target: float) -> str:
    return "met" if value <= target else "missed"


def known_issue(results: dict[str, Any]) -> str:
    f = _figures(results)
    return (
        f"On 2M trades spread evenly over 100k symbols (three counters, 300k instances), `{results['command']}` "
        f"(results of {results['made_on']}, `bench/results/results.json`) measured one consumer process at "
        f"{f['consumer']:.1f} CPU s per million events, Cassandra at {f['cassandra']:.1f}, "
        f"{f['cs'] / f['raw']:.2f}× raw Kafka consumption, {f['cs'] / f['native']:.1f}× Cassandra counter columns "
        f"and {f['cs'] / f['quix']:.1f}× Quix Streams in its exactly-once mode. The consumer's CPU target (≤ "
        f"{CONSUMER_CPU_TARGET:.0f}) is {_verdict(f['consumer'], CONSUMER_CPU_TARGET)}, Cassandra's (≤ "
        f"{CASSANDRA_CPU_TARGET:.0f}) is {_verdict(f['cassandra'], CASSANDRA_CPU_TARGET)}; the ratios (≥ 0.3×, "
        f"≥ 15×, ≥ 4×) are missed. On the benchmark's two cores the whole pipeline's {f['total']:.1f} CPU s per "
        f"million events allow about {round(f['ceiling'], -3):,.0f} events per second; two consumer processes "
        f"reached {f['two']:,.0f} ({f['two'] / f['quix']:.1f}× Quix Streams), spending less per event in their "
        f"run (consumers {f['two_consumers']}, Cassandra {f['two_cassandra']}); 0.3× raw consumption would need "
        f"about {2 * 1e6 / (0.3 * f['raw']):.0f}. The hot path alone is {f['hot'][0]:.2f} µs per event against "
        f"{f['hot'][1]:.2f} record at a time, side by side; the rest of the consumer's thread is Kafka's record "
        "decoding and the flush."
    )


def status_bench(results: dict[str, Any]) -> str:
    f = _figures(results)
    consumer_ok = f["consumer"] <= CONSUMER_CPU_TARGET
    cassandra_ok = f["cassandra"] <= CASSANDRA_CPU_TARGET
    missed = ("the cost-per-event targets are missed" if not (consumer_ok or cassandra_ok) else
              "the consumer's CPU target is met, Cassandra's and the ratio targets are missed" if consumer_ok
              and not cassandra_ok else "the ratio targets are missed")
    return (f"working; results in `bench/results/REPORT.md` ({results['made_on']}): "
            f"{f['cs'] / f['quix']:.1f}× Quix Streams and {f['cs'] / f['native']:.1f}× counter columns, recovery "
            f"within {f['worst_default']:.1f} s, roll-ups of 168 distinct buckets in {f['rollup_168_distinct']:.0f} "
            f"ms (p50); {missed} (see [Known issues](guarantees.md#known-issues))")


def takeover(results: dict[str, Any]) -> str:
    f = _figures(results)
    return (f"The replacement applies new records at once ({f['after_flush']['seconds']:.1f} s after the kill with "
            f"1M live instances, `make bench` of {results['made_on']}), but its first flush waits until it has "
            f"replayed that window in the background ({f['after_flush']['replayed_instances']:,.0f} instances: "
            f"first flush {f['after_flush']['flushed_s']:.1f} s after the kill).")


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "bench-takeover": takeover,
    "bench-throughput": throughput_table,
    "bench-cost": cost_paragraph,
    "bench-known-issue": known_issue,
    "bench-status": status_bench,
}


def pages(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(text: str, results: dict[str, Any], where: str = "") -> str:
    """The page with every region filled; a region on lines of its own keeps its lines."""

    def fill(found: re.Match[str]) -> str:
        name = found["name"]
        if name not in RENDERERS:
            raise SystemExit(f"{where}: no figures named {name!r} in bench/docs_figures.py ({sorted(RENDERERS)})")
        body = RENDERERS[name](results)
        if found["body"].startswith("\n"):  # a region of lines: as indented as its begin line, prose wrapped
            indent = text[:found.start()].rsplit("\n", 1)[-1]
            if "\n" not in body:
                body = textwrap.fill(body, WIDTH, initial_indent=indent, subsequent_indent=indent,
                                     break_long_words=False, break_on_hyphens=False)
            else:
                body = textwrap.indent(body, indent)
            body = f"\n{body}\n{indent}"
        return f"<!-- figures:begin {name} -->{body}<!-- figures:end -->"

    return REGION.sub(fill, text)


def stale(root: Path = REPO, results: dict[str, Any] | None = None) -> list[Path]:
    """The pages whose regions differ from what results.json renders."""
    results = results or load(root / "bench" / "results" / "results.json")
    return [page for page in pages(root) if render(page.read_text(), results, page.name) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs_figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only name the pages out of date (exit 1 if any)")
    args = parser.parse_args(argv)
    results = load()
    out_of_date = stale(REPO, results)
    for page in out_of_date:
        if args.check:
            print(f"{page.relative_to(REPO)}: figures differ from bench/results/results.json", file=sys.stderr)
        else:
            page.write_text(render(page.read_text(), results, page.name))
            print(f"rewrote the figures of {page.relative_to(REPO)}")
    return 1 if args.check and out_of_date else 0


if __name__ == "__main__":
    sys.exit(main())
