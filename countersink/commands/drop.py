"""``countersink drop COUNTER``: remove a counter, its registry entry and every row of it.

The order is what keeps a running consumer from writing it back:

1. The registry entry is marked dropped (LWT). From then on a consumer starting with the counter refuses to
   start, and a running one refuses it at its next registry check: it writes none of its states again
   (``consumer.service``: no flush starts on a look at the registry older than ``registry_check_s``).
2. The command waits until twice ``registry_check_s`` has passed since the mark: every flush that starts
   after that has seen the mark.
3. It walks every row of ``shards`` (a page at a time, ``--batch`` rows) and deletes the counter's cell of
   each row and its tally of each key, each delete stamped with the time it is sent, a cell's at least above
   its row's newest write (a mutator whose clock runs ahead writes later timestamps). Every write of a mutator
   born before then carries a smaller timestamp (``born_us + flush``) and stays hidden under it, whatever
   order they land in; a GC fold carries at most ``now - grace``, so one built from a read before a delete
   is hidden too, and one built after reads nothing of the counter.

The name stays refused after the drop: a consumer holding the old definitions must never count it again.
The sweep deletes the cells of every epoch of the counter (its resets' cells too). ``--forget`` (a deliberate
act, once no consumer runs the old definitions) walks the rows once more, deletes the counter's hand-overs, its
backfills' ownership rows and its resets, retires the mutators of backfills killed before they finished, and
removes the registry entry, so a new definition may take the name
(and be backfilled anew) and starts with nothing of the old one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Callable

from consumer.cassandra_store import CassandraStore
from consumer.ownership import now_us
from consumer.protocol import retire_time
from countersink.backfills import backfill_group
from countersink.cassandra import CassandraClient, as_dicts
from countersink.cli import EXIT_USAGE, counter_name, positive_int, run_async, stop_on_signals
from countersink.logs import get_logger
from countersink.registry import CounterRegistry, DroppedCounter
from countersink.settings import Settings
from schemas.cql import DROP_STAMP_SOURCE, SET_STAMP, SHARD_ROW_WHERE, STAMP_ROW, STAMP_TTL_S, TALLY_ROW, slice_key
from schemas.resets import later_cells, split_cell

log = get_logger(__name__)

PROGRESS_EVERY_S = 5.0
# A cell is deleted at a timestamp above its row's newest write (and at least when it is sent): a mutator whose
# clock runs ahead writes at born_us + flush later than the sweep's own clock, and a delete stamped by that clock
# left its cells visible, to be read and folded into the tally of a name defined anew.
_CELL_DELETE = f"DELETE states[?] FROM shards USING TIMESTAMP ? {SHARD_ROW_WHERE}"
_TALLY_DELETE = f"DELETE tallies[?] FROM shards {SHARD_ROW_WHERE}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="the counter to drop, as the registry names it")
    parser.add_argument("--yes", action="store_true", help="really delete every value of the counter")
    parser.add_argument("--forget", action="store_true",
                        help="also release the name (a deliberate act: run it once no consumer holds the old "
                        "definition), so that a new definition may use it")
    parser.add_argument("--batch", type=positive_int, default=500, metavar="ROWS",
                        help="rows read per page, and deletes in flight at most")


@dataclasses.dataclass
class DropProgress:
    """What a sweep has done so far."""

    rows_scanned: int = 0
    cells_deleted: int = 0
    tallies_deleted: int = 0
    keys: set[str] = dataclasses.field(default_factory=set)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        log.error("drop_not_confirmed", counter=args.counter,
                  error=f"this deletes every value of {args.counter!r} and refuses its name from now on: "
                  "run again with --yes")
        return EXIT_USAGE
    return run_async(drop(settings, args.counter, forget=args.forget, batch=args.batch))


async def drop(settings: Settings, name: str, *, forget: bool = False, batch: int = 500,
               say: Callable[[str], object] = print) -> int:
    """The command: mark, wait, sweep, and with ``forget`` release the name. Returns the exit code."""
    stopping = asyncio.Event()
    async with CassandraClient(settings.cassandra, app="countersink-drop") as client:
        if not await client.schema_complete():
            log.error("schema_outdated", error=f"keyspace {client.keyspace!r} lacks the counter registry's drop "
                      "marker: run countersink schema first")
            return EXIT_USAGE
        registry = CounterRegistry(client)
        with stop_on_signals(stopping.set):
            dropped = await registry.drop(name, f"{socket.gethostname()}:{os.getpid()}")
            if dropped is None:
                log.error("unknown_counter", counter=name, error=f"no counter {name!r} in the counter registry of "
                          f"keyspace {client.keyspace!r}")
                return EXIT_USAGE
            say(f"{name}: dropped at {_instant(dropped.dropped_us)} by {dropped.dropped_by}; consumers stop "
                f"writing it at their next registry check")
            wait_s = dropped.dropped_us / 1e6 + 2 * settings.consumer.registry_check_s - time.time()
            if wait_s > 0:
                say(f"{name}: waiting {wait_s:.0f} s (twice COUNTERSINK_CONSUMER__REGISTRY_CHECK_S) for running "
                    "consumers to stop writing it")
                try:
                    await asyncio.wait_for(stopping.wait(), wait_s)
                    return 130  # interrupted: the mark stays; running the command again goes on from here
                except TimeoutError:
                    pass
            progress = await sweep(client, name, batch, stopping, _progress_reporter(name))
            if stopping.is_set():
                return 130
            say(f"{name}: deleted {progress.cells_deleted} shard cells and {progress.tallies_deleted} tallies "
                f"in {len(progress.keys)} keys ({progress.rows_scanned} rows read)")
            if forget:
                return await _forget(registry, dropped, say)
            say(f"{name}: the name stays refused; `countersink drop {name} --yes --forget` releases it")
    return 0


async def forget_backfills(client: CassandraClient, name: str) -> ForgottenBackfills:
    """Delete ``name``'s hand-overs (of the counter and of each reprocess of it) and the ownership rows of their
    backfill groups: a new definition under the name records hand-overs of its own and is backfilled from the
    start, not taken for the old one's, done long ago. A backfill killed before it finished left its mutators
    unretired, with no ownership row to lead a takeover to them once these are gone: they are retired here (the
    GC folds and deletes their rows; a live one would keep cutting its folds at its birth). The hand-overs go
    last: they name the groups, so a forget stopped half-way finds the rest again. ``handovers``,
    ``partitions`` and ``mutators`` are read whole."""
    found = {(row["consumer_group"], row["cell"]) for row in as_dicts(await client.execute(
        "SELECT consumer_group, cell FROM handovers")) if split_cell(row["cell"])[0] == name}
    groups = {backfill_group(group, cell) for group, cell in found}
    owned = [row for row in as_dicts(await client.execute(
        "SELECT consumer_group, topic, partition, flush_seq FROM partitions")) if row["consumer_group"] in groups]
    # A window's writer stamps its shards born_us + flush_seq: the retire time must exceed the largest.
    flushes = max((int(row["flush_seq"] or 0) for row in owned), default=0)
    store, retired = CassandraStore(client), 0
    for row in as_dicts(await client.execute("SELECT id, consumer_group, born_us, retired_us FROM mutators")):
        if row["consumer_group"] in groups and row["retired_us"] is None:
            await store.retire_mutator(row["id"], retire_time(int(row["born_us"] or 0) + flushes, now_us()))
            retired += 1
    for row in owned:
        await client.execute("DELETE FROM partitions WHERE consumer_group = ? AND topic = ? AND partition = ? "
                             "IF EXISTS", [row["consumer_group"], row["topic"], row["partition"]],
                             idempotent=False)
    deleted = 0
    for group, cell in sorted(found):
        deleted += len(as_dicts(await client.execute(
            "SELECT topic FROM handovers WHERE consumer_group = ? AND cell = ?", [group, cell])))
        await client.execute("DELETE FROM handovers WHERE consumer_group = ? AND cell = ?", [group, cell])
    return ForgottenBackfills(deleted, retired)


@dataclasses.dataclass(frozen=True)
class ForgottenBackfills:
    handovers: int  # hand-over rows deleted
    mutators_retired: int  # unretired mutators of the backfill groups (killed backfills) retired


async def forget_resets(client: CassandraClient, name: str) -> int:
    """Delete ``name``'s resets and where they sit in each partition: a new definition under the name starts at
    epoch 0 with none (the old ones put its instances in the old epochs' cells, read back as the old values),
    and a control record of an old reset still in a topic names a reset no longer recorded, which consumers
    take for a forged one and skip. Returns how many resets were deleted. ``reset_positions`` is read whole."""
    resets = len(as_dicts(await client.execute("SELECT epoch FROM resets WHERE counter = ?", [name])))
    positions = {(row["topic"], row["partition"]) for row in as_dicts(await client.execute(
        "SELECT topic, partition, counter FROM reset_positions")) if row["counter"] == name}
    for topic, partition in sorted(positions):
        await client.execute("DELETE FROM reset_positions WHERE topic = ? AND partition = ? AND counter = ?",
                             [topic, partition, name])
    await client.execute("DELETE FROM resets WHERE counter = ?", [name])
    return resets


async def _forget(registry: CounterRegistry, dropped: DroppedCounter, say: Callable[[str], object]) -> int:
    # Before the name is released: a consumer with a new definition of it must find none of the old hand-overs,
    # nor the old resets.
    backfills = await forget_backfills(registry.client, dropped.name)
    if backfills.handovers:
        say(f"{dropped.name}: deleted {backfills.handovers} hand-over rows and the ownership rows of its backfills")
    if backfills.mutators_retired:
        say(f"{dropped.name}: retired {backfills.mutators_retired} mutators of backfills that did not finish "
            "(the GC folds their rows)")
    resets = await forget_resets(registry.client, dropped.name)
    if resets:
        say(f"{dropped.name}: deleted its {resets} resets and where they sit in each partition")
    if not await registry.forget(dropped):
        log.error("forget_refused", counter=dropped.name,
                  error=f"the registry entry of {dropped.name!r} is no longer the drop of "
                  f"{_instant(dropped.dropped_us)}: nothing released")
        return 1
    say(f"{dropped.name}: name released: the next consumer that starts with a definition of it records it anew")
    return 0


async def sweep(client: CassandraClient, name: str, batch: int, stopping: asyncio.Event,
                report: Callable[[DropProgress, bool], object]) -> DropProgress:
    """Delete ``name``'s cells of every shard row and its tallies of every key, in every epoch (a reset's
    cells too: a name released and defined anew would read them back): every row of the table is read once, a
    page of ``batch`` rows at a time, with at most ``batch`` deletes in flight. ``report`` hears the progress
    after each page, and whether it was the last."""
    progress = DropProgress()
    page: bytes | None = None
    tallied: tuple[str, str] | None = None  # the last key whose tallies were deleted: its rows follow one another
    later = later_cells(name)  # the cells of its epochs after resets
    while not stopping.is_set():
        result = await client.execute(
            "SELECT part, key, born_us, mutator, tallies[?] AS tally, states[?] AS cell, "
            "tallies[?..?] AS later_tallies, states[?..?] AS later_cells, maxwritetime(states) AS written_us "
            "FROM shards", [name, name, *later, *later],
            page_size=batch, page_state=page)
        # By key: its deletes and its stamp in one single-partition batch, which Cassandra applies
        # atomically: a serve that kept a merge of the counter reads the states again (schemas.cql), whatever
        # point the sweep is stopped at.
        deletes: dict[tuple[str, str], list[tuple[str, list[object]]]] = {}
        for row in as_dicts(result):
            progress.rows_scanned += 1
            slice_of = (row["part"], row["key"])  # schemas.cql.shard_slice
            tallies = ([name] if row["tally"] is not None else []) + sorted(row["later_tallies"] or ())
            cells = ([name] if row["cell"] is not None else []) + sorted(row["later_cells"] or ())
            if (tallies or cells) and slice_of != tallied:
                tallied = slice_of
                # The tallies of every epoch the key holds, whether this read saw one or not: a GC fold read
                # before this sweep may land after it, at an earlier timestamp (its mutators' last retirement),
                # and bring back a tally this read did not see; the sweep's deletes hide it.
                deletes.setdefault(slice_of, []).extend(
                    (_TALLY_DELETE, [cell, *slice_of, *TALLY_ROW]) for cell in sorted({name, *tallies, *cells}))
                progress.tallies_deleted += len(tallies)
                progress.keys.add(slice_key(*slice_of))
            if cells:
                at_us = max(time.time_ns() // 1000, int(row["written_us"] or 0) + 1)
                deletes.setdefault(slice_of, []).extend(
                    (_CELL_DELETE, [cell, at_us, *slice_of, row["born_us"], row["mutator"]]) for cell in cells)
                progress.cells_deleted += len(cells)
                progress.keys.add(slice_key(*slice_of))
        await asyncio.gather(*(_delete(client, slice_of, statements) for slice_of, statements in deletes.items()))
        page = result.page_state() if result.has_more_pages() else None
        report(progress, page is None)
        if page is None:
            break
    return progress


def _progress_reporter(name: str) -> Callable[[DropProgress, bool], None]:
    """A ``drop_progress`` line after the first page, then at most every :data:`PROGRESS_EVERY_S`, and after
    the last."""
    last = [float("-inf")]

    def report(progress: DropProgress, done: bool) -> None:
        if done or time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            log.info("drop_progress", counter=name, rows_scanned=progress.rows_scanned,
                     cells_deleted=progress.cells_deleted, tallies_deleted=progress.tallies_deleted, done=done)

    return report


# Deletes per batch: a partition's deletes go in batches of this many (Cassandra refuses a batch over 50 KiB).
_DELETES_PER_BATCH = 100
_last_stamp_us = 0


async def _delete(client: CassandraClient, slice_of: tuple[str, str],
                  statements: list[tuple[str, list[object]]]) -> None:
    """One key's deletes (``slice_of``: its place, schemas.cql.shard_slice), each batch of them with a stamp of
    its own, timestamped when it is sent: later than any write of a mutator born before it."""
    global _last_stamp_us
    for start in range(0, len(statements), _DELETES_PER_BATCH):
        # Each batch's stamp differs from the last (a serve that read between two batches reads again).
        _last_stamp_us = now_us = max(time.time_ns() // 1000, _last_stamp_us + 1)
        await client.execute_batch(
            [*statements[start:start + _DELETES_PER_BATCH],
             (SET_STAMP, [STAMP_TTL_S, DROP_STAMP_SOURCE, now_us, *slice_of, *STAMP_ROW])], timestamp_us=now_us)


def _instant(epoch_us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_us // 1_000_000))
