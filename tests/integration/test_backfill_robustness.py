"""Backfill and reprocess when things go wrong, on real Kafka and Cassandra: records that retention deletes while
a backfill reads them fail it (no partition marked finished with a hole); a reprocess stopped after each step of
its setup is resumed by ``countersink backfill`` or refused until run again, and ends exact; a reprocess of a
counter with ``since`` waits for every hand-over; a changed ``since`` is refused."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import RecordsToDelete
from structlog.testing import capture_logs

from consumer.applying import Applier, Record, RecordsLostError, RetryWindow
from consumer.cassandra_store import CassandraStore
from consumer.kafka_source import KafkaRecordSource
from consumer.storage import PartitionId
from countersink.backfills import (
    Span,
    backfill_group,
    backfill_partition,
    counter_backfill,
    read_handovers,
    record_handover,
    record_plan,
)
from countersink.cassandra import CassandraClient
from countersink.cli import EXIT_FAILED, EXIT_USAGE
from countersink.commands.backfill import Backfill
from countersink.commands.trace import _reprocessed_by
from countersink.kafka import make_admin
from countersink.reader import read_state
from countersink.registry import CounterRegistry
from countersink.resets import CassandraResets, read_resets
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, Settings
from schemas.definitions import load_definitions, parse_definitions
from schemas.events import EventRouter
from schemas.resets import Reset, cell_name, new_reset_id
from stack.loading import end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import Truth, create_again, make_events, start_consumer, wait_until_started

pytestmark = pytest.mark.integration

SHARES = """
[[counter]]
name = "shares_traded"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "trade_id"
since = "{since}"
"""


async def _delete_before(kafka: KafkaSettings, topic: str, offset: int) -> None:
    admin = make_admin(kafka)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(offset)}, timeout_ms=10_000)
    finally:
        await admin.close()


class DeletingSource(KafkaRecordSource):
    """The real reader, whose log loses its head to retention (``delete_records``) once the first chunk of a
    stream has been handed over."""

    def __init__(self, settings: KafkaSettings, topic: str, delete_before: int) -> None:
        super().__init__(settings)
        self.topic, self.delete_before, self.deleted = topic, delete_before, False

    async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
        async for chunk in super().stream(topic, partition, first, last):
            yield chunk
            if not self.deleted:
                self.deleted = True
                await _delete_before(self._settings, self.topic, self.delete_before)


async def test_records_deleted_while_a_backfill_reads_them_fail_it(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """Retention deletes records a backfill has not read yet while it streams a partition (the reader would
    jump to the new log start): the backfill raises RecordsLostError naming the partition and exactly the
    offsets it had not counted, flushes nothing past them, and the partition is not done; a run again fails
    too."""
    topic = await topic_factory(partitions=1)
    counters_file = tmp_path / "counters.toml"
    counters_file.write_text(SHARES.replace("{topic}", topic).replace("{since}", "earliest"))
    counters = load_definitions(counters_file)
    events, _ = make_events(30_000, symbols=6, seed=5)
    await publish(kafka_settings, topic, events)
    delete_before = 27_000
    router = EventRouter(counters)
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        resets = CassandraResets(client, store.read_cl, store.write_cl)
        source = DeletingSource(kafka_settings, topic, delete_before)

        def applier() -> Applier:
            return Applier(router, counters, topic, 0, RetryWindow(100), resets, only=frozenset({"shares_traded"}))

        flushed: list[int] = []
        try:
            with pytest.raises(RecordsLostError) as lost:
                await backfill_partition(store, source, applier, Span(topic, 0, 0, len(events)), "g.backfill.x", "t",
                                         flush_interval_s=0.0, flush_max_dirty=1,
                                         on_progress=lambda *a: flushed.append(a[3]))
        finally:
            await source.stop()
        assert source.deleted
        assert (lost.value.topic, lost.value.partition, lost.value.last) == (topic, 0, delete_before - 1)
        # The first offset lost is the first one not counted: nothing was flushed past it.
        assert 0 < lost.value.first < delete_before, lost.value
        assert max(flushed) == lost.value.first - 1, (flushed[-3:], lost.value)
        assert str(lost.value) == (f"records {lost.value.first}..{delete_before - 1} of {topic}/0 were deleted from "
                                   "the log before they were counted")
        row = await store.read_partition(PartitionId("g.backfill.x", topic, 0))
        assert row is not None
        assert row.intent_offset == lost.value.first - 1, row  # the last flush's window ends before the hole
        # A run again, by the command, fails too (its replay of the open window finds it gone first): exit 1, one
        # line naming the partition and the offsets, and the partition is not marked finished.
        settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings,
                            consumer=ConsumerSettings(counters_file=counters_file, group_id="g"))
        await record_handover(client, "g", "x", topic, 0, len(events), "test")
        with capture_logs() as logs:
            rc = await Backfill(settings, counters, "shares_traded")._run(client, "x", None,
                                                                          [Span(topic, 0, 0, len(events))])
        assert rc == EXIT_FAILED
        failed = [e for e in logs if e.get("log_level") == "error"]
        assert [e["event"] for e in failed] == ["backfill_failed"], logs
        assert failed[0]["error"] == (f"records {row.committed_offset + 1}..{row.intent_offset} of {topic}/0 were "
                                      "deleted from the log before they were counted"), failed
        assert (await read_handovers(client, "g", "x"))[(topic, 0)].finished_us is None


class Stop(Exception):
    """Raised by a test's hook where a reprocess is stopped (as kill -9 would, with every write it made)."""


def _stop_at(step: str) -> Callable[[str], None]:
    def hook(reached: str) -> None:
        if reached == step:
            raise Stop(step)
    return hook


async def _values(cassandra: CassandraSettings, counter: str, symbols: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    async with CassandraClient(cassandra) as client:
        for symbol in sorted(symbols):
            state = await read_state(client, counter, symbol)
            found[symbol] = 0 if state is None else int(state.value())  # type: ignore[call-overload]
    return {symbol: value for symbol, value in found.items() if value}


async def test_a_reprocess_stopped_at_each_step_of_its_setup_is_resumed_or_refused_and_ends_exact(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """shares_traded has since = "earliest". A reprocess before a live consumer recorded its hand-overs waits
    for them and refuses after --wait-s, resetting nothing. Then, with a live consumer running, a reprocess
    from a time T is stopped after each step of its setup in turn (reset recorded, plan recorded (after the first
    reprocess finished), control records published, their positions recorded, the first partition's end
    recorded): ``countersink
    backfill`` resumes it where its plan and the reset's points are recorded (by the reprocess, or by the live
    consumers that met its control records), refuses (exit 2, one line
    naming the reprocess to run again) where the reset is recorded but its points are not, nothing marked
    finished, and says so where nothing was reset; the reprocess run again then finishes. After every round
    the counter equals the sum of the events published after T, computed from the events alone, and explain
    says no more that it is backfilling. A definitions file whose since differs from the recorded one is
    refused."""
    partitions = 2
    topic = await topic_factory(partitions=partitions)
    group = f"r{os.urandom(4).hex()}"
    counters_file = tmp_path / "counters.toml"
    counters_file.write_text(SHARES.replace("{topic}", topic).replace("{since}", "earliest"))
    counters = load_definitions(counters_file)
    options: dict[str, object] = {"flush_interval_s": 0.2, "dead_letter_topic": f"dlq-{group}", "group_id": group}
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        counters_file=counters_file, group_id=group, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.05,
        flush_max_dirty=5))

    def command(hook: Callable[[str], None] | None = None) -> Backfill:
        backfill = Backfill(settings, counters, "shares_traded")
        if hook is not None:
            backfill.on_step = hook
        return backfill

    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(counters, "test", group)
    with capture_logs() as logs:
        assert await command().reprocess("earliest", 1) == EXIT_FAILED
    assert any("no live consumer recorded where it counts shares_traded from" in str(e.get("error")) for e in logs)
    async with CassandraClient(cassandra_settings) as client:
        assert await read_resets(client, "shares_traded") == []

    batches = [make_events(n, symbols=5, duplicates=n // 50, seed=seed) for seed, n in enumerate([800] * 7, start=3)]
    symbols = {s for _, truth in batches for s in truth.qty}
    log = tmp_path / "consumer.log"

    async def flushed() -> None:
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: partitions}),
                                 within_s=120)

    live = start_consumer(kafka_settings, cassandra_settings, log, counters_file=counters_file, **options)
    try:
        await wait_until_started(log, live)
        await publish(kafka_settings, topic, batches[0][0])
        await flushed()
        await asyncio.sleep(1.1)
        since = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        await asyncio.sleep(1.1)
        after = Truth()
        # Stopped once its control records are published, it is resumed: the live consumers record where they
        # met them (waited for below, so the round does not race their next flush).
        resumed = {"published", "positions", f"end {topic}/0"}
        # "planned" after a finished reprocess too: the current epoch's plan (finished) must not hide it.
        for round_, step in enumerate(["reset", "planned", "published", "positions", f"end {topic}/0"], start=1):
            events, truth = batches[round_]
            await publish(kafka_settings, topic, events)
            after.qty.update(truth.qty)
            await flushed()
            before = await _values(cassandra_settings, "shares_traded", symbols)
            with pytest.raises(Stop):
                await command(_stop_at(step)).reprocess(since, 30)
            if step == "published":
                await flushed()
            if step == "planned":  # nothing was reset
                assert await _values(cassandra_settings, "shares_traded", symbols) == before
            with capture_logs() as logs:
                resumed_rc = await command().backfill(30)
            if step in resumed:
                assert resumed_rc == 0, (step, logs)
            elif step == "planned":
                # Nothing was reset: said, and shares_traded (with since) is backfilled as usual.
                assert resumed_rc == 0, (step, logs)
                said = [e for e in logs if e.get("event") == "reprocess_not_started"]
                assert len(said) == 1, (step, logs)
                assert f"countersink reprocess shares_traded --from {since} again" in said[0]["error"], said
                assert await command().reprocess(since, 30) == 0, step
            else:
                assert resumed_rc == EXIT_USAGE, (step, logs)
                refusals = [e for e in logs if e.get("event") == "backfill_refused"]
                assert len(refusals) == 1, (step, logs)
                assert f"countersink reprocess shares_traded --from {since} again" in refusals[0]["error"], refusals
                # The reset is in force: readers are told the reprocess is not done.
                async with CassandraClient(cassandra_settings) as client:
                    told = await counter_backfill(client, "shares_traded")
                assert told is not None
                assert told.startswith("backfilling: 0 of 2 partitions done"), (step, told)
                assert told.endswith(f"(countersink reprocess shares_traded --from {since})"), told  # not backfill
                assert await command().reprocess(since, 30) == 0, step
            await flushed()
            assert await _values(cassandra_settings, "shares_traded", symbols) == dict(after.qty), step
            async with CassandraClient(cassandra_settings) as client:
                assert await counter_backfill(client, "shares_traded") is None, step
                epoch = max(r.epoch for r in await read_resets(client, "shares_traded"))
                plan = await read_handovers(client, group, cell_name("shares_traded", epoch))
            assert sorted(plan) == [(topic, p) for p in range(partitions)], (step, plan)
            assert all(h.finished_us is not None and h.reprocess_from == since for h in plan.values()), (step, plan)
        # Once done, a backfill resumes nothing and counts nothing twice.
        assert await command().backfill(30) == 0
        events, truth = batches[6]
        await publish(kafka_settings, topic, events)
        after.qty.update(truth.qty)
        await flushed()
        assert await _values(cassandra_settings, "shares_traded", symbols) == dict(after.qty)
    finally:
        live.send_signal(signal.SIGTERM)
        live.wait(timeout=60)

    # A partition whose hand-over is past the reset's point ends at the hand-over (its live mutators count from
    # there, the reset applied at their start); else at the point. An end once recorded stays.
    far = Reset(new_reset_id("shares_traded", 99), "shares_traded", 99, frozenset(), ((topic, partitions),))
    async with CassandraClient(cassandra_settings) as client:
        await record_plan(client, group, cell_name("shares_traded", 99), {(topic, p): 0 for p in range(partitions)},
                          far.reset_id, since, "t")
        unfilled: dict[tuple[str, int], int | None] = {(topic, 0): None, (topic, 1): None}
        points, live_from = {(topic, 0): 5, (topic, 1): 7}, {(topic, 0): 9, (topic, 1): 3}
        ends = await command()._ends(client, far, unfilled, points, live_from)
        assert ends == {(topic, 0): 9, (topic, 1): 7}
        again = await command()._ends(client, far, unfilled, {(topic, 0): 6, (topic, 1): 6}, {})
        assert again == ends
        recorded = await read_handovers(client, group, cell_name("shares_traded", 99))
        assert {tp: h.offset for tp, h in recorded.items()} == ends

    # A topic the counter registry records the counter on (a consumer of other definitions gave it one more),
    # which this file does not give it: the run says so, and reads only the file's topics.
    async with CassandraClient(cassandra_settings) as client:
        wider = parse_definitions(SHARES.replace('"{topic}"', f'"{topic}", "{topic}-more"').replace("{since}", since))
        await CounterRegistry(client).register(wider, "another-host", group)
        with capture_logs() as logs:
            assert await command()._checked(client, since_required=True) is True
    assert [e["topics"] for e in logs if e.get("event") == "topics_not_read"] == [[f"{topic}-more"]]

    # since is fixed at the first start: a file with another one is refused, pointing at reprocess.
    changed = tmp_path / "changed.toml"
    changed.write_text(SHARES.replace("{topic}", topic).replace("{since}", "2026-01-01T00:00:00Z"))
    other = Backfill(settings, load_definitions(changed), "shares_traded")
    async with CassandraClient(cassandra_settings) as client:
        with capture_logs() as logs:
            assert await other._checked(client, since_required=True) is False
    assert [e["error"] for e in logs if e.get("event") == "backfill_refused"] == [
        "'shares_traded' has since = '2026-01-01T00:00:00Z' in "
        f"{changed}, but it was first counted with since = 'earliest', which is fixed then: put it back (to count "
        "again from another time, use countersink reprocess shares_traded --from TIME)"]

    # The topic deleted and created again: the hand-overs and positions recorded are the old topic's offsets, and
    # a backfill or reprocess would read the new topic's records by them.
    await create_again(kafka_settings, topic, partitions)
    async with CassandraClient(cassandra_settings) as client:
        with capture_logs() as logs:
            assert await command()._checked(client, since_required=True) is False
    refusals = [e["error"] for e in logs if e.get("event") == "backfill_refused"]
    assert len(refusals) == 1
    assert refusals[0].startswith(f"topic {topic!r} is now another topic")


async def test_two_reprocesses_planning_one_epoch_never_leave_a_plan_of_both(
    cassandra_settings: CassandraSettings,
) -> None:
    """Two reprocesses of a counter that read the same next epoch both record a plan for it before either
    claims it. Each plan is written whole (one conditional batch, here of 1,200 partitions of a 240-character
    topic); the run that wins the epoch makes the plan its own again, marked claimed, and no plan writes over it
    after that: the other run is told which reset holds the epoch. A plan left by a run stopped before its
    claim is written over."""
    group, cell = f"p{os.urandom(4).hex()}", cell_name("shares_traded", 5)
    first, second = new_reset_id("shares_traded", 5), new_reset_id("shares_traded", 5)
    wide = "t" * 240

    async def plan() -> dict[tuple[str, int], tuple[int | None, str | None, str | None]]:
        found = await read_handovers(client, group, cell)
        return {tp: (h.start_offset, h.reset_id, h.reprocess_from) for tp, h in found.items()}

    async with CassandraClient(cassandra_settings) as client:
        starts = {(wide, p): p for p in range(1_200)}
        assert await record_plan(client, group, cell, starts, second, "earliest", "b") is None
        assert len(await plan()) == 1_200
        # The first run plans two partitions; the second, stopped before its claim, is written over whole.
        assert await record_plan(client, group, cell, {("a", 0): 10, ("a", 1): 11}, first, "-1h", "a") is None
        assert await plan() == {("a", 0): (10, first, "-1h"), ("a", 1): (11, first, "-1h")}
        # The second plans again (it read the same epoch), over the first's: a partition more, other starts.
        racing = {("a", 0): 20, ("a", 1): 21, ("a", 2): 22}
        assert await record_plan(client, group, cell, racing, second, "-2h", "b") is None
        assert await plan() == {("a", p): (20 + p, second, "-2h") for p in range(3)}
        # The first claims the epoch: its plan is its own again, claimed.
        for _ in range(2):  # asked twice (an answer lost): the same
            assert await record_plan(client, group, cell, {("a", 0): 10, ("a", 1): 11}, first, "-1h", "a",
                                     claimed_us=1) is None
            assert await plan() == {("a", 0): (10, first, "-1h"), ("a", 1): (11, first, "-1h")}
        # The second's plan, or its claim, no longer writes over it.
        assert await record_plan(client, group, cell, racing, second, "-2h", "b") == first
        assert await record_plan(client, group, cell, racing, second, "-2h", "b", claimed_us=2) == first
        assert await plan() == {("a", 0): (10, first, "-1h"), ("a", 1): (11, first, "-1h")}
        # trace asks which backfill counts a record again into the epoch: only the plan of the reset that made it.
        assert await _reprocessed_by(client, group, cell, first, "a", 0, 12, None) is None  # no end, no point
        assert await _reprocessed_by(client, group, cell, first, "a", 0, 12, 20) == backfill_group(group, cell)
        assert await _reprocessed_by(client, group, cell, second, "a", 0, 12, 20) is None


async def test_a_backfill_of_a_counter_without_since_is_refused_as_a_backfill(
    cassandra_settings: CassandraSettings, tmp_path: Path,
) -> None:
    """A counter whose file has no since has nothing before its hand-over to backfill: refused in one
    ``backfill_refused`` line naming the counter, exit 2, nothing written."""
    counters_file = tmp_path / "without_since.toml"
    counters_file.write_text(SHARES.replace("{topic}", "trades_without_since").replace('since = "{since}"\n', ""))
    settings = Settings(cassandra=cassandra_settings, consumer=ConsumerSettings(
        counters_file=counters_file, group_id="backfill-without-since"))
    with capture_logs() as logs:
        assert await Backfill(settings, load_definitions(counters_file), "shares_traded").backfill(1) == EXIT_USAGE
    assert [(e["event"], e.get("counter"), e["error"]) for e in logs if e.get("log_level") == "error"] == [
        ("backfill_refused", "shares_traded", f"'shares_traded' has no since in {counters_file}: there is nothing "
         "before its hand-over to count (countersink reprocess counts again from a time)")]


async def test_a_backfill_taken_over_by_another_run_of_it_stops_with_one_clear_line(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs of one backfill at once: the second claims the partition while the first counts it (after the
    first's first chunk). The second counts on from the first's last flush to the end; the first stops at its
    next flush, saying in one line that another run took the partition over (exit 1), not with the protocol's
    internal message. Every value equals the truth: nothing counted twice or lost."""
    topic = await topic_factory(partitions=1)
    group = f"t{os.urandom(4).hex()}"
    counters_file = tmp_path / "counters.toml"
    counters_file.write_text(SHARES.replace("{topic}", topic).replace("{since}", "earliest"))
    counters = load_definitions(counters_file)
    events, truth = make_events(20_000, symbols=6, seed=11)
    await publish(kafka_settings, topic, events)
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings, consumer=ConsumerSettings(
        counters_file=counters_file, group_id=group, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.05,
        flush_max_dirty=5))
    span = Span(topic, 0, 0, len(events))
    second: list[int] = []

    class TakenOverSource(KafkaRecordSource):
        """The real reader; the first run's stream, after its first chunk, waits for a whole second run."""

        taking_over: Callable[[], Awaitable[int]] | None = None

        async def stream(self, topic: str, partition: int, first: int, last: int) -> AsyncIterator[list[Record]]:
            async for chunk in super().stream(topic, partition, first, last):
                yield chunk
                run, TakenOverSource.taking_over = TakenOverSource.taking_over, None
                if run is not None:
                    second.append(await run())

    monkeypatch.setattr("countersink.commands.backfill.KafkaRecordSource", TakenOverSource)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(counters, "test", group)
        await record_handover(client, group, "shares_traded", topic, 0, len(events), "test")
        TakenOverSource.taking_over = lambda: Backfill(settings, counters, "shares_traded")._run(
            client, "shares_traded", None, [span])
        with capture_logs() as logs:
            first = await Backfill(settings, counters, "shares_traded")._run(client, "shares_traded", None, [span])
        assert second == [0], logs
        assert first == EXIT_FAILED, logs
        failed = [e for e in logs if e.get("log_level") == "error"]
        assert [(e["event"], e["partition"], e["error"]) for e in failed] == [
            ("backfill_taken_over", f"{topic}/0",
             f"another run of this backfill of shares_traded took {topic}/0 over while this one counted it")], failed
        assert (await read_handovers(client, group, "shares_traded"))[(topic, 0)].finished_us is not None
    assert await _values(cassandra_settings, "shares_traded", set(truth.qty)) == dict(truth.qty)
