"""Storage shapes a wide instance could take, measured side by side on the same data: reads, flushes, GC.

    python -m bench.wide_layouts [--cassandra HOST:PORT] [--rounds N] [--keys N] [--rotations N]

A prototype, to choose a layout by (docs/benchmarks.md, Wide instances): each shape is a table of its own in a
keyspace of its own (dropped at the end), written with plain CQL the way a store of that shape would write it.

- ``rows`` (schema 3, today's): a partition per key, a row per mutator clustered by (birth, mutator), a
  ``states`` map of counter -> cell, a static ``tallies`` map.
- ``static cells``: a partition per key holding only static maps: ``cells``, keyed ``counter \\0 mutator``
  (each mutator's cell its own map element, so concurrent flushes never conflict), and ``tallies``. An
  instance is read with a map slice, ``cells['c\\0' .. 'c\\1']``.
- ``generation rows``: a row per key and mutator generation (a mutator's birth time divided by the
  generation's length), cells keyed ``counter \\0 mutator`` in it; the GC would fold and delete whole
  generations once all their mutators are retired (a row tombstone), never single cells. Mutators spread
  over ``GENERATIONS`` generations here (births spread over a rotation period, and the one before).
- ``generation rows + stamps``: the same, and beside each cell an empty one of the same name in ``stamps``,
  written by the same statement: what a reader checks without reading the states.
- ``generation rows + stamp table``: the stamps (a digest of each cell) in a table of their own, same key and
  generation, written beside the states.
- ``counter rows``: a row per (key, counter), a map mutator -> cell in it: a flush writes a row per counter.

Reads (``--rounds`` of each, all interleaved in an order shuffled each round, one unmeasured round first,
beside the plain one-row read of bench.wide_reads): the instance of 256 and of 1,000 shards of a sum, a
distinct, a quantiles and a top-k (bench.wide_reads' states), each merged with ``merge_blobs``, again
through a ``StateCache`` of serve's default size, and "write times checked": the write times of the
instance's tally and cells read (``writetime(cells['c\0' .. 'c\1'])``, or of ``stamps``), the states only
when those differ from the last read's (never, here: nothing is written between reads); and for the stamp
table "digests checked": its stamps hold a 16-byte digest of each cell, read as values. Every value is
checked. ``--layouts a,b`` and ``--parts reads,flushes,gc`` measure some of it.

Flushes (``--keys``): the Cassandra process's CPU seconds (``/proc``, so Cassandra must run on this machine;
its pid is found by its listening port, or given with ``--cassandra-pid``) for what bench.layouts writes (a
flush of every key for three counters, then of 46 % of them), and for a wide flush: ``--wide-mutators``
mutators each flushing the same ``--wide-keys`` keys. Layouts interleaved, rounds shuffled.

GC (``--rotations``): each rotation retires every mutator of a 256-shard instance of three sums and folds
them into the tally the way that layout's GC would (rows: one range tombstone; cells: one cell tombstone per
counter and mutator; generations: a row tombstone per generation; counter rows: a cell tombstone per
mutator), then a new set of mutators flushes. After the rotations, a traced read gives the tombstones one
read of the instance scans, and ``--rounds`` reads its latency.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bench.wide_reads import KINDS, POOL, _check, _pool, _sum_bytes
from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import CassandraSettings, Consistency, ServeSettings
from countersink.state_cache import StateCache
from schemas.cql import shard_cell, shard_of_cell
from schemas.kinds import State, merge_blobs

LAYOUTS = ("rows", "static cells", "generation rows", "generation rows + stamps", "generation rows + stamp table",
           "counter rows")
STAMPED = "generation rows + stamp table"
# The stamps of STAMPED: a partition per key in a table of their own, so that checking them reads no state.
STAMP_TABLE = ("l_stamps", "key text, gen bigint, tally_stamps map<text, blob> STATIC, stamps map<text, blob>, "
                           "PRIMARY KEY ((key), gen)")
TABLES = {
    "rows": "key text, born_us bigint, mutator uuid, tallies map<text, blob> STATIC, states map<text, blob>, "
            "PRIMARY KEY ((key), born_us, mutator)",
    "static cells": "key text, tallies map<text, blob> STATIC, cells map<text, blob> STATIC, gen bigint, "
                    "PRIMARY KEY ((key), gen)",
    "generation rows": "key text, gen bigint, tallies map<text, blob> STATIC, cells map<text, blob>, "
                       "PRIMARY KEY ((key), gen)",
    "generation rows + stamps": "key text, gen bigint, tallies map<text, blob> STATIC, cells map<text, blob>, "
                               "stamps map<text, blob>, PRIMARY KEY ((key), gen)",
    STAMPED: "key text, gen bigint, tallies map<text, blob> STATIC, cells map<text, blob>, PRIMARY KEY ((key), gen)",
    "counter rows": "key text, counter text, tally blob, cells map<text, blob>, PRIMARY KEY ((key), counter)",
}
TABLE_NAMES = {"rows": "l_rows", "static cells": "l_static", "generation rows": "l_gen",
               "generation rows + stamps": "l_gen_stamps", STAMPED: "l_gen_st", "counter rows": "l_counter"}
COMPACTION = "compaction = {'class': 'UnifiedCompactionStrategy', 'scaling_parameters': 'L4'}"
WIDE = (256, 1000)
GENERATIONS = 3
GEN_US = 3600 * 1_000_000
BORN_US = 1_795_000_000 * 1_000_000
PLAIN = "plain row"
CACHED = ", cached"
# serve's cache checked against the write times of the instance's cells, read without their bytes
VALIDATED = ", write times checked"
# the same, with the stamp table's digests read as values
DIGESTS = ", digests checked"
SEP = "\x00"
BATCH_ROWS = 10
WORKERS = 64
FLUSH_COUNTERS = ("trades", "shares", "buyers")
FLUSH_STATE_BYTES = {"trades": 3, "shares": 6, "buyers": 43}  # bench.layouts' states (make bench's stream)
_READ = re.compile(r"Read (\d+) live rows and (\d+) tombstone cells")


def digest(cell: bytes) -> bytes:
    """A stamp: 16 bytes that change whenever the cell's bytes do."""
    return hashlib.blake2b(cell, digest_size=16).digest()


def cell_name(counter: str, mutator: uuid.UUID) -> str:
    return f"{counter}{SEP}{mutator.hex}"


class Layout:
    """Writes, reads and GC deletes of one shape."""

    def __init__(self, client: CassandraClient, name: str) -> None:
        self.client = client
        self.name = name
        self.table = TABLE_NAMES[name]

    def write(self, key: str, mutator: uuid.UUID, born_us: int, ts: int, cells: dict[str, bytes]
              ) -> list[tuple[str, list[object]]]:
        """The statements of one mutator's flush of one key (``cells``: counter -> shard cell)."""
        t = self.table
        if self.name == "rows":
            return [(f"UPDATE {t} USING TIMESTAMP ? SET states = states + ? WHERE key = ? AND born_us = ? "  # noqa: S608
                     "AND mutator = ?", [ts, cells, key, born_us, mutator])]
        named = {cell_name(c, mutator): v for c, v in cells.items()}
        if self.name == "static cells":
            return [(f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ? WHERE key = ?", [ts, named, key])]  # noqa: S608
        if self.name == "generation rows":
            return [(f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ? WHERE key = ? AND gen = ?",  # noqa: S608
                     [ts, named, key, born_us // GEN_US])]
        if self.name == STAMPED:
            # two partitions (one per table) of one key: one mutation in Cassandra when batched together
            return [(f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ? WHERE key = ? AND gen = ?",  # noqa: S608
                     [ts, named, key, born_us // GEN_US]),
                    (f"UPDATE {STAMP_TABLE[0]} USING TIMESTAMP ? SET stamps = stamps + ? WHERE key = ? "  # noqa: S608
                     "AND gen = ?", [ts, {n: digest(v) for n, v in named.items()}, key, born_us // GEN_US])]
        if self.name == "generation rows + stamps":
            # beside each cell an empty one of the same name and write time: what a validator reads
            return [(f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ?, stamps = stamps + ? WHERE key = ? "  # noqa: S608
                     "AND gen = ?", [ts, named, dict.fromkeys(named, b""), key, born_us // GEN_US])]
        return [(f"UPDATE {t} USING TIMESTAMP ? SET cells = cells + ? WHERE key = ? AND counter = ?",  # noqa: S608
                 [ts, {mutator.hex: v}, key, c]) for c, v in cells.items()]

    async def read(self, counter: str, key: str) -> list[bytes]:
        """The instance's stored states, tally first."""
        t, level = self.table, self.client.settings.read_consistency
        blobs: list[bytes] = []
        if self.name == "rows":
            result = await self.client.execute(f"SELECT tallies[?], states[?] FROM {t} WHERE key = ?",  # noqa: S608
                                               [counter, counter, key], consistency=level)
            first = True
            for row in result:
                tally, cell = row.as_tuple()
                if first and tally is not None:
                    blobs.append(tally)
                first = False
                if cell is not None:
                    blobs.append(shard_of_cell(cell)[0])
            return blobs
        if self.name == "counter rows":
            result = await self.client.execute(f"SELECT tally, cells FROM {t} WHERE key = ? AND counter = ?",  # noqa: S608
                                               [key, counter], consistency=level)
            for row in result:
                tally, cells = row.as_tuple()
                if tally is not None:
                    blobs.append(tally)
                blobs += [shard_of_cell(cell)[0] for cell in (cells or {}).values()]
            return blobs
        where = " PER PARTITION LIMIT 1" if self.name == "static cells" else ""
        result = await self.client.execute(
            f"SELECT tallies[?], cells[? .. ?] FROM {t} WHERE key = ?{where}",  # noqa: S608
            [counter, counter + SEP, counter + chr(1), key], consistency=level)
        first = True
        for row in result:
            tally, cells = row.as_tuple()
            if first and tally is not None:
                blobs.append(tally)
            first = False
            blobs += [shard_of_cell(cell)[0] for cell in (cells or {}).values()]
        return blobs

    async def validator(self, counter: str, key: str) -> tuple[object, ...]:
        """What identifies the instance's stored states without their bytes: the write time of its tally and of
        each of its cells (a cell's write time names its flush; a fold moves the tally's later). The cell names
        are literals: Cassandra 5.0 fails to prepare ``writetime(m[?])`` (a ClassCastException on the bind
        marker), so the statement is prepared once per counter."""
        t, level = self.table, self.client.settings.read_consistency
        c = counter.replace("'", "''")
        if self.name == "rows":
            text = f"SELECT writetime(tallies['{c}']), writetime(states['{c}']) FROM {t} WHERE key = ?"  # noqa: S608
            params: list[object] = [key]
        elif self.name == "counter rows":
            text = f"SELECT writetime(tally), writetime(cells) FROM {t} WHERE key = ? AND counter = ?"  # noqa: S608
            params = [key, counter]
        elif self.name == STAMPED:
            text = (f"SELECT writetime(tally_stamps['{c}']), writetime(stamps['{c}{SEP}' .. '{c}\x01']) "  # noqa: S608
                    f"FROM {STAMP_TABLE[0]} WHERE key = ?")
            params = [key]
        else:
            column = "stamps" if self.name == "generation rows + stamps" else "cells"
            text = (f"SELECT writetime(tallies['{c}']), writetime({column}['{c}{SEP}' .. '{c}\x01']) "  # noqa: S608
                    f"FROM {t} WHERE key = ?" + (" PER PARTITION LIMIT 1" if self.name == "static cells" else ""))
            params = [key]
        result = await self.client.execute(text, params, consistency=level)
        return tuple(tuple(w) if isinstance(w, list) else w for row in result for w in row.as_tuple())

    async def digests(self, counter: str, key: str) -> tuple[object, ...]:
        """The stamp table's digests of the instance's tally and cells, read as values (prepared, bound)."""
        result = await self.client.execute(
            f"SELECT tally_stamps[?], stamps[? .. ?] FROM {STAMP_TABLE[0]} WHERE key = ?",  # noqa: S608
            [counter, counter + SEP, counter + chr(1), key], consistency=self.client.settings.read_consistency)
        return tuple(tuple((w or {}).values()) if isinstance(w, dict) else w for row in result for w in row.as_tuple())

    def fold(self, key: str, counters: Sequence[str], retired: Sequence[tuple[uuid.UUID, int]], tally: bytes,
             ts: int, live_from: int) -> list[tuple[str, list[object]]]:
        """The GC's batch folding ``retired`` (mutator, birth) of ``key`` into its tallies (one partition).
        ``live_from``: the first birth not folded; rows and generations before it go by one range tombstone that
        covers the previous run's, as schema 3's GC deletes (gc_worker.collector)."""
        t = self.table
        if self.name == "counter rows":
            rows: list[tuple[str, list[object]]] = []
            for c in counters:
                rows.append((f"UPDATE {t} USING TIMESTAMP ? SET tally = ? WHERE key = ? AND counter = ?",  # noqa: S608
                             [ts, tally, key, c]))
                rows += [(f"DELETE cells[?] FROM {t} USING TIMESTAMP ? WHERE key = ? AND counter = ?",
                          [m.hex, ts, key, c]) for m, _ in retired]
            return rows
        tallies = {c: tally for c in counters}
        statements = [(f"UPDATE {t} USING TIMESTAMP ? SET tallies = tallies + ? WHERE key = ?", [ts, tallies, key])]  # noqa: S608
        if self.name == "rows":
            statements.append((f"DELETE FROM {t} USING TIMESTAMP ? WHERE key = ? AND born_us < ?",  # noqa: S608
                               [ts, key, live_from]))
        elif self.name == "static cells":
            statements += [(f"DELETE cells[?] FROM {t} USING TIMESTAMP ? WHERE key = ?",
                            [cell_name(c, m), ts, key]) for c in counters for m, _ in retired]
        else:
            statements.append((f"DELETE FROM {t} USING TIMESTAMP ? WHERE key = ? AND gen < ?",  # noqa: S608
                               [ts, key, live_from // GEN_US]))
        if self.name == STAMPED:
            s = STAMP_TABLE[0]
            statements += [(f"UPDATE {s} USING TIMESTAMP ? SET tally_stamps = tally_stamps + ? WHERE key = ?",  # noqa: S608
                            [ts, dict.fromkeys(counters, digest(tally)), key]),
                           (f"DELETE FROM {s} USING TIMESTAMP ? WHERE key = ? AND gen < ?",  # noqa: S608
                            [ts, key, live_from // GEN_US])]
        return statements


async def bounded(calls: Sequence[Callable[[], Awaitable[object]]], at_once: int = WORKERS) -> None:
    pending = iter(calls)

    async def worker() -> None:
        for call in pending:
            await call()

    await asyncio.gather(*(worker() for _ in range(min(len(calls), at_once))))


def batched(client: CassandraClient, statements: list[tuple[str, list[object]]], rows: int = BATCH_ROWS
            ) -> list[Callable[[], Awaitable[object]]]:
    calls: list[Callable[[], Awaitable[object]]] = []
    for i in range(0, len(statements), rows):
        group = statements[i:i + rows]
        if len(group) == 1:
            calls.append(functools.partial(client.execute, group[0][0], group[0][1]))
        else:
            calls.append(functools.partial(client.execute_batch, group))
    return calls


def born(i: int, n: int) -> int:
    """Mutator ``i`` of ``n``: births spread over GENERATIONS generations."""
    return BORN_US + (i * GENERATIONS // n) * GEN_US + i


def cassandra_pid(port: int) -> int:
    """The pid of the process listening on ``port`` (from /proc/net/tcp and the processes' sockets)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    raise RuntimeError(f"no process of this machine listens on port {port}: give --cassandra-pid")


def cpu_s(pid: int) -> float:
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def stat_cpu_s(stat: Path) -> float:
    """User plus system CPU seconds from a process's or a thread's ``stat`` file under /proc."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def measure_reads(client: CassandraClient, layouts: dict[str, Layout], rounds: int, seed: int
                        ) -> dict[str, tuple[float, float]]:
    rng = random.Random(seed)
    pools = {kind: _pool(kind, rng) for kind in KINDS if kind != "sum"}
    mutators = [uuid.uuid4() for _ in range(max(WIDE))]
    for layout in layouts.values():
        statements = []
        for i, mutator in enumerate(mutators):
            for kind in KINDS:
                for n in WIDE:
                    if i < n:
                        state = _sum_bytes(i + 1) if kind == "sum" else pools[kind][i % POOL]
                        statements += layout.write(f"{kind}-{n}", mutator, born(i, n), born(i, n) + 1,
                                                   {f"wide_{kind}": shard_cell(state, 1)})
        # one mutator's cells of a key go together; batches of one partition each (the keys are few here)
        await bounded([functools.partial(client.execute, cql, params) for cql, params in statements])
    await client.execute("CREATE TABLE IF NOT EXISTS plain_values (k text PRIMARY KEY, v bigint)", prepared=False)
    await client.execute("INSERT INTO plain_values (k, v) VALUES ('one', 1)", prepared=False)
    level = client.settings.read_consistency
    caches = {name: StateCache(ServeSettings().state_cache_bytes) for name in layouts}

    async def plain() -> None:
        await client.execute("SELECT v FROM plain_values WHERE k = ?", ["one"], consistency=level)

    validated: dict[tuple[str, str, str, str], tuple[tuple[object, ...], State | None]] = {}

    def reader(name: str, kind: str, n: int, how: str) -> Callable[[], Awaitable[None]]:
        layout, counter, key = layouts[name], f"wide_{kind}", f"{kind}-{n}"

        async def read() -> None:
            if how in (VALIDATED, DIGESTS):
                # the stored states' write times (or digests) read; the states only when they differ from the
                # last read's
                seen = await (layout.validator(counter, key) if how == VALIDATED else layout.digests(counter, key))
                kept = validated.get((name, counter, key, how))
                if kept is None or kept[0] != seen:
                    kept = (seen, merge_blobs(await layout.read(counter, key)))
                    validated[(name, counter, key, how)] = kept
                state = kept[1]
            else:
                blobs = await layout.read(counter, key)
                state = caches[name].merged(counter, key, blobs) if how == CACHED else merge_blobs(blobs)
            _check(kind, n, state)
        return read

    reads: dict[str, Callable[[], Awaitable[None]]] = {PLAIN: plain}
    for name in layouts:
        for kind in KINDS:
            for n in WIDE:
                for how in ("", CACHED, VALIDATED) + ((DIGESTS,) if name == STAMPED else ()):
                    reads[f"{name}: {kind}, {n:,} shards{how}"] = reader(name, kind, n, how)
    return await interleaved(reads, rounds, seed)


async def interleaved(reads: dict[str, Callable[[], Awaitable[None]]], rounds: int, seed: int
                      ) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each read, made ``rounds`` times (after one unmeasured round), all of them in an
    order shuffled each round, so that the machine's noise falls on all alike."""
    timings: dict[str, list[float]] = {name: [] for name in reads}
    order_rng = random.Random(seed)
    for measured in [False] + [True] * rounds:
        order = list(reads.items())
        order_rng.shuffle(order)
        for name, read in order:
            started = time.perf_counter()
            await read()
            if measured:
                timings[name].append(time.perf_counter() - started)
    return {name: (1000 * statistics.median(t), 1000 * pct(t, 99)) for name, t in timings.items()}


async def measure_flushes(client: CassandraClient, layouts: dict[str, Layout], pid: int, keys: int, rounds: int,
                          wide_mutators: int, wide_keys: int, seed: int) -> dict[str, tuple[float, float]]:
    """Cassandra CPU s per 100,000 keys flushed (bench.layouts' flushes), and per 100,000 cells of wide
    flushes, by layout."""
    totals = {name: [0.0, 0.0] for name in layouts}
    rng = random.Random(seed)

    def cells(seq: int) -> dict[str, bytes]:
        return {c: shard_cell(rng.randbytes(FLUSH_STATE_BYTES[c]), seq) for c in FLUSH_COUNTERS}

    for round_ in range(rounds + 1):
        order = list(layouts.items())
        rng.shuffle(order)
        for name, layout in order:
            # narrow: one mutator flushes every key, then 46 % of them again
            mutator, birth = uuid.uuid4(), BORN_US + round_
            everything = [f"n{round_}-{i:06d}" for i in range(keys)]
            before = cpu_s(pid)
            for seq, flushed in enumerate((everything, rng.sample(everything, int(keys * 0.46))), start=1):
                statements = [s for key in flushed for s in layout.write(key, mutator, birth, birth + seq, cells(seq))]
                await bounded(batched(client, statements))
            await asyncio.sleep(2)
            narrow = cpu_s(pid) - before
            # wide: wide_mutators mutators each flush the same wide_keys keys, twice
            before = cpu_s(pid)
            mutators = [(uuid.uuid4(), born(i, wide_mutators)) for i in range(wide_mutators)]
            for seq in (1, 2):
                statements = [s for m, b in mutators for k in range(wide_keys)
                              for s in layout.write(f"w{round_}-{k}", m, b, b + seq, cells(seq))]
                await bounded(batched(client, statements))
            await asyncio.sleep(2)
            wide = cpu_s(pid) - before
            print(f"flush round {round_}: {name}: narrow {narrow:.1f} CPU s, wide {wide:.1f} CPU s", flush=True)
            if round_:
                totals[name][0] += narrow
                totals[name][1] += wide
    narrow_per = 100_000 / (keys * 1.46) / rounds
    wide_per = 100_000 / (wide_mutators * wide_keys * 2) / rounds
    return {name: (n * narrow_per, w * wide_per) for name, (n, w) in totals.items()}


async def measure_gc(client: CassandraClient, layouts: dict[str, Layout], pid: int, rotations: int, rounds: int,
                     shards: int = 256) -> dict[str, tuple[float, int, int, float, float]]:
    """Per layout: the GC's Cassandra CPU s over all rotations (in /proc's 10 ms ticks), the live rows and
    tombstones one read scans after ``rotations`` rotations, and its p50 and p99 (ms)."""
    counters = [f"gc{i}" for i in range(3)]
    key = "gc-hot"
    out: dict[str, tuple[float, int, int, float, float]] = {}
    for name, layout in layouts.items():
        gc_cpu = 0.0
        waiting: list[tuple[uuid.UUID, int]] = []  # retired, not folded yet
        folded = 0
        for rotation in range(rotations + 1):
            # rotation r's mutators: births spread over one rotation period (as long as a generation)
            mutators = [(uuid.uuid4(), BORN_US + rotation * GEN_US + i * GEN_US // shards) for i in range(shards)]
            statements = [s for m, b in mutators for s in layout.write(
                key, m, b, b + 1, {c: shard_cell(_sum_bytes(1), 1) for c in counters})]
            await bounded([functools.partial(client.execute, cql, params) for cql, params in statements])
            if waiting:
                # generation rows are deleted whole: only generations without a live mutator are folded
                live_gens = {b // GEN_US for _, b in mutators} if name.startswith("generation rows") else set()
                fold_now = [(m, b) for m, b in waiting if b // GEN_US not in live_gens]
                waiting = [(m, b) for m, b in waiting if b // GEN_US in live_gens]
                folded += len(fold_now)
                before = cpu_s(pid)
                ts = BORN_US + (rotation + 1) * GEN_US  # after every write of the folded mutators
                # one batch: a fold is atomic within the partition
                live_from = min(b for _, b in waiting + mutators)
                await client.execute_batch(layout.fold(key, counters, fold_now, _sum_bytes(folded), ts, live_from))
                gc_cpu += cpu_s(pid) - before
            waiting += mutators
        for counter in counters:  # every value still exact
            blobs = await layout.read(counter, key)
            state = merge_blobs(blobs)
            if state is None or state.value() != shards * (rotations + 1):
                raise RuntimeError(f"{name}: {counter} reads {None if state is None else state.value()}")
        table = layout.table
        if name == "counter rows":
            text = f"SELECT tally, cells FROM {table} WHERE key = '{key}' AND counter = 'gc0'"  # noqa: S608
        elif name == "rows":
            text = f"SELECT tallies['gc0'], states['gc0'] FROM {table} WHERE key = '{key}'"  # noqa: S608
        else:
            text = f"SELECT tallies['gc0'], cells['gc0{SEP}' .. 'gc0\x01'] FROM {table} WHERE key = '{key}'"  # noqa: S608
        text += f" /* {uuid.uuid4().hex} */"  # this run's trace, not another's
        await client.execute(text, consistency=Consistency.ONE, prepared=False, tracing=True)
        live, tombstones = await traced(client, text)
        timings = []
        for _ in range(rounds):
            started = time.perf_counter()
            await layout.read("gc0", key)
            timings.append(time.perf_counter() - started)
        out[name] = (gc_cpu, live, tombstones, 1000 * statistics.median(timings),
                     1000 * pct(timings, 99))
        print(f"gc: {name}: {out[name]}", flush=True)
    return out


async def traced(client: CassandraClient, text: str) -> tuple[int, int]:
    """Live rows and tombstones of the traced run of ``text`` (system_traces is written asynchronously)."""
    for _ in range(50):
        await asyncio.sleep(0.2)
        page: bytes | None = None
        while True:
            result = await client.execute("SELECT session_id, parameters FROM system_traces.sessions",
                                          consistency=Consistency.ONE, page_size=5000, page_state=page,
                                          prepared=False)
            for row in as_dicts(result):
                if text not in str((row["parameters"] or {}).get("query", "")):
                    continue
                events = as_dicts(await client.execute(
                    "SELECT activity FROM system_traces.events WHERE session_id = ?", [row["session_id"]],
                    consistency=Consistency.ONE))
                counts = [(int(m.group(1)), int(m.group(2))) for e in events
                          if (m := _READ.search(e["activity"] or ""))]
                if counts:
                    return max(c[0] for c in counts), max(c[1] for c in counts)
            if not result.has_more_pages():
                break
            page = result.page_state()
    raise RuntimeError("no trace found")


async def run(args: argparse.Namespace) -> None:
    host, _, port = args.cassandra.rpartition(":")
    pid = args.cassandra_pid or cassandra_pid(int(port))
    keyspace = f"bench_layouts_{uuid.uuid4().hex[:8]}"
    settings = CassandraSettings(contact_points=[host], port=int(port), keyspace=keyspace)
    unknown = [name for name in args.layouts if name not in TABLES]
    if unknown:
        raise SystemExit(f"unknown layouts {unknown}: choose among {', '.join(LAYOUTS)}")
    try:
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                                 "{'class': 'SimpleStrategy', 'replication_factor': 1}", prepared=False)
            for name in args.layouts:
                await client.execute(f"CREATE TABLE {keyspace}.{TABLE_NAMES[name]} ({TABLES[name]}) "
                                     f"WITH {COMPACTION}", prepared=False)
                if name == STAMPED:
                    await client.execute(f"CREATE TABLE {keyspace}.{STAMP_TABLE[0]} ({STAMP_TABLE[1]}) "
                                         f"WITH {COMPACTION}", prepared=False)
        async with CassandraClient(settings) as client:
            layouts = {name: Layout(client, name) for name in args.layouts}
            if "reads" in args.parts:
                reads = await measure_reads(client, layouts, args.rounds, args.seed)
                plain50, plain99 = reads[PLAIN]
                print("| read | p50 ms | p99 ms | p50 × plain row | p99 × plain row |\n|---|---:|---:|---:|---:|")
                for name, (p50, p99) in reads.items():
                    print(f"| {name} | {p50:.2f} | {p99:.2f} | {p50 / plain50:.1f} | {p99 / plain99:.1f} |")
            if "flushes" in args.parts:
                flushes = await measure_flushes(client, layouts, pid, args.keys, args.flush_rounds,
                                                args.wide_mutators, args.wide_keys, args.seed)
                base = next(iter(flushes.values()))
                print("| layout | Cassandra CPU s per 100,000 keys flushed | × rows | per 100,000 cells of wide "
                      "flushes | × rows |\n|---|---:|---:|---:|---:|")
                for name, (narrow, wide) in flushes.items():
                    print(f"| {name} | {narrow:.2f} | {narrow / base[0]:.2f} | {wide:.2f} | {wide / base[1]:.2f} |")
            if "gc" in args.parts:
                gc = await measure_gc(client, layouts, pid, args.rotations, args.rounds)
                print(f"| layout | GC Cassandra CPU s, all rotations | live rows / tombstones a read scans after "
                      f"{args.rotations} rotations | read p50 ms | read p99 ms |\n|---|---:|---:|---:|---:|")
                for name, (cpu, live, tombstones, p50, p99) in gc.items():
                    print(f"| {name} | {cpu:.2f} | {live} / {tombstones} | {p50:.2f} | {p99:.2f} |")
    finally:
        async with CassandraClient(settings, use_keyspace=False) as client:
            await client.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", prepared=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wide_layouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", default="127.0.0.1:9042")
    parser.add_argument("--cassandra-pid", type=int, help="the Cassandra process (default: found by its port)")
    parser.add_argument("--rounds", type=int, default=100, help="reads of each instance (default 100)")
    parser.add_argument("--keys", type=int, default=20_000, help="keys of a narrow flush (default 20,000)")
    parser.add_argument("--flush-rounds", type=int, default=3)
    parser.add_argument("--wide-mutators", type=int, default=256)
    parser.add_argument("--wide-keys", type=int, default=40)
    parser.add_argument("--rotations", type=int, default=24, help="GC rotations before the read (default 24)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), type=lambda s: s.split(","))
    parser.add_argument("--parts", default="reads,flushes,gc", type=lambda s: s.split(","))
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
