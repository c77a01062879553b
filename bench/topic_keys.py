"""What a counter costs when its key is not the topic's record key.

    python -m bench.topic_keys [--kafka HOST:PORT] [--cassandra HOST:PORT] [--events N] [--pages N]
                               [--partitions N] [--rounds N]

The same page views (``bench.shapes.event``, as ``bench.stream2`` makes them) are published into two topics
of ``--partitions`` partitions each: one keyed by user (as ``bench.stream2`` publishes them), one keyed by page.
Each is counted by a countersink consumer keeping views per page per hour and views per country per hour (the
two counters Kafka Streams keeps in ``bench.stream2``), the topics in turn, each round under new consumer
groups (the first round's order reversed in the next). Printed per topic, the median of the rounds: events
per second, the consumer's and Cassandra's CPU per million events (Cassandra's from ``/proc``: it must run on
this machine, found by its port), Cassandra rows written per event, and the least rows per event any flush
schedule could write (distinct pairs of partition and row key in what was published). Every count of every
run is checked against the truth computed while publishing (exit 1 on a mismatch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import pipeline, stream2
from bench.pipeline import load, say
from bench.wide_layouts import cassandra_pid
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics, start_admin
from countersink.settings import CassandraSettings, KafkaSettings

KEYS = ("user", "page")  # the record key of each topic: a field of the page view
COUNTERS = stream2.KSTREAMS_COUNTERS  # views per page per hour (keyed by page), views per country per hour


@dataclass
class Topic:
    """One topic's page views: the truth of its counts and the rows its consumers must write at least."""

    name: str
    key: str
    truth: stream2.Truth
    rows: set[int] = field(default_factory=set)  # (partition, row key) pairs of the two counters

    def maker(self, pages: int, seed: int) -> Callable[[int], tuple[bytes, bytes]]:
        """``make(i)`` for ``pipeline.load``: the i-th page view keyed by its ``key`` field, added to the truth."""
        make_user_keyed = stream2.maker(pages, seed, self.truth)
        needle = b'"user":{"id":"' if self.key == "user" else b'"page":"'

        def make(i: int) -> tuple[bytes, bytes]:
            _, value = make_user_keyed(i)
            start = value.index(needle) + len(needle)
            key = value[start:value.index(b'"', start)]
            partition = zlib.crc32(key) % self.truth.partitions  # as pipeline.load places it
            event = json.loads(value)
            hour = stream2.hour(event["ts"])
            self.rows.update((hash((partition, f"{event['page']}|{hour}")),
                              hash((partition, f"{event['user']['country']}|{hour}"))))
            return key, value

        return make


async def count(kafka: KafkaSettings, cassandra: CassandraSettings, topic: Topic, events: int, partitions: int,
                servers: dict[str, int]) -> tuple[dict[str, float], list[str]]:
    """One countersink run over ``topic``'s page views, under a new group: its figures and mismatches."""
    group = f"bench-keys-{topic.key}-{uuid.uuid4().hex[:4]}"  # counters renamed run_bench_keys_…: names stay short
    run = await pipeline.countersink_rate(kafka, cassandra, partitions, events, group, servers, topic=topic.name,
                                          counters_text=stream2.definitions(topic.name, only=COUNTERS))
    per_million = 1e6 / events
    figures = {"events_per_s": run.rate, "consumer_cpu_s_per_million": run.cpu_s * per_million,
               "cassandra_cpu_s_per_million": run.server_cpu_s.get("Cassandra", 0.0) * per_million,
               "rows_per_event": run.cassandra_rows / events}
    problems = await stream2.check_values(cassandra, topic.truth, stream2.renamed(group), counters=COUNTERS)
    return figures, problems


async def measure(kafka: KafkaSettings, cassandra: CassandraSettings, events: int, pages: int, partitions: int,
                  rounds: int, seed: int = 7) -> tuple[dict[str, dict[str, float]], dict[str, float], list[str]]:
    """The median figures of each topic's runs, each topic's floor of rows per event, and every mismatch."""
    suffix = uuid.uuid4().hex[:6]
    topics = [Topic(f"bench-topic-keys-{key}-{suffix}", key, stream2.Truth(partitions=partitions)) for key in KEYS]
    await ensure_topics(kafka, {topic.name: partitions for topic in topics})
    try:
        for topic in topics:
            await load(kafka, topic.name, partitions, events, topic.maker(pages, seed),
                       f"page views keyed by {topic.key}")
        servers = {"Cassandra": cassandra_pid(cassandra.port)}
        runs: dict[str, list[dict[str, float]]] = {topic.key: [] for topic in topics}
        problems: list[str] = []
        for round_ in range(rounds):
            for topic in topics if round_ % 2 == 0 else topics[::-1]:
                figures, mismatched = await count(kafka, cassandra, topic, events, partitions, servers)
                runs[topic.key].append(figures)
                problems += [f"keyed by {topic.key}: {problem}" for problem in mismatched]
                say(f"keyed by {topic.key}: {figures['events_per_s']:,.0f} events/s, "
                    f"{figures['rows_per_event']:.2f} rows per event, {len(mismatched)} values mismatched")
    finally:
        admin = await start_admin(kafka)
        try:
            await admin.delete_topics([topic.name for topic in topics])
        finally:
            await admin.close()
    medians = {key: {name: statistics.median(run[name] for run in of_key) for name in of_key[0]}
               for key, of_key in runs.items()}
    return medians, {topic.key: len(topic.rows) / events for topic in topics}, problems


def table(medians: dict[str, dict[str, float]], floors: dict[str, float]) -> str:
    lines = ["| topic's record key | events/s | consumer CPU s per million events | Cassandra CPU s per million events "
             "| Cassandra rows per event | least rows per event |", "|---|---:|---:|---:|---:|---:|"]
    for key, f in medians.items():
        lines.append(f"| {key} | {f['events_per_s']:,.0f} | {f['consumer_cpu_s_per_million']:.1f} | "
                     f"{f['cassandra_cpu_s_per_million']:.1f} | {f['rows_per_event']:.3f} | {floors[key]:.3f} |")
    user, page = medians["user"], medians["page"]
    lines.append(f"\nkeyed by page ÷ keyed by user: {page['events_per_s'] / user['events_per_s']:.2f}× events/s, "
                 f"{page['rows_per_event'] / user['rows_per_event']:.2f}× rows per event, "
                 f"{page['cassandra_cpu_s_per_million'] / user['cassandra_cpu_s_per_million']:.2f}× Cassandra CPU, "
                 f"{page['consumer_cpu_s_per_million'] / user['consumer_cpu_s_per_million']:.2f}× consumer CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topic_keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kafka", default="127.0.0.1:9092", help="HOST:PORT of a running Kafka")
    parser.add_argument("--cassandra", default="127.0.0.1:9042", help="HOST:PORT of a Cassandra on this machine")
    parser.add_argument("--events", type=int, default=300_000, help="page views per topic")
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each topic, alternating")
    args = parser.parse_args(argv)
    host, port = args.cassandra.rsplit(":", 1)
    kafka = KafkaSettings(bootstrap_servers=[args.kafka], client_id="bench-topic-keys")
    keyspace = f"bench_topic_keys_{uuid.uuid4().hex[:8]}"
    cassandra = CassandraSettings(contact_points=[host], port=int(port), keyspace=keyspace,
                                  replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")

    async def run() -> tuple[dict[str, dict[str, float]], dict[str, float], list[str]]:
        async with CassandraClient(cassandra, use_keyspace=False) as client:
            await client.ensure_schema()
        try:
            pipeline.STACK.mkdir(parents=True, exist_ok=True)
            return await measure(kafka, cassandra, args.events, args.pages, args.partitions, args.rounds)
        finally:
            async with CassandraClient(cassandra, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)

    medians, floors, problems = asyncio.run(run())
    print(table(medians, floors))
    for problem in problems[:10]:
        print(f"MISMATCH {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["KEYS", "Topic", "measure", "table"]
