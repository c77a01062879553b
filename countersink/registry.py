"""The counter registry in Cassandra: consumers record their definitions; readers learn names and kinds.

Recording is a lightweight transaction per counter (``INSERT ... IF NOT EXISTS``), so two consumers starting
at once with different meanings under one name cannot both win: the second sees the first's record and
refuses to start. A record's meaning is never overwritten: a changed meaning is a new counter with a new name.
Its topics may change under the same meaning: those a consumer counts are added to the record (never removed),
so that a reset reaches every topic the counter is counted on.

Each record also holds the consumer group that counts it: one group per keyspace, because reads merge the
shards of every group and a second group would count the retained log again into the same values. A record
made before the group was recorded adopts the group of the first consumer that starts on it (by LWT, so two
at once cannot both adopt). ``countersink drop`` marks a record dropped: the name is then refused, to a
consumer starting with it and to one still counting it (``dropped``, at its next registry check), until the
drop is released by ``forget``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from countersink.cassandra import CassandraClient, CassandraError, as_dicts
from countersink.logs import get_logger
from countersink.settings import Consistency
from schemas import registry
from schemas.definitions import CounterDefinition, CounterSet
from schemas.errors import CounterDroppedError, DefinitionChangedError, GroupMismatchError
from schemas.formats import TopicFormat

log = get_logger(__name__)

# Compare-and-set attempts at adding a counter's topics while other consumers change its record too.
_TOPIC_ATTEMPTS = 5
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

    async def register(self, counters: CounterSet, registered_by: str, group: str | None = None,
                       backfill: Collection[str] = ()) -> dict[str, int]:
        """Record each counter not recorded yet, with ``group`` (the consumer group counting it). Raises,
        nothing being overwritten: :class:`CounterDroppedError` naming every counter dropped; else
        :class:`DefinitionChangedError` naming every counter whose recorded meaning differs; else
        :class:`GroupMismatchError` when the group recorded for any counter is not ``group``.

        ``group`` None checks no group (a tool recording definitions, not counting them). ``backfill`` names
        counters this process counts as a declared backfill, a second reader of the log that hands over to the
        recorded group at an offset: their group may differ, and is not adopted.

        Returns when each counter was recorded (epoch microseconds: now, or by whoever recorded it first)."""
        # Looked at first, recorded after: a consumer refused for one counter records none of its new ones (they
        # would stay recorded for a group that never counted them).
        await self._judge(counters, group, backfill, {d.name: await self.record(d.name) for d in counters},
                          adopt=False)
        answers: dict[str, dict[str, Any] | None] = {}
        registered: dict[str, int] = {}
        formats = {d.name: None if d.name in backfill else registry.formats_record(counters, d) for d in counters}
        for definition in counters:
            now_us = time.time_ns() // 1000
            result = await self.client.execute(
                "INSERT INTO counters (name, kind, fingerprint, definition, registered_us, registered_by, "
                "consumer_group, topic_formats) VALUES (?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
                [definition.name, definition.kind, registry.fingerprint(definition), registry.to_record(definition),
                 now_us, registered_by, None if definition.name in backfill else group, formats[definition.name]],
                idempotent=False)  # a conditional write is never retried blindly by the driver
            rows = as_dicts(result)
            answers[definition.name] = None if not rows or rows[0].get("[applied]") else rows[0]
            found = answers[definition.name]
            if found is None:
                registered[definition.name] = now_us
            elif found.get("registered_us") is not None:  # a record older than its time: left out
                registered[definition.name] = int(found["registered_us"])
        # Again with what each insert found: a consumer starting at the same moment may have recorded first.
        await self._judge(counters, group, backfill, answers, adopt=True)
        # The topics' formats as this consumer decodes them, over a record made before formats were recorded or
        # with other ones (formats may change under the same meaning), and the topics it counts each counter on.
        # A backfill records neither: it reads the topics as the live consumer does, and that one records them.
        for definition in counters:
            name, row = definition.name, answers[definition.name]
            if row is None or name in backfill:
                continue
            if row.get("topic_formats") != formats[name]:
                await self.client.execute("UPDATE counters SET topic_formats = ? WHERE name = ? IF EXISTS",
                                          [formats[name], name], idempotent=False)
            if row.get("definition") is not None:
                await self._add_topics(definition, str(row["definition"]))
        return registered

    async def _add_topics(self, definition: CounterDefinition, recorded_text: str) -> None:
        """Add to the recorded definition the topics ``definition`` counts that it lacks (``topics`` may change
        under the same meaning): a reset publishes its control records to the recorded topics, and a topic it
        missed would read nothing of the counter from the reset on. Topics are only added (a consumer of an
        older file, in a rolling deploy, may still count one removed since), by a compare-and-set on the text,
        read again when another consumer added some first."""
        for _ in range(_TOPIC_ATTEMPTS):
            recorded = registry.from_record(recorded_text)
            added = tuple(topic for topic in definition.topics if topic not in recorded.topics)
            if not added:
                return
            result = await self.client.execute(
                "UPDATE counters SET definition = ? WHERE name = ? IF definition = ?",
                [registry.to_record(recorded.model_copy(update={"topics": (*recorded.topics, *added)})),
                 definition.name, recorded_text], idempotent=False)
            rows = as_dicts(result)
            if rows and rows[0].get("[applied]"):
                log.info("counter_topics_recorded", counter=definition.name, added=list(added))
                return
            if not rows or rows[0].get("definition") is None:
                return  # the row is gone (dropped and released): nothing to add to
            recorded_text = str(rows[0]["definition"])
        raise CassandraError(f"the topics of counter {definition.name!r} could not be recorded: other consumers kept "
                             f"changing its record")

    async def check(self, counters: CounterSet) -> None:
        """Raise as :meth:`register` does for counters of ``counters`` dropped, or recorded with another meaning;
        record nothing and check no group (a reader given a definitions file of its own)."""
        if not await self._has_table():
            return
        await self._judge(counters, None, (), {d.name: await self.record(d.name) for d in counters}, adopt=False)

    async def _judge(self, counters: CounterSet, group: str | None, backfill: Collection[str],
                     rows: dict[str, dict[str, Any] | None], *, adopt: bool) -> None:
        """Raise the refusals :meth:`register` describes for the rows found under the counters' names (None: no
        row). With ``adopt``, a row with no group takes ``group``; without, it is taken as if it would."""
        refused: list[DefinitionChangedError] = []
        dropped: list[CounterDroppedError] = []
        other_groups: dict[str, list[str]] = {}
        for definition in counters:
            row = rows.get(definition.name)
            if row is None or row.get("kind") is None:
                continue
            if row.get("dropped_us") is not None:
                dropped.append(CounterDroppedError(counters.source, f"{definition.name!r}", "",
                                                   dropped_reason(self.client.keyspace, definition.name, row)))
                continue
            # A fingerprint recorded before the meaning covered something more (retention) differs with an
            # unchanged meaning: the meanings decide.
            reason = None if row.get("fingerprint") == registry.fingerprint(definition) else registry.refusal(
                registry.from_record(row["definition"]), definition, row.get("registered_by"))
            if reason is not None:
                refused.append(DefinitionChangedError(counters.source, f"{definition.name!r}", "", reason))
                continue
            if group is None or definition.name in backfill:
                continue
            recorded = row.get("consumer_group")
            if recorded is None:
                recorded = await self._adopt(definition.name, row, group) if adopt else group
            if recorded != group:
                other_groups.setdefault(recorded, []).append(definition.name)
        for errors in (dropped, refused):
            if errors:
                first, *more = errors
                raise type(first)(first.source, first.counter, first.field, first.reason, tuple(more))
        if other_groups:
            assert group is not None
            raise GroupMismatchError(counters.source, group_reason(self.client.keyspace, group, other_groups),
                                     {g: tuple(names) for g, names in other_groups.items()})

    async def _adopt(self, name: str, row: dict[str, Any], group: str) -> str:
        """Record ``group`` for a counter recorded before groups were (a keyspace from an earlier version):
        the first group that starts on it adopts it. Returns the group recorded after the attempt."""
        result = await self.client.execute(
            "UPDATE counters SET consumer_group = ? WHERE name = ? IF consumer_group = null AND kind = ?",
            [group, name, row.get("kind")], idempotent=False)
        answer = as_dicts(result)
        if answer and answer[0].get("[applied]"):
            log.info("counter_group_adopted", counter=name, group=group)
            return group
        recorded = answer[0].get("consumer_group") if answer else None
        return str(recorded) if recorded is not None else group

    async def drop(self, name: str, dropped_by: str) -> DroppedCounter | None:
        """Mark ``name`` dropped (once: a second drop keeps the first one's time). None when the registry has
        no such counter."""
        now_us = time.time_ns() // 1000
        result = await self.client.execute(
            "UPDATE counters SET dropped_us = ?, dropped_by = ? WHERE name = ? IF dropped_us = null AND kind != null",
            [now_us, dropped_by, name], idempotent=False)
        answer = as_dicts(result)
        if answer and answer[0].get("[applied]"):
            return DroppedCounter(name, now_us, dropped_by)
        found = await self.record(name)
        if found is None or found.get("kind") is None or found.get("dropped_us") is None:
            return None
        return DroppedCounter(name, int(found["dropped_us"]), str(found.get("dropped_by")))

    async def forget(self, drop: DroppedCounter) -> bool:
        """Remove a dropped counter's record, so that a new definition may take the name. False when the record
        is not that drop's any more."""
        result = await self.client.execute("DELETE FROM counters WHERE name = ? IF dropped_us = ?",
                                           [drop.name, drop.dropped_us], idempotent=False)
        answer = as_dicts(result)
        return bool(answer and answer[0].get("[applied]"))

    async def record(self, name: str) -> dict[str, Any] | None:
        """The registry row of ``name`` as stored (every column), or None."""
        rows = as_dicts(await self.client.execute("SELECT * FROM counters WHERE name = ?", [name],
                                                  consistency=str(self.client.settings.serial_consistency)))
        return rows[0] if rows else None

    async def groups(self) -> dict[str, str | None]:
        """The consumer group recorded for each counter not dropped (None: recorded before groups were)."""
        # Every column: a keyspace not yet given the group and drop columns answers without them.
        rows = as_dicts(await self.client.execute("SELECT * FROM counters", consistency=self.consistency))
        return {row["name"]: row.get("consumer_group") for row in rows if row.get("dropped_us") is None}

    async def refused(self, names: Iterable[str]) -> dict[str, str]:
        """Of ``names``, the counters a consumer must stop writing, each with why: dropped, or no longer in
        the registry at all (a drop released since). One read of the whole registry (a row per counter)."""
        dropped, _ = await self.look(names)
        return dropped

    async def look(self, names: Iterable[str], registered_us: Mapping[str, int] | None = None
                   ) -> tuple[dict[str, str], dict[str, str]]:
        """Of ``names``, the counters a consumer must stop writing, each with why, in two parts: those dropped
        (or no longer in the registry at all: a drop released since), and those recorded again since
        ``registered_us`` (when each was recorded as the consumer registered it: dropped, released and defined
        anew while it did not look, a process frozen through it all). One read of the whole registry (a row
        per counter)."""
        rows = {row["name"]: row for row in as_dicts(await self.client.execute(
            "SELECT name, kind, dropped_us, dropped_by, registered_us, registered_by FROM counters",
            consistency=self.consistency))}
        dropped: dict[str, str] = {}
        redefined: dict[str, str] = {}
        for name in names:
            row = rows.get(name)
            if row is None or row.get("kind") is None:
                dropped[name] = f"counter {name!r} is no longer in the counter registry (dropped, and released since)"
            elif row.get("dropped_us") is not None:
                dropped[name] = dropped_reason(self.client.keyspace, name, row)
            elif (registered_us is not None and name in registered_us and row.get("registered_us") is not None
                  and int(row["registered_us"]) != registered_us[name]):
                redefined[name] = redefined_reason(name, row)
        return dropped, redefined

    async def counters(self) -> CounterSet | None:
        """Every recorded counter; None while no consumer has recorded any (a keyspace from before the
        registry, or one nothing has counted in yet): then names cannot be checked."""
        definitions = []
        if await self._has_table():
            # Every column, whatever the table's age: a keyspace not yet given the drop marker has none.
            result = await self.client.execute("SELECT * FROM counters", consistency=self.consistency)
            definitions = [registry.from_record(row["definition"]) for row in as_dicts(result)
                           if row.get("definition") is not None and row.get("dropped_us") is None]
        self._known = registry.registered_set(definitions) if definitions else None
        self._loaded_at = time.monotonic()
        return self._known

    async def topic_format(self, topic: str) -> TopicFormat | str:
        """The format of ``topic`` as the consumers of its counters recorded it, or why it is not known."""
        rows = as_dicts(await self.client.execute("SELECT * FROM counters", consistency=self.consistency))
        records = [row.get("topic_formats") for row in rows if row.get("definition") is not None
                   and row.get("dropped_us") is None and topic in registry.from_record(row["definition"]).topics]
        if not records:
            return f"no counter in the counter registry reads topic {topic!r}"
        return registry.recorded_format(topic, records)

    async def _has_table(self) -> bool:
        """Whether the keyspace has the registry's table (found once, kept): a keyspace made before the registry
        has none until a consumer or `countersink schema` adds it."""
        if not self._table_exists:
            tables = await self.client.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = 'counters'",
                [self.client.keyspace], consistency=Consistency.ONE)
            self._table_exists = bool(as_dicts(tables))
        return self._table_exists

    async def lookup(self, name: str) -> tuple[bool, CounterDefinition | None]:
        """(known, definition): known is False only for a name missing from a registry that has entries. The
        copy held is read again once it is older than ``REFRESH_S``: a name recorded since becomes known, and one
        dropped since unknown, within that time."""
        if time.monotonic() - self._loaded_at > REFRESH_S:
            await self.counters()
        if self._known is None:
            return True, None
        definition = self._known.get(name)
        return definition is not None, definition


@dataclasses.dataclass(frozen=True)
class DroppedCounter:
    """A drop as the registry records it: which counter, when (epoch microseconds), by whom."""

    name: str
    dropped_us: int
    dropped_by: str


def _instant(epoch_us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_us // 1_000_000))


def dropped_reason(keyspace: str, name: str, row: dict[str, Any]) -> str:
    """Why a dropped counter is refused, and what to do."""
    return (f"counter {name!r} was dropped from keyspace {keyspace!r} at {_instant(int(row['dropped_us']))} by "
            f"{row.get('dropped_by')}: remove it from the definitions file. A new definition under this name needs "
            f"the drop released first (countersink drop {name} --yes --forget)")


def redefined_reason(name: str, row: dict[str, Any]) -> str:
    """Why a counter recorded again since a consumer registered it is refused, and what to do."""
    recorded = _instant(int(row["registered_us"]))
    return (f"counter {name!r} was dropped and defined again (recorded anew at {recorded} by "
            f"{row.get('registered_by')}) since this process started, which did not see it: restart the process "
            "with the definitions file in force")


def group_reason(keyspace: str, group: str, other_groups: dict[str, list[str]]) -> str:
    """Why a consumer of ``group`` is refused counters recorded for other groups, and what to do."""
    (recorded, names), *more = sorted(other_groups.items())
    listed = ", ".join(repr(n) for n in names)
    also = "".join(f"; {', '.join(repr(n) for n in ns)} by group {g!r}" for g, ns in more)
    return (f"consumer group {group!r} refused: keyspace {keyspace!r} counts {listed} by consumer group "
            f"{recorded!r}{also}, and a second group would count the topics' retained history again into the same "
            f"values. Start with --group {recorded} (COUNTERSINK_CONSUMER__GROUP_ID={recorded}), or count with "
            "the new group in another keyspace (COUNTERSINK_CASSANDRA__KEYSPACE)")
