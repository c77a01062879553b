"""A rebalance callback that raises (aiokafka only logs it) turns the consumer unready and ends its loop."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from structlog.testing import capture_logs

from consumer.service import ConsumerService, RebalanceFailedError, _Rebalance
from countersink.settings import ConsumerSettings, Settings
from tests.unit.memory_store import MemoryLog, MemoryStore
from tests.unit.test_protocol_model import COUNTERS, DeadLetterTopic


class NothingToFetch:
    """The Kafka consumer as the loop uses it, on a group with nothing to fetch."""

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[object]]:
        await asyncio.sleep(0.01)
        return {}


async def test_a_failed_take_in_the_rebalance_callback_makes_the_process_unready_and_its_loop_raise() -> None:
    """An error in a rebalance callback is logged at ERROR with the partitions it concerned, /readyz turns
    unready at once, and the loop raises RebalanceFailedError (the process then stops and exits 1)."""
    service = ConsumerService(Settings(consumer=ConsumerSettings(group_id="g", health_port=0)), COUNTERS,
                              store=MemoryStore(), source=MemoryLog([]),
                              consumer=cast(AIOKafkaConsumer, NothingToFetch()),
                              producer=cast(AIOKafkaProducer, DeadLetterTopic()))

    async def take(assigned: list[TopicPartition]) -> None:
        raise RuntimeError("injected: no claim")

    service.ownership.take = take  # type: ignore[method-assign]
    service._started = True  # as start() leaves it, without the servers
    loop = asyncio.create_task(service.run())
    for _ in range(500):
        if service.ready:
            break
        await asyncio.sleep(0.01)
    assert service.is_ready
    with capture_logs() as logs:
        await _Rebalance(service).on_partitions_assigned([TopicPartition("orders", 1), TopicPartition("orders", 0)])
    assert not service.is_ready
    with pytest.raises(RebalanceFailedError, match="injected: no claim"):
        await asyncio.wait_for(loop, 5)
    failed = [entry for entry in logs if entry["event"] == "rebalance_failed"]
    assert len(failed) == 1
    assert failed[0]["log_level"] == "error"
    assert failed[0]["partitions"] == ["orders/0", "orders/1"]
