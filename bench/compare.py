"""Consumer settings side by side: one stack, one loaded topic, one countersink run per variant.

    python -m bench.compare '{"flush_spacing": 4}' '{"flush_spacing": 10}' [--events 2000000] [--repeat 2]

Each variant is a JSON object of consumer settings (``COUNTERSINK_CONSUMER__*`` names, lower case), plus
``"processes": N`` to run N consumer processes in one group (default 1). The topic
is ``make bench``'s (JSON trades keyed by symbol); each run gets a fresh keyspace and group, consumes the
whole topic until every record is flushed, and has count and sum of a sample of symbols checked against the
truth. Prints events per second, the ratio to raw consumption measured in the same run, consumer CPU, shards
per event and the servers' CPU. Starts its own Kafka and Cassandra (ports 29192 and 29142, data under
``.stack/compare``) and stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

from bench import pipeline
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.logs import configure_logging
from countersink.settings import CassandraSettings, KafkaSettings
from stack import servers


async def run(args: argparse.Namespace) -> int:
    pipeline.STACK = servers.STACK_DIR / "compare"
    pipeline.STACK.mkdir(parents=True, exist_ok=True)
    mismatched = 0
    with pipeline.bench_servers(pipeline.STACK, kafka_port=29192, native_port=29142, storage_port=27100,
                                jmx_port=27299, cluster_name="countersink-compare") as (kafka_server, cassandra_node):
        jvms = {name: server.process.pid for name, server in (("Cassandra", cassandra_node), ("Kafka", kafka_server))
                if server.process is not None and server.process.pid is not None}
        kafka = KafkaSettings(bootstrap_servers=[kafka_server.bootstrap], client_id="countersink-compare")
        base = CassandraSettings(contact_points=["127.0.0.1"], port=29142, keyspace="compare_warmup",
                                 replication="{'class': 'SimpleStrategy', 'replication_factor': 1}")
        async with CassandraClient(base, use_keyspace=False) as client:
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

        await pipeline.load(kafka, pipeline.TOPIC, args.partitions, args.events, make, "trades")
        if args.warmup_seconds > 0:
            pipeline.say(f"warming Cassandra up ({args.warmup_seconds:.0f} s, not measured)")
            await pipeline.native_counter_rate(kafka, base, args.partitions, args.events, args.warmup_seconds / 2)
            await pipeline.warm_up_consumer(kafka, base, args.partitions, args.warmup_seconds / 2)
        raw = await pipeline.raw_rate(kafka, args.partitions, args.events)
        print(f"raw aiokafka: {raw:,.0f} events/s", flush=True)
        for repeat in range(args.repeat):
            for number, variant in enumerate(args.variants):
                settings = json.loads(variant)
                cassandra = base.model_copy(update={"keyspace": f"compare_{repeat}_{number}"})
                async with CassandraClient(cassandra, use_keyspace=False) as client:
                    await client.ensure_schema()
                group = f"compare-{repeat}-{number}"
                result = await pipeline.countersink_rate(kafka, cassandra, args.partitions, args.events, group,
                                                         jvms, **settings)
                problems = await pipeline.check_values(cassandra, truth, args.check, group)
                mismatched += len(problems)
                servers_cpu = ", ".join(f"{name} {cpu / args.events * 1e6:.1f}"
                                        for name, cpu in result.server_cpu_s.items())
                print(f"{variant}: {result.rate:,.0f} events/s ({result.rate / raw:.3f}× raw), consumer "
                      f"{result.cpu_s / args.events * 1e6:.1f} CPU s per million events, "
                      f"{result.rows / args.events:.2f} shards per event, servers {servers_cpu}; "
                      f"{len(problems)} of {2 * min(args.check, len(truth))} checked values mismatched "
                      + "; ".join(problems[:3]), flush=True)
    return 1 if mismatched else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help='consumer settings as JSON, e.g. \'{"flush_spacing": 4}\'')
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--symbols", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=1, help="run every variant this many times, interleaved")
    parser.add_argument("--warmup-seconds", type=float, default=40.0)
    parser.add_argument("--check", type=int, default=300, help="symbols whose count and sum are checked")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    for variant in args.variants:
        try:
            settings = json.loads(variant)
        except json.JSONDecodeError as exc:
            parser.error(f"{variant!r} is not JSON: {exc}")
        if not isinstance(settings, dict):
            parser.error(f"{variant!r} is not a JSON object of consumer settings")
    configure_logging("WARNING", "console")
    try:
        return asyncio.run(run(args))
    except servers.StackError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
