"""Resident memory per live instance of one kind, as a consumer holds it: ``python -m bench.memory KIND N``.

Run in a fresh interpreter per kind (``bench.pipeline`` does), so that one kind's freed memory is not
reused by the next. N keys get four events each on average; prints RSS bytes per instance actually created.
"""

from __future__ import annotations

import gc
import random
import sys
from pathlib import Path

from bench.apply import definitions, events
from schemas.events import EventRouter, apply_updates
from schemas.kinds import State

EVENTS_PER_INSTANCE = 4


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(kind: str, instances: int) -> None:
    counters = definitions()
    router = EventRouter(counters)
    raws = events(instances * EVENTS_PER_INSTANCE, instances, random.Random(1))
    gc.collect()
    before = rss_bytes()
    states: dict[tuple[str, str], State] = {}
    for raw in raws:
        apply_updates(states, router.route(f"t_{kind}", raw), counters)
    gc.collect()
    after = rss_bytes()
    print(f"{(after - before) / len(states):.1f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
