"""Cassandra's CPU per event and per row under each set of options of the shards table, measured side by side.

    python -m bench.table_options [--events N] [--rounds N] [--variant NAME ...]

Built as ``bench.compaction``: one keyspace per variant (the schema, then ``ALTER TABLE shards WITH ...``), the
same loaded topics, and a countersink consumer over the whole of each topic into each keyspace in turn, round
after round (the variants' order turned by one each round, so none always follows the same one), on both of
``make bench``'s streams: the trades of ``bench.pipeline`` (three counters of one key) and the page views of
``bench.stream2`` (nine counters over seven keys, 1.3 rows per event). After each run the variant's keyspace
is flushed (``nodetool flush``) and its compactions are waited for: Cassandra's CPU from the consumer's start
to the end of those is what the variant's events cost it, the writes it would otherwise leave to the next
run included. Each variant's values are checked against what was published (its last round). It prints, per
stream and variant, the median and the spread over the rounds of Cassandra's CPU seconds per million events
and µs per Cassandra row, and their ratio to the current table's. It starts its own servers on the
benchmark's ports (29092/29042) and stops them on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from bench import pipeline as bp
from bench import stream2
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.logs import configure_logging
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers

# name -> the options given to ALTER TABLE shards WITH ... ("" is the table as create_tables makes it)
VARIANTS: dict[str, str] = {
    "current": "",
    "no_compression": "compression = {'enabled': 'false'}",
    "lz4_4k": "compression = {'class': 'LZ4Compressor', 'chunk_length_in_kb': 4}",
    "lz4_64k": "compression = {'class': 'LZ4Compressor', 'chunk_length_in_kb': 64}",
    "trie": "memtable = 'trie'",
    "trie_no_compression": "memtable = 'trie' AND compression = {'enabled': 'false'}",
    "bloom_0.1": "bloom_filter_fp_chance = 0.1",
}
PARTITIONS = 12
STREAMS = ("trades", "page views")


@dataclass
class Figures:
    cpu_s_per_million: list[float] = field(default_factory=list)  # Cassandra, run + flush + compactions
    run_cpu_s_per_million: list[float] = field(default_factory=list)  # Cassandra, the consumer's run alone
    us_per_row: list[float] = field(default_factory=list)
    rows_per_event: list[float] = field(default_factory=list)
    events_per_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    check_s: float = 0.0  # the values' check (the same reads for every variant), last round
    shards_mib: float = 0.0  # the keyspace's shards SSTables on disk after the last round, compacted


def keyspace_of(name: str) -> str:
    return "tableopts_" + name.replace(".", "_")


async def settle(node: servers.CassandraNode, settings: CassandraSettings, timeout_s: float = 300) -> None:
    """Flush the keyspace's shards to SSTables and wait until Cassandra runs no compaction."""
    done = await asyncio.to_thread(node.nodetool, "flush", settings.keyspace, "shards")
    if done.returncode != 0:
        raise RuntimeError(f"nodetool flush exited {done.returncode}: {done.stderr.strip()[-500:]}")
    deadline = time.monotonic() + timeout_s
    async with CassandraClient(settings, use_keyspace=False) as client:
        while time.monotonic() < deadline:
            tasks = list(await client.execute("SELECT keyspace_name FROM system_views.sstable_tasks", prepared=False))
            if not tasks:
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"compactions still running after {timeout_s:.0f} s")


async def check_trades(cassandra: CassandraSettings, truth: dict[str, tuple[int, int]], prefix: str,
                       sample: int = 500) -> list[str]:
    problems = []
    async with CassandraClient(cassandra) as client:
        for symbol in sorted(truth)[:sample]:
            count, qty = truth[symbol]
            for counter, want in (("trades", count), ("shares", qty)):
                state = await read_state(client, prefix + counter, symbol)
                got = None if state is None else state.value()
                if got != want:
                    problems.append(f"{counter}/{symbol}: {got} != {want}")
    return problems


def cpu_s(pid: int) -> float:
    return bp.proc_cpu_s(pid)


def shards_mib(node: servers.CassandraNode, keyspace: str) -> float:
    """The size of the keyspace's shards SSTables on disk."""
    files = (node.root / "data" / "data" / keyspace).glob("shards-*/*")
    return sum(path.stat().st_size for path in files if path.is_file()) / 2**20


async def run(events: int, rounds: int, variants: dict[str, str], seed: int, warmup_s: float
              ) -> dict[str, dict[str, Figures]]:
    bp.STACK.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Figures]] = {stream: {name: Figures() for name in variants} for stream in STREAMS}
    with bp.bench_servers(bp.STACK, kafka_port=29092, native_port=29042, storage_port=27000, jmx_port=27199,
                          cluster_name="countersink-bench") as (kafka_server, node):
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-bench")
        keyspaces = {}
        for name, options in variants.items():
            settings = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace=keyspace_of(name),
                                         replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepared=False)
                await client.ensure_schema()
                if options:
                    await client.execute(f"ALTER TABLE {settings.keyspace}.shards WITH {options}", prepared=False)
            keyspaces[name] = settings
        await ensure_topics(kafka, {bp.TOPIC: PARTITIONS, stream2.TOPIC: PARTITIONS})
        rng = random.Random(seed)
        trades_truth: dict[str, tuple[int, int]] = {}

        def trade(i: int) -> tuple[bytes, bytes]:
            key, value = bp.trade(i, rng, events // 20)
            event = json.loads(value)
            count, qty = trades_truth.get(event["symbol"], (0, 0))
            trades_truth[event["symbol"]] = (count + 1, qty + event["qty"])
            return key, value

        await bp.load(kafka, bp.TOPIC, PARTITIONS, events, trade, "trades")
        views_truth = stream2.Truth(partitions=PARTITIONS)
        await bp.load(kafka, stream2.TOPIC, PARTITIONS, events, stream2.maker(events // 50, seed, views_truth),
                      "page views")
        assert node.process is not None
        assert node.process.pid is not None
        assert kafka_server.process is not None
        assert kafka_server.process.pid is not None
        cassandra_pid = node.process.pid
        jvms = {"Cassandra": cassandra_pid, "Kafka": kafka_server.process.pid}
        await bp.warm_up_consumer(kafka, keyspaces["current"], PARTITIONS, warmup_s)
        await settle(node, keyspaces["current"])
        names = list(variants)
        for round_ in range(rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                settings = keyspaces[name]
                for stream in STREAMS:
                    # short: the counters are renamed after it (run_to_0_3_pv_views_by_country), 48 characters at most
                    group = f"to-{round_}-{names.index(name)}-{'pv' if stream == 'page views' else 'tr'}"
                    before = cpu_s(cassandra_pid)
                    if stream == "trades":
                        result = await bp.countersink_rate(kafka, settings, PARTITIONS, events, group, jvms)
                    else:
                        result = await bp.countersink_rate(kafka, settings, PARTITIONS, events, group, jvms,
                                                           topic=stream2.TOPIC, counters_text=stream2.definitions())
                    await settle(node, settings)
                    total = cpu_s(cassandra_pid) - before
                    figures = results[stream][name]
                    figures.cpu_s_per_million.append(total / events * 1e6)
                    figures.run_cpu_s_per_million.append(result.server_cpu_s["Cassandra"] / events * 1e6)
                    figures.us_per_row.append(total * 1e6 / max(result.cassandra_rows, 1))
                    figures.rows_per_event.append(result.cassandra_rows / events)
                    figures.events_per_s.append(result.rate)
                    if round_ == rounds - 1:
                        prefix = stream2.renamed(group)
                        started = time.monotonic()
                        figures.problems = (await check_trades(settings, trades_truth, prefix) if stream == "trades"
                                            else await stream2.check_values(settings, views_truth, prefix))
                        figures.check_s = time.monotonic() - started
                        figures.shards_mib = shards_mib(node, settings.keyspace)
                    print(f"round {round_ + 1}, {name}, {stream}: Cassandra {total / events * 1e6:.1f} CPU s per "
                          f"million events ({result.server_cpu_s['Cassandra'] / events * 1e6:.1f} during the run), "
                          f"{figures.us_per_row[-1]:.1f} µs per row, {figures.rows_per_event[-1]:.3f} rows per "
                          f"event, {result.rate:,.0f} events/s", flush=True)
    return results


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def ratio(mine: list[float], theirs: list[float]) -> str:
    return f"{statistics.median(mine) / statistics.median(theirs):.2f}×"


def table(results: dict[str, dict[str, Figures]], variants: dict[str, str]) -> list[str]:
    lines = []
    for stream in STREAMS:
        base = results[stream].get("current")
        lines += [f"{stream}:", "",
                  "| variant | Cassandra CPU s per million events, median (min–max) | × current | "
                  "during the run alone | µs per row | × current | rows per event | events/s | values | "
                  "check's reads, s | shards on disk, MiB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for name in variants:
            f = results[stream][name]
            lines.append(
                f"| {name} | {spread(f.cpu_s_per_million)} | "
                f"{ratio(f.cpu_s_per_million, base.cpu_s_per_million) if base else '-'} | "
                f"{spread(f.run_cpu_s_per_million)} | {spread(f.us_per_row)} | "
                f"{ratio(f.us_per_row, base.us_per_row) if base else '-'} | "
                f"{statistics.median(f.rows_per_event):.3f} | {statistics.median(f.events_per_s):,.0f} | "
                f"{'exact' if not f.problems else f'{len(f.problems)} mismatched'} | {f.check_s:.1f} | "
                f"{f.shards_mib:.1f} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.table_options", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000, help="of each stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--warmup-seconds", type=float, default=60.0, help="a consumer warms Cassandra up, unmeasured")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), default=None,
                        help="only these (repeatable; 'current' is always run)")
    args = parser.parse_args(argv)
    chosen = {name: VARIANTS[name] for name in VARIANTS if args.variant is None or name in {"current", *args.variant}}
    configure_logging("WARNING", "console")
    command = "python -m bench.table_options " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        results = asyncio.run(run(args.events, args.rounds, chosen, args.seed, args.warmup_seconds))
    except servers.StackError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    print("\n".join([f"Made by `{command.strip()}` on {time.strftime('%Y-%m-%d')}.", "", *table(results, chosen)]))
    return 1 if any(f.problems for by_name in results.values() for f in by_name.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
