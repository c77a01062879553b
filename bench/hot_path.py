"""The consumer's hot path alone: decode, route and apply the bench's trades, no Kafka and no Cassandra.

    python -m bench.hot_path [--events N] [--symbols N] [--rounds N] [--parts | --shapes]

Measured side by side in one process, interleaved round by round (the machine is shared: read the ratios):

- *record at a time*: ``Mutator.apply`` per record, the reference path (router, updates, retry window);
- *batch*: ``Mutator.apply_batch`` on batches of 500, the path the consumer runs;
- *batch, collector tuned*: the same with the consumer's garbage-collector settings
  (``consumer.cli.GC_THRESHOLDS`` after ``gc.freeze()``).

Each is CPU seconds (``time.process_time``) per event, best round, in two regimes: keys repeating (each
mutator has seen every symbol before: the steady state) and new keys (every symbol first seen in the
round: states, rows and window ids created).

``--parts`` measures instead what each part of the work costs on the batch path (collector tuned, keys
repeating): the same stream with the counters' event ids removed (no publisher-retry window), with the
distinct counter removed, with both, and msgspec's decoding of the four fields alone.

``--shapes`` measures instead, on one stream of events holding every field (``bench.shapes``), each shape of
definition: flat (the bench's three counters), the key read from a nested field, an hourly bucket, an exact
decimal sum, the third counter of each kind, and a page-view stream of nine counters. Each shape's batch path
(collector tuned, keys repeating) and router (record at a time), interleaved round by round in one process,
with its ratio to flat, its share of events the batch path decides itself, and its CPU per counter update.

``--shapes --second-pass`` applies each round twice to each shape's mutator, its retry window emptied between:
the second pass makes no row or state, so with rounds of an hour (``--events 72000``) the gap is what an hourly
bucket's new rows and states cost.

``--refused`` measures instead the flat shape on that stream with none, 1 % and 10 % of its records holding
``qty`` as a string: refused by the sum counter (a dead letter each) on the batch path, counted by the others.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import uuid
from collections.abc import Callable

import msgspec

from bench import shapes
from bench.pipeline import TOPIC, definitions, trade
from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.cli import GC_THRESHOLDS
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter
from schemas.fast_route import Row
from schemas.kinds import State, new_state

BATCH = 500


def new_mutator(partition: int = 0, text: str | None = None) -> Mutator:
    counters = parse_definitions(text or definitions(TOPIC), "bench")
    applier = Applier(EventRouter(counters), counters, TOPIC, partition, RetryWindow(10_000))
    entry = MutatorEntry(uuid.uuid4(), "bench", TOPIC, partition, "bench", 0, 2**62)
    return Mutator(entry, PartitionId("bench", TOPIC, partition), applier, -1, -1)


def record_at_a_time(mutator: Mutator, records: list[Record]) -> None:
    for record in records:
        mutator.apply(record)


def batched(mutator: Mutator, records: list[Record]) -> None:
    for start in range(0, len(records), BATCH):
        mutator.apply_batch(records[start:start + BATCH])


def cpu_us_per_event(run: Callable[[Mutator, list[Record]], None], mutator: Mutator, records: list[Record],
                     *, tuned: bool) -> float:
    thresholds = gc.get_threshold()
    if tuned:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    try:
        started = time.process_time()
        run(mutator, records)
        return (time.process_time() - started) / len(records) * 1e6
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


PATHS: dict[str, tuple[Callable[[Mutator, list[Record]], None], bool]] = {
    "record at a time": (record_at_a_time, False),
    "batch": (batched, False),
    "batch, collector tuned": (batched, True),
}


def measure(events: int, symbols: int, rounds: int, seed: int = 7) -> dict[str, dict[str, float]]:
    """Best µs/event of each path, keys repeating and new keys."""
    rng = random.Random(seed)
    offset = 0

    def stream(n: int) -> list[Record]:
        nonlocal offset
        records = [Record(offset + i, trade(offset + i, rng, symbols)[1]) for i in range(n)]
        offset += n
        return records

    results: dict[str, dict[str, float]] = {name: {"keys repeating": float("inf"), "new keys": float("inf")}
                                            for name in PATHS}
    warm = {name: new_mutator() for name in PATHS}
    seen = stream(symbols * 5)  # every symbol, several times over: each mutator's rows and states exist
    for name, (run, _) in PATHS.items():
        run(warm[name], seen)
    for _ in range(rounds):
        repeating = stream(events)
        fresh = stream(events)
        for name, (run, tuned) in PATHS.items():
            best = results[name]
            best["keys repeating"] = min(best["keys repeating"],
                                         cpu_us_per_event(run, warm[name], repeating, tuned=tuned))
            best["new keys"] = min(best["new keys"], cpu_us_per_event(run, new_mutator(), fresh, tuned=tuned))
    return results


def without(*, event_ids: bool = False, distinct: bool = False) -> str:
    """The bench's definitions with the event ids or the distinct counter taken out."""
    text = definitions(TOPIC)
    if event_ids:
        text = text.replace('event_id = "id"\n', "")
    if distinct:
        text = text[:text.index('[[counter]]\nname = "buyers"')]
    return text


def parts(events: int, symbols: int, rounds: int, seed: int = 7) -> dict[str, float]:
    """Best µs/event of the batch path (collector tuned, keys repeating) with parts of the work removed."""
    rng = random.Random(seed)
    variants = {"all three counters, event ids": definitions(TOPIC), "no event ids": without(event_ids=True),
                "no distinct": without(distinct=True), "no event ids, no distinct": without(event_ids=True,
                                                                                           distinct=True)}
    mutators = {name: new_mutator(text=text) for name, text in variants.items()}
    seen = [Record(i, trade(i, rng, symbols)[1]) for i in range(symbols * 5)]
    for mutator in mutators.values():
        batched(mutator, seen)
    best = dict.fromkeys([*variants, "msgspec decode of the four fields alone"], float("inf"))
    decoder = msgspec.json.Decoder(_Trade)
    for round_ in range(rounds):
        records = [Record(len(seen) + events * round_ + i, trade(i, rng, symbols)[1]) for i in range(events)]
        for name, mutator in mutators.items():
            best[name] = min(best[name], cpu_us_per_event(batched, mutator, records, tuned=True))
        started = time.process_time()
        for record in records:
            decoder.decode(record.value)
        best["msgspec decode of the four fields alone"] = min(
            best["msgspec decode of the four fields alone"], (time.process_time() - started) / events * 1e6)
    return best


class _Trade(msgspec.Struct):
    symbol: str
    id: str
    qty: int
    buyer: str


def _chosen_shapes(only: list[str] | None) -> dict[str, str]:
    """The shapes whose names hold one of ``only`` (every shape without it), and flat always."""
    return {name: text for name, text in shapes.SHAPES.items()
            if name == shapes.FLAT or not only or any(part in name for part in only)}


def measure_shapes(events: int, symbols: int, rounds: int, seed: int = 7, only: list[str] | None = None
                   ) -> dict[str, dict[str, float]]:
    """Per shape: best µs/event of the batch path and of the router, the share of events the batch path
    decides itself, and counter updates per event. ``only``: the shapes whose names hold one of these (and
    flat)."""
    chosen = _chosen_shapes(only)
    rng = random.Random(seed)
    offset = 0

    def stream(n: int) -> list[Record]:
        nonlocal offset
        records = [Record(offset + i, shapes.event(offset + i, rng, symbols), (shapes.START_S + offset // 20) * 1000)
                   for i in range(n)]
        offset += n
        return records

    warm = {(name, path): new_mutator(text=text) for name, text in chosen.items()
            for path in ("batch", "router")}
    seen = stream(symbols * 5)
    results: dict[str, dict[str, float]] = {}
    for name in chosen:
        batched(warm[name, "batch"], seen)
        record_at_a_time(warm[name, "router"], seen)
        mutator = warm[name, "batch"]
        fast = mutator.applier.fast
        sample = stream(2000)
        taken = 0
        if fast is not None:
            rows = fast.new_rows()
            create = _scratch(mutator)
            taken = sum(fast.apply_event(r.value or b"", r.timestamp, None, (), rows, lambda c, e: True, [], create)
                        is not None for r in sample)
        updates = new_mutator(text=chosen[name])
        applied = 0
        for record in sample:
            _, updated, _ = updates.applier.classify(record)
            applied += len(updated)
        results[name] = {"batch": float("inf"), "router": float("inf"), "taken": taken / len(sample),
                         "updates": applied / len(sample)}
    names = list(chosen)
    for round_ in range(rounds):
        records = stream(events)
        # each round starts at another shape: none is always measured first, after the stream is made
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            best = results[name]
            best["batch"] = min(best["batch"], cpu_us_per_event(batched, warm[name, "batch"], records, tuned=True))
            best["router"] = min(best["router"], cpu_us_per_event(record_at_a_time, warm[name, "router"], records,
                                                                  tuned=True))
    return results


def measure_second_pass(events: int, symbols: int, rounds: int, only: list[str] | None = None, seed: int = 7
                        ) -> dict[str, tuple[float, float]]:
    """Per shape: best µs/event of the batch path (collector tuned) on a round of new events, then on the same
    round again with the mutator's retry window emptied (so every record is applied a second time, to rows and
    states the first pass made). With rounds of an hour of the stream, what separates the two passes of an hourly
    bucket is the hour's new rows and states."""
    chosen = _chosen_shapes(only)
    rng = random.Random(seed)
    records = [Record(i, shapes.event(i, rng, symbols), (shapes.START_S + i // shapes.PER_SECOND) * 1000)
               for i in range(events * (rounds + 1))]
    mutators = {name: new_mutator(text=text) for name, text in chosen.items()}
    for mutator in mutators.values():
        batched(mutator, records[:events])  # the first round's keys seen
    best = {name: (float("inf"), float("inf")) for name in chosen}
    names = list(chosen)
    for round_ in range(1, rounds + 1):
        part = records[events * round_:events * (round_ + 1)]
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            mutator = mutators[name]
            first = cpu_us_per_event(batched, mutator, part, tuned=True)
            mutator.applied_through = part[0].offset - 1
            mutator.applier.window = RetryWindow(mutator.applier.window.size)
            second = cpu_us_per_event(batched, mutator, part, tuned=True)
            best[name] = (min(best[name][0], first), min(best[name][1], second))
    return best


REFUSED_SHARES = (0.0, 0.01, 0.1)


def measure_refused(events: int, symbols: int, rounds: int, seed: int = 7) -> dict[float, float]:
    """Best µs/event of the batch path (collector tuned, keys repeating) on the flat shape, per share of records
    one counter refuses (``qty`` a string), the same records otherwise, the shares in turn."""
    rng = random.Random(seed)
    raw = [shapes.event(i, rng, symbols) for i in range(events * (rounds + 1))]

    def spoiled(i: int, value: bytes, share: float) -> bytes:
        if share and i % round(1 / share) == 0:
            return value.replace(b'"qty":', b'"qty":"x').replace(b',"buyer"', b'","buyer"', 1)
        return value

    streams = {share: [Record(i, spoiled(i, value, share), (shapes.START_S + i // shapes.PER_SECOND) * 1000)
                       for i, value in enumerate(raw)] for share in REFUSED_SHARES}
    mutators = {share: new_mutator(text=shapes.SHAPES[shapes.FLAT]) for share in REFUSED_SHARES}
    for share, mutator in mutators.items():
        batched(mutator, streams[share][:events])
    best = dict.fromkeys(REFUSED_SHARES, float("inf"))
    for round_ in range(rounds):
        for share in REFUSED_SHARES[round_ % 3:] + REFUSED_SHARES[:round_ % 3]:
            part = streams[share][events * (round_ + 1):events * (round_ + 2)]
            best[share] = min(best[share], cpu_us_per_event(batched, mutators[share], part, tuned=True))
    return best


def _scratch(mutator: Mutator) -> Callable[[Row, int], State]:
    """States for a pass that only asks the batch path what it would take (thrown away after)."""
    counters = mutator.applier.counters
    return lambda row, index: new_state(counters[row.names[index]])


def slowest_shape(results: dict[str, dict[str, float]]) -> tuple[str, float]:
    """The shape of :data:`bench.shapes.FLAT_VARIANTS` whose batch path costs the most per event, and that cost ÷
    flat's (the shapes measured by :func:`measure_shapes`)."""
    flat = results[shapes.FLAT]["batch"]
    name = max((name for name in shapes.FLAT_VARIANTS if name in results), key=lambda n: results[n]["batch"])
    return name, results[name]["batch"] / flat


def shapes_table(results: dict[str, dict[str, float]]) -> str:
    flat = results[shapes.FLAT]
    lines = ["| shape | batch path, µs/event | × flat | router, µs/event | × flat | decided by the batch path | "
             "counter updates per event | batch path, µs per update |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        per_update = r["batch"] / r["updates"] if r["updates"] else float("nan")
        lines.append(f"| {name} | {r['batch']:.2f} | {r['batch'] / flat['batch']:.2f}× | {r['router']:.2f} | "
                     f"{r['router'] / flat['router']:.2f}× | {r['taken']:.0%} | {r['updates']:.2f} | "
                     f"{per_update:.2f} |")
    return "\n".join(lines)


def table(results: dict[str, dict[str, float]]) -> str:
    reference = results["record at a time"]
    lines = ["| path | keys repeating, µs/event | ratio | new keys, µs/event | ratio |", "|---|---:|---:|---:|---:|"]
    for name, figures in results.items():
        lines.append(f"| {name} | {figures['keys repeating']:.2f} | "
                     f"{reference['keys repeating'] / figures['keys repeating']:.2f}× | {figures['new keys']:.2f} | "
                     f"{reference['new keys'] / figures['new keys']:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hot_path", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="events per path and round")
    parser.add_argument("--symbols", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", action="store_true", help="what each part of the batch path costs")
    parser.add_argument("--shapes", action="store_true", help="each shape of definition, beside flat")
    parser.add_argument("--only", action="append", help="with --shapes: the shapes whose names hold this")
    parser.add_argument("--refused", action="store_true", help="flat, with records one counter refuses")
    parser.add_argument("--second-pass", action="store_true",
                        help="with --shapes: each round applied twice, the second pass making no row")
    args = parser.parse_args(argv)
    if args.shapes and args.second_pass:
        passes = measure_second_pass(args.events, args.symbols, args.rounds, only=args.only)
        print("| shape | first pass, µs/event | second pass (no new row), µs/event | first ÷ second |\n"
              "|---|---:|---:|---:|")
        print("\n".join(f"| {name} | {first:.2f} | {second:.2f} | {first / second:.2f}× |"
                        for name, (first, second) in passes.items()))
        return 0
    if args.refused:
        best = measure_refused(args.events, args.symbols, args.rounds)
        print("| records one counter refuses | batch path, µs/event | × none |\n|---|---:|---:|")
        print("\n".join(f"| {share:.0%} | {us:.2f} | {us / best[0.0]:.2f}× |" for share, us in best.items()))
        return 0
    if args.shapes:
        print(shapes_table(measure_shapes(args.events, args.symbols, args.rounds, only=args.only)))
        return 0
    if args.parts:
        print("| batch path (collector tuned, keys repeating) | µs/event |\n|---|---:|")
        print("\n".join(f"| {name} | {us:.2f} |" for name, us in parts(args.events, args.symbols,
                                                                       args.rounds).items()))
        return 0
    print(table(measure(args.events, args.symbols, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
