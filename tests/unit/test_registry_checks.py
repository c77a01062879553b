"""A running consumer's looks at the counter registry: in the background, never blocking the loop, and no
flush on a look older than ``registry_check_s``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from structlog.testing import capture_logs

from consumer.handovers import HandoverRefusedError
from consumer.service import ConsumerService, CounterRedefinedError
from countersink.registry import CounterRegistry
from countersink.settings import ConsumerSettings, Settings
from tests.unit.memory_store import MemoryLog, MemoryStore
from tests.unit.test_protocol_model import COUNTERS, DeadLetterTopic
from tests.unit.test_rebalance_failures import NothingToFetch


class Registry:
    """The registry as the consumer asks it: what to refuse, or an error while Cassandra is away."""

    def __init__(self) -> None:
        self.answer: dict[str, str] | Exception = {}  # the counters dropped, with why
        self.redefined: dict[str, str] = {}  # the counters recorded again since the start, with why
        self.asked = 0

    async def look(self, names: list[str], registered_us: Mapping[str, int] | None = None
                   ) -> tuple[dict[str, str], dict[str, str]]:
        self.asked += 1
        self.registered_us = registered_us
        await asyncio.sleep(0)
        if isinstance(self.answer, Exception):
            raise self.answer
        return ({name: why for name, why in self.answer.items() if name in names},
                {name: why for name, why in self.redefined.items() if name in names})


def _service(registry: Registry) -> ConsumerService:
    service = ConsumerService(Settings(consumer=ConsumerSettings(group_id="g", health_port=0, registry_check_s=10)),
                              COUNTERS, store=MemoryStore(), source=MemoryLog([]),
                              consumer=cast(AIOKafkaConsumer, NothingToFetch()),
                              producer=cast(AIOKafkaProducer, DeadLetterTopic()))
    service.registry = cast(CounterRegistry, registry)
    return service


async def _settle(service: ConsumerService) -> None:
    look = service._registry_look
    if look is not None:
        await look


async def test_no_flush_on_a_stale_look_and_the_look_runs_in_the_background() -> None:
    """A fresh look lets flushes start without asking again; past half the interval a look starts in the
    background while flushes go on; past the interval none starts until a look has answered."""
    registry = Registry()
    service = _service(registry)
    service._registry_checked_at = time.monotonic()  # as after the start's registration
    assert service._registry_fresh()
    assert service._registry_look is None
    service._registry_checked_at -= 6  # past half of registry_check_s
    assert service._registry_fresh()
    await _settle(service)
    assert registry.asked == 1
    assert service._registry_fresh()
    service._registry_checked_at -= 11
    service._registry_look_started -= 2
    assert not service._registry_fresh()
    await _settle(service)
    assert service._registry_fresh()


async def test_a_dropped_counter_is_refused_once_and_an_unreadable_registry_stops_flushes() -> None:
    """A counter the registry reports dropped is refused (one counter_dropped line); while the registry
    cannot be read, flushes wait and one warning says why."""
    registry = Registry()
    service = _service(registry)
    name = next(iter(COUNTERS)).name
    registry.answer = {name: f"counter {name!r} was dropped"}
    with capture_logs() as logs:
        assert not service._registry_fresh()
        await _settle(service)
        assert service.ownership.dropped == {name}
        service._registry_checked_at -= 11
        service._registry_look_started -= 2
        registry.answer = ConnectionError("cassandra is away")
        for _ in range(2):
            assert not service._registry_fresh()
            await _settle(service)
            service._registry_look_started -= 2
    assert [entry["counter"] for entry in logs if entry["event"] == "counter_dropped"] == [name]
    assert [entry["event"] for entry in logs if entry["event"] == "registry_check_failed"] == ["registry_check_failed"]
    registry.answer = {}
    assert not service._registry_fresh()
    await _settle(service)
    assert service._registry_fresh()


async def test_a_counter_recorded_anew_since_the_start_stops_the_consumer_before_any_flush() -> None:
    """A look that finds a counter recorded again since this process registered it (dropped, released and
    defined anew while it was frozen) leaves the registry unread for flushes and makes the loop exit
    (CounterRedefinedError); the look asks with the registration times of the start."""
    registry = Registry()
    service = _service(registry)
    service.ownership.registered_us = {"trades": 5}
    name = next(iter(COUNTERS)).name
    registry.redefined = {name: f"counter {name!r} was dropped and defined again (recorded anew at ...)"}
    with capture_logs() as logs:
        assert not service._registry_fresh()
        await _settle(service)
    assert registry.registered_us == {"trades": 5}
    assert isinstance(service.redefined, CounterRedefinedError)
    assert not service._registry_fresh()  # no flush starts on that look
    assert name in service.ownership.dropped
    assert [entry for entry in logs if entry["event"] == "counter_dropped"] == []
    with pytest.raises(CounterRedefinedError, match="dropped and defined again"):
        await service._consume()


async def test_a_partition_refused_for_a_counter_found_redefined_still_exits_as_redefined() -> None:
    """The look that finds a counter redefined marks it dropped too, and a takeover running meanwhile refuses a
    partition where the new definition's hand-over is recorded: the loop exits for the redefinition (no last
    flush), not for the refusal (which flushes the other partitions with the old meaning)."""
    registry = Registry()
    service = _service(registry)
    name = next(iter(COUNTERS)).name
    registry.redefined = {name: f"counter {name!r} was dropped and defined again (recorded anew at ...)"}
    service._registry_fresh()
    await _settle(service)
    service.ownership.refusal = HandoverRefusedError("trades", 0, [name])
    with pytest.raises(CounterRedefinedError, match="dropped and defined again"):
        await service._consume()
