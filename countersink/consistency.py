"""Whether reads that decide what gets written see every acknowledged write.

A takeover's replay reads the shards of the mutator whose flush it finishes, and the GC reads a whole
instance before it folds and deletes: if such a read can miss a write that Cassandra acknowledged, events are
lost or counted twice. A read is guaranteed to see a write when the replicas it waits for and the replicas
the write waited for must share one: read + write > replication factor (within the local data centre when
both levels are local ones).
"""

from __future__ import annotations

import ast

from countersink.settings import CassandraSettings, Consistency
from schemas.errors import CountersinkError

_LOCAL_LEVELS = {Consistency.LOCAL_ONE, Consistency.LOCAL_QUORUM, Consistency.EACH_QUORUM}


class ConsistencyError(CountersinkError):
    """Raised at start-up when a read that decides what gets written could miss an acknowledged write."""


def replication_factors(replication: dict[str, str] | str) -> dict[str, int]:
    """Replicas per data centre of a keyspace's replication map (``system_schema.keyspaces``, or the CQL
    map text of the ``replication`` setting). SimpleStrategy counts as one data centre named ``""``."""
    options = ast.literal_eval(replication) if isinstance(replication, str) else replication
    strategy = str(options.get("class", ""))
    if strategy.endswith("SimpleStrategy"):
        return {"": int(options["replication_factor"])}
    return {dc: int(factor) for dc, factor in options.items() if dc not in ("class", "replication_factor")}


def _replicas(level: Consistency, factors: dict[str, int], local: int) -> int:
    """Replicas a request at ``level`` waits for, counted across every data centre."""
    total = sum(factors.values())
    return {
        Consistency.ONE: 1, Consistency.TWO: 2, Consistency.THREE: 3, Consistency.LOCAL_ONE: 1,
        Consistency.QUORUM: total // 2 + 1, Consistency.ALL: total, Consistency.LOCAL_QUORUM: local // 2 + 1,
        Consistency.EACH_QUORUM: sum(factor // 2 + 1 for factor in factors.values()),
    }[level]


def _local_replicas(level: Consistency, local: int) -> int:
    """Replicas in the local data centre a request at a local ``level`` waits for."""
    return 1 if level is Consistency.LOCAL_ONE else local // 2 + 1


def reads_see_writes(read: Consistency, write: Consistency, factors: dict[str, int], local_dc: str | None) -> bool:
    """True when every read at ``read`` overlaps every write acknowledged at ``write``."""
    if not factors:
        return False
    # Without a named local data centre, assume the smallest: the overlap must hold wherever the client is.
    local = factors.get(local_dc or "", min(factors.values())) if len(factors) > 1 else next(iter(factors.values()))
    if read in _LOCAL_LEVELS and write in _LOCAL_LEVELS and _local_replicas(read, local) + _local_replicas(
            write, local) > local:
        return True
    return _replicas(read, factors, local) + _replicas(write, factors, local) > sum(factors.values())


# Levels that may wait for more replicas than a keyspace keeps (QUORUM, EACH_QUORUM and ALL never do).
_LEVELS_ABOVE_SOME_KEYSPACES = frozenset({Consistency.TWO, Consistency.THREE, Consistency.LOCAL_ONE,
                                          Consistency.LOCAL_QUORUM})


def may_exceed_replicas(level: Consistency) -> bool:
    """Whether a request at ``level`` can wait for more replicas than some keyspace keeps."""
    return level in _LEVELS_ABOVE_SOME_KEYSPACES


def beyond_replicas(level: Consistency, keyspace: str, factors: dict[str, int], local_dc: str | None
                    ) -> str | None:
    """How a request at ``level`` waits for more replicas than ``keyspace``, with these replication factors,
    keeps (no retry can meet it), in words; None when it does not, or when that cannot be told (no factors; a local
    level with no local data centre named)."""
    if not factors or not may_exceed_replicas(level):
        return None
    local = level in (Consistency.LOCAL_ONE, Consistency.LOCAL_QUORUM)
    if local and local_dc is None:
        return None
    kept = factors.get(local_dc or "", 0) if local else sum(factors.values())
    needed = _local_replicas(level, kept) if local else _replicas(level, factors, kept)
    if needed <= kept:
        return None
    in_dc = f" in data centre {local_dc}" if local else ""
    return (f"waits for {needed} replica{'s' if needed > 1 else ''}{in_dc}; keyspace {keyspace} keeps {kept} "
            f"({_replication_text(factors)})")


def _replication_text(factors: dict[str, int]) -> str:
    """Replication factors as a refusal names them: ``dc1=3, dc2=3``, or ``replication_factor=1``."""
    return ", ".join(f"{dc or 'replication_factor'}={n}" for dc, n in sorted(factors.items()))


def level_beyond_replicas(levels: dict[str, Consistency], keyspace: str, factors: dict[str, int],
                          local_dc: str | None) -> str | None:
    """The refusal of the first of ``levels`` (how each is set, e.g. its variable, to its level) that waits for
    more replicas than ``keyspace`` keeps, in one line; None when none does."""
    for name, level in levels.items():
        beyond = beyond_replicas(level, keyspace, factors, local_dc)
        if beyond is not None:
            return f"{name}={level} {beyond}: no request at it can succeed; lower it"
    return None


def check_deciding_reads(settings: CassandraSettings, factors: dict[str, int],
                         reads: dict[str, Consistency]) -> None:
    """Raise :class:`ConsistencyError` (one line, naming the settings) unless each of ``reads`` (setting name
    to level) overlaps ``write_consistency`` on a keyspace with these replication factors, and unless each of
    them and ``write_consistency`` waits for no more replicas than the keyspace keeps."""
    beyond = level_beyond_replicas({f"COUNTERSINK_CASSANDRA__{name.upper()}": level for name, level in {
        "write_consistency": settings.write_consistency, **reads}.items()}, settings.keyspace, factors,
        settings.local_dc)
    if beyond is not None:
        raise ConsistencyError(beyond)
    for name, level in reads.items():
        if not reads_see_writes(level, settings.write_consistency, factors, settings.local_dc):
            raise ConsistencyError(
                f"COUNTERSINK_CASSANDRA__{name.upper()}={level} with COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY="
                f"{settings.write_consistency} can miss acknowledged writes on keyspace {settings.keyspace} "
                f"({_replication_text(factors)}): read + write replicas must exceed the replication factor; raise "
                "one of them")
