"""The counter registry in Cassandra: consumers record their definitions; readers learn names and kinds.

Recording is a lightweight transaction per counter (``INSERT ... IF NOT EXISTS``), so two consumers starting
at once with different meanings under one name cannot both win: the second sees the first's record and
refuses to start. A record is never overwritten: a changed meaning is a new counter with a new name.
"""

from __future__ import annotations

import time

from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import Consistency
from schemas import registry
from schemas.definitions import CounterDefinition, CounterSet
from schemas.errors import DefinitionChangedError

# How long a reader trusts its copy before it reads the registry again to look for a name it does not know.
REFRESH_S = 5.0


class CounterRegistry:
    """``register(counters)`` at a consumer's start; ``counters()`` and ``lookup(name)`` for readers."""

    def __init__(self, client: CassandraClient, consistency: Consistency | None = None) -> None:
        self.client = client
        self.consistency = consistency or client.settings.read_consistency
        self._known: CounterSet | None = None
        self._loaded_at = float("-inf")
        self._table_exists = False

    async def register(self, counters: CounterSet, registered_by: str) -> None:
        """Record each counter not recorded yet; raise :class:`DefinitionChangedError` naming every counter
        whose recorded meaning differs (nothing is overwritten)."""
        refused: list[DefinitionChangedError] = []
        for definition in counters:
            stamp = registry.fingerprint(definition)
            result = await self.client.execute(
                "INSERT INTO counters (name, kind, fingerprint, definition, registered_us, registered_by) "
                "VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
                [definition.name, definition.kind, stamp, registry.to_record(definition), time.time_ns() // 1000,
                 registered_by],
                idempotent=False)  # a conditional write is never retried blindly by the driver
            rows = as_dicts(result)
            if not rows or rows[0].get("[applied]") or rows[0].get("fingerprint") == stamp:
                continue
            # A fingerprint recorded before the meaning covered something more (retention) differs with an
            # unchanged meaning: the meanings decide.
            reason = registry.refusal(registry.from_record(rows[0]["definition"]), definition,
                                      rows[0].get("registered_by"))
            if reason is not None:
                refused.append(DefinitionChangedError(counters.source, f"{definition.name!r}", "", reason))
        if refused:
            first, *more = refused
            raise DefinitionChangedError(first.source, first.counter, first.field, first.reason, tuple(more))

    async def counters(self) -> CounterSet | None:
        """Every recorded counter; None while no consumer has recorded any (a keyspace from before the
        registry, or one nothing has counted in yet): then names cannot be checked."""
        if not self._table_exists:
            # A keyspace made before the registry has no table until a consumer or `countersink schema` adds it.
            tables = await self.client.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = 'counters'",
                [self.client.keyspace], consistency=Consistency.ONE)
            self._table_exists = bool(as_dicts(tables))
        definitions = []
        if self._table_exists:
            result = await self.client.execute("SELECT definition FROM counters", consistency=self.consistency)
            definitions = [registry.from_record(row["definition"]) for row in as_dicts(result)]
        self._known = registry.registered_set(definitions) if definitions else None
        self._loaded_at = time.monotonic()
        return self._known

    async def lookup(self, name: str) -> tuple[bool, CounterDefinition | None]:
        """(known, definition): known is False only for a name missing from a registry that has entries. A
        name not in the copy held is looked up again once the copy is older than ``REFRESH_S``."""
        stale = time.monotonic() - self._loaded_at > REFRESH_S
        if stale and (self._known is None or name not in self._known):
            await self.counters()
        if self._known is None:
            return True, None
        definition = self._known.get(name)
        return definition is not None, definition
