"""Invalid records to the dead-letter topic: at least once, and acknowledged before any flush window that
skips them is recorded complete (by a flush, a release or a rotation)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from consumer.applying import KafkaRecord
from countersink.kafka_records import sendable_header_name
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.settings import ConsumerSettings
from schemas.definitions import CounterSet
from schemas.errors import CountersinkError, CountersRefusedError, InvalidEventError, NotRepublishableError
from schemas.events import APPLY_TO_HEADER, apply_to

log = get_logger(__name__)

# What a dead letter refused whole is cut to last: far below any broker's smallest message limit.
LAST_RESORT_BYTES = 1024
LAST_RESORT_HEADER_BYTES = 16 * 1024  # the record's own headers a last-resort dead letter still carries
# Dead letters handed to the producer at once. A burst of invalid records (a bad deploy upstream) queues one
# delivery each; handed over all at once, the thousands waiting for room in the producer's batches were all woken
# at each drain, most of them waiting again, until some waited past request_timeout_ms: KafkaTimeoutError stopped
# the consumer at every start (20,000 dead letters in one partition, a healthy broker).
SENDS_IN_FLIGHT = 256
_HEADER_OVERHEAD = 10  # a record header's two varint lengths, at most 5 bytes each


class DeadLetterLoopError(CountersinkError):
    """A counter reads the dead-letter topic its consumer writes to: every record it refuses would come back."""


def refuse_dead_letter_loop(counters: CounterSet, dead_letter_topic: str) -> None:
    """Raise :class:`DeadLetterLoopError` when a counter reads ``dead_letter_topic``: a record one of them
    refused would be written there, read again, refused again and written again, without end."""
    readers = sorted(c.name for c in counters if dead_letter_topic in c.topics)
    if readers:
        raise DeadLetterLoopError(
            f"{', '.join(readers)} {'reads' if len(readers) == 1 else 'read'} {dead_letter_topic}, the consumer's "
            "dead-letter topic (COUNTERSINK_CONSUMER__DEAD_LETTER_TOPIC): each record refused there would be "
            "written back to it and read again without end; count another topic, or set another dead-letter topic")


# Headers countersink sets on a dead letter (and a record's own headers it does not copy to one).
HEADER_PREFIX = "countersink."
TRUNCATED_HEADER = "countersink.truncated"


class DeadLetterLostError(CountersinkError):
    """Raised when a dead letter was not delivered: the windows that skip its record must not be committed."""

REFUSED_HEADER = "countersink.refused"
TIMESTAMP_HEADER = "countersink.timestamp"


def refused_by(error: InvalidEventError) -> tuple[str, ...]:
    """The counters that refused an event; ``()`` when it was refused as a whole (unparseable, ...)."""
    if isinstance(error, CountersRefusedError):
        return error.refused_by
    return () if error.counter is None else (error.counter,)


def _meant_for(record: KafkaRecord) -> tuple[str, ...]:
    """The counters a record's :data:`~schemas.events.APPLY_TO_HEADER` names, in order; ``()`` without one (or
    one that is no UTF-8 text, which the record was refused whole for: then for every counter)."""
    try:
        named = apply_to(record.headers or ())
    except InvalidEventError:
        return ()
    return tuple(sorted(named or ()))


def _describe(error: InvalidEventError) -> bytes:
    return f"{type(error).__name__} {error.path}: {error.reason}".encode()[:1024]


def dead_letter_headers(topic: str, partition: int, record: KafkaRecord, error: InvalidEventError
                        ) -> list[tuple[str, bytes | None]]:
    """The headers of the dead letter of ``record``: why it was refused (the first refusal's reason, error
    and path; ``countersink.counter`` names its counter), where it came from, ``countersink.refused`` (the
    counters that refused it, comma-separated: absent when it was refused as a whole) with one
    ``countersink.refused.NAME`` per counter saying why, the record's timestamp, and the record's own
    headers (those not named ``countersink.*``), so that it can be re-published as it was (a header name that
    is not UTF-8 with its undecodable bytes replaced by U+FFFD: a producer sends no other)."""
    refusals = error.refusals if isinstance(error, CountersRefusedError) else (error,)
    first = refusals[0]
    headers: list[tuple[str, bytes | None]] = [
        ("countersink.reason", str(first.reason).encode()[:1024]),
        ("countersink.error", type(first).__name__.encode()),
        ("countersink.path", str(first.path).encode()[:1024]),
        ("countersink.source", f"{topic}/{partition}/{record.offset}".encode()),
    ]
    if first.counter is not None:  # the counter whose definition refused it (None: the whole event)
        headers.append(("countersink.counter", first.counter.encode()))
    schema_id = getattr(first, "schema_id", None)
    if schema_id is not None:  # the writer schema the registry does not know, or that cannot be used
        headers.append(("countersink.schema_id", str(schema_id).encode()))
    # A re-published record meant for some counters alone (countersink.apply-to), refused as a whole this time
    # (a fix that is no JSON): its dead letter is for those counters alone still. Without it, the next
    # republish would go back for every counter, and those that counted the original would count it twice.
    names = refused_by(error) or _meant_for(record)
    if names:
        headers.append((REFUSED_HEADER, ",".join(names).encode()))
        headers += [(f"{REFUSED_HEADER}.{r.counter}", _describe(r)) for r in refusals if r.counter is not None]
    if record.timestamp is not None and record.timestamp >= 0:
        headers.append((TIMESTAMP_HEADER, str(record.timestamp).encode()))
    headers += [(sendable_header_name(name), value) for name, value in (record.headers or ())
                if not name.startswith(HEADER_PREFIX)]
    return headers


class Republish(NamedTuple):
    """A dead letter sent back to its source: to the partition it came from, with its key, timestamp and
    headers, and (when counters refused it) :data:`~schemas.events.APPLY_TO_HEADER` naming them."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int | None


def plan_republish(headers: Sequence[tuple[str, bytes | None]], value: bytes | None, key: bytes | None,
                   payload: bytes | None = None, *, origin: str = "") -> Republish:
    """What re-publishing one dead letter sends: ``payload`` (the fixed event) or the dead letter's own value,
    to the topic and partition of ``countersink.source``. A dead letter that counters refused goes back for
    those counters alone (the others counted it the first time); one refused as a whole goes back for all.
    ``origin`` (``TOPIC/PARTITION/OFFSET`` of the dead letter) is kept in a header, to trace it."""
    last: dict[str, bytes | None] = {}
    for name, header in headers:
        last[name] = header
    source = (last.get("countersink.source") or b"").decode("utf-8", "replace")
    topic, _, rest = source.partition("/")
    partition_text, _, _ = rest.partition("/")
    if not topic or not (partition_text.isascii() and partition_text.isdigit()):
        raise NotRepublishableError(
            (f"its countersink.source header is not TOPIC/PARTITION/OFFSET ({source[:200]!r})" if source else
             "no countersink.source header") + ": not a dead letter countersink wrote")
    if f"{TRUNCATED_HEADER}.key" in last or f"{TRUNCATED_HEADER}.headers" in last:
        raise NotRepublishableError("the dead letter's key or headers were cut short: it cannot be sent back as the "
                                    "record was (countersink.source names the record, to publish again by hand)")
    if payload is None:
        if TRUNCATED_HEADER in last:
            raise NotRepublishableError("the dead letter was cut short (countersink.truncated): give the event "
                                        "to send with --payload")
        if value is None:
            raise NotRepublishableError("the dead letter has no value: give the event to send with --payload")
        payload = value
    stamp = (last.get(TIMESTAMP_HEADER) or b"").decode("ascii", "replace")
    out = [(name, header) for name, header in headers if not name.startswith(HEADER_PREFIX)]
    refused = last.get(REFUSED_HEADER)
    if refused:
        out.append((APPLY_TO_HEADER, refused))
    if origin:
        out.append(("countersink.republished-from", origin.encode()))
    return Republish(topic, int(partition_text), key, payload, out, int(stamp) if stamp.isdigit() else None)


class DeadLetters:
    """Sends invalid records with their reason; :meth:`deliver` waits until all sent so far are acknowledged."""

    def __init__(self, producer: AIOKafkaProducer, config: ConsumerSettings) -> None:
        self._producer = producer
        self._topic = config.dead_letter_topic
        self._max_bytes = config.dead_letter_max_bytes
        self._pending: list[asyncio.Future[None]] = []
        self._failed: BaseException | None = None  # the first delivery that failed, if any
        self._sending = asyncio.Semaphore(SENDS_IN_FLIGHT)  # FIFO: each waiting delivery is woken once

    def queue(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Start sending ``record``; its delivery is awaited by the next :meth:`deliver` or :meth:`take`."""
        delivery = asyncio.ensure_future(self._send_in_turn(tp, record, error))
        delivery.add_done_callback(self._note_failure)
        self._pending.append(delivery)
        METRICS.dead_lettered.inc()
        for counter in refused_by(error):
            METRICS.refused.labels(counter).inc()

    def take(self) -> list[asyncio.Future[None]]:
        """The deliveries started so far, for a flush to await before it opens or commits a window."""
        pending, self._pending = self._pending, []
        return pending

    def _note_failure(self, delivery: asyncio.Future[None]) -> None:
        if not delivery.cancelled() and delivery.exception() is not None and self._failed is None:
            self._failed = delivery.exception()

    async def deliver(self) -> None:
        """Wait until every dead letter sent so far is acknowledged; raise if any ever failed, even one a flush
        took and saw fail: no window skipping its record may be recorded complete (a release after that
        flush's failure found nothing left to await, and committed the window: the event was lost)."""
        pending = self.take()
        if pending:
            await asyncio.gather(*pending)
        if self._failed is not None:
            raise DeadLetterLostError(f"a dead letter was not delivered ({self._failed}): the windows skipping "
                                      "its record stay open for the next owner to read again") from self._failed

    def abandon(self) -> None:
        """Stop waiting for deliveries (closing): the windows that skip them were never recorded complete."""
        for delivery in self.take():
            delivery.cancel()

    async def _send_in_turn(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        async with self._sending:
            await self.send(tp, record, error)

    async def send(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Deliver one dead letter (acknowledged by the broker). One the broker or the client refuses as too
        large goes again cut short, with headers saying so: its value to ``dead_letter_max_bytes``, then its value
        and key to 1 KiB and without the record's own headers (a record's key or headers alone can pass the
        limit; ``countersink.source`` still names the record): an invalid event never wedges the consumer."""
        headers = dead_letter_headers(tp.topic, tp.partition, record, error)
        value, key = record.value, record.key
        # The record's own headers are left out of the last attempt only when they are large themselves: a
        # dead letter with them can be republished (with its value fixed), one without them cannot.
        # Each header costs its two lengths as well (varints, a few bytes): 524,200 empty headers are 0 bytes of
        # names and values and a megabyte in the record, and were kept, so the last attempt failed too and the
        # consumer stopped on the record at every start.
        record_headers = sum(len(name) + len(header or b"") + _HEADER_OVERHEAD for name, header in headers
                             if not name.startswith(HEADER_PREFIX))
        last = headers if record_headers <= LAST_RESORT_HEADER_BYTES else [
            (name, header) for name, header in headers if name.startswith(HEADER_PREFIX)]
        attempts = [(self._max_bytes, None, headers), (LAST_RESORT_BYTES, LAST_RESORT_BYTES, last)]
        for attempt, (value_limit, key_limit, kept) in enumerate(attempts, start=1):
            sent, sent_key, cut = value, key, []
            if value is not None and len(value) > value_limit:
                sent = value[:value_limit]
                cut.append((TRUNCATED_HEADER, f"{len(value)} bytes cut to {value_limit}".encode()))
            if key is not None and key_limit is not None and len(key) > key_limit:
                sent_key = key[:key_limit]
                cut.append((f"{TRUNCATED_HEADER}.key", f"{len(key)} bytes cut to {key_limit}".encode()))
            if len(kept) < len(headers):
                cut.append((f"{TRUNCATED_HEADER}.headers", f"{len(headers) - len(kept)} of the record's headers "
                            f"({record_headers} bytes) left out".encode()))
            try:
                delivery = await self._producer.send(self._topic, sent, key=sent_key, headers=kept + cut)
                await delivery
            except (MessageSizeTooLargeError, RecordTooLargeError) as exc:
                if attempt == len(attempts):
                    raise
                log.warning("dead_letter_too_large", topic=tp.topic, partition=tp.partition, offset=record.offset,
                            bytes=len(value or b"") + len(key or b""), error=str(exc))
                continue
            if cut:
                METRICS.dead_letters_truncated.inc()
            return
