"""``countersink dead-letters republish``: send a dead letter (or the event fixed) back to its topic.

A dead letter that some counters refused was counted by the others: it goes back with a
``countersink.apply-to`` header naming the counters that refused it, so that those alone count it (the
router and the batch path both honour the header). It goes to the partition it came from, with its key, its
timestamp and its own headers, so that counters reading the record (``@key``, ``@timestamp``, ...) read it
as they read the original. A dead letter refused as a whole (unparseable, oversized) goes back for every
counter. docs/operations.md, Dead letters, shows the steps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition, errors

from countersink.cli import EXIT_USAGE, MAX_OPTION_INT, HelpFormatter, run_async
from countersink.kafka import make_consumer, make_producer, topic_partitions
from countersink.logs import get_logger
from countersink.publish_cli import BadLineError, json_event
from countersink.settings import Settings

if TYPE_CHECKING:
    from consumer.dead_letters import Republish

log = get_logger(__name__)


def _non_negative(noun: str, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of 0 or more (and at most ``most``), refused as not ``noun``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if value < 0 or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"{text} is not {noun} (0 or more)")
        return value

    return parse


_partition = _non_negative("a partition number", MAX_OPTION_INT)
_offset = _non_negative("an offset")


def add_dead_letters_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    republish = actions.add_parser(
        "republish", help="send one dead letter back to its source topic",
        description="Send the dead letter at PARTITION/OFFSET of the dead-letter topic back to the topic and\n"
        "partition it came from, with its key, timestamp and headers. When counters refused it, it is\n"
        "applied by those counters alone (countersink.apply-to), so the counters that counted it do not\n"
        "count it again. Prints where it was sent, for which counters, and its size (--dry-run: the\n"
        "record it would send, sending nothing).", formatter_class=HelpFormatter)
    republish.add_argument("--partition", type=_partition, required=True, help="the dead letter's partition")
    republish.add_argument("--offset", type=_offset, required=True, help="the dead letter's offset")
    republish.add_argument("--payload", metavar="FILE",
                           help="send this event instead of the dead letter's own value (the event fixed; - "
                           "reads standard input)")
    republish.add_argument("--dry-run", action="store_true", help="print what would be sent, send nothing")
    republish.add_argument("--again", action="store_true",
                           help="send it even though it was sent back before (counters without event_id count "
                           "each copy)")


def run_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    payload = None
    if args.payload is not None:
        limit = settings.consumer.max_event_bytes
        try:
            stream = sys.stdin.buffer if args.payload == "-" else Path(args.payload).open("rb")  # noqa: SIM115
            with stream:
                payload = stream.read(limit + 1)
        except OSError as exc:  # missing, a folder, unreadable: a bad argument
            log.error("usage_refused", error=f"--payload {args.payload}: {exc.strerror or exc}")
            return EXIT_USAGE
        if len(payload) > limit:
            log.error("usage_refused", error=f"the payload is larger than {limit} bytes "
                      "(COUNTERSINK_CONSUMER__MAX_EVENT_BYTES)")
            return EXIT_USAGE
        payload = _as_event(payload)
        problem = _not_an_event(payload)
        if problem is not None:
            log.error("usage_refused", error=f"--payload {args.payload}: {problem}")
            return EXIT_USAGE
    return run_async(republish(settings, args.partition, args.offset, payload, dry_run=args.dry_run,
                               again=args.again))


def _as_event(payload: bytes) -> bytes:
    """A JSON payload as ``publish`` takes a line: without a byte-order mark or the file's last newline (a
    payload in a schema registry's wire format, its magic byte first, is sent as it is)."""
    if payload[:1] == b"\x00":
        return payload
    return payload.removeprefix(b"\xef\xbb\xbf").removesuffix(b"\n").removesuffix(b"\r")


def _not_an_event(payload: bytes) -> str | None:
    """Why ``payload`` cannot be a fixed event, or None. A payload in a schema registry's wire format (its magic
    byte first) is sent as it is; any other is a JSON topic's event, which must be a JSON object as
    ``countersink publish`` requires: a fix that is not one is refused whole by the consumer again."""
    if payload[:1] == b"\x00":
        return None
    try:
        json_event(payload)
    except BadLineError as exc:
        return str(exc)
    return None


# Records of the source partition searched, back from its end, for an earlier copy of the dead letter sent back.
REPUBLISH_SCAN = 100_000
# Bytes of the value a dry run shows.
DRY_RUN_SHOWN = 300


async def republish(settings: Settings, partition: int, offset: int, payload: bytes | None, *,
                    dry_run: bool = False, again: bool = False) -> int:
    """Read one dead letter and send it back (:func:`consumer.dead_letters.plan_republish` says how), unless it
    was sent back before (found among the last :data:`REPUBLISH_SCAN` records of its source partition, by the
    ``countersink.republished-from`` header) and ``again`` is not given: counters without ``event_id`` count
    every copy."""
    from consumer.dead_letters import plan_republish

    topic = settings.consumer.dead_letter_topic
    tp = TopicPartition(topic, partition)
    # A partition the topic lacks: said at once (the consumer's look-up of its offsets waited out its timeout).
    partitions = await _partitions_of(settings, topic)
    if partition not in partitions:
        log.error("dead_letter_not_found", topic=topic, partition=partition, offset=offset,
                  error=f"{topic} has {len(partitions)} partitions" + (
                      f" (0..{max(partitions)})" if partitions else ": is it the dead-letter topic?"))
        return EXIT_USAGE
    async with _reading(settings, tp) as (consumer, low, high):
        if not low <= offset < high:
            log.error("dead_letter_not_found", topic=topic, partition=partition, offset=offset,
                      error=f"{topic}/{partition} holds " + (f"offsets {low}..{high - 1}" if high > low else
                                                                   "no record"))
            return EXIT_USAGE
        consumer.seek(tp, offset)
        found = None
        while found is None:
            batch = (await consumer.getmany(tp, timeout_ms=5000, max_records=1)).get(tp, [])
            if not batch:
                break
            if batch[0].offset >= offset:
                found = batch[0]
    if found is None or found.offset != offset:
        log.error("dead_letter_not_found", topic=topic, partition=partition, offset=offset,
                  error="no record at that offset (a transaction marker, or compacted away)")
        return EXIT_USAGE
    origin = f"{topic}/{partition}/{offset}"
    plan = plan_republish(found.headers, found.value, found.key, None if payload is None else _as_event(payload),
                          origin=origin)
    # The source partition, as the dead letter's header names it, still there: a forged or stale header is said
    # as such (the producer asserted on a partition past the topic's, and waited out its timeout for a topic gone).
    source = await _partitions_of(settings, plan.topic)
    if plan.partition not in source:
        log.error("source_not_found", dead_letter=origin, error=(
            f"the dead letter came from {plan.topic}/{plan.partition}, which no longer exists ("
            + (f"{plan.topic} has {len(source)} partitions)" if source else f"no topic {plan.topic})")))
        return EXIT_USAGE
    # Sent in a transaction whose id is the dead letter's: a run started meanwhile fences this one (its copy
    # aborted, never counted) before it looks for an earlier copy, so two runs at once send one copy that counts.
    producer = None if dry_run else make_producer(settings.kafka, transactional_id=republish_id(origin))
    # aiokafka waits for Kafka's transaction coordinator without a deadline: a coordinator that never answers
    # would hold the command for good.
    wait_s = settings.kafka.request_timeout_ms / 1000
    try:
        if producer is not None:
            try:
                async with asyncio.timeout(wait_s):
                    await producer.start()
            except TimeoutError:
                log.error("republish_failed", dead_letter=origin, error=f"Kafka's transaction coordinator did not "
                          f"answer within {wait_s:g} s (COUNTERSINK_KAFKA__REQUEST_TIMEOUT_MS): nothing was sent")
                return 1
        return await _send_back(settings, producer, found, plan, origin, dry_run=dry_run, again=again)
    finally:
        if producer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(wait_s):
                    await producer.stop()


async def send_in_transaction(producer: AIOKafkaProducer, plan: Republish, wait_s: float) -> str | None:
    """Send ``plan``'s record in a transaction of ``producer``'s; None once committed, ``"fenced"`` when another
    run with the same transactional id started meanwhile (this copy aborted), else why it is not known to be sent."""
    # Not aiokafka's transaction() context: on an error it aborts, waiting for the coordinator without a deadline.
    try:
        async with asyncio.timeout(wait_s):
            await producer.begin_transaction()
            await (await producer.send(plan.topic, plan.value, key=plan.key, partition=plan.partition,
                                       timestamp_ms=plan.timestamp_ms, headers=plan.headers))
            await producer.commit_transaction()
    except errors.ProducerFenced:
        return "fenced"  # the run that fenced this one aborted its transaction
    except TimeoutError:
        return (f"the copy's transaction did not end within {wait_s:g} s: it may be committed; run the command "
                "again, which finds a committed copy and sends none")
    except BaseException:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(wait_s):
                await producer.abort_transaction()
        raise
    return None


def republish_id(origin: str) -> str:
    """The transactional id of every run that sends back the dead letter at ``origin`` (topic/partition/offset)."""
    return f"countersink-republish:{origin}"


async def _send_back(settings: Settings, producer: AIOKafkaProducer | None, found: ConsumerRecord[Any, Any],
                     plan: Republish, origin: str, *, dry_run: bool, again: bool) -> int:
    if not again:
        # A copy carries the record's own time (plan.timestamp_ms), earlier than the dead letter's.
        since = min(found.timestamp, plan.timestamp_ms if plan.timestamp_ms is not None else found.timestamp)
        sent = await _sent_back(settings, TopicPartition(plan.topic, plan.partition), origin, since)
        if sent is not None:
            log.error("already_republished", dead_letter=origin, error=(
                f"{origin} was sent back before, as {sent}: counters without event_id would count it again "
                "(--again sends it once more)"))
            return EXIT_USAGE
    restricted = [_escaped(value) for name, value in plan.headers
                  if name == "countersink.apply-to" and value is not None]
    line = (f"{'would send' if dry_run else 'sent'} {origin} to {plan.topic}/{plan.partition}"
            f" for {'counters ' + restricted[0] if restricted else 'every counter'} ({len(plan.value)} bytes)")
    if dry_run:
        # What would be counted, to read before sending: a dead letter is only as trustworthy as whoever may write
        # the dead-letter topic (the consumers' user), and its headers choose the topic and the counters.
        shown = _escaped(plan.value[:DRY_RUN_SHOWN])
        line += f": {shown}{' ...' if len(plan.value) > DRY_RUN_SHOWN else ''}"
    if producer is not None:
        failed = await send_in_transaction(producer, plan, settings.kafka.request_timeout_ms / 1000)
        if failed == "fenced":
            log.error("already_republished", dead_letter=origin, error=(
                f"another run sending {origin} back started meanwhile: this one's copy is not counted, and that "
                "one sends it (or finds it sent)"))
            return EXIT_USAGE
        if failed is not None:
            log.error("republish_failed", dead_letter=origin, error=failed)
            return 1
    print(line)
    return 0


async def _sent_back(settings: Settings, tp: TopicPartition, origin: str, since_ms: int) -> str | None:
    """Where an earlier copy of the dead letter ``origin`` was sent back in ``tp`` (``topic/partition@offset``),
    looked for from the first record stamped ``since_ms`` or later (a copy is stamped as the record was), at most
    the last :data:`REPUBLISH_SCAN`; None when none is found there."""
    wanted = ("countersink.republished-from", origin.encode())
    async with _reading(settings, tp) as (consumer, low, end):
        by_time = (await consumer.offsets_for_times({tp: max(0, since_ms)})).get(tp)
        start = max(low, end - REPUBLISH_SCAN, by_time.offset if by_time is not None else end)
        if start >= end:
            return None
        consumer.seek(tp, start)
        while True:
            batch = (await consumer.getmany(tp, timeout_ms=5000)).get(tp, [])
            if not batch:
                return None
            for record in batch:
                if record.offset >= end:
                    return None
                if wanted in list(record.headers or ()):
                    return f"{tp.topic}/{tp.partition}@{record.offset}"
            if batch[-1].offset >= end - 1:
                return None
    return None


def _escaped(data: bytes) -> str:
    """Bytes of a dead letter as printable text: it comes from whoever could write the dead-letter topic, and no
    control character of it reaches the terminal."""
    return repr(bytes(data))[2:-1]


async def _partitions_of(settings: Settings, topic: str) -> list[int]:
    """The partitions of ``topic`` (none when it does not exist), asked without waiting out a look-up."""
    lookup = make_producer(settings.kafka)
    try:
        await lookup.start()
        return [number for _, number in await topic_partitions(settings.kafka, lookup, [topic])]
    finally:
        await lookup.stop()


@contextlib.asynccontextmanager
async def _reading(settings: Settings, tp: TopicPartition) -> AsyncIterator[tuple[AIOKafkaConsumer, int, int]]:
    """A consumer of ``tp`` alone (read committed, no group), with the partition's first and end offsets."""
    consumer = make_consumer(settings.kafka, enable_auto_commit=False, auto_offset_reset="none",
                             isolation_level="read_committed")
    try:
        await consumer.start()
        consumer.assign([tp])
        yield consumer, (await consumer.beginning_offsets([tp]))[tp], (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()
