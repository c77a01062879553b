"""A bounded cache of merged instance states, checked against what is stored, so that it never serves a value
an uncached read would not.

A wide instance (a shard from each of hundreds of partitions) costs a reader more to fetch, decode and merge
than a plain row: a sketch's decode takes 5 to 25 µs, the merge of 256 of them about a millisecond, and the
request alone returns every shard's bytes. Yet its value changes at most once per flush interval.

Each entry keeps, beside the merge, the partition's stamps as the same read returned them with the states
(``schemas.cql``: a cell per source, its last write timestamp, written in the same mutation as the states).
A read of an instance the cache keeps a merge of first reads the stamps alone (one small row); when they equal
the entry's, no shard changed since the entry's read, and the entry answers (a *hit*). Any flush acknowledged
before the read stamped the partition anew, so the read sees it exactly as an uncached read would
(read-your-flush). An instance it keeps no merge of is read as an uncached read is, in one request
(:meth:`StateCache.holds`). Otherwise, when the stamps
that changed are of sources whose row the entry knows (each shard's row is kept with the write timestamp of
its newest cell, which is its source's stamp while that write is its source's last), only those rows are read
again (:meth:`StateCache.rows_to_read`, :meth:`StateCache.patched`): a tenth of a hot instance's sources
flushed since the last read costs a tenth of its rows, not all. Else the read reads the states as an uncached
read does. Either way the entry is reused where the bytes read equal the bytes it was made from; when only
some shards changed, the unchanged shards' decoded states are reused and only the changed ones are decoded,
then all are merged again. An entry is not answered from once ``max_age_s`` old (the stamps
then read with the states again: a bound on what a lagging replica at a weak consistency could pin) nor once
the bucket it holds is past its retention (the hiding an uncached read applies).

With ``max_staleness_s`` above 0 (``serve.max_staleness_s``, off by default) a merge whose stamps were read at
most that long ago answers again without any request (:meth:`recent`): the read-your-flush above is then given
up for that long, which a dashboard polling a hot instance may choose; ``get`` and ``explain`` never do.

Entries are kept least recently used first and evicted beyond ``max_bytes`` (the stored bytes an entry holds
plus what its decoded states take, as measured for each sketch kind). A range read's buckets, and an instance
too large for ``max_bytes`` whole, are kept as their merge alone (no bytes, states or rows: answered while their
stamps are unchanged, read whole once changed), so that a long roll-up of sketches fits. States handed out are
shared: callers read them (``value()``, or merge them into a new state), never change them.
Pure and single-threaded: no I/O, no locks (one event loop calls it); the caller gives the time.
"""

from __future__ import annotations

import uuid
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.kinds import State, count, merge_blobs, merge_checked, quantiles, state_to_merge, top_k
from schemas.kinds import sum as sum_kind

Stamps = dict[bytes, int]  # a partition's stamps: source -> write timestamp (compared whole, never changed)
Row = tuple[int, uuid.UUID | str]  # a shard's row in its partition: (born_us, mutator), as the driver returns it


@dataclass(frozen=True, slots=True)
class ShardRow:
    """Where a shard read was stored, and the write timestamp of its row's newest cell (any counter's): the
    timestamp of the last flush that wrote the row, which is its source's stamp while that flush is its
    source's last (a flush writes one row of a key, and its source's stamp, at one timestamp: schemas.cql)."""

    row: Row
    written_us: int | None


@dataclass(slots=True)
class _Entry:
    blobs: tuple[bytes, ...] | None  # None: the merge alone is kept (:meth:`StateCache._strip`)
    states: tuple[State, ...] | None  # each blob decoded, when the kind merges from states (the sketches)
    merged: State
    size: int
    stamps: Stamps | None  # read with ``blobs``; None: no stamps (nothing to check against)
    read_at: float  # monotonic seconds of the read that gave blobs and stamps
    checked_at: float  # monotonic seconds of the last read of the stamps that found them those of ``merged``
    hidden_at: float | None  # wall-clock seconds from which the instance is hidden (retention), if ever
    value: object = None  # ``merged.value()`` once a read asked for it (``computed``), answered again from here
    computed: bool = False
    rows: tuple[ShardRow, ...] | None = None  # the last len(rows) blobs' rows, when the read gave them
    sources: dict[bytes, int] | None = None  # source -> index in rows of the row its stamp's flush wrote


# Kinds that merge stored bytes in one pass (count, integer sums): decoding them is the merge, so keeping each
# shard's decoded state saves nothing.
_BATCH_TAG_BYTES = frozenset({bytes((count.TAG,)), bytes((sum_kind.TAG,))})


# What a decoded sketch takes beyond its own estimate (``size_bytes``, which the consumer's memory budget uses):
# at least ``a`` times its stored bytes plus ``b``. Measured with 100-shard entries filling 60 MiB (resident
# memory freed by clearing them, malloc trimmed): a KLL sketch of k 200 holding 2,000 values, 3.4 KiB stored,
# takes 13 KiB decoded; a frequent-items sketch of map 256, 1 KiB stored, 5 KiB. A HyperLogLog takes what it
# says.
_DECODED_SIZE = {quantiles.TAG: (4, 0), top_k.TAG: (4, 4096)}


# What an entry takes in Python beyond its states' bytes: the entry, its key and its place in the cache, the
# merged state's object, and per shard the bytes object, its stamp (a dict item) and its row (a ShardRow, a tuple
# and a UUID). Measured with tracemalloc over 20,000 entries of a count of 1, 3 and 20 shards (/metrics' gauge
# had counted 51 to 108 bytes an entry of what took 1,129 to 9,799): 673 bytes and 456 a shard, rounded up.
_ENTRY_OVERHEAD = 700
_SHARD_OVERHEAD = 480


def _overhead(cell: str, key: str, shards: int) -> int:
    # A str of other than ASCII takes up to 4 bytes a character.
    text = sum(len(part) if part.isascii() else 4 * len(part) for part in (cell, key))
    return _ENTRY_OVERHEAD + text + _SHARD_OVERHEAD * shards


def _decoded_bytes(state: State, blob: bytes) -> int:
    a, b = _DECODED_SIZE.get(state.tag, (0, 0))
    return max(state.size_bytes(), a * len(blob) + b)


class StateCache:
    """Merged states of recently read instances, reused only for byte-identical reads (see the module)."""

    def __init__(self, max_bytes: int, max_age_s: float = 60.0, max_staleness_s: float = 0.0) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.max_staleness_s = max_staleness_s
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.checked_hits = 0  # reads answered after reading the stamps alone
        self.hits = 0  # reads answered by a merged state kept whole (the stamps or the bytes unchanged)
        self.partial = 0  # reads that decoded only the shards that changed
        self.patched_reads = 0  # reads that read only the rows of the sources that flushed since (patched())
        self.recent_hits = 0  # reads answered without a request, the stamps read less than max_staleness_s ago
        self.misses = 0
        self.stripped = 0  # entries kept as their merge alone: a range read's buckets, instances too large whole

    @property
    def size_bytes(self) -> int:
        """What the entries hold now, by the measure ``max_bytes`` bounds."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, cell: str, key: str, now: float, wall: float) -> bool:
        """Whether a merge is kept for ``cell`` and ``key`` that may still answer (:meth:`_answerable`): without
        one, reading the stamps before the states only adds a round trip, since the read of the states returns
        them too."""
        return self._answerable(cell, key, now, wall) is not None

    def _answerable(self, cell: str, key: str, now: float, wall: float) -> _Entry | None:
        """The entry kept for ``cell`` and ``key`` if it is younger than ``max_age_s`` (``now``: monotonic
        seconds) and not hidden (``wall``: epoch seconds); else None."""
        entry = self._entries.get((cell, key))
        if (entry is None or now - entry.read_at >= self.max_age_s
                or (entry.hidden_at is not None and wall >= entry.hidden_at)):
            return None
        return entry

    def recent(self, cell: str, key: str, now: float, wall: float) -> State | None:
        """The merge kept for ``cell`` and ``key`` when its stamps were last found unchanged less than
        ``max_staleness_s`` before ``now`` (monotonic seconds; never when it is 0), it is younger than
        ``max_age_s`` and not hidden: an answer at most that stale, without a request. Else None."""
        if self.max_staleness_s <= 0:
            return None
        entry = self._answerable(cell, key, now, wall)
        if entry is None or now - entry.checked_at >= self.max_staleness_s:
            return None
        self._entries.move_to_end((cell, key))
        self.hits += 1
        self.recent_hits += 1
        return entry.merged

    def checked(self, cell: str, key: str, stamps: Stamps | None, now: float, wall: float,
                sent: float | None = None) -> State | None:
        """The merge kept for ``cell`` (a counter's cell of the key's epoch) and ``key`` when ``stamps``, read
        just now (the read sent at ``sent``, monotonic seconds: :meth:`recent` counts from then), equal those
        read with its states, it is younger than ``max_age_s`` (``now``: monotonic seconds) and not hidden
        (``wall``: epoch seconds); else None: read the states."""
        entry = self._answerable(cell, key, now, wall)
        if entry is None or not stamps or entry.stamps != stamps:
            return None
        self._entries.move_to_end((cell, key))
        entry.checked_at = max(entry.checked_at, now if sent is None else sent)
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
               stamps: Stamps | None = None, now: float = 0.0, hidden_at: float | None = None,
               rows: Sequence[ShardRow] | None = None, patching: bool = False,
               checked_at: float | None = None) -> State | None:
        """The merge of ``blobs`` (the instance's stored states as read, tally first): ``merge_blobs(blobs)``,
        from the cache when it merged these same bytes before. ``stamps``: the partition's, read with
        ``blobs`` (``now``: when, monotonic), kept for :meth:`checked`; ``hidden_at``: when the instance's
        retention hides it. ``rows``: each shard's row and the write timestamp of its cell as read (the last
        ``len(rows)`` of ``blobs``), kept for :meth:`rows_to_read`. ``scan``: one of many instances a range read
        meets once; kept as the least recently read, so that a long range read evicts its own buckets before the
        instances read again and again (a bucket read a second time is kept as any other). ``patching``: called
        by :meth:`patched`, which counts the read. ``checked_at``: when ``stamps`` were read (monotonic), if
        not with ``blobs`` at ``now``."""
        checked_at = now if checked_at is None else checked_at
        if not blobs:
            self._drop((cell, key))
            return None
        ident = (cell, key)
        entry = self._entries.get(ident)
        read = tuple(blobs)
        if entry is not None and entry.blobs == read:
            self._entries.move_to_end(ident)
            entry.stamps, entry.read_at, entry.hidden_at, entry.checked_at = stamps, now, hidden_at, checked_at
            entry.rows, entry.sources = _rows_of(rows, len(read)), _sources(stamps, rows)
            self.hits += not patching
            return entry.merged
        states: tuple[State, ...] | None = None
        if read[0][:1] in _BATCH_TAG_BYTES or self.max_bytes <= 0:
            merged = merge_blobs(read)
            self.misses += not patching
        else:
            known = ({} if entry is None or entry.states is None or entry.blobs is None
                     else dict(zip(entry.blobs, entry.states, strict=True)))
            states = tuple(known.get(blob) or state_to_merge(blob) for blob in read)
            if known:
                self.partial += not patching
            else:
                self.misses += not patching
            merged = merge_checked(states)
        if merged is None:  # not reached: blobs is not empty
            return None
        self._drop(ident)
        size = sum(len(blob) for blob in read) + merged.size_bytes() + _overhead(cell, key, len(read))
        if states is not None:
            size += sum(_decoded_bytes(state, blob) for state, blob in zip(states, read, strict=True))
        entry = _Entry(read, states, merged, size, stamps, now, checked_at, hidden_at,
                       rows=_rows_of(rows, len(read)), sources=_sources(stamps, rows))
        # A range read's bucket keeps its merge alone: a roll-up of a week of 100-shard sketches is then 168
        # merges, not 16,800 shards (which no bound held: each range read merged them all again). It answers
        # while its stamps are unchanged, as a hit needs nothing else; changed, it is read whole. So does an
        # instance too large for the bound whole.
        if scan or size > self.max_bytes:
            self._strip(entry, ident)
        if entry.size <= self.max_bytes:
            self._entries[ident] = entry
            if scan:
                self._entries.move_to_end(ident, last=False)
            self._bytes += entry.size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
        return merged

    def _strip(self, entry: _Entry, ident: tuple[str, str]) -> None:
        """Keep only ``entry``'s merge (and its stamps, times and value), sized as it is (its stamps a third of
        a shard's overhead each)."""
        if entry.blobs is not None:
            entry.size = (_decoded_bytes(entry.merged, max(entry.blobs, key=len)) + _overhead(*ident, 0)
                          + _SHARD_OVERHEAD // 3 * len(entry.stamps or ()))
            entry.blobs = entry.states = entry.rows = entry.sources = None
            self.stripped += 1

    def rows_to_read(self, cell: str, key: str, stamps: Stamps | None, now: float, wall: float) -> list[Row] | None:
        """The rows to read of the instance kept for ``cell`` and ``key`` when ``stamps``, read just now, differ
        from those read with its states only in sources whose last flush then wrote a row it holds (the row's
        newest cell carried the source's stamp): a read of those rows then shows what changed
        (:meth:`patched`). None: read the instance whole (no such merge, too old, hidden, a source it cannot
        place: new, expired, a fold's or a drop's, or more than half its rows to read)."""
        entry = self._answerable(cell, key, now, wall)
        if entry is None:
            return None
        placed = _changed_rows(entry, stamps)
        if placed is None:
            return None
        rows, changed = placed
        # Past half the rows, reading them by name costs what reading the partition does.
        return [rows[at].row for at, _ in changed] if changed and 2 * len(changed) <= len(rows) else None

    def patched(self, cell: str, key: str, tally: bytes | None, read: Mapping[Row, ShardRow],
                cells: Mapping[Row, bytes], stamps: Stamps | None, hidden_at: float | None,
                checked_at: float | None = None) -> State | None:
        """The merge of the instance kept for ``cell`` and ``key`` with the rows of :meth:`rows_to_read` read
        again (one request: ``tally``, and ``read``, each row found with this counter's cell, ``cells`` its
        state's bytes), for ``stamps``, read just before. Taken only when those stamps' changes are accounted
        for by the rows read: each changed source's row's newest cell was written at its new stamp, so that
        flush, its source's last, wrote that row (a partition's later owner is born above every earlier write,
        schemas.cql) and the row holds what it wrote, whatever replicas answered each request; and the tally is
        the one kept (a fold changes it with a stamp of its own). Then the other rows are what they were, and
        the merge is that of an uncached read at those stamps (read at ``checked_at``, monotonic, when given).
        None otherwise: read the instance whole."""
        entry = self._entries.get((cell, key))
        placed = None if entry is None else _changed_rows(entry, stamps)
        if entry is None or placed is None or entry.blobs is None:  # a stripped entry keeps no rows either
            return None
        kept_rows, changed = placed
        tallied = len(entry.blobs) - len(kept_rows)
        if tally != (entry.blobs[0] if tallied else None):
            return None
        blobs, rows = list(entry.blobs), list(kept_rows)
        for at, stamp in changed:
            row = kept_rows[at].row
            found = read.get(row)
            if found is None or found.written_us != stamp:
                return None
            blobs[tallied + at], rows[at] = cells[row], found
        self.patched_reads += 1
        hidden = [at for at in (entry.hidden_at, hidden_at) if at is not None]
        # Aged from the whole read its unchanged rows came from: max_age_s still bounds what any row answered is.
        return self.merged(cell, key, blobs, stamps=stamps, now=entry.read_at, hidden_at=min(hidden, default=None),
                           rows=rows, patching=True, checked_at=checked_at)

    def _drop(self, ident: tuple[str, str]) -> None:
        entry = self._entries.pop(ident, None)
        if entry is not None:
            self._bytes -= entry.size


def _changed_rows(entry: _Entry, stamps: Stamps | None
                  ) -> tuple[tuple[ShardRow, ...], list[tuple[int, int]]] | None:
    """The entry's rows, and for each source whose stamp in ``stamps`` differs from the entry's, the index of its
    row and its new stamp; None when the entry kept no rows or stamps, a source came or went, or a changed
    source has no row placed."""
    if entry.rows is None or entry.sources is None or not stamps or not entry.stamps \
            or stamps.keys() != entry.stamps.keys():
        return None
    changed = []
    for source, stamp in stamps.items():
        if entry.stamps[source] != stamp:
            at = entry.sources.get(source)
            if at is None:
                return None
            changed.append((at, stamp))
    return entry.rows, changed


def _rows_of(rows: Sequence[ShardRow] | None, blobs: int) -> tuple[ShardRow, ...] | None:
    return None if rows is None or len(rows) > blobs else tuple(rows)


def _sources(stamps: Stamps | None, rows: Sequence[ShardRow] | None) -> dict[bytes, int] | None:
    """Each source's row among ``rows``: the one whose newest cell was written at the source's stamp (a flush
    writes a key's row and its source's stamp at one timestamp). Timestamps are a mutator's birth plus its
    flush number, so two sources' stamps can be equal: such a timestamp places neither. A source whose stamp
    no row carries (its last flush wrote a row with none of this counter's cells) is not placed either. A live
    mutator's row carries its source's stamp, so any other row carrying the same timestamp is a retired
    mutator's; a source placed on it is harmless: the row never changes again, so :meth:`StateCache.patched`
    never finds it written at the source's next stamp (a fold's or a drop's stamp, placed so, changes rows
    without writing them, and is never found either)."""
    if not stamps or rows is None:
        return None
    at = {row.written_us: i for i, row in enumerate(rows) if row.written_us is not None}
    shared = {stamp for stamp, n in Counter(stamps.values()).items() if n > 1}
    return {source: at[stamp] for source, stamp in stamps.items() if stamp in at and stamp not in shared}


__all__ = ["Row", "ShardRow", "Stamps", "StateCache"]
