"""Create countersink's keyspace and tables if they are missing (safe to run any number of times)."""

from __future__ import annotations

import argparse

from countersink.cassandra import CassandraClient
from countersink.cli import run_async
from countersink.logs import get_logger
from countersink.settings import Settings

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replication", help="CQL replication map for a new keyspace (default: the setting)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    async def create() -> int:
        async with CassandraClient(settings.cassandra, use_keyspace=False) as client:
            await client.ensure_schema(args.replication)
        log.info("schema_ready", keyspace=settings.cassandra.keyspace)
        return 0

    return run_async(create())
