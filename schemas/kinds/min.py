"""``min``: the smallest value of a numeric field; an empty min reads as ``None``, never 0."""

from __future__ import annotations

from schemas.kinds._extremum import MinState, max_stored_bytes
from schemas.kinds.base import KindSpec

TAG = MinState.tag
VERSIONS = frozenset({1})

__all__ = ["MinState", "max_stored_bytes", "new", "state_from_bytes"]


def new(spec: KindSpec) -> MinState:
    """Return an empty min in the definition's number mode."""
    return MinState(spec.number)


def state_from_bytes(data: bytes) -> MinState:
    """Decode bytes written by :meth:`MinState.to_bytes`."""
    return MinState._decode(data, TAG, VERSIONS)
