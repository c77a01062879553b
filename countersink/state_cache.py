"""A bounded cache of merged instance states, keyed by what was read, so that it can never serve a stale value.

A wide instance (a shard from each of hundreds of partitions) costs a reader more to decode and merge than to
fetch: a sketch's decode takes 5 to 25 µs, the merge of 256 of them about a millisecond. Yet its value changes
at most once per flush interval, and between two flushes every read decodes the same bytes.

The cache does not decide whether a value is fresh: every read still fetches the instance's stored states
from Cassandra, and the cache only answers "these exact bytes were merged before". An entry is reused
when the bytes read equal the bytes it was made from (the tally and every shard, in the partition's order),
so a read that follows an acknowledged flush sees it exactly as an uncached read would (read-your-flush), and
no setting can make it stale. When only some shards changed (a few partitions flushed), the unchanged
shards' decoded states are reused and only the changed ones are decoded, then all are merged again.

Entries are kept least recently used first and evicted beyond ``max_bytes`` (the stored bytes an entry holds
plus what its decoded states take, as measured for each sketch kind); an instance larger than that is merged and
not kept. States handed out are shared: callers read them (``value()``, or merge them into a new state), never
change them.
Pure and single-threaded: no I/O, no clock, no locks (one event loop calls it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.kinds import State, count, merge_blobs, merge_states, quantiles, state_from_bytes, top_k
from schemas.kinds import sum as sum_kind


@dataclass(slots=True)
class _Entry:
    blobs: tuple[bytes, ...]
    states: tuple[State, ...] | None  # each blob decoded, when the kind merges from states (the sketches)
    merged: State
    size: int


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

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # reads answered by a merged state kept whole
        self.partial = 0  # reads that decoded only the shards that changed
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        """What the entries hold now, by the measure ``max_bytes`` bounds."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def merged(self, counter: str, key: str, blobs: Sequence[bytes], *, scan: bool = False) -> State | None:
        """The merge of ``blobs`` (the instance's stored states as read, tally first): ``merge_blobs(blobs)``,
        from the cache when it merged these same bytes before. ``scan``: one of many instances a range read
        meets once; kept as the least recently read, so that a long range read evicts its own buckets before
        the instances read again and again (a bucket read a second time is kept as any other)."""
        if not blobs:
            self._drop((counter, key))
            return None
        ident = (counter, key)
        entry = self._entries.get(ident)
        read = tuple(blobs)
        if entry is not None and entry.blobs == read:
            self._entries.move_to_end(ident)
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
            self._entries[ident] = _Entry(read, states, merged, size)
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


__all__ = ["StateCache"]
