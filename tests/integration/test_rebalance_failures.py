"""A rebalance callback that fails never leaves partitions assigned and idle, on real Kafka and Cassandra."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from countersink.settings import CassandraSettings, KafkaSettings
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import (
    REPO,
    expected_values,
    make_events,
    read_values,
    start_consumer,
    write_definitions,
)

pytestmark = pytest.mark.integration

# The consumer's own command, over a store whose every read of partition 1's ownership row raises an error
# that is not retriable (a bug, a refused permission): its take fails in the rebalance callback.
TAKE_FAILS_ON_PARTITION_1 = textwrap.dedent("""
    import sys
    import consumer.cli
    from consumer.cassandra_store import CassandraStore
    from countersink.cassandra import CassandraClient
    from countersink.cli import main

    class TakeFailsOnPartition1(CassandraStore):
        async def read_partition(self, pid):
            if pid.partition == 1:
                raise RuntimeError("injected: partition 1 cannot be taken")
            return await super().read_partition(pid)

    class Service(consumer.cli.ConsumerService):
        def __init__(self, settings, counters, **kwargs):
            cassandra = CassandraClient(settings.cassandra, app="countersink-consumer")
            super().__init__(settings, counters, cassandra=cassandra, store=TakeFailsOnPartition1(cassandra),
                             **kwargs)

    consumer.cli.ConsumerService = Service
    sys.exit(main(["consume"]))
""")


def _start_failing(kafka: KafkaSettings, cassandra: CassandraSettings, log: Path, consumer: dict[str, object]
                   ) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", TAKE_FAILS_ON_PARTITION_1], cwd=REPO,
                                env=child_env(kafka, cassandra, consumer={"health_port": 0, **consumer}),
                                stdout=out, stderr=subprocess.STDOUT)


async def test_a_take_that_fails_in_the_rebalance_callback_makes_the_process_exit_1_then_a_restart_counts_all(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """aiokafka only logs an error raised by a rebalance callback. A take that fails for one partition must
    not leave the rest of the assignment unclaimed and the process ready: it logs ``rebalance_failed`` at
    ERROR, releases what it holds and exits 1; restarted (as its supervisor would), it consumes every
    partition, and every count is exact."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(1500, duplicates=60, seed=29)
    await publish(kafka_settings, topic, events[:800])
    consumer = {"group_id": group, "counters_file": counters, "dead_letter_topic": f"dlq-{group}",
                "flush_interval_s": 0.3, "session_timeout_ms": 6000}
    log = tmp_path / "failing.log"
    failing = _start_failing(kafka_settings, cassandra_settings, log, consumer)
    try:
        code = await asyncio.to_thread(failing.wait, 120)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if failing.poll() is None:
            failing.kill()
            failing.wait()
    output = log.read_text(errors="replace")
    assert code == 1, f"exit code {code}: partitions assigned and never consumed\n{output[-3000:]}"
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line["event"] == "rebalance_failed"]
    assert failed, output[-3000:]
    assert failed[0]["level"] == "error"
    assert "injected: partition 1 cannot be taken" in failed[0]["error"]
    assert failed[0]["callback"] == "on_partitions_assigned"
    assert any(line["event"] == "consumer_stopped" for line in lines)

    await publish(kafka_settings, topic, events[800:])
    restarted_log = tmp_path / "restarted.log"
    restarted = start_consumer(kafka_settings, cassandra_settings, restarted_log, **consumer)
    try:
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}),
                                 within_s=180)
        restarted.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(restarted.wait, 60) == 0
    finally:
        if restarted.poll() is None:
            restarted.kill()
            restarted.wait()
    assert await read_values(cassandra_settings, truth) == expected_values(truth), restarted_log.read_text()[-3000:]
