"""Loading a topic, starting countersink processes and waiting for them to catch up: shared by the demo, the
benchmarks and the integration tests."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import make_consumer, make_producer
from countersink.settings import CassandraSettings, KafkaSettings


def child_env(kafka: KafkaSettings, cassandra: CassandraSettings, **sections: dict[str, object]) -> dict[str, str]:
    """The environment of a countersink child process that talks to these servers, plus any settings given
    per section: ``child_env(k, c, consumer={"group_id": "g"})`` sets COUNTERSINK_CONSUMER__GROUP_ID."""
    env = {
        **os.environ,
        "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": ",".join(kafka.bootstrap_servers),
        "COUNTERSINK_CASSANDRA__CONTACT_POINTS": ",".join(cassandra.contact_points),
        "COUNTERSINK_CASSANDRA__PORT": str(cassandra.port),
        "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra.keyspace,
        "COUNTERSINK_CASSANDRA__REPLICATION": cassandra.replication,
        "COUNTERSINK_LOG_FORMAT": "json",
    }
    for section, values in sections.items():
        env.update({f"COUNTERSINK_{section.upper()}__{name.upper()}": str(value) for name, value in values.items()})
    return env


async def publish(settings: KafkaSettings, topic: str, events: Sequence[bytes], connect_attempts: int = 10,
                  keys: Sequence[bytes | None] | None = None) -> None:
    """Publish in order, each keyed by its own content (or by ``keys``, one a record, when given): a retrying
    publisher re-sends the same record with the same key, so a retry lands in the same partition as the original.

    A broker that is restarting (the chaos run restarts it while publishing) refuses the connection: the
    producer is started again, a second apart, before anything is sent, so no record goes out twice."""
    for attempt in range(1, connect_attempts + 1):
        producer = make_producer(settings)
        try:
            await producer.start()
            break
        except KafkaConnectionError:
            await producer.stop()
            if attempt == connect_attempts:
                raise
            await asyncio.sleep(1.0)
    try:
        chosen = keys if keys is not None else [hashlib.blake2b(event, digest_size=8).digest() for event in events]
        deliveries = [await producer.send(topic, event, key=key) for event, key in zip(events, chosen, strict=True)]
        await asyncio.gather(*deliveries)
    finally:
        await producer.stop()


async def end_offsets(settings: KafkaSettings, partitions: dict[str, int]) -> dict[TopicPartition, int]:
    """The log-end offset of every partition of the given topics (topic -> partition count)."""
    tps = [TopicPartition(topic, p) for topic, count in partitions.items() for p in range(count)]
    async with make_consumer(settings) as consumer:
        ends = await consumer.end_offsets(tps)
    return {tp: int(offset) for tp, offset in ends.items()}


async def unflushed(client: CassandraClient, group: str, ends: dict[TopicPartition, int]) -> int:
    """Records below ``ends`` that the group's ownership rows do not yet show flushed."""
    behind = 0
    for topic in sorted({tp.topic for tp in ends}):
        partitions = sorted(tp.partition for tp in ends if tp.topic == topic)
        rows = as_dicts(await client.execute(
            "SELECT partition, intent_offset FROM partitions WHERE consumer_group = ? AND topic = ? "
            "AND partition IN ?", [group, topic, partitions]))
        flushed = {row["partition"]: row["intent_offset"] for row in rows}
        behind += sum(max(0, ends[TopicPartition(topic, p)] - 1 - flushed.get(p, -1)) for p in partitions)
    return behind


async def wait_until_flushed(cassandra: CassandraSettings, group: str, ends: dict[TopicPartition, int],
                             within_s: float = 120.0, progress: Callable[[int], None] | None = None,
                             consumers: Sequence[subprocess.Popen[Any]] = ()) -> None:
    """Until every partition's ownership row shows a flush through its last record; ``progress`` hears the
    number of records still behind every 3 seconds. Raises at once when one of ``consumers`` has exited:
    nothing would flush what is left (a definition refused, a crash)."""
    started = last_report = time.monotonic()
    async with CassandraClient(cassandra) as client:
        while (behind := await unflushed(client, group, ends)) > 0:
            if exited := [process for process in consumers if process.poll() is not None]:
                raise RuntimeError(f"a consumer (pid {exited[0].pid}) exited {exited[0].returncode} with {behind} "
                                   "records not flushed")
            if time.monotonic() - started > within_s:
                raise TimeoutError(f"{behind} records still not flushed after {within_s:.0f}s")
            if progress is not None and time.monotonic() - last_report >= 3:
                progress(behind)
                last_report = time.monotonic()
            await asyncio.sleep(0.5)
