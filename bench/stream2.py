"""``make bench``'s second stream: page views, shaped like real traffic and unlike the trades.

Each event (``bench.shapes.event``) has a nested user, an epoch-seconds time (20 events a second, so an hour
holds 72,000), a page out of ``pages``, an endpoint, a status, a latency, a decimal amount and a type. The nine
counters of ``bench.shapes.PAGE_VIEWS`` read it: hourly and daily buckets, keys from nested fields, a decimal
sum of purchases only, latency quantiles, top-k endpoints, an error count under a filter, over seven
different keys. The stream is loaded into a topic of its own (keyed by ``user.id``) and counted:

- by a countersink consumer, until every record is flushed (the same columns as the trades: events/s, CPU per
  event and per counter update, Cassandra and Kafka CPU), its views, views per country, revenue, errors and
  slowest values checked against the truth computed while publishing; Cassandra rows written per event and
  Cassandra CPU per row (what its nine counters over seven keys cost the store);
- by the same consumer with other settings (``--variant consumer.flush_spacing=30``: one run each), measured
  in the same run: rows per event and Cassandra CPU per row, the same values;
- by a countersink consumer keeping only the two counters Kafka Streams keeps the equivalents of (views per
  page and per country, per hour), both systems then counting the same thing, its values checked;
- by Kafka Streams (``HourlyCounts``, exactly-once v2), keeping the windowed equivalents it can of two of the
  nine counters in one application (views per page and per country, per hour), its every count checked.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
import zlib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench import kstreams, pipeline, shapes
from bench.pipeline import ConsumerRun, countersink_rate, load, named_for, say
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers

TOPIC = "bench-pageviews"
GROUP = "bench-countersink-pageviews"  # its counters are renamed run_pageviews_…
WIDER_GROUP = "bench-countersink-pageviews-variant"  # and -0, -1, … a variant
COUNTERS = 9
# Kafka Streams: an hourly count of each, in one application (key paths, comma-separated)
KSTREAMS_KEYS = ("page", "user.country")
# countersink's counters of those two hourly counts, counted alone in a run of their own (like for like)
KSTREAMS_COUNTERS = ("views", "views_by_country")
LIKE_GROUP = "bench-countersink-pageviews-like-kstreams"


def definitions(topic: str = TOPIC, only: Collection[str] | None = None) -> str:
    """The nine page-view counters of ``bench.shapes`` (or those named in ``only``) on ``topic``."""
    return shapes.page_views(only).replace(f'topics = ["{shapes.TOPIC}"]', f'topics = ["{topic}"]')


def renamed(group: str) -> str:
    """The prefix ``pipeline.named_for`` gives the counters of ``group`` (``run_pageviews_``)."""
    return named_for('name = "', group).removeprefix('name = "')


def hour(ts: int) -> str:
    """An hourly bucket's name in an instance key: its start in UTC."""
    return time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(ts - ts % 3600))


@dataclass
class Truth:
    """What the published page views add up to, for the counters checked (exact: decimals as decimals)."""

    partitions: int = 1  # the topic's, to tell the rows each partition's consumer must write
    events: int = 0
    updates: int = 0  # counter updates: each event once in every counter it applies to (filters, fields)
    views: Counter[str] = field(default_factory=Counter)  # page|hour
    by_country: Counter[str] = field(default_factory=Counter)  # country|hour
    revenue: dict[str, Decimal] = field(default_factory=dict)  # country|hour, purchases only
    errors: Counter[str] = field(default_factory=Counter)  # endpoint|hour, status 500 or 503
    slowest: dict[str, float] = field(default_factory=dict)  # endpoint
    # (partition, Cassandra row key) pairs: each is written at least once, whatever the flush schedule
    rows: set[int] = field(default_factory=set)

    def add(self, value: bytes, key: bytes = b"") -> None:
        event = json.loads(value, parse_float=Decimal)
        bucket = hour(event["ts"])
        country, endpoint, page = event["user"]["country"], event["endpoint"], event["page"]
        day = time.strftime("%Y-%m-%dT00:00Z", time.gmtime(event["ts"]))
        partition = zlib.crc32(key) % self.partitions  # as pipeline.load places it
        # The rows the nine counters write: one per distinct instance key (counters sharing one share the row)
        for row in (f"{page}|{bucket}", f"{country}|{bucket}", f"{endpoint}|{bucket}", country, f"{page}|{day}",
                    endpoint, f"{endpoint}|{event['status']}"):
            self.rows.add(hash((partition, row)))
        self.events += 1
        self.updates += 7  # views, views_by_country, latency, top_endpoints, visitors, slowest, bytes
        self.views[f"{event['page']}|{bucket}"] += 1
        self.by_country[f"{country}|{bucket}"] += 1
        if event["type"] == "purchase":
            self.updates += 1
            revenue_key = f"{country}|{bucket}"
            self.revenue[revenue_key] = self.revenue.get(revenue_key, Decimal(0)) + event["amount"]
        if event["status"] in (500, 503):
            self.updates += 1
            self.errors[f"{endpoint}|{bucket}"] += 1
        latency = float(event["latency_ms"])
        self.slowest[endpoint] = max(latency, self.slowest.get(endpoint, latency))

    def hourly_counts(self) -> dict[str, int]:
        """HourlyCounts' expected output for ``KSTREAMS_KEYS``: ``page=/p/1|2025-11-26T00:00Z`` -> count."""
        return {**{f"page={key}": n for key, n in self.views.items()},
                **{f"user.country={key}": n for key, n in self.by_country.items()}}


def maker(pages: int, seed: int, truth: Truth) -> Any:
    """``make(i)`` for ``pipeline.load``: the i-th page view (keyed by its user), added to ``truth``."""
    rng = random.Random(seed)

    def make(i: int) -> tuple[bytes, bytes]:
        value = shapes.event(i, rng, pages)
        user = value[value.index(b'"user":{"id":"') + 14:]
        key = user[:user.index(b'"')]
        truth.add(value, key)
        return key, value

    return make


async def check_values(cassandra: CassandraSettings, truth: Truth, counter_prefix: str = "",
                       sample: int = 1_000, counters: Collection[str] | None = None) -> list[str]:
    """The countersink run's values against the truth: views of ``sample`` page-hours (sorted), and every
    views-per-country, revenue (exact decimal), error count and slowest latency; only those of ``counters``
    when given (a run keeping some of the nine)."""
    expected: list[tuple[str, str, object]] = [
        *[("views", key, truth.views[key]) for key in sorted(truth.views)[:sample]],
        *[("views_by_country", key, n) for key, n in sorted(truth.by_country.items())],
        *[("revenue", key, total) for key, total in sorted(truth.revenue.items())],
        *[("errors", key, n) for key, n in sorted(truth.errors.items())],
        *[("slowest", key, latency) for key, latency in sorted(truth.slowest.items())],
    ]
    if counters is not None:
        expected = [(counter, key, want) for counter, key, want in expected if counter in counters]
    problems = []
    async with CassandraClient(cassandra) as client:
        for counter, key, want in expected:
            state = await read_state(client, counter_prefix + counter, key)
            got = None if state is None else state.value()
            if got != want:
                problems.append(f"{counter}/{key}: {got} != {want}")
    return problems


def figures(run: ConsumerRun, truth: Truth, updates: int | None = None) -> dict[str, float]:
    """A countersink run's columns, as the trades' are reported; ``updates``: the counter updates its counters
    made, when not the nine's."""
    per_million = 1e6 / truth.events
    cassandra = run.server_cpu_s.get("Cassandra", 0.0)
    return {
        "events_per_s": run.rate,
        "consumer_cpu_s_per_million": run.cpu_s * per_million,
        "consumer_cpu_us_per_update": run.cpu_s * 1e6 / (updates or truth.updates),
        "cassandra_cpu_s_per_million": cassandra * per_million,
        "kafka_cpu_s_per_million": run.server_cpu_s.get("Kafka", 0.0) * per_million,
        "shards_per_event": run.rows / truth.events,
        "rows_per_event": run.cassandra_rows / truth.events,
        "cassandra_cpu_us_per_row": cassandra * 1e6 / run.cassandra_rows if run.cassandra_rows else 0.0,
    }


Variant = tuple[str, dict[str, dict[str, object]]]  # a label, and settings by section ("consumer", "cassandra")


def variant(spec: str) -> Variant:
    """``consumer.flush_spacing=30,cassandra.write_batch_rows=20`` -> (that text, its settings by section)."""
    settings: dict[str, dict[str, object]] = {}
    for item in spec.split(","):
        name, sep, value = item.strip().partition("=")
        section, dot, setting = name.partition(".")
        if not sep or not dot or section not in ("consumer", "cassandra") or not setting.isidentifier():
            raise ValueError(f"not SECTION.NAME=VALUE (section consumer or cassandra): {item!r}")
        settings.setdefault(section, {})[setting] = value
    return spec, settings


async def bench_step(kafka: KafkaSettings, cassandra: CassandraSettings, *, events: int, pages: int,
                     partitions: int, seed: int, variants: Sequence[Variant], kstreams_budget_s: float,
                     servers_by_name: dict[str, int], workdir: Path, classpath: str, kstreams_threads: int = 1,
                     kstreams_commit_ms: int = 100, profile_to: Path | None = None) -> dict[str, Any]:
    """Load the page views and count them four ways (see the module's docstring). Returns every figure and
    the mismatches found (``checks``, ``variant_checks``, ``like_kstreams_checks``, ``kstreams_checks``: empty
    when all is exact).
    ``profile_to``: py-spy samples the first countersink run's stacks into that file (``out["profile"]``)."""
    await ensure_topics(kafka, {TOPIC: partitions})
    truth = Truth(partitions=partitions)
    started = time.monotonic()
    await load(kafka, TOPIC, partitions, events, maker(pages, seed, truth), "page views")
    out: dict[str, Any] = {"events": events, "pages": pages, "partitions": partitions, "counters": COUNTERS,
                           "load_s": time.monotonic() - started, "updates_per_event": truth.updates / events,
                           "rows_floor_per_event": len(truth.rows) / events}
    say(f"loaded {events:,} page views ({truth.updates / events:.2f} counter updates per event) in "
        f"{out['load_s']:.0f}s")

    text = definitions()
    run = await countersink_rate(kafka, cassandra, partitions, events, GROUP, servers_by_name, profile_to,
                                 topic=TOPIC, counters_text=text)
    out["countersink"] = figures(run, truth)
    if profile_to is not None:
        out["profile"] = pipeline.profile_table(profile_to)
    say(f"page views, countersink: {run.rate:,.0f} events/s, {out['countersink']['rows_per_event']:.2f} Cassandra "
        f"rows per event, {out['countersink']['cassandra_cpu_us_per_row']:.1f} µs of Cassandra CPU per row")
    out["checks"] = await check_values(cassandra, truth, renamed(GROUP))
    say(f"page views, countersink: {len(out['checks'])} values mismatched")

    # the same run with other settings (rows per event, Cassandra CPU per row), in the same run
    out["variants"], out["variant_checks"] = {}, []
    for n, (label, settings) in enumerate(variants):
        group = f"{WIDER_GROUP}-{n}"
        consumer: dict[str, Any] = settings.get("consumer", {})
        run = await countersink_rate(kafka, cassandra, partitions, events, group, servers_by_name, topic=TOPIC,
                                     counters_text=text, cassandra_options=settings.get("cassandra"), **consumer)
        out["variants"][label] = figures(run, truth)
        problems = await check_values(cassandra, truth, renamed(group))
        out["variant_checks"] += [f"{label}: {problem}" for problem in problems]
        say(f"page views, {label}: {run.rate:,.0f} events/s, {out['variants'][label]['rows_per_event']:.2f} rows "
            f"per event, {len(problems)} values mismatched")

    # the two counters Kafka Streams keeps, alone: both systems counting the same thing (every page view has
    # a page, a country and a time: two updates each)
    run = await countersink_rate(kafka, cassandra, partitions, events, LIKE_GROUP, servers_by_name, topic=TOPIC,
                                 counters_text=definitions(only=KSTREAMS_COUNTERS))
    out["like_kstreams"] = figures(run, truth, updates=len(KSTREAMS_COUNTERS) * events)
    out["like_kstreams_checks"] = await check_values(cassandra, truth, renamed(LIKE_GROUP),
                                                     counters=KSTREAMS_COUNTERS)
    say(f"page views, countersink with Kafka Streams' two counters: {run.rate:,.0f} events/s, "
        f"{len(out['like_kstreams_checks'])} values mismatched")

    ks = await kstreams_run(kafka, partitions, events, kstreams_budget_s, servers_by_name, workdir, classpath,
                            threads=kstreams_threads, commit_ms=kstreams_commit_ms)
    out["kstreams"], out["kstreams_checks"] = kstreams_figures(ks, truth, threads=kstreams_threads,
                                                               commit_ms=kstreams_commit_ms)
    return out


async def kstreams_run(kafka: KafkaSettings, partitions: int, events: int, budget_s: float,
                       servers_by_name: Mapping[str, int], workdir: Path, classpath: str, *, threads: int = 1,
                       commit_ms: int = 100, topic: str = TOPIC) -> kstreams.StreamsRun:
    """HourlyCounts keeping views per page and per country per hour, until it has committed ``events``
    records (or for ``budget_s``)."""
    run = await kstreams.streams_rate(kafka, topic, partitions, events, budget_s, servers_by_name, workdir,
                                      classpath, threads=threads, config={"commit.interval.ms": commit_ms},
                                      application=kstreams.hourly(",".join(KSTREAMS_KEYS), "ts"))
    say(f"page views, Kafka Streams: {run.rate:,.0f} events/s over {run.committed:,} events")
    return run


def kstreams_figures(run: kstreams.StreamsRun, truth: Truth, *, threads: int = 1, commit_ms: int = 100
                     ) -> tuple[dict[str, float], list[str]]:
    """Its figures (as the trades' Kafka Streams step reports them) and its counts' mismatches with the truth;
    checked only when it committed every record."""
    per_million = 1e6 / max(run.committed, 1)
    out = {"events_per_s": run.rate, "committed": run.committed, "threads": threads,
           "commit_interval_ms": commit_ms, "jvm_cpu_s_per_million": run.cpu_s * per_million,
           **{f"{name.lower()}_cpu_s_per_million": cpu * per_million for name, cpu in run.server_cpu_s.items()}}
    if run.committed < truth.events:
        return out, []
    expected = truth.hourly_counts()
    out["counts_checked"] = len(expected)
    return out, kstreams.check_counts(kstreams.hourly_counts(run.output), expected)


# --- the second stream beside the trades, alone: `python -m bench.stream2`


async def run(args: argparse.Namespace) -> pipeline.Report:
    """The trades' countersink and Kafka Streams runs, then the second stream's (``bench_step``), on servers of
    the bench's own (as ``make bench`` starts them), one after the other: the figures #32's table compares,
    from one run, without the rest of ``make bench``."""
    report = pipeline.Report(events=args.events, symbols=args.symbols, partitions=args.partitions)
    stack = pipeline.STACK
    stack.mkdir(parents=True, exist_ok=True)
    for old in stack.glob("*.log"):
        old.unlink()
    say("building the Kafka Streams application (bench/kstreams)")
    classpath = kstreams.build()
    say("starting Kafka and Cassandra")
    with pipeline.bench_servers(stack, kafka_port=29092, native_port=29042, storage_port=27000, jmx_port=27199,
                                cluster_name="countersink-bench") as (kafka_server, cassandra_node):
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-bench")
        cassandra = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace="countersink_bench",
                                      replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.execute("DROP KEYSPACE IF EXISTS countersink_bench", prepared=False)
            await client.ensure_schema()
        await ensure_topics(kafka, {pipeline.TOPIC: args.partitions})
        rng = random.Random(args.seed)
        truth: dict[str, tuple[int, int]] = {}

        def make(i: int) -> tuple[bytes, bytes]:
            key, value = pipeline.trade(i, rng, args.symbols)
            event = json.loads(value)
            count, qty = truth.get(event["symbol"], (0, 0))
            truth[event["symbol"]] = (count + 1, qty + event["qty"])
            return key, value

        started = time.monotonic()
        await load(kafka, pipeline.TOPIC, args.partitions, args.events, make, "trades")
        report.load_s = time.monotonic() - started
        jvms = {name: server.process.pid for name, server in (("Cassandra", cassandra_node), ("Kafka", kafka_server))
                if server.process is not None and server.process.pid is not None}
        if args.warmup_seconds > 0:
            say(f"warming Cassandra up ({args.warmup_seconds:.0f} s, not measured)")
            await pipeline.warm_up_consumer(kafka, cassandra, args.partitions, args.warmup_seconds)

        say("trades: countersink (count, sum, distinct; exactly-once)")
        run_ = await countersink_rate(kafka, cassandra, args.partitions, args.events, pipeline.MAIN_GROUP, jvms)
        report.rates["countersink"] = run_.rate
        report.cpu_s_per_million = run_.cpu_s / args.events * 1e6
        report.server_cpu_s_per_million = {name: cpu / args.events * 1e6 for name, cpu in run_.server_cpu_s.items()}
        report.rows_per_event = run_.rows / args.events
        report.cassandra_rows_per_event = run_.cassandra_rows / args.events
        report.checks = await pipeline.check_values(cassandra, truth, 2000)
        say(f"trades, countersink: {run_.rate:,.0f} events/s; {len(report.checks)} values mismatched")

        say("trades: Kafka Streams, exactly-once v2")
        report.kstreams, report.kstreams_checks = await kstreams.bench_step(
            kafka, pipeline.TOPIC, args.partitions, truth, args.kstreams_seconds, jvms, stack, classpath,
            threads=args.kstreams_threads, commit_ms=args.kstreams_commit_ms)
        report.rates[kstreams.NAME] = report.kstreams["events_per_s"]
        say(f"trades, Kafka Streams: {report.kstreams['events_per_s']:,.0f} events/s; "
            f"{len(report.kstreams_checks)} values mismatched")

        say(f"page views: {args.stream2_events:,} over {args.pages:,} pages")
        report.stream2 = await bench_step(
            kafka, cassandra, events=args.stream2_events, pages=args.pages, partitions=args.partitions,
            seed=args.seed, variants=args.variant, kstreams_budget_s=args.kstreams_seconds,
            servers_by_name=jvms, workdir=stack, classpath=classpath, kstreams_threads=args.kstreams_threads,
            kstreams_commit_ms=args.kstreams_commit_ms,
            profile_to=stack / "pageviews-stacks.txt" if args.profile else None)
    say("servers stopped")
    return report


def main(argv: list[str] | None = None) -> int:
    from bench.report import _kstreams_section, stream2_section

    parser = argparse.ArgumentParser(prog="python -m bench.stream2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="trades")
    parser.add_argument("--symbols", type=int, default=50_000)
    parser.add_argument("--stream2-events", type=int, default=None, help="page views (default: as many as trades)")
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--variant", type=variant, action="append", default=[], metavar="SECTION.NAME=VALUE,…",
                        help="the page views counted again with these settings (repeatable)")
    parser.add_argument("--kstreams-seconds", type=float, default=300.0)
    parser.add_argument("--kstreams-threads", type=int, default=1)
    parser.add_argument("--kstreams-commit-ms", type=int, default=100)
    parser.add_argument("--warmup-seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="sample the page views' first countersink run with py-spy (100 a second, from outside)")
    parser.add_argument("--out", type=Path, default=None, help="write every figure here as JSON")
    args = parser.parse_args(argv)
    if args.stream2_events is None:
        args.stream2_events = args.events
    configure_logging("WARNING", "console")
    command = "python -m bench.stream2 " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        result = asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    lines = [f"Made by `{command.strip()}` on {time.strftime('%Y-%m-%d')}.", "",
             *_kstreams_section(result, result.rates["countersink"]),
             *stream2_section(result)]
    if result.stream2.get("profile"):
        lines += ["The page views' countersink run, its stacks sampled by py-spy:", "", result.stream2["profile"]]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text(json.dumps({"command": command.strip(), "report": dataclasses.asdict(result)},
                                       indent=1) + "\n")
    problems = [*result.checks, *result.kstreams_checks,
                *[p for name in pipeline.STREAM2_CHECKS for p in result.stream2.get(name, [])]]
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
