"""Reading a range of a partition again from Kafka, for replays and for rebuilding the retry window."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, TopicPartition

from consumer.applying import Record
from countersink.kafka import make_consumer
from countersink.settings import KafkaSettings


class KafkaRecordSource:
    """A group-less consumer that is assigned one partition at a time and seeks to the range asked for."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        # Made at start: a client made and never started is reported unclosed when a process stops early.
        self._client: AIOKafkaConsumer | None = None
        # One range at a time: a read assigns and seeks the one consumer, and takeovers finishing in the
        # background read concurrently with each other and with the loop's warm-ups.
        self._reading = asyncio.Lock()

    @property
    def _consumer(self) -> AIOKafkaConsumer:
        if self._client is None:
            raise RuntimeError("KafkaRecordSource used before start()")
        return self._client

    async def start(self) -> None:
        if self._client is None:
            client = make_consumer(self._settings, enable_auto_commit=False, group_id=None,
                                   auto_offset_reset="earliest", isolation_level="read_committed")
            try:
                await client.start()
            except BaseException:
                await client.stop()
                raise
            self._client = client

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.stop()

    async def read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        if last < first:
            return []
        async with self._reading:
            return await self._read(topic, partition, first, last)

    async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        if last < first:
            return
        async with self._reading:
            async for chunk in self._chunks(topic, partition, first, last):
                yield chunk

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        if count <= 0 or before <= 0:
            return []
        async with self._reading:
            low = await self._log_start(TopicPartition(topic, partition))
            # Offsets with no record (transaction markers, aborted or compacted records) make the span of
            # ``count`` records unknown in advance: read further back, a range at a time, until the records
            # read hold them or the log starts. Each step reads only offsets not read yet, sized by the
            # density of records seen so far.
            records: list[Record] = []
            end = before  # the range read so far is [end, before)
            while len(records) < count and end > low:
                read, wanted = before - end, count - len(records)
                # With no record found yet (a long aborted transaction?), go twice as far back.
                span = max(wanted, wanted * read // len(records) + wanted // 4) if records else max(wanted, read)
                first = max(low, end - span)
                records[:0] = await self._read(topic, partition, first, end - 1)
                end = first
            return records[-count:]

    async def log_start(self, topic: str, partition: int) -> int:
        async with self._reading:
            return await self._log_start(TopicPartition(topic, partition))

    async def _log_start(self, tp: TopicPartition) -> int:
        await self.start()
        return int((await self._consumer.beginning_offsets([tp]))[tp])

    async def _read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        return [record async for chunk in self._chunks(topic, partition, first, last) for record in chunk]

    async def _chunks(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        """Records with first <= offset <= last, a fetch at a time; the caller holds ``_reading``."""
        tp = TopicPartition(topic, partition)
        low = await self._log_start(tp)
        self._consumer.assign([tp])
        start = max(first, low)  # records before the log start were deleted by retention
        if start > last:
            return
        self._consumer.seek(tp, start)
        while True:
            batches = await self._consumer.getmany(tp, timeout_ms=1000, max_records=5000)
            got = batches.get(tp, [])
            chunk = [Record(message.offset, message.value, message.timestamp, message.key, message.headers)
                     for message in got if message.offset <= last]
            if chunk:
                yield chunk
            if got and got[-1].offset >= last:
                return
            if not got:
                # Compacted or transactional logs have gaps; stop once the end of the log is passed.
                end = (await self._consumer.end_offsets([tp]))[tp]
                if await self._consumer.position(tp) >= min(end, last + 1):
                    return
