"""Cassandra's CPU per event under each compaction strategy for the shards table, measured side by side.

    python -m bench.compaction [--events N] [--rounds N]

One topic of ``make bench``'s trades, one keyspace per strategy (the schema, then ``ALTER TABLE shards WITH
compaction = ...``), and a countersink consumer over the whole topic into each keyspace in turn, round after
round, so every strategy sees the same events and the same state of the machine. It prints Cassandra's CPU
seconds per million events for each run. It starts its own servers on the benchmark's ports (29092/29042).
"""

from __future__ import annotations

import argparse
import asyncio
import random

from bench import pipeline as bp
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.settings import CassandraSettings, KafkaSettings

STRATEGIES = {
    "lcs": "{'class': 'LeveledCompactionStrategy'}",
    "ucs": "{'class': 'UnifiedCompactionStrategy'}",
    "ucs_l4": "{'class': 'UnifiedCompactionStrategy', 'scaling_parameters': 'L4'}",
}
PARTITIONS = 12


async def run(events: int, rounds: int) -> None:
    bp.STACK.mkdir(parents=True, exist_ok=True)
    with bp.bench_servers(bp.STACK, kafka_port=29092, native_port=29042, storage_port=27000, jmx_port=27199,
                          cluster_name="countersink-bench") as (kafka_server, cassandra_node):
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-bench")
        keyspaces = {}
        for name, compaction in STRATEGIES.items():
            settings = CassandraSettings(contact_points=["127.0.0.1"], port=29042, keyspace=f"compaction_{name}",
                                         replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
            async with CassandraClient(settings, use_keyspace=False) as client:
                await client.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepared=False)
                await client.ensure_schema()
                await client.execute(f"ALTER TABLE {settings.keyspace}.shards WITH compaction = {compaction}",
                                     prepared=False)
            keyspaces[name] = settings
        await ensure_topics(kafka, {bp.TOPIC: PARTITIONS})
        rng = random.Random(7)
        await bp.load(kafka, bp.TOPIC, PARTITIONS, events, lambda i: bp.trade(i, rng, events // 20), "trades")
        assert cassandra_node.process is not None
        assert kafka_server.process is not None
        jvms = {"Cassandra": cassandra_node.process.pid, "Kafka": kafka_server.process.pid}
        await bp.warm_up_consumer(kafka, keyspaces["lcs"], PARTITIONS, 20)
        for round_ in range(rounds):
            for name, settings in keyspaces.items():
                result = await bp.countersink_rate(kafka, settings, PARTITIONS, events, f"compaction-{round_}-{name}",
                                                   jvms)
                print(f"{name}, round {round_ + 1}: Cassandra {result.server_cpu_s['Cassandra'] / events * 1e6:.1f} "
                      f"CPU s per million events, consumer {result.cpu_s / events * 1e6:.1f}, "
                      f"{result.rows / events:.3f} shards per event", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    asyncio.run(run(args.events, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
