""":class:`~gc_worker.collector.GcStore` on countersink's tables (see ``schemas.cql``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import Consistency
from gc_worker.collector import Instance, InstanceView, RegistryEntry, ShardView

_PAGE = 1000


def _uuid(value: object) -> uuid.UUID:
    return uuid.UUID(str(value))  # the driver returns uuid columns as text


class CassandraGcStore:
    """Reads instances at ``gc_read_consistency`` (ALL unless configured), everything else at the normal
    read and write levels."""

    def __init__(self, client: CassandraClient, *, instance_consistency: Consistency | None = None,
                 page_size: int = _PAGE) -> None:
        self.client = client
        settings = client.settings
        self.instance_cl = instance_consistency or settings.gc_read_consistency
        self.read_cl = settings.read_consistency
        self.write_cl = settings.write_consistency
        self.page_size = page_size

    async def _pages(self, cql_text: str, params: list[object], consistency: Consistency
                     ) -> AsyncIterator[list[dict[str, object]]]:
        page_state: bytes | None = None
        while True:
            result = await self.client.execute(cql_text, params, consistency=consistency,
                                               page_size=self.page_size, page_state=page_state)
            yield as_dicts(result)
            if not result.has_more_pages():
                return
            page_state = result.page_state()

    async def read_registry(self) -> list[RegistryEntry]:
        entries: list[RegistryEntry] = []
        async for rows in self._pages(
                "SELECT id, consumer_group, topic, partition, born_us, expires_us, retired_us, collected_us "
                "FROM mutators", [], self.read_cl):
            entries.extend(
                RegistryEntry(_uuid(r["id"]), str(r["consumer_group"] or ""), str(r["topic"] or ""),
                              int(r["partition"] if r["partition"] is not None else -1),  # type: ignore[call-overload]
                              int(r["born_us"] or 0), int(r["expires_us"] or 0),  # type: ignore[call-overload]
                              r["retired_us"], r["collected_us"])  # type: ignore[arg-type]
                for r in rows)
        return entries

    async def read_work(self, mutator: uuid.UUID) -> AsyncIterator[Sequence[Instance]]:
        async for rows in self._pages("SELECT counter, key FROM mutator_counters WHERE mutator = ?",
                                      [mutator], self.read_cl):
            yield [(str(r["counter"]), str(r["key"])) for r in rows]

    async def read_instance(self, counter: str, key: str) -> InstanceView:
        tally: bytes | None = None
        tally_write_us: int | None = None
        shards = []
        pages = 0
        ttls: list[int | None] = []
        async for rows in self._pages(
                "SELECT mutator, state, through_offset, writetime(state) AS state_us, ttl(state) AS state_ttl, "
                "tally, writetime(tally) AS tally_us, ttl(tally) AS tally_ttl "
                "FROM shards WHERE counter = ? AND key = ?",
                [counter, key], self.instance_cl):
            pages += 1
            if pages == 1 and rows:
                # Every row carries the static tally as of its own request: keep the first request's, which
                # the collector checks against a read of the tally after the last page.
                tally, tally_write_us = rows[0]["tally"], rows[0]["tally_us"]  # type: ignore[assignment]
                if tally is not None:
                    ttls.append(rows[0]["tally_ttl"])  # type: ignore[arg-type]
            for r in rows:
                if r["mutator"] is not None and r["state"] is not None:
                    shards.append(ShardView(_uuid(r["mutator"]), r["state"],  # type: ignore[arg-type]
                                            -1 if r["through_offset"] is None else int(r["through_offset"]),  # type: ignore[call-overload]
                                            int(r["state_us"])))  # type: ignore[call-overload]
                    ttls.append(r["state_ttl"])  # type: ignore[arg-type]
        # A bucket with retention: the tally lives as long as the longest-lived of its rows (they all expire
        # at the bucket's expiry plus the grace, give or take the writers' clocks).
        ttl_s = max(ttls) if ttls and None not in ttls else None  # type: ignore[type-var]
        return InstanceView(tally, tally_write_us, tuple(shards), pages, ttl_s)

    async def read_tally(self, counter: str, key: str) -> tuple[bytes | None, int | None]:
        # The static columns come with any row of the partition (or alone, if it has no shard rows).
        rows = as_dicts(await self.client.execute(
            "SELECT tally, writetime(tally) AS tally_us FROM shards WHERE counter = ? AND key = ? LIMIT 1",
            [counter, key], consistency=self.instance_cl))
        if not rows or rows[0]["tally"] is None:
            return None, None
        return rows[0]["tally"], int(rows[0]["tally_us"])

    async def fold(self, counter: str, key: str, tally: bytes, folded: Sequence[uuid.UUID], timestamp_us: int,
                   ttl_s: int | None = None) -> None:
        # One partition: Cassandra applies an unlogged batch on it atomically and in isolation. Every statement
        # takes the batch's timestamp, so repeating it changes nothing.
        statements: list[tuple[str, Sequence[object]]] = [
            ("UPDATE shards SET tally = ? WHERE counter = ? AND key = ?", [tally, counter, key]) if ttl_s is None
            else ("UPDATE shards USING TTL ? SET tally = ? WHERE counter = ? AND key = ?",
                  [max(ttl_s, 1), tally, counter, key])]
        statements.extend(("DELETE FROM shards WHERE counter = ? AND key = ? AND mutator = ?", [counter, key, m])
                          for m in folded)
        await self.client.execute_batch(statements, consistency=self.write_cl, timestamp_us=timestamp_us)

    async def mark_collected(self, mutator: uuid.UUID, collected_us: int) -> None:
        await self.client.execute("UPDATE mutators SET collected_us = ? WHERE id = ?", [collected_us, mutator],
                                  consistency=self.write_cl)

    async def forget(self, mutator: uuid.UUID) -> None:
        await self.client.execute("DELETE FROM mutator_counters WHERE mutator = ?", [mutator],
                                  consistency=self.write_cl)
        await self.client.execute("DELETE FROM mutators WHERE id = ?", [mutator], consistency=self.write_cl)


__all__ = ["CassandraGcStore"]
