"""countersink's tables in Cassandra. Pure text: the I/O layer executes these statements.

One instance of a counter (``shares_traded`` / ``IBM``) is one partition of ``shards``: the static ``tally``
holds what the GC has folded, and one clustering row per mutator holds that mutator's whole state. The value
of an instance is ``merge(tally, every shard)``, read with one single-partition query.
"""

from __future__ import annotations

import re

from schemas.errors import CountersinkError

SCHEMA_VERSION = 1
GC_RUNS_TTL_S = 30 * 24 * 3600  # how long the record of each GC run is kept

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


class InvalidIdentifierError(CountersinkError):
    """Raised when a keyspace or table name is not a plain lower-case CQL identifier."""


def check_identifier(name: str) -> str:
    """Return ``name`` if it is safe to place in CQL text (it cannot be a bound parameter), else raise."""
    if not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(f"{name!r} is not a valid identifier: use [a-z][a-z0-9_]{{0,47}}")
    return name


# Replication strategies and options allowed inside CREATE KEYSPACE's map literal.
_REPLICATION = re.compile(r"^\{\s*('[A-Za-z0-9_.]+'\s*:\s*'?[A-Za-z0-9_.]+'?\s*,?\s*)+\}$")


def check_replication(replication: str) -> str:
    """Return ``replication`` if it is a plain CQL map literal (it is placed in CQL text), else raise."""
    if not _REPLICATION.fullmatch(replication):
        raise InvalidIdentifierError(
            f"replication {replication!r} is not a plain CQL map "
            "like {'class': 'SimpleStrategy', 'replication_factor': 3}"
        )
    return replication


def create_keyspace(keyspace: str, replication: str) -> str:
    return (
        f"CREATE KEYSPACE IF NOT EXISTS {check_identifier(keyspace)} "
        f"WITH replication = {check_replication(replication)}"
    )


def create_tables(keyspace: str) -> list[str]:
    """The schema, idempotent (``IF NOT EXISTS``), in creation order."""
    ks = check_identifier(keyspace)
    # Shards are overwritten in place by every flush. Cassandra 5's unified compaction in its leveled mode with
    # a fan-out of 4 keeps reads to few SSTables, as LeveledCompactionStrategy did, with less rewriting: on
    # make bench's stream Cassandra spent 7.4-8.3 CPU s per million events with it against 13.6-19.7 with
    # LCS, interleaved in one run (python -m bench.compaction).
    overwrite_heavy = "compaction = {'class': 'UnifiedCompactionStrategy', 'scaling_parameters': 'L4'}"
    return [
        f"""CREATE TABLE IF NOT EXISTS {ks}.shards (
            counter text,
            key text,
            mutator uuid,
            tally blob STATIC,
            state blob,
            through_offset bigint,
            PRIMARY KEY ((counter, key), mutator)
        ) WITH {overwrite_heavy}""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.partitions (
            consumer_group text,
            topic text,
            partition int,
            owner uuid,
            window_mutator uuid,
            window_born_us bigint,
            flush_seq bigint,
            committed_offset bigint,
            intent_offset bigint,
            PRIMARY KEY ((consumer_group, topic, partition))
        )""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.mutators (
            id uuid PRIMARY KEY,
            consumer_group text,
            topic text,
            partition int,
            host text,
            born_us bigint,
            expires_us bigint,
            retired_us bigint,
            collected_us bigint
        )""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.mutator_counters (
            mutator uuid,
            counter text,
            key text,
            PRIMARY KEY ((mutator), counter, key)
        )""",
        # The counter registry: each counter's definition as a consumer recorded it before counting
        # (schemas/registry.py). Readers learn names and kinds from it; a changed meaning is refused.
        f"""CREATE TABLE IF NOT EXISTS {ks}.counters (
            name text PRIMARY KEY,
            kind text,
            fingerprint text,
            definition text,
            registered_us bigint,
            registered_by text
        )""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.schema_meta (
            name text PRIMARY KEY,
            version int
        )""",
        # One row per GC run, newest first, kept 30 days; the static column is the end of the last run that
        # deferred nothing (written with TTL 0). Read by every process's /metrics (countersink.gc_runs).
        f"""CREATE TABLE IF NOT EXISTS {ks}.gc_runs (
            name text,
            started_us bigint,
            run uuid,
            host text,
            ended_us bigint,
            outcome text,
            instances_folded bigint,
            instances_deferred bigint,
            mutators_collected bigint,
            shards_deleted bigint,
            error text,
            last_complete_us bigint STATIC,
            PRIMARY KEY ((name), started_us, run)
        ) WITH CLUSTERING ORDER BY (started_us DESC, run ASC) AND default_time_to_live = {GC_RUNS_TTL_S:d}""",
    ]


def table_names(keyspace: str) -> set[str]:
    """The tables :func:`create_tables` makes."""
    return {re.search(r"CREATE TABLE IF NOT EXISTS \w+\.(\w+)", statement).group(1)  # type: ignore[union-attr]
            for statement in create_tables(keyspace)}


def read_schema_version(keyspace: str) -> str:
    return f"SELECT version FROM {check_identifier(keyspace)}.schema_meta WHERE name = 'countersink'"  # noqa: S608


def record_schema_version(keyspace: str) -> str:
    ks = check_identifier(keyspace)  # validated identifier; the version is our own integer constant
    return f"INSERT INTO {ks}.schema_meta (name, version) VALUES ('countersink', {SCHEMA_VERSION:d})"  # noqa: S608
