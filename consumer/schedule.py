"""When the consumer flushes and which mutators it rotates: pure decisions, the clock passed in.

The service gathers what each decision needs (one :class:`Progress` per partition it owns, the times of the
last flush) and acts on the answer; these functions read nothing else, so they are tested without servers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import TypeVar

from countersink.settings import ConsumerSettings

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True)
class Progress:
    """One owned partition as the flush schedule sees it."""

    applied_through: int  # the last offset its mutator has applied, or skipped past
    log_end: int | None  # the offset a caught-up consumer is at (last stable offset), None before a fetch
    dirty: int  # instances changed since the last flush
    may_flush: bool = True  # False while its takeover is still running: it writes nothing yet


@dataclasses.dataclass(frozen=True)
class Footprint:
    """One mutator as the rotation policy sees it."""

    memory_bytes: int
    born_us: int


def caught_up(partitions: Mapping[K, Progress]) -> bool:
    """Every partition's mutator has applied everything up to the log end last seen."""
    return all(p.log_end is not None and p.applied_through + 1 >= p.log_end for p in partitions.values())


def flush_due(partitions: Mapping[K, Progress], config: ConsumerSettings, *, since_last_s: float,
              last_took_s: float) -> bool:
    """Whether to start a flush now, ``since_last_s`` after the last one started (which took ``last_took_s``)."""
    # flush_max_dirty is a hard bound: it caps what a takeover replays after a crash (the open window's
    # instances are read and rewritten), so it holds even while flushes are being spaced out.
    if any(p.dirty >= config.flush_max_dirty for p in partitions.values() if p.may_flush):
        return True
    if since_last_s < config.flush_interval_s:
        return False
    # A flush rewrites every dirty instance whole, so its cost grows with the keys touched, not the events.
    # While flushes are slow and a backlog remains, they start at least flush_spacing times the last one's
    # duration apart: Cassandra is left time between them, and each flush folds in more events. Once every
    # partition is caught up there is nothing more to fold in, and waiting would only delay the counts.
    return caught_up(partitions) or since_last_s >= last_took_s * config.flush_spacing


def rotation_reasons(mutators: Mapping[K, Footprint], config: ConsumerSettings, now_us: int) -> dict[K, str]:
    """Mutators to rotate now: too old, over their own memory budget, or the largest ones while the process
    is over its total budget (so memory stays bounded whatever the number of partitions)."""
    due: dict[K, str] = {}
    total = 0
    for key, mutator in mutators.items():
        total += mutator.memory_bytes
        if mutator.memory_bytes > config.mutator_memory_budget_bytes:
            due[key] = "memory"
        elif (now_us - mutator.born_us) / 1e6 >= config.mutator_max_age_s:
            due[key] = "age"
    total -= sum(mutators[key].memory_bytes for key in due)
    for key, mutator in sorted(mutators.items(), key=lambda item: -item[1].memory_bytes):
        if total <= config.memory_budget_bytes:
            break
        if key not in due:
            due[key] = "process_memory"
            total -= mutator.memory_bytes
    return due
