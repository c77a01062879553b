"""The one flush in flight: every owned mutator flushed in the background while the loop goes on applying.

One flush at a time: the loop waits for it when the next is due, so consumption pauses while Cassandra
cannot take writes. Each mutator's flush takes its intent offset and shard bytes together when it begins;
what the loop applies meanwhile goes to the next one.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import TopicPartition

from consumer.applying import Mutator
from consumer.dead_letters import DeadLetters
from consumer.ownership import Ownership, PartitionRetry
from consumer.protocol import FencedError, MutatorExpiredError, flush
from consumer.storage import Store
from countersink.cassandra import CassandraClient
from countersink.metrics import METRICS

Expired = list[tuple[TopicPartition, Mutator]]


class Flushing:
    """Starts, awaits and times the flush in flight."""

    def __init__(self, store: Store, ownership: Ownership, dead_letters: DeadLetters, retry: PartitionRetry,
                 cassandra: CassandraClient | None = None) -> None:
        self.store = store
        self.ownership = ownership
        self.dead_letters = dead_letters
        self.retry = retry
        self.cassandra = cassandra
        self.last_started = time.monotonic()
        self.last_took_s = 0.0
        self._task: asyncio.Task[Expired] | None = None

    @property
    def in_flight(self) -> bool:
        return self._task is not None

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def start(self) -> None:
        """Start flushing every owned mutator in the background."""
        self.last_started = time.monotonic()
        # Every dead letter sent so far is awaited before any window is opened or committed by this flush,
        # and so before any window that skips their records is recorded complete (by the next flush).
        self._task = asyncio.create_task(
            self._flush_all(list(self.ownership.mutators.items()), self.dead_letters.take()))

    async def finish(self) -> Expired:
        """Wait for the flush in flight, raising its error; returns the mutators it found past their expiry,
        which wrote nothing and must be replaced."""
        task, self._task = self._task, None
        return [] if task is None else await task

    async def wait_until_done(self) -> None:
        """Wait for the flush in flight to end, without raising its error: the loop raises it when it
        finishes that flush. A mutator is never released while a flush of it may still be running."""
        if self._task is not None:
            await asyncio.wait([self._task])

    def forget(self) -> BaseException | None:
        """Drop the flush in flight (ended) and return the error it ended with, if any."""
        task, self._task = self._task, None
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def _flush_all(self, mutators: Expired, dead_letters: list[asyncio.Future[None]]) -> Expired:
        started = time.monotonic()
        if dead_letters:
            await asyncio.gather(*dead_letters)
        # Mutators own different partitions and rows, so their flushes overlap: one LWT's round trip does not
        # idle the others, and the client's in-flight slots stay full.
        outcomes = await asyncio.gather(*(self.flush_one(tp, m) for tp, m in mutators), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]
        self.last_took_s = time.monotonic() - started
        if self.cassandra is not None:
            self.cassandra.sample_driver_metrics()
        return [(tp, mutator) for (tp, mutator), expired in zip(mutators, outcomes, strict=True) if expired is True]

    async def flush_one(self, tp: TopicPartition, mutator: Mutator) -> bool:
        """Flush one mutator, retrying while Cassandra is unavailable. True when the mutator is past its expiry
        (it wrote nothing; the caller replaces it). A mutator whose takeover is still replaying is left for a
        later flush: one slow replay must not hold every other partition's flush."""
        if mutator.fenced or self.ownership.takeover_pending(mutator):
            return False
        started = time.perf_counter()

        async def attempt() -> int:
            nonlocal started
            started = time.perf_counter()  # the attempt that succeeds is timed, not the outage before it
            return await flush(self.store, mutator, self.ownership.clock())

        try:
            rows = await self.retry("flush", tp, attempt, on_retry=METRICS.flush_retries.inc)
        except FencedError as exc:
            self.ownership.drop(tp, mutator, str(exc))
            return False
        except MutatorExpiredError:
            return True
        if rows:
            METRICS.flush_seconds.observe(time.perf_counter() - started)
            METRICS.flush_rows.observe(rows)
        METRICS.partition_flushed(tp.topic, tp.partition)
        return False
