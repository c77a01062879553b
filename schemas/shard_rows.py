"""The largest shard row a flush can write, and the check that refuses definitions whose rows could not be.

A mutator writes one ``shards`` row per key per flush (``schemas.cql``), with a cell for every counter of its
topic that counted that key. Counters of one topic whose instance keys have the same number of parts can
produce the same key (``symbol = "IBM"`` and ``user = "IBM"``; a keyless counter's ``""`` is also a one-part
key's ``""``), so they can meet in one row. Cassandra refuses a mutation larger than its
``max_mutation_size`` (half of ``commitlog_segment_size``: 16 MiB by default) outright, and a retry cannot
get past that: the flush would fail again after every restart. So a definitions file is refused when it is
loaded if the states of counters that can share a row could together outgrow ``max_row_bytes``.

Each kind's ``max_stored_bytes`` bounds its state from its definition alone (the sketch sizes, the number
mode, the longest top-k item the router accepts); ``tests/unit/test_state_bounds.py`` fills states to those
bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.definitions import CounterDefinition, CounterSet
from schemas.errors import RowTooLargeError
from schemas.events import DEFAULT_MAX_KEY_BYTES
from schemas.kinds import KINDS
from schemas.kinds.base import MAX_STATE_BYTES

# Half of Cassandra's default max_mutation_size (16 MiB), which also caps a request's size by default
# (native_transport_max_message_size): room for every estimate below to be off.
DEFAULT_MAX_ROW_BYTES = 8 * 1024 * 1024
# What a row adds to its cells: the partition key (an instance key, at most 1 KiB), the mutator id, the
# mutation's and the request's headers.
ROW_OVERHEAD_BYTES = 2048
# What a cell adds to its name and value: flags, timestamp, TTL and lengths. The value is the shard's
# offset (8 bytes) and the state.
CELL_OVERHEAD_BYTES = 64
_OFFSET_BYTES = 8


def state_bound(definition: CounterDefinition) -> int:
    """The most bytes a state of ``definition`` can take once stored."""
    return KINDS[definition.kind].max_stored_bytes(definition.spec, DEFAULT_MAX_KEY_BYTES)


def cell_bound(definition: CounterDefinition) -> int:
    """The most bytes ``definition``'s cell adds to a shard row."""
    return CELL_OVERHEAD_BYTES + len(definition.name) + _OFFSET_BYTES + state_bound(definition)


def key_parts(definition: CounterDefinition) -> int:
    """How many parts the definition's instance keys have; 0 and 1 count alike (both can be ``""``)."""
    return max(1, len(definition.key) + (1 if definition.bucket is not None else 0))


@dataclass(frozen=True)
class RowGroup:
    """Counters of one topic whose keys can be equal, so that one flush can write all their cells in one row."""

    topic: str
    parts: int
    counters: tuple[CounterDefinition, ...]

    @property
    def bound(self) -> int:
        """The most bytes one row of this group can take."""
        return ROW_OVERHEAD_BYTES + sum(cell_bound(c) for c in self.counters)


def row_groups(counters: CounterSet) -> list[RowGroup]:
    """Every group of counters that can share a row, by topic, then by the number of key parts."""
    groups = []
    for topic in counters.topics:
        by_parts: dict[int, list[CounterDefinition]] = {}
        for definition in counters.for_topic(topic):
            by_parts.setdefault(key_parts(definition), []).append(definition)
        groups += [RowGroup(topic, parts, tuple(members)) for parts, members in sorted(by_parts.items())]
    return groups


def _mib(n: int) -> str:
    return f"{n / 1048576:.2f} MiB"


def check_rows(counters: CounterSet, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> None:
    """Raise :class:`RowTooLargeError` naming every counter whose state alone could outgrow what a state may
    be, and every group of counters whose shared row could outgrow ``max_row_bytes``."""
    problems = [RowTooLargeError(
        counters.source, f"{c.name!r}", "",
        f"its {c.kind} state can reach {state_bound(c)} bytes ({_mib(state_bound(c))}), more than a stored "
        f"state may be ({_mib(MAX_STATE_BYTES)}): choose a smaller max_map_size, lg_k or k",
        counters=(c.name,), bound=state_bound(c))
        for c in counters if state_bound(c) > MAX_STATE_BYTES]
    too_large = {name for problem in problems for name in problem.counters}
    for group in row_groups(counters):
        names = [c.name for c in group.counters]
        if group.bound <= max_row_bytes or set(names) <= too_large:
            continue
        sizes = ", ".join(f"{c.name} {_mib(cell_bound(c))}" for c in group.counters)
        together = (f"with {', '.join(repr(n) for n in names[1:])}, sharing rows of topic {group.topic!r} (keys "
                    f"of {group.parts} part{'s' if group.parts > 1 else ''})" if len(names) > 1
                    else f"on topic {group.topic!r}")
        problems.append(RowTooLargeError(
            counters.source, repr(names[0]), "",
            f"{together}: one flush can write a row of up to {group.bound} bytes ({sizes}), more than "
            f"max_row_bytes, {max_row_bytes} bytes (COUNTERSINK_CASSANDRA__MAX_ROW_BYTES); Cassandra refuses a "
            "mutation over its max_mutation_size for good. Choose a smaller max_map_size, lg_k or k, or fewer "
            "such counters on one topic (docs/counters.md, Row size)",
            counters=tuple(names), bound=group.bound))
    if problems:
        first, *more = problems
        raise RowTooLargeError(first.source, first.counter, first.field, first.reason, tuple(more),
                               counters=first.counters, bound=first.bound)
