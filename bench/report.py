"""``bench/results/REPORT.md`` and its plots, from one ``bench.pipeline`` run."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import shapes

if TYPE_CHECKING:
    from bench.pipeline import Report


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# The same figures from `make bench` before the batch path, the lean flush and unified compaction (commit
# b3521e5, bench/results/REPORT.md of that commit): the "before" column of the cost table.
BEFORE = {
    "consumer_cpu": 33.2,
    "cassandra_cpu": 23.2,
    "raw_ratio": 0.10,
    "native_ratio": 6.2,
    "quix_ratio": 1.7,
}


def _plots(report: Report, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(8, 3.5))
    systems = list(report.rates)
    ax.barh(systems[::-1], [report.rates[s] for s in systems][::-1], color="#4477aa")
    ax.set_xlabel("events per second")
    ax.set_title(f"{report.events:,} trades, {report.symbols:,} symbols, {report.partitions} partitions")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    names.append("throughput.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = list(report.read_latency_ms)
    ax.bar([x - 0.2 for x in range(len(labels))], [report.read_latency_ms[n][0] for n in labels], 0.4, label="p50")
    ax.bar([x + 0.2 for x in range(len(labels))], [report.read_latency_ms[n][1] for n in labels], 0.4, label="p99")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("ms")
    ax.set_title("read latency of one instance")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "read_latency.png", dpi=110)
    names.append("read_latency.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    kinds = list(report.memory_bytes)
    ax.bar(kinds, [report.memory_bytes[k] for k in kinds], color="#228833")
    ax.set_ylabel("bytes of RSS per live instance")
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=110)
    names.append("memory.png")
    plt.close(fig)
    return names


def _cost_table(report: Report, cs: float, raw: float, native: float, quix: float) -> list[str]:
    """Cost per event, before and now, against its targets."""
    cassandra = report.server_cpu_s_per_million.get("Cassandra", 0.0)
    hot = report.hot_path_us
    lines = [
        "## Cost per event",
        "",
        "Before: the same command at commit b3521e5 (records applied one at a time, a frozen dataclass and an "
        "awaited statement look-up per row written, leveled compaction). Now: this run.",
        "",
        "| figure | before | now | target | |",
        "|---|---:|---:|---:|---|",
        f"| consumer CPU s per million events (whole process, flushes included) | {BEFORE['consumer_cpu']:.1f} | "
        f"{report.cpu_s_per_million:.1f} | ≤ 10 | {_verdict(report.cpu_s_per_million <= 10)} |",
        f"| Cassandra CPU s per million events | {BEFORE['cassandra_cpu']:.1f} | {cassandra:.1f} | ≤ 8 | "
        f"{_verdict(0 < cassandra <= 8)} |",
        f"| throughput, ratio to raw aiokafka | {BEFORE['raw_ratio']:.2f}× | {cs / raw:.2f}× | ≥ 0.3× | "
        f"{_verdict(cs >= 0.3 * raw)} |",
        f"| ratio to Cassandra counter columns | {BEFORE['native_ratio']:.1f}× | {cs / native:.1f}× | ≥ 15× | "
        f"{_verdict(cs >= 15 * native)} |",
        f"| ratio to Quix Streams, exactly-once | {BEFORE['quix_ratio']:.1f}× | {cs / quix:.1f}× | ≥ 4× | "
        f"{_verdict(cs >= 4 * quix)} |",
    ]
    if hot:
        reference = hot["record at a time"]["keys repeating"]
        batch = hot["batch, collector tuned"]["keys repeating"]
        lines.append(f"| decode + route + apply, no I/O, keys repeating, µs/event (before: record at a time, "
                     f"same run) | {reference:.2f} | {batch:.2f} | ≤ 2.5 | {_verdict(batch <= 2.5)} |")
        lines += [
            "",
            "The hot path alone (`python -m bench.hot_path`: 100,000 events per round over 10,000 symbols, best "
            "of three rounds, every path interleaved in one process; CPU time):",
            "",
            "| path | keys repeating, µs/event | new keys, µs/event |",
            "|---|---:|---:|",
            *[f"| {name} | {figures['keys repeating']:.2f} | {figures['new keys']:.2f} |"
              for name, figures in hot.items()],
        ]
    return [*lines, ""]


def _stream_time(events: int) -> str:
    hours = events / shapes.EVENTS_PER_HOUR
    return "an hour" if hours == 1 else f"{hours:g} hours"


def shapes_section(report: Report) -> list[str]:
    """The hot path by shape of definition (``bench.hot_path --shapes``) and #32's target for it."""
    results = report.hot_path_shapes
    if not results:
        return []
    from bench.hot_path import shapes_table, slowest_shape

    name, ratio = slowest_shape(results)
    events = report.hot_path_shape_events
    return [
        "## The hot path by shape of definition",
        "",
        f"Decode, route and apply alone, no I/O (`python -m bench.hot_path --shapes --events "
        f"{events} --rounds 3`): one stream of events holding every field (`bench/shapes.py`), "
        "counted by the bench's three counters (count, sum, distinct, with event ids) read as flat fields, from a "
        "nested key, in hourly buckets, or with an exact decimal sum; by the same counters with the third of each "
        f"kind; and by the page views' nine. Rounds of {events:,} events ({_stream_time(events)} of the stream at its "
        f"{shapes.PER_SECOND} events a second), the best of three, every shape and path "
        "in one process, each round starting at another shape; CPU time, the collector tuned as the consumer's. "
        "The batch path is what the consumer runs; the router, what it falls back on for a record the batch "
        "path does not decide, and the reference the tests hold it equal to.",
        "",
        shapes_table(results),
        "",
        "| figure | measured | target | |",
        "|---|---:|---:|---|",
        f"| the slowest of flat's counters read another way ({name}) ÷ flat, batch path | {ratio:.2f}× | ≤ 1.3× | "
        f"{_verdict(ratio <= 1.3)} |",
        "",
        "*kind: count, sum, distinct* holds flat's own counters: its distance from flat is this run's noise.",
        "",
    ]


def _wide_section(report: Report) -> list[str]:
    """``bench.wide_reads``' table and its targets, when the run measured it."""
    if not report.wide_latency_ms:
        return []
    from bench import wide_reads

    return [
        "Wide instances (`python -m bench.wide_reads`): one instance with a shard from each of 1 to 1,000 "
        "mutators, for each sketch kind and a sum, read by `read_state` without and with serve's state cache "
        "(each counter's resets known, as serve keeps them), "
        "beside a plain one-row read, every read interleaved in an order shuffled each round; and ranges of "
        "100-shard hourly buckets. Target: 256 shards within 2× the plain row at p50 and 3× at p99.",
        "",
        *wide_reads.table(report.wide_latency_ms),
        "",
        *[f"- {line}" for line in wide_reads.targets(report.wide_latency_ms)],
        "",
        *([] if not report.wide_alone_latency_ms else [
            "The same cached reads of 1 and 256 shards, and the stamps query a 256-shard hit sends, interleaved with "
            "the plain row and nothing heavier (`python -m bench.wide_reads --alone`):",
            "",
            *wide_reads.table(report.wide_alone_latency_ms),
            "",
            *[f"- {line}" for line in wide_reads.targets(report.wide_alone_latency_ms)],
            ""]),
    ]


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}×" if theirs > 0 else "n/a"


def _kstreams_section(report: Report, cs: float) -> list[str]:
    """countersink beside Kafka Streams on the same topic in the same run: throughput, CPU, and the ratios."""
    ks = report.kstreams
    if not ks:
        return []
    consumer = report.cpu_s_per_million
    cassandra = report.server_cpu_s_per_million.get("Cassandra", 0.0)
    kafka = report.server_cpu_s_per_million.get("Kafka", 0.0)
    jvm = ks["jvm_cpu_s_per_million"]
    ks_kafka = ks.get("kafka_cpu_s_per_million", 0.0)
    ours, theirs = consumer + cassandra + kafka, jvm + ks_kafka
    rate = ks["events_per_s"]
    threads = int(ks.get("threads", 1))
    checked = int(ks.get("symbols_checked", 0))
    exactness = (f"Its count and sum of {checked:,} symbols, the last committed record of each in its output "
                 f"topic, compared with the truth: {len(report.kstreams_checks)} mismatched."
                 + ("" if not report.kstreams_checks else " " + "; ".join(report.kstreams_checks[:5]))
                 if checked else
                 f"Its values were not checked: it committed {ks['committed']:,.0f} of {report.events:,} events "
                 "within its time budget.")
    return [
        "## Kafka Streams",
        "",
        "What a JVM team would run instead: a Kafka Streams application (`bench/kstreams/`, built by Maven at the "
        "stack's Kafka version; `processing.guarantee=exactly_once_v2`, "
        + ("one stream thread" if threads == 1 else f"{threads} stream threads")
        + f", a commit every {ks.get('commit_interval_ms', 100):,.0f} ms, the totals in a RocksDB store with its "
        "changelog topic, every update written to an output "
        "topic) keeping count and sum of `qty` per symbol: two of countersink's three counters (no distinct). "
        "Timed from its JVM's start until its committed offsets reach the end of the topic; CPU is user + system "
        "of each process meanwhile, from /proc. "
        + exactness,
        "",
        "| figure | countersink | Kafka Streams | countersink ÷ Kafka Streams | target | |",
        "|---|---:|---:|---:|---:|---|",
        f"| events/s | {cs:,.0f} | {rate:,.0f} | {_ratio(cs, rate)} | ≥ 1.5× | "
        f"{_verdict(cs >= 1.5 * rate) if rate > 0 else 'not measured'} |",
        f"| CPU s per million events: the consumer / the Streams JVM | {consumer:.1f} | {jvm:.1f} | "
        f"{_ratio(consumer, jvm)} | | |",
        f"| CPU s per million events: Kafka | {kafka:.1f} | {ks_kafka:.1f} | | | |",
        f"| CPU s per million events: Cassandra | {cassandra:.1f} | (not used) | | | |",
        f"| whole pipeline CPU s per million events | {ours:.1f} | {theirs:.1f} | {_ratio(ours, theirs)} | ≤ 0.5× | "
        f"{_verdict(0 < ours <= 0.5 * theirs) if rate > 0 else 'not measured'} |",
        "",
    ]


TRADES_COUNTERS = 3  # the trades' counters: every event updates each of them


def stream2_section(report: Report) -> list[str]:
    """The second stream (``bench.stream2``) beside the trades, the same columns, and the ratios to its targets."""
    s2 = report.stream2
    if not s2:
        return []
    cs, variants, ks = s2["countersink"], s2.get("variants", {}), s2["kstreams"]
    like = s2.get("like_kstreams")  # countersink keeping only Kafka Streams' two counters
    server = report.server_cpu_s_per_million
    trades_cassandra = server.get("Cassandra", 0.0)
    trades_rows = report.cassandra_rows_per_event
    trades = {
        "events_per_s": report.rates["countersink"], "consumer_cpu_s_per_million": report.cpu_s_per_million,
        "consumer_cpu_us_per_update": report.cpu_s_per_million / TRADES_COUNTERS,
        "cassandra_cpu_s_per_million": trades_cassandra, "kafka_cpu_s_per_million": server.get("Kafka", 0.0),
        "shards_per_event": report.rows_per_event, "rows_per_event": trades_rows,
        "cassandra_cpu_us_per_row": trades_cassandra / trades_rows if trades_rows else 0.0}

    def row(name: str, counters: str, f: dict[str, float]) -> str:
        return (f"| {name} | {counters} | {f['events_per_s']:,.0f} | {f['consumer_cpu_s_per_million']:.1f} | "
                f"{f['consumer_cpu_us_per_update']:.2f} | {f['cassandra_cpu_s_per_million']:.1f} | "
                f"{f['kafka_cpu_s_per_million']:.1f} | {f['shards_per_event']:.2f} | {f['rows_per_event']:.2f} | "
                f"{f['cassandra_cpu_us_per_row']:.1f} |")

    per_update = cs["consumer_cpu_us_per_update"] / trades["consumer_cpu_us_per_update"]
    ks_rate = ks["events_per_s"]
    trades_ks = report.kstreams.get("events_per_s", 0.0)
    def pipeline_cpu(f: dict[str, float]) -> float:
        return f["consumer_cpu_s_per_million"] + f["cassandra_cpu_s_per_million"] + f["kafka_cpu_s_per_million"]

    ours = pipeline_cpu(cs)
    theirs = ks["jvm_cpu_s_per_million"] + ks.get("kafka_cpu_s_per_million", 0.0)
    checked = int(ks.get("counts_checked", 0))
    ks_exactness = (f"Kafka Streams' {checked:,} hourly counts (the last committed record of each in its output "
                    f"topic) compared with the truth: {len(s2['kstreams_checks'])} mismatched."
                    if checked else f"Kafka Streams' values were not checked: it committed "
                    f"{ks['committed']:,.0f} of {s2['events']:,} events within its time budget.")
    checks = [*s2["checks"], *s2.get("variant_checks", []), *s2.get("like_kstreams_checks", []),
              *s2["kstreams_checks"]][:5]
    floor = s2.get("rows_floor_per_event", 0.0)
    return [
        "## The second stream: page views",
        "",
        f"{s2['events']:,} page views over {s2['pages']:,} pages in a topic of their own ({s2['partitions']} "
        f"partitions, keyed by user, loaded in {s2['load_s']:.0f} s), shaped like real traffic and unlike the "
        "trades: a nested user, hourly and daily buckets of an epoch-seconds time, a decimal sum of purchases "
        "only, latency quantiles, top-k endpoints, a max, a mean, an error count under a filter: nine counters "
        f"over seven keys (`bench.shapes.PAGE_VIEWS`), {s2['updates_per_event']:.2f} counter updates per event "
        "(a counter whose filter or fields an event does not meet is not updated). Each system consumed the "
        "whole topic in one process, after the trades' runs, on the same servers.",
        "",
        "| stream | counters | events/s | consumer CPU s per million events | consumer CPU µs per counter "
        "update | Cassandra CPU s per million events | Kafka CPU s per million events | shards per event | "
        "Cassandra rows per event | Cassandra CPU µs per row |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        row("trades", "3 (count, sum, distinct)", trades),
        row("page views", "9", cs),
        *[row(f"page views, `{label}`", "9", f) for label, f in variants.items()],
        *([row("page views, Kafka Streams' two counters alone", "2 (views per page and per country, hourly)", like)]
          if like else []),
        "",
        "A shard is one counter's state of one key; a Cassandra row holds the shards of every counter sharing "
        "that key (`countersink_shard_rows_written_total`), and is what Cassandra's work follows. "
        + (f"Whatever the flush schedule, each consumer writes every row its partitions touched at least once: "
           f"{floor:.2f} rows per event on this stream (distinct partition and row key pairs in what was "
           "published), the floor of the page views' rows per event in this layout." if floor else ""),
        "",
        f"Kafka Streams (`HourlyCounts`, exactly-once v2, RocksDB window store, one stream thread, a commit every "
        f"{ks.get('commit_interval_ms', 100):,.0f} ms) kept the windowed equivalents it can of two of the nine "
        "counters (views per page per hour and per country per hour) in one application, through one "
        f"repartition topic: {ks_rate:,.0f} events/s, JVM {ks['jvm_cpu_s_per_million']:.1f} and Kafka "
        f"{ks.get('kafka_cpu_s_per_million', 0.0):.1f} CPU s per million events. {ks_exactness}",
        "",
        f"countersink's views (1,000 page-hours), views per country, revenue, errors and slowest, compared with "
        f"the truth computed while publishing: {len(s2['checks'])} mismatched"
        + (f"; in the runs with other settings: {len(s2.get('variant_checks', []))}" if variants else "")
        + (f"; keeping Kafka Streams' two counters alone, every views and views per country checked: "
           f"{len(s2.get('like_kstreams_checks', []))}" if like else "") + "."
        + ("" if not checks else " " + "; ".join(checks)),
        "",
        "| figure | measured | target | |",
        "|---|---:|---:|---|",
        f"| page views: consumer CPU per counter update ÷ trades' | {per_update:.2f}× | ≤ 1.3× | "
        f"{_verdict(per_update <= 1.3)} |",
        f"| countersink ÷ Kafka Streams EOS, events/s, trades | {_ratio(trades['events_per_s'], trades_ks)} | "
        f"≥ 1.5× | {_verdict(trades['events_per_s'] >= 1.5 * trades_ks) if trades_ks else 'not measured'} |",
        f"| countersink ÷ Kafka Streams EOS, events/s, page views (9 counters against its 2) | "
        f"{_ratio(cs['events_per_s'], ks_rate)} | ≥ 1.5× | "
        f"{_verdict(cs['events_per_s'] >= 1.5 * ks_rate) if ks_rate else 'not measured'} |",
        f"| whole pipeline CPU per event ÷ Kafka Streams' (JVM + Kafka), page views | {_ratio(ours, theirs)} | | |",
        *([f"| countersink ÷ Kafka Streams EOS, events/s, page views, the same two counters | "
           f"{_ratio(like['events_per_s'], ks_rate)} | | |",
           f"| whole pipeline CPU per event ÷ Kafka Streams', page views, the same two counters | "
           f"{_ratio(pipeline_cpu(like), theirs)} | | |"] if like else []),
        *[f"| page views, `{label}` ÷ the default: Cassandra rows per event, Cassandra CPU per event | "
          f"{_ratio(f['rows_per_event'], cs['rows_per_event'])}, "
          f"{_ratio(f['cassandra_cpu_s_per_million'], cs['cassandra_cpu_s_per_million'])} | | |"
          for label, f in variants.items()],
        "",
    ]


def write_report(report: Report, out: Path, command: str, made_on: str | None = None) -> str:
    """Write REPORT.md, its plots, and results.json (every figure, to render the report again from)."""
    out.mkdir(parents=True, exist_ok=True)
    made_on = made_on or time.strftime('%Y-%m-%d')
    record: dict[str, Any] = {"command": command, "made_on": made_on, "report": dataclasses.asdict(report)}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    plots = _plots(report, out)
    cs = report.rates["countersink"]
    raw = report.rates["raw aiokafka"]
    native = report.rates["Cassandra counter columns"]
    quix = report.rates["Quix Streams (exactly-once)"]
    default_recovery = [r["seconds"] for name, r in report.recovery_s.items() if "(the default)" in name]
    worst_recovery = max(default_recovery or [r["seconds"] for r in report.recovery_s.values()])
    worst_flushed = max([r.get("flushed_s", 0.0) for name, r in report.recovery_s.items() if "(the default)" in name]
                        or [0.0])
    lines = [
        "# countersink benchmarks",
        "",
        f"Made by `{command}` on {made_on} ({platform.machine()}, {_cpus()} CPUs, "
        f"Python {platform.python_version()}), with Kafka and Cassandra on the same machine. Every figure below "
        "comes from that one run; the machine is shared, so read the ratios rather than the absolute rates.",
        "",
        f"The topic: {report.events:,} JSON trades over {report.symbols:,} symbols, {report.partitions} "
        f"partitions, keyed by symbol (loaded in {report.load_s:.0f} s). Each system consumes the whole topic in "
        "one process (except where it says two), one after the other.",
        "",
        "## Throughput",
        "",
        "| system | events/s | ratio to countersink | note |",
        "|---|---:|---:|---|",
    ]
    for name, rate in report.rates.items():
        lines.append(f"| {name} | {rate:,.0f} | {rate / cs:.2f}× | {report.notes.get(name, '')} |")
    lines += [
        "",
        "- raw aiokafka: `getmany` and discard; the limit for a Python consumer.",
        "- countersink: one consumer process, three counters (count, integer sum, distinct) with event ids (the "
        "publisher-retry window on), from its start until every partition's last record is flushed and the "
        "process has shut down cleanly (final flush committed).",
        "- Cassandra counter columns: aiokafka, `json.loads`, and one `UPDATE … SET trades = trades + 1, "
        "shares = shares + ?` per event, as many in flight as countersink's client allows. Count and sum only "
        "(counter columns cannot keep a distinct count), and not exact: a retried update counts twice.",
        "- countersink, 2 processes: the same with two consumer processes in one group, sharing the partitions.",
        "- Quix Streams: its exactly-once mode (Kafka transactions, RocksDB state with changelog topics), "
        "count and sum of `qty` per symbol, no distinct; timed until its committed offsets reach the end.",
        "- Kafka Streams: exactly-once v2, RocksDB, count and sum of `qty` per symbol, no distinct; timed the same "
        "way (see [Kafka Streams](#kafka-streams)).",
        "",
        f"![throughput]({plots[0]})",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| countersink ≥ 0.6× raw consumption | {cs / raw:.2f}× | {_verdict(cs >= 0.6 * raw)} |",
        f"| ≥ 10× Cassandra counter columns | {cs / native:.1f}× | {_verdict(cs >= 10 * native)} |",
        f"| ahead of Quix Streams (exactly-once) | {cs / quix:.1f}× | {_verdict(cs > quix)} |",
        f"| recovery after kill -9 ≤ 10 s, whatever the state size | {worst_recovery:.1f} s worst until events "
        f"are applied again (default settings); its first flush after {worst_flushed:.1f} s at worst | "
        f"{_verdict(worst_recovery <= 10)} |",
        "",
        *_cost_table(report, cs, raw, native, quix),
        *_kstreams_section(report, cs),
        *stream2_section(report),
        *shapes_section(report),
        "## Exactness of the countersink run",
        "",
        f"Count and sum of 2,000 symbols compared with the truth computed while publishing: "
        f"{len(report.checks)} mismatched." + ("" if not report.checks else " " + "; ".join(report.checks[:5])),
        "",
        "## Cost",
        "",
        f"- Consumer CPU: {report.cpu_s_per_million:.1f} CPU seconds per million events (user + system of the "
        "consumer process, three counters).",
        f"- GC: {report.gc['instances_folded']:,.0f} instances folded ({report.gc['shards_deleted']:,.0f} shards "
        f"deleted) in {report.gc['seconds']:.1f} s: **{report.gc['instances_per_s']:,.0f} instances/s** "
        "(`countersink gc --once`, default concurrency 16, CL ALL on one node).",
        "",
        "Memory per live instance, as a mutator holds it (RSS growth over 4 events per instance on average, "
        "each kind in a fresh interpreter):",
        "",
        "| kind | bytes per instance |",
        "|---|---:|",
        *[f"| {kind} | {value:,.0f} |" for kind, value in report.memory_bytes.items()],
        "",
        f"![memory]({plots[2]})",
        "",
        "## Read latency",
        "",
        "One instance read (tally and every shard, merged) against a plain one-row read, sequentially, "
        "interleaved round by round, at QUORUM on one node:",
        "",
        "| read | p50 ms | p99 ms | p50 ratio to the plain row |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / report.read_latency_ms['plain row'][0]:.2f}× |"
          for name, (p50, p99) in report.read_latency_ms.items()],
        "",
        f"![read latency]({plots[1]})",
        "",
        "Roll-ups of a bucketed counter (`python -m bench.rollup`): hourly buckets of one key, each with a shard "
        "from each of 12 partitions, merged into one value by `CounterReader.rollup` (HyperLogLog lg_k 12 with "
        "2,000 values per shard for the distinct). Target: p50 ≤ 50 ms for 168 distinct buckets.",
        "",
        "| roll-up | p50 ms | p99 ms |",
        "|---|---:|---:|",
        *[f"| {name} | {p50:.1f} | {p99:.1f} |" for name, (p50, p99) in report.rollup_latency_ms.items()],
        "",
        *_wide_section(report),
        "## Recovery after kill -9",
        "",
        "A consumer holding every instance of a topic live in memory is killed with `kill -9`; a replacement "
        "starts at once while events keep arriving (20 per second). Measured from the kill until the "
        "replacement's `countersink_events_applied_total` is above 0 (applying again), and until its "
        "`countersink_flush_seconds_count` is (its first flush has written what it applied since):",
        "",
        "| state | seconds to apply again | first flush after | replacement serving metrics after | "
        "takeover (replay) | window replayed | RSS of the killed consumer |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {name} | {r['seconds']:.1f} | {r.get('flushed_s', 0.0):.1f} s | {r['process_up_s']:.1f} s | "
          f"{r['takeover_s']:.1f} s | {r['replayed_records']:,.0f} records, {r['replayed_instances']:,.0f} "
          f"instances | {r['rss_mb_before_kill']:,.0f} MB |" for name, r in report.recovery_s.items()],
        "",
        "The instances held are never read back: a takeover reads only the shards of the killed consumer's "
        "last flush window, and only if that window was still open. A consumer killed while its partition is "
        "busy leaves it open (at most `flush_max_dirty` instances per partition): the replacement claims the "
        "partition and starts applying new records at once, while in the background it reads the window's "
        "records again and rewrites their shards; its own first flush waits for that. One that had gone quiet "
        "had recorded its last window complete at the next flush time, so there is nothing to replay."
        + " The rows above measure both. Until the first flush, reads show the counts as of the killed "
        "consumer's last completed flush.",
        "",
    ]
    quiet = [r["seconds"] for name, r in report.recovery_s.items() if "(the default)" in name and "quiet" in name]
    if len(quiet) > 1:
        lines += [f"Killed while quiet with the default 6 s session timeout, recovery differs by "
                  f"{max(quiet) - min(quiet):+.1f} s between the smallest and the largest "
                  "state. Most of the wait is the group's: the dead member's session must time out before the "
                  "rebalance hands its partition over. `COUNTERSINK_CONSUMER__SESSION_TIMEOUT_MS` trades that "
                  "wait against tolerance of pauses; 6 s is the broker's default minimum "
                  "(`group.min.session.timeout.ms`).", ""]
    lines += [
        "## Where the consumer's time goes",
        "",
        f"- Decoding, routing and applying the same trades to the same three counters in one process, with no "
        f"Kafka and no Cassandra (the batch path, keys repeating, see above): "
        f"**{report.apply_only:,.0f} events/s**, {report.apply_only / raw:.2f}× the raw consumption rate. "
        "That is the ceiling of countersink's per-event CPU work in Python before any I/O.",
        f"- The consumer reached {cs / report.apply_only:.2f}× that ceiling. It wrote "
        f"{report.rows_per_event:.2f} shards per event, three to a Cassandra row (one row per key holds the "
        "shards of the counters sharing it): a flush rewrites every instance touched since the last one, whole, "
        "so its cost follows the keys touched, and while a backlog remains flushes are spaced out "
        "(`flush_spacing`) so that each folds in more events. Encoding rows and driving requests take the same "
        "Python thread as applying.",
        "- CPU seconds per million events during the countersink run: "
        + ", ".join([f"consumer {report.cpu_s_per_million:.1f}"]
                    + [f"{name} {cpu:.1f}" for name, cpu in report.server_cpu_s_per_million.items()])
        + f". All three share the machine's {_cpus()} cores.",
        f"- Spacing flushes further apart while a backlog remains folds more events into each row: with "
        f"`flush_spacing` 4 instead of the default 10 the consumer reached "
        f"{report.rates.get('countersink, flush_spacing 4', 0) / cs:.2f}× the default's rate in the same run. On "
        "streams where keys repeat within a flush interval (most real streams are skewed), the shards per event "
        "fall further.",
        f"- Two consumer processes in one group reached "
        f"{report.rates.get('countersink, 2 processes', 0) / cs:.2f}× one process's rate: each applies in its own "
        f"thread, but the machine's {_cpus()} cores are shared with Kafka and Cassandra, and Cassandra's CPU per "
        "event is close to the consumer's.",
        "",
    ]
    if report.profile:
        lines += ["The countersink run again, its Python stacks sampled by `py-spy` from outside the process "
                  "(100 a second, without pausing it). The functions that were running most often:", "",
                  report.profile, ""]
    text = "\n".join(lines)
    (out / "REPORT.md").write_text(text)
    return text


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    """Render REPORT.md and its plots again from a results.json (``python -m bench.report FILE``)."""
    from bench.pipeline import Report

    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m bench.report bench/results/results.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    record = json.loads(path.read_text())
    report = Report(**record["report"])
    report.read_latency_ms = {name: (p50, p99) for name, (p50, p99) in report.read_latency_ms.items()}
    report.rollup_latency_ms = {name: (p50, p99) for name, (p50, p99) in report.rollup_latency_ms.items()}
    report.wide_latency_ms = {name: (p50, p99) for name, (p50, p99) in report.wide_latency_ms.items()}
    print(write_report(report, path.parent, record["command"], record["made_on"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
