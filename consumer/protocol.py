"""The flush / takeover / release protocol that makes every event count exactly once.

Writing whole state makes a retried *write* harmless, not a redelivered *message*: a mutator that flushed
through offset 200 and died before recording it would see 151–200 counted again by its successor. So every
shard records the offset it is complete through, ownership of a partition moves only by LWT, and a flush
opens a *window* (committed, intent] before writing, which a successor replays as the writer if it finds it
open. The argument, step by step, is in docs/guarantees.md.

Everything here talks to storage through :class:`~consumer.storage.Store` and to Kafka through
:class:`~consumer.applying.RecordSource`, and takes ``now_us`` as an argument: the same code runs against
Cassandra and Kafka in production and against in-memory stand-ins in the model test. The states it writes
are built on the hot path, ``consumer.applying``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NoReturn

from consumer.applying import Applier, KafkaRecord, Mutator, Outcome, RecordsLostError, RecordSource
from consumer.storage import MutatorEntry, PartitionId, PartitionRow, ShardWrite, Store
from countersink.logs import get_logger
from countersink.retry import is_retriable
from schemas.cql import stamp_source
from schemas.errors import CountersinkError, InvalidEventError
from schemas.events import Update
from schemas.kinds import State, new_state, state_from_bytes
from schemas.resets import ResetPosition

log = get_logger(__name__)

# A mutator's shard writes carry the timestamp born_us + flush_seq; the GC deletes with retired_us. Retiring
# at least this long after birth keeps every write timestamp below the retire time for any mutator that
# flushes less than once per microsecond on average, which a 1 s flush interval guarantees by far.
MIN_LIFETIME_US = 1_000_000


class FencedError(CountersinkError):
    """Raised when a mutator's LWT did not apply: another mutator owns the partition now."""


class StaleEntryError(CountersinkError):
    """Raised by :func:`claim` given a registry entry made before: every takeover needs a fresh mutator
    (a mutator retired by a later takeover must never own a partition again)."""


class ClaimUnresolvedError(CountersinkError):
    """Raised by :meth:`Claimant.claim` when a claim's answer was lost and the ownership row cannot say
    whether it applied (another mutator has claimed since): the claimant's mutator is retired unused, and a
    takeover tries again with a fresh one."""

    retriable = True


class MutatorExpiredError(CountersinkError):
    """Raised instead of flushing when a mutator is past its expiry: it must not write any more.

    Its successor (a takeover, in the same process or another) replays whatever window it left open and
    re-reads its unflushed records from Kafka.
    """


def _stamp_source(pid: PartitionId) -> bytes:
    return stamp_source(pid.consumer_group, pid.topic, pid.partition)


async def flush(store: Store, mutator: Mutator, now_us: int) -> int:
    """Flush k: open the window by LWT, write every dirty shard, then mark it done. Returns rows written.

    The mutator may go on applying records while this runs (but never two flushes of one mutator at once).

    Raises :class:`FencedError` when the LWT does not apply; the mutator must then drop its state and stop.
    A storage error propagates; the same flush can be retried as it is (it is idempotent: the window LWT
    is retried only if it did not apply, and shard writes carry the same timestamp and values).
    """
    if mutator.fenced or mutator.released or mutator.retiring:
        raise FencedError(f"mutator {mutator.id} no longer owns {mutator.pid}")
    if not mutator.needs_flush():
        if not mutator.window_committed and now_us < mutator.entry.expires_us:
            await _commit_window(store, mutator)
        return 0
    if now_us >= mutator.entry.expires_us:
        raise MutatorExpiredError(f"mutator {mutator.id} expired; its unflushed records will be read again")
    # The intent and the bytes written are taken together, before the first await: records applied while
    # this flush is in flight (the consumer goes on applying) belong to the next window, not to this one.
    intent = mutator.applied_through
    flushing, mutator.dirty = mutator.dirty, set()
    expires_at, retained = mutator.applier.expires_at, mutator.applier.retained
    states, recorded, epochs = mutator.states, mutator.recorded, mutator.applier.epochs
    # In no particular order: the store groups them by key (sorting them cost more than building them). Each
    # state goes to the cell of its instance's epoch (the counter's own name until a reset).
    # ``recorded`` holds cells: after a reset, an instance's new cell goes to the GC's work list too.
    by_epoch = bool(epochs.applied)  # (a reset applied while this flush is in flight belongs to the next)
    if by_epoch:
        writes = [
            ShardWrite(cell, key, states[(counter, key)].to_bytes(), intent, (cell, key) not in recorded,
                       expires_at(counter, key) if counter in retained else None)
            for counter, key in flushing
            for cell in (epochs.cell(counter, key),)
        ]
    else:
        # No reset applied (nearly always): each instance's cell is its counter's name, so its identity is its
        # cell's (a flush writes a row or more per event applied: no tuple more per write than needed).
        writes = [
            ShardWrite(ident[0], ident[1], states[ident].to_bytes(), intent, ident not in recorded,
                       expires_at(*ident) if ident[0] in retained else None)
            for ident in flushing
        ]
    positions, mutator.positions = mutator.positions, []
    mutator.window_committed = False
    try:
        if positions:
            # Before the window that covers them can be committed: a successor starting past a control record
            # learns its reset from here (the reset command may have died before recording it).
            await mutator.applier.resets.record_positions(positions)
        seq = await _open_window(store, mutator, intent)
        await store.write_shards(mutator.id, mutator.entry.born_us, mutator.entry.born_us + seq, writes,
                                 source=_stamp_source(mutator.pid))
    except BaseException:
        # Not known written: the next attempt writes them again, as they are then (unless a reset applied
        # meanwhile dropped them).
        mutator.dirty |= {ident for ident in flushing if ident in states}
        mutator.positions[:0] = positions
        raise
    if by_epoch:
        mutator.recorded.update((write.counter, write.key) for write in writes)
    else:
        mutator.recorded |= flushing
    mutator.flush_seq = seq
    mutator.flushed_through = intent
    mutator.window_seq = None
    mutator.remeasure(flushing)
    return len(writes)


async def _commit_window(store: Store, mutator: Mutator) -> None:
    """Record the last flush complete (every write of it is acknowledged) without opening another window.

    A flush's window is otherwise recorded complete only by the next flush's LWT; on a partition gone quiet
    that leaves it open, and a takeover after a crash would read its records again and rewrite its shards
    for nothing. Idempotent: the condition is unchanged by the update itself.
    """
    if not await store.commit_window(mutator.pid, mutator.id, mutator.flush_seq, mutator.flushed_through):
        row = await store.read_partition(mutator.pid)
        if row is None or row.owner != mutator.id or row.committed_offset != mutator.flushed_through:
            mutator.fenced = True
            raise FencedError(f"mutator {mutator.id} lost {mutator.pid} before committing its last flush")
    mutator.window_committed = True


async def _open_window(store: Store, mutator: Mutator, intent: int) -> int:
    """Open the window of the next flush by LWT and return its number (docs/guarantees.md: a flush opens a
    window first).

    After an attempt that may have opened a window without writing it all, the row says what happened: if it
    shows that window with the same intent, it is reused as it is. If more records were applied since, a new
    window follows it, still counting from the last *completed* flush, so a successor replays both; stamping
    the old window's shards with the new intent would make a successor count the extra records twice. The
    window the row shows may be any this mutator opened since its last completed flush, not only the last
    it tried: an attempt after a lost answer may itself have failed before applying.
    """
    base = mutator.flush_seq
    if mutator.window_seq is not None:
        row = await store.read_partition(mutator.pid)
        if row is None or row.owner != mutator.id:
            mutator.fenced = True
            raise FencedError(f"mutator {mutator.id} lost {mutator.pid} (owner now {row.owner if row else None})")
        if mutator.flush_seq < row.flush_seq <= mutator.window_seq and row.window_mutator == mutator.id:
            if row.intent_offset == intent:
                return row.flush_seq
            base = row.flush_seq
        elif row.flush_seq != mutator.flush_seq:
            mutator.fenced = True
            raise FencedError(f"mutator {mutator.id}: {mutator.pid} shows flush {row.flush_seq}, "
                              f"expected {mutator.flush_seq} or {mutator.window_seq}")
    seq = base + 1
    mutator.window_seq = seq  # before the LWT: it may apply even if its answer never arrives
    if not await store.open_window(mutator.pid, mutator.id, mutator.entry.born_us, seq, mutator.flushed_through,
                                   intent):
        mutator.fenced = True
        raise FencedError(f"mutator {mutator.id} lost {mutator.pid}")
    return seq


async def release(store: Store, mutator: Mutator, now_us: int) -> None:
    """Clean hand-over (revoke, shutdown, rotation): final flush, record it committed, retire.

    Safe to call again after an error: once the last flush is committed the mutator is marked retiring and
    never flushes again, so a retire that applied with its answer lost cannot be followed by a write that the
    GC's deletion would hide."""
    if mutator.released:
        return
    if not mutator.retiring:
        await flush(store, mutator, now_us)
        if not mutator.window_committed:
            await _commit_window(store, mutator)
        mutator.retiring = True
    await store.retire_mutator(mutator.id, retire_time(mutator.entry.born_us, now_us))
    mutator.released = True


def retire_time(born_us: int, now_us: int) -> int:
    return max(now_us, born_us + MIN_LIFETIME_US)


@dataclasses.dataclass(frozen=True)
class Takeover:
    """What a takeover did: where the new mutator starts, and what it replayed and retired."""

    start_offset: int
    replayed_records: int
    replayed_instances: int
    retired: tuple[uuid.UUID, ...]
    previous_owner: uuid.UUID | None


@dataclasses.dataclass(frozen=True)
class Claim:
    """A partition's ownership row as ``new`` claimed it: what :func:`finish_take_over` still has to do."""

    new: MutatorEntry
    row: PartitionRow | None  # None: the partition had no row, and ``new`` created it
    initial_last_offset: int

    @property
    def start_offset(self) -> int:
        """The first offset the new mutator applies; it may start before the takeover is finished."""
        return self.initial_last_offset + 1 if self.row is None else self.row.intent_offset + 1

    @property
    def counted_from(self) -> int:
        """The first offset the takeover counts: the window the previous owner left open, replayed by
        :func:`finish_take_over`, else the start offset."""
        row = self.row
        return row.committed_offset + 1 if row is not None and row.window_to_replay is not None else self.start_offset

    @property
    def finished(self) -> bool:
        """Nothing left to replay, retire or close: a partition seen for the first time."""
        return self.row is None


class Claimant:
    """A fresh mutator claiming a partition, across the attempts of one takeover.

    An LWT may apply and still time out at the caller. What it sent and never heard the answer of is kept
    here, so that the next :meth:`claim` reads the ownership row (SERIAL) to learn what happened instead of
    starting over with another mutator: a claim that applied is carried on with (a rotation that started
    over was refused by its own claim, and dropped the partition for good); one the row shows did not apply
    is sent again; one the row cannot tell about (another mutator has claimed since) leaves this mutator
    spent. ``from_owner`` (a rotation: a clean hand-over to oneself) claims only from that mutator: a member
    that lost its assignment without noticing must never fence the partition's rightful owner.
    """

    def __init__(self, new: MutatorEntry, initial_last_offset: int, from_owner: uuid.UUID | None = None) -> None:
        self.new = new
        self.initial_last_offset = initial_last_offset
        self.from_owner = from_owner
        self.pid = PartitionId(new.consumer_group, new.topic, new.partition)
        self._registering = False  # a register LWT was sent: finding the entry registered then means ours
        self._registered = False
        self._above_cutoffs = False  # no GC run that missed the registration can have a cutoff at its birth
        # The row a claim (or, None, a create) LWT was last sent from, while its answer is unknown.
        self._unanswered: tuple[PartitionRow | None] | None = None
        # Why this mutator may claim no more (retired unused: the takeover goes on, if at all, with a fresh one).
        self.spent: CountersinkError | None = None

    async def claim(self, store: Store, max_attempts: int = 20) -> Claim:
        """Register the mutator and claim the ownership row by LWT (or create it, the first time); safe to
        call again after any error, with the same mutator, unless :attr:`spent`.

        From here on no other mutator can open a window on the partition. ``new`` may apply records from
        :attr:`Claim.start_offset` in memory at once, but must write nothing (no flush, no release) until
        :func:`finish_take_over` has returned: the window the previous owner left open is still to be replayed.

        Raises :class:`FencedError` when someone else owns the row (a rotation), or after ``max_attempts``
        refused claims; :class:`ClaimUnresolvedError` when the mutator is spent: claim with a fresh one.
        Either is raised once the mutator is retired (again after an error retiring it). Cancelled (the
        process stops), a registered mutator no claim of which may have applied retires unused on the way out:
        it leaves no orphan for ``countersink retire-orphans``.
        """
        try:
            return await self._claim(store, max_attempts)
        except asyncio.CancelledError:
            await self.abandon(store)
            raise

    async def abandon(self, store: Store) -> None:
        """The claim is given up for good (the process stops; also between attempts): retire the mutator when it
        is registered and can never own the partition, no claim or create of it having an answer still unknown.
        One whose answer is unknown is left as a crash leaves it (if it applied, the next claimant's takeover
        retires it; else ``retire-orphans`` does). Idempotent: a spent mutator is retired already."""
        if not self._registered or self._unanswered is not None or self.spent is not None:
            return
        self.spent = ClaimUnresolvedError(f"claim of {self.pid} by {self.new.id}: given up")
        try:
            await _retire_unused(store, self.new)
        except Exception as exc:  # stopping: the orphan is left for retire-orphans, and said
            log.warning("unused_mutator_not_retired", mutator=str(self.new.id), topic=self.pid.topic,
                        partition=self.pid.partition, error=str(exc))

    async def _claim(self, store: Store, max_attempts: int) -> Claim:
        if self.spent is not None:
            await self._spend(store, type(self.spent)(*self.spent.args))
        if not self._registered and not self._registering:
            # Before the mutator is registered its birth may still move: above every write timestamp of the
            # partition's earlier owners, whatever this machine's clock says (schemas.cql: stamps), and above
            # every GC run's cutoff so far.
            floor = max(_timestamp_floor(await store.read_partition(self.pid)), await store.read_gc_cutoff())
            if self.new.born_us <= floor:
                self.new = _born_at(self.new, floor + 1)
        new = self.new
        if not self._registered:
            again, self._registering = self._registering, True
            if not await store.register_mutator(new) and not again:
                raise StaleEntryError(f"mutator {new.id} was registered before: a takeover needs a fresh mutator")
            self._registered = True  # by this claimant: the id is fresh, and only its own claims could retire it
        if not self._above_cutoffs:
            # A GC run that read the registry before the registration landed took every birth up to its cutoff
            # for a final mutator's (gc_worker.collector): its range tombstones would delete this mutator's
            # rows, and its fold count them as final. Each run records its cutoff before it reads the registry,
            # so a run that missed the registration recorded a cutoff this read sees (both at quorum), however
            # long the registration took (a lost answer, a stalled process).
            cutoff = await store.read_gc_cutoff()
            if new.born_us <= cutoff:
                await self._spend(store, ClaimUnresolvedError(
                    f"claim of {self.pid} by {new.id}: born at {new.born_us}, not after the cutoff {cutoff} of a GC "
                    "run that may have read the registry before it was registered"))
            self._above_cutoffs = True
        for _ in range(max_attempts):
            row = await store.read_partition(self.pid)
            if self._unanswered is not None:
                (sent_from,), self._unanswered = self._unanswered, None
                if row is not None and row.owner == new.id:
                    # It applied. ``sent_from`` is the row as claimed: it names the owner to retire.
                    return Claim(new, sent_from, self.initial_last_offset)
                if not _same_claim(row, sent_from):
                    # Another mutator claimed since. Ours may have applied before: it may have been retired by
                    # that claimant, and must never own the partition again.
                    await self._spend(store, self._not_rotating(row) if self.from_owner else ClaimUnresolvedError(
                        f"claim of {self.pid} by {new.id}: answer lost, and {row.owner if row else None} has "
                        "claimed since"))
                # Else the condition it was sent with still holds: it did not apply; claim as if refused.
            if self.from_owner is not None and (row is None or row.owner != self.from_owner):
                await self._spend(store, self._not_rotating(row))
            if new.born_us <= _timestamp_floor(row):
                # The owner flushed on (or another claimed) since the birth was chosen, with a clock ahead of
                # this one: a fresh mutator is born above them.
                await self._spend(store, ClaimUnresolvedError(
                    f"claim of {self.pid} by {new.id}: born at {new.born_us}, not after the partition's last "
                    f"write timestamp {_timestamp_floor(row)}"))
            self._unanswered = (row,)
            if row is None:
                applied = await store.create_partition(self.pid, new.id, new.born_us, self.initial_last_offset)
            else:
                applied = await store.claim_partition(self.pid, new.id, row)
            self._unanswered = None
            if applied:
                return Claim(new, row, self.initial_last_offset)
        await self._spend(store, FencedError(f"could not claim {self.pid} after {max_attempts} attempts"))

    def _not_rotating(self, row: PartitionRow | None) -> FencedError:
        return FencedError(f"{self.pid} is owned by {row.owner if row else None}, not by {self.from_owner}: "
                           "not rotating")

    async def _spend(self, store: Store, error: CountersinkError) -> NoReturn:
        """This mutator claims no more: retire it (it wrote nothing) and raise ``error``."""
        self.spent = error
        await _retire_unused(store, self.new)
        raise error


def _timestamp_floor(row: PartitionRow | None) -> int:
    """The latest write timestamp any earlier owner of the partition may have used: its window writer's birth
    plus its flush number (a claimant that has not closed the window wrote only at the writer's timestamps)."""
    if row is None or row.window_born_us is None:
        return -1
    return row.window_born_us + row.flush_seq


def _born_at(entry: MutatorEntry, born_us: int) -> MutatorEntry:
    """``entry`` born at ``born_us`` instead, its expiry moved as much."""
    return dataclasses.replace(entry, born_us=born_us, expires_us=entry.expires_us + born_us - entry.born_us)


def _same_claim(row: PartitionRow | None, sent_from: PartitionRow | None) -> bool:
    """True when ``row`` still meets the condition of an LWT sent from ``sent_from``, so that LWT did not
    apply: a claim names (owner, flush_seq, window_mutator) as read, and once a mutator has lost the row it
    never owns it again; a create applies only where there is no row, and rows are never deleted."""
    if row is None or sent_from is None:
        return row is None and sent_from is None
    return ((row.owner, row.flush_seq, row.window_mutator)
            == (sent_from.owner, sent_from.flush_seq, sent_from.window_mutator))


async def claim(store: Store, new: MutatorEntry, initial_last_offset: int, max_attempts: int = 20,
                from_owner: uuid.UUID | None = None) -> Claim:
    """One :meth:`Claimant.claim` of a fresh :class:`Claimant` (see there)."""
    return await Claimant(new, initial_last_offset, from_owner).claim(store, max_attempts)


async def _retire_unused(store: Store, new: MutatorEntry) -> None:
    """Retire a registered mutator that never owned its partition (every claim it tried was refused, so it
    wrote nothing): the GC collects its registry row instead of keeping it forever, waiting for a retirement
    no one else would record."""
    await store.retire_mutator(new.id, new.born_us)


InvalidRecordHandler = Callable[[KafkaRecord, InvalidEventError], Awaitable[None]]


async def finish_take_over(store: Store, source: RecordSource, claimed: Claim,
                           applier_factory: Callable[[], Applier], clock: Callable[[], int],
                           on_invalid: InvalidRecordHandler | None = None, accept_lost: bool = False) -> Takeover:
    """Finish what the previous owner left, after :func:`claim`: replay the window it left open as its
    writer W (same shards, same timestamp, values completed from each shard's ``through_offset``), retire W
    and the previous owner, close the window by LWT naming the new mutator. A crash anywhere leaves a row the
    next claimant finishes the same way. The consumer runs it in the background while the new mutator applies.
    ``clock`` (microseconds since the epoch) is read as each retirement is written.

    ``on_invalid`` is awaited for each invalid record of a replayed window before the window is closed: the
    writer may have died before its dead letters were delivered, and closing the window is what makes its
    records skipped for good. Raises :class:`RecordsLostError` when records of the window are no longer in
    the log, unless ``accept_lost``: then what remains is replayed."""
    row, new = claimed.row, claimed.new
    if row is None:
        return Takeover(claimed.start_offset, 0, 0, (), None)
    pid = PartitionId(new.consumer_group, new.topic, new.partition)
    # What an earlier attempt did, if any: its close may have applied with its answer lost (then the replay
    # and the retirements before it are done), or another mutator may have claimed since (then there is
    # nothing to replay for: this one will never write).
    now = await store.read_partition(pid)
    if now is None or now.owner != new.id:
        raise FencedError(f"{pid} was claimed by {now.owner if now else None} during takeover by {new.id}")
    if now.window_mutator == new.id:
        # Closed by this mutator: the replay and the retirements were acknowledged before the close was sent.
        done = tuple(dict.fromkeys(m for m in (row.window_mutator, row.owner) if m is not None and m != new.id))
        return Takeover(claimed.start_offset, 0, 0, done, row.owner)
    replayed_records = replayed_instances = 0
    if (window := row.window_to_replay) is not None:
        replayed_records, replayed_instances = await _replay_window(
            store, source, applier_factory(), pid, *window, row.flush_seq, row.committed_offset, row.intent_offset,
            on_invalid, accept_lost)
    # Retire before closing: once the close renames the window, no later claimant would know W any more.
    # Retiring first is safe: the replay above is acknowledged, retiring is set-once, and a repeated replay
    # writes at born_us(W) + seq, below the retire time, so the GC's deletion hides it.
    retired: list[uuid.UUID] = []
    if row.window_mutator is not None and row.window_mutator != new.id:
        # Only the window's writer has shards, stamped born_us(W) + seq: its retire time must exceed them
        # even when this machine's clock is behind W's.
        # The clock is read now, not when the takeover began: a retirement must land within the GC's grace of its
        # time. One landing later (a replay of minutes) may be missed by a run whose cutoff is already above it
        # while another run sees it, and both fold a key at the same timestamp, with different contents: a tie
        # Cassandra settles by the bytes, which may keep the fold without W's shards and delete them all the same.
        await store.retire_mutator(row.window_mutator, retire_time((row.window_born_us or 0) + row.flush_seq, clock()))
        retired.append(row.window_mutator)
    if row.owner is not None and row.owner not in (new.id, row.window_mutator):
        # A claimant that died before writing anything (a claimant writes nothing until its takeover is
        # finished, so one fenced by this claim has no shards either).
        await store.retire_mutator(row.owner, clock())
        retired.append(row.owner)
    if not await store.close_window(pid, new.id, new.born_us, row.intent_offset):
        raise FencedError(f"{pid} was claimed by another mutator during takeover")
    return Takeover(claimed.start_offset, replayed_records, replayed_instances, tuple(retired), row.owner)


async def _replay_window(
    store: Store,
    source: RecordSource,
    applier: Applier,
    pid: PartitionId,
    writer: uuid.UUID,
    writer_born_us: int,
    seq: int,
    committed: int,
    intent: int,
    on_invalid: InvalidRecordHandler | None = None,
    accept_lost: bool = False,
) -> tuple[int, int]:
    """Write what ``writer``'s flush ``seq`` would have written, from its shards and the records again."""
    start = await source.log_start(applier.topic, applier.partition)
    if start > committed + 1 and not accept_lost:
        raise RecordsLostError(applier.topic, applier.partition, committed + 1, min(start - 1, intent))
    await applier.warm_up(source, committed + 1)
    # The window streams through a chunk at a time: memory holds the states of its instances (bounded by
    # flush_max_dirty) and one chunk, never the whole window's records. Each chunk's new instances have their
    # shards read before its updates apply.
    replayed = 0
    # By (cell, key): the writer's state of an instance in the epoch it wrote it in (schemas.resets).
    states: dict[tuple[str, str], tuple[State, int]] = {}
    counter_of: dict[str, str] = {}  # cell -> counter
    epochs = applier.epochs
    positions: list[ResetPosition] = []
    async for chunk in source.stream(applier.topic, applier.partition, committed + 1, intent):
        replayed += len(chunk)
        await applier.learn(chunk)
        applied: list[tuple[int, list[tuple[str, Update]]]] = []
        unread: dict[tuple[str, str], None] = {}  # in first-seen order
        for record in chunk:
            outcome, updates, error = applier.classify(record)
            if outcome is Outcome.CONTROL:
                # As the writer did: its states of the instances reset are dropped, never written again.
                reset = applier.control_reset(record)
                if (reset.counter, reset.epoch) not in epochs.applied:
                    for cell, key in [i for i in states if epochs.clears(reset, counter_of[i[0]], i[1])]:
                        if epochs.cell(counter_of[cell], key) == cell:
                            del states[(cell, key)]
                    for cell, key in [i for i in unread if epochs.clears(reset, counter_of[i[0]], i[1])]:
                        if epochs.cell(counter_of[cell], key) == cell:
                            del unread[(cell, key)]
                    epochs.apply(reset)
                    positions.append(ResetPosition(reset.reset_id, reset.counter, reset.epoch, applier.topic,
                                                   applier.partition, record.offset))
            elif outcome is Outcome.FILTERED and (elsewhere := applier.kept_elsewhere(record)) is not None:
                # A reset of a counter these definitions lack: its position is recorded all the same
                # (Mutator.note_position).
                positions.append(ResetPosition(elsewhere.reset_id, elsewhere.counter, elsewhere.epoch,
                                               applier.topic, applier.partition, record.offset))
            if outcome is Outcome.APPLIED:
                placed = [(epochs.cell(u.counter, u.key) if epochs.applied else u.counter, u) for u in updates]
                applied.append((record.offset, placed))
                for cell, u in placed:
                    counter_of[cell] = u.counter
                    if (cell, u.key) not in states:
                        unread[(cell, u.key)] = None
            if error is not None and on_invalid is not None:  # refused whole, or by some of its counters
                await on_invalid(record, error)
        if unread:
            stored = await store.read_shards(writer, writer_born_us, list(unread))
            states.update({
                (c, k): (new_state(applier.counters[counter_of[c]]), -1) if shard is None else
                        (state_from_bytes(shard.state), shard.through_offset)
                for (c, k), shard in stored.items()})
        for offset, placed in applied:
            for cell, update in placed:
                entry = states.get((cell, update.key))
                if entry is not None and offset > entry[1]:
                    entry[0].apply(update.value)
    if positions:
        await applier.resets.record_positions(positions)
    writes = [ShardWrite(c, k, state.to_bytes(), intent, True, applier.expires_at(counter_of[c], k))
              for (c, k), (state, _) in sorted(states.items())]
    await store.write_shards(writer, writer_born_us, writer_born_us + seq, writes,
                             source=_stamp_source(pid))
    return replayed, len(writes)


async def record_start(store: Store, claimed: Claim, counters: Iterable[str]) -> None:
    """Record where the claiming mutator starts and the ``counters`` it counts on its topic
    (:meth:`Store.record_start`), before its first flush. A later takeover of the partition reads them when it
    replays this mutator's last window: a counter the mutator did not count is not counted from that window
    (consumer.ownership, ``_replayed_for``). ``countersink trace`` reads them too. So the write is required: it
    raises when it fails, and the caller retries it (a takeover waits for it as for its other steps) before the
    mutator opens any window. A retriable failure (a timeout, whose write may or may not have applied, or a
    connection lost) is tried again at once, up to :data:`START_ATTEMPTS` in all, before it is raised: the
    write sets the same values whether it applied or not, and a timeout has already waited."""
    counted = frozenset(counters)
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            await store.record_start(claimed.new.id, claimed.start_offset, counted)
            return
        except Exception as exc:
            if attempt < START_ATTEMPTS and is_retriable(exc):
                continue
            raise


START_ATTEMPTS = 3


__all__: Sequence[str] = (
    "Claim", "FencedError", "InvalidRecordHandler", "MutatorExpiredError", "StaleEntryError", "Takeover",
    "claim", "finish_take_over", "flush", "record_start", "release", "retire_time",
)
