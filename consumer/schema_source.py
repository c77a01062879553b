"""Records read again (replays, the retry window's warm-up) with their writer schemas loaded first.

The router decodes Avro, Protobuf and JSON Schema records from a cache it never fills itself; every path that
hands it records loads their schema ids before: the live loop (``consumer.service``), and this wrapper of the
record source for the others. A registry that cannot be reached raises a retriable error, which the takeover's
retry waits out like a server away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from consumer.applying import Record, RecordSource
from countersink.schema_registry import SchemaLoader


class SchemaLoadingSource:
    """A :class:`~consumer.applying.RecordSource` whose records' writer schemas are in the cache when returned."""

    def __init__(self, source: RecordSource, loader: SchemaLoader) -> None:
        self.source = source
        self.loader = loader

    async def start(self) -> None:
        start = getattr(self.source, "start", None)
        if start is not None:
            await start()

    async def stop(self) -> None:
        stop = getattr(self.source, "stop", None)
        if stop is not None:
            await stop()

    # Each method loads for a holder of its own per partition (SchemaCache): its caller routes the records after
    # awaits of its own (resets looked up, a server away), and the cache keeps their schemas until then.
    async def read(self, topic: str, partition: int, first: int, last: int) -> list[Record]:
        records = await self.source.read(topic, partition, first, last)
        await self.loader.load(topic, (r.value for r in records), ("read", topic, partition))
        return records

    async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        holder = ("stream", topic, partition)
        try:
            async for chunk in self.source.stream(topic, partition, first, last):
                await self.loader.load(topic, (r.value for r in chunk), holder)
                yield chunk
        finally:
            self.loader.cache.release(holder)

    async def read_back(self, topic: str, partition: int, before: int, count: int) -> list[Record]:
        records = await self.source.read_back(topic, partition, before, count)
        await self.loader.load(topic, (r.value for r in records), ("read_back", topic, partition))
        return records

    async def log_start(self, topic: str, partition: int) -> int:
        return await self.source.log_start(topic, partition)
