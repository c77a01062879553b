"""What the flush/takeover protocol needs from storage: the :class:`Store` interface and its row types.

The protocol (``consumer.protocol``) is written against :class:`Store`, so the same code runs on Cassandra in
production (``consumer.cassandra_store``) and on an in-memory stand-in that loses, delays and reorders writes
in the model test. This module imports no driver.

Conventions: offsets are Kafka offsets of *records*; ``committed_offset`` and ``intent_offset`` are the last
offset (inclusive) a window covers, ``-1`` before the first record. Times are microseconds since the epoch.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Forgotten(enum.Enum):
    """:meth:`Store.read_counted`'s answer for a mutator without a registry row: the GC folded it (retired, so
    whoever retired it had replayed its last window first) and forgot it, days later. A mutator's row is written
    before it can claim a partition, so one named by a partition's row had one."""

    ROW = "forgotten"


FORGOTTEN = Forgotten.ROW


@dataclasses.dataclass(frozen=True)
class PartitionRow:
    """The ownership row of one (group, topic, partition); changed by LWT only."""

    owner: uuid.UUID | None
    window_mutator: uuid.UUID | None
    window_born_us: int | None
    flush_seq: int
    committed_offset: int
    intent_offset: int

    @property
    def window_open(self) -> bool:
        """True when a flush may have been interrupted: its shards may be only partly written."""
        return self.intent_offset > self.committed_offset

    @property
    def window_to_replay(self) -> tuple[uuid.UUID, int] | None:
        """The writer of an open window (its mutator and birth time), which a takeover replays; None when there
        is none to replay."""
        if self.window_open and self.window_mutator is not None and self.window_born_us is not None:
            return self.window_mutator, self.window_born_us
        return None


@dataclasses.dataclass(frozen=True)
class MutatorEntry:
    """One mutator in the registry."""

    id: uuid.UUID
    consumer_group: str
    topic: str
    partition: int
    host: str
    born_us: int
    expires_us: int
    retired_us: int | None = None


class ShardWrite(NamedTuple):
    """One whole-state snapshot of one instance by one mutator (a tuple: a flush makes one per row written)."""

    counter: str
    key: str
    state: bytes
    through_offset: int
    first_write: bool  # also record the instance in the GC's work list
    # When the bucket's retention ends (epoch seconds): the row gets a TTL to match, and none is written after.
    expires_at: int | None = None


@dataclasses.dataclass(frozen=True)
class StoredShard:
    state: bytes
    through_offset: int


@dataclasses.dataclass(frozen=True)
class PartitionId:
    consumer_group: str
    topic: str
    partition: int


class Store(Protocol):
    """Storage operations of the protocol. Methods returning bool return whether an LWT applied."""

    async def read_partition(self, pid: PartitionId) -> PartitionRow | None: ...

    async def create_partition(self, pid: PartitionId, owner: uuid.UUID, born_us: int, last_offset: int) -> bool: ...

    async def claim_partition(self, pid: PartitionId, owner: uuid.UUID, seen: PartitionRow) -> bool: ...

    async def open_window(
        self, pid: PartitionId, mutator: uuid.UUID, born_us: int, seq: int, committed: int, intent: int
    ) -> bool: ...

    async def commit_window(self, pid: PartitionId, mutator: uuid.UUID, seq: int, offset: int) -> bool: ...

    async def close_window(self, pid: PartitionId, owner: uuid.UUID, born_us: int, offset: int) -> bool: ...

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int,
                           writes: Sequence[ShardWrite], *, source: bytes) -> None:
        """Write ``mutator``'s shards (its rows are placed by its birth time, ``born_us``) at ``timestamp_us``,
        and stamp each partition written as changed by ``source`` (``schemas.cql.stamp_source`` of the
        mutator's partition) at that time."""
        ...

    async def read_shard(self, counter: str, key: str, mutator: uuid.UUID, born_us: int) -> StoredShard | None: ...

    async def read_shards(self, mutator: uuid.UUID, born_us: int, instances: Sequence[tuple[str, str]]
                          ) -> dict[tuple[str, str], StoredShard | None]:
        """``read_shard`` of every (counter, key), in any order or concurrently; raises on the first failure."""
        ...

    async def register_mutator(self, record: MutatorEntry) -> bool:
        """Add a new mutator to the registry; False if its id is there already."""
        ...

    async def retire_mutator(self, mutator: uuid.UUID, retired_us: int) -> None: ...

    async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str]) -> None:
        """Record the first offset a mutator that claimed its partition applies (its claim's start offset), and
        the counters it counts there (none: an empty set). A takeover replaying the mutator's window reads them
        (:meth:`read_counted`), and so does ``countersink trace``, to tell which mutator applied a record, and
        whether that one counted a counter (added since, or not)."""
        ...

    async def read_counted(self, mutator: uuid.UUID) -> frozenset[str] | Forgotten | None:
        """The counters ``mutator`` recorded it counts (:meth:`record_start`); None when its row recorded none (a
        version before they were recorded): it may have counted any; :data:`FORGOTTEN` when it has no row."""
        ...

    async def read_gc_cutoff(self) -> int:
        """The highest cutoff a GC run recorded before it read the registry (-1 when none did): a mutator
        registered now but born at or below it may have rows a run already takes for a final mutator's."""
        ...


__all__ = ["FORGOTTEN", "Forgotten", "MutatorEntry", "PartitionId", "PartitionRow", "ShardWrite", "Store",
           "StoredShard"]
