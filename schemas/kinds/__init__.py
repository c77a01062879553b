"""The CRDT kinds: one module per kind, all with one small interface (see :mod:`schemas.kinds.base`).

Each kind module has ``new(spec) -> State`` and ``state_from_bytes(data) -> State``; every state has
``apply``, ``merge``, ``copy``, ``value``, ``to_bytes`` and ``size_bytes``. :data:`KINDS` maps a kind name
to its module; :func:`new_state` and :func:`state_from_bytes` dispatch through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from schemas.errors import CorruptStateError, CountersinkError, IncompatibleStateError, UnknownStateTagError
from schemas.kinds import count, distinct, max, mean, min, quantiles, sum, top_k, variance
from schemas.kinds.base import KindSpec, NumberMode, State

if TYPE_CHECKING:
    from schemas.definitions import CounterDefinition

__all__ = [
    "KINDS",
    "KindModule",
    "KindSpec",
    "NumberMode",
    "State",
    "kind_of_bytes",
    "merge_blobs",
    "merge_checked",
    "merge_states",
    "merge_stored",
    "new_state",
    "state_from_bytes",
    "state_to_merge",
]


class KindModule(Protocol):
    """What every kind module provides."""

    TAG: int
    VERSIONS: frozenset[int]

    def new(self, spec: KindSpec) -> State: ...

    def state_from_bytes(self, data: bytes) -> State: ...

    def max_stored_bytes(self, spec: KindSpec, max_item_bytes: int) -> int: ...


_MODULES: tuple[ModuleType, ...] = (count, sum, min, max, mean, variance, distinct, quantiles, top_k)

KINDS: dict[str, KindModule] = {m.__name__.rsplit(".", 1)[1]: m for m in _MODULES}
_BY_TAG: dict[int, KindModule] = {m.TAG: m for m in KINDS.values()}
# Each kind's decoding for a merge (state_to_merge): its own when it has one, else its decoding.
_TO_MERGE: dict[int, Callable[[bytes], State]] = {
    m.TAG: getattr(m, "state_to_merge", m.state_from_bytes) for m in KINDS.values()
}


def new_state(definition: CounterDefinition | KindSpec) -> State:
    """Return an empty state for a counter definition (or a bare :class:`KindSpec`)."""
    spec = definition if isinstance(definition, KindSpec) else definition.spec
    return KINDS[spec.kind].new(spec)


def kind_of_bytes(data: bytes) -> str:
    """Return the kind name stored bytes claim to be, from the tag byte alone."""
    if len(data) < 2:
        raise CorruptStateError(f"state of {len(data)} bytes has no header")
    module = _BY_TAG.get(data[0])
    if module is None:
        raise UnknownStateTagError(f"state tag {data[0]} belongs to no known kind")
    return next(name for name, m in KINDS.items() if m is module)


def _module_of(data: bytes) -> KindModule:
    if len(data) < 2:
        raise CorruptStateError(f"state of {len(data)} bytes has no header")
    module = _BY_TAG.get(data[0])
    if module is None:
        raise UnknownStateTagError(f"state tag {data[0]} belongs to no known kind")
    return module


def state_from_bytes(data: bytes) -> State:
    """Decode stored bytes of any kind and any supported version."""
    return _module_of(data).state_from_bytes(data)


def state_to_merge(data: bytes) -> State:
    """Decode stored bytes to merge them with others (:func:`merge_checked`): :func:`state_from_bytes` less the
    checks a kind makes of every item a sketch holds (:meth:`State.check`: each quantiles sketch's sorted view,
    each top-k item's text), which the merge gets once. A read of 256 shards then checks one sketch, not 256.
    Never for a state applied to or written back whole (a takeover's replay decodes with every check)."""
    return _TO_MERGE[_module_of(data).TAG](data)


def merge_checked(states: Sequence[State]) -> State | None:
    """:func:`merge_states` of states decoded by :func:`state_to_merge`, the merge checked
    (:meth:`State.check`): :class:`CorruptStateError` when a sketch does not merge or an item kept does not
    list, as their decoding would have said. None when there are none."""
    try:
        merged = merge_states(states)
        if merged is not None:
            merged.check()
        return merged
    except (CountersinkError, MemoryError):
        raise
    except Exception as exc:  # the C++ libraries raise several types; all mean a bad body
        raise CorruptStateError(f"stored states do not merge: {exc}") from exc


def merge_stored(blobs: Iterable[bytes | None]) -> State | None:
    """Merge stored states (``None`` entries skipped) into one; None when there are none. States of different
    kinds never merge: :class:`IncompatibleStateError`. Each state is decoded with every check: the GC writes
    this merge back as a tally and deletes the shards, so a damaged shard stops it, even one whose damage the
    merge would leave out (a top-k item it purges), which :func:`merge_blobs` may let through."""
    return merge_checked([state_from_bytes(blob) for blob in blobs if blob is not None])


def merge_blobs(blobs: Sequence[bytes]) -> State | None:
    """:func:`merge_stored` of stored states (none ``None``) for a read, as a batch: a kind that can merge stored
    bytes in one pass without a state per blob (``merged_from_bytes``: count, integer sums) does; the others
    decode each blob for the merge (:func:`state_to_merge`) and merge them all at once (:meth:`State.merged`:
    one sketch union for distinct), the merge checked once (:func:`merge_checked`). Same value as
    :func:`merge_stored`, which stays the reference; the same errors, but for damage the merge leaves out."""
    if not blobs:
        return None
    first = blobs[0]
    module = _BY_TAG.get(first[0]) if first else None
    batch = getattr(module, "merged_from_bytes", None)
    if batch is not None and all(blob[:1] == first[:1] for blob in blobs):
        merged: State | None = batch(blobs)
        if merged is not None:
            return merged
    return merge_checked([state_to_merge(blob) for blob in blobs])


def merge_states(states: Sequence[State]) -> State | None:
    """Merge states of one kind into one (the only one as it is, else a new state); None when there are
    none. States of different kinds never merge: :class:`IncompatibleStateError`."""
    if not states:
        return None
    for state in states[1:]:
        if type(state) is not type(states[0]):
            raise IncompatibleStateError(f"cannot merge {type(state).__name__} into {type(states[0]).__name__}")
    return states[0] if len(states) == 1 else type(states[0]).merged(states)
