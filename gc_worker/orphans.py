"""Retire orphaned mutators, so that the GC can fold their shards.

A mutator is normally retired by whoever takes its partition over. Two kinds never are:
- the owner of a partition that no longer exists: its topic was deleted (or recreated with fewer
  partitions), so no consumer will ever be assigned that partition again;
- a mutator registered by a process that died before its claim applied: it never owned anything.
A consumer group that stopped for good still owns partitions that exist; restarting it, or deleting its rows,
is an operator's decision, not this command's.

Only mutators past their expiry (plus the grace period) are considered: a mutator never writes after its
expiry, so retiring it cannot race with its own flushes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from consumer.protocol import retire_time
from consumer.storage import PartitionId, PartitionRow
from gc_worker.collector import RegistryEntry


@dataclasses.dataclass(frozen=True)
class Orphan:
    entry: RegistryEntry
    reason: str  # topic_gone | partition_gone | never_owned
    retire_us: int


def find_orphans(
    registry: list[RegistryEntry],
    rows: Mapping[PartitionId, PartitionRow | None],
    partition_counts: Mapping[str, int],
    now_us: int,
    grace_us: int,
) -> list[Orphan]:
    """The unretired, expired mutators nobody will retire. ``rows`` holds the ownership row of every
    partition named by an unretired mutator; ``partition_counts`` every topic that exists in Kafka."""
    orphans = []
    for entry in registry:
        if entry.retired_us is not None or entry.expires_us >= now_us - grace_us:
            continue
        row = rows.get(PartitionId(entry.consumer_group, entry.topic, entry.partition))
        count = partition_counts.get(entry.topic)
        if count is None:
            reason = "topic_gone"
        elif entry.partition >= count:
            reason = "partition_gone"
        elif row is None or entry.id not in (row.owner, row.window_mutator):
            reason = "never_owned"
        else:
            continue  # the owner (or open window) of a live partition: its successor's takeover retires it
        # Shards of a window's writer carry born_us + flush_seq: the retire time must exceed it.
        written_us = entry.born_us + (row.flush_seq if row is not None and row.window_mutator == entry.id else 0)
        orphans.append(Orphan(entry, reason, retire_time(written_us, now_us)))
    return orphans


__all__ = ["Orphan", "find_orphans"]
