"""Create countersink's keyspace and tables if they are missing (safe to run any number of times)."""

from __future__ import annotations

import argparse
import functools
import time

from countersink.cassandra import CassandraClient, CassandraError
from countersink.cli import run_async, setting_default
from countersink.logs import get_logger
from countersink.retry import wait_until_reachable
from countersink.settings import Settings
from schemas import cql

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replication", metavar="MAP", type=_replication,
                        help="CQL replication map for a new keyspace " + setting_default("cassandra.replication"))
    parser.add_argument("--wait", type=_seconds, default=120.0, metavar="SECONDS",
                        help="how long to wait for Cassandra to answer")


def _replication(text: str) -> str:
    """An argparse type: a plain CQL replication map (it is placed in CQL text)."""
    try:
        return cql.check_replication(text)
    except cql.InvalidIdentifierError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_WAIT_S = 86_400.0  # a start's wait for the servers: the bound of the settings' startup_timeout_s


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds, 0 to a day (inf and nan refused as numbers past any use)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to {MAX_WAIT_S:.0f}")
    return value


def run(args: argparse.Namespace, settings: Settings) -> int:
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
