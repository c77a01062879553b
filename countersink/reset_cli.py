"""``countersink reset COUNTER [KEY ...]``: count a counter (or some of its keys) again from now.

The reset is recorded first (a new epoch of the counter, who asked, when), then a control record naming it
is published to every partition of the counter's topics; the offset each landed at is the reset's point in
that partition, printed and recorded. Consumers apply it in log order and never pause; readers show only
what comes after the point in each partition (``schemas.resets``, docs/operations.md "Resetting a counter").
"""

from __future__ import annotations

import argparse
import json
import shlex
import uuid
from datetime import UTC, datetime
from typing import Any, cast

from countersink.cassandra import CassandraClient
from countersink.cli import EXIT_FAILED, EXIT_USAGE, counter_name, instance_key, run_async
from countersink.logs import get_logger
from countersink.registry import CounterRegistry
from countersink.resets import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_KEY_RULE,
    MAX_RESET_KEYS,
    ResetProgress,
    ResetRefusedError,
    command_requester,
    first_line,
    positions_not_recorded,
    read_points,
    read_reset_rows,
    reset_counter,
    took_effect,
    unbucketed_keys,
)
from countersink.settings import Settings

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as recorded in the counter registry")
    parser.add_argument("keys", type=instance_key, nargs="*", metavar="KEY",
                        help=f"instance keys to reset (at most {MAX_RESET_KEYS}); none: every key of the counter")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--list", action="store_true",
                        help="reset nothing: print the counter's recorded resets and where each sits")
    parser.add_argument("--idempotency-key", type=idempotency_key, metavar="KEY",
                        help="the same on every attempt of one reset: a reset of the counter recorded with this key "
                        "is completed and printed, not made again (default: a new key, printed if the reset fails "
                        "after recording)")


def idempotency_key(text: str) -> str:
    if not IDEMPOTENCY_KEY.fullmatch(text):
        raise argparse.ArgumentTypeError(IDEMPOTENCY_KEY_RULE)
    return text


def run(args: argparse.Namespace, settings: Settings) -> int:
    if len(args.keys) > MAX_RESET_KEYS:
        log.error("usage_refused", error=f"a reset names at most {MAX_RESET_KEYS} keys, not {len(args.keys)}")
        return EXIT_USAGE
    if args.list:
        if args.keys:
            log.error("usage_refused", error="--list takes no KEY")
            return EXIT_USAGE
        return run_async(list_resets(settings, args.counter, as_json=args.json))
    return run_async(reset(settings, args.counter, list(dict.fromkeys(args.keys)), as_json=args.json,
                           request_key=args.idempotency_key or uuid.uuid4().hex))


async def list_resets(settings: Settings, counter: str, *, as_json: bool = False) -> int:
    """Print every recorded reset of ``counter``, oldest first, with who, when and its points."""
    async with CassandraClient(settings.cassandra) as client:
        found = []
        for row in await read_reset_rows(client, counter):
            points = await read_points(client, counter, int(row["epoch"]), row.get("partitions") or {})
            found.append({"counter": counter, "keys": sorted(row.get("keys") or ()), "epoch": int(row["epoch"]),
                          "id": row["id"], "requested_by": row["requested_by"],
                          "requested_at": datetime.fromtimestamp(row["requested_us"] / 1e6, UTC).isoformat(
                              timespec="milliseconds"),
                          "positions": [{"topic": t, "partition": p, "offset": o} for (t, p), o in points.items()]})
    if as_json:
        print(json.dumps(found))
        return 0
    if not found:
        print(f"no reset of {counter} is recorded")
    for item in found:
        keys = cast(list[str], item["keys"])
        what = f"keys {', '.join(keys)} of {counter}" if keys else f"every key of {counter}"
        print(f"reset {what}: epoch {item['epoch']}, id {item['id']}, by {item['requested_by']} at "
              f"{item['requested_at']}")
        for p in cast(list[dict[str, Any]], item["positions"]):
            print(f"  {p['topic']}/{p['partition']}: counts from offset {p['offset'] + 1} on "
                  f"(control record at {p['offset']})")
    return 0


async def reset(settings: Settings, counter: str, keys: list[str], *, as_json: bool = False,
                request_key: str | None = None) -> int:
    """Reset ``counter`` (``keys``, or every key) and print it. A failure after the reset was recorded says so,
    and how to complete that reset (the same command with its idempotency key); one while recording where the
    control records landed, every control record out, is a reset done: printed, with a warning."""
    progress = ResetProgress()
    requested_by = command_requester()
    async with CassandraClient(settings.cassandra) as client:
        known, definition = await CounterRegistry(client).lookup(counter)
        if not known or definition is None:
            log.error("unknown_counter", counter=counter,
                      error=f"no counter {counter!r} in the counter registry: a consumer records it when it starts")
            return EXIT_USAGE
        unbucketed = unbucketed_keys(definition, keys)
        if unbucketed is not None:  # as get refuses the key: a usage error, nothing recorded
            log.error("usage_refused", counter=counter, error=unbucketed)
            return EXIT_USAGE
        warning = None
        try:
            done = await reset_counter(client, settings.kafka, definition, keys, requested_by,
                                       settings.cassandra.write_consistency,
                                       settings.cassandra.replay_read_consistency, request_key=request_key,
                                       progress=progress)
        except ResetRefusedError as exc:
            log.error("reset_refused", counter=counter, error=str(exc))
            return EXIT_FAILED
        except Exception as exc:  # every failure says what was recorded, and what to do
            took = took_effect(progress, keys, requested_by)
            if took is None:
                _failed(counter, keys, progress, request_key, exc)
                return EXIT_FAILED
            done, warning = took, positions_not_recorded(exc)
            log.warning("reset_positions_not_recorded", counter=counter, epoch=done.reset.epoch,
                        id=done.reset.reset_id, error=type(exc).__name__)
    answer = done.as_json()
    if as_json:
        print(json.dumps(answer if warning is None else {**answer, "warning": warning}))
        return 0
    what = f"keys {', '.join(sorted(keys))} of {counter}" if keys else f"every key of {counter}"
    print(f"reset {what}: epoch {answer['epoch']}, id {answer['id']}, by {answer['requested_by']} at "
          f"{answer['requested_at']}")
    for p in done.positions:
        print(f"  {p.topic}/{p.partition}: counts from offset {p.offset + 1} on (control record at {p.offset})")
    return 0


def _failed(counter: str, keys: list[str], progress: ResetProgress, request_key: str | None,
            exc: Exception) -> None:
    """Log a reset that did not complete: what was recorded, and the command that completes it."""
    next_step = "reset again"
    if progress.reset is not None:
        again = shlex.join(["countersink", "reset", counter, *keys, "--idempotency-key", str(request_key)])
        next_step = f"complete it with `{again}` (a reset without that key would be a new one)"
    log.error("reset_failed", counter=counter, error=type(exc).__name__, message=first_line(exc),
              next_step=f"{progress.recorded()}: {next_step}", **progress.as_json())
