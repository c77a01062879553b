""":class:`~gc_worker.collector.GcStore` on countersink's tables (see ``schemas.cql``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from countersink.cassandra import CassandraClient, as_dicts
from countersink.gc_runs import RUNS_PARTITION
from countersink.settings import Consistency
from gc_worker.collector import Instance, KeyView, Range, RegistryEntry, Row, ShardView
from schemas.cql import (
    GC_STAMP_SOURCE,
    SET_STAMP,
    SHARD_ROW_WHERE,
    STAMP_ROW,
    STAMP_TTL_S,
    TALLY_ROW,
    instances_of_work,
    shard_of_cell,
    shard_slice,
)
from schemas.errors import CountersinkError

_PAGE = 1000
_WORK_ROWS_PER_PAGE = 4


def _uuid(value: object) -> uuid.UUID:
    return uuid.UUID(str(value))  # the driver returns uuid columns as text


# A key's tally row (schemas.cql.TALLY_ROW), its partition and key bound.
_TALLY_ROW_WHERE = f"WHERE part = ? AND key = ? AND born_us = {TALLY_ROW[0]:d} AND mutator = {TALLY_ROW[1]}"
_READ_TALLIES = f"SELECT tallies, writetime(tallies) AS tally_us FROM shards {_TALLY_ROW_WHERE}"  # noqa: S608
_TALLY = f"UPDATE shards SET tallies[?] = ? {_TALLY_ROW_WHERE}"  # noqa: S608
_EXPIRING_TALLY = f"UPDATE shards USING TTL ? SET tallies[?] = ? {_TALLY_ROW_WHERE}"  # noqa: S608
# Levels that reach a quorum (of the data centre, for LOCAL_QUORUM: claimants there read at LOCAL_SERIAL).
_QUORUMS = frozenset({Consistency.QUORUM, Consistency.ALL, Consistency.EACH_QUORUM, Consistency.LOCAL_QUORUM})


class GcClockAheadError(CountersinkError):
    """This GC worker's clock is ahead of Cassandra's by more than the grace: the run folds nothing."""


class CassandraGcStore:
    """Reads instances at ``gc_read_consistency`` (ALL unless configured), the registry and the work lists at
    ``gc_list_consistency``, and writes at ``write_consistency``: every read here decides what the GC writes or
    deletes, so none is at the ``read_consistency`` configured for serving (see countersink.consistency)."""

    def __init__(self, client: CassandraClient, *, instance_consistency: Consistency | None = None,
                 page_size: int = _PAGE, clock_checked: bool = True) -> None:
        """``clock_checked=False`` records a cutoff past Cassandra's clock as any other: for a benchmark whose
        runs simulate time in a keyspace of its own, never for a deployment's."""
        self.client = client
        self.clock_checked = clock_checked
        settings = client.settings
        self.instance_cl = instance_consistency or settings.gc_read_consistency
        self.list_cl = settings.gc_list_consistency
        self.write_cl = settings.write_consistency
        self.page_size = page_size

    def _pages(self, cql_text: str, params: list[object], consistency: Consistency
               ) -> AsyncIterator[list[dict[str, object]]]:
        return self._pages_of(cql_text, params, consistency, self.page_size)

    async def _pages_of(self, cql_text: str, params: list[object], consistency: Consistency, page_size: int
                        ) -> AsyncIterator[list[dict[str, object]]]:
        page_state: bytes | None = None
        while True:
            result = await self.client.execute(cql_text, params, consistency=consistency,
                                               page_size=page_size, page_state=page_state)
            yield as_dicts(result)
            if not result.has_more_pages():
                return
            page_state = result.page_state()

    async def read_registry(self) -> list[RegistryEntry]:
        entries: list[RegistryEntry] = []
        async for rows in self._pages(
                "SELECT id, consumer_group, topic, partition, born_us, expires_us, retired_us, collected_us "
                "FROM mutators", [], self.list_cl):
            entries.extend(
                RegistryEntry(_uuid(r["id"]), str(r["consumer_group"] or ""), str(r["topic"] or ""),
                              int(r["partition"] if r["partition"] is not None else -1),  # type: ignore[call-overload]
                              int(r["born_us"] or 0), int(r["expires_us"] or 0),  # type: ignore[call-overload]
                              r["retired_us"], r["collected_us"])  # type: ignore[arg-type]
                for r in rows)
        return entries

    async def read_work(self, mutator: uuid.UUID) -> AsyncIterator[Sequence[Instance]]:
        # A row holds up to a thousand instances: a few rows to a page.
        async for rows in self._pages_of("SELECT instances FROM mutator_work WHERE mutator = ?",
                                         [mutator], self.list_cl, _WORK_ROWS_PER_PAGE):
            for r in rows:
                yield instances_of_work(r["instances"])  # type: ignore[arg-type]

    async def read_key(self, key: str) -> KeyView:
        tallies: dict[str, bytes] = {}
        tally_write_us: dict[str, int] = {}
        tally_ttls: dict[str, int | None] = {}
        shards = []
        pages = 0
        # Maps come back in key order, and writetime() and ttl() of a map list its cells in that order. The
        # tally row is the first of the key's slice (schemas.cql.TALLY_ROW): the first page's, read with it.
        async for rows in self._pages(
                "SELECT born_us, mutator, states, writetime(states) AS state_us, ttl(states) AS state_ttl, "
                "tallies, writetime(tallies) AS tally_us, ttl(tallies) AS tally_ttl FROM shards "
                "WHERE part = ? AND key = ?",
                list(shard_slice(key)), self.instance_cl):
            pages += 1
            for found in rows:
                row: dict[str, Any] = found
                if row["tallies"]:
                    for (counter, tally), write_us, ttl in zip(row["tallies"].items(), row["tally_us"] or (),
                                                               row["tally_ttl"] or (), strict=True):
                        tallies[counter], tally_write_us[counter], tally_ttls[counter] = tally, int(write_us), ttl
                if row["born_us"] == TALLY_ROW[0] or not row["states"]:
                    continue  # the tally row, or the stamps row
                cells = row["states"]
                shards.append(ShardView(
                    _uuid(row["mutator"]), int(row["born_us"]),
                    {counter: shard_of_cell(cell)[0] for counter, cell in cells.items()},
                    max(int(w) for w in row["state_us"]),
                    dict(zip(cells, row["state_ttl"], strict=True))))
        return KeyView(tallies, tally_write_us, tuple(shards), pages, tally_ttls)

    async def read_tallies(self, key: str) -> tuple[Mapping[str, bytes], Mapping[str, int]]:
        rows = as_dicts(await self.client.execute(_READ_TALLIES, list(shard_slice(key)), consistency=self.instance_cl))
        if not rows or not rows[0]["tallies"]:
            return {}, {}
        tallies = rows[0]["tallies"]
        return dict(tallies), {c: int(w) for c, w in zip(tallies, rows[0]["tally_us"], strict=True)}

    async def fold(self, key: str, tallies: Mapping[str, tuple[bytes, int | None]], ranges: Sequence[Range],
                   rows: Sequence[Row], timestamp_us: int) -> None:
        # One partition: Cassandra applies an unlogged batch on it atomically and in isolation. Every statement
        # takes the batch's timestamp, so repeating it changes nothing. The rows go by range tombstones over
        # birth times, each covering the last one written over the same births (schemas.cql), all above the
        # tally row.
        part, key = shard_slice(key)
        statements: list[tuple[str, Sequence[object]]] = [
            (_TALLY, [counter, tally, part, key]) if ttl_s is None
            else (_EXPIRING_TALLY, [max(ttl_s, 1), counter, tally, part, key])
            for counter, (tally, ttl_s) in tallies.items()]
        statements.extend(
            ("DELETE FROM shards WHERE part = ? AND key = ? AND born_us > ? AND born_us < ?",
             [part, key, TALLY_ROW[0] if after is None else after, before])
            for after, before in ranges)
        statements.extend((f"DELETE FROM shards {SHARD_ROW_WHERE}", [part, key, born, mutator])  # noqa: S608
                          for born, mutator in rows)
        # The key's stamp of the GC (schemas.cql): a merge of sketches kept from before the fold is not the
        # merge a read makes after it. Its row expires with the tallies, if they do.
        # It outlives every tally it stamps (a stamp that expires before a tally it changed could bring the stamps
        # back to what a kept merge was read with).
        ttls = [ttl_s for _, ttl_s in tallies.values()]
        stamp_ttl_s = STAMP_TTL_S if None in ttls or not ttls else max(1, *(t for t in ttls if t is not None))
        statements.append((SET_STAMP, [stamp_ttl_s, GC_STAMP_SOURCE, timestamp_us, part, key, *STAMP_ROW]))
        await self.client.execute_batch(statements, consistency=self.write_cl, timestamp_us=timestamp_us)

    async def record_cutoff(self, cutoff_us: int) -> None:
        if self.clock_checked:
            await self._refuse_a_cutoff_ahead(cutoff_us)
        # Written at the cutoff as its timestamp: whichever run's is highest stays, in any order. TTL 0: gc_runs'
        # rows expire, the cutoff must not. A static cell of the runs' partition: the GC's role may write it. At a
        # quorum at least, whatever the level configured: claimants read it at SERIAL (consumer.cassandra_store).
        level = self.write_cl if self.write_cl in _QUORUMS else Consistency.QUORUM
        await self.client.execute(
            "UPDATE gc_runs USING TIMESTAMP ? AND TTL 0 SET cutoff_us = ? WHERE name = ?",
            [cutoff_us, cutoff_us, RUNS_PARTITION], consistency=level)

    async def _refuse_a_cutoff_ahead(self, cutoff_us: int) -> None:
        """Raise :class:`GcClockAheadError` when ``cutoff_us`` is past Cassandra's own clock: it would stay (nothing
        lowers it) and hold every claimant's birth ahead of time until the clocks caught up; this worker's clock
        is then ahead by more than the grace."""
        rows = as_dicts(await self.client.execute(
            "SELECT toUnixTimestamp(now()) AS now_ms FROM system.local", [], consistency=Consistency.ONE))
        server_us = int(rows[0]["now_ms"]) * 1000
        if cutoff_us > server_us:
            raise GcClockAheadError(
                "this GC worker's clock is ahead of Cassandra's by more than the grace (its cutoff is "
                f"{(cutoff_us - server_us) / 1e6:.1f} s past Cassandra's now): nothing was folded (fix the clock: the "
                "GC's grace must exceed every clock skew)")

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None:
        await self.client.execute("UPDATE mutators SET collected_us = ? WHERE id = ?", [collected_us, mutator],
                                  consistency=self.write_cl)

    async def forget(self, mutator: uuid.UUID) -> None:
        await self.client.execute("DELETE FROM mutator_work WHERE mutator = ?", [mutator],
                                  consistency=self.write_cl)
        await self.client.execute("DELETE FROM mutators WHERE id = ?", [mutator], consistency=self.write_cl)


__all__ = ["CassandraGcStore"]
