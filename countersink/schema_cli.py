"""Create countersink's keyspace and tables if they are missing (safe to run any number of times)."""

from __future__ import annotations

import argparse
import functools
import sys
import time

from countersink.cassandra import CassandraClient, CassandraError
from countersink.cli import run_async
from countersink.logs import get_logger
from countersink.retry import wait_until_reachable
from countersink.settings import Settings

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replication", help="CQL replication map for a new keyspace (default: the setting)")
    parser.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                        help="how long to wait for Cassandra to answer (default: 120)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.wait < 0:
        print("countersink schema: --wait must not be negative", file=sys.stderr)
        return 2

    async def create() -> int:
        client = CassandraClient(settings.cassandra, use_keyspace=False)
        started = time.monotonic()
        try:
            # A schema job started beside a Cassandra that is still booting waits for it.
            await wait_until_reachable("cassandra", functools.partial(_create, client, args.replication),
                                       timeout_s=args.wait)
        except CassandraError as exc:
            # The time actually waited: a refused password or certificate is not retried, so it is ~0.
            log.error("schema_failed", error=str(exc), waited_s=round(time.monotonic() - started, 1))
            return 1
        finally:
            await client.stop()
        log.info("schema_ready", keyspace=settings.cassandra.keyspace)
        return 0

    return run_async(create())


async def _create(client: CassandraClient, replication: str | None) -> None:
    await client.start()
    await client.ensure_schema(replication)
