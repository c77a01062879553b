"""The :class:`~consumer.storage.Store` of the flush/takeover protocol on countersink's Cassandra tables."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from consumer.storage import FORGOTTEN, Forgotten, MutatorEntry, PartitionId, PartitionRow, ShardWrite, StoredShard
from countersink.cassandra import CassandraClient, as_dicts
from countersink.gc_runs import RUNS_PARTITION
from countersink.metrics import METRICS
from schemas.cql import (
    COUNTED_NONE,
    SHARD_ROW_WHERE,
    STAMP_ROW,
    STAMP_TTL_S,
    counters_recorded,
    partition_groups,
    row_ttl,
    shard_cell,
    shard_of_cell,
    shard_slice,
    slice_key,
    work_chunk,
)
from schemas.resets import split_cell


def _uuid(value: object) -> uuid.UUID | None:
    """The driver returns uuid columns as text."""
    return None if value is None else uuid.UUID(str(value))


# Under Cassandra's default batch_size_warn_threshold (5 KiB) with room to spare: what rows of several
# partitions go in one request.
_BATCH_BYTES = 4096
# A partition's rows go in single-partition batches (one mutation: Cassandra checks no size threshold on
# them) of at most this many keys (a row each, most of them) and bytes: far below the largest mutation
# Cassandra takes (half a commit log segment, 16 MiB by default) and small enough to be applied well within a
# write timeout on a busy node (docs/benchmarks.md, "Rows holding many keys": 1,000-row batches timed out
# there, 250-row ones did not).
_PARTITION_BATCH_ROWS = 250
_PARTITION_BATCH_BYTES = 512 * 1024
# What a cell adds beyond its name and value bytes (cell header, and the row's mutator id and timestamp
# shared out), roughly.
_CELL_OVERHEAD_BYTES = 32
# What a key's stamp adds to a batch (schemas.cql: its row, a source and a timestamp).
_STAMP_BYTES = 48
# Instances per work-list row: a few tens of KiB with keys of a few tens of bytes (keys are bounded, so a row
# stays far below Cassandra's mutation size limits).
_WORK_CHUNK_INSTANCES = 1000
# Keys one stamps statement names (key IN ?): Cassandra's in_select_cartesian_product guardrail, off by default,
# also counts an UPDATE's clustering keys, and 25 is the warning threshold its documentation suggests.
_STAMPED_KEYS_PER_STATEMENT = 25
# A flushed row's statements, bound for every row of every flush: what is the same for all of them (the
# flush's timestamp, the stamps row, a stamp's TTL without retention) is in the batch or the text, not bound
# each time (python -m bench.versions flushes).
# A key of a bucket binds its partition and its text; any other key is its partition alone, under the empty
# text (schemas.cql.shard_slice), which is in the statements' text: one value less to bind, twice a row.
_ROW_WHERE = {True: SHARD_ROW_WHERE, False: SHARD_ROW_WHERE.replace("key = ?", "key = ''")}
_STAMP_ROW_WHERE = {bucketed: where.replace("born_us = ? AND mutator = ?",
                                            f"born_us = {STAMP_ROW[0]:d} AND mutator = {STAMP_ROW[1]}")
                    for bucketed, where in _ROW_WHERE.items()}
_SHARD_CQL = {b: f"UPDATE shards SET states = states + ? {w}" for b, w in _ROW_WHERE.items()}  # noqa: S608
_EXPIRING_SHARD_CQL = {b: f"UPDATE shards USING TTL ? SET states = states + ? {w}"  # noqa: S608
                       for b, w in _ROW_WHERE.items()}
_STAMP_CQL = {b: f"UPDATE shards USING TTL {STAMP_TTL_S:d} SET stamps[?] = ? {w}"  # noqa: S608
              for b, w in _STAMP_ROW_WHERE.items()}
_EXPIRING_STAMP_CQL = {b: f"UPDATE shards USING TTL ? SET stamps[?] = ? {w}"  # noqa: S608
                       for b, w in _STAMP_ROW_WHERE.items()}
# The stamps of a single-partition batch's keys, one statement for many of them (their stamps rows all get the
# same cell): half the statements of the batch to bind, send and apply. By whether the TTL is bound (a row's) or
# a stamp's own.
_STAMPS_OF_KEYS_CQL = {ttl: f"UPDATE shards USING TTL {'?' if ttl else STAMP_TTL_S} SET stamps[?] = ? "  # noqa: S608
                       f"{_STAMP_ROW_WHERE[True].replace('key = ?', 'key IN ?')}" for ttl in (True, False)}
# Keys per shard read of a replay: Cassandra's coordinator reads them as separate partitions, but the
# client pays for one request. Far below the IN-list limits Cassandra warns about.
_READ_KEYS_PER_REQUEST = 50


def _with_stamps(part: str, unit: list[Any], source: bytes, timestamp_us: int) -> list[tuple[str, list[object]]]:
    """The statements of a bucket's key's unit (see ``write_shards``) sent with other partitions: its states and a
    stamp, for each of its rows."""
    _, states, ttls, stored = unit
    statements: list[tuple[str, list[object]]] = []
    for row_states, ttl_s in zip(states, ttls, strict=True):
        statements += (row_states, (_STAMP_CQL[True], [source, timestamp_us, part, stored]) if ttl_s is None else
                       (_EXPIRING_STAMP_CQL[True], [ttl_s, source, timestamp_us, part, stored]))
    return statements


def _partition_batch(part: str, units: list[list[Any]], source: bytes, timestamp_us: int
                     ) -> list[tuple[str, list[object]]]:
    """The statements of a single-partition batch of keys' units: their states, then their stamps, one
    statement per TTL naming every key stamped with it."""
    statements: list[tuple[str, list[object]]] = []
    stamped: dict[int | None, list[str]] = {}
    for _, states, ttls, stored in units:
        statements += states
        for ttl_s in ttls:
            stamped.setdefault(ttl_s, []).append(stored)
    for ttl_s, stored in stamped.items():
        for start in range(0, len(stored), _STAMPED_KEYS_PER_STATEMENT):
            named = stored[start:start + _STAMPED_KEYS_PER_STATEMENT]
            statements.append((_STAMPS_OF_KEYS_CQL[False], [source, timestamp_us, part, named]) if ttl_s is None
                              else (_STAMPS_OF_KEYS_CQL[True], [ttl_s, source, timestamp_us, part, named]))
    return statements


class CassandraStore:
    """:class:`Store` on countersink's tables (see ``schemas.cql``)."""

    def __init__(self, client: CassandraClient) -> None:
        self.client = client
        self.write_cl = client.settings.write_consistency
        # The store's only reads of shards are a replay's, which decide what it writes (see
        # countersink.consistency): never at the read level configured for serving.
        self.read_cl = client.settings.replay_read_consistency
        self.batch_rows = client.settings.write_batch_rows
        # Counters dropped from the registry while this consumer runs: no write of theirs leaves this store
        # (flushes and replays alike), so a consumer still holding the old definitions never writes them back.
        self.refused: set[str] = set()

    def _shard_call(self, group: list[tuple[str, list[object]]], timestamp_us: int
                    ) -> Callable[[], Awaitable[object]]:
        # Every statement of a flush is written at the flush's timestamp: the batch's, not a bound value each.
        return functools.partial(self.client.execute_batch, group, consistency=self.write_cl,
                                 timestamp_us=timestamp_us)

    async def _lwt(self, cql_text: str, params: list[object]) -> bool:
        # A conditional update is not idempotent from the driver's point of view: never retried blindly.
        result = await self.client.execute(cql_text, params, consistency=self.write_cl, idempotent=False)
        rows = as_dicts(result)
        return bool(rows and rows[0].get("[applied]"))

    async def read_partition(self, pid: PartitionId) -> PartitionRow | None:
        # SERIAL read: sees any LWT that was accepted by a quorum, even one whose commit did not finish.
        result = await self.client.execute(
            "SELECT owner, window_mutator, window_born_us, flush_seq, committed_offset, intent_offset "
            "FROM partitions WHERE consumer_group = ? AND topic = ? AND partition = ?",
            [pid.consumer_group, pid.topic, pid.partition],
            consistency=str(self.client.settings.serial_consistency),
        )
        rows = as_dicts(result)
        if not rows:
            return None
        row = rows[0]
        return PartitionRow(
            owner=_uuid(row["owner"]),
            window_mutator=_uuid(row["window_mutator"]),
            window_born_us=row["window_born_us"],
            flush_seq=row["flush_seq"] or 0,
            committed_offset=row["committed_offset"] if row["committed_offset"] is not None else -1,
            intent_offset=row["intent_offset"] if row["intent_offset"] is not None else -1,
        )

    async def create_partition(self, pid: PartitionId, owner: uuid.UUID, born_us: int, last_offset: int) -> bool:
        return await self._lwt(
            "INSERT INTO partitions (consumer_group, topic, partition, owner, window_mutator, window_born_us, "
            "flush_seq, committed_offset, intent_offset) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?) IF NOT EXISTS",
            [pid.consumer_group, pid.topic, pid.partition, owner, owner, born_us, last_offset, last_offset],
        )

    async def claim_partition(self, pid: PartitionId, owner: uuid.UUID, seen: PartitionRow) -> bool:
        # (owner, flush_seq) alone repeats: close_window resets flush_seq to 0 under the same owner, so a
        # claim prepared from an older read could apply and rewind the partition. window_mutator makes the
        # triple unique: every close renames it to the new owner, whose flush_seq then only grows.
        return await self._lwt(
            "UPDATE partitions SET owner = ? WHERE consumer_group = ? AND topic = ? AND partition = ? "
            "IF owner = ? AND flush_seq = ? AND window_mutator = ?",
            [owner, pid.consumer_group, pid.topic, pid.partition, seen.owner, seen.flush_seq, seen.window_mutator],
        )

    async def open_window(
        self, pid: PartitionId, mutator: uuid.UUID, born_us: int, seq: int, committed: int, intent: int
    ) -> bool:
        return await self._lwt(
            "UPDATE partitions SET window_mutator = ?, window_born_us = ?, flush_seq = ?, committed_offset = ?, "
            "intent_offset = ? WHERE consumer_group = ? AND topic = ? AND partition = ? IF owner = ? AND flush_seq = ?",
            [mutator, born_us, seq, committed, intent, pid.consumer_group, pid.topic, pid.partition, mutator, seq - 1],
        )

    async def commit_window(self, pid: PartitionId, mutator: uuid.UUID, seq: int, offset: int) -> bool:
        return await self._lwt(
            "UPDATE partitions SET committed_offset = ? WHERE consumer_group = ? AND topic = ? AND partition = ? "
            "IF owner = ? AND flush_seq = ?",
            [offset, pid.consumer_group, pid.topic, pid.partition, mutator, seq],
        )

    async def close_window(self, pid: PartitionId, owner: uuid.UUID, born_us: int, offset: int) -> bool:
        return await self._lwt(
            "UPDATE partitions SET window_mutator = ?, window_born_us = ?, flush_seq = 0, committed_offset = ?, "
            "intent_offset = ? WHERE consumer_group = ? AND topic = ? AND partition = ? IF owner = ?",
            [owner, born_us, offset, offset, pid.consumer_group, pid.topic, pid.partition, owner],
        )

    async def write_shards(self, mutator: uuid.UUID, born_us: int, timestamp_us: int,
                           writes: Sequence[ShardWrite], *, source: bytes) -> None:
        # The counters of one key go to one row (one cell each, added to the map: no tombstone, and a counter
        # not written keeps its cell). A row is what Cassandra's work follows, far more than its bytes.
        # The key's stamp of this source goes in the same batch as its row (one mutation per partition: a
        # replica holding the states holds their stamp), at the same timestamp (schemas.cql).
        mutator_text = str(mutator)  # the driver takes a uuid column's text; a UUID object costs more to bind
        work_cql = "INSERT INTO mutator_work (mutator, chunk, instances) VALUES (?, ?, ?)"
        # A bucket with retention: every row of it expires at its expiry plus the grace (readers hide it from
        # the expiry on), and a bucket already past that is not written at all: a late flush or a replay must
        # not bring back part of a bucket that is gone. No row expires after what Cassandra stores (row_ttl:
        # a bucket whose expiry is later expires then, docs/counters.md), so no write is ever refused for it.
        if self.refused:  # a write names a cell: the counter's own name, or counter@epoch after a reset
            writes = [w for w in writes if split_cell(w.counter)[0] not in self.refused]
        grace, now_s = self.client.settings.retention_grace_s, int(time.time())
        # Each expiry's TTL once: a flush's retained instances share a few buckets.
        ttls = {at: row_ttl(at + grace, now_s) for at in {w.expires_at for w in writes} if at is not None}
        if any(ttl is None for ttl in ttls.values()):
            for write in writes:
                if write.expires_at is not None and ttls[write.expires_at] is None:
                    METRICS.expired_writes_skipped.labels(write.counter).inc()
            writes = [w for w in writes if w.expires_at is None or ttls[w.expires_at] is not None]
        # A key's rows: one per expiry its counters have (a cell per counter), most keys one.
        rows: dict[tuple[str, int | None], dict[str, bytes]] = {}
        for write in writes:
            rows.setdefault((write.key, write.expires_at), {})[write.counter] = shard_cell(write.state,
                                                                                            write.through_offset)
        calls: list[Callable[[], Awaitable[object]]] = []
        # A partition's rows are one single-partition batch (a few hundred rows at most): one mutation and one
        # request for all of them. Partitions of a row or a few go several to a request (an unlogged batch): one
        # request per row costs the client and the server more than the row itself. Each partition is still its
        # own mutation (no atomicity across them is needed or assumed), and such a batch stays under Cassandra's
        # warning thresholds for size and for partitions per unlogged batch. A key's rows and stamps are never
        # split between requests: its stamps are the same value in each, and serve, having read the key between
        # two such requests, would keep a merge missing the second under stamps that the second does not change.
        # The keys of a bucket by partition (schemas.cql.shard_slice: a bucket's keys share a few): each key's
        # bytes, its states' statements (one per row) and its stamps' TTLs (one per row: None without), gathered
        # in one unit (a key's second row, of another expiry, joins its first), and its clustering key; a
        # single-partition batch stamps all its keys in one statement. The keys of a partition of their own are
        # sent several to a batch, each as [bytes, statements] (its states and its stamp, for each of its rows).
        parts: dict[str, list[list[Any]]] = {}
        shared: list[list[Any]] = []
        keys: dict[str, list[Any]] = {}
        for (key, expires_at), cells in rows.items():
            part, stored = shard_slice(key)
            # (Counter names are ASCII: their length is their size. Summed in a loop: most rows hold a cell or two.)
            size = (len(key) if key.isascii() else len(key.encode())) + _STAMP_BYTES
            for name, cell in cells.items():
                size += len(name) + len(cell) + _CELL_OVERHEAD_BYTES
            ttl_s = None if expires_at is None else ttls[expires_at]
            unit = keys.get(key)
            if stored == "":
                row = ((_SHARD_CQL[False], [cells, part, born_us, mutator_text]),
                       (_STAMP_CQL[False], [source, timestamp_us, part])) if ttl_s is None else (
                       (_EXPIRING_SHARD_CQL[False], [ttl_s, cells, part, born_us, mutator_text]),
                       (_EXPIRING_STAMP_CQL[False], [ttl_s, source, timestamp_us, part]))
                if unit is None:
                    keys[key] = unit = [size, [*row]]
                    shared.append(unit)
                else:
                    unit[0] += size
                    unit[1] += row
                continue
            states = ((_SHARD_CQL[True], [cells, part, stored, born_us, mutator_text]) if ttl_s is None else
                      (_EXPIRING_SHARD_CQL[True], [ttl_s, cells, part, stored, born_us, mutator_text]))
            if unit is None:
                keys[key] = unit = [size, [states], [ttl_s], stored]
                parts.setdefault(part, []).append(unit)
            else:
                unit[0] += size
                unit[1].append(states)
                unit[2].append(ttl_s)
        for part, of_part in parts.items():
            part_bytes = sum(unit[0] for unit in of_part)
            if len(of_part) > 1 and (len(of_part) >= self.batch_rows or part_bytes > _BATCH_BYTES):
                batch: list[list[Any]] = []
                batch_bytes = 0
                for unit in of_part:
                    full = len(batch) >= _PARTITION_BATCH_ROWS or batch_bytes + unit[0] > _PARTITION_BATCH_BYTES
                    if batch and full:
                        calls.append(self._shard_call(_partition_batch(part, batch, source, timestamp_us),
                                                      timestamp_us))
                        batch, batch_bytes = [], 0
                    batch.append(unit)
                    batch_bytes += unit[0]
                calls.append(self._shard_call(_partition_batch(part, batch, source, timestamp_us), timestamp_us))
            else:
                shared.append([part_bytes, [statement for unit in of_part
                                            for statement in _with_stamps(part, unit, source, timestamp_us)]])
        group: list[tuple[str, list[object]]] = []
        group_bytes = group_parts = 0
        for part_bytes, statements in shared:
            if group and (group_parts >= self.batch_rows or group_bytes + part_bytes > _BATCH_BYTES):
                calls.append(self._shard_call(group, timestamp_us))
                group, group_bytes, group_parts = [], 0, 0
            group.extend(statements)
            group_bytes += part_bytes
            group_parts += 1
        if group:
            calls.append(self._shard_call(group, timestamp_us))
        # The GC's work list: the instances new to this mutator, a few thousand to a row. Their number follows
        # the keys, not the events, and a row per instance cost Cassandra as much as a shard row.
        new = [(write.counter, write.key) for write in writes if write.first_write]
        for start in range(0, len(new), _WORK_CHUNK_INSTANCES):
            chunk, body = work_chunk(new[start:start + _WORK_CHUNK_INSTANCES])
            calls.append(functools.partial(self.client.execute, work_cql, [mutator, chunk, body],
                                           consistency=self.write_cl))
        # Every write must be acknowledged before the next flush opens a window; the caller retries the whole
        # (idempotent) set after a failure.
        await self._run_bounded(calls)
        METRICS.shard_rows_written.inc(len(rows))

    async def _run_bounded(self, calls: Sequence[Callable[[], Awaitable[object]]]) -> None:
        """Run ``calls`` on a fixed number of workers, not one task each: a flush or replay of a hundred
        thousand rows must not queue them all for the client's in-flight slots at once (they would time out
        waiting, and each retry would queue them all again). Raises the first failure once every call in
        flight has ended; the caller retries the whole (idempotent) set."""
        pending = iter(calls)
        failures: list[Exception] = []

        async def worker() -> None:
            for call in pending:
                if failures:
                    return  # the set is retried whole: stop early, but never abandon a call in flight
                try:
                    await call()
                except Exception as exc:
                    failures.append(exc)
                    return

        # Half the client's in-flight slots per set: one mutator alone keeps Cassandra busy, and several
        # flushing at once wait for slots a few round trips at most, far below the queue timeout.
        workers = max(1, self.client.settings.max_in_flight // 2)
        await asyncio.gather(*(worker() for _ in range(min(len(calls), workers))))
        if failures:
            raise failures[0]

    async def read_shard(self, counter: str, key: str, mutator: uuid.UUID, born_us: int) -> StoredShard | None:
        result = await self.client.execute(
            f"SELECT states[?] AS cell FROM shards {SHARD_ROW_WHERE}",  # noqa: S608
            [counter, *shard_slice(key), born_us, mutator], consistency=self.read_cl)
        rows = as_dicts(result)
        if not rows or rows[0]["cell"] is None:
            return None
        return StoredShard(*shard_of_cell(rows[0]["cell"]))

    async def read_shards(self, mutator: uuid.UUID, born_us: int, instances: Sequence[tuple[str, str]]
                          ) -> dict[tuple[str, str], StoredShard | None]:
        # Keys go _READ_KEYS_PER_REQUEST to a request (IN on the partition and the key: schemas.cql's
        # partition_groups), each row with the cells of every counter of the key: a takeover replaying a window of
        # tens of thousands of instances would otherwise spend most of its time on per-request overhead. The
        # requests run concurrently, a bounded number at a time.
        found: dict[tuple[str, str], StoredShard | None] = dict.fromkeys(instances)

        async def read(parts: list[str], keys: list[str]) -> None:
            result = await self.client.execute(
                "SELECT part, key, states FROM shards WHERE part IN ? AND key IN ? AND born_us = ? AND mutator = ?",
                [parts, keys, born_us, mutator], consistency=self.read_cl)
            for row in as_dicts(result):
                key = slice_key(row["part"], row["key"])
                for counter, cell in (row["states"] or {}).items():
                    if (counter, key) in found:
                        found[(counter, key)] = StoredShard(*shard_of_cell(cell))

        groups = partition_groups([key for _, key in instances], _READ_KEYS_PER_REQUEST)
        await self._run_bounded([functools.partial(read, parts, keys) for parts, keys in groups])
        return found

    async def register_mutator(self, record: MutatorEntry) -> bool:
        # IF NOT EXISTS: a record seen before (perhaps retired since) must never come back as a new owner.
        return await self._lwt(
            "INSERT INTO mutators (id, consumer_group, topic, partition, host, born_us, expires_us) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            [record.id, record.consumer_group, record.topic, record.partition, record.host, record.born_us,
             record.expires_us])

    async def retire_mutator(self, mutator: uuid.UUID, retired_us: int) -> None:
        # Set once: a second retirement (by a later takeover) must not move the time the GC relies on.
        await self._lwt("UPDATE mutators SET retired_us = ? WHERE id = ? IF retired_us = null", [retired_us, mutator])

    async def record_start(self, mutator: uuid.UUID, start_offset: int, counters: frozenset[str]) -> None:
        # IF EXISTS: a write landing after the GC deleted the row (the process frozen past the mutator's
        # retirement and collection) must not bring back a row without a birth, which the GC would take for a live
        # mutator's. The row's other writes are LWTs too.
        await self._lwt("UPDATE mutators SET start_offset = ?, counters = ? WHERE id = ? IF EXISTS",
                        [start_offset, sorted(counters) or [COUNTED_NONE], mutator])

    async def read_counted(self, mutator: uuid.UUID) -> frozenset[str] | Forgotten | None:
        # At the replay's level: it decides where a counter is counted from (consumer.ownership).
        rows = as_dicts(await self.client.execute("SELECT counters FROM mutators WHERE id = ?", [mutator],
                                                  consistency=self.read_cl))
        return FORGOTTEN if not rows else counters_recorded(rows[0]["counters"])

    async def read_gc_cutoff(self) -> int:
        # SERIAL, as the ownership row: a quorum whatever the levels configured, so it meets the GC's write of the
        # cutoff (at a quorum at least: gc_worker.store) as the GC's read of the registry meets the registration.
        rows = as_dicts(await self.client.execute(
            "SELECT cutoff_us FROM gc_runs WHERE name = ? LIMIT 1", [RUNS_PARTITION],
            consistency=str(self.client.settings.serial_consistency)))
        return -1 if not rows or rows[0]["cutoff_us"] is None else int(rows[0]["cutoff_us"])


__all__ = ["CassandraStore"]
