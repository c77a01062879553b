"""A bounded cache of merged instance states, checked against what is stored, so that it never serves a value
an uncached read would not.

A wide instance (a shard from each of hundreds of partitions) costs a reader more to fetch, decode and merge
than a plain row: a sketch's decode takes 5 to 25 µs, the merge of 256 of them about a millisecond, and the
request alone returns every shard's bytes. Yet its value changes at most once per flush interval.

Each entry keeps, beside the merge, the partition's stamps as the same read returned them with the states
(``schemas.cql``: a cell per source, its last write timestamp, written in the same mutation as the states).
A read first reads the stamps alone (one small row); when they equal the entry's, no shard changed since the
entry's read, and the entry answers (a *hit*). Any flush acknowledged before the read stamped the partition
anew, so the read sees it exactly as an uncached read would (read-your-flush). Otherwise the read reads the
states as an uncached read does, and the entry is reused where the bytes read equal the bytes it was made
from; when only some shards changed, the unchanged shards' decoded states are reused and only the changed
ones are decoded, then all are merged again. An entry is not answered from once ``max_age_s`` old (the stamps
then read with the states again: a bound on what a lagging replica at a weak consistency could pin) nor once
the bucket it holds is past its retention (the hiding an uncached read applies).

Entries are kept least recently used first and evicted beyond ``max_bytes`` (the stored bytes an entry holds
plus what its decoded states take, as measured for each sketch kind); an instance larger than that is merged and
not kept. States handed out are shared: callers read them (``value()``, or merge them into a new state), never
change them.
Pure and single-threaded: no I/O, no locks (one event loop calls it); the caller gives the time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.kinds import State, count, merge_blobs, merge_states, quantiles, state_from_bytes, top_k
from schemas.kinds import sum as sum_kind

Stamps = dict[bytes, int]  # a partition's stamps: source -> write timestamp (compared whole, never changed)


@dataclass(slots=True)
class _Entry:
    blobs: tuple[bytes, ...]
    states: tuple[State, ...] | None  # each blob decoded, when the kind merges from states (the sketches)
    merged: State
    size: int
    stamps: Stamps | None  # read with ``blobs``; None: no stamps (nothing to check against)
    read_at: float  # monotonic seconds of the read that gave blobs and stamps
    hidden_at: float | None  # wall-clock seconds from which the instance is hidden (retention), if ever
    value: object = None  # ``merged.value()`` once a read asked for it (``computed``), answered again from here
    computed: bool = False


# Kinds that merge stored bytes in one pass (count, integer sums): decoding them is the merge, so keeping each
# shard's decoded state saves nothing.
_BATCH_TAG_BYTES = frozenset({bytes((count.TAG,)), bytes((sum_kind.TAG,))})


# What a decoded sketch takes beyond its own estimate (``size_bytes``, which the consumer's memory budget uses):
# at least ``a`` times its stored bytes plus ``b``. Measured with 100-shard entries filling 60 MiB (resident
# memory freed by clearing them, malloc trimmed): a KLL sketch of k 200 holding 2,000 values, 3.4 KiB stored,
# takes 13 KiB decoded; a frequent-items sketch of map 256, 1 KiB stored, 5 KiB. A HyperLogLog takes what it
# says.
_DECODED_SIZE = {quantiles.TAG: (4, 0), top_k.TAG: (4, 4096)}


def _decoded_bytes(state: State, blob: bytes) -> int:
    a, b = _DECODED_SIZE.get(state.tag, (0, 0))
    return max(state.size_bytes(), a * len(blob) + b)


class StateCache:
    """Merged states of recently read instances, reused only for byte-identical reads (see the module)."""

    def __init__(self, max_bytes: int, max_age_s: float = 60.0) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.checked_hits = 0  # reads answered after reading the stamps alone
        self.hits = 0  # reads answered by a merged state kept whole (the stamps or the bytes unchanged)
        self.partial = 0  # reads that decoded only the shards that changed
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        """What the entries hold now, by the measure ``max_bytes`` bounds."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def checked(self, cell: str, key: str, stamps: Stamps | None, now: float, wall: float) -> State | None:
        """The merge kept for ``cell`` (a counter's cell of the key's epoch) and ``key`` when ``stamps``, read
        just now, equal those read with its states, it is younger than ``max_age_s`` (``now``: monotonic
        seconds) and not hidden (``wall``: epoch seconds); else None: read the states."""
        entry = self._entries.get((cell, key))
        if (entry is None or not stamps or entry.stamps != stamps or now - entry.read_at >= self.max_age_s
                or (entry.hidden_at is not None and wall >= entry.hidden_at)):
            return None
        self._entries.move_to_end((cell, key))
        self.hits += 1
        self.checked_hits += 1
        return entry.merged

    def value(self, cell: str, key: str, state: State) -> object:
        """``state.value()``, computed once for the merge kept for ``cell`` and ``key`` when ``state`` is that
        merge: a hit then costs no estimate (a top-k's sorts every item the merged sketch tracks, tens of µs to
        a tenth of a millisecond at 256 shards). Values are immutable (numbers, frozen estimates), and a kept
        merge is never changed: a different merge is a new entry. Any other state is computed as given."""
        entry = self._entries.get((cell, key))
        if entry is None or entry.merged is not state:
            return state.value()
        if not entry.computed:
            entry.value, entry.computed = state.value(), True
        return entry.value

    def merged(self, cell: str, key: str, blobs: Sequence[bytes], *, scan: bool = False,
               stamps: Stamps | None = None, now: float = 0.0, hidden_at: float | None = None) -> State | None:
        """The merge of ``blobs`` (the instance's stored states as read, tally first): ``merge_blobs(blobs)``,
        from the cache when it merged these same bytes before. ``stamps``: the partition's, read with
        ``blobs`` (``now``: when, monotonic), kept for :meth:`checked`; ``hidden_at``: when the instance's
        retention hides it. ``scan``: one of many instances a range read meets once; kept as the least
        recently read, so that a long range read evicts its own buckets before the instances read again and
        again (a bucket read a second time is kept as any other)."""
        if not blobs:
            self._drop((cell, key))
            return None
        ident = (cell, key)
        entry = self._entries.get(ident)
        read = tuple(blobs)
        if entry is not None and entry.blobs == read:
            self._entries.move_to_end(ident)
            entry.stamps, entry.read_at, entry.hidden_at = stamps, now, hidden_at
            self.hits += 1
            return entry.merged
        states: tuple[State, ...] | None = None
        if read[0][:1] in _BATCH_TAG_BYTES or self.max_bytes <= 0:
            merged = merge_blobs(read)
            self.misses += 1
        else:
            known = {} if entry is None or entry.states is None else dict(zip(entry.blobs, entry.states, strict=True))
            states = tuple(known.get(blob) or state_from_bytes(blob) for blob in read)
            if known:
                self.partial += 1
            else:
                self.misses += 1
            merged = merge_states(states)
        if merged is None:  # not reached: blobs is not empty
            return None
        self._drop(ident)
        size = sum(len(blob) for blob in read) + merged.size_bytes()
        if states is not None:
            size += sum(_decoded_bytes(state, blob) for state, blob in zip(states, read, strict=True))
        if size <= self.max_bytes:
            self._entries[ident] = _Entry(read, states, merged, size, stamps, now, hidden_at)
            if scan:
                self._entries.move_to_end(ident, last=False)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
        return merged

    def _drop(self, ident: tuple[str, str]) -> None:
        entry = self._entries.pop(ident, None)
        if entry is not None:
            self._bytes -= entry.size


__all__ = ["Stamps", "StateCache"]
