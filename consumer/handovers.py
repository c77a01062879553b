"""Hand-over offsets of counters with ``since`` (a backfill): the :class:`HandoverBook` interface.

A counter whose definition says where it starts (``since``) is counted by two readers of each partition: the
live mutators from its *hand-over offset* H on, and a backfill (``countersink backfill``) below it. H is the
start offset of the first live mutator that counted the counter in the partition, recorded once by
``INSERT ... IF NOT EXISTS``: every later mutator, takeover and replay finds the same H and counts the counter
only at offsets >= H (``consumer.applying.Applier.starts``), and the backfill stops at H. Start offsets of a
partition only move forward, so every mutator that counts the counter starts at or after H.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class HandoverBook(Protocol):
    """Hand-over offsets as recorded in storage."""

    async def hand_over(self, group: str, topic: str, partition: int, counters: Sequence[str],
                        offset: int) -> Mapping[str, int]:
        """Record ``offset`` as the hand-over of each of ``counters`` in the partition that has none yet, and
        return the hand-over recorded for each (whoever recorded it first)."""
        ...


class NoHandovers:
    """The book of a store that records no hand-over: every counter is counted from where a mutator starts."""

    async def hand_over(self, group: str, topic: str, partition: int, counters: Sequence[str],
                        offset: int) -> Mapping[str, int]:
        return {}


NO_HANDOVERS = NoHandovers()

__all__ = ["NO_HANDOVERS", "HandoverBook", "NoHandovers"]
