"""Backfills in Cassandra and Kafka: hand-over offsets (``consumer.handovers``), a backfill's run over one
partition, and what a reader is told while one is under way.

A counter with ``since`` is counted by the live mutators from its hand-over offset H in each partition on. A
backfill counts [start, H) of each partition for that counter alone: mutators of its own, in a consumer group
of its own (:func:`backfill_group`, the declared exception to one group per keyspace), run the same claim /
flush / takeover protocol as the live ones (``consumer.protocol``), so a backfill killed at any point is
finished by the next run, which replays the window the dead one left open. It stops each partition at H, so
every record is counted by exactly one side; its mutators retire and the GC folds their shards as any
other's. Records are routed with every counter of the topic (the publisher-retry window decides as the live
mutators' does) and only the backfilled counter's updates are kept. A reprocess is a reset, then a backfill
into the reset's epoch from a time up to the reset's point (its control record) in each partition. A reprocess
records its plan (a row per partition: the reset's id, ``--from`` and the start, no end yet) before it resets,
and each partition's end once the reset's point there is known, so a run killed at any step is resumed or
refused, never taken for finished (``countersink.commands.backfill``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Protocol

from aiokafka import TopicPartition

from consumer.applying import Applier, KafkaRecord, Mutator, Record, RecordsLostError, RecordSource
from consumer.handovers import Recorded
from consumer.protocol import Claimant, ClaimUnresolvedError, finish_take_over, flush, record_start, release
from consumer.storage import MutatorEntry, PartitionId, Store
from countersink.cassandra import CassandraClient, as_dicts
from countersink.retry import Backoff, pause_unless_stopped
from schemas import registry
from schemas.errors import CountersinkError, CountersRefusedError, InvalidEventError
from schemas.resets import cell_name, current_epochs, split_cell

# A backfill's mutator rotates (releases and claims again with a fresh one) once this old, well within the
# expiry it is registered with (twice this), after which it would write nothing more.
ROTATE_AFTER_S = 600.0

# Claims in a row whose mutator is spent (each retired unused, a fresh one then claiming) before the backfill fails.
_UNRESOLVED_CLAIMS = 20


def backfill_group(live_group: str, cell: str) -> str:
    """The consumer group of a backfill's ownership rows and mutators: derived from the live group and the cell
    it fills (a counter, or ``counter@epoch`` for a reprocess), so that two backfills never share rows."""
    return f"{live_group}.backfill.{cell}"


class CassandraHandovers:
    """:class:`consumer.handovers.HandoverBook` on the ``handovers`` table, by LWT."""

    def __init__(self, client: CassandraClient, recorded_by: str) -> None:
        self.client, self.recorded_by = client, recorded_by

    async def propose(self, group: str, topic: str, partition: int, counter: str, offset: int,
                      mutator: uuid.UUID) -> Recorded:
        rows = as_dicts(await self.client.execute(
            "INSERT INTO handovers (consumer_group, cell, topic, partition, offset, mutator, recorded_us, recorded_by) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            [group, counter, topic, partition, offset, mutator, time.time_ns() // 1000, self.recorded_by],
            idempotent=False))
        if not rows or rows[0].get("[applied]"):
            return Recorded(offset, mutator, confirmed=False)
        return _recorded(rows[0])

    async def supersede(self, group: str, topic: str, partition: int, counter: str, offset: int,
                        mutator: uuid.UUID, proposed_by: uuid.UUID) -> Recorded:
        rows = as_dicts(await self.client.execute(
            "UPDATE handovers SET offset = ?, mutator = ?, recorded_us = ?, recorded_by = ? WHERE consumer_group = ? "
            "AND cell = ? AND topic = ? AND partition = ? IF mutator = ? AND confirmed_us = null",
            [offset, mutator, time.time_ns() // 1000, self.recorded_by, group, counter, topic, partition,
             proposed_by], idempotent=False))
        if not rows or rows[0].get("[applied]"):
            return Recorded(offset, mutator, confirmed=False)
        return await self._read(group, topic, partition, counter)

    async def confirm(self, group: str, topic: str, partition: int, counter: str, mutator: uuid.UUID) -> Recorded:
        # Applied or not (a lost answer, another's proposal since), the row says what is recorded now.
        await self.client.execute(
            "UPDATE handovers SET confirmed_us = ? WHERE consumer_group = ? AND cell = ? AND topic = ? AND "
            "partition = ? IF mutator = ? AND confirmed_us = null",
            [time.time_ns() // 1000, group, counter, topic, partition, mutator], idempotent=False)
        return await self._read(group, topic, partition, counter)

    async def _read(self, group: str, topic: str, partition: int, counter: str) -> Recorded:
        rows = as_dicts(await self.client.execute(
            "SELECT offset, mutator, confirmed_us FROM handovers WHERE consumer_group = ? AND cell = ? AND topic = ? "
            "AND partition = ?", [group, counter, topic, partition],
            consistency=str(self.client.settings.serial_consistency)))
        if not rows:  # never: a hand-over row is not deleted while a consumer counts its counter
            raise RuntimeError(f"the hand-over of {counter} in {topic}/{partition} is gone")
        return _recorded(rows[0])

    async def confirmed(self, group: str, topic: str, partition: int, counters: Collection[str]) -> dict[str, int]:
        if not counters:
            return {}
        rows = as_dicts(await self.client.execute(
            "SELECT cell, offset, mutator, confirmed_us FROM handovers WHERE consumer_group = ? AND cell IN ? AND "
            "topic = ? AND partition = ?", [group, sorted(counters), topic, partition],
            consistency=self.client.settings.replay_read_consistency))
        return {row["cell"]: found.offset for row in rows if (found := _recorded(row)).confirmed}

    async def foreign(self, group: str, topic: str, partition: int, known: Collection[str]) -> list[str]:
        # A row per counter (and reprocess) and partition, found in each (group, cell) by its clustering key, at
        # the consistency of the protocol's deciding reads (a proposal acknowledged before this read is seen).
        # With 32 counters over 1,024 partitions, this read and learn_handovers' took 1.3 ms (p50) on the
        # development stack: reading the registry first, then only the rows of counters lacking, saved nothing.
        rows = as_dicts(await self.client.execute(
            "SELECT consumer_group, cell FROM handovers WHERE topic = ? AND partition = ? ALLOW FILTERING",
            [topic, partition], consistency=self.client.settings.replay_read_consistency))
        unknown = sorted({split_cell(row["cell"])[0] for row in rows if row["consumer_group"] == group}
                         - set(known))
        if not unknown:
            return []
        from countersink.registry import CounterRegistry

        gone = await CounterRegistry(self.client, self.client.settings.replay_read_consistency).refused(unknown)
        return [name for name in unknown if name not in gone]


def _recorded(row: Mapping[str, Any]) -> Recorded:
    """A row as the book holds it: one written by a command (no proposer) is confirmed as written."""
    mutator = row.get("mutator")
    return Recorded(int(row["offset"]), mutator, confirmed=mutator is None or row.get("confirmed_us") is not None)


async def record_handover(client: CassandraClient, group: str, cell: str, topic: str, partition: int, offset: int,
                          recorded_by: str) -> int:
    """Record ``offset`` as the hand-over of ``cell`` in the partition unless one is recorded, confirmed as
    written (a command's, no mutator's: a reprocess at its reset's point); return the one recorded (a retry
    after a lost answer finds its own)."""
    rows = as_dicts(await client.execute(
        "INSERT INTO handovers (consumer_group, cell, topic, partition, offset, recorded_us, recorded_by) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
        [group, cell, topic, partition, offset, time.time_ns() // 1000, recorded_by], idempotent=False))
    if not rows or rows[0].get("[applied]"):
        return offset
    return int(rows[0]["offset"])


class DeadLetterSink(Protocol):
    """What a backfill needs of :class:`consumer.dead_letters.DeadLetters`."""

    def queue(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None: ...
    async def send(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None: ...
    async def deliver(self) -> None: ...


class CounterDroppedDuringBackfillError(CountersinkError):
    """Raised before a backfill's write when the registry shows its counter dropped (or released) since it
    started: ``countersink drop`` deletes the counter's cells once every writer has looked, and a later write
    would bring them back."""


def registry_look(client: CassandraClient, counter: str, check_s: float) -> Callable[[], Awaitable[None]]:
    """A backfill's look at the registry before it writes, as a live consumer's: no write starts on a look
    older than half of ``check_s`` (the registry is read again then); raises
    :class:`CounterDroppedDuringBackfillError` once ``counter`` is dropped."""
    from countersink.registry import CounterRegistry

    registry = CounterRegistry(client, client.settings.replay_read_consistency)
    looked_at = [float("-inf")]

    async def look() -> None:
        if time.monotonic() - looked_at[0] < check_s / 2:
            return
        started = time.monotonic()
        refused = await registry.refused([counter])
        if counter in refused:
            raise CounterDroppedDuringBackfillError(refused[counter])
        # As old as the read's start, not its end: a read that took the request timeout (seconds) does not
        # make the look younger than it is (countersink drop waits out looks of registry_check_s at most).
        looked_at[0] = started

    return look


@dataclasses.dataclass(frozen=True)
class Handover:
    """One partition's hand-over of a cell, as recorded."""

    topic: str
    partition: int
    # The first offset the live mutators count; the backfill counts below it. None: a reprocess's plan whose
    # end is not recorded yet (its reset's point in the partition was not known when it was killed).
    offset: int | None
    start_offset: int | None  # where the backfill started (None: not fixed yet)
    finished_us: int | None
    reset_id: str | None = None  # a reprocess's: the reset it counts again after
    reprocess_from: str | None = None  # a reprocess's ``--from``


async def read_handovers(client: CassandraClient, group: str, cell: str) -> dict[tuple[str, int], Handover]:
    """Every confirmed hand-over of ``cell`` for the live ``group``, read at SERIAL (they are written by LWT)."""
    rows = as_dicts(await client.execute(
        "SELECT topic, partition, offset, mutator, confirmed_us, start_offset, finished_us, reset_id, reprocess_from "
        "FROM handovers WHERE consumer_group = ? AND cell = ?", [group, cell],
        consistency=str(client.settings.serial_consistency)))
    # A live mutator's proposal not confirmed yet is no hand-over: it may still be superseded (consumer.handovers).
    # A reprocess's plan (no proposer, its end perhaps not recorded yet) is kept: the command reads its offset.
    rows = [row for row in rows if row.get("mutator") is None or row.get("confirmed_us") is not None]
    return {(row["topic"], int(row["partition"])): Handover(
        row["topic"], int(row["partition"]), None if row.get("offset") is None else int(row["offset"]),
        None if row.get("start_offset") is None else int(row["start_offset"]),
        None if row.get("finished_us") is None else int(row["finished_us"]),
        row.get("reset_id"), row.get("reprocess_from")) for row in rows}


# A reprocess's plan rows of one cell share a partition of ``handovers``, so the whole plan is written by one
# conditional batch, each row on the condition it was read in: no plan is ever half one run's, half another's.
_PLAN_INSERT = (
    "INSERT INTO handovers (consumer_group, cell, topic, partition, offset, recorded_us, recorded_by, start_offset, "
    "finished_us, reset_id, reprocess_from, confirmed_us) VALUES (?, ?, ?, ?, null, ?, ?, ?, null, ?, ?, ?) "
    "IF NOT EXISTS")
_PLAN_OVERWRITE = (
    "UPDATE handovers SET offset = null, recorded_us = ?, recorded_by = ?, start_offset = ?, finished_us = null, "
    "reset_id = ?, reprocess_from = ?, confirmed_us = ? WHERE consumer_group = ? AND cell = ? AND topic = ? AND "
    "partition = ? IF reset_id = ? AND confirmed_us = null")
_PLAN_DELETE = (
    "DELETE FROM handovers WHERE consumer_group = ? AND cell = ? AND topic = ? AND partition = ? "
    "IF reset_id = ? AND confirmed_us = null")
# Rounds of read-then-write lost to other runs writing the same cell's plan before one gives up.
_PLAN_ROUNDS = 10


async def record_plan(client: CassandraClient, group: str, cell: str, starts: Mapping[tuple[str, int], int],
                      reset_id: str, reprocess_from: str, recorded_by: str, *, claimed_us: int | None = None
                      ) -> str | None:
    """Record a reprocess's plan (a row per partition: the reset it will be, whose epoch ``cell`` names,
    ``--from`` and where the backfill starts, with no end: :func:`fill_end` records it) before its reset is.
    Return None once recorded, or the id of the reset whose plan holds the cell (it took the epoch: nothing is
    written). A plan left by a run stopped before its reset was recorded is written over; so is one of a run
    planning the same epoch at the same time, which then loses the epoch. With ``claimed_us`` (the reset holds
    its epoch now), the plan is written again if such a run wrote over it meanwhile, and marked as claimed
    (``confirmed_us``): no later plan writes over it."""
    for _ in range(_PLAN_ROUNDS):
        rows = as_dicts(await client.execute(
            "SELECT topic, partition, reset_id, confirmed_us FROM handovers WHERE consumer_group = ? AND cell = ?",
            [group, cell], consistency=str(client.settings.serial_consistency)))
        held = {(row["topic"], int(row["partition"])): row for row in rows}
        claimed = {row.get("reset_id") for row in rows if row.get("confirmed_us") is not None}
        if claimed - {reset_id}:
            return str(min(claimed - {reset_id}, key=str))
        if claimed:
            return None  # ours, claimed: its answer lost, then asked again
        now_us = time.time_ns() // 1000
        batch: list[tuple[str, list[Any]]] = []
        for (topic, partition), start in sorted(starts.items()):
            row = held.get((topic, partition))
            if row is None:
                batch.append((_PLAN_INSERT, [group, cell, topic, partition, now_us, recorded_by, start, reset_id,
                                             reprocess_from, claimed_us]))
            else:
                batch.append((_PLAN_OVERWRITE, [now_us, recorded_by, start, reset_id, reprocess_from, claimed_us,
                                                group, cell, topic, partition, row.get("reset_id")]))
        for (topic, partition), row in sorted(held.items()):
            if (topic, partition) not in starts:
                batch.append((_PLAN_DELETE, [group, cell, topic, partition, row.get("reset_id")]))
        answer = as_dicts(await client.execute_batch(batch, idempotent=False))
        if not answer or answer[0].get("[applied]"):
            return None
    raise CountersinkError(f"the plan of {cell} kept changing under {_PLAN_ROUNDS} attempts to record it: another "
                           "reprocess of the counter is writing its own; run one at a time")


async def fill_end(client: CassandraClient, group: str, cell: str, topic: str, partition: int, end: int) -> int:
    """Record the end of a reprocess's span in a partition, once (a resumed run finds the first one's);
    return the end recorded."""
    rows = as_dicts(await client.execute(
        "UPDATE handovers SET offset = ? WHERE consumer_group = ? AND cell = ? AND topic = ? AND partition = ? "
        "IF offset = null", [end, group, cell, topic, partition], idempotent=False))
    if not rows or rows[0].get("[applied]") or rows[0].get("offset") is None:
        return end
    return int(rows[0]["offset"])


async def fix_start(client: CassandraClient, group: str, cell: str, topic: str, partition: int, start: int) -> int:
    """Record where the backfill of a partition starts, once (a later run resumes the same span, whatever
    retention or the clock say by then); return the start recorded."""
    rows = as_dicts(await client.execute(
        "UPDATE handovers SET start_offset = ? WHERE consumer_group = ? AND cell = ? AND topic = ? AND partition = ? "
        "IF start_offset = null", [start, group, cell, topic, partition], idempotent=False))
    if not rows or rows[0].get("[applied]") or rows[0].get("start_offset") is None:
        return start
    return int(rows[0]["start_offset"])


async def mark_finished(client: CassandraClient, group: str, cell: str, topic: str, partition: int) -> None:
    """Record the partition backfilled up to its hand-over (once: a second run keeps the first one's time)."""
    await client.execute(
        "UPDATE handovers SET finished_us = ? WHERE consumer_group = ? AND cell = ? AND topic = ? AND partition = ? "
        "IF finished_us = null", [time.time_ns() // 1000, group, cell, topic, partition], idempotent=False)


async def backfill_state(client: CassandraClient, counter: str, group: str | None, since: str | None,
                         epoch: int, reset_id: str | None = None) -> str | None:
    """What a reader is told of ``counter``'s backfill: None when none is under way (no ``since`` and no
    reprocess of its current ``epoch``, or every recorded hand-over finished), else one line. ``reset_id`` is
    the reset that made ``epoch``: a reprocess's plan for another reset (one that lost the epoch to it, or was
    killed before its reset was recorded) is no backfill of this epoch."""
    if group is None:
        return None
    cells = ([counter] if since is not None and epoch == 0 else []) + ([cell_name(counter, epoch)] if epoch else [])
    for cell in cells:
        try:
            found = await read_handovers(client, group, cell)
        except Exception:  # a keyspace made before backfills has no table: nothing to say
            return None
        if cell != counter and reset_id is not None:
            found = {where: h for where, h in found.items() if h.reset_id is None or h.reset_id == reset_id}
        if cell != counter or found or since is not None:
            done = sum(1 for h in found.values() if h.finished_us is not None)
            if not found and cell == counter:
                return (f"backfilling: no live consumer has recorded where it counts {counter} from yet "
                        f"(countersink backfill {counter})")
            if done < len(found):
                # A reprocess's cell is finished by running the reprocess again (backfill refuses it).
                since_from = next((h.reprocess_from for h in found.values() if h.reprocess_from), None)
                finish = (f"countersink reprocess {counter} --from {since_from}" if cell != counter and since_from
                          else f"countersink backfill {counter}")
                return (f"backfilling: {done} of {len(found)} partitions done; events before each hand-over offset "
                        f"are not all counted yet ({finish})")
    return None


async def counter_backfill(client: CassandraClient, counter: str) -> str | None:
    """What readers are told of ``counter``'s backfill (:func:`backfill_state`), from the counter registry and
    its resets; None when none is under way or the keyspace cannot say."""
    from countersink.registry import CounterRegistry
    from countersink.resets import read_resets

    try:
        row = await CounterRegistry(client).record(counter)
    except Exception:  # a keyspace made before the registry: nothing to say
        return None
    if row is None or row.get("definition") is None:
        return None
    since = registry.from_record(row["definition"]).since
    resets = await read_resets(client, counter)
    epoch = current_epochs(resets).all_keys.get(counter, 0)
    made = next((r.reset_id for r in resets if r.epoch == epoch), None)
    return await backfill_state(client, counter, row.get("consumer_group"), since, epoch, made)


async def _check_kept(source: RecordSource, span: Span, through: int, upto: int) -> None:
    """Raise :class:`RecordsLostError` when offsets from ``through`` + 1 up to ``upto`` (excluded, and the
    span's end at most) were deleted from the log: its start is past ``through`` + 1."""
    log_start = await source.log_start(span.topic, span.partition)
    if log_start > through + 1:
        raise RecordsLostError(span.topic, span.partition, through + 1, min(log_start, upto, span.end) - 1)


async def _apply(store: Store, mutator: Mutator, chunk: list[Record], span: Span, last_flush: float,
                 flush_interval_s: float, flush_max_dirty: int, on_progress: ProgressReport,
                 clock: Callable[[], int], tp: TopicPartition, before_write: Callable[[], Awaitable[None]],
                 dead_letters: DeadLetterSink | None) -> float:
    """Apply one chunk and flush when one is due; return when the last flush started (monotonic). Records the
    backfilled counter refuses are queued for ``dead_letters``, delivered before the flush that skips them."""
    await mutator.applier.learn(chunk)
    applied = mutator.apply_batch(chunk)
    if dead_letters is not None:
        for record, error in applied.invalid:
            if isinstance(error, CountersRefusedError):
                dead_letters.queue(tp, record, error)
    now = time.monotonic()
    if len(mutator.dirty) >= flush_max_dirty or now - last_flush >= flush_interval_s:
        await before_write()
        if dead_letters is not None:
            await dead_letters.deliver()
        await flush(store, mutator, clock())
        on_progress(span.topic, span.partition, span.first, mutator.flushed_through, span.end)
        return now
    return last_flush


ProgressReport = Callable[[str, int, int, int, int], None]  # topic, partition, first, applied through, end


@dataclasses.dataclass(frozen=True)
class Span:
    """One partition of a backfill: from ``first`` (its start offset, for a first run) up to ``end`` (its
    hand-over offset, excluded)."""

    topic: str
    partition: int
    first: int
    end: int


async def _write_anything() -> None:
    """The default look before a backfill's write: nothing forbids it."""


async def _pause(seconds: float) -> None:
    await pause_unless_stopped(seconds, None)


async def backfill_partition(store: Store, source: RecordSource, make_applier: Callable[[], Applier], span: Span,
                             group: str, host: str, *, flush_interval_s: float, flush_max_dirty: int,
                             on_progress: ProgressReport, clock: Callable[[], int] = lambda: time.time_ns() // 1000,
                             rotate_after_s: float = ROTATE_AFTER_S,
                             before_write: Callable[[], Awaitable[None]] = _write_anything,
                             dead_letters: DeadLetterSink | None = None,
                             pause: Callable[[float], Awaitable[object]] = _pause) -> int:
    """Count ``span`` of one partition with mutators of ``group`` (the backfill's), by the live protocol, and
    return where this run started in it. A run after a kill -9 claims the partition, replays the window the
    dead mutator left open and goes on from there; a run once the partition is done writes nothing.
    ``before_write`` is awaited before each flush and release: it raises to stop the run before it writes (the
    counter dropped meanwhile: :class:`CounterDroppedDuringBackfillError`). Records the backfilled counter refuses
    go to ``dead_letters`` (restricted to it), delivered before the window that skips them is recorded: below H
    the live consumers did not have the counter, or left its refusals to the backfill. A record refused whole
    is not: every live consumer dead-lettered it.

    Raises :class:`RecordsLostError` when records still to count were deleted from the log."""
    tp = TopicPartition(span.topic, span.partition)

    async def replayed_invalid(record: KafkaRecord, error: InvalidEventError) -> None:
        if dead_letters is not None and isinstance(error, CountersRefusedError):
            await dead_letters.send(tp, record, error)

    unresolved = 0
    next_pause = Backoff().pauses()
    while True:
        born = clock()
        entry = MutatorEntry(id=uuid.uuid4(), consumer_group=group, topic=span.topic, partition=span.partition,
                             host=host, born_us=born, expires_us=born + int(rotate_after_s * 2e6))
        try:
            claimed = await Claimant(entry, span.first - 1).claim(store)
        except ClaimUnresolvedError:
            unresolved += 1
            if unresolved >= _UNRESOLVED_CLAIMS:
                raise
            # That mutator is retired unused: a fresh one claims (consumer.protocol.Claimant), after a pause
            # growing as the live consumer's retries do, since what made this one late (a registration slower
            # than the GC's grace) may well make the next one late too.
            await pause(next_pause())
            continue
        unresolved = 0
        next_pause = Backoff().pauses()
        entry = claimed.new  # born later than asked when the partition's last writer's clock was ahead
        start = claimed.start_offset
        applier = make_applier()
        await record_start(store, claimed, (c.name for c in applier.counters.for_topic(span.topic)))
        await applier.warm_up(source, start)
        await finish_take_over(store, source, claimed, make_applier, clock, on_invalid=replayed_invalid)
        mutator = Mutator(entry, PartitionId(group, span.topic, span.partition), applier,
                          applied_through=start - 1, flushed_through=start - 1)
        if start < span.end:
            await _check_kept(source, span, start - 1, span.end)
        rotate_at = time.monotonic() + rotate_after_s
        last_flush = time.monotonic()
        while mutator.applied_through < span.end - 1 and time.monotonic() < rotate_at:
            # The reader jumps to the log start when retention deletes what it reads next (aiokafka resets an
            # out-of-range position): a chunk that starts past the next offset is checked against the log
            # start before it is applied (transaction markers leave such gaps too). The check reads Kafka,
            # which the open stream holds: the stream is closed first, and opened again after the chunk.
            skipped: list[Record] | None = None
            ended = False
            chunks = source.stream(span.topic, span.partition, mutator.applied_through + 1, span.end - 1)
            try:
                async for chunk in chunks:
                    if chunk[0].offset > mutator.applied_through + 1:
                        skipped = chunk
                        break
                    last_flush = await _apply(store, mutator, chunk, span, last_flush, flush_interval_s,
                                              flush_max_dirty, on_progress, clock, tp, before_write, dead_letters)
                    if time.monotonic() >= rotate_at:
                        break
                else:
                    ended = True
            finally:
                # Closed on a break too: the source holds its reader while a stream is open.
                close = getattr(chunks, "aclose", None)
                if close is not None:
                    await close()
            if skipped is not None:
                await _check_kept(source, span, mutator.applied_through, skipped[0].offset)
                last_flush = await _apply(store, mutator, skipped, span, last_flush, flush_interval_s,
                                          flush_max_dirty, on_progress, clock, tp, before_write, dead_letters)
            elif ended:
                await _check_kept(source, span, mutator.applied_through, span.end)
                mutator.skip_to(span.end)  # the offsets after the last record below H hold no record
        await before_write()
        if dead_letters is not None:
            await dead_letters.deliver()
        await release(store, mutator, clock())
        on_progress(span.topic, span.partition, span.first, mutator.flushed_through, span.end)
        if mutator.flushed_through >= span.end - 1:
            return start


__all__ = [
    "CassandraHandovers",
    "CounterDroppedDuringBackfillError",
    "Handover",
    "Span",
    "backfill_group",
    "backfill_partition",
    "backfill_state",
    "counter_backfill",
    "fill_end",
    "fix_start",
    "mark_finished",
    "read_handovers",
    "record_handover",
    "record_plan",
    "registry_look",
]
