"""What a mutator needs to know of resets (``schemas.resets``), from storage: the :class:`ResetBook`.

The hot path never waits: before a batch holding control records is applied, the consumer asks the book for
the resets they name (:meth:`ResetBook.look_up`), and :class:`~consumer.applying.Applier` decides from what it
learned. A reset row is recorded before its control records are published, so a look-up made after a control
record was read finds it, whoever makes it and whenever: the decision is the log's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from schemas.resets import Epochs, Reset, ResetPosition


class ResetBook(Protocol):
    """Reset rows and their positions in partitions, as recorded in storage."""

    async def look_up(self, reset_ids: Sequence[str]) -> Mapping[str, Reset | None]:
        """The recorded reset of each id (None: no reset has that id)."""
        ...

    async def epochs_at(self, topic: str, partition: int, counters: Sequence[str], start: int) -> Epochs:
        """The epochs of ``counters``' instances for a mutator starting at offset ``start`` of the partition:
        every reset whose recorded position there is below ``start`` applied (``schemas.resets.epochs_at``)."""
        ...

    async def record_positions(self, positions: Sequence[ResetPosition]) -> None:
        """Record where resets sit in a partition (idempotent: the position is the first control record's
        offset, the same whoever records it)."""
        ...


class NoResets:
    """The book of a deployment that never resets: no reset is recorded (every control record is forged)."""

    async def look_up(self, reset_ids: Sequence[str]) -> Mapping[str, Reset | None]:
        return dict.fromkeys(reset_ids)

    async def epochs_at(self, topic: str, partition: int, counters: Sequence[str], start: int) -> Epochs:
        return Epochs()

    async def record_positions(self, positions: Sequence[ResetPosition]) -> None:
        return None


NO_RESETS = NoResets()

__all__ = ["NO_RESETS", "NoResets", "ResetBook"]
