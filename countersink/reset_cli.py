"""``countersink reset COUNTER [KEY ...]``: count a counter (or some of its keys) again from now.

The reset is recorded first (a new epoch of the counter, who asked, when), then a control record naming it
is published to every partition of the counter's topics; the offset each landed at is the reset's point in
that partition, printed and recorded. Consumers apply it in log order and never pause; readers show only
what comes after the point in each partition (``schemas.resets``, docs/operations.md "Resetting a counter").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import uuid
from datetime import UTC, datetime
from typing import Any, cast

from countersink.cassandra import CassandraClient
from countersink.cli import (
    EXIT_FAILED,
    EXIT_USAGE,
    counter_name,
    instance_key,
    quoted_key,
    run_async,
    stop_on_signals,
)
from countersink.logs import get_logger
from countersink.registry import CounterRegistry
from countersink.resets import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_KEY_RULE,
    MAX_RESET_KEYS,
    RequestKeyReusedError,
    ResetKeyError,
    ResetProgress,
    ResetRefusedError,
    command_requester,
    first_line,
    positions_not_recorded,
    read_points,
    read_reset_rows,
    reset_counter,
    reset_of,
    took_effect,
)
from countersink.settings import Settings
from schemas.resets import superseding

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="counter name, as recorded in the counter registry")
    parser.add_argument("keys", type=instance_key, nargs="*", metavar="KEY",
                        help=f"instance keys to reset (at most {MAX_RESET_KEYS}); none: every key of the counter; a "
                        "key starting with - after -- (every argument after -- is a key)")
    # keys after options too (cli._late_positionals)
    parser.set_defaults(late_positionals=("keys", instance_key, "KEY"))
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
        known, _ = await CounterRegistry(client).lookup(counter)
        if not known:  # a mistyped name: said, not listed as a counter without resets
            log.error("unknown_counter", counter=counter,
                      error=f"no counter {counter!r} in the counter registry: a consumer records it when it starts")
            return EXIT_USAGE
        found = []
        rows = await read_reset_rows(client, counter)
        recorded = [reset_of(row) for row in rows]
        for row, this in zip(rows, recorded, strict=True):
            partitions = row.get("partitions") or {}
            points = await read_points(client, counter, int(row["epoch"]), partitions, reset_id=this.reset_id)
            # Partitions with no position recorded: a reset cut short before its control record reached them (or
            # before where it landed was recorded). Its idempotency key completes it.
            missing = [{"topic": t, "partition": p} for t, n in sorted(partitions.items()) for p in range(n)
                       if (t, p) not in points]
            found.append({"counter": counter, "keys": sorted(row.get("keys") or ()), "epoch": int(row["epoch"]),
                          "id": row["id"], "requested_by": row["requested_by"],
                          "requested_at": datetime.fromtimestamp(row["requested_us"] / 1e6, UTC).isoformat(
                              timespec="milliseconds"),
                          "request_key": row.get("request_key"),
                          "positions": [{"topic": t, "partition": p, "offset": o} for (t, p), o in points.items()],
                          "not_recorded": missing,
                          **({"superseded_by": later.epoch} if (later := superseding(this, recorded)) else {})})
    if as_json:
        print(json.dumps(found))
        return 0
    if not found:
        print(f"no reset of {counter} is recorded")
    for item in found:
        keys = cast(list[str], item["keys"])
        what = f"keys {', '.join(map(quoted_key, keys))} of {counter}" if keys else f"every key of {counter}"
        print(f"reset {what}: epoch {item['epoch']}, id {item['id']}, by {item['requested_by']} at "
              f"{item['requested_at']}")
        for p in cast(list[dict[str, Any]], item["positions"]):
            print(f"  {p['topic']}/{p['partition']}: counts from offset {p['offset'] + 1} on "
                  f"(control record at {p['offset']})")
        missing = cast(list[dict[str, Any]], item["not_recorded"])
        where = ", ".join(f"{p['topic']}/{p['partition']}" for p in missing)
        if missing and "superseded_by" in item:
            print(f"  no control record recorded in {where}; superseded by epoch {item['superseded_by']}, which "
                  "resets every key it does: nothing to complete")
        elif missing:
            print(f"  incomplete: no control record recorded in {where}: complete it with "
                  f"`{_again(counter, keys, item['request_key'])}`"
                  if item["request_key"] else f"  incomplete: no control record recorded in {where}")
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
        warning = None
        running = asyncio.ensure_future(reset_counter(
            client, settings.kafka, definition, keys, requested_by, settings.cassandra.write_consistency,
            settings.cassandra.replay_read_consistency, request_key=request_key, progress=progress))
        interrupts = 0

        def interrupted() -> None:
            # Stopped half-way, a recorded reset hides its keys' new events where no control record reached
            # yet: the first Ctrl-C or SIGTERM lets it finish (a second or so), a second stops it, saying how
            # to complete it.
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1:
                log.warning("reset_finishing", counter=counter, message="the reset finishes (a second signal "
                            "stops it, and says how to complete it)")
            else:
                running.cancel()
        try:
            with stop_on_signals(interrupted):
                done = await running
        except asyncio.CancelledError:
            _failed(counter, keys, progress, request_key, "interrupted")
            return 130
        except (ResetKeyError, RequestKeyReusedError) as exc:  # as get refuses the key: a usage error, nothing recorded
            log.error("usage_refused", counter=counter, error=str(exc))
            return EXIT_USAGE
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
    what = f"keys {', '.join(map(quoted_key, sorted(keys)))} of {counter}" if keys else f"every key of {counter}"
    print(f"reset {what}: epoch {answer['epoch']}, id {answer['id']}, by {answer['requested_by']} at "
          f"{answer['requested_at']}")
    for p in done.positions:
        print(f"  {p.topic}/{p.partition}: counts from offset {p.offset + 1} on (control record at {p.offset})")
    if done.superseded_by is not None:
        print(f"  superseded by epoch {done.superseded_by}, which resets every key it does: nothing to complete "
              "(no instance reads this epoch any more)")
    return 0


def _again(counter: str, keys: list[str], request_key: object) -> str:
    """The command that makes or completes the reset of ``keys`` recorded with ``request_key``."""
    # Keys after "--": a key may start with "-" (-x is an instance key, not an option).
    return shlex.join(["countersink", "reset", counter, "--idempotency-key", str(request_key),
                       *(["--", *keys] if keys else [])])


def _failed(counter: str, keys: list[str], progress: ResetProgress, request_key: str | None,
            exc: Exception | str) -> None:
    """Log a reset that did not complete (``exc``, or why it stopped): what was recorded, and the command that
    completes it. Before the reset is known to be recorded its record may still land: the same key completes it
    then, or makes it."""
    again = _again(counter, keys, request_key)
    next_step = (f"complete it with `{again}` (a reset without that key would be a new one)"
                 if progress.reset is not None else f"reset again with `{again}`")
    log.error("reset_failed", counter=counter, error=exc if isinstance(exc, str) else type(exc).__name__,
              message=exc if isinstance(exc, str) else first_line(exc),
              next_step=f"{progress.recorded()}: {next_step}", **progress.as_json())
