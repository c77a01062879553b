"""Resets on real Kafka and Cassandra: ``countersink reset`` while a consumer runs, then kill -9 and a takeover
that replays what the dead consumer left: values show only what came after each partition's reset point."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.admin import NewPartitions

from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import make_admin, make_producer
from countersink.reader import CounterReader, read_state
from countersink.resets import read_points, read_resets
from countersink.settings import CassandraSettings, KafkaSettings
from schemas.cql import TALLY_ROW, slice_key
from stack.loading import child_env, end_offsets, wait_until_flushed
from tests.integration.consumer_support import read_topic, start_consumer, wait_until_started

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
SYMBOLS = ("S0", "S1", "S2")
DEFINITIONS = """
[[counter]]
name = "trades"
topics = ["{topic}"]
kind = "count"
key = ["symbol"]
event_id = "id"

[[counter]]
name = "shares"
topics = ["{topic}"]
kind = "sum"
key = ["symbol"]
value = "qty"
event_id = "id"
"""

Event = tuple[str, str, int]  # id, symbol, qty


def _events(prefix: str, n: int) -> list[Event]:
    return [(f"{prefix}{i}", SYMBOLS[i % len(SYMBOLS)], i + 1) for i in range(n)]


async def _publish(kafka: KafkaSettings, topic: str, events: list[Event], partitions: int = PARTITIONS) -> None:
    """Each event to partition (number mod ``partitions``), in order."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        for i, (event_id, symbol, qty) in enumerate(events):
            await producer.send_and_wait(topic, json.dumps({"id": event_id, "symbol": symbol, "qty": qty}).encode(),
                                         partition=i % partitions)
    finally:
        await producer.stop()


def _truth(events: list[Event]) -> dict[tuple[str, str], int]:
    counts: Counter[str] = Counter(symbol for _, symbol, _ in events)
    sums: Counter[str] = Counter()
    for _, symbol, qty in events:
        sums[symbol] += qty
    return {**{("trades", s): counts[s] for s in SYMBOLS}, **{("shares", s): sums[s] for s in SYMBOLS}}


async def _values(cassandra: CassandraSettings) -> dict[tuple[str, str], int]:
    values: dict[tuple[str, str], int] = {}
    async with CassandraClient(cassandra) as client:
        for counter in ("trades", "shares"):
            for symbol in SYMBOLS:
                state = await read_state(client, counter, symbol)
                values[(counter, symbol)] = 0 if state is None else int(state.value())  # type: ignore[call-overload]
    return values


def _reset(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "countersink.cli", "reset", *args], cwd=REPO,
                          env=child_env(kafka, cassandra), capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


async def _flushed(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, topic: str) -> None:
    await wait_until_flushed(cassandra, group, await end_offsets(kafka, {topic: PARTITIONS}), within_s=90)


def _consumer_options(tmp_path: Path, topic: str) -> tuple[str, Path, dict[str, Any]]:
    """A fresh group, the definitions file on ``topic``, and the consumer options of these tests."""
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    return group, counters, {"flush_interval_s": 0.5, "dead_letter_topic": f"dlq-{group}", "group_id": group,
                             "counters_file": counters}


async def test_a_reset_while_consuming_then_kill_9_and_a_takeover_shows_only_later_events(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """A consumer counts events; ``countersink reset trades`` and ``countersink reset shares S1`` run while it
    does. Right after each returns, the instances reset read nothing counted before. More events come; the
    consumer is killed with kill -9 before its last flush commits and a second one takes over, replaying the
    window it left: every value is exactly the events after the reset (trades, shares of S1) or all of them
    (shares of S0 and S2), explain shows the same as get, and so does every value after the GC has folded
    the dead consumer's rows."""
    topic = await topic_factory(partitions=PARTITIONS)
    group, _, options = _consumer_options(tmp_path, topic)
    log = tmp_path / "consumer.log"
    before, after, late = _events("a", 30), _events("b", 24), _events("c", 18)

    first = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, first)
        await _publish(kafka_settings, topic, before)
        await _flushed(kafka_settings, cassandra_settings, group, topic)
        assert await _values(cassandra_settings) == _truth(before)

        whole = json.loads(await asyncio.to_thread(_reset, kafka_settings, cassandra_settings, "trades", "--json"))
        one = await asyncio.to_thread(_reset, kafka_settings, cassandra_settings, "shares", "S1")
        head, *points = one.splitlines()
        assert head.startswith("reset keys 'S1' of shares: epoch 1, id shares.1.")
        assert sorted(points) == [f"  {topic}/0: counts from offset 17 on (control record at 16)",
                                  f"  {topic}/1: counts from offset 17 on (control record at 16)"], one
        assert whole["epoch"] == 1
        listed_resets = json.loads(await asyncio.to_thread(
            _reset, kafka_settings, cassandra_settings, "trades", "--list", "--json"))
        assert [{k: v for k, v in r.items() if k in whole} for r in listed_resets] == [whole]  # as recorded
        assert listed_resets[0]["not_recorded"] == []  # every partition reached
        assert len(listed_resets[0]["request_key"]) == 32  # the command's own idempotency key
        positions = cast(list[dict[str, int]], whole["positions"])
        assert sorted((p["partition"], p["offset"]) for p in positions) == [(0, 15), (1, 15)], whole
        seen = await _values(cassandra_settings)
        async with CassandraClient(cassandra_settings) as client:
            listed = (await CounterReader(client).list_instances("trades"))[0]
            assert (listed, (await CounterReader(client).list_instances("shares"))[0]) == ([], ["S0", "S2"])
        assert all(seen[("trades", s)] == 0 for s in SYMBOLS), seen
        assert seen[("shares", "S1")] == 0, seen
        assert seen[("shares", "S0")] == _truth(before)[("shares", "S0")], seen

        await _publish(kafka_settings, topic, after)
        await _flushed(kafka_settings, cassandra_settings, group, topic)
        await _publish(kafka_settings, topic, late)
    finally:
        first.send_signal(signal.SIGKILL)  # whatever it had applied of ``late`` and not committed is replayed
        first.wait()

    second = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, second)
        await _flushed(kafka_settings, cassandra_settings, group, topic)
        seen = await _values(cassandra_settings)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait()
    everything, since = _truth(before + after + late), _truth(after + late)
    expected = {**everything, **{("trades", s): since[("trades", s)] for s in SYMBOLS},
                ("shares", "S1"): since[("shares", "S1")]}
    assert seen == expected
    async with CassandraClient(cassandra_settings) as client:
        explained = await CounterReader(client).explain("shares", "S1")
        listed = (await CounterReader(client).list_instances("trades"))[0]
    assert explained.value == expected[("shares", "S1")]
    assert listed == list(SYMBOLS)
    # The GC folds the first consumer's rows, cells of both epochs: what it folds of the old one is never read.
    gc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "gc", "--once"], cwd=REPO, capture_output=True,
        env=child_env(kafka_settings, cassandra_settings, gc={"grace_s": 0}), timeout=120, check=False)
    assert gc.returncode == 0, gc.stderr.decode(errors="replace")
    assert b"mutator_collected" in gc.stdout + gc.stderr
    assert await _values(cassandra_settings) == expected
    # Only current epochs were folded: the cells a reset ended were deleted with their rows, unfolded.
    async with CassandraClient(cassandra_settings) as client:
        tallies = {slice_key(row["part"], row["key"]): set(row["tallies"] or {}) for row in as_dicts(
            await client.execute("SELECT part, key, tallies FROM shards WHERE born_us = ? AND mutator = ? "
                                 "ALLOW FILTERING", list(TALLY_ROW)))}
    assert {key: cells - {"trades@1", "shares", "shares@1"} for key, cells in tallies.items()} == {
        s: set() for s in SYMBOLS}, tallies
    assert "shares@1" not in tallies["S0"], tallies
    assert "shares" not in tallies["S1"], tallies
    assert any(tallies.values()), tallies  # something was folded
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    applied = [json.loads(line) for line in text.splitlines() if '"reset_applied"' in line]
    assert {(e["counter"], e["partition"]) for e in applied} == {
        (counter, partition) for counter in ("trades", "shares") for partition in range(PARTITIONS)}, applied


async def test_a_forged_control_record_is_dead_lettered_and_resets_nothing(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """A record carrying the control header with an id no reset was recorded under (or no reset id at all)
    changes no value and goes to the dead-letter topic."""
    topic = await topic_factory(partitions=PARTITIONS)
    group = f"g{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace("{topic}", topic))
    log = tmp_path / "consumer.log"
    events = _events("a", 12)
    process = start_consumer(kafka_settings, cassandra_settings, log, flush_interval_s=0.5,
                             dead_letter_topic=f"dlq-{group}", group_id=group, counters_file=counters)
    try:
        await wait_until_started(log, process)
        await _publish(kafka_settings, topic, events[:6])
        producer = make_producer(kafka_settings)
        await producer.start()
        try:
            sent = []
            for partition in range(PARTITIONS):
                # An epoch of digits int() reads but no reset id has (a superscript two) was a ValueError out of
                # the consumer's look-up: the partition stopped on the record at every start.
                for forged in (b"trades.1.forged", "trades.\u00b2.forged".encode()):
                    sent.append(await producer.send_and_wait(topic, b"{}", partition=partition,
                                                             headers=[("countersink.control", forged)]))
        finally:
            await producer.stop()
        await _publish(kafka_settings, topic, events[6:])
        await _flushed(kafka_settings, cassandra_settings, group, topic)
        assert await _values(cassandra_settings) == _truth(events)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    letters = await read_topic(kafka_settings, f"dlq-{group}", at_least=2 * PARTITIONS, within_s=20)
    assert len(letters) == 2 * PARTITIONS
    # trace says what the consumer did with one: dead-lettered as forged, for every counter (it routed the
    # record's value as an event: "counted", or a retry).
    traced = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "trace", "--json", "--topic", topic, "--offset",
                         f"{sent[0].partition}:{sent[0].offset}"], cwd=REPO, capture_output=True, text=True,
        env=child_env(kafka_settings, cassandra_settings, consumer={"dead_letter_topic": f"dlq-{group}",
                                                                    "group_id": group}), timeout=120)
    assert traced.returncode == 0, traced.stderr
    record = next(json.loads(line) for line in traced.stdout.splitlines() if line.startswith("{"))
    assert {c["outcome"] for c in record["counters"]} == {"dead_lettered"}, record
    assert all("ForgedControlError" in c["reason"] and c["dead_letter"] for c in record["counters"]), record
    assert all(dict(r.headers).get("countersink.error") == b"ForgedControlError" for r in letters), [
        r.headers for r in letters]


async def test_a_partition_added_after_a_reset_counts_all_it_holds(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """A reset records how many partitions the counter's topics have: a partition added later got no control
    record, and everything in it counts (it holds nothing from before the reset)."""
    topic = await topic_factory(partitions=1)
    group, _, options = _consumer_options(tmp_path, topic)
    log = tmp_path / "consumer.log"
    process = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, process)
        await _publish(kafka_settings, topic, [(f"a{i}", "S0", 1) for i in range(5)], partitions=1)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 1}), within_s=90)
        await asyncio.to_thread(_reset, kafka_settings, cassandra_settings, "trades")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    admin = make_admin(kafka_settings)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=2)})
    finally:
        await admin.close()
    await _publish(kafka_settings, topic, [(f"b{i}", "S0", 1) for i in range(6)], partitions=2)
    process = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, process)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 2}), within_s=90)
        seen = await _values(cassandra_settings)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert (seen[("trades", "S0")], seen[("shares", "S0")]) == (6, 11)


async def test_a_reset_reaches_a_topic_the_counter_was_given_after_it_was_first_recorded(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], tmp_path: Path,
) -> None:
    """The counter is recorded on one topic, then given a second. The reset publishes its control records to
    both (the registry's record gains the second when a consumer with it starts): the second's events after the
    reset count, in the reset's epoch. Before, they were written in the old epoch, which no reader reads."""
    first, second = await topic_factory(partitions=1), await topic_factory(partitions=1)
    group, counters, options = _consumer_options(tmp_path, first)
    log = tmp_path / "consumer.log"
    process = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, process)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    counters.write_text(DEFINITIONS.replace('"{topic}"', f'"{first}", "{second}"'))
    process = start_consumer(kafka_settings, cassandra_settings, log, **options)
    try:
        await wait_until_started(log, process)
        await _publish(kafka_settings, second, [(f"a{i}", "S0", 1) for i in range(4)], partitions=1)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {first: 1, second: 1}),
                                 within_s=90)
        assert (await _values(cassandra_settings))[("trades", "S0")] == 4
        printed = await asyncio.to_thread(_reset, kafka_settings, cassandra_settings, "trades", "--json")
        assert {(p["topic"], p["partition"]) for p in json.loads(printed)["positions"]} == {(first, 0), (second, 0)}
        await _publish(kafka_settings, second, [(f"b{i}", "S0", 10) for i in range(3)], partitions=1)
        await _publish(kafka_settings, first, [(f"c{i}", "S0", 100) for i in range(2)], partitions=1)
        await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {first: 1, second: 1}),
                                 within_s=90)
        seen = await _values(cassandra_settings)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert (seen[("trades", "S0")], seen[("shares", "S0")]) == (5, 234)  # trades: 3 + 2 after the reset; shares: all


async def test_a_keyspace_made_before_resets_reads_as_before(cassandra_settings: CassandraSettings) -> None:
    """Reads of a keyspace whose schema predates resets (no ``resets`` table until ``countersink schema``
    runs) work as before: no reset is recorded there."""
    async with CassandraClient(cassandra_settings) as client:
        await client.execute("DROP TABLE resets", prepared=False)
        assert await read_state(client, "trades", "S0") is None
        assert (await CounterReader(client).list_instances("trades"))[0] == []


async def test_a_reset_of_a_counter_whose_topic_kafka_does_not_know_records_nothing(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """A reset whose control records could reach none of the counter's topics would reset nothing: the
    command refuses (exit 1, one line) before recording anything, without waiting out Kafka's request timeout
    (set here beyond the command's allowed run). A topic the counter was once given and that Kafka no longer
    has (the registry keeps it) does not stop the reset of the others: the reset names only the topics that
    exist, says which it did not reach, and a topic made under that name later counts in the reset's epoch."""
    from countersink.registry import CounterRegistry
    from schemas.definitions import parse_definitions

    gone = f"gone-{os.urandom(4).hex()}"
    env = {**child_env(kafka_settings, cassandra_settings), "COUNTERSINK_KAFKA__REQUEST_TIMEOUT_MS": "300000"}
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace("{topic}", gone)), "test",
                                               "resetting-group")
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "reset", "trades"], cwd=REPO, capture_output=True,
        env=env, timeout=120, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"Kafka knows no partition of {gone}: nothing was reset".encode() in done.stderr
    async with CassandraClient(cassandra_settings) as client:
        assert as_dicts(await client.execute("SELECT * FROM resets")) == []

    # The counter given a topic that exists too (a consumer of a later file added it to the record).
    topic = await topic_factory(partitions=2)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace('"{topic}"', f'"{topic}"')),
                                               "test", "resetting-group")
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "reset", "trades"], cwd=REPO, capture_output=True,
        env=env, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert b"reset_topics_absent" in done.stderr
    assert gone.encode() in done.stderr
    async with CassandraClient(cassandra_settings) as client:
        (recorded,) = await read_resets(client, "trades")
        assert dict(recorded.partitions) == {topic: 2}
        assert (recorded.born_after(topic, 1), recorded.born_after(gone, 0)) == (False, True)
        points = await read_points(client, "trades", recorded.epoch, dict(recorded.partitions),
                                   reset_id=recorded.reset_id)
    assert sorted(points) == [(topic, 0), (topic, 1)]

    # Not listed to this command but counted by a live mutator of the counter's group (a grant its Kafka user
    # lacks hides a topic from its listing): refused, nothing recorded; the skip would leave that mutator counting
    # in the old epoch until it next starts.
    import uuid

    async with CassandraClient(cassandra_settings) as client:
        group = (await CounterRegistry(client).record("trades") or {}).get("consumer_group")
        assert group is not None
        owner = uuid.uuid4()
        await client.execute("INSERT INTO mutators (id, consumer_group, topic, partition, born_us, expires_us) "
                             "VALUES (?, ?, ?, 0, 0, ?)", [owner, group, gone, (int(time.time()) + 600) * 10**6])
        await client.execute("INSERT INTO partitions (consumer_group, topic, partition, owner) VALUES (?, ?, 0, ?)",
                             [group, gone, owner])
    hidden = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "countersink.cli", "reset", "trades"], cwd=REPO, capture_output=True,
        env=env, timeout=120, check=False)
    assert hidden.returncode == 1, (hidden.stdout, hidden.stderr)
    assert f"Kafka lists no partition of {gone} to this command, but live consumers count it".encode() in (
        hidden.stderr)
    async with CassandraClient(cassandra_settings) as client:
        assert len(await read_resets(client, "trades")) == 1


async def test_a_reset_of_a_bucketed_counter_by_a_key_naming_no_bucket_is_refused(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
) -> None:
    """``reset hourly a`` (no bucket), or a time that starts no bucket: exit 2 naming a key to reset, nothing
    recorded; it recorded a reset of an instance that cannot exist and exited 0, the bucket untouched."""
    from countersink.registry import CounterRegistry
    from schemas.definitions import parse_definitions

    hourly = parse_definitions('[[counter]]\nname = "hourly"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\n'
                               'bucket = { field = "ts", size = "1h" }\n')
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(hourly, "test")
    for key in ("a", "a|2026-11-27T09:17Z"):
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "countersink.cli", "reset", "hourly", key], cwd=REPO,
            capture_output=True, env=child_env(kafka_settings, cassandra_settings), timeout=120, check=False)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert b"keeps an instance per 1h bucket" in done.stderr
        assert b": reset 'a|" in done.stderr
    async with CassandraClient(cassandra_settings) as client:
        assert as_dicts(await client.execute("SELECT * FROM resets")) == []
    # explain refuses the keys get refuses (it answered "(no state)", exit 0), and reset --list a name the registry
    # lacks (it answered "no reset of ... is recorded", exit 0).
    for command in (["explain", "hourly", "a"], ["explain", "hourly", "a|b|c"], ["reset", "houryl", "--list"]):
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "countersink.cli", *command], cwd=REPO,
            capture_output=True, env=child_env(kafka_settings, cassandra_settings), timeout=120, check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert (b"unknown_counter" if "houryl" in command else b"usage_refused") in done.stderr, done.stderr


@pytest.mark.parametrize("signals", [1, 2])
async def test_a_signal_once_a_reset_is_recorded_lets_it_finish_and_a_second_says_how_to_complete_it(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory,
    monkeypatch: pytest.MonkeyPatch, signals: int,
) -> None:
    """Ctrl-C (or SIGTERM) after the reset is recorded and before its control records are out: the command
    exited 130 saying nothing, and the reset's keys read nothing of their new events until someone found its
    idempotency key in Cassandra. One signal now lets it finish (printed as any reset); a second stops it with
    the command that completes it, and ``--list`` says which partitions it did not reach."""
    from structlog.testing import capture_logs

    from countersink import resets
    from countersink.registry import CounterRegistry
    from countersink.reset_cli import list_resets, reset
    from countersink.settings import Settings
    from schemas.definitions import parse_definitions

    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace("{topic}", topic)), "test")
    publish = resets.publish_controls

    async def interrupted_publish(*args: object, **kwargs: object) -> object:
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.1)
        return await publish(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(resets, "publish_controls", interrupted_publish)
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings)
    printed: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    with capture_logs() as logs:
        code = await reset(settings, "trades", ["S0"], request_key="k" * 32)
    events = [entry["event"] for entry in logs]
    assert "reset_finishing" in events
    if signals == 1:
        assert code == 0
        assert printed[0].startswith("reset keys 'S0' of trades: epoch 1")
        assert len(printed) == 1 + PARTITIONS  # a line per partition's control record
        return
    assert code == 130
    failed = next(entry for entry in logs if entry["event"] == "reset_failed")
    assert f"countersink reset trades --idempotency-key {'k' * 32} -- S0" in failed["next_step"]
    printed.clear()
    await list_resets(settings, "trades")
    assert any(line.startswith("  incomplete: no control record recorded in ") and "--idempotency-key" in line
               for line in printed), printed


async def _resets_cut_after_one_partition(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, Any, Any]:
    """A topic of PARTITIONS partitions with DEFINITIONS' counters registered, and resets whose control records
    reach its first partition only (the broker then "goes away"): the topic, the settings, and the real
    ``publish_controls`` (to put back)."""
    from countersink import resets
    from countersink.registry import CounterRegistry
    from countersink.settings import Settings
    from schemas.definitions import parse_definitions

    topic = await topic_factory(partitions=PARTITIONS)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS.replace("{topic}", topic)), "test")
    publish = resets.publish_controls

    async def one_then_away(reset: object, partitions: list[tuple[str, int]], *args: object) -> object:
        await publish(reset, partitions[:1], *args)  # type: ignore[arg-type]
        raise OSError("the broker went away")

    monkeypatch.setattr(resets, "publish_controls", one_then_away)
    return topic, Settings(kafka=kafka_settings, cassandra=cassandra_settings), publish


async def test_a_reset_cut_short_says_how_to_complete_it_and_its_key_completes_it(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``countersink reset`` cut short after recording the reset (its control record out to one partition of
    two) exits 1 naming the epoch and the command that completes it; that command (its idempotency key)
    publishes the rest and prints the same reset. One that fails only while recording where its control
    records landed took effect: printed, exit 0, with a warning."""
    from structlog.testing import capture_logs

    from countersink import reset_cli, resets
    from countersink.cassandra import CassandraUnavailableError

    _, settings, publish = await _resets_cut_after_one_partition(kafka_settings, cassandra_settings,
                                                                 topic_factory, monkeypatch)
    cut = await reset_cli.reset(settings, "shares", ["S1"], as_json=True, request_key="cut-1")
    said = capsys.readouterr()
    monkeypatch.setattr(resets, "publish_controls", publish)
    completed = await reset_cli.reset(settings, "shares", ["S1"], as_json=True, request_key="cut-1")
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with capture_logs() as reused_logs:  # the key given again with other keys: a usage error, nothing recorded
        reused = await reset_cli.reset(settings, "shares", ["S2"], as_json=True, request_key="cut-1")
    capsys.readouterr()

    async def positions_lost(*_: object) -> None:
        raise CassandraUnavailableError("no host answered")

    monkeypatch.setattr(resets.CassandraResets, "record_positions", positions_lost)
    took = await reset_cli.reset(settings, "trades", [], as_json=True, request_key="whole-1")
    warned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert cut == 1
    log = said.out + said.err
    assert "countersink reset shares --idempotency-key cut-1 -- S1" in log, log
    assert "published to 1 of 2 partitions" in log
    assert completed == 0
    assert (done["epoch"], done["keys"]) == (1, ["S1"])  # the reset recorded by the attempt cut short
    assert reused == 2
    assert "with other keys" in next(e["error"] for e in reused_logs if e["event"] == "usage_refused")
    assert sorted(p["partition"] for p in done["positions"]) == [0, 1]
    async with CassandraClient(cassandra_settings) as client:
        assert len(as_dicts(await client.execute("SELECT * FROM resets WHERE counter = 'shares'"))) == 1
    assert took == 0
    assert warned["epoch"] == 1
    assert sorted(p["partition"] for p in warned["positions"]) == [0, 1]
    assert "the reset took effect" in warned["warning"]


async def test_requests_with_one_idempotency_key_at_once_record_one_reset(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Callable[..., Awaitable[str]],
) -> None:
    """Three requests with one key at once (a client retrying one it gave up waiting for, serve replicas): one
    reset is recorded, and each answers it; every partition has its control record. A request recorded just
    before another reads it; two racing for one epoch, the loser reads the winner's key."""
    from countersink.registry import CounterRegistry
    from countersink.resets import reset_counter
    from countersink.settings import Consistency
    from schemas.definitions import parse_definitions

    topic = await topic_factory(partitions=PARTITIONS)
    definitions = parse_definitions(DEFINITIONS.replace("{topic}", topic))
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(definitions, "test")
        done = await asyncio.gather(*(reset_counter(client, kafka_settings, definitions["trades"], [], f"r{i}",
                                                    Consistency.QUORUM, Consistency.QUORUM, request_key="once")
                                      for i in range(3)))
        rows = as_dicts(await client.execute("SELECT * FROM resets WHERE counter = 'trades'"))
    assert [row["epoch"] for row in rows] == [1]
    assert {d.reset.epoch for d in done} == {1}
    assert {d.reset.reset_id for d in done} == {rows[0]["id"]}
    published = {(p.topic, p.partition) for d in done for p in d.positions}
    assert sorted(published) == [(topic, p) for p in range(PARTITIONS)]


async def test_a_reset_cut_short_then_covered_by_a_later_one_is_not_completed(
    kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings,
    topic_factory: Callable[..., Awaitable[str]], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A reset of S1 cut short (its control record out to one partition of two), then a reset of every key:
    the first one's key publishes nothing more and says it was superseded (its control records would change no
    value, where it printed positions from which nothing counted); --list says so instead of the command."""
    from countersink import reset_cli, resets

    topic, settings, publish = await _resets_cut_after_one_partition(kafka_settings, cassandra_settings,
                                                                     topic_factory, monkeypatch)
    assert await reset_cli.reset(settings, "shares", ["S1"], as_json=True, request_key="early-1") == 1
    monkeypatch.setattr(resets, "publish_controls", publish)
    assert await reset_cli.reset(settings, "shares", [], as_json=True, request_key="whole-2") == 0
    capsys.readouterr()
    assert await reset_cli.reset(settings, "shares", ["S1"], as_json=True, request_key="early-1") == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (done["epoch"], done["superseded_by"]) == (1, 2)
    assert done["positions"] == []  # none published (the attempt cut short recorded none either)
    assert await reset_cli.reset(settings, "shares", ["S1"], request_key="early-1") == 0
    assert "superseded by epoch 2, which resets every key it does: nothing to complete" in capsys.readouterr().out
    assert await reset_cli.list_resets(settings, "shares") == 0
    listed = capsys.readouterr().out
    assert "superseded by epoch 2" in listed, listed
    assert "complete it with" not in listed, listed
    async with CassandraClient(cassandra_settings) as client:
        (first,) = [r for r in await resets.read_resets(client, "shares") if r.epoch == 1]
        points = await resets.read_points(client, "shares", 1, {topic: PARTITIONS}, reset_id=first.reset_id)
    assert points == {}
