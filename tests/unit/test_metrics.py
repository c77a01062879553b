"""The metrics registry: process and build series, freshness per partition, revoked partitions forgotten,
driver timeouts counted, no ``_created`` series."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from countersink.cassandra import CassandraClient
from countersink.metrics import METRICS, GcAge, Metrics, PartitionFreshness
from countersink.settings import CassandraSettings


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exposition = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(exposition) for s in family.samples}


def names(metrics: Metrics) -> set[str]:
    return {name for name, _ in samples(metrics)}


def test_process_platform_and_build_series() -> None:
    """The registry carries the process, platform and Python GC collectors and countersink_build_info."""
    exposed = names(Metrics())
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "python_info",
            "python_gc_collections_total", "countersink_build_info"} <= exposed
    build = [labels for (name, labels) in samples(Metrics()) if name == "countersink_build_info"]
    assert dict(build[0])["version"]


def test_no_created_series() -> None:
    """Counters and histograms export no _created series."""
    metrics = Metrics()
    metrics.events_applied.inc()
    metrics.flush_seconds.observe(0.1)
    assert not [n for n in names(metrics) if n.endswith("_created")]


def test_freshness_is_the_time_since_the_last_flush() -> None:
    """Each partition's flush age grows with time and restarts at 0 when it flushes again."""
    now = [100.0]
    freshness = PartitionFreshness(clock=lambda: now[0])
    freshness.flushed("trades", 0)
    now[0] = 107.5
    freshness.flushed("trades", 1)
    now[0] = 110.0
    ages = {tuple(s.labels.values()): s.value for f in freshness.collect() for s in f.samples}
    assert ages == {("trades", "0"): 10.0, ("trades", "1"): 2.5}
    freshness.forget("trades", 0)
    assert [s.labels["partition"] for f in freshness.collect() for s in f.samples] == ["1"]


def test_revoked_partition_series_are_removed() -> None:
    """forget_partition drops the lag and freshness series of that partition only."""
    metrics = Metrics()
    for partition in (0, 1):
        metrics.lag.labels("trades", str(partition)).set(5)
        metrics.partition_flushed("trades", partition)
    metrics.forget_partition("trades", 0)
    metrics.forget_partition("trades", 7)  # never owned: nothing to remove, no error
    left = {(n, dict(labels)["partition"]) for n, labels in samples(metrics)
            if n in ("countersink_partition_lag", "countersink_partition_flush_age_seconds")}
    assert left == {("countersink_partition_lag", "1"), ("countersink_partition_flush_age_seconds", "1")}


def test_gc_age() -> None:
    """The GC age is absent until read, +Inf when no run completed, else the seconds since the last one."""
    age = GcAge(clock=lambda: 1_000.0)
    assert [s for f in age.collect() for s in f.samples] == []
    age.set_last_complete(None)
    assert [s.value for f in age.collect() for s in f.samples] == [math.inf]
    age.set_last_complete(940.0)
    assert [s.value for f in age.collect() for s in f.samples] == [60.0]


def test_the_last_gc_run_recorded_is_exported() -> None:
    """No series until a run is read; then when it ended, its outcome (1 among the known ones) and figures."""
    metrics = Metrics()
    exported = lambda: {(s.name, tuple(s.labels.items())): s.value  # noqa: E731
                        for f in metrics.gc_last_run.collect() for s in f.samples}
    assert exported() == {}
    metrics.gc_last_run.set_last_run(1_000.5, "deferred", {"instances_folded": 7, "instances_deferred": 2,
                                                          "mutators_collected": 1, "shards_deleted": 30})
    assert exported() == {
        ("countersink_gc_last_run_end_timestamp_seconds", ()): 1_000.5,
        ("countersink_gc_last_run_outcome", (("outcome", "complete"),)): 0.0,
        ("countersink_gc_last_run_outcome", (("outcome", "deferred"),)): 1.0,
        ("countersink_gc_last_run_outcome", (("outcome", "failed"),)): 0.0,
        ("countersink_gc_last_run_outcome", (("outcome", "stopped"),)): 0.0,
        ("countersink_gc_last_run_instances_folded", ()): 7,
        ("countersink_gc_last_run_instances_deferred", ()): 2,
        ("countersink_gc_last_run_mutators_collected", ()): 1,
        ("countersink_gc_last_run_shards_deleted", ()): 30,
    }
    assert "countersink_gc_last_run_shards_deleted 30.0" in generate_latest(metrics.registry).decode()


def test_driver_timeouts_are_a_counter() -> None:
    """cassandra_driver_timeouts is exported as a counter (the _total series), not a gauge."""
    metrics = Metrics()
    metrics.cassandra_driver_timeouts.labels(level="request").inc(2)
    exposition = generate_latest(metrics.registry).decode()
    assert "# TYPE countersink_cassandra_driver_timeouts_total counter" in exposition
    assert 'countersink_cassandra_driver_timeouts_total{level="request"} 2.0' in exposition


class _DriverStats:
    def __init__(self, connection: int, request: int) -> None:
        self.stats_total_connections = 1
        self.errors_connection_timeouts = connection
        self.errors_request_timeouts = request


class _SessionCounting:
    """The driver's session as sample_driver_metrics sees it: running counts of timeouts since it opened."""

    def __init__(self) -> None:
        self.stats = _DriverStats(0, 0)

    def metrics(self) -> _DriverStats:
        return self.stats


def test_driver_running_counts_become_counter_increments() -> None:
    """Sampling the driver's running counts adds only what they grew by, so repeated samples count nothing
    twice (as a gauge set to the running count, rate() made no sense and restarts looked like drops)."""
    def total(level: str) -> float:
        return METRICS.cassandra_driver_timeouts.labels(level=level)._value.get()  # type: ignore[no-any-return]

    before = {level: total(level) for level in ("connection", "request")}
    client = CassandraClient(CassandraSettings())
    session = _SessionCounting()
    client._session = session
    for connection, request in [(0, 2), (0, 2), (1, 5), (1, 5)]:
        session.stats = _DriverStats(connection, request)
        client.sample_driver_metrics()
    client._session = None
    assert total("connection") - before["connection"] == 1
    assert total("request") - before["request"] == 5
