"""Write golden state-byte vectors: one JSON file per kind, number mode and format version.

Run ``python -m tests.golden.make_golden`` after adding a kind or a format version. Existing files are
never overwritten: a golden vector is a promise that bytes written by a released version stay readable.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from schemas.kinds import KINDS, KindSpec, State, new_state

HERE = Path(__file__).parent

# name -> (spec, fixed inputs, whether encoding the inputs again must give the same bytes).
# KLL compaction is randomized, so a KLL vector past k values is decode-only.
VECTORS: dict[str, tuple[KindSpec, list[Any], bool]] = {
    "count": (KindSpec("count"), [None] * 3, True),
    "sum_integer": (KindSpec("sum", number="integer"), [5, -2, 2**70], True),
    "sum_decimal": (
        KindSpec("sum", number="decimal"),
        [Decimal("10.50"), Decimal("0.25"), Decimal(-3)],
        True,
    ),
    "sum_float": (KindSpec("sum", number="float"), [0.1, 0.2, 1e300, -1e300, 7], True),
    "min_integer": (KindSpec("min", number="integer"), [4, -9, 12], True),
    "min_decimal": (KindSpec("min", number="decimal"), [Decimal("1.0"), Decimal("1.00"), Decimal(3)], True),
    "min_float": (KindSpec("min", number="float"), [2.5, -0.125], True),
    "max_integer": (KindSpec("max", number="integer"), [4, -9, 12], True),
    "max_decimal": (KindSpec("max", number="decimal"), [Decimal("1.0"), Decimal("1.00")], True),
    "max_float": (KindSpec("max", number="float"), [2.5, -0.125], True),
    "mean_integer": (KindSpec("mean", number="integer"), [1, 2, 4], True),
    "mean_decimal": (KindSpec("mean", number="decimal"), [Decimal("0.1"), Decimal("0.2")], True),
    "mean_float": (KindSpec("mean", number="float"), [0.1, 0.2, 0.3], True),
    "variance_integer": (KindSpec("variance", number="integer"), [2, 4, 4, 4, 5, 5, 7, 9], True),
    "variance_decimal": (KindSpec("variance", number="decimal"), [Decimal("1.5"), Decimal("2.5")], True),
    "variance_float": (KindSpec("variance", number="float"), [1e9 + 1, 1e9 + 2, 1e9 + 3], True),
    "distinct": (KindSpec("distinct", lg_k=12), [str(i % 7) for i in range(20)], True),
    "distinct_estimating": (KindSpec("distinct", lg_k=4), [str(i) for i in range(100)], True),
    "quantiles": (KindSpec("quantiles", k=200), [float(i) for i in range(50)], True),
    "quantiles_compacted": (KindSpec("quantiles", k=8), [float(i) for i in range(100)], False),
    "top_k": (KindSpec("top_k", lg_max_map_size=8, top=3), list("abracadabra"), True),
    "top_k_purged": (KindSpec("top_k", lg_max_map_size=3), [str(i) for i in range(7)], True),
}


def build(spec: KindSpec, inputs: list[Any]) -> State:
    state = new_state(spec)
    for v in inputs:
        state.apply(v)
    return state


def main() -> int:
    written = 0
    for name, (spec, inputs, deterministic) in VECTORS.items():
        assert spec.kind in KINDS
        state = build(spec, inputs)
        path = HERE / f"{name}_v{state.version}.json"
        if path.exists():
            continue
        doc = {
            "name": name,
            "version": state.version,
            "hex": state.to_bytes().hex(),
            "value": repr(state.value()),
            "deterministic": deterministic,
        }
        with path.open("x", encoding="utf-8") as f:  # "x": refuse to overwrite, even in a race
            json.dump(doc, f, indent=2)
            f.write("\n")
        written += 1
        print(f"wrote {path.name}")
    print(f"{written} new vectors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
