"""The record of GC runs in Cassandra (table ``gc_runs``), so that their outcome outlives the process.

A GC worker run from cron exits before any Prometheus scrape: its own metrics die with it. Each run writes
a row when it starts and completes it when it ends (folded, deferred, the error of a failed run), and a
complete run (nothing deferred) moves the partition's ``last_complete_us``. Every long-running process (the
consumer, ``serve``, the GC loop) reads that value when scraped and exports its age as
``countersink_gc_last_complete_age_seconds``: an alert on it tells an operator that GC has not completed for
a day, whichever pod ran it, or whether any did.

Writing this record never fails a run: a keyspace created before the table existed gets it from
``countersink schema``, and meanwhile the GC logs a warning and goes on. (The cutoff each run records in the
same partition, ``cutoff_us``, is another matter: gc_worker.store; a run that cannot record it folds nothing.)
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from countersink.cassandra import CassandraClient, CassandraError, as_dicts
from countersink.logs import get_logger
from countersink.metrics import METRICS

log = get_logger(__name__)

RUNS_PARTITION = "gc"  # every run in one partition, newest first: a few rows a day, kept 30 days
_RUNS_SAMPLED = 5  # the newest runs, among which the one that ended last is exported
_ERROR_CHARS = 1000  # an error's text is bounded: it comes from the driver, whose messages can be long


@dataclasses.dataclass(frozen=True)
class GcRun:
    """One run as recorded. ``ended_us`` is None while it runs (or if it died without a word)."""

    run: uuid.UUID
    started_us: int
    ended_us: int | None
    outcome: str  # running, complete, deferred, failed, stopped
    host: str
    instances_folded: int
    instances_deferred: int
    mutators_collected: int
    shards_deleted: int
    error: str | None


class GcRunLog:
    """Reads and writes ``gc_runs`` through one client."""

    def __init__(self, client: CassandraClient) -> None:
        self.client = client

    async def started(self, run: uuid.UUID, started_us: int, host: str) -> bool:
        """Record that ``run`` started; False (and a warning) when the record could not be written."""
        return await self._write(
            "INSERT INTO gc_runs (name, started_us, run, host, outcome) VALUES (?, ?, ?, ?, 'running')",
            [RUNS_PARTITION, started_us, run, host])

    async def finished(self, run: uuid.UUID, started_us: int, ended_us: int, *, outcome: str,
                       instances_folded: int = 0, instances_deferred: int = 0, mutators_collected: int = 0,
                       shards_deleted: int = 0, error: str | None = None) -> bool:
        """Record how ``run`` ended; a complete run also moves ``last_complete_us`` (never backwards: it is
        written at the run's end time, so a slower, older run finishing later does not hide a newer one)."""
        wrote = await self._write(
            "UPDATE gc_runs SET ended_us = ?, outcome = ?, instances_folded = ?, instances_deferred = ?, "
            "mutators_collected = ?, shards_deleted = ?, error = ? WHERE name = ? AND started_us = ? AND run = ?",
            [ended_us, outcome, instances_folded, instances_deferred, mutators_collected, shards_deleted,
             None if error is None else error[:_ERROR_CHARS], RUNS_PARTITION, started_us, run])
        if wrote and outcome == "complete":
            # TTL 0: the last complete run is remembered however long ago it was, unlike the rows of runs.
            wrote = await self._write(
                "UPDATE gc_runs USING TIMESTAMP ? AND TTL 0 SET last_complete_us = ? WHERE name = ?",
                [ended_us, ended_us, RUNS_PARTITION])
        return wrote

    async def _write(self, cql_text: str, params: list[object]) -> bool:
        try:
            await self.client.execute(cql_text, params)
        except CassandraError as exc:
            log.warning("gc_run_not_recorded", error=str(exc))
            return False
        return True

    async def last_complete_us(self) -> int | None:
        """When the last complete run ended (µs since the epoch), or None if none ever did."""
        rows = as_dicts(await self.client.execute(
            "SELECT last_complete_us FROM gc_runs WHERE name = ? LIMIT 1", [RUNS_PARTITION]))
        value = rows[0]["last_complete_us"] if rows else None
        return None if value is None else int(value)

    async def recent(self, limit: int = 20) -> list[GcRun]:
        """The latest ``limit`` runs, newest first."""
        rows = as_dicts(await self.client.execute(
            "SELECT run, started_us, ended_us, outcome, host, instances_folded, instances_deferred, "
            "mutators_collected, shards_deleted, error FROM gc_runs WHERE name = ? LIMIT ?",
            [RUNS_PARTITION, limit]))
        return [GcRun(uuid.UUID(str(r["run"])), int(r["started_us"]), _int_or_none(r["ended_us"]),
                      str(r["outcome"] or ""), str(r["host"] or ""), int(r["instances_folded"] or 0),
                      int(r["instances_deferred"] or 0), int(r["mutators_collected"] or 0),
                      int(r["shards_deleted"] or 0), r["error"])
                for r in rows if r["run"] is not None]


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


class GcAgeSampler:
    """Refreshes ``countersink_gc_last_complete_age_seconds`` and the last ended run's figures
    (``countersink_gc_last_run_*``) from Cassandra, at most every ``refresh_s``: called before each scrape, it
    costs two single-partition reads per refresh, not per scrape."""

    def __init__(self, client: CassandraClient, refresh_s: float = 30.0) -> None:
        self.log = GcRunLog(client)
        self.refresh_s = refresh_s
        self._next_read = 0.0

    async def __call__(self) -> None:
        if self.log.client.connections() == 0 or time.monotonic() < self._next_read:
            return  # not connected (yet, or every node away): the last value read stands
        self._next_read = time.monotonic() + self.refresh_s
        last_us = await self.log.last_complete_us()
        METRICS.gc_age.set_last_complete(None if last_us is None else last_us / 1e6)
        ended = max((run for run in await self.log.recent(_RUNS_SAMPLED) if run.ended_us is not None),
                    key=lambda run: run.ended_us or 0, default=None)  # runs may overlap: the one that ended last
        if ended is not None and ended.ended_us is not None:
            METRICS.gc_last_run.set_last_run(ended.ended_us / 1e6, ended.outcome, {
                "instances_folded": ended.instances_folded, "instances_deferred": ended.instances_deferred,
                "mutators_collected": ended.mutators_collected, "shards_deleted": ended.shards_deleted})
