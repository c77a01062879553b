"""Prometheus metrics of every countersink process, in one registry, exported by the health server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """All metric objects. One instance per process (``METRICS``); tests may build their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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
        self.cassandra_driver_timeouts = Gauge(
            "countersink_cassandra_driver_timeouts", "Timeouts the driver counted since start", ["level"], registry=r)
        self.events_applied = Counter("countersink_events_applied", "Events applied to counters", registry=r)
        self.dead_lettered = Counter("countersink_events_dead_lettered", "Invalid events sent to the dead-letter topic",
                                     registry=r)
        self.duplicates_dropped = Counter("countersink_duplicates_dropped", "Publisher retries dropped by event id",
                                          registry=r)
        self.flush_seconds = Histogram("countersink_flush_seconds", "Time to flush one mutator", registry=r)
        self.flush_rows = Histogram("countersink_flush_rows", "Shards written by one flush", registry=r,
                                    buckets=(1, 10, 100, 1_000, 10_000, 100_000))
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
            "= stop)", registry=r)
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


METRICS = Metrics()
