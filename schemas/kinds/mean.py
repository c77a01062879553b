"""``mean``: the arithmetic mean of a numeric field, merged exactly (see :mod:`schemas.kinds._moments`).

The value is a ``float`` (the exact mean rounded once), or ``None`` before any event. Number mode default:
``float`` (integers are accepted in float mode and held exactly).
"""

from __future__ import annotations

from schemas.kinds._moments import MeanState, max_power_sums_bytes
from schemas.kinds.base import KindSpec

TAG = MeanState.tag
VERSIONS = frozenset({1})

__all__ = ["MeanState", "max_stored_bytes", "new", "state_from_bytes"]


def new(spec: KindSpec) -> MeanState:
    """Return an empty mean in the definition's number mode."""
    return MeanState(spec.number)


def state_from_bytes(data: bytes) -> MeanState:
    """Decode bytes written by :meth:`MeanState.to_bytes`."""
    return MeanState._decode(data, TAG, VERSIONS)


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a mean stores: its reader refuses a longer one."""
    return max_power_sums_bytes(spec, squares=False)
