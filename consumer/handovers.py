"""Hand-over offsets: the :class:`HandoverBook` interface, how a live mutator learns them
(:func:`learn_handovers`) and how a consumer without a counter refuses a partition where other definitions count
it (:class:`HandoverRefusedError`).

Every counter has one in each partition its live mutators count, its *hand-over offset* H there, recorded by the
first of them: the live mutators count the counter from H on. A consumer whose definitions lack the counter
refuses the partition (below) instead of counting on without it: a counter added without ``since`` during a
rolling restart lost, for itself, what consumers still running the old definitions counted in the partitions
they took back, silently.

For a counter without ``since``, H is where the first mutator with it counted from: the window it replayed, or
its start offset (a counter counted before hand-overs were recorded for it had all that came before counted
already). A counter whose definition says where it starts (``since``) is counted by two readers of each
partition: the live mutators from H on, and a backfill (``countersink backfill``) below it. Its H is the start
offset of the first live mutator that counted it in the partition, and the backfill stops there.

Every later mutator, takeover and replay finds the same H and counts the counter only at offsets >= H
(``consumer.applying.Applier.starts``). Start offsets of a partition only move forward, so every mutator that
counts the counter starts at or after H, and every window replayed after H was recorded starts at or after it.

A mutator running *older* definitions (a rolling deploy: some processes still without the counter) must never
count a partition past H: what it flushes there would hold no update of the counter, and nothing would count
those records for it. So every claim reads the partition's hand-overs (:meth:`HandoverBook.foreign`) before
its mutator applies anything, and a hand-over of a counter the process does not define (and the registry does
not show dropped) makes it refuse. For that read to be decisive, H is recorded in two steps, as a handshake with
the claims: a mutator *proposes* its start (INSERT ... IF NOT EXISTS), then reads the ownership row, and
*confirms* the proposal only if it still owns the partition. Whoever claimed between its claim and that read
may have looked before the proposal landed; the mutator is then fenced (it writes nothing) and its proposal
stays unconfirmed, to be superseded by the next mutator with the counter, which counts it from past everything
the claimant in between flushed (a counter without ``since`` from the start of the window that claimant left
open, when that claimant counted it, replayed with the counter; else from where the next mutator starts). A
claim after the confirming read looks after the proposal, and sees it. Only a confirmed H is counted from, by
the live mutators and by the backfill.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

from consumer.protocol import FencedError
from consumer.storage import PartitionId, Store
from schemas.errors import CountersinkError


class HandoverRefusedError(CountersinkError):
    """Raised when a claimed partition holds a hand-over of a counter this process does not define and the
    registry does not show dropped: other definitions count it there, and this process would lose its events."""

    def __init__(self, topic: str, partition: int, counters: Sequence[str]) -> None:
        self.topic, self.partition, self.counters = topic, partition, tuple(counters)
        names = ", ".join(self.counters)
        drops = " and ".join(f"countersink drop {name}" for name in self.counters)
        self.line = (f"{topic}/{partition} is counted for {names} (a hand-over is recorded), which this process "
                     f"does not count (its definitions lack it, or it was dropped since the process started): its "
                     f"records there would be lost for {names}. Run it with the definitions that have {names} (a "
                     f"rolling restart not done yet), or, to stop counting it, drop it first ({drops}: its values "
                     "are deleted)")
        super().__init__(self.line)


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A partition's hand-over of one counter as the book holds it."""

    offset: int
    mutator: uuid.UUID | None  # who proposed it; None: recorded by a command (a reprocess), confirmed as written
    confirmed: bool


class HandoverBook(Protocol):
    """Hand-over offsets as recorded in storage, each write an LWT."""

    async def propose(self, group: str, topic: str, partition: int, counter: str, offset: int,
                      mutator: uuid.UUID) -> Recorded:
        """Propose ``offset`` as the counter's hand-over unless one is recorded; return what is recorded."""
        ...

    async def supersede(self, group: str, topic: str, partition: int, counter: str, offset: int,
                        mutator: uuid.UUID, proposed_by: uuid.UUID) -> Recorded:
        """Replace the unconfirmed proposal of ``proposed_by`` with ``offset``; return what is recorded."""
        ...

    async def confirm(self, group: str, topic: str, partition: int, counter: str, mutator: uuid.UUID) -> Recorded:
        """Confirm ``mutator``'s proposal if it is still the one recorded; return what is recorded."""
        ...

    async def confirmed(self, group: str, topic: str, partition: int, counters: Collection[str]) -> dict[str, int]:
        """Of ``counters``, those whose hand-over in the partition is confirmed, with its offset: one read, which
        may miss one confirmed a moment ago (a proposal then finds it)."""
        ...

    async def foreign(self, group: str, topic: str, partition: int, known: Collection[str]) -> list[str]:
        """The counters not in ``known`` with a hand-over (confirmed or not) in the partition that the registry
        does not show dropped: one read of the partition's hand-overs."""
        ...


async def learn_handovers(book: HandoverBook, store: Store, pid: PartitionId, counters: Sequence[str],
                          proposals: Callable[[Sequence[str]], Awaitable[Mapping[str, int]]],
                          mutator: uuid.UUID) -> dict[str, int]:
    """The confirmed hand-over of each of ``counters`` in ``pid``'s partition, proposing an offset there where
    none is confirmed (module docstring): where the claiming ``mutator`` counts it from, as ``proposals`` gives
    it for the counters without one (asked only then: it may read). Raises :class:`FencedError` when ``mutator``
    lost the partition before its proposal was confirmed. Safe to retry after any error."""
    where = (pid.consumer_group, pid.topic, pid.partition)
    # Confirmed hand-overs never change: the common case (every counter recorded long ago) is this one read.
    found = await book.confirmed(*where, list(counters))
    missing = [counter for counter in counters if counter not in found]
    offsets = await proposals(missing) if missing else {}
    for counter in missing:
        start = offsets[counter]
        recorded = await book.propose(*where, counter, start, mutator)
        while not recorded.confirmed:
            if recorded.mutator != mutator:
                # An unconfirmed proposal of another mutator: it lost the partition before confirming it (or is
                # about to, as this one claimed after it). Ours replaces it, then is confirmed as below.
                assert recorded.mutator is not None
                recorded = await book.supersede(*where, counter, start, mutator, recorded.mutator)
                continue
            row = await store.read_partition(pid)
            if row is None or row.owner != mutator:
                raise FencedError(f"mutator {mutator} lost {pid} before confirming the hand-over of {counter}")
            recorded = await book.confirm(*where, counter, mutator)
        found[counter] = recorded.offset
    return found


class NoHandovers:
    """The book of a store that records no hand-over: every counter is counted from where a mutator starts."""

    async def propose(self, group: str, topic: str, partition: int, counter: str, offset: int,
                      mutator: uuid.UUID) -> Recorded:
        return Recorded(offset, mutator, confirmed=True)

    async def supersede(self, group: str, topic: str, partition: int, counter: str, offset: int,
                        mutator: uuid.UUID, proposed_by: uuid.UUID) -> Recorded:
        return Recorded(offset, mutator, confirmed=True)

    async def confirm(self, group: str, topic: str, partition: int, counter: str, mutator: uuid.UUID) -> Recorded:
        raise AssertionError("nothing is ever proposed unconfirmed here")

    async def confirmed(self, group: str, topic: str, partition: int, counters: Collection[str]) -> dict[str, int]:
        return {}

    async def foreign(self, group: str, topic: str, partition: int, known: Collection[str]) -> list[str]:
        return []


NO_HANDOVERS = NoHandovers()

__all__ = ["NO_HANDOVERS", "HandoverBook", "HandoverRefusedError", "NoHandovers", "Recorded", "learn_handovers"]
