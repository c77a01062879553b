"""``countersink trace``: what one record of a topic did in each counter that reads the topic.

For each counter on the topic the record was counted (into which instance; the partition's ownership row
says whether the value holds it yet: the owner's flushes are committed through an offset at or past the
record's), dropped as a publisher's retry (of which earlier record, within the retry window), filtered out by
``where``, skipped (late for its bucket's retention), or dead-lettered (and why).

Everything is decided as the consumer decides it, from the log alone: routing by :func:`route_decisions`
(the router's public API, and the one place that knows how its answers map to outcomes), the retry window by
the consumer's own :class:`~consumer.applying.Applier` rebuilt from the records before this one, exactly as a
successor rebuilds it. Read-only: it reads Kafka (the record, the window before it, and with ``--event-id``
at most ``--scan`` records back from the end of each partition searched) and Cassandra (the registry, the
ownership rows, the values); it writes nothing and joins no consumer group.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import DefaultPartitioner

from consumer.applying import Applier, Record, RecordSource, RetryWindow
from consumer.kafka_source import KafkaRecordSource
from consumer.schema_source import SchemaLoadingSource
from countersink.backfills import backfill_group, read_handovers
from countersink.cassandra import CassandraClient, as_dicts
from countersink.cli import EXIT_FAILED, EXIT_USAGE, instance_key, positive_int, run_async
from countersink.kafka import KafkaUnavailableError, explain_refusal, make_consumer, start_admin
from countersink.logs import get_logger
from countersink.read_cli import _render as render_value
from countersink.reader import CounterReader, to_jsonable
from countersink.registry import CounterRegistry
from countersink.resets import read_point, read_resets
from countersink.schema_registry import (
    SchemaLoader,
    SchemaRegistryNotConfiguredError,
    SchemaRegistryUnavailableError,
    schema_cache,
)
from countersink.settings import ConsumerSettings, Settings
from countersink.topic_ids import recreated_topics
from schemas.cql import counters_recorded
from schemas.definitions import CounterSet, load_definitions
from schemas.errors import CountersinkError, InvalidEventError
from schemas.events import APPLY_TO_HEADER, EventRouter, apply_to
from schemas.formats import decoders
from schemas.resets import cell_name, control_reset_id, counts_after_resets, current_epochs, row_of_reset_id

log = get_logger(__name__)

COUNTED = "counted"
RETRY = "dropped_as_retry"
FILTERED = "filtered"
LATE = "late"
NOT_APPLICABLE = "not_applicable"
DEAD_LETTERED = "dead_lettered"
CONTROL = "control_record"  # a reset's control record: no event, counted by no counter

# Records found by --event-id that are traced at most (an original and its retries are a few).
MAX_MATCHES = 20
DEFAULT_SCAN = 100_000
DEAD_LETTER_SCAN = 10_000  # records of each dead-letter partition searched, back from its end
_OFFSET = re.compile(r"^(\d{1,9}):(\d{1,19})$")


@dataclasses.dataclass(frozen=True)
class Decision:
    """What routing decided for one counter: its outcome, and for a counted record the instance, the value
    and the event id; for the others why."""

    counter: str
    outcome: str
    key: str | None = None
    value: object = None
    event_id: str | None = None
    reason: str | None = None


Decide = Callable[[str, Record, int], dict[str, Decision]]
Decoders = Mapping[str, Callable[[Any], Any]]  # per topic that is not JSON: schemas.formats.decoders


def route_decisions(counters: CounterSet, limits: ConsumerSettings, decoders: Decoders | None = None) -> Decide:
    """A function telling, for one record of a topic, what the consumer's router does with it in each counter
    on the topic (the router is built once, with the consumer's limits). Each counter decides for itself: an
    event refused as a whole (unparseable, oversized, too deep) is dead-lettered for every counter; otherwise
    a counter counts it, filters it out, finds it late, skips it as not applicable (a key, value or bucket
    field absent or null) or refuses it (then the record is dead-lettered, once, for the counters refusing it).
    ``decoders``: the consumer's, for topics that are not JSON (:func:`schemas.formats.decoders`); the writer
    schemas a record names must be in their cache before it is decided."""
    late: list[str] = []
    router = EventRouter(counters, max_event_bytes=limits.max_event_bytes, on_late=late.append,
                         max_future_skew_s=limits.max_future_skew_s, decoders=decoders)

    def decide(topic: str, record: Record, partition: int) -> dict[str, Decision]:
        late.clear()
        on_topic = counters.for_topic(topic)
        try:
            decision = router.decide_record(topic, record.value or b"", record.timestamp, record.key,
                                            record.headers, partition)
        except InvalidEventError as exc:
            why = f"{type(exc).__name__} at {exc.path or '<event>'}: {exc.reason}"
            return {c.name: Decision(c.name, DEAD_LETTERED, reason=why) for c in on_topic}
        only = apply_to(record.headers) if record.headers else None
        counted = {update.counter: update for update in decision.updates}
        refused = {exc.counter: exc for exc in decision.refusals}
        skipped = dict(decision.not_applicable)
        decisions = {}
        for c in on_topic:
            update = counted.get(c.name)
            refusal = refused.get(c.name)
            if update is not None:
                decisions[c.name] = Decision(c.name, COUNTED, update.key, update.value, update.event_id)
            elif refusal is not None:
                decisions[c.name] = Decision(c.name, DEAD_LETTERED, reason=f"{type(refusal).__name__} at "
                                             f"{refusal.path or '<event>'}: {refusal.reason}")
            elif c.name in skipped:
                decisions[c.name] = Decision(c.name, NOT_APPLICABLE, reason=skipped[c.name])
            elif c.name in late:
                decisions[c.name] = Decision(c.name, LATE, reason="its bucket's retention had ended when the "
                                             "record was written")
            elif only is not None and c.name not in only:
                decisions[c.name] = Decision(c.name, FILTERED, reason=(
                    f"{APPLY_TO_HEADER} names {', '.join(sorted(only)) or 'no counter'}, not this one (a dead "
                    "letter sent back for the counters that refused it)"))
            else:
                where = ", ".join(f"{path} in {list(allowed)}" for path, allowed in sorted(c.where.items()))
                decisions[c.name] = Decision(c.name, FILTERED, reason=f"where {where}" if where else None)
        return decisions

    return decide


@dataclasses.dataclass
class CounterTrace:
    """One counter's part in a traced record."""

    counter: str
    outcome: str
    key: str | None = None
    event_id: str | None = None
    reason: str | None = None
    retry_of: int | None = None  # the last earlier record in the window with the same event id
    dead_letter: str | None = None  # where the dead-letter topic holds the record ("topic/partition@offset")
    group: str | None = None
    owner: str | None = None  # the mutator owning the partition now
    flushed_through: int | None = None  # the offset the partition's flushes are committed through
    # Shards of the instance written from this partition that cover the record: (mutator, through offset).
    shards: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    in_tally: bool = False  # the instance has a tally (folded shards of retired mutators)
    # The partition is flushed through the record, and a shard written from it through the record (by a mutator
    # not started past it) or the instance's tally holds the counter's state. A counter added to a running group
    # counts from the group's position then: a record before that is flushed but was never applied to it.
    in_value: bool | None = None
    held: bool = False
    value_now: object = None
    # The reset that set the instance's current epoch, when the record does not count toward it: it lies before
    # that reset's control record in its partition (at reset_offset), or the reset has none there (None).
    reset: str | None = None
    reset_offset: int | None = None
    # The mutator that applied the record (the last of its group and partition to start at or before it, as each
    # recorded its start and counters), and whether it counted this counter: one started before the counter was
    # added did not, whatever the shards and the tally hold now. None: not known (no start recorded).
    applied_by: str | None = None
    applier_counts: bool | None = None


@dataclasses.dataclass
class RecordTrace:
    topic: str
    partition: int
    offset: int
    message_key: str | None
    timestamp_ms: int | None
    size: int
    counters: list[CounterTrace]


def _offset(text: str) -> tuple[int, int]:
    """An argparse type: PARTITION:OFFSET."""
    match = _OFFSET.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not PARTITION:OFFSET (like 2:1500)")
    return int(match.group(1)), int(match.group(2))


def _topic(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Kafka topic name")
    return text


def _event_id(text: str) -> str:
    if not 0 < len(text.encode("utf-8", "surrogatepass")) <= 1024:
        raise argparse.ArgumentTypeError("an event id is 1 to 1024 bytes")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True, type=_topic, help="the topic the record is in")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--offset", type=_offset, metavar="PARTITION:OFFSET", help="the record at this offset")
    which.add_argument("--event-id", type=_event_id, metavar="ID",
                       help="the records whose event id (any counter's event_id field) is ID")
    parser.add_argument("--key", type=instance_key, metavar="KEY",
                        help="with --event-id: the record's message key; only its partition is searched")
    parser.add_argument("--scan", type=positive_int, default=DEFAULT_SCAN, metavar="RECORDS",
                        help="with --event-id: records searched at most, back from the end of each partition")
    parser.add_argument("--counters", metavar="FILE",
                        help="definitions file (default: the definitions in the counter registry)")
    parser.add_argument("--group", help="consumer group whose ownership rows say what is flushed (default: for "
                        "each counter the group the registry records, else COUNTERSINK_CONSUMER__GROUP_ID)")
    parser.add_argument("--json", action="store_true", help="one JSON object per record traced")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.key is not None and args.event_id is None:
        log.error("usage", error="--key goes with --event-id")
        return EXIT_USAGE
    query = TraceQuery(args.topic, args.offset, args.event_id, args.key, args.scan)
    counters = (load_definitions(args.counters, max_row_bytes=settings.cassandra.max_row_bytes)
                if args.counters else None)
    return run_async(_command(settings, query, counters, args.group, as_json=args.json))


async def _command(settings: Settings, query: TraceQuery, counters: CounterSet | None, group: str | None, *,
                   as_json: bool) -> int:
    async with CassandraClient(settings.cassandra, app="countersink-trace") as client:
        try:
            result = await trace(client, settings, query, counters, group)
        except TraceRefusedError as exc:
            log.error("trace_refused", topic=query.topic, error=str(exc))
            return EXIT_USAGE
        except SchemaRegistryUnavailableError as exc:
            log.error("trace_failed", topic=query.topic, error=str(exc))
            return EXIT_FAILED
    for note in result.notes:
        if as_json:
            log.info("trace_searched", note=note)
        else:
            print(note)
    for traced in result.records:
        print(json.dumps(to_jsonable(traced)) if as_json else _describe(traced))
    return 0 if result.records else EXIT_FAILED


class TraceRefusedError(CountersinkError):
    """Raised when a trace cannot be made as asked: no counter reads the topic, the topic or the partition
    does not exist, or an event id is asked for on a topic whose counters name none."""


@dataclasses.dataclass(frozen=True)
class TraceQuery:
    """Which record to trace: at ``offset`` (partition, offset), or those whose event id is ``event_id`` (with
    ``key``, the message key: its partition only) among the last ``scan`` records of each partition."""

    topic: str
    offset: tuple[int, int] | None = None
    event_id: str | None = None
    key: str | None = None
    scan: int = DEFAULT_SCAN


@dataclasses.dataclass
class TraceResult:
    """The records traced, and what was searched (or why nothing was found), one line each."""

    notes: list[str]
    records: list[RecordTrace]


async def trace(client: CassandraClient, settings: Settings, query: TraceQuery, counters: CounterSet | None = None,
                group: str | None = None) -> TraceResult:
    """Trace the records ``query`` names, with ``counters`` (default: the counter registry's) and the ownership
    rows of ``group`` (default: for each counter, the group the registry records for it, else the consumer
    setting). Raises :class:`TraceRefusedError` when the query cannot be answered as asked."""
    registry = CounterRegistry(client)
    counters = counters if counters is not None else await _registered(registry, query.topic)
    on_topic = counters.for_topic(query.topic)
    if not on_topic:
        # Before any read of Kafka: a trace reads only topics counted (serve's tokens read counters, not Kafka).
        raise TraceRefusedError(f"no counter reads topic {query.topic!r} ({counters.source})")
    recorded = {} if group is not None else await registry.groups()
    group_of = {c.name: group or recorded.get(c.name) or settings.consumer.group_id for c in on_topic}
    consumer = make_consumer(settings.kafka, enable_auto_commit=False, group_id=None,
                             auto_offset_reset="earliest", isolation_level="read_committed")
    # The consumer's decoders: Avro, Protobuf and JSON Schema records are decoded as it decodes them, their
    # writer schemas loaded from the registry before any is routed (consumer.schema_source).
    cache = schema_cache(settings.schema_registry)
    try:
        loader = SchemaLoader(settings.schema_registry, counters, cache)
    except SchemaRegistryNotConfiguredError as exc:
        raise TraceRefusedError(str(exc)) from None
    formats = _Formats(decoders(counters.formats, cache, counters.schema_base), loader)
    kafka_source = KafkaRecordSource(settings.kafka)
    source: RecordSource = SchemaLoadingSource(kafka_source, loader) if loader.needed else kafka_source
    result = TraceResult([], [])
    try:
        try:
            await consumer.start()
        except KafkaConnectionError as exc:
            await explain_refusal(settings.kafka)  # a refusal for good is said as such
            raise KafkaUnavailableError(f"cannot reach Kafka at {','.join(settings.kafka.bootstrap_servers)}: "
                                        f"{exc}") from None
        known = await _partitions(settings, (query.topic, settings.consumer.dead_letter_topic))
        partitions = known.get(query.topic, set())
        if not partitions:
            raise TraceRefusedError(f"topic {query.topic!r} does not exist")
        await _same_topic(client, settings, query.topic)
        if query.offset is not None:
            found = await _at_offset(consumer, query.topic, *query.offset, partitions, result.notes)
        else:
            found = await _by_event_id(consumer, counters, settings.consumer, query, partitions, result.notes,
                                       formats)
        await loader.load(query.topic, (record.value for record in found))
        for record in found:
            result.records.append(await _trace_record(client, consumer, source, counters, settings.consumer,
                                                      group_of, query.topic, record,
                                                      known.get(settings.consumer.dead_letter_topic, set()),
                                                      formats.decoders))
    finally:
        await consumer.stop()
        await kafka_source.stop()
        await loader.stop()
    return result


TOPIC_CHECK_S = 10.0


async def _same_topic(client: CassandraClient, settings: Settings, topic: str) -> None:
    """Refuse a topic deleted and created again since its counters counted it: its offsets are not the ones
    the ownership rows speak of, and a record at one of them was never counted (countersink.topic_ids)."""
    try:
        recreated = await recreated_topics(settings.kafka, client, [topic], None, TOPIC_CHECK_S)
    except Exception as exc:  # a keyspace no consumer of this version wrote yet has no table: trace as before
        log.warning("topic_ids_unchecked", topic=topic, error=repr(exc))
        return
    if topic in recreated:
        raise TraceRefusedError(f"{recreated[topic]}; trace cannot tell what was counted of it")


async def _registered(registry: CounterRegistry, topic: str) -> CounterSet:
    """The registry's counters, with ``topic``'s format as its consumers recorded it. Refused when the registry
    does not say that format, or when its schemas are files on the consumer's host: records are decoded as the
    consumer decodes them, or not traced (never taken for JSON)."""
    counters = await registry.counters()
    if counters is None or not counters.for_topic(topic):
        where = counters.source if counters else "the counter registry is empty"
        raise TraceRefusedError(f"no counter reads topic {topic!r} ({where})")
    recorded = await registry.topic_format(topic)
    if isinstance(recorded, str):
        raise TraceRefusedError(f"pass --counters FILE: {recorded}")
    if recorded.schema_file is not None or recorded.reader_schema_file is not None:
        raise TraceRefusedError(f"pass --counters FILE: topic {topic!r} is read with schema files on the "
                                "consumer's host, which the counter registry does not hold")
    return CounterSet(counters.counters, counters.source, {topic: recorded})


@dataclasses.dataclass(frozen=True)
class _Formats:
    """How a trace decodes records that are not JSON: the consumer's decoders, and what loads their schemas."""

    decoders: Decoders
    loader: SchemaLoader


async def _partitions(settings: Settings, topics: tuple[str, ...]) -> dict[str, set[int]]:
    """The partitions of each of ``topics`` that exists, asked of the broker by an admin client (a consumer's
    metadata covers only the topics it was given; aiokafka has no public call to widen it)."""
    admin = await start_admin(settings.kafka)
    try:
        described = await admin.describe_topics(list(dict.fromkeys(topics)))
    finally:
        await admin.close()
    return {d["topic"]: {p["partition"] for p in d["partitions"]} for d in described
            if not d.get("error_code") and d["partitions"]}


async def _chunks(consumer: AIOKafkaConsumer, tp: TopicPartition, first: int, last: int
                  ) -> AsyncIterator[list[Any]]:
    """The records of ``tp`` with first <= offset <= last (with their message keys), a fetch at a time."""
    consumer.assign([tp])
    consumer.seek(tp, first)
    while True:
        batches = await consumer.getmany(tp, timeout_ms=1000, max_records=5000)
        got = batches.get(tp, [])
        chunk = [message for message in got if message.offset <= last]
        if chunk:
            yield chunk
        if (got and got[-1].offset >= last) or (not got and await consumer.position(tp) > last):
            return
        if not got and await consumer.position(tp) >= (await consumer.end_offsets([tp]))[tp]:
            return


async def _bounds(consumer: AIOKafkaConsumer, tp: TopicPartition) -> tuple[int, int]:
    return int((await consumer.beginning_offsets([tp]))[tp]), int((await consumer.end_offsets([tp]))[tp])


async def _at_offset(consumer: AIOKafkaConsumer, topic: str, partition: int, offset: int, partitions: set[int],
                     notes: list[str]) -> list[Any]:
    if partition not in partitions:
        raise TraceRefusedError(f"topic {topic!r} has partitions 0..{max(partitions)}, not {partition}")
    tp = TopicPartition(topic, partition)
    start, end = await _bounds(consumer, tp)
    if offset < start:
        notes.append(f"{topic}/{partition}@{offset}: no longer in the log (deleted by retention: the log starts at "
                     f"{start})")
        return []
    if offset >= end:
        notes.append(f"{topic}/{partition}@{offset}: not written yet (the log ends at {end})")
        return []
    async for chunk in _chunks(consumer, tp, offset, offset):
        return chunk[:1]
    notes.append(f"{topic}/{partition}@{offset}: no record at this offset (a transaction marker, or an aborted or "
                 "compacted record)")
    return []


async def _by_event_id(consumer: AIOKafkaConsumer, counters: CounterSet, limits: ConsumerSettings,
                       query: TraceQuery, partitions: set[int], notes: list[str], formats: _Formats) -> list[Any]:
    """Records whose event id, by any counter on the topic that names one, is ``query.event_id``: the last
    ``query.scan`` records of each partition searched (only the key's partition with a key)."""
    paths = sorted({c.event_id for c in counters.for_topic(query.topic) if c.event_id is not None})
    if not paths:
        raise TraceRefusedError(f"no counter on {query.topic!r} names an event_id field: trace by offset")
    router = EventRouter(counters, max_event_bytes=limits.max_event_bytes, decoders=formats.decoders)
    key = None if query.key is None else query.key.encode()
    searched = sorted(partitions)
    if key is not None:
        searched = [DefaultPartitioner()(key, searched, searched)]
    found: list[Any] = []
    for partition in searched:
        tp = TopicPartition(query.topic, partition)
        start, end = await _bounds(consumer, tp)
        first = max(start, end - query.scan)
        if first < end:
            async for chunk in _chunks(consumer, tp, first, end - 1):
                await formats.loader.load(query.topic, (message.value for message in chunk))
                for message in chunk:
                    if key is not None and message.key != key:
                        continue
                    if query.event_id in _event_ids(router, query.topic, message.value, paths):
                        found.append(message)
        notes.append(f"{query.topic}/{partition}: searched offsets {first}..{end - 1}"
                     + (f" (the last {query.scan}; a larger scan searches further)" if first > start else ""))
    if not found:
        notes.append(f"no record with event id {query.event_id!r}"
                     + (f" and key {query.key!r}" if key is not None else "") + " in the offsets searched")
    return found[:MAX_MATCHES]


def _event_ids(router: EventRouter, topic: str, value: bytes | None, paths: list[str]) -> set[str]:
    """The event ids a record carries under each of ``paths`` (integers by their decimal text, as counted)."""
    try:
        event = router.parse(topic, value or b"")
    except InvalidEventError:
        return set()
    ids = set()
    for path in paths:
        node: Any = event
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) or (isinstance(node, int) and not isinstance(node, bool)):
            ids.add(str(node))
    return ids


async def _trace_record(client: CassandraClient, consumer: AIOKafkaConsumer, source: RecordSource,
                        counters: CounterSet,
                        limits: ConsumerSettings, group_of: dict[str, str], topic: str, message: Any,
                        dead_letter_partitions: set[int], decoders: Decoders) -> RecordTrace:
    offset, partition = int(message.offset), int(message.partition)
    value: bytes = message.value or b""
    decide = route_decisions(counters, limits, decoders)
    headers = tuple((name, bytes(v) if v is not None else None) for name, v in (message.headers or ()))
    key = message.key
    reset_id = control_reset_id(headers)
    if reset_id is not None:  # a reset's control record, as the consumer's applier classifies one: no event
        controls = await _control(client, counters, topic, reset_id)
        if any(t.outcome == DEAD_LETTERED for t in controls):
            held = await _dead_letter_of(consumer, limits.dead_letter_topic, dead_letter_partitions,
                                         f"{topic}/{partition}/{offset}")
            for t in controls:
                t.dead_letter = held
        return RecordTrace(topic, partition, offset, None if key is None else key.decode("utf-8", "replace"),
                           message.timestamp, len(value), controls)
    decisions = decide(topic, Record(offset, value, message.timestamp, message.key, headers), partition)
    traces = {name: CounterTrace(name, d.outcome, d.key, d.event_id, d.reason) for name, d in decisions.items()}
    if any(d.outcome == COUNTED and d.event_id is not None for d in decisions.values()):
        fresh, last_seen = await _retry_window(source, counters, limits, decide, topic, partition,
                                               Record(offset, value, message.timestamp, message.key, headers),
                                               decoders)
        for name, d in decisions.items():
            if d.outcome == COUNTED and d.event_id is not None and name not in fresh:
                trace = traces[name]
                trace.outcome, trace.retry_of = RETRY, last_seen.get((name, d.event_id))
                trace.reason = (f"event id {d.event_id!r} was seen within the last {limits.retry_window_records} "
                                "records of the partition")
    if any(t.outcome == DEAD_LETTERED for t in traces.values()):
        held = await _dead_letter_of(consumer, limits.dead_letter_topic, dead_letter_partitions,
                                     f"{topic}/{partition}/{offset}")
        for t in traces.values():
            if t.outcome == DEAD_LETTERED:
                t.dead_letter = held
    counted = [t for t in traces.values() if t.outcome == COUNTED]
    rows: dict[str, list[dict[str, Any]]] = {}  # the partition's ownership row, by group
    reader = CounterReader(client)

    async def owned_by(trace: CounterTrace, group: str) -> None:
        """The group counting the record, its partition's owner and how far that is flushed."""
        if group not in rows:
            rows[group] = as_dicts(await client.execute(
                "SELECT owner, committed_offset FROM partitions WHERE consumer_group = ? AND topic = ? "
                "AND partition = ?", [group, topic, partition]))
        row = rows[group]
        trace.group, trace.owner, trace.flushed_through = group, None, None
        if row:
            trace.owner = None if row[0]["owner"] is None else str(row[0]["owner"])
            trace.flushed_through = row[0]["committed_offset"]
        trace.in_value = trace.flushed_through is not None and offset <= trace.flushed_through

    known_appliers: dict[str, tuple[uuid.UUID, frozenset[str]] | None] = {}

    async def appliers(group: str) -> tuple[uuid.UUID, frozenset[str]] | None:
        if group not in known_appliers:
            known_appliers[group] = await _applier(client, group, topic, partition, offset)
        return known_appliers[group]

    for trace in counted:
        await owned_by(trace, await _counting_group(client, counters, group_of[trace.counter], trace.counter,
                                                    topic, partition, offset))
        flushed_live = trace.in_value
        explained = await reader.explain(trace.counter, trace.key or "")
        # A partition's mutators follow one another through its offsets: the shard with the lowest
        # offset at or past the record is the one whose mutator applied it (unless the GC folded that one), but
        # for one whose mutator started past the record (a counter added, or dropped and defined again, since).
        covering = [(s.mutator, s.through_offset) for s in explained.shards if s.topic == topic
                    and s.partition == partition and s.through_offset is not None and s.through_offset >= offset]
        starts = await _mutator_starts(client, {mutator for mutator, _ in covering})
        trace.shards = sorted(((str(mutator), through) for mutator, through in covering
                               if (start := starts.get(mutator)) is None or start <= offset),
                              key=lambda shard: shard[1])
        trace.in_tally = explained.tally is not None
        trace.held = bool(trace.shards) or trace.in_tally
        trace.in_value = bool(trace.in_value and trace.held)
        trace.value_now = explained.value
        if not flushed_live:
            continue
        applier = await appliers(trace.group or "")
        if applier is not None:
            mutator, counting = applier
            trace.applied_by, trace.applier_counts = str(mutator), trace.counter in counting
            if not trace.applier_counts:
                trace.in_value, trace.held, trace.shards = False, False, []
                continue
        # The mutator went past the record, and past any control record before it.
        cleared = await _cleared_by_reset(client, trace.counter, trace.key or "", topic, partition, offset)
        if cleared is None:
            continue
        reset, point, epoch = cleared
        refill = await _reprocessed_by(client, group_of[trace.counter], cell_name(trace.counter, epoch), reset,
                                       topic, partition, offset, point)
        if refill is not None:  # a reprocess's backfill counts it again into the reset's epoch
            await owned_by(trace, refill)
            trace.in_value = bool(trace.in_value and trace.held)
        else:
            # What holds it is the earlier epoch's cell: the current one's shards do not.
            trace.reset, trace.reset_offset, trace.in_value = reset, point, False
            trace.shards, trace.held = [], False
    key = message.key
    return RecordTrace(topic, partition, offset, None if key is None else key.decode("utf-8", "replace"),
                       message.timestamp, len(value), list(traces.values()))


async def _control(client: CassandraClient, counters: CounterSet, topic: str, reset_id: str) -> list[CounterTrace]:
    """What a control record is to each counter on ``topic``: a recorded reset of one of them (CONTROL), a
    recorded reset of a counter these definitions do not keep (FILTERED), or forged (DEAD_LETTERED), as the
    consumer's applier decides it."""
    on_topic = counters.for_topic(topic)
    where = row_of_reset_id(reset_id) if reset_id else None
    reset = None
    if where is not None:
        reset = next((r for r in await read_resets(client, where[0]) if r.reset_id == reset_id), None)
    if reset is not None and any(c.name == reset.counter for c in on_topic):
        why = f"the control record of reset {reset_id} of {reset.counter} (epoch {reset.epoch}): no event"
        return [CounterTrace(c.name, CONTROL, reason=why) for c in on_topic]
    if reset is not None and counters.get(reset.counter) is None:
        why = f"the control record of reset {reset_id} of {reset.counter}, a counter these definitions lack"
        return [CounterTrace(c.name, FILTERED, reason=why) for c in on_topic]
    why = f"ForgedControlError: control record {reset_id!r} names no recorded reset of a counter on {topic}"
    return [CounterTrace(c.name, DEAD_LETTERED, reason=why) for c in on_topic]


async def _cleared_by_reset(client: CassandraClient, counter: str, key: str, topic: str, partition: int,
                            offset: int) -> tuple[str, int | None, int] | None:
    """The reset that set the current epoch of instance (``counter``, ``key``), which the value reads, and where
    its control record sits in the record's partition, when the record does not count toward that epoch
    (``schemas.resets.counts_after_resets``): it came before the control record, and was counted into an earlier
    epoch's cell, which shards and tallies keep beside the current one. None when it counts, or no reset
    covers the instance."""
    resets = await read_resets(client, counter)
    epoch = current_epochs(resets).epoch(counter, key)
    if epoch == 0:
        return None
    reset = next(r for r in resets if r.epoch == epoch)
    point = await read_point(client, counter, epoch, topic, partition, reset_id=reset.reset_id)
    points = {} if point is None else {(reset.reset_id, topic, partition): point}
    if counts_after_resets(resets, points, counter, key, topic, partition, offset):
        return None
    return reset.reset_id, point, epoch


async def _reprocessed_by(client: CassandraClient, live_group: str, cell: str, reset_id: str, topic: str,
                          partition: int, offset: int, point: int | None) -> str | None:
    """The group of the reprocess's backfill that counts the record at ``offset`` again into ``cell`` (the epoch
    reset ``reset_id`` made), when the reprocess planned a span of the partition holding it: from where its
    backfill starts up to the reset's control record (the plan's end, or ``point`` while it is not recorded). A
    plan of another reset (a reprocess that lost the epoch to this one, or stopped before its claim) counts
    nothing there."""
    try:
        planned = (await read_handovers(client, live_group, cell)).get((topic, partition))
    except Exception:  # a keyspace made before backfills: no reprocess
        return None
    if planned is not None and planned.reset_id not in (None, reset_id):
        return None
    end = point if planned is None or planned.offset is None else planned.offset
    if planned is None or planned.start_offset is None or end is None or not planned.start_offset <= offset < end:
        return None
    return backfill_group(live_group, cell)


async def _applier(client: CassandraClient, group: str, topic: str, partition: int, offset: int
                   ) -> tuple[uuid.UUID, frozenset[str]] | None:
    """The mutator of ``group`` that applied the record at ``offset`` of (``topic``, ``partition``), and the
    counters it counted: the last to start at or before the offset (each successor starts where the partition
    was flushed through, replaying what its predecessor left unflushed). None when the starts recorded do not
    say: none at or before the offset (those before may be collected and forgotten by the GC, or claimed by an
    earlier version), or that one's counters not recorded. The registry has no index by partition: its rows
    are read page by page, those of the partition kept."""
    found: tuple[int, int, uuid.UUID, frozenset[str] | None] | None = None
    page_state: bytes | None = None
    try:
        while True:
            result = await client.execute(
                "SELECT id, born_us, start_offset, counters FROM mutators WHERE consumer_group = ? AND topic = ? "
                "AND partition = ? ALLOW FILTERING", [group, topic, partition], page_size=_REGISTRY_PAGE,
                page_state=page_state)
            for row in as_dicts(result):
                start = row.get("start_offset")
                if start is None or start > offset:
                    continue
                candidate = (int(start), int(row["born_us"] or 0), uuid.UUID(str(row["id"])),
                             counters_recorded(row.get("counters")))
                if found is None or candidate[:2] > found[:2]:
                    found = candidate
            if not result.has_more_pages():
                break
            page_state = result.page_state()
    except Exception as exc:  # a keyspace whose schema predates the counters column: traced as before
        log.warning("mutator_counters_unread", error=repr(exc))
        return None
    if found is None or found[3] is None:
        return None
    return found[2], found[3]


_REGISTRY_PAGE = 5000


async def _mutator_starts(client: CassandraClient, mutators: Collection[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The first offset each of ``mutators`` applied, for those whose claim recorded it (consumer.ownership:
    none before that was recorded; a keyspace whose ``countersink schema`` predates it has no column)."""
    if not mutators:
        return {}
    try:
        rows = as_dicts(await client.execute("SELECT id, start_offset FROM mutators WHERE id IN ?",
                                             [sorted(mutators)]))
    except Exception as exc:  # traced as before: every shard taken for its mutator's
        log.warning("mutator_starts_unread", error=repr(exc))
        return {}
    return {uuid.UUID(str(row["id"])): int(row["start_offset"]) for row in rows if row["start_offset"] is not None}


async def _counting_group(client: CassandraClient, counters: CounterSet, live_group: str, counter: str, topic: str,
                          partition: int, offset: int) -> str:
    """The group whose mutators count ``counter`` at ``offset``: the live one, but for a counter with ``since``
    below its hand-over in the partition (or before any is recorded), which its backfill counts."""
    if counters[counter].since is None:
        return live_group
    try:
        handover = (await read_handovers(client, live_group, counter)).get((topic, partition))
    except Exception:  # a keyspace made before backfills: no hand-over, no backfill
        return live_group
    counted_live = handover is not None and handover.offset is not None and offset >= handover.offset
    return live_group if counted_live else backfill_group(live_group, counter)


async def _dead_letter_of(consumer: AIOKafkaConsumer, dead_letter_topic: str, partitions: set[int], source: str
                         ) -> str | None:
    """Where the dead-letter topic holds the record whose ``countersink.source`` header is ``source``, among the
    last :data:`DEAD_LETTER_SCAN` records of each of its partitions; None when not found there."""
    wanted = source.encode()
    for partition in sorted(partitions):
        tp = TopicPartition(dead_letter_topic, partition)
        start, end = await _bounds(consumer, tp)
        if start >= end:
            continue
        async for chunk in _chunks(consumer, tp, max(start, end - DEAD_LETTER_SCAN), end - 1):
            for message in chunk:
                if ("countersink.source", wanted) in list(message.headers or ()):
                    return f"{dead_letter_topic}/{partition}@{message.offset}"
    return None


async def _retry_window(source: RecordSource, counters: CounterSet, limits: ConsumerSettings, decide: Decide,
                        topic: str, partition: int, record: Record, decoders: Decoders
                        ) -> tuple[set[str], dict[tuple[str, str], int]]:
    """The counters for which ``record`` is no publisher retry, by the consumer's own window rebuilt from the
    ``retry_window_records`` records before it; and, per (counter, event id), the last of those records that
    carried it."""
    size = limits.retry_window_records
    router = EventRouter(counters, max_event_bytes=limits.max_event_bytes, max_future_skew_s=limits.max_future_skew_s,
                         decoders=decoders)
    applier = Applier(router, counters, topic, partition, RetryWindow(size))
    last_seen: dict[tuple[str, str], int] = {}
    window = await source.read_back(topic, partition, record.offset, size) if size > 0 else []
    # A reset's control record takes its place in the window as a record without ids, whichever reset it names:
    # looked up in no book (the applier refuses to classify one it was not told of), each is such a record.
    await applier.learn([*window, record])
    for earlier in window:
        for name, d in decide(topic, earlier, partition).items():
            if d.outcome == COUNTED and d.event_id is not None:
                last_seen[(name, d.event_id)] = earlier.offset
        applier.classify(earlier)
    _, fresh, _ = applier.classify(record)
    return {update.counter for update in fresh}, last_seen


def _instant(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "none"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _describe(traced: RecordTrace) -> str:
    """The trace of one record for a person: a line for the record, one per counter."""
    lines = [f"{traced.topic}/{traced.partition}@{traced.offset}: key {traced.message_key!r}, timestamp "
             f"{_instant(traced.timestamp_ms)}, {traced.size} bytes"]
    width = max(len(t.counter) for t in traced.counters)
    for t in traced.counters:
        if t.outcome == COUNTED:
            flushed = (f"{traced.topic}/{traced.partition} is flushed through offset {t.flushed_through} "
                       f"(group {t.group!r}, owner {t.owner})")
            counted = f"counted into {t.key!r}"
            if t.applier_counts is False:
                counted = f"its definition counts it into {t.key!r}"
                where = (f"not in the value: {flushed}, but mutator {t.applied_by}, which applied it, did not count "
                         "this counter (added to the group's definitions after that mutator started)")
            elif t.reset is not None:
                where = (f"not in the value: {flushed}, but the value counts from reset {t.reset}"
                         + (f", whose control record is at offset {t.reset_offset} of this partition, after it"
                            if t.reset_offset is not None else
                            ", which has no control record in this partition: nothing of it counts here"))
            elif t.flushed_through is not None and traced.offset <= t.flushed_through and not t.held:
                counted = f"its definition counts it into {t.key!r}"
                where = (f"not in the value: {flushed}, but no shard written from it holds the counter through this "
                         "offset and the instance has no tally (a counter added to a running group counts from the "
                         "group's position when it was added)")
            elif t.in_value:
                where = f"in the value: {flushed}"
            else:
                where = f"not in the value yet: {flushed}"
            held = (f"; applied by mutator {t.shards[0][0]}, whose shard is written through offset {t.shards[0][1]}"
                    if t.shards else "")
            if t.in_value and t.in_tally:
                held += (", or by an earlier mutator that the GC folded into the tally" if t.shards else
                         "; applied by a mutator that the GC folded into the tally")
            text = f"{counted}; {where}{held}; value now {render_value(t.value_now)}"
        elif t.outcome == RETRY:
            text = (f"dropped as a retry of offset {t.retry_of}: {t.reason}" if t.retry_of is not None
                    else f"dropped as a retry: {t.reason}")
        elif t.outcome == CONTROL:
            text = t.reason or "a reset's control record"
        elif t.outcome == FILTERED:
            text = "filtered out" + (f" ({t.reason})" if t.reason else "")
        elif t.outcome == DEAD_LETTERED:
            text = f"dead-lettered: {t.reason}" + (f"; in {t.dead_letter}" if t.dead_letter else
                                                   f"; not among the last {DEAD_LETTER_SCAN} records of each "
                                                   "dead-letter partition")
        else:
            text = f"skipped, {t.outcome.replace('_', ' ')}: {t.reason}"
        lines.append(f"  {t.counter:<{width}}  {text}")
    return "\n".join(lines)
