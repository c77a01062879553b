""":class:`~gc_worker.collector.GcStore` on countersink's tables (see ``schemas.cql``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import Consistency
from gc_worker.collector import Instance, InstanceView, RegistryEntry, ShardView
from schemas.cql import instances_of_work, partition_key, shard_of_cell

_PAGE = 1000
_WORK_ROWS_PER_PAGE = 4


def _uuid(value: object) -> uuid.UUID:
    return uuid.UUID(str(value))  # the driver returns uuid columns as text


class CassandraGcStore:
    """Reads instances at ``gc_read_consistency`` (ALL unless configured), the registry and the work lists at
    ``gc_list_consistency``, and writes at ``write_consistency``: every read here decides what the GC writes or
    deletes, so none is at the ``read_consistency`` configured for serving (see countersink.consistency)."""

    def __init__(self, client: CassandraClient, *, instance_consistency: Consistency | None = None,
                 page_size: int = _PAGE) -> None:
        self.client = client
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

    async def read_instance(self, counter: str, key: str) -> InstanceView:
        tally: bytes | None = None
        tally_write_us: int | None = None
        shards = []
        pages = 0
        ttls: list[int | None] = []
        async for rows in self._pages(
                "SELECT mutator, states[?] AS cell, writetime(states[?]) AS state_us, ttl(states[?]) AS state_ttl, "
                "tallies[?] AS tally, writetime(tallies[?]) AS tally_us, ttl(tallies[?]) AS tally_ttl "
                "FROM shards WHERE key = ?",
                [*[counter] * 6, partition_key(key)], self.instance_cl):
            pages += 1
            if pages == 1 and rows:
                # Every row carries the static tally as of its own request: keep the first request's, which
                # the collector checks against a read of the tally after the last page.
                tally, tally_write_us = rows[0]["tally"], rows[0]["tally_us"]  # type: ignore[assignment]
                if tally is not None:
                    ttls.append(rows[0]["tally_ttl"])  # type: ignore[arg-type]
            for r in rows:
                # Rows of the key's other counters come too, without a cell of this one.
                if r["mutator"] is not None and r["cell"] is not None:
                    state, through_offset = shard_of_cell(r["cell"])  # type: ignore[arg-type]
                    shards.append(ShardView(_uuid(r["mutator"]), state, through_offset,
                                            int(r["state_us"])))  # type: ignore[call-overload]
                    ttls.append(r["state_ttl"])  # type: ignore[arg-type]
        # A bucket with retention: the tally lives as long as the longest-lived of its rows (they all expire
        # at the bucket's expiry plus the grace, give or take the writers' clocks).
        ttl_s = max(ttls) if ttls and None not in ttls else None  # type: ignore[type-var]
        return InstanceView(tally, tally_write_us, tuple(shards), pages, ttl_s)

    async def read_tally(self, counter: str, key: str) -> tuple[bytes | None, int | None]:
        # The static columns come with any row of the partition (or alone, if it has no shard rows).
        rows = as_dicts(await self.client.execute(
            "SELECT tallies[?] AS tally, writetime(tallies[?]) AS tally_us FROM shards WHERE key = ? LIMIT 1",
            [counter, counter, partition_key(key)], consistency=self.instance_cl))
        if not rows or rows[0]["tally"] is None:
            return None, None
        return rows[0]["tally"], int(rows[0]["tally_us"])

    async def fold(self, counter: str, key: str, tally: bytes, folded: Sequence[uuid.UUID], timestamp_us: int,
                   ttl_s: int | None = None) -> None:
        # One partition: Cassandra applies an unlogged batch on it atomically and in isolation. Every statement
        # takes the batch's timestamp, so repeating it changes nothing. Only this counter's cells change: the
        # key's other counters in the same rows are folded on their own.
        key = partition_key(key)
        statements: list[tuple[str, Sequence[object]]] = [
            ("UPDATE shards SET tallies[?] = ? WHERE key = ?", [counter, tally, key]) if ttl_s is None
            else ("UPDATE shards USING TTL ? SET tallies[?] = ? WHERE key = ?", [max(ttl_s, 1), counter, tally, key])]
        statements.extend(("DELETE states[?] FROM shards WHERE key = ? AND mutator = ?", [counter, key, m])
                          for m in folded)
        await self.client.execute_batch(statements, consistency=self.write_cl, timestamp_us=timestamp_us)

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None:
        await self.client.execute("UPDATE mutators SET collected_us = ? WHERE id = ?", [collected_us, mutator],
                                  consistency=self.write_cl)

    async def forget(self, mutator: uuid.UUID) -> None:
        await self.client.execute("DELETE FROM mutator_work WHERE mutator = ?", [mutator],
                                  consistency=self.write_cl)
        await self.client.execute("DELETE FROM mutators WHERE id = ?", [mutator], consistency=self.write_cl)


__all__ = ["CassandraGcStore"]
