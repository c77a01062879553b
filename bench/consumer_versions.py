"""The page views' consumer at two versions, side by side on one loaded topic: a commit's and the working tree's.

    python -m bench.consumer_versions --against COMMIT [--events N] [--rounds N] [--kafka HOST:PORT]
                                      [--cassandra HOST:PORT] [--retain DURATION]

``bench.stream2`` runs each stream once on fresh servers, and from one run to the next the page views' consumer
moves by more than most changes to it. This loads ``--events`` page views of ``bench.stream2``'s shape once
into a topic of the running servers (the development stack's by default, ``make services-up``), then counts
them with a consumer process started in each version's source tree (the commit's packages written out with
``git archive``, as ``bench.versions`` does), the versions in an order shuffled each round, each run in a
consumer group and under counter names of its own, every value checked against the truth. Printed per run and
as medians: the consumer's CPU per million events and per counter update, Cassandra's CPU per million events
(when the servers are the development stack's, whose processes ``.stack/state.json`` names), events per second.
``--retain`` gives each bucketed counter that retention (long enough for the stream's 2025 buckets to be kept:
``3650d``): its rows are then written with their expiry.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench import pipeline, stream2
from bench.versions import _archive
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics, make_admin
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers

KEYSPACE = "consumer_versions"
PARTITIONS = 12


def _server_pids() -> dict[str, int]:
    """The development stack's Kafka and Cassandra processes, when it runs: their CPU is read around each run."""
    entries = servers.load_state()
    return {name.capitalize(): int(str(entries[name]["pid"])) for name in ("kafka", "cassandra") if name in entries}


async def _fresh_topic(kafka: KafkaSettings) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        if stream2.TOPIC in await admin.list_topics():
            await admin.delete_topics([stream2.TOPIC])
            await asyncio.sleep(3)  # the deletion completes on the broker after it answers
    finally:
        await admin.close()
    await ensure_topics(kafka, {stream2.TOPIC: PARTITIONS})


def with_retention(text: str, retain: str | None) -> str:
    """The page views' definitions, each bucketed counter given ``retain`` (none: as they are)."""
    if retain is None:
        return text
    return "\n".join(f'{line}\nretain = "{retain}"' if line.startswith("bucket = ") else line
                     for line in text.split("\n"))


async def run(against: str, tree: Path, kafka: KafkaSettings, cassandra: CassandraSettings, events: int,
              rounds: int, retain: str | None = None) -> str:
    async with CassandraClient(cassandra, use_keyspace=False) as client:
        await client.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", prepared=False)
        await client.ensure_schema()
    await _fresh_topic(kafka)
    truth = stream2.Truth(partitions=PARTITIONS)
    await pipeline.load(kafka, stream2.TOPIC, PARTITIONS, events, stream2.maker(20_000, 7, truth), "page views")
    servers = _server_pids()
    trees = {against: tree, "working tree": pipeline.ROOT}
    runs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in trees}
    kept = "" if retain is None else f", bucketed counters kept {retain}"
    lines = [f"{events:,} page views ({truth.updates / events:.2f} counter updates per event{kept}), {rounds} rounds",
             "",
             "| round | version | consumer CPU s per million events | µs per update | Cassandra CPU s per million "
             "events | events/s | values mismatched |", "|---:|---|---:|---:|---:|---:|---:|"]
    for round_ in range(rounds):
        order = list(trees)
        random.shuffle(order)
        for name in order:
            group = f"versions-{round_}-{len(runs[name])}-{int(time.time())}"
            consumed = await pipeline.countersink_rate(kafka, cassandra, PARTITIONS, events, group, servers,
                                                       topic=stream2.TOPIC,
                                                       counters_text=with_retention(stream2.definitions(), retain),
                                                       tree=trees[name])
            problems = await stream2.check_values(cassandra, truth, stream2.renamed(group))
            figures = (consumed.cpu_s * 1e6 / events, consumed.cpu_s * 1e6 / truth.updates,
                       consumed.server_cpu_s.get("Cassandra", 0.0) * 1e6 / events, consumed.rate)
            runs[name].append(figures)
            lines.append(f"| {round_} | {name} | {figures[0]:.1f} | {figures[1]:.2f} | {figures[2]:.1f} | "
                         f"{figures[3]:,.0f} | {len(problems)} |")
            pipeline.say(lines[-1])
    lines += ["", "| version | consumer CPU s per million events, median | × the commit's | Cassandra, median |",
              "|---|---:|---:|---:|"]
    base = statistics.median(r[0] for r in runs[against])
    for name, figures in runs.items():
        consumer = statistics.median(r[0] for r in figures)
        lines.append(f"| {name} | {consumer:.1f} | {consumer / base:.2f}× | "
                     f"{statistics.median(r[2] for r in figures):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.consumer_versions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the commit measured beside the working tree")
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kafka", default="127.0.0.1:9092")
    parser.add_argument("--cassandra", default="127.0.0.1:9042")
    parser.add_argument("--retain", metavar="DURATION",
                        help='give each bucketed counter this retention (e.g. 3650d: its rows then expire)')
    args = parser.parse_args(argv)
    if args.against.startswith("-"):
        parser.error("--against names a commit")
    host, _, port = args.cassandra.rpartition(":")
    kafka = KafkaSettings(bootstrap_servers=[args.kafka], client_id="countersink-versions")
    cassandra = CassandraSettings(contact_points=[host], port=int(port), keyspace=KEYSPACE,
                                  replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
    with tempfile.TemporaryDirectory(prefix="countersink-consumer-versions-") as folder:
        _archive(args.against, Path(folder))
        print(asyncio.run(run(args.against, Path(folder), kafka, cassandra, args.events, args.rounds,
                              args.retain)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
