"""Resets: a counter (or some of its keys) counted again from a point in each partition's log. Pure code.

A whole-state shard is rewritten in full at every flush, so a tombstone cannot reset an instance: the next
flush of a live mutator writes its pre-reset events back, and a replay rebuilds them. A reset is therefore a
position in each partition's log:

1. ``countersink reset`` records a :class:`Reset` row first (counter, keys or all keys, a new *epoch* ``E``
   greater than every earlier one of the counter, who, when, an id), then publishes a *control record*
   (header :data:`CONTROL_HEADER`, naming the reset id) to every partition of the counter's topics.
2. A mutator applies a control record in log order, as it applies events (so a replay and a successor decide
   alike): it drops its in-memory states of the instances the reset covers and, from then on, writes them in
   the cell :func:`cell_name` ``(counter, E)`` instead of the cell of the epoch before.
3. Readers and the GC merge only the cells of an instance's current epoch (:meth:`Epochs.epoch` over every
   recorded reset): a partition whose mutators have not reached its control record yet contributes nothing
   to the new epoch until they do, and a zombie writing an older epoch's cell writes a cell nobody reads.

The position of a reset in a partition is the offset of the first control record of it there. Whoever applies
it (the mutator, a replay, the reset command from its acknowledgements) records it, before the flush that
covers it is committed: a successor starting at offset ``s`` knows every reset whose position is below ``s``
(:func:`epochs_at`). A control record naming no recorded reset of a counter on its topic is forged and
dead-lettered; a second one of a reset already applied is ignored.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence

from schemas.definitions import MAX_NAME_CHARS
from schemas.errors import InvalidEventError

CONTROL_HEADER = "countersink.control"
_MAX_EPOCH_DIGITS = 18  # the most digits a reset id's epoch may have (a bigint holds every such number)
# The longest id new_reset_id makes (the longest counter name, the longest epoch, 32 hex digits): a control header
# is read up to this many characters (a record of the topic may carry anything there).
MAX_RESET_ID_CHARS = MAX_NAME_CHARS + 1 + _MAX_EPOCH_DIGITS + 1 + 32
_EPOCH_MARK = "@"  # counter names are [a-z][a-z0-9_]*: a cell name with "@" is never a counter's own


@dataclasses.dataclass(frozen=True)
class Reset:
    """One recorded reset: the counter's instances ``keys`` (all of them when empty) count again from each
    partition's control record on, in the cells of ``epoch``."""

    reset_id: str
    counter: str
    epoch: int
    keys: frozenset[str] = frozenset()
    # How many partitions each of the counter's topics had when the reset was recorded: a partition added
    # since got no control record, and everything in it comes after the reset.
    partitions: tuple[tuple[str, int], ...] = ()

    def covers(self, key: str) -> bool:
        return not self.keys or key in self.keys

    def covered_by(self, later: Reset) -> bool:
        """Whether ``later`` resets every instance this reset does: then no instance ever reads this epoch's
        cells again, and its control records change nothing."""
        return not later.keys or (bool(self.keys) and self.keys <= later.keys)

    def born_after(self, topic: str, partition: int) -> bool:
        """Whether (``topic``, ``partition``) was no partition of the counter's topics when the reset was recorded:
        a partition added to one of them since, or any of a topic the counter was given since (a topic the
        reset does not name: it got no control record, and the live consumers count the counter in it from its
        hand-over, later). A reset recorded before partitions were (none named) takes every partition to have
        been one."""
        if not self.partitions:
            return False
        count = dict(self.partitions).get(topic)
        return count is None or partition >= count


def cell_name(counter: str, epoch: int) -> str:
    """The name of an instance's cell (in ``shards.states`` and ``shards.tallies``) in ``epoch``: the counter's
    own name before any reset, so that data written before resets existed is epoch 0."""
    return counter if epoch == 0 else f"{counter}{_EPOCH_MARK}{epoch:d}"


def later_cells(counter: str) -> tuple[str, str]:
    """Bounds of a map slice holding every :func:`cell_name` of ``counter`` after epoch 0 and no other name: the
    epoch mark is no character of a counter's name, so only this counter's cells start with it after the name."""
    return f"{counter}{_EPOCH_MARK}", f"{counter}{_EPOCH_MARK}\U0010ffff"


def split_cell(cell: str) -> tuple[str, int]:
    """The counter and epoch of a :func:`cell_name`."""
    counter, mark, epoch = cell.partition(_EPOCH_MARK)
    return (counter, int(epoch)) if mark else (counter, 0)


def control_reset_id(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The reset id a control record names, ``""`` for a control record that names none (forged), None for a
    record that is not a control record."""
    for name, value in headers:
        if name == CONTROL_HEADER:
            try:
                return (value or b"").decode()[:MAX_RESET_ID_CHARS]
            except UnicodeDecodeError:
                return ""
    return None


# The most a control record's value holds: a reset's keys are listed in it while they fit, else counted. A reset
# may name a thousand keys of a kilobyte each (three megabytes as escaped JSON): past what a producer sends by
# default (1 MiB), such a record could never be published, and the reset, recorded first, never completed.
MAX_CONTROL_VALUE_BYTES = 64 * 1024


def control_record(reset: Reset) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The value and headers of the control record of ``reset``: the header names it, the value says what it
    does for a reader of the topic (the value is informative; the recorded row decides): its keys, or their
    number (``key_count``) when listing them would pass :data:`MAX_CONTROL_VALUE_BYTES`."""
    about: dict[str, object] = {"countersink": "reset", "id": reset.reset_id, "counter": reset.counter,
                                "epoch": reset.epoch}
    value = json.dumps({**about, "keys": sorted(reset.keys)}, separators=(",", ":")).encode()
    if len(value) > MAX_CONTROL_VALUE_BYTES:
        value = json.dumps({**about, "key_count": len(reset.keys)}, separators=(",", ":")).encode()
    return value, [(CONTROL_HEADER, reset.reset_id.encode())]


def new_reset_id(counter: str, epoch: int) -> str:
    """A reset's id: its counter and epoch (where its row is) and a random part (which row it must be)."""
    return f"{counter}.{epoch:d}.{uuid.uuid4().hex}"


def row_of_reset_id(reset_id: str) -> tuple[str, int] | None:
    """The (counter, epoch) a :func:`new_reset_id` names, None for a string that is not one."""
    parts = reset_id.split(".")
    # ASCII digits: isdigit() also takes "²", which int() refuses (a ValueError that stopped the partition).
    if (len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) > _MAX_EPOCH_DIGITS
            or not parts[0]):
        return None
    return parts[0], int(parts[1])


class ForgedControlError(InvalidEventError):
    """Raised for a control record that names no recorded reset of a counter on its topic: dead-lettered."""


@dataclasses.dataclass
class Epochs:
    """The epoch of each instance of some counters at one point of a partition's log (or, for a reader, the
    current epochs, over every recorded reset): per counter, the epoch of all its keys and that of keys reset
    one by one; an instance's epoch is the greater. Also the resets already applied (their control records
    met), so that a second control record of one of them is ignored."""

    all_keys: dict[str, int] = dataclasses.field(default_factory=dict)
    by_key: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    applied: set[tuple[str, int]] = dataclasses.field(default_factory=set)

    def epoch(self, counter: str, key: str) -> int:
        keyed = self.by_key.get(counter)
        base = self.all_keys.get(counter, 0)
        if keyed is None:
            return base
        return max(base, keyed.get(key, 0))

    def cell(self, counter: str, key: str) -> str:
        return cell_name(counter, self.epoch(counter, key))

    def apply(self, reset: Reset) -> bool:
        """Take ``reset`` into account; False when it was applied already (a second control record)."""
        if (reset.counter, reset.epoch) in self.applied:
            return False
        self.applied.add((reset.counter, reset.epoch))
        if reset.keys:
            keyed = self.by_key.setdefault(reset.counter, {})
            for key in reset.keys:
                keyed[key] = max(keyed.get(key, 0), reset.epoch)
        else:
            self.all_keys[reset.counter] = max(self.all_keys.get(reset.counter, 0), reset.epoch)
        return True

    def clears(self, reset: Reset, counter: str, key: str) -> bool:
        """Whether applying ``reset`` (not yet applied) drops the state of instance (``counter``, ``key``):
        it covers it with an epoch above the instance's. A reset whose epoch is below the instance's (two
        resets run at once, met in the other order) changes nothing there: readers use the greater epoch."""
        return counter == reset.counter and reset.covers(key) and reset.epoch > self.epoch(counter, key)

    def copy(self) -> Epochs:
        return Epochs(dict(self.all_keys), {c: dict(k) for c, k in self.by_key.items()}, set(self.applied))


def current_epochs(resets: Iterable[Reset]) -> Epochs:
    """The epochs readers use: every recorded reset applied."""
    epochs = Epochs()
    for reset in sorted(resets, key=lambda r: r.epoch):
        epochs.apply(reset)
    return epochs


def superseding(reset: Reset, resets: Iterable[Reset]) -> Reset | None:
    """The latest reset of ``reset``'s counter after it that resets every instance it does (:meth:`Reset.covered_by`),
    or None: completing ``reset`` (publishing its control records) would then change no value."""
    later = [r for r in resets if r.counter == reset.counter and r.epoch > reset.epoch and reset.covered_by(r)]
    return max(later, key=lambda r: r.epoch, default=None)


def epochs_at(resets: Iterable[Reset], positions: Mapping[str, int], start: int, topic: str = "",
              partition: int = -1) -> Epochs:
    """The epochs of a mutator that starts at offset ``start`` of (``topic``, ``partition``): every reset whose
    position in that partition (``positions``: reset id -> offset of its first control record there) is below
    ``start``, and every reset recorded before the partition existed (it holds nothing from before them)."""
    epochs = Epochs()
    for reset in sorted(resets, key=lambda r: r.epoch):
        at = positions.get(reset.reset_id)
        if (at is not None and at < start) or (at is None and reset.born_after(topic, partition)):
            epochs.apply(reset)
    return epochs


def counts_after_resets(resets: Iterable[Reset], points: Mapping[tuple[str, str, int], int], counter: str,
                        key: str, topic: str, partition: int, offset: int) -> bool:
    """The truth rule of resets, for a checker that computes values from the log alone (``make chaos``):
    whether the record at ``offset`` of (``topic``, ``partition``) counts toward instance (``counter``,
    ``key``). It does when it lies after the control record, in that partition, of the reset that sets the
    instance's current epoch (the greatest epoch among the recorded resets covering it); always, before any
    reset. ``points`` maps (reset id, topic, partition) to the offset of the reset's control record there, as
    ``countersink reset --json`` prints it. A partition without a point for that reset counts nothing of the
    instance (its control record was never published: run the reset again), unless the partition was added
    after the reset was recorded: then all of it counts."""
    resets = [r for r in resets if r.counter == counter]
    epoch = current_epochs(resets).epoch(counter, key)
    if epoch == 0:
        return True
    reset = next(r for r in resets if (r.counter, r.epoch) == (counter, epoch))
    point = points.get((reset.reset_id, topic, partition))
    if point is None:
        return reset.born_after(topic, partition)
    return offset > point


@dataclasses.dataclass(frozen=True)
class ResetPosition:
    """Where a reset sits in one partition: the offset of its first control record there."""

    reset_id: str
    counter: str
    epoch: int
    topic: str
    partition: int
    offset: int


__all__ = [
    "CONTROL_HEADER",
    "Epochs",
    "ForgedControlError",
    "Reset",
    "ResetPosition",
    "cell_name",
    "control_record",
    "control_reset_id",
    "counts_after_resets",
    "current_epochs",
    "epochs_at",
    "new_reset_id",
    "row_of_reset_id",
    "split_cell",
]
