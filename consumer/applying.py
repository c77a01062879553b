"""The hot path: records of one partition turned into in-memory state updates by one mutator.

:class:`RetryWindow` drops publisher retries, :class:`Applier` routes records and asks the window,
:class:`Mutator` holds the states one flush writes. Nothing here does I/O but :meth:`Applier.warm_up`, which
reads the records before a start offset through a :class:`RecordSource`; the flush/takeover protocol that
writes these states is ``consumer.protocol``.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple, Protocol

from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import CounterSet
from schemas.errors import CountersinkError, InvalidEventError
from schemas.events import EventRouter, Update, apply_updates
from schemas.kinds import State

# What one event id held in the publisher-retry window costs: its string (85 bytes for a UUID) kept alive, and
# about 70 bytes of dict slot and record number (tracemalloc, 100k UUID ids pushed into a RetryWindow).
RETRY_ID_BYTES = 160


class KafkaRecord(Protocol):
    """What the protocol reads of a record: a :class:`Record`, or the Kafka client's own, as it comes."""

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...


class Record(NamedTuple):
    """One Kafka record of the partition a mutator consumes."""

    offset: int
    value: bytes | None


class RecordSource(Protocol):
    """Reads a range of a partition again, for replays and for rebuilding the publisher-retry window.

    Offsets of a partition's records need not be consecutive: transaction markers, aborted transactions and
    compaction leave gaps, which a reader skips."""

    async def read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        """Records with first <= offset <= last, in offset order (fewer if the log was truncated)."""
        ...

    def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        """What :meth:`read` returns, a chunk at a time."""
        ...

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        """The last ``count`` records with an offset below ``before``, in offset order: fewer only when the
        log starts after them. However many offsets they span."""
        ...

    async def log_start(self, topic: str, partition: int) -> int:
        """The offset of the first record the log still holds (retention deletes the ones before)."""
        ...


class RecordsLostError(CountersinkError):
    """Records that must be read are no longer in the log (deleted by retention before they were counted).

    ``first`` and ``last`` bound the offsets lost (inclusive); not every offset in between held a record."""

    def __init__(self, topic: str, partition: int, first: int, last: int) -> None:
        super().__init__(f"records {first}..{last} of {topic}/{partition} were deleted from the log before they "
                         f"were counted")
        self.topic, self.partition, self.first, self.last = topic, partition, first, last


class Outcome(enum.Enum):
    APPLIED = "applied"
    FILTERED = "filtered"  # valid, but no counter on this topic wants it
    DUPLICATE = "duplicate"  # every update repeats an event id seen within the window
    INVALID = "invalid"


class RetryWindow:
    """Event ids of the last ``size`` records of one partition, to drop publisher retries.

    A pure function of the partition's log: whether record ``o`` is a repeat depends only on the ``size``
    records before it. So a replay, or a successor that rebuilds the window by re-reading those records,
    decides exactly as the original mutator did.

    Each id maps to the number of the last record that carried it, in one dict per counter (records are
    numbered as they are pushed, so gaps in Kafka offsets do not matter): one dict lookup and one store per
    id on the hot path. Ids that fell out of the window are forgotten all at once every ``size`` records,
    which keeps at most the ids of ``2 × size`` records.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._pushed = 0  # records pushed so far; the next record is number _pushed
        self._last: dict[str, dict[str, int]] = {}  # counter -> event id -> number of its last record

    def seen(self, counter: str, event_id: str) -> bool:
        at = self._last.get(counter, {}).get(event_id)
        return at is not None and at >= self._pushed - self.size

    def push(self, ids: tuple[tuple[str, str], ...]) -> None:
        """Record one record's ids (possibly none)."""
        if self.size <= 0:
            return
        number = self._pushed
        for counter, event_id in ids:
            self._ids_of(counter)[event_id] = number
        self._advance()

    def admit(self, updates: list[Update]) -> list[Update]:
        """The updates of one record whose event id was not seen within the window; records their ids.
        The same as :meth:`seen` for each update, then :meth:`push` of their ids, in one pass."""
        if self.size <= 0:
            return updates
        number = self._pushed
        oldest = number - self.size
        fresh = []
        for update in updates:
            event_id = update.event_id
            if event_id is None:
                fresh.append(update)
                continue
            last = self._last.get(update.counter)
            if last is None:
                last = self._ids_of(update.counter)
            at = last.get(event_id)
            if at is None or at < oldest:
                fresh.append(update)
            last[event_id] = number
        self._advance()
        return fresh

    def ids_held(self) -> int:
        return sum(len(ids) for ids in self._last.values())

    def _ids_of(self, counter: str) -> dict[str, int]:
        return self._last.setdefault(counter, {})

    def _advance(self) -> None:
        self._pushed += 1
        if self._pushed % self.size == 0:
            oldest = self._pushed - self.size
            self._last = {counter: {event_id: at for event_id, at in ids.items() if at >= oldest}
                          for counter, ids in self._last.items()}


@dataclasses.dataclass
class Applier:
    """Turns records into updates of in-memory states: routing, publisher-retry dropping, applying."""

    router: EventRouter
    counters: CounterSet
    topic: str
    partition: int
    window: RetryWindow

    def classify(self, record: KafkaRecord) -> tuple[Outcome, list[Update], InvalidEventError | None]:
        """Route one record and drop repeats; pushes its ids into the window. No state is touched."""
        try:
            updates = self.router.route(self.topic, record.value or b"")
        except InvalidEventError as exc:
            self.window.push(())
            return Outcome.INVALID, [], exc
        fresh = self.window.admit(updates)
        if not updates:
            return Outcome.FILTERED, [], None
        if not fresh:
            return Outcome.DUPLICATE, [], None
        return Outcome.APPLIED, fresh, None

    async def warm_up(self, source: RecordSource, before: int) -> None:
        """Rebuild the retry window from the last ``size`` records before offset ``before``: the window the
        partition's previous owner had there. Records, not offsets: a window rebuilt from the last ``size``
        offsets of a log with gaps (transactions, compaction) would hold fewer records, and let through a
        retry the previous owner dropped."""
        if self.window.size <= 0 or before <= 0:
            return
        for record in await source.read_back(self.topic, self.partition, before, self.window.size):
            self.classify(record)


@dataclasses.dataclass
class Mutator:
    """The only writer of its shards: one per partition assignment, with in-memory state per instance."""

    entry: MutatorEntry  # its row of the mutators registry
    pid: PartitionId
    applier: Applier
    applied_through: int  # last offset whose record has been applied (or skipped)
    flushed_through: int  # the intent offset of the last completed flush (O_k-1)
    flush_seq: int = 0  # k-1: the number of the last flush whose window this mutator opened
    states: dict[tuple[str, str], State] = dataclasses.field(default_factory=dict)
    dirty: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    recorded: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # in mutator_counters already
    state_bytes: int = 0
    # The window a flush attempt may have opened without finishing its writes (its LWT can apply even when
    # the caller sees a timeout); the next attempt reads the row to learn what happened.
    window_seq: int | None = None
    # False from the moment a flush may open a window until that window is recorded complete, by the next
    # flush's LWT or, when nothing new comes first, by commit_window alone.
    window_committed: bool = True
    fenced: bool = False
    retiring: bool = False  # release has committed and is retiring it: it must never flush again
    released: bool = False

    @property
    def id(self) -> uuid.UUID:
        return self.entry.id

    def apply(self, record: KafkaRecord) -> tuple[Outcome, InvalidEventError | None]:
        """Apply one record of this partition, in offset order. Records at or below what is applied are
        ignored (a redelivery after a seek)."""
        if record.offset <= self.applied_through:
            return Outcome.FILTERED, None
        outcome, updates, error = self.applier.classify(record)
        if updates:
            self.state_bytes += apply_updates(self.states, updates, self.applier.counters, self.dirty)
        self.applied_through = record.offset
        return outcome, error

    def skip_to(self, position: int) -> None:
        """Every offset below ``position`` that held a record has been given to :meth:`apply`: the offsets
        between the last record and ``position`` are transaction markers, aborted or compacted records.
        Counting them as applied lets a flush commit past them, so a quiet transactional partition reads as
        caught up (no lag), and a successor does not start on a marker."""
        if position - 1 > self.applied_through:
            self.applied_through = position - 1

    def needs_flush(self) -> bool:
        return bool(self.dirty) or self.applied_through > self.flushed_through

    def memory_bytes(self) -> int:
        """An estimate of the memory held: states (refreshed at each flush, sketches grow as they fill) and
        the event ids of the publisher-retry window."""
        return self.state_bytes + self.applier.window.ids_held() * RETRY_ID_BYTES


__all__ = [
    "RETRY_ID_BYTES", "Applier", "KafkaRecord", "Mutator", "Outcome", "Record", "RecordSource", "RecordsLostError",
    "RetryWindow",
]
