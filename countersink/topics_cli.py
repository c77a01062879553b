"""``countersink topics create``: create the Kafka topics a definitions file names (or the ones given).

Brokers usually refuse to create topics on first use (``auto.create.topics.enable=false``), and a consumer
whose topics do not exist waits for them, unready. Topics that exist already are left as they are.

A topic that a counter with ``event_id`` reads is created with ``cleanup.policy=delete``, whatever the broker's
default: the consumer refuses to count such a counter on a compacted topic (``consumer.cleanup_policies``).
One that exists compacted is reported (``topic_refused``) and the command exits 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiokafka.admin import NewTopic

from consumer.cleanup_policies import check_policies, deduplicating
from countersink.cli import (
    EXIT_USAGE,
    HelpFormatter,
    load_definitions_or_refuse,
    positive_int,
    run_async,
    setting_default,
)
from countersink.kafka import broker_topic_defaults, cleanup_policies, raise_topic_errors, start_admin
from countersink.logs import get_logger
from countersink.settings import MAX_TOPIC_PARTITIONS, Settings
from schemas.definitions import NOT_COUNTABLE_TOPICS, TOPIC_PATTERN, CounterSet
from schemas.errors import CompactedTopicError

log = get_logger(__name__)


def _partition_count(text: str) -> int:
    """An argparse type: partitions of a new topic, bounded as COUNTERSINK_CONSUMER__TOPIC_PARTITIONS is."""
    value = positive_int(text)
    if value > MAX_TOPIC_PARTITIONS:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_TOPIC_PARTITIONS:,} partitions")
    return value


# Replicas of a topic: Kafka's CreateTopics request holds a 16-bit number.
MAX_REPLICATION_FACTOR = 32_767

def _replication_factor(text: str) -> int:
    """An argparse type: replicas of a new topic, bounded as COUNTERSINK_CONSUMER__TOPIC_REPLICATION_FACTOR is
    (Kafka's request holds a 16-bit number: 32,768 failed inside the client, exit 1)."""
    value = positive_int(text)
    if value > MAX_REPLICATION_FACTOR:
        raise argparse.ArgumentTypeError(f"{text} is more than {MAX_REPLICATION_FACTOR:,} replicas")
    return value


def _topic_name(text: str) -> str:
    """An argparse type: a Kafka topic name (not "." or "..", which Kafka refuses, nor one of Kafka's own)."""
    if not TOPIC_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kafka topic name ([A-Za-z0-9._-], at most 249)")
    if text in NOT_COUNTABLE_TOPICS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a topic to create: Kafka refuses it, or it is Kafka's own")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create missing topics (idempotent)",
                                description="Create the topics a definitions file names, and any given by name,\n"
                                "that do not exist yet. Prints one line per topic: created or exists.",
                                formatter_class=HelpFormatter)
    create.add_argument("topics", nargs="*", metavar="TOPIC", type=_topic_name,
                        help="topic names (besides those of --counters)")
    create.add_argument("--counters", type=Path, metavar="FILE",
                        help="create every topic this definitions file names")
    create.add_argument("--partitions", type=_partition_count, default=None, metavar="N",
                        help="partitions of each new topic " + setting_default("consumer.topic_partitions"))
    create.add_argument("--replication-factor", type=_replication_factor, default=None, metavar="N",
                        help="replicas of each new topic, at most the number of brokers (default: the broker's "
                        "default.replication.factor, from COUNTERSINK_CONSUMER__TOPIC_REPLICATION_FACTOR)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    topics = list(dict.fromkeys(args.topics))  # a name given twice is one topic (Kafka refused the request)
    counters = None
    if args.counters is not None:
        counters = load_definitions_or_refuse(args.counters, settings.cassandra.max_row_bytes)
        if counters is None:
            return EXIT_USAGE
        topics += [t for t in counters.topics if t not in topics]
    if not topics:
        log.error("usage_refused", error="name topics, or a definitions file with --counters")
        return EXIT_USAGE
    partitions = args.partitions or settings.consumer.topic_partitions
    replication_factor = args.replication_factor or settings.consumer.topic_replication_factor
    return run_async(create_topics(settings, topics, partitions, replication_factor, counters))


async def create_topics(settings: Settings, topics: list[str], partitions: int, replication_factor: int | None,
                        counters: CounterSet | None = None) -> int:
    """Create each missing topic; print ``created NAME (N partitions)`` or ``exists NAME (N partitions)``.
    Topics that ``counters`` deduplicate by event id are created with ``cleanup.policy=delete``; one that exists
    compacted is refused (exit 2). A topic the broker refuses raises its Kafka error, naming the topic and the
    broker's reason."""
    window = settings.consumer.retry_window_records
    plain = deduplicating(counters, window) if counters is not None else {}
    # A refused login or certificate is named (KafkaSecurityError), not reported as a failed bootstrap.
    admin = await start_admin(settings.kafka)
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t not in existing]
        if missing:
            if replication_factor is None:  # the broker's default.replication.factor
                replication_factor = (await broker_topic_defaults(admin))[1]
            # A topic another process creates between the listing and this request counts as created.
            raise_topic_errors(await admin.create_topics([NewTopic(t, partitions, replication_factor, topic_configs={
                "cleanup.policy": "delete"} if t in plain else None) for t in missing]))
        existing_ones = [t for t in topics if t not in missing]
        described = {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(existing_ones)
                     } if existing_ones else {}
    finally:
        await admin.close()
    for topic in topics:
        if topic in missing:
            print(f"created {topic} ({partitions} partition{'' if partitions == 1 else 's'})")
        else:
            count = described.get(topic, "?")
            print(f"exists  {topic} ({count} partition{'' if count == 1 else 's'})")
    if counters is None or not plain:
        return 0
    try:
        check_policies(counters, window, await cleanup_policies(settings.kafka, [t for t in plain if t in topics]))
    except CompactedTopicError as exc:
        for topic, line in zip(sorted(exc.topics), exc.lines, strict=True):
            log.error("topic_refused", topic=topic, policy=exc.policies[topic], error=line)
        return EXIT_USAGE
    return 0
