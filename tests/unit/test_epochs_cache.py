"""serve's EpochsCache: a counter's resets read at most once per kept_s (from when the read was sent), and a
reset that returns only RESET_SETTLE_S after it was recorded is known to every read made after it returned."""

from __future__ import annotations

import asyncio

import pytest

from countersink import resets
from countersink.resets import EPOCHS_KEPT_S, RESET_SETTLE_S, EpochsCache
from schemas.resets import Epochs


def test_epochs_are_read_again_once_kept_s_has_passed_since_the_read_was_sent(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    now = [100.0]
    reads: list[str] = []

    async def read_epochs(client: object, counter: str) -> Epochs:
        reads.append(counter)
        now[0] += 0.3  # the read takes 0.3 s: what is kept is as old as when it was sent
        return Epochs()

    monkeypatch.setattr(resets, "read_epochs", read_epochs)
    cache = EpochsCache(object(), kept_s=0.5, clock=lambda: now[0])  # type: ignore[arg-type]

    async def run() -> None:
        await cache.get("views")  # sent at 100.0, ends at 100.3
        await cache.get("views")  # at 100.3, 0.3 s after the read was sent: kept
        now[0] += 0.15
        await cache.get("views")  # at 100.45: kept
        now[0] += 0.05
        await cache.get("views")  # at 100.5, 0.5 s after: read again (sent 100.5, ends 100.8)
        await cache.get("likes")  # another counter: read (sent 100.8, ends 101.1)
        await cache.get("views")  # at 101.1, 0.6 s after: read again

    asyncio.run(run())
    assert reads == ["views", "views", "likes", "views"]


def test_a_reset_settles_longer_than_any_cache_keeps_its_epochs() -> None:
    assert RESET_SETTLE_S >= 2 * EPOCHS_KEPT_S
