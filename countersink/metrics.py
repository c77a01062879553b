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
        self.cassandra_host_events = Counter(
            "countersink_cassandra_host_events", "Cassandra node discovery and up/down events", ["event"], registry=r)


METRICS = Metrics()
