"""Consumer decisions that need no servers: which mutators rotate (too old, over their own budget, or the
largest while over the total), and how long a starting consumer waits for the servers."""

from __future__ import annotations

import time
from types import SimpleNamespace

from aiokafka import TopicPartition

from consumer.service import ConsumerService
from countersink.settings import ConsumerSettings

MIB = 1024 * 1024


def reasons(sizes_mib: dict[int, int], *, old: frozenset[int] = frozenset(), total_mib: int = 1024,
            each_mib: int = 256) -> dict[int, str]:
    now_us = time.time_ns() // 1000
    mutators = {
        TopicPartition("t", p): SimpleNamespace(
            memory_bytes=lambda size=size: size * MIB,
            record=SimpleNamespace(born_us=now_us - (7200 if p in old else 1) * 1_000_000))
        for p, size in sizes_mib.items()}
    service = SimpleNamespace(mutators=mutators, config=ConsumerSettings(
        memory_budget_bytes=total_mib * MIB, mutator_memory_budget_bytes=each_mib * MIB, mutator_max_age_s=3600))
    due = ConsumerService._rotation_reasons(service)  # type: ignore[arg-type]
    return {tp.partition: reason for tp, reason in due.items()}


def test_nothing_rotates_within_every_budget() -> None:
    assert reasons({0: 100, 1: 200, 2: 250}) == {}


def test_old_and_oversized_mutators_rotate() -> None:
    assert reasons({0: 300, 1: 10, 2: 10}, old=frozenset({1})) == {0: "memory", 1: "age"}


def test_over_the_process_budget_the_largest_rotate_until_under() -> None:
    # 5 × 200 + 150 + 50 = 1200 MiB > 1024: rotating one of the largest brings it to 1000.
    assert reasons({0: 200, 1: 200, 2: 200, 3: 200, 4: 200, 5: 150, 6: 50}, total_mib=1024) == {0: "process_memory"}
    assert reasons({0: 200, 1: 200, 2: 200, 3: 200, 4: 200, 5: 150, 6: 50}, total_mib=900) == {
        0: "process_memory", 1: "process_memory"}
    assert reasons({0: 100, 1: 900, 2: 100}, total_mib=1000, each_mib=1000) == {1: "process_memory"}


def test_mutators_already_rotating_count_towards_the_budget() -> None:
    # 0 rotates for its own size; the rest (3 × 300 = 900) fits the total of 1000.
    assert reasons({0: 400, 1: 300, 2: 300, 3: 300}, total_mib=1000, each_mib=350) == {0: "memory"}


def test_a_starting_consumer_waits_for_a_server_that_comes_back() -> None:
    import asyncio

    from aiokafka.errors import KafkaConnectionError

    attempts = []

    async def flaky() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaConnectionError("Unable to bootstrap")

    service = SimpleNamespace(config=ConsumerSettings(startup_timeout_s=30))
    asyncio.run(ConsumerService._when_reachable(service, "kafka", flaky))  # type: ignore[arg-type]
    assert len(attempts) == 3


def test_a_starting_consumer_gives_up_after_its_startup_timeout() -> None:
    import asyncio

    import pytest
    from aiokafka.errors import KafkaConnectionError

    async def down() -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    service = SimpleNamespace(config=ConsumerSettings(startup_timeout_s=1.2))
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError):
        asyncio.run(ConsumerService._when_reachable(service, "kafka", down))  # type: ignore[arg-type]
    assert time.monotonic() - started < 5


def flush_due(*, since_s: float, took_s: float, behind: bool, dirty: int = 1, interval_s: float = 1.0,
              spacing: float = 4.0) -> bool:
    tp = TopicPartition("t", 0)
    mutator = SimpleNamespace(dirty=set(range(dirty)), applied_through=99 - behind * 50)
    service = SimpleNamespace(
        mutators={tp: mutator},
        config=ConsumerSettings(flush_interval_s=interval_s, flush_spacing=spacing, flush_max_dirty=1000),
        consumer=SimpleNamespace(highwater=lambda _tp: 100),  # the next offset the broker would give
        _last_flush=time.monotonic() - since_s, _last_flush_took=took_s)
    service._caught_up = lambda: ConsumerService._caught_up(service)  # type: ignore[arg-type]
    return ConsumerService._flush_due(service)  # type: ignore[arg-type]


def test_flushes_wait_for_the_interval() -> None:
    assert not flush_due(since_s=0.5, took_s=0.0, behind=False)
    assert flush_due(since_s=1.1, took_s=0.0, behind=False)


def test_slow_flushes_are_spaced_while_a_backlog_remains() -> None:
    # The last flush took 2 s: with a backlog the next starts 4 × 2 s after it, not at the 1 s interval.
    assert not flush_due(since_s=5.0, took_s=2.0, behind=True)
    assert flush_due(since_s=8.1, took_s=2.0, behind=True)
    assert flush_due(since_s=3.1, took_s=2.0, behind=True, spacing=1.5)


def test_a_caught_up_consumer_flushes_at_the_interval_however_slow_the_last_flush() -> None:
    assert flush_due(since_s=1.1, took_s=2.0, behind=False)


def test_too_many_dirty_instances_force_a_flush_at_once() -> None:
    assert flush_due(since_s=0.0, took_s=0.0, behind=True, dirty=1000)
