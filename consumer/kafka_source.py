"""Reading a range of a partition again from Kafka, for replays and for rebuilding the retry window."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from consumer.protocol import Record
from countersink.kafka import make_consumer
from countersink.settings import KafkaSettings


class KafkaRecordSource:
    """A group-less consumer that is assigned one partition at a time and seeks to the range asked for."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._consumer = make_consumer(settings, enable_auto_commit=False, group_id=None,
                                       auto_offset_reset="earliest", isolation_level="read_committed")
        self._started = False
        # One range at a time: a read assigns and seeks the one consumer, and takeovers finishing in the
        # background read concurrently with each other and with the loop's warm-ups.
        self._reading = asyncio.Lock()

    async def start(self) -> None:
        if not self._started:
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._consumer.stop()

    async def read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        if last < first:
            return []
        async with self._reading:
            return await self._read(topic, partition, first, last)

    async def _read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        await self.start()
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        low = (await self._consumer.beginning_offsets([tp]))[tp]
        start = max(first, low)  # records before the log start were deleted by retention
        if start > last:
            return []
        self._consumer.seek(tp, start)
        records: list[Record] = []
        while True:
            batches = await self._consumer.getmany(tp, timeout_ms=1000, max_records=5000)
            got = batches.get(tp, [])
            for message in got:
                if message.offset > last:
                    return records
                records.append(Record(message.offset, message.value))
            if records and records[-1].offset >= last:
                return records
            if not got:
                # Compacted or transactional logs have gaps; stop once the end of the log is passed.
                end = (await self._consumer.end_offsets([tp]))[tp]
                if await self._consumer.position(tp) >= min(end, last + 1):
                    return records
