"""Two versions of the hot path measured in one process, round by round in turn: a commit's and the working tree's.

    python -m bench.versions formats --against COMMIT [--events N] [--symbols N] [--rounds N]
    python -m bench.versions shapes --against COMMIT [--events N] [--symbols N] [--rounds N] [--only TEXT]
    python -m bench.versions flushes --against COMMIT [--cassandra HOST:PORT] [--keys N] [--rounds N] [--without-bucket]

On a shared machine two runs a minute apart differ by more than most changes measured; the same run does not.
The commit's packages are written out with ``git archive`` into a temporary folder and imported beside the
working tree's (each version's modules loaded in turn, kept by reference: a version's classes use its own
modules). ``formats`` runs :func:`bench.formats.measure` one round at a time for each version in turn;
``shapes`` runs the batch path of each shape of :mod:`bench.shapes` on the same records for each version, the
versions and shapes in turn, a round holding ``--events`` records (72,000, the default, is one hour of the
stream: every round of an hourly bucket then makes one hour's new instances). Printed: each version's best
round, µs of CPU per event, and its ratio to JSON or to flat. ``flushes`` sends one flush of ``--keys`` page-view
rows (:mod:`bench.flush_requests`) through each version's own ``CassandraStore.write_shards`` and
``CassandraClient``, each into a keyspace of its own on a Cassandra running on this machine, the versions in an
order shuffled each round (one unmeasured round first): printed, the medians of the client's and Cassandra's CPU
per row.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGES = ("schemas", "consumer", "bench", "countersink", "demo", "gc_worker", "stack")
ROOT = Path(__file__).resolve().parents[1]


def _load(root: Path, modules: tuple[str, ...]) -> list[ModuleType]:
    for name in [n for n in sys.modules if n.split(".")[0] in PACKAGES]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        return [importlib.import_module(module) for module in modules]
    finally:
        sys.path.remove(str(root))


def _archive(commit: str, folder: Path) -> None:
    """The packages of ``commit`` written into ``folder`` (``git archive``: the repository is only read)."""
    tar = folder / "commit.tar"
    with tar.open("wb") as out:
        subprocess.run(["git", "archive", commit, *PACKAGES], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(tar) as archive:
        archive.extractall(folder, filter="data")


def formats(versions: dict[str, list[ModuleType]], events: int, symbols: int, rounds: int) -> str:
    best: dict[tuple[str, str], float] = {}
    names = list(versions)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            for format_, us in versions[name][0].measure(events, symbols, 1).items():
                best[name, format_] = min(best.get((name, format_), us), us)
    lines = [f"{events // 2} events a round, {symbols} symbols, best of {rounds} rounds per version, apply_batch, "
             "collector tuned, keys repeating", "",
             "| format | " + " | ".join(f"{v}, µs/event | × json" for v in names) + " |",
             "|---|" + "---:|---:|" * len(names)]
    for format_ in versions[names[0]][0].FORMATS:
        lines.append(f"| {format_} | " + " | ".join(
            f"{best[v, format_]:.2f} | {best[v, format_] / best[v, 'json']:.2f}" for v in names) + " |")
    return "\n".join(lines)


def shapes(versions: dict[str, list[ModuleType]], events: int, symbols: int, rounds: int, only: list[str]) -> str:
    newest = versions[list(versions)[-1]][1]
    chosen = [n for n in newest.SHAPES if n == newest.FLAT or any(part in n for part in only)]
    rng = random.Random(7)
    raw = [(newest.event(i, rng, symbols), (newest.START_S + i // newest.PER_SECOND) * 1000)
           for i in range(events * (rounds + 1))]
    runs: dict[tuple[str, str], tuple[Any, Any, list[Any]]] = {}
    for version, (hot, shapes_, applying) in versions.items():
        records = [applying.Record(i, value, ts) for i, (value, ts) in enumerate(raw)]
        for name in chosen:
            mutator = hot.new_mutator(text=shapes_.SHAPES[name])
            hot.batched(mutator, records[:events])  # the first round's keys seen: keys repeat, as in bench.hot_path
            runs[version, name] = (hot, mutator, records)
    best = dict.fromkeys(runs, float("inf"))
    order = list(runs)
    for round_ in range(rounds):
        for key in order[round_ % len(order):] + order[:round_ % len(order)]:
            hot, mutator, records = runs[key]
            part = records[events * (round_ + 1):events * (round_ + 2)]
            best[key] = min(best[key], hot.cpu_us_per_event(hot.batched, mutator, part, tuned=True))
    names = list(versions)
    lines = [f"{events} events a round ({events / (3600 * newest.PER_SECOND):.2f} h of the stream), {symbols} "
             f"symbols, best of {rounds} rounds, batch path, collector tuned", "",
             "| shape | " + " | ".join(f"{v}, µs/event | × flat" for v in names) + " |",
             "|---|" + "---:|---:|" * len(names)]
    for name in chosen:
        lines.append(f"| {name} | " + " | ".join(
            f"{best[v, name]:.2f} | {best[v, name] / best[v, newest.FLAT]:.2f}×" for v in names) + " |")
    return "\n".join(lines)


async def _flushes(versions: dict[str, list[ModuleType]], host: str, port: int, keys: int, rounds: int,
                   bucketed: bool) -> dict[str, dict[str, list[float]]]:
    newest = versions[list(versions)[-1]][0]
    stores: dict[str, Any] = {}
    try:
        for i, (version, (flush_requests, store_module, client_module)) in enumerate(versions.items()):
            settings = flush_requests.settings_for(host, port, f"flushver_{i}_{random.getrandbits(32):08x}", 10)
            stores[version] = await newest.open_store(settings, client_module.CassandraClient,
                                                      store_module.CassandraStore)
        return await newest.measure(stores, keys, rounds, 7, newest.cassandra_pid(port), bucketed)
    finally:
        for store in stores.values():
            await newest.close_store(store)


def flushes(versions: dict[str, list[ModuleType]], cassandra: str, keys: int, rounds: int, bucketed: bool = True
            ) -> str:
    host, port = cassandra.rsplit(":", 1)
    figures = asyncio.run(_flushes(versions, host, int(port), keys, rounds, bucketed))
    medians = {v: {name: statistics.median(values) / keys * 1e6 for name, values in measured.items()}
               for v, measured in figures.items()}
    first = next(iter(medians.values()))
    lines = [f"{keys} page-view rows a flush ({'one hour' if bucketed else 'no'} bucket), write_batch_rows 10, "
             f"median of {rounds} rounds", "",
             "| version | client CPU µs per row: event loop | driver | × first: client | "
             "Cassandra CPU µs per row | × first |", "|---|---:|---:|---:|---:|---:|"]
    for version, m in medians.items():
        client = (m["loop"] + m["driver"]) / (first["loop"] + first["driver"])
        lines.append(f"| {version} | {m['loop']:.1f} | {m['driver']:.1f} | {client:.2f}× | {m['cassandra']:.1f} | "
                     f"{m['cassandra'] / first['cassandra']:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.versions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["formats", "shapes", "flushes"])
    parser.add_argument("--against", required=True, help="the commit measured beside the working tree")
    parser.add_argument("--events", type=int)
    parser.add_argument("--symbols", type=int)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--only", action="append", default=[], help="shapes: those whose names hold this (and flat)")
    parser.add_argument("--cassandra", default="127.0.0.1:9042",
                        help="flushes: HOST:PORT of a Cassandra on this machine")
    parser.add_argument("--keys", type=int, default=20_000, help="flushes: rows per flush")
    parser.add_argument("--without-bucket", action="store_true", help="flushes: keys of no time bucket")
    args = parser.parse_args(argv)
    if args.against.startswith("-"):
        parser.error("--against names a commit")
    modules = {"formats": ("bench.formats",), "shapes": ("bench.hot_path", "bench.shapes", "consumer.applying"),
               "flushes": ("bench.flush_requests", "consumer.cassandra_store", "countersink.cassandra")}[args.what]
    with tempfile.TemporaryDirectory(prefix="countersink-versions-") as folder:
        _archive(args.against, Path(folder))
        versions = {args.against: _load(Path(folder), modules), "working tree": _load(ROOT, modules)}
    if args.what == "formats":
        print(formats(versions, args.events or 40_000, args.symbols or 500, args.rounds))
    elif args.what == "flushes":
        print(flushes(versions, args.cassandra, args.keys, args.rounds, not args.without_bucket))
    else:
        print(shapes(versions, args.events or 72_000, args.symbols or 10_000, args.rounds, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
