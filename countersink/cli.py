"""``countersink``: one command line for every process. Each subcommand lives with its package.

``countersink consume`` runs the consumer, ``countersink gc`` the GC worker; ``countersink schema``
creates the keyspace and tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from countersink.settings import Settings
    from schemas.definitions import CounterSet

# subcommand -> (module, help). A module provides ``add_arguments(parser)`` and ``run(args, settings) -> int``,
# or, when it serves several subcommands, ``add_<name>_arguments`` and ``run_<name>``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "schema": ("countersink.schema_cli", "create the keyspace and tables (idempotent)"),
    "consume": ("consumer.cli", "consume events and keep the counters"),
    "gc": ("gc_worker.cli", "fold shards of retired mutators into tallies"),
    "retire-orphans": ("gc_worker.cli", "retire mutators of partitions that no longer exist, so GC can fold them"),
    "get": ("countersink.read_cli", "print the value of one counter instance"),
    "explain": ("countersink.read_cli", "show why an instance's value is what it is: tally, shards, mutators"),
    "list": ("countersink.read_cli", "list the instances of a counter, a page at a time"),
    "serve": ("countersink.serve", "serve counters over HTTP as JSON (with an OpenAPI description)"),
}


def load_definitions_or_refuse(path: Path | str) -> CounterSet | None:
    """The definitions file, or None after one ``definitions_refused`` log line naming the file, counter and
    field (the caller exits 2, as for any usage error)."""
    from countersink.logs import get_logger
    from schemas.definitions import load_definitions
    from schemas.errors import DefinitionError

    try:
        return load_definitions(path)
    except (DefinitionError, OSError) as exc:
        get_logger(__name__).error("definitions_refused", error=str(exc))
        return None


def main(argv: list[str] | None = None) -> int:
    _remember_early_stop()
    # Imported here, after the handler above, because these imports are most of a process's start-up time.
    from countersink.logs import configure_logging
    from countersink.settings import Settings

    parser = argparse.ArgumentParser(prog="countersink", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runners: dict[str, Callable[[argparse.Namespace, Settings], int]] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a part not built yet is simply not offered
        command = sub.add_parser(name, help=help_text, description=help_text)
        ident = name.replace("-", "_")
        add_arguments = getattr(module, f"add_{ident}_arguments", None) or module.add_arguments
        add_arguments(command)
        runners[name] = getattr(module, f"run_{ident}", None) or module.run
    args = parser.parse_args(argv)
    from pydantic import ValidationError

    from countersink.logs import get_logger
    from schemas.errors import CountersinkError

    try:
        settings = Settings()
    except ValidationError as exc:
        # Without the values given: a refused setting may be a password.
        problems = "; ".join(f"{'.'.join(map(str, error['loc'])) or 'settings'}: {error['msg']}"
                             for error in exc.errors(include_input=False, include_url=False))
        print(f"countersink {args.command}: refused settings: {problems}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        return runners[args.command](args, settings)
    except CountersinkError as exc:
        # A refused login, an untrusted certificate, an unreadable key: one line that says what to check.
        get_logger(__name__).error("command_failed", command=args.command, error=str(exc))
        return 1


def run_async(coroutine: Coroutine[Any, Any, int | None], *, graceful: bool = False) -> int:
    """Run a subcommand's coroutine; Ctrl-C ends it with the conventional exit code 130.

    ``graceful`` commands stop cleanly on SIGTERM through :func:`stop_on_signals`, including a SIGTERM
    that came while the process was starting; any other command gets the default action back first.
    """
    if not graceful:
        _forget_early_stop()
    try:
        result = asyncio.run(coroutine)
    except KeyboardInterrupt:
        return 130
    finally:
        _forget_early_stop()
    return int(result or 0)


# A SIGTERM that arrives while a process is still importing, connecting or joining its group (an orchestrator
# scaling down a pod that has just started) is remembered rather than fatal, so that a long-running command
# still releases what it holds and exits 0.
_early_stop: list[int] = []


def _remember_early_stop() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: _early_stop.append(signum))


def _forget_early_stop() -> None:
    """Give SIGTERM its default action back; deliver one that was remembered and not acted upon."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _early_stop:
            signal.raise_signal(_early_stop.pop())


@contextlib.contextmanager
def stop_on_signals(callback: Callable[[], object]) -> Iterator[None]:
    """Call ``callback`` on SIGTERM or SIGINT while the block runs, and at once if a SIGTERM came earlier."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, callback)
    if _early_stop:
        _early_stop.clear()
        callback()
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)


if __name__ == "__main__":
    sys.exit(main())
