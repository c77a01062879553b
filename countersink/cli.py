"""``countersink``: one command line for every process. Each subcommand lives with its package.

``countersink consume`` runs the consumer, ``countersink gc`` the GC worker; ``countersink schema``
creates the keyspace and tables.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from countersink.logs import configure_logging
from countersink.settings import Settings

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


def main(argv: list[str] | None = None) -> int:
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
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    return runners[args.command](args, settings)


def run_async(coroutine: Coroutine[Any, Any, int | None]) -> int:
    """Run a subcommand's coroutine; Ctrl-C ends it with the conventional exit code 130."""
    try:
        result = asyncio.run(coroutine)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
