"""``countersink gc`` (fold the shards of retired mutators into tallies) and ``countersink retire-orphans``.

Exit codes of ``gc --once``: 0 when every final mutator was collected, 3 when some instances were deferred
(a replica unavailable for the CL ALL read, or a failed safety check: see the log), 1 when the run failed
(Cassandra unreachable), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from consumer.cassandra_store import CassandraStore
from consumer.storage import PartitionId, PartitionRow
from countersink.cassandra import CassandraClient, CassandraError
from countersink.cli import consistency_level, positive_int, run_async, setting_default, stop_on_signals
from countersink.consistency import ConsistencyError, check_deciding_reads
from countersink.gc_runs import GcAgeSampler, GcRunLog
from countersink.health import HealthServer
from countersink.kafka import start_admin
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.resets import read_epochs
from countersink.retry import pause_unless_stopped
from countersink.settings import Consistency, Settings, given_options, with_options
from gc_worker.collector import Collector, GcReport
from gc_worker.orphans import find_orphans
from gc_worker.store import CassandraGcStore, GcClockAheadError

log = get_logger(__name__)
# What fails one GC run (logged, counted, recorded in gc_runs) without ending the loop: Cassandra away, or this
# worker's clock too far ahead to record its cutoff.
RUN_FAILURES = (CassandraError, GcClockAheadError)

EXIT_DEFERRED = 3
# How long a run stopped by the loop's SIGTERM may take to record that it stopped.
_STOPPED_RECORD_TIMEOUT_S = 5.0

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
                      help="run in a loop, e.g. 5m; 0 means once " + setting_default("gc.every_s"))
    when.add_argument("--runs", type=int, nargs="?", const=10, metavar="N",
                      help="show the last N runs recorded in Cassandra (default 10) and when one last completed; "
                           "run nothing")
    parser.add_argument("--dry-run", action="store_true", help="show what would be folded; write nothing")
    parser.add_argument("--grace", type=parse_duration, metavar="DURATION",
                        help="fold only mutators retired this long ago, e.g. 5m " + setting_default("gc.grace_s"))
    parser.add_argument("--consistency", type=consistency_level, metavar="LEVEL",
                        help="consistency of the instance reads, any case: " + ", ".join(Consistency) + " "
                        + setting_default("cassandra.gc_read_consistency"))
    parser.add_argument("--concurrency", type=positive_int,
                        help="instances worked on at once " + setting_default("gc.concurrency"))
    parser.add_argument("--json", action="store_true", help="print each run's report as one JSON line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")


def run_gc(args: argparse.Namespace, settings: Settings) -> int:
    if args.runs is not None:
        if not 1 <= args.runs <= 1000:
            print("countersink gc: --runs takes 1 to 1000", file=sys.stderr)
            return 2
        return run_async(_show_runs(settings, args.runs, as_json=args.json))
    options = given_options(args, ("every_s", "--every", "every"), ("grace_s", "--grace", "grace"),
                            ("concurrency", "--concurrency", "concurrency"))
    if args.once:
        options["every_s"] = ("--once", 0.0)
    if options:
        settings = settings.model_copy(update={"gc": with_options(settings.gc, options)})
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
        except RUN_FAILURES as exc:
            log.error("gc_failed", error=str(exc))
            METRICS.gc_runs.labels(outcome="failed").inc()
            return 1
        return EXIT_DEFERRED if report.instances_deferred else 0
    return await _loop(settings, args)


async def _one_run(settings: Settings, client: CassandraClient, args: argparse.Namespace) -> GcReport:
    store = CassandraGcStore(client, instance_consistency=args.consistency)
    # A read that misses a shard would fold the tally without it and delete nothing for it, or fold it twice;
    # one that misses a registry or work-list row would collect a mutator whose shards were never folded.
    check_deciding_reads(settings.cassandra, await client.replication_factors(),
                         {"gc_read_consistency": store.instance_cl, "gc_list_consistency": store.list_cl})
    progress = _Progress(settings.gc.progress_interval_s, bar=not args.no_progress and sys.stderr.isatty())
    collector = Collector(
        store, int(settings.gc.grace_s * 1e6),
        dry_run=args.dry_run,
        concurrency=settings.gc.concurrency,
        forget_after_us=int(settings.gc.forget_after_s * 1e6),
        progress=progress,
        epochs_of=functools.partial(read_epochs, client),
    )
    started = time.perf_counter()
    run, started_us = uuid.uuid4(), now_us()
    runs = None if args.dry_run else GcRunLog(client)
    try:
        if runs is not None:
            await runs.started(run, started_us, f"{socket.gethostname()}:{os.getpid()}")
        log.info("gc_started", run=str(run), grace_s=settings.gc.grace_s, consistency=str(store.instance_cl),
                 dry_run=args.dry_run)
        report = await collector.run(started_us)
    except RUN_FAILURES as exc:
        if runs is not None:
            await runs.finished(run, started_us, now_us(), outcome="failed", error=str(exc))
        raise
    except asyncio.CancelledError:
        # The loop stops a run where it is (SIGTERM): say so, or its record would read "running" for good.
        # Bounded: a Cassandra that does not answer must not hold the stop up.
        if runs is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runs.finished(run, started_us, now_us(), outcome="stopped"),
                                       _STOPPED_RECORD_TIMEOUT_S)
        log.info("gc_stopped", run=str(run))
        raise
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    if runs is not None:
        ended_us = now_us()
        complete = await runs.finished(
            run, started_us, ended_us, outcome="deferred" if report.instances_deferred else "complete",
            instances_folded=report.instances_folded, instances_deferred=report.instances_deferred,
            mutators_collected=report.mutators_collected, shards_deleted=report.shards_deleted)
        if complete and not report.instances_deferred:
            METRICS.gc_age.set_last_complete(ended_us / 1e6)
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


async def _show_runs(settings: Settings, limit: int, *, as_json: bool) -> int:
    """The record of the latest runs (what a CronJob's pods leave behind), newest first."""
    try:
        async with CassandraClient(settings.cassandra, app="countersink-gc") as client:
            runs = GcRunLog(client)
            last_us = await runs.last_complete_us()
            recent = await runs.recent(limit)
    except CassandraError as exc:
        log.error("gc_runs_unreadable", error=str(exc))
        return 1
    if as_json:
        print(json.dumps({"last_complete_us": last_us}))
        for run in recent:
            print(json.dumps({**dataclasses.asdict(run), "run": str(run.run)}))
        return 0
    now = time.time()
    print("last complete run: " + ("never" if last_us is None else
                                   f"{_when(last_us)} ({_ago(now - last_us / 1e6)} ago)"))
    if recent:
        print(f"{'started':<21} {'outcome':<9} {'seconds':>8} {'folded':>8} {'deferred':>8} {'collected':>9}  host")
    for run in recent:
        took = "" if run.ended_us is None else f"{(run.ended_us - run.started_us) / 1e6:.1f}"
        print(f"{_when(run.started_us):<21} {run.outcome:<9} {took:>8} {run.instances_folded:>8} "
              f"{run.instances_deferred:>8} {run.mutators_collected:>9}  {run.host}"
              + (f"\n    error: {run.error}" if run.error else ""))
    return 0


def _when(us: int) -> str:
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(seconds: float) -> str:
    """``3d4h``, ``5m12s``, ``40s``: the two largest units."""
    left = max(0, int(seconds))
    days, left = divmod(left, 86400)
    hours, left = divmod(left, 3600)
    minutes, left = divmod(left, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (left, "s")) if n]
    return "".join(parts[:2]) or "0s"


def _summary(report: GcReport, elapsed: float) -> str:
    verb = "would fold" if report.dry_run else "folded"
    lines = [
        f"gc{' (dry run)' if report.dry_run else ''}: {report.mutators_final} retired mutators to collect, "
        f"{report.mutators_waiting} within the grace period",
        f"  {verb} {report.instances_folded} instances ({report.shards_deleted} shards) of "
        f"{report.instances_checked} keys checked; {report.mutators_collected} mutators "
        f"{'would be ' if report.dry_run else ''}collected, {report.mutators_forgotten} "
        f"{'would be ' if report.dry_run else ''}forgotten; {elapsed:.1f}s",
    ]
    if report.instances_deferred:
        lines.append(f"  deferred {report.instances_deferred} keys (run again later; exit code {EXIT_DEFERRED}):")
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
    client = CassandraClient(settings.cassandra, app="countersink-gc")
    health = HealthServer(settings.gc.health_port, ready=lambda: healthy["ok"], host=settings.gc.health_host,
                          before_scrape=_scrape_refresh(client)) if settings.gc.health_port else None
    if health:
        await health.start()
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


def _scrape_refresh(client: CassandraClient) -> Callable[[], Awaitable[None]]:
    gc_age = GcAgeSampler(client)

    async def refresh() -> None:
        client.sample_driver_metrics()
        await gc_age()

    return refresh


async def _guarded_run(settings: Settings, client: CassandraClient, args: argparse.Namespace) -> bool:
    """One run of the loop; a failure is logged and the loop goes on. Returns whether it succeeded."""
    try:
        await client.start()
        await _one_run(settings, client, args)
    except RUN_FAILURES as exc:
        log.error("gc_failed", error=str(exc))
        METRICS.gc_runs.labels(outcome="failed").inc()
        await client.stop()  # connect afresh next time
        return False
    return True


# ------------------------------------------------------------------------------------------------ orphans


def add_retire_orphans_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apply", action="store_true", help="retire them (without it: only list them)")
    parser.add_argument("--grace", type=parse_duration, metavar="DURATION",
                        help="only mutators expired this long ago, e.g. 5m " + setting_default("gc.grace_s"))
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

