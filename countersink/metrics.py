"""Prometheus metrics of every countersink process, in one registry, exported by the health server.

Besides countersink's own series the registry carries the process (CPU, memory, open files), platform and
Python GC collectors, and ``countersink_build_info``. Counters and histograms export no ``_created`` series:
they double the series count and no dashboard or alert here reads them.
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

disable_created_metrics()  # type: ignore[no-untyped-call]


def _version() -> str:
    try:
        return version("countersink")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class PartitionFreshness(Collector):
    """Seconds since each owned partition's last completed flush, computed at each scrape: what is in
    Cassandra for a partition is at most this old (plus the flush interval). A partition this process no longer
    owns has no series."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._flushed: dict[tuple[str, str], float] = {}

    def flushed(self, topic: str, partition: int) -> None:
        self._flushed[(topic, str(partition))] = self._clock()

    def forget(self, topic: str, partition: int) -> None:
        self._flushed.pop((topic, str(partition)), None)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("countersink_partition_flush_age_seconds",
                                   "Seconds since the partition's last completed flush", labels=["topic", "partition"])
        now = self._clock()
        for (topic, partition), at in sorted(self._flushed.items()):
            family.add_metric([topic, partition], max(0.0, now - at))
        yield family


class GcAge(Collector):
    """Seconds since the last complete GC run (nothing deferred), as recorded in Cassandra by whichever GC
    worker ran it. No series until the process has read the record; +Inf when no run has ever completed."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._known = False
        self._last_complete_s: float | None = None

    def set_last_complete(self, seconds: float | None) -> None:
        """``seconds`` since the epoch of the last complete run's end, or None when none has completed."""
        self._known = True
        self._last_complete_s = seconds

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("countersink_gc_last_complete_age_seconds",
                                   "Seconds since a GC run last finished with nothing deferred (+Inf: never)")
        if self._known:
            last = self._last_complete_s
            family.add_metric([], math.inf if last is None else max(0.0, self._clock() - last))
        yield family


class GcLastRun(Collector):
    """The last ended GC run as recorded in Cassandra by whichever GC worker ran it (a CronJob's run exits
    before any scrape: its own counters die with it): when it ended, what it folded, deferred, collected and
    deleted, and its outcome. No series until the process has read a record of an ended run."""

    FIGURES = ("instances_folded", "instances_deferred", "mutators_collected", "shards_deleted")
    OUTCOMES = ("complete", "deferred", "failed", "stopped")

    def __init__(self) -> None:
        self._run: tuple[float, str, dict[str, int]] | None = None

    def set_last_run(self, ended_s: float, outcome: str, figures: dict[str, int]) -> None:
        self._run = (ended_s, outcome, figures)

    def collect(self) -> Iterable[Metric]:
        ended = GaugeMetricFamily("countersink_gc_last_run_end_timestamp_seconds",
                                  "When the last ended GC run (any worker, as recorded in Cassandra) ended")
        outcome = GaugeMetricFamily("countersink_gc_last_run_outcome",
                                    "1 for the outcome of the last ended GC run, 0 for the others",
                                    labels=["outcome"])
        figures = {name: GaugeMetricFamily(f"countersink_gc_last_run_{name}",
                                           f"{name.replace('_', ' ').capitalize()} by the last ended GC run")
                   for name in self.FIGURES}
        if self._run is not None:
            ended_s, last, counted = self._run
            ended.add_metric([], ended_s)
            for known in self.OUTCOMES:
                outcome.add_metric([known], 1.0 if known == last else 0.0)
            for name, family in figures.items():
                family.add_metric([], counted.get(name, 0))
        yield ended
        yield outcome
        yield from figures.values()


class Metrics:
    """All metric objects. One instance per process (``METRICS``); tests may build their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Info("countersink_build", "Version of countersink and of the Python running it",
                               registry=r)
        self.build_info.info({"version": _version(), "python": platform.python_version(),
                              "implementation": platform.python_implementation()})
        self.freshness = PartitionFreshness()
        r.register(self.freshness)
        self.gc_age = GcAge()
        r.register(self.gc_age)
        self.gc_last_run = GcLastRun()
        r.register(self.gc_last_run)
        self.cassandra_in_flight = Gauge("countersink_cassandra_in_flight", "Cassandra requests in flight", registry=r)
        self.cassandra_queue_timeouts = Counter(
            "countersink_cassandra_queue_timeouts", "Requests refused: no in-flight slot in time", registry=r)
        self.cassandra_errors = Counter(
            "countersink_cassandra_errors", "Failed Cassandra requests", ["kind"], registry=r)
        self.cassandra_request_seconds = Histogram(
            "countersink_cassandra_request_seconds", "Cassandra request latency", registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.cassandra_connections = Gauge(
            "countersink_cassandra_connections", "Open driver connections to Cassandra nodes", registry=r)
        self.cassandra_driver_timeouts = Counter(
            "countersink_cassandra_driver_timeouts", "Timeouts the Cassandra driver counted", ["level"], registry=r)
        self.events_applied = Counter("countersink_events_applied", "Events applied to counters", registry=r)
        self.dead_lettered = Counter("countersink_events_dead_lettered", "Invalid events sent to the dead-letter topic",
                                     registry=r)
        self.undecidable = Counter(
            "countersink_records_undecidable", "Records whose decision raised what no refusal should (a defect), "
            "dead-lettered as UndecidableRecordError", ["topic"], registry=r)
        self.not_applicable = Counter(
            "countersink_events_not_applicable", "Events skipped by a counter: they lack its key, value or bucket "
            "field (reason key_missing, value_null, ...; a replay counts its records again)", ["counter", "reason"],
            registry=r)
        self.refused = Counter(
            "countersink_events_refused", "Events a counter refused (a field of the wrong type or out of range), "
            "dead-lettered naming it", ["counter"], registry=r)
        self.duplicates_dropped = Counter("countersink_duplicates_dropped", "Publisher retries dropped by event id",
                                          registry=r)
        self.late_events = Counter(
            "countersink_late_events", "Events not counted: their bucket was past its retention when the record "
            "was written (a replay counts its records again)", ["counter"], registry=r)
        self.expired_writes_skipped = Counter(
            "countersink_expired_writes_skipped", "Instances a flush or replay did not write: their bucket was past "
            "its retention and grace by then (a backlog older than the retention, or records without a timestamp; "
            "a replay counts them again)", ["counter"], registry=r)
        self.flush_seconds = Histogram("countersink_flush_seconds", "Time to flush one mutator", registry=r)
        self.flush_rows = Histogram("countersink_flush_rows", "Shards written by one flush", registry=r,
                                    buckets=(1, 10, 100, 1_000, 10_000, 100_000))
        self.shard_rows_written = Counter(
            "countersink_shard_rows_written", "Cassandra rows of shards written by flushes (one per key flushed: "
            "the counters of a key share its row); what Cassandra's work follows", registry=r)
        self.flush_retries = Counter("countersink_flush_retries", "Flushes retried while Cassandra was unavailable",
                                     registry=r)
        self.live_mutators = Gauge("countersink_live_mutators", "Mutators owned by this process", registry=r)
        self.ownership_changes = Counter("countersink_ownership_changes", "Partitions taken over", registry=r)
        self.lag = Gauge("countersink_partition_lag", "Records between the consumer's position and the log end",
                         ["topic", "partition"], registry=r)
        self.expiries = Counter("countersink_mutator_expiries",
                                "Mutators replaced because they were past their expiry", registry=r)
        self.fencings = Counter("countersink_fencings", "Mutators found replaced by another owner", registry=r)
        self.records_lost = Counter(
            "countersink_records_lost", "Offsets deleted from the log (retention) before they were counted",
            ["topic", "partition"], registry=r)
        self.partitions_stopped = Gauge(
            "countersink_partitions_stopped", "Partitions not consumed because records were lost (on_records_lost "
            "= stop) or their topic was deleted and created again", registry=r)
        self.topic_checks_failed = Counter(
            "countersink_topic_checks_failed", "Checks of topic ids before a flush, release or rotation that could "
            "not be made (Kafka away): nothing applied was written then", registry=r)
        self.topics_recreated = Counter(
            "countersink_topic_recreated", "Partitions stopped because their topic's name stands for another topic "
            "than the one counted (deleted and created again)", ["topic", "partition"], registry=r)
        self.dead_letters_truncated = Counter(
            "countersink_dead_letters_truncated", "Dead letters sent truncated because the broker refused them whole",
            registry=r)
        self.gc_instances_folded = Counter("countersink_gc_instances_folded",
                                           "Instances whose final shards were folded into the tally", registry=r)
        self.gc_shards_deleted = Counter("countersink_gc_shards_deleted", "Shard rows folded and deleted", registry=r)
        self.gc_mutators_collected = Counter("countersink_gc_mutators_collected",
                                             "Retired mutators whose every instance was folded", registry=r)
        self.gc_instances_deferred = Counter("countersink_gc_instances_deferred",
                                             "Instances left for a later run (replica down or a failed check)",
                                             registry=r)
        self.gc_runs = Counter("countersink_gc_runs", "GC runs by outcome", ["outcome"], registry=r)
        self.gc_run_seconds = Histogram("countersink_gc_run_seconds", "Duration of one GC run", registry=r,
                                        buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600))
        self.gc_last_success = Gauge("countersink_gc_last_success_timestamp_seconds",
                                     "When a GC run last finished with nothing deferred", registry=r)
        self.serve_requests = Counter("countersink_serve_requests", "Read API requests by route and status",
                                      ["route", "status"], registry=r)
        self.serve_request_seconds = Histogram(
            "countersink_serve_request_seconds", "Read API request latency", ["route"], registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.serve_tokens_accepted = Gauge("countersink_serve_tokens_accepted",
                                           "Bearer tokens the read API accepts now", registry=r)
        self.serve_tokens_file_refused = Counter(
            "countersink_serve_tokens_file_refused",
            "Changes of the read API's tokens file refused (every token it held revoked), by reason: "
            "missing, unreadable, invalid", ["reason"], registry=r)
        self.serve_state_cache_reads = Counter(
            "countersink_serve_state_cache_reads",
            "Reads of the read API through its state cache, by outcome: recent (no request: the stamps found "
            "unchanged less than serve.max_staleness_s ago), checked (the stamps alone read, merge "
            "reused), patched (the rows of the sources that flushed since alone read), hit (the states read, "
            "unchanged, merge reused), partial (only changed shards decoded), miss",
            ["outcome"], registry=r)
        self.serve_state_cache_bytes = Gauge("countersink_serve_state_cache_bytes",
                                             "What the read API's state cache holds now", registry=r)

    def partition_flushed(self, topic: str, partition: int) -> None:
        """A flush of the partition completed: its freshness starts again from 0."""
        self.freshness.flushed(topic, partition)

    def forget_partition(self, topic: str, partition: int) -> None:
        """The partition was revoked or lost: drop its lag and freshness series, which would otherwise stay
        frozen at the last value this process saw while another member owns the partition."""
        with contextlib.suppress(KeyError):  # never set: the partition was released before its first batch
            self.lag.remove(topic, str(partition))
        self.freshness.forget(topic, partition)


METRICS = Metrics()
