"""The GC worker on real Kafka and Cassandra: values never change, shards go away, workers run at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from consumer.protocol import MIN_LIFETIME_US
from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.reader import CounterReader, read_state
from countersink.settings import CassandraSettings, Consistency, ConsumerSettings, KafkaSettings, Settings
from gc_worker.collector import Collector, GcReport
from gc_worker.store import CassandraGcStore
from schemas.cql import shard_cell, shard_slice, work_chunk
from schemas.definitions import CounterSet, load_definitions, parse_definitions
from schemas.errors import MalformedInstanceKeyError
from schemas.kinds import new_state
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import (
    DEFINITIONS,
    expected_values,
    make_events,
    read_values,
    running,
    start_consumer,
    write_definitions,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MONOTONIC = ("trades_count", "shares_traded")  # counts and sums of positive quantities only ever grow
GRACE_S = 0.5  # one machine, one clock: no skew to cover
COUNTERS = parse_definitions(DEFINITIONS.replace("{topic}", "any"))


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path) -> Settings:
    # Mutators rotate every 2 s, so the GC has retired mutators to fold all through the test.
    return Settings(kafka=kafka, cassandra=cassandra, consumer=ConsumerSettings(
        group_id=group, counters_file=counters, dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
        session_timeout_ms=6000, health_port=0, mutator_max_age_s=2))


def _now_us() -> int:
    return time.time_ns() // 1000


async def _gc_run(client: CassandraClient, **options: object) -> GcReport:
    collector = Collector(CassandraGcStore(client), int(GRACE_S * 1e6), retriable=(CassandraUnavailableError,),
                          **options)  # type: ignore[arg-type]
    return await collector.run(_now_us())


async def _shards(client: CassandraClient, counter: str, key: str) -> list[str]:
    rows = as_dicts(await client.execute("SELECT mutator, states[?] AS state FROM shards WHERE part = ? AND key = ?",
                                         [counter, *shard_slice(key)]))
    return [str(r["mutator"]) for r in rows if r["state"] is not None]


async def _count(client: CassandraClient, key: str) -> int:
    state = await read_state(client, "trades_count", key)
    value = 0 if state is None else state.value()
    assert isinstance(value, int)
    return value


async def _registry(client: CassandraClient) -> dict[str, dict[str, Any]]:
    rows = as_dicts(await client.execute("SELECT id, retired_us, collected_us FROM mutators"))
    return {str(r["id"]): r for r in rows}


async def test_two_gc_workers_while_consumers_run_never_change_a_value(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """A reader polls every counter while two consumers run (rotating their mutators every 2 s) and two GC
    workers fold at once: no value ever goes down or beyond the truth, and the end equals the truth. After
    GC, shards belong only to mutators still live at its cutoff; once every mutator has retired, none is
    left; a second run changes nothing."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(6000, symbols=40, duplicates=100, malformed=5, seed=23)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    definitions = load_definitions(counters)
    consumers = [ConsumerService(settings, definitions) for _ in range(2)]
    runners = []
    for service in consumers:
        await service.start()
        runners.append(asyncio.create_task(service.run()))

    stop = asyncio.Event()
    problems: list[str] = []
    polls = 0
    reports: list[GcReport] = []
    final: dict[str, dict[str, Any]] = expected_values(truth)

    async def reader() -> None:
        nonlocal polls
        last: dict[tuple[str, str], int] = {}
        async with CassandraClient(cassandra_settings) as client:
            while not stop.is_set():
                for counter in MONOTONIC:
                    for symbol in truth.count:
                        state = await read_state(client, counter, symbol)
                        seen = 0 if state is None else state.value()
                        assert isinstance(seen, int)
                        if seen < last.get((counter, symbol), 0):
                            problems.append(f"{counter}/{symbol} went down: {last[(counter, symbol)]} -> {seen}")
                        if seen > final[counter][symbol]:
                            problems.append(f"{counter}/{symbol} = {seen}, beyond the truth {final[counter][symbol]}")
                        last[(counter, symbol)] = seen
                polls += 1

    async def gc_worker() -> None:
        async with CassandraClient(cassandra_settings) as client:
            while not stop.is_set():
                reports.append(await _gc_run(client, concurrency=4))
                await asyncio.sleep(0.2)

    background = [asyncio.create_task(reader()), asyncio.create_task(gc_worker()), asyncio.create_task(gc_worker())]
    try:
        for i in range(0, len(events), 600):
            await publish(kafka_settings, topic, events[i:i + 600])
            await asyncio.sleep(0.8)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
        await asyncio.sleep(2 * GRACE_S)
    finally:
        stop.set()
        await asyncio.gather(*background)

    try:
        async with CassandraClient(cassandra_settings) as client:
            started_us = _now_us()
            await _gc_run(client)
            registry = await _registry(client)
            cutoff_us = started_us - GRACE_S * 1e6
            for counter in MONOTONIC:
                for symbol in truth.count:
                    for mutator in await _shards(client, counter, symbol):
                        retired = registry[mutator]["retired_us"]
                        assert retired is None or retired >= cutoff_us, f"{counter}/{symbol}: {mutator} left"
    finally:
        for service in consumers:
            service.request_stop()
        await asyncio.gather(*runners)
        for service in consumers:
            await service.stop()
    await _hand_over_cleanly(settings, definitions, partitions=3)

    assert problems == []
    assert polls >= 3
    assert sum(r.instances_folded for r in reports) > 0
    assert all(r.instances_deferred == 0 for r in reports)

    # Every mutator is retired now, some at born + MIN_LIFETIME_US, just ahead: let that and the grace pass.
    await asyncio.sleep(MIN_LIFETIME_US / 1e6 + 2 * GRACE_S)
    async with CassandraClient(cassandra_settings) as client:
        last_run = await _gc_run(client)
        assert last_run.mutators_collected == last_run.mutators_final > 0
        for counter in expected_values(truth):
            for symbol in truth.count:
                assert await _shards(client, counter, symbol) == []
        registry = await _registry(client)
        assert [r for r in registry.values() if r["collected_us"] is None] == []
        again = await _gc_run(client)
    assert (again.mutators_final, again.instances_checked, again.instances_folded) == (0, 0, 0)
    assert await read_values(cassandra_settings, truth) == expected_values(truth)


async def _hand_over_cleanly(settings: Settings, definitions: CounterSet, partitions: int) -> None:
    """Members stopped in the middle of a rebalance or a rotation leave the takeovers they had begun as a crash
    leaves them: their mutators own rows that only the partitions' next owner retires. One more consumer, which
    does not rotate, takes every partition, finishes those takeovers, and hands everything over cleanly."""
    calm = settings.model_copy(update={"consumer": settings.consumer.model_copy(update={"mutator_max_age_s": 3600})})
    last = ConsumerService(calm, definitions)
    await last.start()
    runner = asyncio.create_task(last.run())
    try:
        deadline = time.monotonic() + 90
        while not (len(last.mutators) == partitions
                   and not any(last.ownership.takeover_pending(m) for m in last.mutators.values())):
            assert time.monotonic() < deadline, "the last consumer did not take every partition within 90 s"
            await asyncio.sleep(0.2)
    finally:
        last.request_stop()
        await runner
        await last.stop()


def _cli(settings: CassandraSettings, *args: str, kafka: KafkaSettings | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = child_env(kafka or KafkaSettings(), settings)
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout + done.stderr
    return json.loads(lines[-1])  # type: ignore[no-any-return]


async def _insert_mutator(client: CassandraClient, *, topic: str, born_us: int, expires_us: int,
                          retired_us: int | None, shard: tuple[str, str, int], write_us: int) -> uuid.UUID:
    """A registry row and one count shard written at ``write_us``, as a consumer would have left them."""
    mutator = uuid.uuid4()
    await client.execute(
        "INSERT INTO mutators (id, consumer_group, topic, partition, host, born_us, expires_us, retired_us) "
        "VALUES (?, 'old-group', ?, 0, 'gone', ?, ?, ?)", [mutator, topic, born_us, expires_us, retired_us])
    counter, key, n = shard
    state = new_state(COUNTERS[counter])
    for _ in range(n):
        state.apply(1)
    await client.execute(
        "UPDATE shards USING TIMESTAMP ? SET states = states + ? WHERE part = ? AND key = ? AND born_us = ? "
        "AND mutator = ?", [write_us, {counter: shard_cell(state.to_bytes(), 0)}, *shard_slice(key), born_us, mutator])
    await client.execute("INSERT INTO mutator_work (mutator, chunk, instances) VALUES (?, ?, ?)",
                         [mutator, *work_chunk([(counter, key)])])
    return mutator


async def test_gc_and_retire_orphans_commands(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """``countersink gc``: a dry run writes nothing, a run folds everything final and exits 0, a failed safety
    check defers and exits 3. ``countersink retire-orphans`` lists, then retires, a mutator of a deleted
    topic, and the next GC folds its shard without changing the value."""
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(2000, symbols=15, seed=29)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    async with running(ConsumerService(settings, load_definitions(counters))):
        for i in range(0, len(events), 500):
            await publish(kafka_settings, topic, events[i:i + 500])
            await asyncio.sleep(1.2)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}))
    await asyncio.sleep(MIN_LIFETIME_US / 1e6)

    async with CassandraClient(cassandra_settings) as client:
        before = {s: await _shards(client, "trades_count", s) for s in truth.count}
    dry = _cli(cassandra_settings, "gc", "--dry-run", "--json", "--grace", "0.5s")
    assert dry.returncode == 0, dry.stderr
    assert _report(dry)["instances_folded"] == 3 * len(truth.count)
    async with CassandraClient(cassandra_settings) as client:
        assert {s: await _shards(client, "trades_count", s) for s in truth.count} == before

    done = _cli(cassandra_settings, "gc", "--once", "--json", "--grace", "0.5s")
    assert done.returncode == 0, done.stderr
    report = _report(done)
    assert report["mutators_collected"] == report["mutators_final"]
    assert report["mutators_final"] >= 2  # at least one rotation per partition
    assert await read_values(cassandra_settings, truth) == expected_values(truth)

    now = _now_us()
    async with CassandraClient(cassandra_settings) as client:
        for symbol in truth.count:
            assert await _shards(client, "trades_count", symbol) == []
        # A shard written after its mutator's retire time would survive the deletion: GC must defer it.
        late = await _insert_mutator(client, topic=topic, born_us=now - 60_000_000, expires_us=now,
                                     retired_us=now - 30_000_000, shard=("trades_count", "LATE", 4),
                                     write_us=now - 10_000_000)
        # A mutator of a topic that no longer exists, expired, never retired.
        orphan = await _insert_mutator(client, topic=f"gone-{uuid.uuid4().hex[:8]}", born_us=now - 60_000_000,
                                       expires_us=now - 30_000_000, retired_us=None,
                                       shard=("trades_count", "ORPHAN", 5), write_us=now - 59_000_000)

    deferred = _cli(cassandra_settings, "gc", "--json", "--grace", "0.5s")
    assert deferred.returncode == 3, deferred.stderr
    assert _report(deferred)["deferred"] == ["LATE: shard_written_after_retirement"]

    listed = _cli(cassandra_settings, "retire-orphans", "--grace", "1s", kafka=kafka_settings)
    assert listed.returncode == 0, listed.stderr
    assert f"would retire {orphan}" in listed.stdout
    assert "1 orphaned mutators; run again with --apply" in listed.stdout
    applied = _cli(cassandra_settings, "retire-orphans", "--grace", "1s", "--apply", "--json", kafka=kafka_settings)
    assert applied.returncode == 0, applied.stderr
    (line,) = [json.loads(x) for x in applied.stdout.splitlines() if x.startswith("{")]
    assert (line["mutator"], line["reason"], line["retired"]) == (str(orphan), "topic_gone", True)

    await asyncio.sleep(0.6)
    after = _cli(cassandra_settings, "gc", "--json", "--grace", "0.5s")
    assert after.returncode == 3  # LATE stays deferred
    async with CassandraClient(cassandra_settings) as client:
        assert await _shards(client, "trades_count", "ORPHAN") == []
        assert await _count(client, "ORPHAN") == 5
        assert await _shards(client, "trades_count", "LATE") == [str(late)]
        assert await _count(client, "LATE") == 4


class _PausingStore(CassandraGcStore):
    """A GC store that runs ``between`` once, after the first page of its first instance read."""

    def __init__(self, client: CassandraClient, between: Callable[[], Awaitable[None]], page_size: int) -> None:
        super().__init__(client, page_size=page_size)
        self.between: Callable[[], Awaitable[None]] | None = between

    async def _pages(self, cql_text: str, params: list[object], consistency: Consistency
                     ) -> AsyncIterator[list[dict[str, object]]]:
        async for rows in super()._pages(cql_text, params, consistency):
            yield rows
            if self.between is not None and "writetime(states" in cql_text:
                between, self.between = self.between, None
                await between()


async def test_a_fold_between_the_pages_of_an_instance_read_changes_no_value(
    cassandra_settings: CassandraSettings,
) -> None:
    """A GC worker folds between the pages of another's read of an instance: its value stays exact."""
    now = _now_us()
    async with CassandraClient(cassandra_settings) as client:
        for i in range(7):
            await _insert_mutator(client, topic="paged", born_us=now - 120_000_000 + i, expires_us=now,
                                  retired_us=now - 60_000_000, shard=("trades_count", "PAGED", i + 1),
                                  write_us=now - 120_000_000 + i + 1)
        late = await _insert_mutator(client, topic="paged", born_us=now - 30_000_000, expires_us=now,
                                     retired_us=now - 10_000_000, shard=("trades_count", "PAGED", 100),
                                     write_us=now - 20_000_000)
        assert await _count(client, "PAGED") == 128
        others: list[GcReport] = []

        async def other_worker() -> None:
            # Its cutoff, 30 s ago, comes before ``late`` retired: it folds the seven early shards only.
            other = Collector(CassandraGcStore(client, page_size=3), 30_000_000,
                              retriable=(CassandraUnavailableError,))
            others.append(await other.run(_now_us()))

        store = _PausingStore(client, other_worker, page_size=3)
        report = await Collector(store, int(GRACE_S * 1e6), retriable=(CassandraUnavailableError,)).run(_now_us())
        assert store.between is None
        assert [(r.instances_folded, r.shards_deleted) for r in others] == [(1, 7)]
        assert (report.instances_folded, report.instances_deferred) == (1, 0)
        assert await _count(client, "PAGED") == 128
        assert await _shards(client, "trades_count", "PAGED") == []
        assert (await _registry(client))[str(late)]["collected_us"] is not None


@pytest.mark.cluster
async def test_gc_defers_while_a_replica_is_down_and_completes_after_it_returns(
    cassandra_cluster, kafka_settings: KafkaSettings, topic_factory, tmp_path: Path
) -> None:
    """RF=3 on three nodes, one stopped: the consumer keeps counting at QUORUM; GC cannot read at ALL, so it
    defers those instances, says so and exits 3, changing nothing. After the node returns, GC completes.

    Every Cassandra client here runs in a child process (the consumer, ``countersink get`` and ``gc``): see
    ``cluster_client.py`` for why no session in the test process lives through a node going down."""
    cassandra = CassandraSettings(contact_points=cassandra_cluster.contact_points, port=cassandra_cluster.native_port,
                                  keyspace=f"t_{uuid.uuid4().hex[:12]}", request_timeout_s=5.0,
                                  replication="{'class': 'SimpleStrategy', 'replication_factor': 3}")
    topic = await topic_factory(partitions=2)
    group = f"g{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    events, truth = make_events(3000, symbols=12, duplicates=50, seed=31)
    symbols = sorted(truth.count)
    schema = _cli(cassandra, "schema")
    assert schema.returncode == 0, schema.stderr

    def counted() -> dict[str, object]:
        done = _cli(cassandra, "get", "--json", "trades_count", *symbols)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["values"]  # type: ignore[no-any-return]

    async def until_counted(expected: dict[str, object], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while (seen := counted()) != expected:
            assert time.monotonic() < deadline, f"counts {seen} never reached {expected}"
            await asyncio.sleep(1)

    log = tmp_path / "consumer.log"
    consumer = start_consumer(kafka_settings, cassandra, log, group_id=group, counters_file=counters,
                              dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3, mutator_max_age_s=2)
    stopped = cassandra_cluster.nodes[2]
    try:
        half = len(events) // 2
        first_truth = Counter(json.loads(e)["symbol"] for e in _distinct(events[:half]))
        await publish(kafka_settings, topic, events[:half])
        await until_counted({s: first_truth.get(s) for s in symbols}, 120)

        stopped.stop()
        try:
            await publish(kafka_settings, topic, events[half:])
            await until_counted(dict(truth.count), 120)  # QUORUM writes go on with two replicas of three
            await asyncio.sleep(MIN_LIFETIME_US / 1e6 + 2 * GRACE_S)
            down = _cli(cassandra, "gc", "--json", "--grace", f"{GRACE_S}s")
            assert down.returncode == 3, down.stdout + down.stderr
            report = _report(down)
            assert report["instances_deferred"] > 0  # type: ignore[operator]
            assert all(item.endswith("storage_unavailable") for item in report["deferred"])  # type: ignore[attr-defined]
            assert report["instances_folded"] == 0
            assert counted() == dict(truth.count)
        finally:
            stopped.restart(tied_to_parent=True)

        deadline = time.monotonic() + 120
        while (done := _cli(cassandra, "gc", "--json", "--grace", f"{GRACE_S}s")).returncode != 0:
            # The driver reconnects to the returned node on its own schedule; until then, ALL still fails.
            assert done.returncode == 3, done.stdout + done.stderr
            assert time.monotonic() < deadline, "GC still deferring two minutes after the node returned"
            await asyncio.sleep(3)
        report = _report(done)
        assert report["instances_folded"] > 0  # type: ignore[operator]
        assert report["mutators_collected"] == report["mutators_final"]
        assert counted() == dict(truth.count)
    finally:
        consumer.send_signal(signal.SIGTERM)
        try:
            code = consumer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            consumer.kill()
            code = consumer.wait()
    assert code == 0, log.read_text()[-3000:]


def _distinct(events: list[bytes]) -> list[bytes]:
    """The valid events of a stream, each event id once (what the counters count)."""
    seen: set[str] = set()
    out = []
    for event in events:
        try:
            body = json.loads(event)
        except ValueError:
            continue
        if isinstance(body, dict) and "qty" in body and body["trade_id"] not in seen:
            seen.add(body["trade_id"])
            out.append(event)
    return out


KEYLESS = """
[[counter]]
name = "all_trades"
topics = ["{topic}"]
kind = "count"
event_id = "trade_id"

[[counter]]
name = "all_shares"
topics = ["{topic}"]
kind = "sum"
value = "qty"
event_id = "trade_id"

[[counter]]
name = "trades_count"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "trade_id"
"""


async def test_counters_without_key_fields_count_fold_and_read_like_any_other(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path
) -> None:
    """Counters with no key fields have one instance, the empty key, beside a keyed counter of the same
    topic: consumers count into it from three partitions, the GC folds their shards into its tally, later
    shards merge with that tally, and get, get_many, explain and list read it; the one string that is not an
    instance key and would alias it is refused."""
    topic = await topic_factory(partitions=3)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(KEYLESS.replace("{topic}", topic))
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    first, truth = make_events(900, symbols=7, duplicates=40, seed=31)
    second, more = make_events(600, symbols=7, duplicates=25, seed=32)

    async def consume(events: list[bytes]) -> None:
        async with running(ConsumerService(settings, load_definitions(counters))):
            await publish(kafka_settings, topic, events)
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))

    await consume(first)
    async with CassandraClient(cassandra_settings) as client:
        await asyncio.sleep(MIN_LIFETIME_US / 1e6 + GRACE_S + 0.5)
        report = await _gc_run(client)
        assert report.instances_folded >= 2 + len(truth.count)  # mutators rotate: an instance may fold twice
        assert await _shards(client, "all_trades", "") == []
    await consume(second)

    total = sum(truth.count.values()) + sum(more.count.values())
    shares = sum(truth.qty.values()) + sum(more.qty.values())
    async with CassandraClient(cassandra_settings) as client:
        reader = CounterReader(client)
        assert await reader.get("all_trades", "") == total
        assert await reader.get_many("all_shares", ["", "S001"]) == {"": shares, "S001": None}
        assert await reader.get("trades_count", "S001") == truth.count["S001"] + more.count["S001"]
        explanation = await reader.explain("all_trades", "")
        assert (explanation.key, explanation.value, explanation.tally) == ("", total, sum(truth.count.values()))
        assert {shard.partition for shard in explanation.shards} == {0, 1, 2}  # the second run's, beside the tally
        assert await reader.list_instances("all_trades") == ([""], None)
        assert (await reader.list_instances("trades_count"))[0] == sorted(truth.count)
        with pytest.raises(MalformedInstanceKeyError):
            await reader.get("all_trades", "\\")
