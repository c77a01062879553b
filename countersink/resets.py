"""Resets in Cassandra (``schemas.resets``): the rows, their positions in partitions, and the reset itself.

:class:`CassandraResets` is the consumer's :class:`~consumer.resetting.ResetBook`; :func:`reset_counter` is
what ``countersink reset`` runs: record the reset (a new epoch, by LWT), publish a control record to every
partition of the counter's topics, record where each landed.
"""

from __future__ import annotations

import asyncio
import getpass
import re
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import make_producer, topic_partitions
from countersink.logs import get_logger
from countersink.retry import pause_unless_stopped
from countersink.settings import Consistency, KafkaSettings
from schemas import timeseries
from schemas.definitions import CounterDefinition
from schemas.errors import CountersinkError
from schemas.resets import (
    Epochs,
    Reset,
    ResetPosition,
    control_record,
    current_epochs,
    epochs_at,
    new_reset_id,
    row_of_reset_id,
    superseding,
)

log = get_logger(__name__)

T = TypeVar("T")
MAX_RESET_KEYS = 1000  # keys one reset may name: its row and each control record stay small
# How long ``serve`` answers from a counter's epochs read before (EpochsCache), counted from when that read was
# sent; a reset returns only RESET_SETTLE_S after it was recorded, so a read made once it has returned knows it
# (twice the time: a margin for the machines' clocks ticking at slightly different rates).
EPOCHS_KEPT_S = 0.5
RESET_SETTLE_S = 2 * EPOCHS_KEPT_S
_EPOCHS_KEPT_COUNTERS = 10_000  # counters whose epochs one cache keeps (beyond it, it starts over)


def reset_of(row: dict[str, Any]) -> Reset:
    return Reset(row["id"], row["counter"], int(row["epoch"]), frozenset(row.get("keys") or ()),
                 tuple(sorted((row.get("partitions") or {}).items())))


_TABLE_SEEN = "_countersink_resets_table_seen"
_TABLE_MISSED = "_countersink_resets_table_missed_at"
# A keyspace without the resets table is asked again at most this often (not on every read): the table
# appears when ``countersink schema`` runs, and a reader sees resets at most this long after that.
NO_TABLE_RECHECK_S = 1.0


async def _table_exists(client: CassandraClient) -> bool:
    """Whether the keyspace has the ``resets`` table (one made before resets has none until ``countersink
    schema`` runs: it has no resets either). Once seen, remembered for the client; not seen, remembered for
    :data:`NO_TABLE_RECHECK_S`."""
    if getattr(client, _TABLE_SEEN, False):
        return True
    missed_at = getattr(client, _TABLE_MISSED, None)
    if missed_at is not None and time.monotonic() - missed_at < NO_TABLE_RECHECK_S:
        return False
    found = as_dicts(await client.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = 'resets'",
        [client.keyspace], consistency=Consistency.ONE))
    if found:
        setattr(client, _TABLE_SEEN, True)
    else:
        setattr(client, _TABLE_MISSED, time.monotonic())
    return bool(found)


async def read_resets(client: CassandraClient, counter: str, consistency: Consistency | None = None) -> list[Reset]:
    """Every recorded reset of ``counter`` (one single-partition read)."""
    if not await _table_exists(client):
        return []
    rows = as_dicts(await client.execute(
        "SELECT counter, epoch, id, keys, partitions FROM resets WHERE counter = ?", [counter],
        consistency=consistency or client.settings.read_consistency))
    return [reset_of(row) for row in rows]


async def read_epochs(client: CassandraClient, counter: str) -> Epochs:
    """The epochs readers use for ``counter``: every recorded reset of it, read at the replay read consistency
    (whatever serving reads at): it overlaps the reset's write, so a read made once ``countersink reset`` has
    returned knows the reset."""
    return current_epochs(await read_resets(client, counter, client.settings.replay_read_consistency))


class EpochsCache:
    """Each counter's epochs (:func:`read_epochs`) read at most once per ``kept_s``, measured from when the read
    was sent: a read of an instance costs one request, not two. A reset is known within ``kept_s`` of being
    recorded, and :func:`reset_counter` returns only :data:`RESET_SETTLE_S` after recording it, so a read made
    once a reset has returned knows it, as one that reads the epochs every time does. Callers that miss while a
    read of the same counter is in flight, sent less than ``kept_s`` ago, wait for it instead of sending
    another (what they get is as fresh as what they would have kept): expiry under load costs one read."""

    def __init__(self, client: CassandraClient, kept_s: float = EPOCHS_KEPT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._kept_s = kept_s
        self._clock = clock
        self._known: dict[str, tuple[float, Epochs]] = {}
        self._in_flight: dict[str, tuple[float, asyncio.Future[Epochs]]] = {}

    def kept(self, counter: str, within_s: float = 0.0) -> Epochs | None:
        """The epochs of ``counter`` kept from a read sent less than ``kept_s`` (or ``within_s``, when longer)
        ago, if any (no request)."""
        known = self._known.get(counter)
        return known[1] if known is not None and self._clock() - known[0] < max(self._kept_s, within_s) else None

    def last(self, counter: str) -> Epochs | None:
        """The epochs of ``counter`` from the last read of them, however old (no request): a guess at them, for a
        read that checks it against the epochs it reads meanwhile (``countersink.reader.read_state``)."""
        known = self._known.get(counter)
        return None if known is None else known[1]

    async def get(self, counter: str) -> Epochs:
        sent = self._clock()
        known = self._known.get(counter)
        if known is not None and sent - known[0] < self._kept_s:
            return known[1]
        flying = self._in_flight.get(counter)
        if flying is not None and sent - flying[0] < self._kept_s:
            # Shielded: a caller that gives up (a request cancelled) does not cancel the others' read.
            return await asyncio.shield(flying[1])
        read = asyncio.ensure_future(self._read(counter, sent))
        self._in_flight[counter] = (sent, read)
        read.add_done_callback(lambda done: self._forget(counter, done))
        return await asyncio.shield(read)

    def _forget(self, counter: str, read: asyncio.Future[Epochs]) -> None:
        if self._in_flight.get(counter, (0.0, None))[1] is read:
            del self._in_flight[counter]
        if not read.cancelled():
            read.exception()  # retrieved: a failed read nobody waits for any more is not reported as unhandled

    async def _read(self, counter: str, sent: float) -> Epochs:
        epochs = await read_epochs(self._client, counter)
        if len(self._known) >= _EPOCHS_KEPT_COUNTERS:
            self._known.clear()
        latest = self._known.get(counter)
        if latest is None or latest[0] < sent:  # a read sent earlier that ended later keeps nothing
            self._known[counter] = (sent, epochs)
        return epochs


async def recorded_then_settled(recording: Awaitable[T]) -> T:
    """``recording`` (what records a reset: an LWT), then :data:`RESET_SETTLE_S` before anything else: whatever
    the caller does next (publish, report, fail, exit), every read that follows knows the reset. Also when the
    recording fails: its LWT may have applied with its answer lost. Not when cancelled (the process stops)."""
    try:
        done = await recording
    except asyncio.CancelledError:
        raise
    except BaseException:
        await _settle(time.monotonic())
        raise
    await _settle(time.monotonic())
    return done


async def _settle(recorded_at: float) -> None:
    """Wait until :data:`RESET_SETTLE_S` has passed since ``recorded_at`` (monotonic): every EpochsCache then
    holds no epochs read before the reset was recorded."""
    wait = recorded_at + RESET_SETTLE_S - time.monotonic()
    if wait > 0:
        await pause_unless_stopped(wait, None)


async def read_reset_rows(client: CassandraClient, counter: str, consistency: Consistency | None = None
                          ) -> list[dict[str, Any]]:
    """The ``resets`` rows of ``counter``, oldest first, every column (``request_key`` only where the keyspace
    has it), at ``consistency`` (the client's default when None)."""
    if not await _table_exists(client):
        return []
    return as_dicts(await client.execute("SELECT * FROM resets WHERE counter = ?", [counter],
                                         consistency=consistency))


async def read_points(client: CassandraClient, counter: str, epoch: int, partitions: Mapping[str, int], *,
                      reset_id: str) -> dict[tuple[str, int], int]:
    """Where ``counter``'s reset of ``epoch`` (``reset_id``) sits in each partition it was published to (those
    recorded)."""
    points: dict[tuple[str, int], int] = {}
    for topic, count in sorted(partitions.items()):
        for partition in range(count):
            point = await read_point(client, counter, epoch, topic, partition, reset_id=reset_id)
            if point is not None:
                points[(topic, partition)] = point
    return points


async def read_point(client: CassandraClient, counter: str, epoch: int, topic: str, partition: int, *,
                     reset_id: str) -> int | None:
    """Where ``counter``'s reset of ``epoch`` (``reset_id``) sits in one partition (the least offset recorded of
    it), None when no position of it is recorded there."""
    rows = as_dicts(await client.execute(
        "SELECT offset, reset_id FROM reset_positions WHERE topic = ? AND partition = ? AND counter = ? AND epoch = ?",
        [topic, partition, counter, epoch]))
    return min((int(row["offset"]) for row in rows if _of_reset(row, reset_id)), default=None)


def _of_reset(row: Mapping[str, Any], reset_id: str) -> bool:
    """Whether a position row is of ``reset_id``'s reset: one written without its reset's id (before the column
    was) is its epoch's."""
    return row.get("reset_id") in (None, reset_id)


class CassandraResets:
    """:class:`consumer.resetting.ResetBook` on the ``resets`` and ``reset_positions`` tables. Reads and writes
    at the consistency of the protocol's own (they decide what is written)."""

    def __init__(self, client: CassandraClient, read_cl: Consistency, write_cl: Consistency) -> None:
        self.client, self.read_cl, self.write_cl = client, read_cl, write_cl

    async def look_up(self, reset_ids: Sequence[str]) -> Mapping[str, Reset | None]:
        found: dict[str, Reset | None] = {}
        for reset_id in reset_ids:
            where = row_of_reset_id(reset_id)
            found[reset_id] = None
            if where is None:
                continue
            rows = as_dicts(await self.client.execute(
                "SELECT counter, epoch, id, keys, partitions FROM resets WHERE counter = ? AND epoch = ?", list(where),
                consistency=self.read_cl))
            if rows and rows[0]["id"] == reset_id:
                found[reset_id] = reset_of(rows[0])
        return found

    async def epochs_at(self, topic: str, partition: int, counters: Sequence[str], start: int) -> Epochs:
        rows = as_dicts(await self.client.execute(
            "SELECT counter, epoch, offset, reset_id FROM reset_positions WHERE topic = ? AND partition = ?",
            [topic, partition], consistency=self.read_cl))
        # Every counter's: a reset recorded before this partition existed has no position here, and applies.
        resets = [r for counter in counters for r in await read_resets(self.client, counter, self.read_cl)]
        least: dict[str, int] = {}
        for r in resets:
            offsets = [int(row["offset"]) for row in rows
                       if (row["counter"], int(row["epoch"])) == (r.counter, r.epoch) and _of_reset(row, r.reset_id)]
            if offsets:
                least[r.reset_id] = min(offsets)
        return epochs_at(resets, least, start, topic, partition)

    async def record_positions(self, positions: Sequence[ResetPosition]) -> None:
        for p in positions:
            await self.client.execute(
                "INSERT INTO reset_positions (topic, partition, counter, epoch, offset, reset_id) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [p.topic, p.partition, p.counter, p.epoch, p.offset, p.reset_id], consistency=self.write_cl)


class ResetRefusedError(CountersinkError):
    """Raised when a reset cannot be recorded (too many keys, no epoch claimed after retries)."""


class ResetKeyError(ResetRefusedError):
    """Raised, before anything is recorded, for keys no instance of the counter can have (a usage error)."""


class RequestKeyReusedError(ResetRefusedError):
    """Raised, recording nothing, when an idempotency key already recorded for a reset of other keys is given
    again (a usage error: a new reset needs a new key)."""


_INSERT = ("INSERT INTO resets (counter, epoch, id, keys, partitions, requested_by, requested_us) "
           "VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS")
# Only a request with a key names the column (a keyspace not yet given it resets from the command line).
_INSERT_KEYED = ("INSERT INTO resets (counter, epoch, id, keys, partitions, requested_by, requested_us, request_key) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS")


def command_requester() -> str:
    """Who asks for a reset from the command line, as recorded in ``requested_by``: the user and the host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def record_reset(client: CassandraClient, counter: str, keys: Sequence[str], requested_by: str,
                       write_cl: Consistency, partitions: Mapping[str, int], attempts: int = 20,
                       request_key: str | None = None) -> tuple[Reset, int]:
    """Record a new reset of ``counter`` (``keys``, or all keys when empty) at the next epoch, by LWT, with the
    number of ``partitions`` of each of its topics now (and the request's idempotency key, if any)."""
    if len(keys) > MAX_RESET_KEYS:
        raise ResetRefusedError(f"a reset names at most {MAX_RESET_KEYS} keys, not {len(keys)}")
    for _ in range(attempts):
        rows = await read_reset_rows(client, counter, write_cl)
        # Two requests with one key at once (a client retrying one it gave up waiting for, two serve replicas):
        # the one that reads the other's row, or loses the epoch to it, answers that reset.
        same = next((row for row in rows if request_key is not None and row.get("request_key") == request_key), None)
        if same is not None:
            raise SameRequestError(same)
        epoch = max((int(row["epoch"]) for row in rows), default=0) + 1
        reset = Reset(new_reset_id(counter, epoch), counter, epoch, frozenset(keys), tuple(sorted(partitions.items())))
        at_us = await claim_epoch(client, reset, requested_by, write_cl, request_key)
        if at_us is not None:
            return reset, at_us
    raise ResetRefusedError(f"could not claim a new epoch of {counter} after {attempts} attempts")


class SameRequestError(Exception):
    """A reset with the same idempotency key was recorded meanwhile (``row``): answer it, record none."""

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(f"reset epoch {row.get('epoch')} holds this request's key")
        self.row = row


async def next_epoch(client: CassandraClient, counter: str, consistency: Consistency) -> int:
    """The epoch a new reset of ``counter`` would take now (the greatest recorded, plus one)."""
    return max((r.epoch for r in await read_resets(client, counter, consistency)), default=0) + 1


async def claim_epoch(client: CassandraClient, reset: Reset, requested_by: str, write_cl: Consistency,
                      request_key: str | None = None) -> int | None:
    """Record ``reset`` at its own epoch, by LWT (with the request's idempotency key, if any); when it was
    recorded (microseconds since 1970), None when another reset holds that epoch."""
    at_us = time.time_ns() // 1000
    rows = as_dicts(await client.execute(
        _INSERT_KEYED if request_key else _INSERT,
        [reset.counter, reset.epoch, reset.reset_id, set(reset.keys) or None, dict(reset.partitions), requested_by,
         at_us, *([request_key] if request_key else [])], consistency=write_cl, idempotent=False))
    if not rows or rows[0].get("[applied]"):
        return at_us
    if rows[0].get("id") == reset.reset_id:  # ours, applied with its answer lost and retried
        return at_us
    return None


async def publish_controls(reset: Reset, partitions: Sequence[tuple[str, int]],
                           send: Callable[[str, int, bytes, list[tuple[str, bytes]]], Any],
                           positions: list[ResetPosition] | None = None) -> list[ResetPosition]:
    """Publish the reset's control record to each (topic, partition) and return where each landed (appended to
    ``positions`` as each lands, when given). ``send`` sends one record to one partition and returns an
    awaitable of its offset."""
    value, headers = control_record(reset)
    positions = [] if positions is None else positions
    for topic, partition in partitions:
        offset = await send(topic, partition, value, headers)
        positions.append(ResetPosition(reset.reset_id, reset.counter, reset.epoch, topic, partition, int(offset)))
    return positions


# The stages of a reset, in order: what :class:`ResetProgress` says it was doing when it stopped.
PARTITIONS, RECORDING, PUBLISHING, POSITIONS, DONE = "partitions", "recording", "publishing", "positions", "done"


@dataclass
class ResetProgress:
    """How far a reset went, for whoever must say so when it fails or is interrupted: its stage, the reset once
    recorded (its epoch and id), and the control records published so far."""

    stage: str = PARTITIONS
    reset: Reset | None = None
    published: list[ResetPosition] = field(default_factory=list)
    partitions: int = 0  # control records to publish
    requested_us: int = 0  # when the reset was recorded
    request_key: str | None = None  # the request's idempotency key

    def recorded(self) -> str:
        """What a reset that did not complete left, in words: nothing, or its epoch and how far it was published."""
        if self.reset is None:
            return "nothing was recorded"
        return (f"epoch {self.reset.epoch} (id {self.reset.reset_id}) was recorded and its control record "
                f"published to {len(self.published)} of {self.partitions} partitions")

    def as_json(self) -> dict[str, Any]:
        """The members a problem document carries about a reset that did not complete."""
        if self.reset is None:
            return {"stage": self.stage, "recorded": False}
        return {"stage": self.stage, "recorded": True, "epoch": self.reset.epoch, "id": self.reset.reset_id,
                "published": len(self.published), "partitions": self.partitions}


# An idempotency key of a reset (POST's Idempotency-Key, reset's --idempotency-key), and the rule in words.
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
IDEMPOTENCY_KEY_RULE = "1 to 128 of A-Z a-z 0-9 . _ : - (a UUID fits)"


@dataclass(frozen=True)
class ResetDone:
    """A reset recorded and published: who asked, when (microseconds since the epoch), and its points.
    ``repeated``: the reset a request with the same idempotency key recorded before (not a new one)."""

    reset: Reset
    keys: tuple[str, ...]
    requested_by: str
    requested_us: int
    positions: tuple[ResetPosition, ...]
    repeated: bool = False
    # A repeated reset that a later one covers whole: not completed (its control records would change nothing).
    superseded_by: int | None = None

    def as_json(self) -> dict[str, Any]:
        """As ``countersink reset --json`` prints it (and ``POST /counters/{name}/reset`` answers)."""
        return {"counter": self.reset.counter, "keys": sorted(self.keys), "epoch": self.reset.epoch,
                "id": self.reset.reset_id, "requested_by": self.requested_by,
                "requested_at": datetime.fromtimestamp(self.requested_us / 1e6, UTC).isoformat(timespec="milliseconds"),
                "positions": [{"topic": p.topic, "partition": p.partition, "offset": p.offset}
                              for p in self.positions],
                **({} if self.superseded_by is None else {"superseded_by": self.superseded_by})}


def first_line(exc: BaseException) -> str:
    """An error's message, first line, bounded (driver messages may be long)."""
    return (str(exc).splitlines() or [""])[0][:300]


def positions_not_recorded(exc: BaseException) -> str:
    """The warning given with a reset that :func:`took_effect` though recording its positions failed."""
    return ("the reset took effect (its control record is in every partition), but recording its positions "
            f"failed ({type(exc).__name__}): the consumers record them as they apply it")


def took_effect(progress: ResetProgress, keys: Sequence[str], requested_by: str) -> ResetDone | None:
    """A reset that failed only while recording where its control records landed, as done: every control record
    is out, so it took effect, and the mutators applying it record its positions. None for any other failure."""
    if progress.stage != POSITIONS or progress.reset is None:
        return None
    return ResetDone(progress.reset, tuple(keys), requested_by, progress.requested_us, tuple(progress.published))


async def recorded_request(client: CassandraClient, counter: str, request_key: str, read_cl: Consistency
                           ) -> dict[str, Any] | None:
    """The ``resets`` row of ``counter`` recorded with the idempotency key ``request_key``, or None."""
    rows = await read_reset_rows(client, counter, read_cl)
    return next((row for row in rows if row.get("request_key") == request_key), None)


def keys_of_no_instance(definition: CounterDefinition, keys: Sequence[str]) -> str | None:
    """Why a reset of ``keys`` would reset nothing, or None: each must have the counter's fields and, for a bucketed
    counter, name a bucket, as a read's key does (a key of other fields, without its bucket, or with a time that
    starts none, is no instance of it)."""
    return next((why for why in (timeseries.why_no_instance(definition, key, "reset") for key in keys) if why), None)


async def reset_counter(client: CassandraClient, kafka: KafkaSettings, definition: CounterDefinition,
                        keys: Sequence[str], requested_by: str, write_cl: Consistency, positions_read_cl: Consistency,
                        *, request_key: str | None = None, progress: ResetProgress | None = None) -> ResetDone:
    """Reset ``definition``'s counter (``keys``, or every key when empty): record the reset, publish its control
    record to every partition of the counter's topics, record where each landed. Raises
    :class:`ResetRefusedError` before recording anything when a topic has no partition Kafka knows.

    With ``request_key``, a reset of the counter already recorded with that key is not made again: it is
    answered (``repeated``), its control record published to the partitions where none is recorded yet (an
    earlier attempt cut short), which is harmless where one landed unrecorded (the least offset counts).
    ``progress`` is kept up to date as the reset goes."""
    progress = progress if progress is not None else ResetProgress()
    progress.request_key = request_key
    unfit = keys_of_no_instance(definition, keys)
    if unfit is not None:
        raise ResetKeyError(unfit)
    if request_key is not None:
        row = await recorded_request(client, definition.name, request_key, write_cl)
        if row is not None:
            return await _repeated(client, kafka, row, keys, write_cl, positions_read_cl, progress)
    producer = make_producer(kafka)
    await producer.start()
    try:
        # The partitions first: the reset records how many each topic has, and one added later holds only
        # what comes after the reset.
        partitions = await topic_partitions(kafka, producer, definition.topics)
        counts = {topic: 1 + max((p for t, p in partitions if t == topic), default=-1) for topic in definition.topics}
        missing = sorted(topic for topic, count in counts.items() if count == 0)
        if len(missing) == len(counts):
            raise ResetRefusedError(f"Kafka knows no partition of {', '.join(missing)}: nothing was reset")
        if missing and (counted := await _counted_now(client, definition.name, missing)):
            # Listed by no broker yet counted: a grant this command's Kafka user lacks (its listing shows only
            # what it may describe), or a topic deleted moments ago. A reset that skipped it would let those
            # mutators count on in the old epoch until they next start.
            raise ResetRefusedError(f"Kafka lists no partition of {', '.join(counted)} to this command, but live "
                                    "consumers count it (may this Kafka user describe and write it?): nothing was "
                                    "reset")
        if missing:
            # A topic the counter was counted on and that is gone (deleted, the counter's file no longer naming
            # it: the registry keeps every topic it was given), or not made yet, which no live mutator counts.
            # The reset does not name it, so all a topic of that name holds when counted counts in the reset's
            # epoch (schemas.resets.Reset.born_after), and a consumer takes no topic made again under an old name
            # (countersink.topic_ids).
            log.warning("reset_topics_absent", counter=definition.name, topics=missing,
                        note="Kafka has no such topic: the reset does not reach it, and whatever a topic of that "
                        "name holds if one is made counts in the reset's epoch")
            counts = {topic: count for topic, count in counts.items() if count}
        progress.stage = RECORDING
        try:
            recorded, at_us = await recorded_then_settled(record_reset(
                client, definition.name, keys, requested_by, write_cl, counts, request_key=request_key))
        except SameRequestError as same:
            answered: dict[str, Any] | None = same.row
        else:
            answered = None
            progress.reset, progress.stage, progress.partitions = recorded, PUBLISHING, len(partitions)
            progress.requested_us = at_us
            positions = await publish_controls(recorded, partitions, _sender(producer), progress.published)
    finally:
        await producer.stop()
    if answered is not None:
        return await _repeated(client, kafka, answered, keys, write_cl, positions_read_cl, progress)
    progress.stage = POSITIONS
    await CassandraResets(client, positions_read_cl, write_cl).record_positions(positions)
    progress.stage = DONE
    return ResetDone(recorded, tuple(keys), requested_by, at_us, tuple(positions))


async def _counted_now(client: CassandraClient, counter: str, topics: Sequence[str]) -> list[str]:
    """Those of ``topics`` a live mutator of ``counter``'s consumer group owns a partition of (neither retired nor
    past its expiry), sorted; all of them when the registry records no group for the counter (it cannot say)."""
    from countersink.registry import CounterRegistry

    row = await CounterRegistry(client).record(counter)
    group = None if row is None else row.get("consumer_group")
    if group is None:
        return sorted(topics)
    # The ownership table is small (a row per partition counted) and keyed by group, topic and partition together.
    owners = {row["owner"]: row["topic"] for row in as_dicts(await client.execute(
        "SELECT consumer_group, topic, owner FROM partitions", page_size=5_000))
        if row["consumer_group"] == group and row["topic"] in topics and row.get("owner") is not None}
    now_us = time.time_ns() // 1000
    counted = set()
    for owner, topic in owners.items():
        rows = as_dicts(await client.execute("SELECT retired_us, expires_us FROM mutators WHERE id = ?", [owner]))
        if rows and rows[0].get("retired_us") is None and (rows[0].get("expires_us") or 0) > now_us:
            counted.add(topic)
    return sorted(counted)


def _sender(producer: Any) -> Callable[[str, int, bytes, list[tuple[str, bytes]]], Any]:
    async def send(topic: str, partition: int, value: bytes, headers: list[tuple[str, bytes]]) -> int:
        metadata = await (await producer.send(topic, value, partition=partition, headers=headers))
        return int(metadata.offset)

    return send


async def _repeated(client: CassandraClient, kafka: KafkaSettings, row: dict[str, Any], keys: Sequence[str],
                    write_cl: Consistency, positions_read_cl: Consistency, progress: ResetProgress) -> ResetDone:
    """The reset ``row`` records, asked for again with its idempotency key: its control record published where
    no position is recorded yet, and answered as recorded."""
    recorded = reset_of(row)
    if recorded.keys != frozenset(keys):
        raise RequestKeyReusedError(f"Idempotency-Key {row.get('request_key')!r} was given to reset epoch "
                                f"{recorded.epoch} of {recorded.counter} with other keys: a new reset needs a new key")
    # When the first attempt recorded it is known on another machine's clock: settled as if recorded now.
    await _settle(time.monotonic())
    progress.reset, progress.stage = recorded, PUBLISHING
    progress.requested_us = int(row.get("requested_us") or 0)
    points = await read_points(client, recorded.counter, recorded.epoch, dict(recorded.partitions),
                               reset_id=recorded.reset_id)
    missing = [(topic, p) for topic, count in recorded.partitions for p in range(count) if (topic, p) not in points]
    later = superseding(recorded, [reset_of(r) for r in await read_reset_rows(client, recorded.counter)]
                        ) if missing else None
    if later is not None:
        missing = []  # every instance it resets reads a later epoch: its control records would change nothing
    progress.partitions = len(missing)
    published: list[ResetPosition] = []
    if missing:
        producer = make_producer(kafka)
        await producer.start()
        try:
            await publish_controls(recorded, missing, _sender(producer), published)
        finally:
            await producer.stop()
        progress.stage = POSITIONS
        await CassandraResets(client, positions_read_cl, write_cl).record_positions(published)
    progress.stage = DONE
    positions = [ResetPosition(recorded.reset_id, recorded.counter, recorded.epoch, topic, p, offset)
                 for (topic, p), offset in points.items()] + published
    return ResetDone(recorded, tuple(keys), str(row.get("requested_by")), int(row.get("requested_us") or 0),
                     tuple(sorted(positions, key=lambda p: (p.topic, p.partition))), repeated=True,
                     superseded_by=None if later is None else later.epoch)
