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


async def _turns() -> None:
    """Let every task that can run, run (a get, then the read it starts)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_callers_that_miss_while_a_read_is_in_flight_share_it_unless_it_was_sent_kept_s_ago(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten requests arriving at once after the entry expired send one read; one arriving when the read in
    flight was sent kept_s ago or more sends its own (the shared one could predate a reset it must know); a
    caller cancelled while it waits leaves the others their answer; a failed read fails every caller that
    waited for it, and the next one reads again."""
    now = [100.0]
    reads: list[str] = []
    gates: list[asyncio.Event] = []
    failing = [False]

    async def read_epochs(client: object, counter: str) -> Epochs:
        reads.append(counter)
        number = len(reads)
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        if failing[0]:
            raise TimeoutError("resets unreadable")
        return Epochs({counter: number})

    monkeypatch.setattr(resets, "read_epochs", read_epochs)
    cache = EpochsCache(object(), kept_s=0.5, clock=lambda: now[0])  # type: ignore[arg-type]

    async def run() -> None:
        waiting = [asyncio.ensure_future(cache.get("views")) for _ in range(10)]
        await _turns()
        assert reads == ["views"]
        waiting[0].cancel()
        now[0] += 0.5  # the read in flight was sent 0.5 s ago: a newcomer reads for itself
        late = asyncio.ensure_future(cache.get("views"))
        await _turns()
        assert reads == ["views", "views"]
        gates[0].set()
        shared = await asyncio.gather(*waiting[1:])
        assert {e.all_keys["views"] for e in shared} == {1}
        gates[1].set()
        assert (await late).all_keys["views"] == 2
        now[0] += 0.6
        failing[0] = True
        failed = [asyncio.ensure_future(cache.get("views")) for _ in range(3)]
        await _turns()
        gates[2].set()
        outcomes = await asyncio.gather(*failed, return_exceptions=True)
        assert all(isinstance(o, TimeoutError) for o in outcomes), outcomes
        failing[0] = False
        again = asyncio.ensure_future(cache.get("views"))
        await _turns()
        gates[3].set()
        assert (await again).all_keys["views"] == 4
        assert waiting[0].cancelled()

    asyncio.run(run())
    assert reads == ["views"] * 4


def test_kept_answers_only_what_a_read_sent_less_than_kept_s_ago_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]

    async def read_epochs(client: object, counter: str) -> Epochs:
        return Epochs()

    monkeypatch.setattr(resets, "read_epochs", read_epochs)
    cache = EpochsCache(object(), kept_s=0.5, clock=lambda: now[0])  # type: ignore[arg-type]
    assert cache.kept("views") is None
    read = asyncio.run(cache.get("views"))
    now[0] += 0.4
    assert cache.kept("views") is read
    assert cache.kept("likes") is None
    now[0] += 0.1
    assert cache.kept("views") is None


def test_a_cached_read_sends_the_resets_not_kept_alongside_the_stamps(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's read of an instance whose counter's resets are not kept (read less than twice a second) sends the
    resets read and the stamps read at once: a hit costs one round trip, not two one after the other. With the
    resets kept, the stamps alone; a second read of unchanged stamps answers the kept merge's value."""
    from countersink import reader
    from countersink.state_cache import StateCache
    from schemas.kinds import KindSpec, new_state

    started: list[str] = []
    both_sent = asyncio.Event()

    def sent(what: str) -> None:
        started.append(what)
        if {"resets", "stamps"} <= set(started):
            both_sent.set()

    async def read_epochs(client: object, counter: str) -> Epochs:
        sent("resets")
        await asyncio.wait_for(both_sent.wait(), 1.0)  # times out unless the stamps read is sent meanwhile
        return Epochs()

    async def read_stamps(client: object, keys: list[str], consistency: object = None) -> dict[str, object]:
        sent("stamps")
        if "resets" in started and not both_sent.is_set():
            await asyncio.wait_for(both_sent.wait(), 1.0)
        return {key: {b"source": 1} for key in keys}

    state = new_state(KindSpec("sum"))
    state.apply(5)

    async def read_instances(client: object, counter: str, keys: list[str], consistency: object = None,
                             epochs: object = None, *, rows: bool = False) -> dict[str, reader.StoredInstance]:
        sent("states")
        return {key: reader.StoredInstance([state.to_bytes()], {b"source": 1}) for key in keys}

    monkeypatch.setattr(resets, "read_epochs", read_epochs)
    monkeypatch.setattr(reader, "read_stamps", read_stamps)
    monkeypatch.setattr(reader, "read_instances", read_instances)
    epochs = EpochsCache(object())  # type: ignore[arg-type]
    states = StateCache(1 << 20)

    async def run() -> list[tuple[str, object] | None]:
        first = await reader.read_value(object(), "views", "home", None, states, epochs)  # type: ignore[arg-type]
        second = await reader.read_value(object(), "views", "home", None, states, epochs)  # type: ignore[arg-type]
        return [first, second]

    assert asyncio.run(run()) == [("sum", 5), ("sum", 5)]
    assert sorted(started[:2]) == ["resets", "stamps"]  # at once (the resets read waits for the stamps read)
    assert started[2:] == ["states", "stamps"]  # the second read: the resets kept, a hit


@pytest.mark.parametrize("cached", [True, False])
def test_a_cold_read_with_the_resets_no_longer_kept_reads_them_and_the_states_at_once(
        monkeypatch: pytest.MonkeyPatch, cached: bool) -> None:
    """serve's read of an instance it keeps no merge of, its counter's resets read before but no longer kept,
    sends the resets read and the states read of the instance's cell in the resets last read at once (one round
    trip), and no stamps read; when the resets read names another cell (a reset since), the states of that cell
    are read and answered, never those of the guessed one. With the state cache on or off."""
    from countersink import reader
    from countersink.state_cache import StateCache
    from schemas.kinds import KindSpec, new_state

    now = [100.0]
    current = [Epochs()]
    started: list[str] = []
    states_sent = asyncio.Event()

    def state(value: int) -> bytes:
        made = new_state(KindSpec("sum"))
        made.apply(value)
        return made.to_bytes()

    async def read_epochs(client: object, counter: str) -> Epochs:
        started.append("resets")
        if len(started) > 1:  # not the first read (the guess), with nothing else sent
            await asyncio.wait_for(states_sent.wait(), 1.0)  # times out unless the states read is sent meanwhile
        return current[0]

    async def read_stamps(client: object, keys: list[str], consistency: object = None) -> dict[str, object]:
        started.append("stamps")
        return dict.fromkeys(keys)

    async def read_instances(client: object, counter: str, keys: list[str], consistency: object = None,
                             epochs: Epochs | None = None, *, rows: bool = False) -> dict[str, reader.StoredInstance]:
        assert epochs is not None
        cell = epochs.cell(counter, keys[0])
        started.append(f"states of {cell}")
        states_sent.set()
        return {key: reader.StoredInstance([state(7 if cell == counter else 2)], {b"source": 1}) for key in keys}

    async def read_blobs_of(client: object, counter: str, keys: list[str], consistency: object = None,
                            epochs: Epochs | None = None) -> dict[str, list[bytes]]:
        found = await read_instances(client, counter, keys, consistency, epochs)
        return {key: found[key].blobs for key in keys}

    monkeypatch.setattr(resets, "read_epochs", read_epochs)
    monkeypatch.setattr(reader, "read_stamps", read_stamps)
    monkeypatch.setattr(reader, "read_instances", read_instances)
    monkeypatch.setattr(reader, "read_blobs_of", read_blobs_of)
    epochs = EpochsCache(object(), kept_s=0.5, clock=lambda: now[0])  # type: ignore[arg-type]

    async def cold_read() -> tuple[str, object] | None:
        now[0] += 1.0  # the resets read before are no longer kept
        started.clear()
        started.append("cold read")
        states_sent.clear()
        return await reader.read_value(object(), "views", "home", None,  # type: ignore[arg-type]
                                       StateCache(1 << 20) if cached else None, epochs)

    async def run() -> None:
        await epochs.get("views")  # read once: serve has a guess
        assert await cold_read() == ("sum", 7)
        assert sorted(started) == ["cold read", "resets", "states of views"]  # at once, in any order
        current[0] = Epochs(all_keys={"views": 1})  # the counter reset since
        assert await cold_read() == ("sum", 2)
        assert sorted(started[:3]) == ["cold read", "resets", "states of views"]
        assert started[3:] == ["states of views@1"]

    asyncio.run(run())


def test_when_one_of_two_reads_sent_at_once_fails_the_other_is_cancelled() -> None:
    """A failed look-up of the resets sent with a read of the states raises its own error (the one serve answers
    for) once the states read is cancelled, not while that read runs on."""
    from countersink import reader

    ended: list[str] = []

    async def failing() -> None:
        await asyncio.sleep(0)
        raise TimeoutError("the resets' look-up")

    async def long_read() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def run() -> None:
        with pytest.raises(TimeoutError, match="the resets' look-up"):
            await reader._together(failing(), long_read())
        assert ended == ["cancelled"]

    asyncio.run(asyncio.wait_for(run(), 5))
