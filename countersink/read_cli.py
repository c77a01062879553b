"""``countersink get``, ``explain`` and ``list``: read counters from Cassandra, for people and scripts."""

from __future__ import annotations

import argparse
import base64
import json
from datetime import UTC, datetime

from countersink.cassandra import CassandraClient
from countersink.cli import counter_name, instance_key, positive_int, run_async, setting_default
from countersink.reader import CounterReader, Explanation, to_jsonable
from countersink.settings import Consistency, Settings


def _page_token(text: str) -> bytes:
    """An argparse type: the page token a previous ``list`` printed."""
    try:
        return base64.b64decode(text.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, UnicodeEncodeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a page token printed by countersink list") from None


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--consistency", type=Consistency, choices=list(Consistency), metavar="LEVEL",
                        help="read consistency, any case: " + ", ".join(Consistency) + " "
                        + setting_default("cassandra.read_consistency"))


def add_get_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("keys", nargs="+", metavar="KEY", type=instance_key,
                        help="instance key(s): key fields' values joined by | (docs/counters.md, Instance keys)")
    _common(parser)


def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("key", type=instance_key, help="instance key (docs/counters.md, Instance keys)")
    _common(parser)


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as in the definitions file")
    parser.add_argument("--limit", type=positive_int, default=100, help="at most this many keys")
    parser.add_argument("--page", type=_page_token, metavar="TOKEN", help="page token printed by the previous call")
    _common(parser)


def _render(value: object) -> str:
    plain = to_jsonable(value)
    return "(nothing counted)" if plain is None else json.dumps(plain) if isinstance(plain, dict | list) else str(plain)


def run_get(args: argparse.Namespace, settings: Settings) -> int:
    async def get() -> int:
        async with CassandraClient(settings.cassandra) as client:
            values = await CounterReader(client, args.consistency).get_many(args.counter, args.keys)
        if args.json:
            print(json.dumps({"counter": args.counter, "values": to_jsonable(values)}))
        else:
            for key, value in values.items():
                print(f"{args.counter} {key!r}: {_render(value)}")
        return 0

    return run_async(get())


def _when(us: int | None) -> str:
    return "-" if us is None else datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="seconds")


def _print_explanation(e: Explanation) -> None:
    print(f"{e.counter} {e.key!r} ({e.kind or 'no state'})")
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


def run_explain(args: argparse.Namespace, settings: Settings) -> int:
    async def explain() -> int:
        async with CassandraClient(settings.cassandra) as client:
            explanation = await CounterReader(client, args.consistency).explain(args.counter, args.key)
        if args.json:
            print(json.dumps(to_jsonable(explanation)))
        else:
            _print_explanation(explanation)
        return 0

    return run_async(explain())


def run_list(args: argparse.Namespace, settings: Settings) -> int:
    async def list_keys() -> int:
        page = args.page
        async with CassandraClient(settings.cassandra) as client:
            keys, next_page = await CounterReader(client, args.consistency).list_instances(
                args.counter, args.limit, page)
        token = base64.urlsafe_b64encode(next_page).decode() if next_page else None
        if args.json:
            print(json.dumps({"counter": args.counter, "keys": keys, "next_page": token}))
        else:
            print("\n".join(keys))
            if token:
                print(f"(more: --page {token})")
        return 0

    return run_async(list_keys())
