"""``countersink gc`` (fold the shards of retired mutators into tallies) and ``countersink retire-orphans``.

Exit codes of ``gc --once``: 0 when every final mutator was collected, 3 when some instances were deferred
(a replica unavailable for the CL ALL read, or a failed safety check: see the log), 1 when the run failed
(Cassandra unreachable), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from typing import Any

from consumer.cassandra_store import CassandraStore
from consumer.storage import PartitionId, PartitionRow
from countersink.cassandra import CassandraClient, CassandraError
from countersink.cli import run_async, stop_on_signals
from countersink.consistency import ConsistencyError, check_deciding_reads
from countersink.health import HealthServer
from countersink.kafka import start_admin
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.retry import pause_unless_stopped
from countersink.settings import Consistency, Settings
from gc_worker.collector import Collector, GcReport
from gc_worker.orphans import find_orphans
from gc_worker.store import CassandraGcStore

log = get_logger(__name__)

EXIT_DEFERRED = 3

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``5m``, ``1.5h``, ``2d``."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 5m, 1h or 2d")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def now_us() -> int:
    return time.time_ns() // 1000


# ------------------------------------------------------------------------------------------------ gc


def add_gc_arguments(parser: argparse.ArgumentParser) -> None:
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one run, then exit (for cron); the default")
    when.add_argument("--every", type=parse_duration, metavar="DURATION",
                      help="run in a loop, e.g. 5m (default: COUNTERSINK_GC__EVERY_S; 0 means once)")
    parser.add_argument("--dry-run", action="store_true", help="show what would be folded; write nothing")
    parser.add_argument("--grace", type=parse_duration, metavar="DURATION",
                        help="fold only mutators retired this long ago (default: COUNTERSINK_GC__GRACE_S)")
    parser.add_argument("--consistency", type=Consistency, choices=list(Consistency),
                        help="consistency of the instance reads (default: COUNTERSINK_CASSANDRA__GC_READ_CONSISTENCY)")
    parser.add_argument("--concurrency", type=int,
                        help="instances worked on at once (default: COUNTERSINK_GC__CONCURRENCY)")
    parser.add_argument("--json", action="store_true", help="print each run's report as one JSON line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")


def run_gc(args: argparse.Namespace, settings: Settings) -> int:
    updates: dict[str, Any] = {}
    if args.every is not None:
        updates["every_s"] = args.every
    if args.once:
        updates["every_s"] = 0.0
    if args.grace is not None:
        updates["grace_s"] = args.grace
    if args.concurrency is not None:
        if args.concurrency < 1:
            print("countersink gc: --concurrency must be at least 1", file=sys.stderr)
            return 2
        updates["concurrency"] = args.concurrency
    if updates:
        settings = settings.model_copy(update={"gc": settings.gc.model_copy(update=updates)})
    # A one-shot run keeps SIGTERM's default action: every step is idempotent and the next run finishes it.
    return run_async(_gc_main(settings, args), graceful=settings.gc.every_s > 0)


async def _gc_main(settings: Settings, args: argparse.Namespace) -> int:
    if settings.gc.every_s <= 0:
        try:
            async with CassandraClient(settings.cassandra, app="countersink-gc") as client:
                report = await _one_run(settings, client, args)
        except ConsistencyError as exc:
            log.error("settings_refused", error=str(exc))
            return 2
        except CassandraError as exc:
            log.error("gc_failed", error=str(exc))
            METRICS.gc_runs.labels(outcome="failed").inc()
            return 1
        return EXIT_DEFERRED if report.instances_deferred else 0
    return await _loop(settings, args)


async def _one_run(settings: Settings, client: CassandraClient, args: argparse.Namespace) -> GcReport:
    store = CassandraGcStore(client, instance_consistency=args.consistency)
    # A read that misses a shard would fold the tally without it and delete nothing for it, or fold it twice.
    check_deciding_reads(settings.cassandra, await client.replication_factors(),
                         {"gc_read_consistency": store.instance_cl})
    progress = _Progress(settings.gc.progress_interval_s, bar=not args.no_progress and sys.stderr.isatty())
    collector = Collector(
        store, int(settings.gc.grace_s * 1e6),
        dry_run=args.dry_run,
        concurrency=settings.gc.concurrency,
        forget_after_us=int(settings.gc.forget_after_s * 1e6),
        progress=progress,
    )
    started = time.perf_counter()
    log.info("gc_started", grace_s=settings.gc.grace_s, consistency=str(store.instance_cl), dry_run=args.dry_run)
    try:
        report = await collector.run(now_us())
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    if not args.dry_run:
        METRICS.gc_instances_folded.inc(report.instances_folded)
        METRICS.gc_shards_deleted.inc(report.shards_deleted)
        METRICS.gc_mutators_collected.inc(report.mutators_collected)
        METRICS.gc_instances_deferred.inc(report.instances_deferred)
        METRICS.gc_run_seconds.observe(elapsed)
        METRICS.gc_runs.labels(outcome="deferred" if report.instances_deferred else "complete").inc()
        if not report.instances_deferred:
            METRICS.gc_last_success.set(time.time())
    log.info("gc_finished", seconds=round(elapsed, 3), **{k: v for k, v in report.as_dict().items() if k != "deferred"})
    if args.json:
        print(json.dumps({**report.as_dict(), "seconds": round(elapsed, 3)}), flush=True)
    else:
        print(_summary(report, elapsed), flush=True)
    return report


def _summary(report: GcReport, elapsed: float) -> str:
    verb = "would fold" if report.dry_run else "folded"
    lines = [
        f"gc{' (dry run)' if report.dry_run else ''}: {report.mutators_final} retired mutators to collect, "
        f"{report.mutators_waiting} within the grace period",
        f"  {verb} {report.instances_folded} instances ({report.shards_deleted} shards) of "
        f"{report.instances_checked} checked; {report.mutators_collected} mutators "
        f"{'would be ' if report.dry_run else ''}collected, {report.mutators_forgotten} "
        f"{'would be ' if report.dry_run else ''}forgotten; {elapsed:.1f}s",
    ]
    if report.instances_deferred:
        lines.append(f"  deferred {report.instances_deferred} instances (run again later; exit code {EXIT_DEFERRED}):")
        lines.extend(f"    {item}" for item in report.deferred)
    return "\n".join(lines)


class _Progress:
    """A progress bar on a terminal; otherwise a log line at most every ``interval_s``."""

    def __init__(self, interval_s: float, *, bar: bool) -> None:
        self.interval_s = interval_s
        self._bar: Any = None
        self._use_bar = bar
        self._last = 0.0

    def __call__(self, done: int, total: int, report: GcReport) -> None:
        if self._use_bar:
            if self._bar is None:
                from tqdm import tqdm  # only interactive runs need it

                self._bar = tqdm(total=total, unit="mutator", desc="gc", file=sys.stderr)
            self._bar.n = done
            self._bar.set_postfix(folded=report.instances_folded, deferred=report.instances_deferred, refresh=False)
            self._bar.refresh()
            return
        moment = time.monotonic()
        if done == total or moment - self._last >= self.interval_s:
            self._last = moment
            log.info("gc_progress", mutators_done=done, mutators_total=total, instances_folded=report.instances_folded,
                     instances_deferred=report.instances_deferred)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _loop(settings: Settings, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        return await _loop_until(stop, settings, args)


async def _loop_until(stop: asyncio.Event, settings: Settings, args: argparse.Namespace) -> int:
    healthy = {"ok": True}
    health = HealthServer(settings.gc.health_port, ready=lambda: healthy["ok"]) if settings.gc.health_port else None
    if health:
        await health.start()
    client = CassandraClient(settings.cassandra, app="countersink-gc")
    try:
        while not stop.is_set():
            run = asyncio.ensure_future(_guarded_run(settings, client, args))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({run, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not run.done():
                # A run may stop anywhere: every step is idempotent and the next run finishes the work.
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                break
            try:
                healthy["ok"] = run.result()
            except ConsistencyError as exc:
                log.error("settings_refused", error=str(exc))
                return 2
            await pause_unless_stopped(settings.gc.every_s, stop)
    finally:
        await client.stop()
        if health:
            await health.stop()
    log.info("gc_loop_stopped")
    return 0


async def _guarded_run(settings: Settings, client: CassandraClient, args: argparse.Namespace) -> bool:
    """One run of the loop; a failure is logged and the loop goes on. Returns whether it succeeded."""
    try:
        await client.start()
        await _one_run(settings, client, args)
    except CassandraError as exc:
        log.error("gc_failed", error=str(exc))
        METRICS.gc_runs.labels(outcome="failed").inc()
        await client.stop()  # connect afresh next time
        return False
    return True


# ------------------------------------------------------------------------------------------------ orphans


def add_retire_orphans_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apply", action="store_true", help="retire them (without it: only list them)")
    parser.add_argument("--grace", type=parse_duration, metavar="DURATION",
                        help="only mutators expired this long ago (default: COUNTERSINK_GC__GRACE_S)")
    parser.add_argument("--json", action="store_true", help="print the orphans as JSON lines")


def run_retire_orphans(args: argparse.Namespace, settings: Settings) -> int:
    grace_s = settings.gc.grace_s if args.grace is None else args.grace
    return run_async(_retire_orphans(settings, int(grace_s * 1e6), apply=args.apply, as_json=args.json))


async def _partition_counts(settings: Settings) -> dict[str, int]:
    admin = await start_admin(settings.kafka)  # a refused login or certificate: one line, not a traceback
    try:
        names = [t for t in await admin.list_topics() if not t.startswith("__")]
        described = await admin.describe_topics(names) if names else []
    finally:
        await admin.close()
    counts = {}
    for topic in described:
        name = topic.get("topic") or topic.get("name")
        if topic.get("error_code", 0) == 0 and name:
            counts[str(name)] = len(topic.get("partitions") or ())
    return counts


async def _retire_orphans(settings: Settings, grace_us: int, *, apply: bool, as_json: bool) -> int:
    try:
        counts = await _partition_counts(settings)
        async with CassandraClient(settings.cassandra, app="countersink-gc") as client:
            registry = await CassandraGcStore(client).read_registry()
            store = CassandraStore(client)
            rows: dict[PartitionId, PartitionRow | None] = {}
            for entry in registry:
                pid = PartitionId(entry.consumer_group, entry.topic, entry.partition)
                if entry.retired_us is None and pid not in rows:
                    rows[pid] = await store.read_partition(pid)
            orphans = find_orphans(registry, rows, counts, now_us(), grace_us)
            for orphan in orphans:
                e = orphan.entry
                if as_json:
                    print(json.dumps({"mutator": str(e.id), "group": e.consumer_group, "topic": e.topic,
                                      "partition": e.partition, "reason": orphan.reason, "retire_us": orphan.retire_us,
                                      "retired": apply}))
                else:
                    print(f"{'retiring' if apply else 'would retire'} {e.id} ({e.consumer_group} {e.topic}/"
                          f"{e.partition}): {orphan.reason}")
                if apply:
                    await store.retire_mutator(e.id, orphan.retire_us)
                    log.info("orphan_retired", mutator=str(e.id), reason=orphan.reason)
    except CassandraError as exc:
        log.error("retire_orphans_failed", error=str(exc))
        return 1
    if not as_json:
        tail = "" if apply or not orphans else "; run again with --apply to retire them"
        print(f"{len(orphans)} orphaned mutators{tail}")
    return 0

