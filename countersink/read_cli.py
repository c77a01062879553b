"""``countersink get``, ``explain`` and ``list``: read counters from Cassandra, for people and scripts."""

from __future__ import annotations

import argparse
import base64
import difflib
import json
from datetime import UTC, datetime

from countersink.cassandra import CassandraClient
from countersink.cli import (
    EXIT_USAGE,
    consistency_level,
    counter_name,
    instance_key,
    positive_int,
    quoted_key,
    run_async,
    setting_default,
)
from countersink.logs import get_logger
from countersink.reader import CounterReader, Explanation, to_jsonable
from countersink.registry import CounterRegistry
from countersink.settings import Consistency, Settings
from schemas import timeseries
from schemas.definitions import CounterDefinition
from schemas.kinds._moments import MomentsValue
from schemas.kinds.distinct import DistinctEstimate
from schemas.kinds.quantiles import QuantilesEstimate
from schemas.kinds.top_k import TopKEstimate
from schemas.timeseries import TimeRangeError

log = get_logger(__name__)


def _page_token(text: str) -> bytes:
    """An argparse type: the page token a previous ``list`` printed."""
    try:
        return base64.b64decode(text.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, UnicodeEncodeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a page token printed by countersink list") from None


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--consistency", type=consistency_level, metavar="LEVEL",
                        help="read consistency, any case: " + ", ".join(Consistency) + " "
                        + setting_default("cassandra.read_consistency"))


def _instant(text: str) -> int:
    """An argparse type: a time for --from and --to."""
    try:
        return timeseries.parse_instant(text)
    except TimeRangeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> int:
    """An argparse type: a step like 1h or 1d."""
    try:
        return timeseries.parse_duration(text)
    except TimeRangeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_get_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("keys", nargs="+", metavar="KEY", type=instance_key,
                        help="instance key(s): key fields' values joined by | (docs/counters.md, Instance keys); "
                        "with --from/--to, one key without its bucket; a key starting with - after -- "
                        "(get c -- -1)")
    series = parser.add_argument_group("time series (bucketed counters; docs/reading.md, Time series)")
    series.add_argument("--from", dest="start", type=_instant, metavar="TIME",
                        help="first time of the range: ISO-8601 with an offset (2026-11-22T10:00Z), a date, now, "
                        "or now-6h / -7d; each bucket starting in [--from, --to) is read")
    series.add_argument("--to", dest="end", type=_instant, metavar="TIME", help="end of the range (excluded)")
    series.add_argument("--step", type=_duration, metavar="DURATION",
                        help="merge the buckets of each step (1h, 1d, 1w; a multiple of the bucket size)")
    series.add_argument("--rollup", action="store_true", help="merge every bucket of the range into one value")
    _common(parser)


def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("key", type=instance_key, help="instance key (docs/counters.md, Instance keys); one "
                        "starting with - after --")
    _common(parser)


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("--limit", type=positive_int, default=100, help="at most this many keys")
    parser.add_argument("--page", type=_page_token, metavar="TOKEN", help="page token printed by the previous call")
    _common(parser)


def _render(value: object) -> str:
    """A value for people, by its kind: sketches with their bounds, numbers as they are."""
    if value is None:
        return "(nothing counted)"
    if isinstance(value, DistinctEstimate):
        return f"about {value.estimate:.6g} (between {value.lower_bound:.6g} and {value.upper_bound:.6g})"
    if isinstance(value, QuantilesEstimate):
        if not value.count:
            return "(nothing counted)"
        ranks = ", ".join(f"p{rank * 100:g} {estimate:.6g}" for rank, estimate in value.quantiles)
        return (f"{ranks} ({value.count} values from {value.min:.6g} to {value.max:.6g}; "
                f"ranks within ±{value.normalized_rank_error:.2%})")
    if isinstance(value, TopKEstimate):
        # An item is an event's text: one that does not print (an escape sequence, a newline forging a line) is
        # quoted as keys are, so that what publishers write cannot move the terminal.
        items = ", ".join(f"{_printable(item.item)} {item.estimate}" + (
            "" if item.lower_bound == item.upper_bound else f" [{item.lower_bound}..{item.upper_bound}]")
            for item in value.items)
        return f"{items or '(none)'} (of {value.total_weight})"
    if isinstance(value, MomentsValue):
        values = f"{value.count} value{'' if value.count == 1 else 's'}"
        return (f"mean {value.mean}, stddev {value.stddev}, variance {value.variance} ({values})"
                if value.count else "(nothing counted)")
    plain = to_jsonable(value)
    return json.dumps(plain) if isinstance(plain, dict | list) else str(plain)


def _printable(item: object) -> str:
    text = str(item)
    return text if text.isprintable() else quoted_key(text)


async def _known_or_refuse(client: CassandraClient, args: argparse.Namespace) -> CounterDefinition | bool | None:
    """The counter's recorded definition (None when the registry is empty), or False after one
    ``unknown_counter`` line: a name no consumer has recorded."""
    registry = CounterRegistry(client, args.consistency)
    known, definition = await registry.lookup(args.counter)
    if known:
        return definition
    names = [c.name for c in (await registry.counters() or [])]
    close = difflib.get_close_matches(args.counter, names, n=3)
    log.error("unknown_counter", counter=args.counter,
              error=f"no counter {args.counter!r} in the counter registry"
              + (f"; did you mean {' or '.join(close)}?" if close else "")
              + f" ({len(names)} known: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''})")
    return False


def _unfit(definition: CounterDefinition | bool | None, keys: list[str]) -> bool:
    """True after one ``usage_refused`` line when a key of ``keys`` can hold nothing of the counter (another
    number of fields, a bucketed counter's key naming no bucket)."""
    if not isinstance(definition, CounterDefinition):
        return False
    unfit = [why for why in (timeseries.why_no_instance(definition, key) for key in keys) if why]
    if unfit:
        log.error("usage_refused", error=unfit[0])
    return bool(unfit)


def _check_range_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the range arguments, before anything connects; None when they fit together."""
    ranged = args.start is not None or args.end is not None
    if not ranged:
        return "--step and --rollup read a range: give --from and --to" if args.step or args.rollup else None
    if args.start is None or args.end is None:
        return "a range needs both --from and --to"
    if len(args.keys) != 1:
        return "a range is read for one key at a time"
    if args.step and args.rollup:
        return "give --step or --rollup, not both"
    if args.end <= args.start:
        return "--to must come after --from"
    return None


def run_series(args: argparse.Namespace, settings: Settings) -> int:
    async def series() -> int:
        async with CassandraClient(settings.cassandra) as client:
            definition = await _known_or_refuse(client, args)
            if not isinstance(definition, CounterDefinition):
                if definition is None:
                    log.error("unknown_counter", counter=args.counter, error="the counter registry is empty: "
                              "no consumer has recorded a counter yet, so its bucket size is not known")
                return EXIT_USAGE
            reader = CounterReader(client, args.consistency, max_range_buckets=settings.read.max_range_buckets,
                                   concurrency=settings.read.range_concurrency)
            key = args.keys[0]
            if args.rollup:
                points = [await reader.rollup(definition, key, args.start, args.end)]
            elif args.step:
                points = await reader.rollup(definition, key, args.start, args.end, args.step)
            else:
                points = await reader.series(definition, key, args.start, args.end)
        if args.json:
            print(json.dumps({"counter": args.counter, "kind": definition.kind, "key": key,
                              "from": timeseries.iso(args.start), "to": timeseries.iso(args.end),
                              "step": args.step, "points": to_jsonable(points)}))
            return 0
        for point in points:
            # Seconds only where a range not on a minute puts them (a bucket starts on one).
            span = timeseries.iso_datetime(point.start, with_seconds=point.start.second != 0)
            if args.step or args.rollup:
                span += " .. " + timeseries.iso_datetime(point.end, with_seconds=point.end.second != 0)
            print(f"{args.counter} {quoted_key(key)} {span}: {_render(point.value)}")
        return 0

    return run_async(series())


def run_get(args: argparse.Namespace, settings: Settings) -> int:
    problem = _check_range_arguments(args)
    if problem is not None:
        log.error("usage_refused", error=problem)
        return EXIT_USAGE
    if args.start is not None:
        return run_series(args, settings)

    async def get() -> int:
        async with CassandraClient(settings.cassandra) as client:
            definition = await _known_or_refuse(client, args)
            if definition is False:
                return EXIT_USAGE
            if _unfit(definition, args.keys):
                return EXIT_USAGE
            values = await CounterReader(client, args.consistency).get_many(args.counter, args.keys)
        if args.json:
            kind = {"kind": definition.kind} if isinstance(definition, CounterDefinition) else {}
            print(json.dumps({"counter": args.counter, **kind, "values": to_jsonable(values)}))
        else:
            for key, value in values.items():
                print(f"{args.counter} {quoted_key(key)}: {_render(value)}")
        return 0

    return run_async(get())


def _when(us: int | None) -> str:
    return "-" if us is None else datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="seconds")


def _print_explanation(e: Explanation) -> None:
    print(f"{e.counter} {quoted_key(e.key)} ({e.kind or 'no state'})")
    print(f"  value        {_render(e.value)}")
    print(f"  tally        {_render(e.tally)}")
    print(f"  shards       {len(e.shards)}")
    for shard in e.shards:
        where = f"{shard.topic}/{shard.partition}" if shard.topic else "?"
        state = "collected" if shard.collected_us else "retired" if shard.retired_us else "live"
        print(f"    mutator {shard.mutator} {where} through offset {shard.through_offset} [{state}, born "
              f"{_when(shard.born_us)}, retired {_when(shard.retired_us)}] contributes {_render(shard.value)}")
    for row in e.partitions:
        if row:
            print(f"  partition {row['topic']}/{row['partition']} (group {row['consumer_group']}): "
                  f"owner {row['owner']}, committed {row['committed_offset']}, intent {row['intent_offset']}, "
                  f"flush {row['flush_seq']}")


async def _backfilling(client: CassandraClient, counter: str) -> str | None:
    """The line telling that ``counter`` is still being backfilled (countersink.backfills), if it is."""
    from countersink.backfills import counter_backfill  # here: the backfill's imports are not every read's

    return await counter_backfill(client, counter)


def run_explain(args: argparse.Namespace, settings: Settings) -> int:
    async def explain() -> int:
        async with CassandraClient(settings.cassandra) as client:
            definition = await _known_or_refuse(client, args)
            # A key that can hold nothing is refused as get refuses it (explain answered "(no state)").
            if definition is False or _unfit(definition, [args.key]):
                return EXIT_USAGE
            explanation = await CounterReader(client, args.consistency).explain(args.counter, args.key)
            backfilling = await _backfilling(client, args.counter)
        if args.json:
            shown = to_jsonable(explanation)
            assert isinstance(shown, dict)
            print(json.dumps({**shown, **({"backfilling": backfilling} if backfilling else {})}))
        else:
            _print_explanation(explanation)
            if backfilling:
                print(f"  {backfilling}")
        return 0

    return run_async(explain())


def listed_key(key: str) -> str:
    """A key as ``list`` prints it, a key per line: as it is, for pipes, but quoted (as :func:`quoted_key`) when it
    does not print (a newline), is empty or starts or ends with a space (a blank line, an edge no one sees), or
    starts as a quoted key does (``''`` would read as the empty key). ``--json`` gives every key exactly."""
    plain = key and key.isprintable() and key.strip() == key and not key.startswith(("'", "$'"))
    return key if plain else quoted_key(key)


def run_list(args: argparse.Namespace, settings: Settings) -> int:
    async def list_keys() -> int:
        page = args.page
        async with CassandraClient(settings.cassandra) as client:
            if await _known_or_refuse(client, args) is False:
                return EXIT_USAGE
            keys, next_page = await CounterReader(client, args.consistency).list_instances(
                args.counter, args.limit, page)
            backfilling = await _backfilling(client, args.counter)
        token = base64.urlsafe_b64encode(next_page).decode() if next_page else None
        if args.json:
            print(json.dumps({"counter": args.counter, "keys": keys, "next_page": token,
                              **({"backfilling": backfilling} if backfilling else {})}))
        else:
            print("\n".join(map(listed_key, keys)))
            if token:
                print(f"(more: --page {token})")
            if backfilling:
                print(f"({backfilling})")
        return 0

    return run_async(list_keys())
