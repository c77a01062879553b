"""In-memory stand-ins for Cassandra and Kafka, for the model test of the flush/takeover/GC protocol.

:class:`MemoryStore` implements :class:`consumer.storage.Store` with the semantics of the CQL in
:class:`consumer.cassandra_store.CassandraStore`: the ``partitions`` row changes only by compare-and-set, shard cells
resolve by write timestamp (ties to the larger value bytes, tombstones winning ties, as Cassandra does), rows
sit at their mutator's birth time, and the GC's batch of tallies and range tombstones over birth times is one
atomic step on one key's partition.

Every storage operation is a *gate*: the coroutine that calls it yields an :class:`Op` to whoever drives it
and waits for a :class:`Fault` decision before the operation takes effect. The test drives the protocol's
coroutines one operation at a time with :class:`Task`, so it chooses the interleaving of owners, zombies and
GC workers exactly and deterministically, and for each operation whether it fails, applies with its answer
lost, or (a shard write) is held in flight to land later or never. No event loop is involved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import struct
import types
import uuid
from collections.abc import AsyncIterator, Coroutine, Generator, Mapping, Sequence
from typing import Any

from consumer.applying import Record
from consumer.storage import FORGOTTEN, Forgotten, MutatorEntry, PartitionId, PartitionRow, ShardWrite, StoredShard
from gc_worker.collector import KeyView, Range, RegistryEntry, Row, ShardView
from schemas.cql import GC_STAMP_SOURCE
from schemas.errors import CountersinkError
from schemas.resets import Epochs, Reset, ResetPosition, epochs_at

Instance = tuple[str, str]


class StoreTimeoutError(CountersinkError):
    """Raised by a faulted storage operation: the caller cannot know whether it applied."""

    retriable = True


class Fault(enum.Enum):
    """What happens to one storage operation."""

    NONE = "none"  # applies and is acknowledged
    FAIL = "fail"  # never applies; the caller gets a timeout
    LOST_ANSWER = "lost_answer"  # applies; the caller gets a timeout anyway
    HOLD = "hold"  # a shard write stays in flight and may land at any later time, or never


@dataclasses.dataclass(frozen=True)
class Op:
    """A storage operation waiting at its gate."""

    name: str
    detail: object = None


@types.coroutine
def _gate(op: Op) -> Generator[Op, Fault | None, Fault]:
    decision = yield op
    return decision or Fault.NONE


@dataclasses.dataclass
class Cell:
    """One Cassandra cell: a value and its write timestamp."""

    value: bytes
    ts: int

    def wins_over(self, other: Cell | None) -> bool:
        # Cassandra's reconciliation: the higher timestamp, then the larger value bytes.
        return other is None or (self.ts, self.value) > (other.ts, other.value)


@dataclasses.dataclass
class ShardRow:
    """One counter's cell of one clustering row of ``shards`` (the row of a mutator, at its birth time): state
    and through_offset."""

    born_us: int
    state: Cell | None = None
    through: Cell | None = None


@dataclasses.dataclass(frozen=True)
class RangeTombstone:
    """``DELETE FROM shards USING TIMESTAMP ts WHERE part = ? AND key = ? AND born_us > after AND born_us < before``."""

    after: int | None
    before: int
    ts: int

    def shadows(self, born_us: int, cell: Cell) -> bool:
        # A tombstone shadows every cell it covers written at or before its timestamp.
        return (self.after is None or born_us > self.after) and born_us < self.before and cell.ts <= self.ts


@dataclasses.dataclass(frozen=True)
class ShardSnapshot:
    """One visible shard of an instance, for the tests' checks."""

    mutator: uuid.UUID
    state: bytes
    through_offset: int
    write_us: int


@dataclasses.dataclass(frozen=True)
class InstanceSnapshot:
    """What a reader of one instance sees: its tally and every visible shard."""

    tally: bytes | None
    tally_write_us: int | None
    shards: tuple[ShardSnapshot, ...]


@dataclasses.dataclass(frozen=True)
class HeldWrite:
    """A shard write in flight: it lands whenever the test delivers it, or never."""

    mutator: uuid.UUID
    born_us: int
    timestamp_us: int
    writes: tuple[ShardWrite, ...]  # one key's: its row and its stamp are one mutation
    source: bytes = b""


def _bigint(value: int) -> bytes:
    return struct.pack(">q", value)


class MemoryStore:
    """:class:`consumer.storage.Store` in memory, for one consumer group, with fault gates on every call."""

    def __init__(self) -> None:
        self.partitions: dict[PartitionId, PartitionRow] = {}
        self.shards: dict[Instance, dict[uuid.UUID, ShardRow]] = {}
        self.tallies: dict[Instance, Cell] = {}
        self.ranges: dict[str, list[RangeTombstone]] = {}  # per key
        self.row_tombstones: dict[tuple[str, uuid.UUID], int] = {}  # (key, mutator) -> timestamp
        self.mutators: dict[uuid.UUID, MutatorEntry] = {}
        self.work: set[tuple[uuid.UUID, str, str]] = set()
        self.collected: dict[uuid.UUID, int] = {}
        self.gc_cutoff = -1  # the highest cutoff a GC run recorded
        self.held: list[HeldWrite] = []
        # Where each mutator started consuming, recorded when its create or close LWT applied: the model
        # test uses it to say what each shard must contain.
        self.starts: dict[uuid.UUID, int] = {}
        self.recorded_starts: dict[uuid.UUID, int] = {}  # record_start's, for trace
        self.recorded_counters: dict[uuid.UUID, frozenset[str]] = {}
        # Every partitions row in the order the LWTs applied, for monotonicity checks.
        self.row_history: list[PartitionRow] = []
        # Each key's stamps (schemas.cql): (key, source) -> its cell, written with each shard write. A shard
        # write that changed a stored state without changing its key's stamps is recorded in stamp_misses: a
        # serve that kept its merge would answer the old value.
        self.stamps: dict[tuple[str, bytes], Cell] = {}
        self.stamp_misses: list[tuple[Instance, str]] = []  # the cell written, and what happened
        self.stamped: dict[tuple[str, bytes, int, str, uuid.UUID], bytes] = {}  # the bytes each stamp stamped

    # -------------------------------------------------------------------------------- helpers

    def _set_row(self, pid: PartitionId, row: PartitionRow) -> None:
        self.partitions[pid] = row
        self.row_history.append(row)

    @staticmethod
    def _answer(fault: Fault, applied: bool) -> bool:
        """Finish an LWT whose effect (if any) is done: report it, or lose the answer."""
        if fault is not Fault.NONE:
            raise StoreTimeoutError("LWT timed out")
        return applied

    async def _lwt(self, name: str, detail: object = None) -> Fault:
        fault = await _gate(Op(name, detail))
        if fault is Fault.HOLD:
            # An LWT that times out after its Paxos round was accepted is completed by the next serial
            # operation on the row: from every other caller's view it applied, and its answer was lost.
            fault = Fault.LOST_ANSWER
        if fault is Fault.FAIL:
            raise StoreTimeoutError(f"{name} timed out before applying")
        return fault

    async def _read(self, name: str, detail: object = None) -> None:
        if await _gate(Op(name, detail)) is not Fault.NONE:
            raise StoreTimeoutError(f"{name} timed out")

    def visible(self, key: str, mutator: uuid.UUID, row: ShardRow, cell: Cell | None) -> Cell | None:
        """``cell`` of ``mutator``'s ``row`` unless a range or row tombstone of the key shadows it."""
        if cell is None or any(t.shadows(row.born_us, cell) for t in self.ranges.get(key, ())):
            return None
        if cell.ts <= self.row_tombstones.get((key, mutator), -1):
            return None
        return cell

    def land(self, mutator: uuid.UUID, born_us: int, timestamp_us: int, write: ShardWrite, source: bytes = b"") -> None:
        """Apply one shard write (``UPDATE ... USING TIMESTAMP``) cell by cell, and its key's stamp."""
        row = self.shards.setdefault((write.counter, write.key), {}).setdefault(mutator, ShardRow(born_us))
        state = Cell(write.state, timestamp_us)
        through = Cell(_bigint(write.through_offset), timestamp_us)
        stamp = Cell(_bigint(timestamp_us), timestamp_us)
        if stamp.wins_over(self.stamps.get((write.key, source))):
            self.stamps[(write.key, source)] = stamp
        if state.wins_over(row.state):
            # The key's stamps must now differ from what they were before any write of another state: the
            # source's cell is this write's (another counter's write of the same flush may have put it there),
            # and no earlier write at this timestamp stamped other bytes of this cell.
            if row.state is None or row.state.value != state.value:  # a new shard, or new bytes of one
                if self.stamps[(write.key, source)] != stamp:
                    self.stamp_misses.append(((write.counter, write.key), f"{write.counter}/{write.key}: {mutator} "
                                              f"wrote at {timestamp_us}, its source's stamp stayed at "
                                              f"{self.stamps[(write.key, source)].ts}"))
                elif self.stamped.get((write.key, source, timestamp_us, write.counter, mutator), state.value) \
                        != state.value:
                    self.stamp_misses.append(((write.counter, write.key), f"{write.counter}/{write.key}: {mutator} "
                                              f"wrote other bytes at {timestamp_us}, stamped the same"))
            self.stamped[(write.key, source, timestamp_us, write.counter, mutator)] = state.value
            row.state = state
        if through.wins_over(row.through):
            row.through = through

    def deliver(self, index: int) -> HeldWrite:
        held = self.held.pop(index)
        for write in held.writes:
            self.land(held.mutator, held.born_us, held.timestamp_us, write, held.source)
        return held

    def drop(self, index: int) -> HeldWrite:
        return self.held.pop(index)

    # -------------------------------------------------------------------------------- partitions

    async def read_partition(self, pid: PartitionId) -> PartitionRow | None:
        await self._read("read_partition")
        return self.partitions.get(pid)

    async def create_partition(self, pid: PartitionId, owner: uuid.UUID, born_us: int, last_offset: int) -> bool:
        fault = await self._lwt("create_partition", owner)
        applied = pid not in self.partitions
        if applied:
            self._set_row(pid, PartitionRow(owner, owner, born_us, 0, last_offset, last_offset))
            self.starts[owner] = last_offset + 1
        return self._answer(fault, applied)

    async def claim_partition(self, pid: PartitionId, owner: uuid.UUID, seen: PartitionRow) -> bool:
        fault = await self._lwt("claim_partition", owner)
        row = self.partitions.get(pid)
        applied = (row is not None and row.owner == seen.owner and row.flush_seq == seen.flush_seq
                   and row.window_mutator == seen.window_mutator)
        if applied:
            assert row is not None
            self._set_row(pid, dataclasses.replace(row, owner=owner))
        return self._answer(fault, applied)

    async def open_window(
        self, pid: PartitionId, mutator: uuid.UUID, born_us: int, seq: int, committed: int, intent: int
    ) -> bool:
        fault = await self._lwt("open_window", (mutator, seq))
        row = self.partitions.get(pid)
        applied = row is not None and self._may_open(row, mutator, seq)
        if applied:
            assert row is not None
            self._set_row(pid, dataclasses.replace(
                row, window_mutator=mutator, window_born_us=born_us, flush_seq=seq,
                committed_offset=committed, intent_offset=intent))
        return self._answer(fault, applied)

    def _may_open(self, row: PartitionRow, mutator: uuid.UUID, seq: int) -> bool:
        """The fence: ``IF owner = mutator AND flush_seq = seq - 1`` (a subclass removes it)."""
        return row.owner == mutator and row.flush_seq == seq - 1

    async def commit_window(self, pid: PartitionId, mutator: uuid.UUID, seq: int, offset: int) -> bool:
        fault = await self._lwt("commit_window", (mutator, seq))
        row = self.partitions.get(pid)
        applied = row is not None and row.owner == mutator and row.flush_seq == seq
        if applied:
            assert row is not None
            self._set_row(pid, dataclasses.replace(row, committed_offset=offset))
        return self._answer(fault, applied)

    async def close_window(self, pid: PartitionId, owner: uuid.UUID, born_us: int, offset: int) -> bool:
        fault = await self._lwt("close_window", owner)
        row = self.partitions.get(pid)
        # An UPDATE ... IF on a missing row does not apply.
        applied = row is not None and row.owner == owner
        if applied:
            assert row is not None
            self._set_row(pid, dataclasses.replace(
                row, window_mutator=owner, window_born_us=born_us, flush_seq=0,
                committed_offset=offset, intent_offset=offset))
            self.starts[owner] = offset + 1
        return self._answer(fault, applied)

    # -------------------------------------------------------------------------------- shards

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int,
                           writes: Sequence[ShardWrite], *, source: bytes) -> None:
        # The Cassandra store sends every statement at once and waits for all: each key's lands or not on its
        # own (its row, a cell per counter, and its stamp are one mutation: they land together), and the call
        # fails if any of them was not acknowledged.
        unacknowledged = 0
        by_key: dict[str, list[ShardWrite]] = {}
        for write in writes:
            by_key.setdefault(write.key, []).append(write)
        for of_key in by_key.values():
            fault = await _gate(Op("write_shard", (mutator, timestamp_us, tuple(of_key))))
            if fault in (Fault.NONE, Fault.LOST_ANSWER):
                for write in of_key:
                    self.land(mutator, born_us, timestamp_us, write, source)
            elif fault is Fault.HOLD:
                self.held.append(HeldWrite(mutator, born_us, timestamp_us, tuple(of_key), source))
            unacknowledged += fault is not Fault.NONE
            for write in of_key:
                if write.first_write:
                    fault = await _gate(Op("write_work_row", (mutator, write.counter, write.key)))
                    if fault is not Fault.FAIL:
                        # A held work-list insert has no timestamp of interest: landing now or later is the same.
                        self.work.add((mutator, write.counter, write.key))
                    unacknowledged += fault is not Fault.NONE
        if unacknowledged:
            raise StoreTimeoutError(f"{unacknowledged} shard writes not acknowledged")

    async def read_shard(self, counter: str, key: str, mutator: uuid.UUID, born_us: int) -> StoredShard | None:
        await self._read("read_shard", (counter, key, mutator))
        row = self.shards.get((counter, key), {}).get(mutator)
        if row is None or row.born_us != born_us:
            return None
        state, through = self.visible(key, mutator, row, row.state), self.visible(key, mutator, row, row.through)
        if state is None or through is None:
            return None
        return StoredShard(state.value, struct.unpack(">q", through.value)[0])

    async def read_shards(self, mutator: uuid.UUID, born_us: int, instances: Sequence[tuple[str, str]]
                          ) -> dict[tuple[str, str], StoredShard | None]:
        # one at a time: every read is a storage step the model schedules and may fail
        return {(counter, key): await self.read_shard(counter, key, mutator, born_us) for counter, key in instances}

    # -------------------------------------------------------------------------------- registry

    async def register_mutator(self, record: MutatorEntry) -> bool:
        fault = await self._lwt("register_mutator", record.id)
        # INSERT ... IF NOT EXISTS
        applied = record.id not in self.mutators
        if applied:
            self.mutators[record.id] = record
        return self._answer(fault, applied)

    async def retire_mutator(self, mutator: uuid.UUID, retired_us: int) -> None:
        fault = await self._lwt("retire_mutator", mutator)
        record = self.mutators.get(mutator)
        # UPDATE ... IF retired_us = null: a missing row has a null column, so the LWT creates it.
        if record is None:
            self.mutators[mutator] = MutatorEntry(mutator, "", "", -1, "", 0, 0, retired_us)
        elif record.retired_us is None:
            self.mutators[mutator] = dataclasses.replace(record, retired_us=retired_us)
        self._answer(fault, True)

    async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str] = frozenset()
                           ) -> None:
        # Not a step the model schedules: a takeover retries it until it is recorded (Ownership._record_start),
        # before its mutator opens any window (test_lost_answers and test_backfill_model fail it on purpose).
        self.recorded_starts[mutator] = start_offset
        self.recorded_counters[mutator] = counters

    async def read_counted(self, mutator: uuid.UUID) -> frozenset[str] | Forgotten | None:
        await self._read("read_counted", mutator)
        if mutator not in self.mutators:
            return FORGOTTEN
        return self.recorded_counters.get(mutator)  # an empty set: it counted none (the Cassandra store alike)

    # -------------------------------------------------------------------------------- what the GC uses

    async def read_registry(self) -> list[RegistryEntry]:
        await self._read("read_registry")
        return [RegistryEntry(r.id, r.consumer_group, r.topic, r.partition, r.born_us, r.expires_us, r.retired_us,
                              self.collected.get(r.id)) for r in self.mutators.values()]

    async def read_work(self, mutator: uuid.UUID) -> AsyncIterator[Sequence[Instance]]:
        # Two pages, so that the GC's paging is exercised too.
        instances = sorted((c, k) for m, c, k in self.work if m == mutator)
        for page in (instances[:1], instances[1:]):
            await self._read("read_work", mutator)
            yield page

    async def read_key(self, key: str) -> KeyView:
        """The whole partition of one key at CL ALL: tallies and every visible row, atomically."""
        await self._read("read_key", key)
        return self.key_view(key)

    def key_view(self, key: str) -> KeyView:
        rows: dict[uuid.UUID, tuple[int, dict[str, bytes], int]] = {}
        for (counter, k), by_mutator in sorted(self.shards.items()):
            if k != key:
                continue
            for mutator, row in by_mutator.items():
                state = self.visible(key, mutator, row, row.state)
                through = self.visible(key, mutator, row, row.through)
                if state is not None and through is not None:
                    born, states, write_us = rows.setdefault(mutator, (row.born_us, {}, 0))
                    states[counter] = state.value
                    rows[mutator] = (born, states, max(write_us, state.ts, through.ts))
        shards = tuple(ShardView(mutator, born, states, write_us, dict.fromkeys(states))
                       for mutator, (born, states, write_us) in sorted(rows.items(), key=lambda r: (r[1][0], r[0])))
        tallies = {c: cell for (c, k), cell in self.tallies.items() if k == key}
        return KeyView({c: cell.value for c, cell in tallies.items()}, {c: cell.ts for c, cell in tallies.items()},
                       shards)

    async def read_tallies(self, key: str) -> tuple[Mapping[str, bytes], Mapping[str, int]]:
        await self._read("read_tallies", key)
        view = self.key_view(key)
        return view.tallies, view.tally_write_us

    def stamps_of(self, key: str) -> dict[bytes, int]:
        """The key's stamps as a read of its stamps row returns them: source -> write timestamp."""
        return {source: cell.ts for (k, source), cell in self.stamps.items() if k == key}

    def stored_rows(self, counter: str, key: str) -> list[tuple[tuple[int, uuid.UUID], bytes, int]]:
        """The instance's visible shards as a read of the partition returns them, in clustering order: each
        row, its state, and the write timestamp of the row's newest visible cell of any counter
        (``maxwritetime(states)``)."""
        newest: dict[uuid.UUID, int] = {}
        for (_, k), by_mutator in self.shards.items():
            if k != key:
                continue
            for mutator, row in by_mutator.items():
                for cell in (self.visible(key, mutator, row, row.state), self.visible(key, mutator, row, row.through)):
                    if cell is not None:
                        newest[mutator] = max(cell.ts, newest.get(mutator, cell.ts))
        found = []
        for mutator, row in self.shards.get((counter, key), {}).items():
            state, through = self.visible(key, mutator, row, row.state), self.visible(key, mutator, row, row.through)
            if state is not None and through is not None:
                found.append(((row.born_us, mutator), state.value, newest[mutator]))
        return sorted(found, key=lambda shard: shard[0])

    def snapshot(self, counter: str, key: str) -> InstanceSnapshot:
        """What a reader of one instance sees now."""
        shards = []
        for mutator, row in sorted(self.shards.get((counter, key), {}).items()):
            state, through = self.visible(key, mutator, row, row.state), self.visible(key, mutator, row, row.through)
            if state is not None and through is not None:
                shards.append(ShardSnapshot(mutator, state.value, struct.unpack(">q", through.value)[0],
                                            max(state.ts, through.ts)))
        tally = self.tallies.get((counter, key))
        return InstanceSnapshot(tally.value if tally else None, tally.ts if tally else None, tuple(shards))

    async def fold(self, key: str, tallies: Mapping[str, tuple[bytes, int | None]], ranges: Sequence[Range],
                   rows: Sequence[Row], ts: int) -> None:
        """The GC batch: write the static tallies, the range tombstones and the row tombstones, all ``USING
        TIMESTAMP ts``; one partition, so Cassandra applies it atomically."""
        fault = await _gate(Op("gc_batch", (key, tuple(sorted(tallies)), tuple(ranges), tuple(rows), ts)))
        if fault is Fault.FAIL:
            raise StoreTimeoutError("gc batch timed out before applying")
        for counter, (tally, _) in tallies.items():
            cell = Cell(tally, ts)
            if cell.wins_over(self.tallies.get((counter, key))):
                self.tallies[(counter, key)] = cell
        self.ranges.setdefault(key, []).extend(RangeTombstone(after, before, ts) for after, before in ranges)
        # A row tombstone is the range of that one birth time, for that one mutator.
        self.row_tombstones.update({(key, mutator): max(ts, self.row_tombstones.get((key, mutator), ts))
                                    for _, mutator in rows})
        # The fold's stamp (schemas.cql): a merge kept from before it is not read again as it was.
        stamp = Cell(_bigint(ts), ts)
        if stamp.wins_over(self.stamps.get((key, GC_STAMP_SOURCE))):
            self.stamps[(key, GC_STAMP_SOURCE)] = stamp
        if fault is not Fault.NONE:
            raise StoreTimeoutError("gc batch applied, answer lost")

    async def record_cutoff(self, cutoff_us: int) -> None:
        fault = await _gate(Op("record_cutoff", cutoff_us))
        if fault is Fault.FAIL:
            raise StoreTimeoutError("record_cutoff timed out before applying")
        self.gc_cutoff = max(self.gc_cutoff, cutoff_us)  # USING TIMESTAMP cutoff: the highest stays
        if fault is not Fault.NONE:
            raise StoreTimeoutError("record_cutoff applied, answer lost")

    async def read_gc_cutoff(self) -> int:
        await self._read("read_gc_cutoff")
        return self.gc_cutoff

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None:
        fault = await _gate(Op("mark_collected", mutator))
        if fault is Fault.FAIL:
            raise StoreTimeoutError("mark_collected timed out before applying")
        self.collected[mutator] = collected_us
        if fault is not Fault.NONE:
            raise StoreTimeoutError("mark_collected applied, answer lost")

    async def forget(self, mutator: uuid.UUID) -> None:
        raise AssertionError("the model test keeps every mutator")


class MemoryResets:
    """:class:`consumer.resetting.ResetBook` in memory: the reset rows (recorded before their control records
    are in the log) and the positions mutators record, with fault gates on the reads and writes a mutator
    waits for. The positions are those the consumer recorded alone: the reset command's own recording of
    them is left out, as if it had died before."""

    def __init__(self, resets: Sequence[Reset] = ()) -> None:
        self.resets = {r.reset_id: r for r in resets}
        self.positions: dict[tuple[str, str, int], int] = {}  # (reset id, topic, partition) -> least offset

    async def look_up(self, reset_ids: Sequence[str]) -> Mapping[str, Reset | None]:
        return {reset_id: self.resets.get(reset_id) for reset_id in reset_ids}

    async def epochs_at(self, topic: str, partition: int, counters: Sequence[str], start: int) -> Epochs:
        if await _gate(Op("read_reset_positions", start)) is not Fault.NONE:
            raise StoreTimeoutError("read_reset_positions timed out")
        here = {reset_id: at for (reset_id, t, p), at in self.positions.items() if (t, p) == (topic, partition)}
        return epochs_at([r for r in self.resets.values() if r.counter in counters], here, start, topic, partition)

    async def record_positions(self, positions: Sequence[ResetPosition]) -> None:
        fault = await _gate(Op("record_reset_positions", positions))
        if fault is Fault.FAIL:
            raise StoreTimeoutError("record_reset_positions timed out before applying")
        for position in positions:
            where = (position.reset_id, position.topic, position.partition)
            self.positions[where] = min(self.positions.get(where, position.offset), position.offset)
        if fault is not Fault.NONE:
            raise StoreTimeoutError("record_reset_positions: answer lost")


class MemoryLog:
    """One Kafka partition's log: a :class:`consumer.protocol.RecordSource` over a list of records.

    ``offsets`` gives each record's offset (increasing, with gaps where a real log has transaction markers,
    aborted or compacted records); by default they are 0, 1, 2, ... ``start`` is the first offset retention
    left in the log."""

    def __init__(self, values: Sequence[bytes | None], offsets: Sequence[int] | None = None, start: int = 0,
                 headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None) -> None:
        offsets = range(len(values)) if offsets is None else offsets
        headers = [()] * len(values) if headers is None else headers
        self.records = [Record(offset, value, headers=tuple(h))
                        for offset, value, h in zip(offsets, values, headers, strict=True)]
        self.start = start

    def _kept(self) -> list[Record]:
        return [r for r in self.records if r.offset >= self.start]

    async def read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        return [r for r in self._kept() if first <= r.offset <= last]

    async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        """Three records at a time: a replay must carry its states from one chunk to the next."""
        records = await self.read(topic, partition, first, last)
        for i in range(0, len(records), 3):
            yield records[i:i + 3]

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        earlier = [r for r in self._kept() if r.offset < before]
        return earlier[-count:] if count > 0 else []

    async def log_start(self, topic: str, partition: int) -> int:
        return self.start


class Task:
    """A protocol coroutine driven one storage operation at a time.

    ``pending`` is the operation the coroutine waits at; :meth:`step` lets it take effect (with a fault) and
    runs the caller's code up to the next one. When the coroutine ends, ``done`` is set and ``result`` or
    ``error`` holds its outcome.
    """

    def __init__(self, label: str, coro: Coroutine[Any, Any, Any], *, start: bool = True) -> None:
        """``start=False`` runs nothing yet (as :func:`asyncio.create_task` does): the first :meth:`step`
        starts the coroutine, which then waits at its first operation."""
        self.label = label
        self._coro = coro
        self.pending: Op | None = None
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._started = start
        if start:
            self._advance(None)
        else:
            self.pending = Op("start")

    def _advance(self, fault: Fault | None, thrown: BaseException | None = None) -> None:
        try:
            yielded = self._coro.send(fault) if thrown is None else self._coro.throw(thrown)
        except StopIteration as stop:
            self.done, self.pending, self.result = True, None, stop.value
        except (CountersinkError, asyncio.CancelledError) as exc:  # the protocol's own errors, timeouts, a stop
            self.done, self.pending, self.error = True, None, exc
        else:
            if not isinstance(yielded, Op):
                raise TypeError(f"{self.label} awaited something other than a storage gate: {yielded!r}")
            self.pending = yielded

    def step(self, fault: Fault = Fault.NONE) -> None:
        if self.done:
            raise RuntimeError(f"{self.label} has finished")
        if not self._started:
            self._started = True
            self._advance(None)  # nothing has failed yet: there was no operation
            return
        self._advance(fault)

    def finish(self) -> Task:
        """Run to the end with no faults."""
        while not self.done:
            self.step()
        return self

    def cancel(self) -> None:
        """The process stops (as :meth:`asyncio.Task.cancel`): CancelledError is raised where the coroutine waits,
        and the storage operations of its handlers are stepped as any others; it ends with that error."""
        if self.done:
            return
        if not self._started:
            self.abandon()
            self.error = asyncio.CancelledError()
            return
        self._advance(None, asyncio.CancelledError())

    def abandon(self) -> None:
        """The process running it dies: operations not yet at their gate never happen."""
        self._coro.close()
        self.done, self.pending = True, None


class BackgroundTask:
    """:class:`consumer.ownership.Background` over a :class:`Task`: a takeover's background half, run by the
    test one storage operation at a time, or cancelled as a process's loop cancels it."""

    def __init__(self, label: str, coro: Coroutine[Any, Any, None]) -> None:
        self.task = Task(label, coro, start=False)
        self._cancelled = False

    def done(self) -> bool:
        return self.task.done

    def cancelled(self) -> bool:
        return self._cancelled

    def exception(self) -> BaseException | None:
        if self._cancelled:
            raise asyncio.CancelledError
        if not self.task.done:
            raise asyncio.InvalidStateError(f"{self.task.label} has not finished")
        return self.task.error

    def result(self) -> None:
        error = self.exception()
        if error is not None:
            raise error

    def cancel(self) -> bool:
        if self.task.done:
            return False
        self.task.abandon()
        self._cancelled = True
        return True

    def __await__(self) -> Generator[Any, None, None]:
        # Awaited only once it is done (ownership awaits a takeover it has just cancelled): nothing to wait for.
        self.result()
        return
        yield


async def retry_pause(what: str) -> None:
    """Where a step that failed waits before it is tried again: the test decides when that is."""
    await _gate(Op("retry_pause", what))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to its end without faults and return its result (or raise its error)."""
    task = Task("run", coro).finish()
    if task.error is not None:
        raise task.error
    return task.result
