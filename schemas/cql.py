"""countersink's tables in Cassandra. Pure text: the I/O layer executes these statements.

An instance key (``IBM``, ``/home|2026-11-22T10:00Z``) owns a slice of ``shards``, clustered by the key and
shared by every counter with that key. Each mutator that counted the key has one row there, clustered by its
birth time and then its id, holding its whole state of each of its counters as one cell of ``states`` (keyed
by counter name); the key's tally row (:data:`TALLY_ROW`, first of its slice) holds in ``tallies``, per
counter, what the GC has folded. The value of an instance (``shares_traded`` / ``IBM``) is
``merge(tallies[counter], states[counter] of every row)``, read with one single-partition query of the key's
slice. Each ``states`` cell is :func:`shard_cell`: the last offset it covers, then the state's bytes.

Where a key's slice is, is :func:`shard_slice`: a key of a time bucket shares a partition with the keys of the
same bucket whose digest falls in the same of :data:`SHARD_SLOTS` slots, clustered under its own text; any other
key is the partition its text names, clustered under the empty text. A flush writes the rows of one partition as
one single-partition batch: one mutation and one request for many rows, which is what Cassandra's CPU and the
client's follow far more than rows (docs/benchmarks.md, "Rows holding many keys"). A bucket bounds what a
partition holds (the bucket's keys over the slots); keys without a bucket would make unbounded partitions of any
fixed number of slots, so each is named by its own text (which may also name a bucket's slot,
``2026-11-22T10:00Z#3``: the two keys still have places of their own, the empty clustering key being no bucket's).

The key's stamps say when its states last changed, without their bytes: a row of their own at the end of the
key's slice (:data:`STAMP_ROW`, after every mutator's: the GC's ranges end below it), a cell per source
(:func:`stamp_source`: a consumer group's topic partition, whichever mutator owns it), written in the same
batch as the states it stamps (one mutation per partition: a replica holding the states holds their stamp),
with the same write timestamp, holding that timestamp. A mutator's timestamps grow with its flushes, and a
mutator's birth is above every timestamp of the key's earlier owners (``consumer.protocol.Claimant``),
so the newest write of a source is its newest stamp, and any write that changes a state changes the
key's stamps. ``serve`` reads that one row to learn that the merge it kept is still the instance's
(``countersink.state_cache``): a few hundred small cells instead of hundreds of rows of sketches. A read of
the whole slice returns the stamps with the states (the same replicas' data), which is what the cache
keeps beside its merge.
The keyless instance (key ``""``) is partition ``\\`` (:func:`partition_key`): Cassandra refuses an empty
partition key, and a lone escape is a key no event can produce.

Counters that share a topic and a key are written together: one row per key per flush instead of one per
counter (``python -m bench.layouts``).

Rows are ordered by birth so that the GC removes what it folded with range tombstones over birth times
(``born_us > a AND born_us < b``, between the births of mutators still live, above the tally row), not a
tombstone per cell or per row: each run's ranges cover the previous runs' at a later timestamp, so a read meets
a couple of range markers whatever the number of partitions, counters and rotations
(``python -m bench.tombstones``). Schema 2 deleted a cell per counter and mutator: a key written from 12
partitions by 3 counters carried 8,640 tombstones after ten days of hourly rotation. Schema 3 gave every key a
partition of its own, tallies in a static column.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys
import uuid
import zlib
from collections.abc import Iterable, Sequence

import msgspec

from schemas.errors import CorruptStateError, CountersinkError, MalformedInstanceKeyError

SCHEMA_VERSION = 4
GC_RUNS_TTL_S = 30 * 24 * 3600  # how long the record of each GC run is kept

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]{0,47}$")

# The latest expiry a row may have: Cassandra 5.0, in its default ``storage_compatibility_mode:
# CASSANDRA_4``, refuses any write whose expiry (its clock plus the TTL) is after 2038-01-19T03:14:07Z
# (CASSANDRA-14092: "ttl ... exceeds maximum supported expiration date"), and Cassandra refuses any TTL
# over 20 years. A refused write is not retriable, so countersink never asks for one: every expiry it writes
# ends by LAST_EXPIRY_S, a day before the limit, which leaves that much room for the server's clock to be
# ahead of the writer's.
CASSANDRA_EXPIRY_LIMIT_S = 2**31 - 1
EXPIRY_MARGIN_S = 86_400
LAST_EXPIRY_S = CASSANDRA_EXPIRY_LIMIT_S - EXPIRY_MARGIN_S
MAX_TTL_S = 20 * 365 * 86_400


class SchemaVersionError(CountersinkError):
    """Raised when a keyspace holds an older countersink schema than this version reads and writes."""


_OFFSET = struct.Struct(">q")
_KEYLESS_PARTITION = "\\"  # a dangling escape: decode_instance_key refuses it, so no event's key is this


def partition_key(key: str) -> str:
    """The ``shards`` partition of an instance key; :func:`key_of_partition` is its inverse.

    Raises :class:`MalformedInstanceKeyError` for the one string that is not an instance key and would alias
    the keyless instance.
    """
    if key == "":
        return _KEYLESS_PARTITION
    if key == _KEYLESS_PARTITION:
        raise MalformedInstanceKeyError(f"bad escape in instance key {key!r}")
    return key


def key_of_partition(partition: str) -> str:
    """The instance key stored as ``partition`` in ``shards.key``."""
    return "" if partition == _KEYLESS_PARTITION else partition


def shard_cell(state: bytes, through_offset: int) -> bytes:
    """One cell of ``shards.states``: the last Kafka offset the state covers, then the state's bytes."""
    return _OFFSET.pack(through_offset) + state


def shard_of_cell(cell: bytes) -> tuple[bytes, int]:
    """The state's bytes and the offset of a :func:`shard_cell`."""
    if len(cell) <= _OFFSET.size:
        raise CorruptStateError(f"a shard cell of {len(cell)} bytes holds no state")
    return cell[_OFFSET.size:], _OFFSET.unpack_from(cell)[0]


# Slots per time bucket (schema 4): a bucket's keys share this many partitions. Sixteen made a flush's rows
# cost Cassandra 0.4-0.6x what a partition per key did (docs/benchmarks.md, "Rows holding many keys"); a slot
# is one replica set, so an hour's writes load at most this many of them. Changing it moves every bucketed key:
# it is part of the schema version.
SHARD_SLOTS = 16
# A bucket's start ends the instance key of a bucketed counter (schemas.timeseries.bucket_key).
_BUCKET_START = re.compile(r"[0-9]{4,5}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}Z")
# The partitions of the buckets shard_slice met last: a flush meets a few buckets, a replay or a GC run a few
# hundred at most, so this bound is only against an unbounded growth over months of hours.
_BUCKETS_KEPT = 4096
_BUCKET_PARTS: dict[str, tuple[str, ...]] = {}


def shard_slice(key: str) -> tuple[str, str]:
    """Where instance key ``key``'s rows are in ``shards``: its partition (``part``) and its clustering key
    (``key``). A key ending in a bucket's start is in the partition of that bucket and of the slot of the key's
    digest, under its own text; any other key is in the partition its text names (as :func:`partition_key`
    stores it), under the empty text. Any function of the key alone would be correct, as long as no two keys
    share a place; this one groups what one flush writes (the keys of the buckets it counts in), bounds what a
    partition holds (a bucket's keys over the slots), and reads a key without a bucket as schema 3 did, one
    partition named in a request. No two keys share a place: a bucket's key is never empty. :func:`slice_key`
    is its inverse.

    Raises :class:`MalformedInstanceKeyError` as :func:`partition_key` does.
    """
    stored = partition_key(key)
    # (Asked for every row of every flush, mostly of keys it has not seen: the shape checked first, in a few
    # character comparisons, and a bucket's start checked once, with its slots' partitions kept.)
    if key[-1:] != "Z" or key[-4:-3] != ":":
        return stored, ""
    bucket = key[key.rfind("|") + 1:]
    parts = _BUCKET_PARTS.get(bucket)
    if parts is None:
        if len(bucket) not in (17, 18) or bucket[-10] != "-" or not _BUCKET_START.fullmatch(bucket):
            return stored, ""
        if len(_BUCKET_PARTS) >= _BUCKETS_KEPT:
            _BUCKET_PARTS.clear()
        # Interned: a flush's rows then hold a bucket's few partition names, not a copy per key.
        parts = _BUCKET_PARTS[bucket] = tuple(sys.intern(f"{bucket}#{slot:d}") for slot in range(SHARD_SLOTS))
    return parts[zlib.crc32(key.encode()) % SHARD_SLOTS], stored


def slice_key(part: str, key: str) -> str:
    """The instance key whose rows are at ``part`` and ``key`` (:func:`shard_slice`)."""
    return key_of_partition(part if key == "" else key)


def partition_groups(keys: Sequence[str], per_request: int) -> list[tuple[list[str], list[str]]]:
    """Requests reading the slices of ``keys`` (instance keys), as ``(parts, clustering keys)`` pairs to select
    with ``part IN ? AND key IN ?``, each naming at most ``per_request`` keys: the keys of a partition holding
    several of them together; keys without a bucket as their partitions and the empty key; the other keys of
    buckets, their partitions and keys (Cassandra reads every pair of the two lists, and a key is in its own
    partition only: the other pairs find nothing, so those requests are kept small)."""
    by_part: dict[str, list[str]] = {}
    for key in dict.fromkeys(keys):
        part, stored = shard_slice(key)
        by_part.setdefault(part, []).append(stored)
    groups: list[tuple[list[str], list[str]]] = []
    whole: list[str] = []
    alone: list[tuple[str, str]] = []
    for part, of_part in by_part.items():
        if of_part == [""]:
            whole.append(part)
        elif len(of_part) == 1:
            alone.append((part, of_part[0]))
        else:
            groups.extend(([part], of_part[i:i + per_request]) for i in range(0, len(of_part), per_request))
    groups.extend((whole[i:i + per_request], [""]) for i in range(0, len(whole), per_request))
    pairs = max(1, min(per_request, _CROSSED_KEYS))
    for i in range(0, len(alone), pairs):
        chunk = alone[i:i + pairs]
        groups.append(([part for part, _ in chunk], [stored for _, stored in chunk]))
    return groups


# Keys of different buckets' partitions read in one request: it reads every partition for every key, so their
# number squared.
_CROSSED_KEYS = 12


# One row of ``shards``, every column of its primary key bound (:func:`shard_slice`'s two, then its birth and
# mutator); and a stamp set there, by a drop's sweep or a GC fold (its TTL, source and timestamp bound first).
SHARD_ROW_WHERE = "WHERE part = ? AND key = ? AND born_us = ? AND mutator = ?"
SET_STAMP = f"UPDATE shards USING TTL ? SET stamps[?] = ? {SHARD_ROW_WHERE}"  # noqa: S608


# The row of a key's stamps (born_us, mutator): after every mutator's row, since births are clock readings.
STAMP_ROW = (2**63 - 1, uuid.UUID(int=0))
# The row of a key's tallies: before every mutator's row, and below every range the GC deletes.
TALLY_ROW = (-(2**63), uuid.UUID(int=0))
# The sources of the stamps a drop's sweep and a GC fold write: not 8 bytes, so no consumer's. A fold keeps every
# value, but a merge of sketches depends on their grouping (KLL compacts at random, frequent items by order): a
# kept merge of the shards before it is not what a read after it merges.
DROP_STAMP_SOURCE = b"drop"
GC_STAMP_SOURCE = b"gc"
# How long a stamp lives unless its row expires sooner: each write renews it, and one that expires only makes
# the stamps differ (a kept merge is read again), while sources that stopped writing (a backfill's group, a
# dropped counter's) leave the row. Far above the longest a merge is kept (ServeSettings.state_cache_max_age_s).
STAMP_TTL_S = 30 * 86_400


def stamp_source(consumer_group: str, topic: str, partition: int) -> bytes:
    """The name of a source's cell of ``shards.stamps``: 8 bytes of a digest of the group, topic and partition
    (a partition's stamps hold one per source that wrote it, a few hundred at most)."""
    body = f"{consumer_group}\0{topic}\0{partition:d}".encode()
    return hashlib.blake2b(body, digest_size=8, person=b"cs-stamp").digest()


def row_ttl(expires_at: int, now_s: int) -> int | None:
    """The TTL (seconds) of a row meant to expire at ``expires_at`` (epoch seconds), written at ``now_s``:
    ``None`` when it must not be written at all (its expiry has passed, or the storage can hold nothing past
    ``now_s``). The row expires at ``expires_at`` or, when that is later, at :data:`LAST_EXPIRY_S`, and its
    TTL is at most :data:`MAX_TTL_S`: every TTL returned is one Cassandra takes."""
    ttl = min(expires_at, LAST_EXPIRY_S) - now_s
    return None if ttl <= 0 else min(ttl, MAX_TTL_S)


_WORK_ENCODER = msgspec.json.Encoder()


def work_chunk(instances: Sequence[tuple[str, str]]) -> tuple[bytes, bytes]:
    """One row of ``mutator_work``: its name (a digest of the content) and the instances, as JSON pairs."""
    # (msgspec writes the bytes json.dumps(ensure_ascii=False, separators=(",", ":")) would, escapes included,
    # in a ninth of the time: a flush of new instances writes one of these per thousand. Same bytes, same name,
    # so a replay by a consumer of an earlier version names its chunk as that version did.)
    body = _WORK_ENCODER.encode(instances)
    return hashlib.blake2b(body, digest_size=16).digest(), body


def instances_of_work(body: bytes) -> list[tuple[str, str]]:
    """The instances of a :func:`work_chunk`."""
    try:
        pairs = json.loads(body)
        return [(str(counter), str(key)) for counter, key in pairs]
    except (ValueError, TypeError) as exc:
        raise CorruptStateError(f"a work-list row does not decode: {exc}") from exc


class InvalidIdentifierError(CountersinkError):
    """Raised when a keyspace or table name is not a plain lower-case CQL identifier."""


# CQL's reserved keywords (Cassandra 3.11 to 5.0, with those newer grammars added): unquoted, CQL text refuses
# them as names, so a keyspace called ``select`` could be created by no statement countersink writes.
RESERVED_WORDS = frozenset({
    "add", "allow", "alter", "and", "apply", "asc", "authorize", "batch", "begin", "by", "columnfamily",
    "create", "default", "delete", "desc", "describe", "drop", "entries", "execute", "for", "from", "full",
    "grant", "if", "in", "index", "infinity", "insert", "into", "is", "keyspace", "keyspaces", "limit",
    "materialized", "mbean", "mbeans", "modify", "nan", "norecursive", "not", "null", "of", "on", "or", "order",
    "primary", "rename", "replace", "revoke", "schema", "select", "set", "table", "to", "token", "truncate",
    "unlogged", "unset", "update", "use", "using", "view", "where", "with",
})


def check_identifier(name: str) -> str:
    """Return ``name`` if it is safe to place in CQL text (it cannot be a bound parameter), else raise."""
    if not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError("not a valid identifier: use [a-z][a-z0-9_]{0,47}")
    if name in RESERVED_WORDS:
        raise InvalidIdentifierError("a reserved word of CQL: choose another name")
    return name


# Replication strategies and options allowed inside CREATE KEYSPACE's map literal.
_REPLICATION = re.compile(r"^\{\s*('[A-Za-z0-9_.]+'\s*:\s*'?[A-Za-z0-9_.]+'?\s*,?\s*)+\}$")


def check_replication(replication: str) -> str:
    """Return ``replication`` if it is a plain CQL map literal (it is placed in CQL text), else raise."""
    if not _REPLICATION.fullmatch(replication):
        raise InvalidIdentifierError(
            "the replication is not a plain CQL map like {'class': 'SimpleStrategy', 'replication_factor': 3}")
    factors = [value.strip("'") for name, value in re.findall(r"'([^']+)'\s*:\s*('?[A-Za-z0-9_.]+'?)", replication)
               if name != "class"]
    if not any(factor.isdigit() and int(factor) > 0 for factor in factors):
        # Cassandra creates such a keyspace, then fails every request with "No hosts available".
        raise InvalidIdentifierError("the replication places no replica: give replication_factor (or a data "
                                     "center's factor) of at least 1")
    return replication


def replication_factors(replication: str) -> tuple[str, dict[str, int]]:
    """The class of a :func:`check_replication` map and its factors: per data center (NetworkTopologyStrategy),
    or ``replication_factor`` (SimpleStrategy, or every data center's default)."""
    pairs = dict(re.findall(r"'([^']+)'\s*:\s*'?([A-Za-z0-9_.]+)'?", replication))
    kind = pairs.pop("class", "").rsplit(".", 1)[-1]
    return kind, {name: int(value) for name, value in pairs.items() if value.isdigit()}


def replication_problem(replication: str, nodes: dict[str, int]) -> str | None:
    """Why a new keyspace of ``replication`` could not be written on a cluster of ``nodes`` (per data center),
    or None: more replicas than nodes, or a data center the cluster lacks. Cassandra creates such a keyspace, and
    every request that needs a quorum of its replicas then fails as "No hosts available"."""
    kind, factors = replication_factors(replication)
    total = sum(nodes.values())
    if kind == "SimpleStrategy":
        wanted = {"the cluster": (factors.get("replication_factor", 0), total)}
    else:
        default = factors.pop("replication_factor", None)
        named = factors or ({dc: default for dc in nodes} if default is not None else {})
        unknown = sorted(dc for dc in named if dc not in nodes)
        if unknown:
            return (f"the replication names data center {', '.join(map(repr, unknown))}, which the cluster lacks "
                    f"(its data centers: {', '.join(map(repr, sorted(nodes)))})")
        wanted = {f"data center {dc!r}": (factor, nodes[dc]) for dc, factor in named.items()}
    for where, (factor, count) in wanted.items():
        if factor > count:
            return (f"replication_factor {factor} places more replicas than {where} has nodes ({count}): every "
                    f"write needing a quorum of them would fail; give at most {count}, or add nodes first")
    return None


def create_keyspace(keyspace: str, replication: str) -> str:
    return (
        f"CREATE KEYSPACE IF NOT EXISTS {check_identifier(keyspace)} "
        f"WITH replication = {check_replication(replication)}"
    )


# A read returns only what it asks for (a stamps row alone, or one counter's cells): Cassandra's blocking read
# repair would write that part alone to a lagging replica, which could then hold a write's stamp without the
# states it stamps, and serve's cache would keep a merge missing that write under stamps that never change again.
# Without read repair a replica only gets whole mutations (writes, hints, repair). What is given up: a quorum read
# that saw a write still in flight may be followed by one that does not, until the write is acknowledged.
SHARDS_READ_REPAIR = "read_repair = 'NONE'"


def shards_options(keyspace: str) -> str:
    """The statement setting the options of ``shards`` that a keyspace made before them lacks."""
    return f"ALTER TABLE {check_identifier(keyspace)}.shards WITH {SHARDS_READ_REPAIR}"


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
            part text,
            key text,
            born_us bigint,
            mutator uuid,
            tallies map<text, blob>,
            states map<text, blob>,
            stamps map<blob, bigint>,
            PRIMARY KEY ((part), key, born_us, mutator)
        ) WITH {overwrite_heavy} AND {SHARDS_READ_REPAIR}""",
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
            collected_us bigint,
            start_offset bigint,
            counters set<text>
        )""",
        # The GC's work list: the instances each mutator wrote, a flush's new ones in a few rows of
        # work_chunk() each, named by a digest of their content, so that a repeated write rewrites the
        # same row and a different one never overwrites another.
        f"""CREATE TABLE IF NOT EXISTS {ks}.mutator_work (
            mutator uuid,
            chunk blob,
            instances blob,
            PRIMARY KEY ((mutator), chunk)
        )""",
        # The counter registry: each counter's definition as a consumer recorded it before counting
        # (schemas/registry.py). Readers learn names and kinds from it; a changed meaning is refused.
        f"""CREATE TABLE IF NOT EXISTS {ks}.counters (
            name text PRIMARY KEY,
            kind text,
            fingerprint text,
            definition text,
            registered_us bigint,
            registered_by text,
            consumer_group text,
            dropped_us bigint,
            dropped_by text,
            topic_formats text
        )""",
        # Resets (schemas/resets.py): one row per reset of a counter, by its epoch (a new epoch is claimed by
        # INSERT ... IF NOT EXISTS), recorded before its control records are published; never deleted while
        # the counter exists (a control record is checked against it, by a replay too).
        f"""CREATE TABLE IF NOT EXISTS {ks}.resets (
            counter text,
            epoch bigint,
            id text,
            keys set<text>,
            partitions map<text, int>,
            requested_by text,
            requested_us bigint,
            request_key text,
            PRIMARY KEY ((counter), epoch)
        )""",
        # Where each reset sits in a partition: the offset of its control record there, recorded by the reset
        # command from its acknowledgements and by the mutator that applies it (the least offset of the reset's
        # id counts: a counter dropped, forgotten and defined again numbers its epochs from 1 again, and a late
        # position of the old one's reset must not place the new one's).
        f"""CREATE TABLE IF NOT EXISTS {ks}.reset_positions (
            topic text,
            partition int,
            counter text,
            epoch bigint,
            offset bigint,
            reset_id text,
            PRIMARY KEY ((topic, partition), counter, epoch, offset)
        )""",
        # Hand-overs (consumer/handovers.py, countersink/backfills.py): per live group and cell (a counter, or
        # the epoch cell a reprocess fills), the offset of each partition where the live mutators count on (for
        # a counter with ``since``, where its backfill stops), recorded once by INSERT ... IF NOT EXISTS; a
        # backfill's start and when it finished the partition.
        f"""CREATE TABLE IF NOT EXISTS {ks}.handovers (
            consumer_group text,
            cell text,
            topic text,
            partition int,
            offset bigint,
            recorded_us bigint,
            recorded_by text,
            mutator uuid,
            confirmed_us bigint,
            start_offset bigint,
            finished_us bigint,
            reset_id text,
            reprocess_from text,
            PRIMARY KEY ((consumer_group, cell), topic, partition)
        )""",
        # The id Kafka gave each topic counted here, as the first consumer to claim one of its partitions found
        # it (countersink.topic_ids): a topic deleted and created again under its name has another, and its
        # partitions are then not consumed (offsets start over, and the keyspace's positions are the old one's).
        f"""CREATE TABLE IF NOT EXISTS {ks}.topic_ids (
            topic text PRIMARY KEY,
            topic_id uuid,
            recorded_us bigint,
            recorded_by text
        )""",
        f"""CREATE TABLE IF NOT EXISTS {ks}.schema_meta (
            name text PRIMARY KEY,
            version int
        )""",
        # One row per GC run, newest first, kept 30 days; the static columns, written with TTL 0, are the end of
        # the last run that deferred nothing (read by every process's /metrics, countersink.gc_runs) and the
        # highest cutoff any run recorded before it read the registry (read by every claimant once registered:
        # consumer.protocol.Claimant).
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
            cutoff_us bigint STATIC,
            PRIMARY KEY ((name), started_us, run)
        ) WITH CLUSTERING ORDER BY (started_us DESC, run ASC) AND default_time_to_live = {GC_RUNS_TTL_S:d}""",
    ]


# Columns added to a table after it was first released, by table: a keyspace made before has the table without
# them, and ensure_schema adds them (ALTER TABLE ... ADD IF NOT EXISTS, idempotent). The counter registry's
# consumer group (one group per keyspace), its drop marker (a dropped counter's name stays refused) and the
# formats of its topics as the consumer last started with them (what a trace without a definitions file decodes).
ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    # The highest cutoff a GC run recorded before reading the registry (gc_worker.collector, Claimant).
    "gc_runs": (("cutoff_us", "bigint static"),),
    "counters": (("consumer_group", "text"), ("dropped_us", "bigint"), ("dropped_by", "text"),
                 ("topic_formats", "text")),
    # The proposing mutator and its confirmation (consumer.handovers): a row without a proposer is confirmed;
    # a reprocess's plan (countersink.backfills.record_plan).
    "handovers": (("mutator", "uuid"), ("confirmed_us", "bigint"), ("reset_id", "text"), ("reprocess_from", "text")),
    # A reset's idempotency key (POST /counters/{name}/reset's Idempotency-Key): a repeated request answers it.
    "resets": (("request_key", "text"),),
    # The reset a position is of (a row without one, written before, is taken as its epoch's reset's).
    "reset_positions": (("reset_id", "text"),),
    # Where each mutator started and the counters it counts (consumer.protocol.record_start): read by a takeover
    # replaying its window (which counters that window counts) and by countersink trace. COUNTED_NONE stands for
    # an empty set, which Cassandra stores as null, the "recorded none" of an earlier version.
    "mutators": (("start_offset", "bigint"), ("counters", "set<text>")),
}


def add_columns(keyspace: str, table: str) -> str:
    """The statement adding :data:`ADDED_COLUMNS` of ``table`` to a table made before them."""
    columns = ", ".join(f"{check_identifier(name)} {kind}" for name, kind in ADDED_COLUMNS[table])
    return f"ALTER TABLE {check_identifier(keyspace)}.{check_identifier(table)} ADD IF NOT EXISTS ({columns})"


def table_names(keyspace: str) -> set[str]:
    """The tables :func:`create_tables` makes."""
    return {re.search(r"CREATE TABLE IF NOT EXISTS \w+\.(\w+)", statement).group(1)  # type: ignore[union-attr]
            for statement in create_tables(keyspace)}


def read_schema_version(keyspace: str) -> str:
    return f"SELECT version FROM {check_identifier(keyspace)}.schema_meta WHERE name = 'countersink'"  # noqa: S608


def record_schema_version(keyspace: str) -> str:
    ks = check_identifier(keyspace)  # validated identifier; the version is our own integer constant
    return f"INSERT INTO {ks}.schema_meta (name, version) VALUES ('countersink', {SCHEMA_VERSION:d})"  # noqa: S608


# A mutator's recorded counters when it counts none (mutators.counters): an empty set is stored as null, which
# reads as "recorded none" (a version before counters were recorded: it may have counted any). No counter has
# this name, so a reader of either meaning finds in it none of the counters it asks about.
COUNTED_NONE = ""


def counters_recorded(column: Iterable[str] | None) -> frozenset[str] | None:
    """A mutator's recorded counters from its ``mutators.counters`` column: None when it recorded none."""
    if not column:
        return None
    return frozenset(column) - {COUNTED_NONE}
