"""The hot path: records of one partition turned into in-memory state updates by one mutator.

:class:`RetryWindow` drops publisher retries, :class:`Applier` routes records and asks the window,
:class:`Mutator` holds the states one flush writes. Nothing here does I/O but :meth:`Applier.warm_up`, which
reads the records before a start offset through a :class:`RecordSource`; the flush/takeover protocol that
writes these states is ``consumer.protocol``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from consumer.resetting import NO_RESETS, ResetBook
from consumer.storage import MutatorEntry, PartitionId
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.retry import is_retriable
from schemas import formats, timeseries
from schemas.definitions import CounterSet
from schemas.errors import CountersinkError, CountersRefusedError, InvalidEventError, UndecidableRecordError
from schemas.events import EventRouter, Update, apply_updates, restricted
from schemas.fast_route import APPLIED, DUPLICATE, FastRoute, Row, refusals
from schemas.kinds import KINDS, State, new_state
from schemas.kinds.base import KindSpec
from schemas.resets import Epochs, ForgedControlError, Reset, ResetPosition, control_reset_id

# What one event id held in the publisher-retry window costs beside its string: about 75 bytes of dict slot and
# record number (tracemalloc, 100k UUID ids pushed into a RetryWindow; a UUID's string is 85 more).
RETRY_ID_BYTES = 75
# How many of the newest ids of each dict of the window give the mean size of its strings.
RETRY_ID_SAMPLE = 16
# What one row of the batch path costs (one per key value a mutator has seen, whatever the number of counters
# sharing it): the row, its list of states and its entry in the row cache (tracemalloc, 100k keys, three
# counters).
ROW_BYTES = 250
# What one measured sketch size costs: its dict slot and int.
MEASURED_BYTES = 80
# What one instance costs beyond its state and its row, plus its key's length (keys are up to max_key_bytes, so
# a constant would miss most of a long one): its (counter, key) identity, the key's string, its slots in
# ``states`` and ``dirty`` (resident memory of 200,000 instances of two counters, keys of 12 and 990 bytes:
# see test_mutator_memory). A key shared by several counters of one row is charged once per counter: on the
# high side.
INSTANCE_BYTES = 300
# Kinds whose states grow as they fill; the others keep the size they have when new.
GROWING_KINDS = frozenset({"distinct", "quantiles", "top_k"})


def instance_bytes(key: str) -> int:
    return INSTANCE_BYTES + len(key)


class KafkaRecord(Protocol):
    """What the protocol reads of a record: a :class:`Record`, or the Kafka client's own, as it comes."""

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp(self) -> int | None: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class Record(NamedTuple):
    """One Kafka record of the partition a mutator consumes."""

    offset: int
    value: bytes | None
    timestamp: int | None = None  # the record's Kafka timestamp, ms (retention decides lateness by it)
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()


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
    CONTROL = "control"  # a control record of a recorded reset (schemas.resets): applied in log order


class ResetNotLearnedError(CountersinkError):
    """Raised when a control record is classified before :meth:`Applier.learn` looked its reset up: a bug in
    the caller, never decided by guess (a guess could differ from a replay's)."""


class RetryWindow:
    """Event ids of the last ``size`` records of one partition, to drop publisher retries.

    A pure function of the partition's log: whether record ``o`` is a repeat depends only on the ``size``
    records before it. So a replay, or a successor that rebuilds the window by re-reading those records,
    decides exactly as the original mutator did.

    Each id maps to the number of the last record that carried it, in one dict per counter (records are
    numbered as they are pushed, so gaps in Kafka offsets do not matter). The dicts come in two generations
    of ``size`` records each: every ``size`` records the older generation is dropped whole and a new one
    begun, in O(1), so at most the ids of ``2 × size`` records are held. An id in the current generation is
    within the window; one found only in the previous generation is if its record number says so.

    Counters that read the same event-id field under the same filter see the same ids in the same records,
    so :meth:`share` lets them keep one dict: one look-up per record instead of one per counter. An id is
    recorded there once any of them counts its record. Each counter decides for itself, so one of them may
    have counted a record that another skipped or refused; a retry is the same bytes, decided alike, so it is
    dropped by those that counted the original and refused again by the others. A re-published dead letter
    (``countersink.apply-to``) is the exception: the counters it names did not count the original, so it is
    checked and recorded against each counter's own ids (``own``), never against its group's.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._pushed = 0  # records pushed so far; the next record is number _pushed
        # ids key (a counter, or the key its group shares) -> event id -> number of its last record
        self._current: dict[str, dict[str, int]] = {}
        self._previous: dict[str, dict[str, int]] = {}
        self._shared: dict[str, str] = {}  # counter -> the ids key of its group, for groups of two or more
        self._decided: dict[str, bool] = {}  # shared ids key -> its decision for the record being admitted

    def share(self, groups: dict[str, str]) -> None:
        """Let counters mapped to the same key keep one dict of ids (before any record is pushed)."""
        sizes: dict[str, int] = {}
        for key in groups.values():
            sizes[key] = sizes.get(key, 0) + 1
        self._shared = {counter: key for counter, key in groups.items() if sizes[key] > 1}

    def seen(self, counter: str, event_id: str) -> bool:
        key = self._shared.get(counter, counter)
        if event_id in self._current.get(key, {}):
            return True
        at = self._previous.get(key, {}).get(event_id)
        return at is not None and at >= self._pushed - self.size

    def push(self, ids: tuple[tuple[str, str], ...]) -> None:
        """Record one record's ids (possibly none)."""
        if self.size <= 0:
            return
        for counter, event_id in ids:
            self._ids_of(self._shared.get(counter, counter))[event_id] = self._pushed
        self.advance()

    def fresh(self, counter: str, event_id: str, own: bool = False) -> bool:
        """Whether ``event_id`` was not seen within the window, for one update of the record being admitted;
        records it. Call :meth:`advance` once the record's updates are all admitted. ``own``: among the ids
        of this counter alone, not of its group."""
        if self.size <= 0:
            return True
        key = counter if own else self._shared.get(counter, counter)
        if key is not counter:
            decided = self._decided.get(key)
            if decided is not None:
                return decided  # a counter of the same group has looked this record's id up already
        current = self._current.get(key)
        if current is None:
            current = self._ids_of(key)
        if event_id in current:
            fresh = False
        else:
            previous = self._previous.get(key)
            at = None if previous is None else previous.get(event_id)
            fresh = at is None or at < self._pushed - self.size
        current[event_id] = self._pushed
        if key is not counter:
            self._decided[key] = fresh
        return fresh

    def admit(self, updates: list[Update], own: bool = False) -> list[Update]:
        """The updates of one record whose event id was not seen within the window; records their ids.
        The same as :meth:`seen` for each update, then :meth:`push` of their ids, in one pass. ``own``: for
        a re-published dead letter, each counter's own ids (:meth:`fresh`)."""
        if self.size <= 0:
            return updates
        fresh = [update for update in updates if update.event_id is None or self.fresh(update.counter,
                                                                                      update.event_id, own)]
        self.advance()
        return fresh

    def advance(self) -> None:
        """The record being admitted is done: the next one gets the next number."""
        if self.size <= 0:
            return
        if self._decided:
            self._decided.clear()
        self._pushed += 1
        if self._pushed % self.size == 0:
            self._previous, self._current = self._current, {}

    def ids_held(self) -> int:
        return sum(len(ids) for ids in self._current.values()) + sum(len(ids) for ids in self._previous.values())

    def bytes_held(self) -> int:
        """About what the ids held take: each its dict slot and record number, and its string, of the mean size
        of the newest ids of its dict (ids may be anything up to max_key_bytes long, and each counter's, or
        group's, its own length: a fixed size per id was a seventh of what ids near that limit take)."""
        held = 0
        for ids in (*self._current.values(), *self._previous.values()):
            if ids:
                sample = list(itertools.islice(reversed(ids), RETRY_ID_SAMPLE))
                held += len(ids) * (RETRY_ID_BYTES + sum(map(sys.getsizeof, sample)) // len(sample))
        return held

    def _ids_of(self, key: str) -> dict[str, int]:
        return self._current.setdefault(key, {})


@dataclasses.dataclass
class Applier:
    """Turns records into updates of in-memory states: routing, publisher-retry dropping, applying."""

    router: EventRouter
    counters: CounterSet
    topic: str
    partition: int
    window: RetryWindow
    resets: ResetBook = NO_RESETS
    # Counters counted only from an offset on (counter -> the first offset it counts): the live mutators count
    # each counter from its hand-over offset (consumer.handovers), a backfill below it (countersink.backfills).
    starts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # A backfill's counter: the only one whose updates are kept. Records are still routed with every counter
    # of the topic, so that the publisher-retry window decides exactly as the live mutators' does.
    only: frozenset[str] | None = None
    # The epochs to start from instead of those recorded at the start offset: a reprocess counts what comes
    # before its reset's point into the reset's epoch.
    epochs_from: Epochs | None = None
    # The epochs of the instances at the point applied (schemas.resets), and the resets looked up by id.
    epochs: Epochs = dataclasses.field(default_factory=Epochs, init=False)
    known: dict[str, Reset | None] = dataclasses.field(default_factory=dict, init=False)
    # The topic's fast path (None: every record takes the router). Built from the router's limits.
    fast: FastRoute | None = dataclasses.field(default=None, init=False)
    # JSON Schema topics whose records are not checked: a record's value to the JSON text the fast path reads
    # (None: the record takes the router); schemas.formats.json_text_reader.
    transcode: Callable[[bytes], bytes | None] | None = dataclasses.field(default=None, init=False)
    # The other Avro, Protobuf and JSON Schema topics: a record's value to the fields the fast path reads
    # (None: the record takes the router); schemas.formats.converter says why that decides as the router does.
    convert: Callable[[bytes], object] | None = dataclasses.field(default=None, init=False)
    # Per counter of the topic: a function making its new state (new_state's), and that state's size.
    made: dict[str, tuple[Callable[[], State], int]] = dataclasses.field(default_factory=dict, init=False)
    # The topic's counters kept for a while (retain): only their instances have an expiry.
    retained: frozenset[str] = dataclasses.field(default=frozenset(), init=False)
    # The topic's counters whose states grow as they fill (GROWING_KINDS): only theirs are measured again.
    growing: frozenset[str] = dataclasses.field(default=frozenset(), init=False)
    # Records below this offset take the reference path (:meth:`classify`), which keeps ``starts``.
    slow_below: int = dataclasses.field(default=-1, init=False)

    def __post_init__(self) -> None:
        router = self.router
        self.slow_below = max(self.starts.values(), default=-1)
        if self.epochs_from is not None:
            self.epochs = self.epochs_from.copy()
        for definition in self.counters.for_topic(self.topic):
            spec = definition.spec
            self.made[definition.name] = (functools.partial(KINDS[spec.kind].new, spec), _size_when_new(spec))
        self.retained = frozenset(c.name for c in self.counters.for_topic(self.topic) if c.retain is not None)
        self.growing = frozenset(c.name for c in self.counters.for_topic(self.topic) if c.kind in GROWING_KINDS)
        self.fast = FastRoute.build(self.counters, self.topic, router.max_event_bytes, router.max_depth,
                                    router.max_key_bytes, router.max_future_skew_s, router.on_not_applicable,
                                    self.partition, router.on_late)
        decode = router.decoder_of(self.topic)
        if self.only is not None:
            self.fast = None  # a backfill keeps one counter's updates: the reference path drops the others'
        if decode is not None and self.fast is not None:
            if not self.fast.decimals:
                # JSON text the fast path reads as the router's parser does (with exact decimals, the record's
                # parser is the schema's: its fields are read as it read them, below)
                self.transcode = formats.json_text_reader(decode, router.max_event_bytes)
            if self.transcode is None:
                self.convert = formats.converter(formats.projecting(decode), router.max_event_bytes,
                                                 router.max_depth, self.fast.fields_of, self.fast.top_names)
        self.window.share({c.name: f"{c.event_id}|{sorted(c.where.items())!r}"
                           for c in self.counters.for_topic(self.topic) if c.event_id is not None})

    def classify(self, record: KafkaRecord) -> tuple[Outcome, list[Update], InvalidEventError | None]:
        """Route one record and drop repeats; pushes its ids into the window. No state is touched.

        The error, when not None, is for the dead-letter topic: the whole event's (outcome INVALID), or a
        :class:`CountersRefusedError` naming the counters that refused it, beside the updates of those that
        accepted it (outcome APPLIED or DUPLICATE; INVALID when none applies it).

        A control record (``schemas.resets``) is no event: outcome CONTROL for one of a recorded reset of a
        counter on this topic (:meth:`control_reset` names it), FILTERED for a recorded reset of a counter
        these definitions do not keep, INVALID with a :class:`ForgedControlError` for one naming no recorded
        reset. It takes its place in the retry window as a record without ids, whatever it is."""
        if record.headers:
            reset_id = control_reset_id(record.headers)
            if reset_id is not None:
                self.window.push(())
                if self._reset_named(reset_id) is not None:
                    return Outcome.CONTROL, [], None
                if reset_id and self.known.get(reset_id) is not None:
                    return Outcome.FILTERED, [], None  # a recorded reset of a counter this consumer does not keep
                return Outcome.INVALID, [], ForgedControlError(
                    "", f"control record {reset_id!r} names no recorded reset of a counter on {self.topic}")
        try:
            decision = self.router.decide_record(self.topic, record.value or b"", record.timestamp, record.key,
                                                 record.headers, self.partition)
        except InvalidEventError as exc:
            self.window.push(())
            return Outcome.INVALID, [], exc.with_traceback(None)  # kept for the dead letter, without its frames
        except Exception as exc:
            if isinstance(exc, MemoryError) or is_retriable(exc):
                raise  # the process's or a server's: not the record's
            self.window.push(())
            return Outcome.INVALID, [], _undecidable(self.topic, self.partition, record.offset, exc)
        updates, refusals = decision.updates, decision.refusals
        # The window first, from every update: it must decide as an unrestricted mutator's would.
        fresh = self.window.admit(updates, bool(record.headers) and restricted(record.headers))
        if self.only is not None or record.offset < self.slow_below:  # else every counter counts the record
            counts = self.counts
            updates = [u for u in updates if counts(u.counter, record.offset)]
            fresh = [u for u in fresh if counts(u.counter, record.offset)]
            refusals = [r for r in refusals if r.counter is None or counts(r.counter, record.offset)]
            if self.epochs_from is not None:
                # A reprocess counts into its reset's epoch only: an instance a later reset of the counter moved
                # on (its control record before the reprocess's point) is counted there by the live mutators.
                kept = self.in_reprocessed_epoch
                updates = [u for u in updates if kept(u.counter, u.key)]
                fresh = [u for u in fresh if kept(u.counter, u.key)]
        error = CountersRefusedError(tuple(refusals)) if refusals else None
        if not updates:
            return (Outcome.FILTERED if error is None else Outcome.INVALID), [], error
        if not fresh:
            return Outcome.DUPLICATE, [], error
        return Outcome.APPLIED, fresh, error

    def start_counting(self, starts: Mapping[str, int]) -> None:
        """Count each of ``starts``' counters only from its offset on (its hand-over): set before any record
        is applied."""
        self.starts = dict(starts)
        self.slow_below = max(self.starts.values(), default=-1)

    def counts(self, counter: str, offset: int) -> bool:
        """Whether this applier counts ``counter``'s update of the record at ``offset``: a counter's hand-over is
        where the live mutators start counting it (and, with ``since``, where its backfill stops)."""
        return (self.only is None or counter in self.only) and offset >= self.starts.get(counter, -1)

    def in_reprocessed_epoch(self, counter: str, key: str) -> bool:
        """Whether the instance is still in the epoch a reprocess counts into (``epochs_from``)."""
        assert self.epochs_from is not None
        return self.epochs.epoch(counter, key) == self.epochs_from.epoch(counter, key)

    def _reset_named(self, reset_id: str) -> Reset | None:
        if reset_id and reset_id not in self.known:
            raise ResetNotLearnedError(f"reset {reset_id!r} was not looked up before its control record applied")
        reset = self.known.get(reset_id) if reset_id else None
        if reset is None or reset.counter not in self.counters or not any(
                c.name == reset.counter for c in self.counters.for_topic(self.topic)):
            return None
        return reset

    def kept_elsewhere(self, record: KafkaRecord) -> Reset | None:
        """The recorded reset a control record names when these definitions do not keep its counter (the record
        is FILTERED): None for any other record."""
        reset_id = control_reset_id(record.headers) if record.headers else None
        if not reset_id or self._reset_named(reset_id) is not None:
            return None
        return self.known.get(reset_id)

    def control_reset(self, record: KafkaRecord) -> Reset:
        """The reset of a record :meth:`classify` found CONTROL."""
        reset = self._reset_named(control_reset_id(record.headers) or "")
        assert reset is not None
        return reset

    async def learn(self, records: Iterable[KafkaRecord]) -> None:
        """Look up the resets that control records among ``records`` name, before they are classified."""
        wanted = [reset_id for record in records if record.headers
                  for reset_id in (control_reset_id(record.headers),)
                  if reset_id and reset_id not in self.known]
        if wanted:
            self.known.update(await self.resets.look_up(list(dict.fromkeys(wanted))))

    def expires_at(self, counter: str, key: str) -> int | None:
        """When the instance's bucket reaches the end of its retention; None for a counter kept forever."""
        definition = self.counters[counter]
        return None if definition.retain is None else timeseries.expiry(definition, key)

    async def warm_up(self, source: RecordSource, before: int) -> None:
        """Rebuild the retry window from the last ``size`` records before offset ``before``: the window the
        partition's previous owner had there. Records, not offsets: a window rebuilt from the last ``size``
        offsets of a log with gaps (transactions, compaction) would hold fewer records, and let through a
        retry the previous owner dropped. Also learns the epochs of the instances at ``before``: every reset
        recorded as sitting below it."""
        if self.epochs_from is not None:
            self.epochs = self.epochs_from.copy()
        else:
            self.epochs = await self.resets.epochs_at(self.topic, self.partition,
                                                      [c.name for c in self.counters.for_topic(self.topic)], before)
        if self.window.size <= 0 or before <= 0:
            return
        records = await source.read_back(self.topic, self.partition, before, self.window.size)
        await self.learn(records)
        for record in records:
            self.classify(record)


log = get_logger(__name__)

# At most one ``record_undecidable`` line with its traceback per kind of error and minute: the records are dead
# letters (each with its reason), and a defect met by a stream of them must not flood the log.
_UNDECIDABLE_SAID: dict[str, float] = {}


def _undecidable(topic: str, partition: int, offset: int, exc: Exception) -> UndecidableRecordError:
    """The dead letter's error for a record whose decision raised ``exc`` (a defect), said in the log."""
    kind = type(exc).__name__
    METRICS.undecidable.labels(topic).inc()
    now = time.monotonic()
    if now - _UNDECIDABLE_SAID.get(kind, -60.0) >= 60.0:
        _UNDECIDABLE_SAID[kind] = now
        log.error("record_undecidable", topic=topic, partition=partition, offset=offset, error=repr(exc)[:500],
                  exc_info=exc)
    return UndecidableRecordError("", f"deciding it raised {kind}: {str(exc)[:200]} (a defect of countersink's: "
                                      "re-publish it once fixed)")


@dataclasses.dataclass
class BatchApplied:
    """What :meth:`Mutator.apply_batch` did: records applied, dropped as publisher retries, and invalid (each
    with its error, for the dead-letter topic)."""

    applied: int = 0
    duplicates: int = 0
    invalid: list[tuple[KafkaRecord, InvalidEventError]] = dataclasses.field(default_factory=list)

    def count(self, record: KafkaRecord, outcome: Outcome, error: InvalidEventError | None) -> None:
        if outcome is Outcome.APPLIED:
            self.applied += 1
        elif outcome is Outcome.DUPLICATE:
            self.duplicates += 1
        if error is not None:  # refused as a whole, or by some of its counters
            self.invalid.append((record, error))


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
    # (cell, key) in the GC's work list already (a cell: schemas.resets.cell_name)
    recorded: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    state_bytes: int = 0
    instance_bytes: int = 0  # what the instances held cost beyond their states (:func:`instance_bytes`)
    # The window a flush attempt may have opened without finishing its writes (its LWT can apply even when
    # the caller sees a timeout); the next attempt reads the row to learn what happened.
    window_seq: int | None = None
    # False from the moment a flush may open a window until that window is recorded complete, by the next
    # flush's LWT or, when nothing new comes first, by commit_window alone.
    window_committed: bool = True
    fenced: bool = False
    retiring: bool = False  # release has committed and is retiring it: it must never flush again
    released: bool = False
    # The fast path's rows (per key group: key value -> the states of that key), holding the same state
    # objects as ``states``. Valid because ``states`` only ever grows, by this mutator's own applying.
    rows: list[dict[object, Row]] | None = None
    # The size last measured of each sketch state written (sketches grow as they fill; the other kinds keep
    # their size when new), so that a flush re-measures what it wrote instead of every state it holds.
    measured: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    # Where resets applied since the last flush sit: recorded by the flush before it opens its window.
    positions: list[ResetPosition] = dataclasses.field(default_factory=list)

    @property
    def id(self) -> uuid.UUID:
        return self.entry.id

    def cell(self, counter: str, key: str) -> str:
        """The name of the cell this mutator writes (counter, key)'s state in: its epoch's."""
        return self.applier.epochs.cell(counter, key)

    def reset(self, reset: Reset, offset: int) -> None:
        """Apply a control record of ``reset`` at ``offset``: drop the states it covers (they are never written
        again: their epoch is over) and write those instances in the reset's epoch from here on. A second
        control record of a reset applied already changes nothing."""
        epochs = self.applier.epochs
        if (reset.counter, reset.epoch) in epochs.applied:
            return
        for ident in [i for i in self.states if epochs.clears(reset, *i)]:
            self.state_bytes -= self._counted(ident, self.states.pop(ident))
            self.measured.pop(ident, None)
            self.instance_bytes -= instance_bytes(ident[1])
            self.dirty.discard(ident)
        self.rows = None  # the fast path's rows held the dropped states: rebuilt from ``states``
        epochs.apply(reset)
        self.positions.append(ResetPosition(reset.reset_id, reset.counter, reset.epoch, self.applier.topic,
                                            self.applier.partition, offset))

    def note_position(self, record: KafkaRecord) -> None:
        """Where a control record of a counter these definitions do not keep sits: recorded all the same (by the
        next flush, before its window opens). A successor whose definitions have the counter (a rolling deploy,
        a counter added with a backfill) learns the instances' epochs at its start from the recorded positions
        alone: without this one it would count the instances the reset covers into the epoch before it, which
        no reader reads."""
        reset = self.applier.kept_elsewhere(record)
        if reset is not None and not any(p.reset_id == reset.reset_id for p in self.positions):
            self.positions.append(ResetPosition(reset.reset_id, reset.counter, reset.epoch, self.applier.topic,
                                                self.applier.partition, record.offset))

    def apply(self, record: KafkaRecord) -> tuple[Outcome, InvalidEventError | None]:
        """Apply one record of this partition, in offset order. Records at or below what is applied are
        ignored (a redelivery after a seek)."""
        if record.offset <= self.applied_through:
            return Outcome.FILTERED, None
        outcome, updates, error = self.applier.classify(record)
        if outcome is Outcome.CONTROL:
            self.reset(self.applier.control_reset(record), record.offset)
        elif outcome is Outcome.FILTERED and record.headers:
            self.note_position(record)
        if updates:
            states = self.states
            self.instance_bytes += sum(instance_bytes(u.key) for u in updates if (u.counter, u.key) not in states)
            self.state_bytes += apply_updates(states, updates, self.applier.counters, self.dirty)
        self.applied_through = record.offset
        return outcome, error

    def apply_batch(self, records: Sequence[KafkaRecord]) -> BatchApplied:
        """Apply a batch of this partition's records, in offset order: the same states, dirty set, window and
        outcomes as :meth:`apply` on each record in turn (``tests/unit/test_fast_route.py`` holds them
        equal), with the per-record work of the topic's fast path. Records it does not accept take
        :meth:`apply`, in their place. Nothing here awaits: a flush sees a batch wholly or not at all."""
        applier = self.applier
        fast = applier.fast
        result = BatchApplied()
        if fast is None:
            for record in records:
                result.count(record, *self.apply(record))
            return result
        rows = self.rows
        if rows is None:
            rows = self.rows = fast.new_rows()
        window, states = applier.window, self.states
        apply_event, fresh, advance = fast.apply_event, window.fresh, window.advance
        transcode, convert, apply_fields = applier.transcode, applier.convert, fast.apply_fields
        touched: list[Row] = []

        made = applier.made

        def create(row: Row, index: int) -> State:
            ident = row.idents[index]
            state = states.get(ident)
            if state is None:
                make, size = made[ident[0]]
                state = states[ident] = make()
                self.state_bytes += size
                self.instance_bytes += instance_bytes(ident[1])
            row.states[index] = state
            return state

        def mark_touched() -> None:
            dirty = self.dirty
            for row in touched:
                bits, idents = row.touched, row.idents
                if bits == (1 << len(idents)) - 1:  # every counter of the row: the common case
                    dirty.update(idents)
                else:
                    index = 0
                    while bits:
                        if bits & 1:
                            dirty.add(idents[index])
                        bits >>= 1
                        index += 1
                row.touched = 0
            touched.clear()

        applied = duplicates = 0
        try:
            for record in records:
                offset = record.offset
                if offset <= self.applied_through:
                    continue
                if offset < applier.slow_below:
                    # Below a hand-over offset: the reference path counts only the counters that start there.
                    mark_touched()
                    result.count(record, *self.apply(record))
                    continue
                if record.headers and control_reset_id(record.headers) is not None:
                    # A control record: what was applied so far is marked dirty before it may drop states, and
                    # the rows (holding the states it may drop) are rebuilt after it.
                    mark_touched()
                    result.count(record, *self.apply(record))
                    if self.rows is None:
                        rows = self.rows = fast.new_rows()
                    continue
                if record.headers and restricted(record.headers):
                    # restricted to some counters (a re-published dead letter): the router decides it
                    result.count(record, *self.apply(record))
                    continue
                raw = record.value or b""
                if convert is not None:
                    fields = convert(raw)
                    outcome = None if fields is None else apply_fields(fields, record.timestamp, record.key,
                                                                        record.headers, rows, fresh, touched, create)
                else:
                    if transcode is not None:
                        json_text = transcode(raw)
                        if json_text is None:
                            result.count(record, *self.apply(record))
                            continue
                        raw = json_text
                    outcome = apply_event(raw, record.timestamp, record.key, record.headers, rows, fresh, touched,
                                          create)
                if outcome == APPLIED:
                    applied += 1
                elif outcome is None:
                    result.count(record, *self.apply(record))
                    continue
                elif outcome == DUPLICATE:
                    duplicates += 1
                elif type(outcome) is tuple:
                    # some counters refused it (a field of the wrong type, out of range), the others decided
                    outcome, refused = outcome
                    result.invalid.append((record, refusals(refused)))
                    if outcome == APPLIED:
                        applied += 1
                    elif outcome == DUPLICATE:
                        duplicates += 1
                advance()
                self.applied_through = offset
        finally:
            result.applied += applied
            result.duplicates += duplicates
            mark_touched()
        return result

    def skip_to(self, position: int) -> None:
        """Every offset below ``position`` that held a record has been given to :meth:`apply`: the offsets
        between the last record and ``position`` are transaction markers, aborted or compacted records.
        Counting them as applied lets a flush commit past them, so a quiet transactional partition reads as
        caught up (no lag), and a successor does not start on a marker."""
        if position - 1 > self.applied_through:
            self.applied_through = position - 1

    def remeasure(self, written: Iterable[tuple[str, str]]) -> None:
        """Bring the memory estimate up to date for states just written: each sketch's growth since it was
        last measured (its size when new, the first time)."""
        growing, states = self.applier.growing, self.states
        for ident in written:
            if ident[0] not in growing:
                continue
            state = states[ident]
            size = state.size_bytes()
            self.state_bytes += size - self._counted(ident, state)
            self.measured[ident] = size

    def _counted(self, ident: tuple[str, str], state: State) -> int:
        """What the estimate holds for the state of ``ident``: a sketch's size when last measured (its size when
        new before that; it may have grown since), the other kinds' size (theirs never changes)."""
        measured = self.measured.get(ident)
        if measured is not None:
            return measured
        spec = self.applier.counters[ident[0]].spec
        return _size_when_new(spec) if spec.kind in GROWING_KINDS else state.size_bytes()

    def needs_flush(self) -> bool:
        return bool(self.dirty) or self.applied_through > self.flushed_through

    def memory_bytes(self) -> int:
        """An estimate of the memory held: states (refreshed at each flush, sketches grow as they fill), the
        batch path's rows, and the event ids of the publisher-retry window."""
        rows = 0 if self.rows is None else sum(len(cache) for cache in self.rows)
        return (self.state_bytes + self.instance_bytes + rows * ROW_BYTES + len(self.measured) * MEASURED_BYTES
                + self.applier.window.bytes_held())


@functools.lru_cache(maxsize=1024)
def _size_when_new(spec: KindSpec) -> int:
    return new_state(spec).size_bytes()


__all__ = [
    "INSTANCE_BYTES", "RETRY_ID_BYTES", "ROW_BYTES", "Applier", "BatchApplied", "KafkaRecord", "Mutator", "Outcome",
    "Record", "RecordSource", "RecordsLostError", "RetryWindow", "instance_bytes",
]
