"""``max``: the largest value of a numeric field; an empty max reads as ``None``, never 0."""

from __future__ import annotations

from schemas.kinds._extremum import MaxState, max_stored_bytes
from schemas.kinds.base import KindSpec

TAG = MaxState.tag
VERSIONS = frozenset({1})

__all__ = ["MaxState", "max_stored_bytes", "new", "state_from_bytes"]


def new(spec: KindSpec) -> MaxState:
    """Return an empty max in the definition's number mode."""
    return MaxState(spec.number)


def state_from_bytes(data: bytes) -> MaxState:
    """Decode bytes written by :meth:`MaxState.to_bytes`."""
    return MaxState._decode(data, TAG, VERSIONS)
