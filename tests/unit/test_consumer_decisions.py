"""Consumer decisions that need no servers: when to flush, which mutators rotate (too old, over their own
budget, or the largest while over the total)."""

from __future__ import annotations

from consumer import schedule
from consumer.schedule import Footprint, Progress
from countersink.settings import ConsumerSettings

MIB = 1024 * 1024


def reasons(sizes_mib: dict[int, int], *, old: frozenset[int] = frozenset(), total_mib: int = 1024,
            each_mib: int = 256) -> dict[int, str]:
    now_us = 10**15
    mutators = {p: Footprint(size * MIB, now_us - (7200 if p in old else 1) * 1_000_000)
                for p, size in sizes_mib.items()}
    config = ConsumerSettings(memory_budget_bytes=total_mib * MIB, mutator_memory_budget_bytes=each_mib * MIB,
                              mutator_max_age_s=3600)
    return schedule.rotation_reasons(mutators, config, now_us)


def test_nothing_rotates_within_every_budget() -> None:
    """Young mutators within their own and the process's budget keep running."""
    assert reasons({0: 100, 1: 200, 2: 250}) == {}


def test_old_and_oversized_mutators_rotate() -> None:
    """A mutator past its age or over its own memory budget rotates, each for its reason."""
    assert reasons({0: 300, 1: 10, 2: 10}, old=frozenset({1})) == {0: "memory", 1: "age"}


def test_over_the_process_budget_the_largest_rotate_until_under() -> None:
    """Over the process budget, the largest mutators rotate until the rest fit."""
    # 5 × 200 + 150 + 50 = 1200 MiB > 1024: rotating one of the largest brings it to 1000.
    assert reasons({0: 200, 1: 200, 2: 200, 3: 200, 4: 200, 5: 150, 6: 50}, total_mib=1024) == {0: "process_memory"}
    assert reasons({0: 200, 1: 200, 2: 200, 3: 200, 4: 200, 5: 150, 6: 50}, total_mib=900) == {
        0: "process_memory", 1: "process_memory"}
    assert reasons({0: 100, 1: 900, 2: 100}, total_mib=1000, each_mib=1000) == {1: "process_memory"}


def test_mutators_already_rotating_count_towards_the_budget() -> None:
    """Mutators rotating for their own size no longer count towards the process total."""
    # 0 rotates for its own size; the rest (3 × 300 = 900) fits the total of 1000.
    assert reasons({0: 400, 1: 300, 2: 300, 3: 300}, total_mib=1000, each_mib=350) == {0: "memory"}


def flush_due(*, since_s: float, took_s: float, behind: bool, dirty: int = 1, interval_s: float = 1.0,
              spacing: float = 4.0, may_flush: bool = True, log_end: int = 100) -> bool:
    # log_end: the offset a caught-up consumer is at (the broker's last stable offset)
    progress = {0: Progress(applied_through=log_end - 1 - behind * 50, log_end=log_end, dirty=dirty,
                            may_flush=may_flush)}
    config = ConsumerSettings(flush_interval_s=interval_s, flush_spacing=spacing, flush_max_dirty=1000)
    return schedule.flush_due(progress, config, since_last_s=since_s, last_took_s=took_s)


def test_flushes_wait_for_the_interval() -> None:
    """No flush starts before flush_interval_s since the last one."""
    assert not flush_due(since_s=0.5, took_s=0.0, behind=False)
    assert flush_due(since_s=1.1, took_s=0.0, behind=False)


def test_slow_flushes_are_spaced_while_a_backlog_remains() -> None:
    """With a backlog, slow flushes start flush_spacing times their duration apart."""
    # The last flush took 2 s: with a backlog the next starts 4 × 2 s after it, not at the 1 s interval.
    assert not flush_due(since_s=5.0, took_s=2.0, behind=True)
    assert flush_due(since_s=8.1, took_s=2.0, behind=True)
    assert flush_due(since_s=3.1, took_s=2.0, behind=True, spacing=1.5)


def test_a_caught_up_consumer_flushes_at_the_interval_however_slow_the_last_flush() -> None:
    """Caught up, a consumer flushes at the interval whatever the last flush took."""
    assert flush_due(since_s=1.1, took_s=2.0, behind=False)


def test_too_many_dirty_instances_force_a_flush_at_once() -> None:
    """flush_max_dirty dirty instances force a flush at once."""
    assert flush_due(since_s=0.0, took_s=0.0, behind=True, dirty=1000)


def test_a_mutator_still_taking_over_forces_no_flush() -> None:
    """A mutator whose takeover is still replaying cannot flush: its dirty count must not force one."""
    assert not flush_due(since_s=0.0, took_s=0.0, behind=True, dirty=1000, may_flush=False)


def test_a_partition_at_its_last_stable_offset_is_caught_up() -> None:
    """Caught up means at the log end the consumer's position reaches (past a transaction's commit marker),
    not one past the last record."""
    assert schedule.caught_up({0: Progress(applied_through=99, log_end=100, dirty=0)})
    assert not schedule.caught_up({0: Progress(applied_through=98, log_end=100, dirty=0)})
    assert not schedule.caught_up({0: Progress(applied_through=99, log_end=None, dirty=0)})
