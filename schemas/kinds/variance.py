"""``variance``: count, mean, population variance, stddev and sample variance of a numeric field.

The state is exact power sums (``n, Σx, Σx²``), which makes Chan et al.'s parallel merge exact and
order-free (see :mod:`schemas.kinds._moments`). Every statistic is the exact value rounded once to a
double, except ``stddev`` (sqrt of the rounded variance, within one ulp). Number mode default: ``float``.
"""

from __future__ import annotations

from schemas.kinds._moments import MomentsValue, VarianceState, max_power_sums_bytes
from schemas.kinds.base import KindSpec

TAG = VarianceState.tag
VERSIONS = frozenset({1})

__all__ = ["MomentsValue", "VarianceState", "max_stored_bytes", "new", "state_from_bytes"]


def new(spec: KindSpec) -> VarianceState:
    """Return an empty variance in the definition's number mode."""
    return VarianceState(spec.number)


def state_from_bytes(data: bytes) -> VarianceState:
    """Decode bytes written by :meth:`VarianceState.to_bytes`."""
    return VarianceState._decode(data, TAG, VERSIONS)


def max_stored_bytes(spec: KindSpec, max_item_bytes: int) -> int:
    """The largest state a variance stores: its reader refuses a longer one."""
    return max_power_sums_bytes(spec, squares=True)
