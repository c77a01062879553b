"""Invalid records to the dead-letter topic: at least once, and acknowledged before any flush window that
skips them is recorded complete (by a flush, a release or a rotation)."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from consumer.applying import KafkaRecord
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.settings import ConsumerSettings
from schemas.errors import InvalidEventError

log = get_logger(__name__)

# What a dead letter refused whole is cut to last: far below any broker's smallest message limit.
LAST_RESORT_BYTES = 1024


class DeadLetters:
    """Sends invalid records with their reason; :meth:`deliver` waits until all sent so far are acknowledged."""

    def __init__(self, producer: AIOKafkaProducer, config: ConsumerSettings) -> None:
        self._producer = producer
        self._topic = config.dead_letter_topic
        self._max_bytes = config.dead_letter_max_bytes
        self._pending: list[asyncio.Future[None]] = []

    def queue(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Start sending ``record``; its delivery is awaited by the next :meth:`deliver` or :meth:`take`."""
        self._pending.append(asyncio.ensure_future(self.send(tp, record, error)))
        METRICS.dead_lettered.inc()

    def take(self) -> list[asyncio.Future[None]]:
        """The deliveries started so far, for a flush to await before it opens or commits a window."""
        pending, self._pending = self._pending, []
        return pending

    async def deliver(self) -> None:
        """Wait until every dead letter sent so far is acknowledged."""
        pending = self.take()
        if pending:
            await asyncio.gather(*pending)

    def abandon(self) -> None:
        """Stop waiting for deliveries (closing): the windows that skip them were never recorded complete."""
        for delivery in self.take():
            delivery.cancel()

    async def send(self, tp: TopicPartition, record: KafkaRecord, error: InvalidEventError) -> None:
        """Deliver one dead letter (acknowledged by the broker). One the broker or the client refuses as too
        large goes again cut short, with a header saying so: an invalid event never wedges the consumer."""
        headers = [
            ("countersink.reason", str(error.reason).encode()[:1024]),
            ("countersink.error", type(error).__name__.encode()),
            ("countersink.path", str(error.path).encode()[:1024]),
            ("countersink.source", f"{tp.topic}/{tp.partition}/{record.offset}".encode()),
        ]
        if error.counter is not None:  # the counter whose definition refused it (None: the whole event)
            headers.append(("countersink.counter", error.counter.encode()))
        schema_id = getattr(error, "schema_id", None)
        if schema_id is not None:  # the writer schema the registry does not know, or that cannot be used
            headers.append(("countersink.schema_id", str(schema_id).encode()))
        value = record.value
        limits = [self._max_bytes, LAST_RESORT_BYTES]
        while True:
            limit = limits.pop(0)
            sent, cut = value, []
            if value is not None and len(value) > limit:
                sent = value[:limit]
                cut = [("countersink.truncated", f"{len(value)} bytes cut to {limit}".encode())]
            try:
                delivery = await self._producer.send(self._topic, sent, headers=headers + cut)
                await delivery
            except (MessageSizeTooLargeError, RecordTooLargeError) as exc:
                if not limits or value is None or len(value) <= limits[0]:
                    raise
                log.warning("dead_letter_too_large", topic=tp.topic, partition=tp.partition, offset=record.offset,
                            bytes=len(value), error=str(exc))
                continue
            if cut:
                METRICS.dead_letters_truncated.inc()
            return
