"""A counter's life on real Kafka and Cassandra: one consumer group per keyspace, and dropping a counter while a
consumer still counts it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from consumer.service import ConsumerService
from countersink import registry as registry_module
from countersink.cassandra import CassandraClient, as_dicts
from countersink.registry import CounterRegistry
from countersink.serve import ReadApi
from countersink.settings import CassandraSettings, ConsumerSettings, KafkaSettings, ServeSettings, Settings
from schemas.cql import TALLY_ROW, shard_slice, slice_key
from schemas.definitions import load_definitions, parse_definitions
from schemas.errors import CounterDroppedError, GroupMismatchError
from schemas.resets import split_cell
from stack.loading import child_env, end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import make_events, read_values, running, write_definitions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _settings(kafka: KafkaSettings, cassandra: CassandraSettings, group: str, counters: Path, **consumer: object
              ) -> Settings:
    options: dict[str, object] = {"dead_letter_topic": f"dlq-{group}", "flush_interval_s": 0.3,
                                  "session_timeout_ms": 6000, "health_port": 0, "registry_check_s": 1.0,
                                  **consumer}
    return Settings(kafka=kafka, cassandra=cassandra,
                    consumer=ConsumerSettings(group_id=group, counters_file=counters, **options))


def _cli(kafka: KafkaSettings, cassandra: CassandraSettings, *args: str, gc: dict[str, object] | None = None,
         **consumer: object) -> subprocess.CompletedProcess[str]:
    env = child_env(kafka, cassandra, consumer={"health_port": 0, **consumer}, gc={"health_port": 0, **(gc or {})})
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def _logged(stderr: str, event: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if f'"{event}"' in line]


async def _stored(cassandra: CassandraSettings, counter: str) -> int:
    """Shard cells and tallies of ``counter``, of every epoch, in the whole table."""
    async with CassandraClient(cassandra) as client:
        result = await client.execute("SELECT tallies, states FROM shards", page_size=100_000)
        rows = as_dicts(result)
        assert not result.has_more_pages()
    return sum(split_cell(cell)[0] == counter for row in rows for cells in (row["tallies"], row["states"])
               for cell in cells or ())


async def test_a_second_consumer_group_is_refused_with_one_line(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path) -> None:
    """While group A counts a keyspace, ``countersink consume --group B`` on the same counters exits 2 with one
    line naming the recorded group and what to do; group A itself starts again."""
    topic = await topic_factory(partitions=3)
    group = f"a{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    async with running(ConsumerService(settings, load_definitions(counters))):
        other = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "consume", "--counters",
                                        str(counters), "--group", "b-group")
    assert other.returncode == 2, other.stderr
    errors = [line for line in other.stderr.splitlines() if '"error"' in line and '"level": "error"' in line]
    assert len(errors) == 1, other.stderr
    refused = json.loads(errors[0])
    assert refused["event"] == "group_refused"
    assert f"by consumer group {group!r}" in refused["error"]
    assert f"--group {group}" in refused["error"]
    assert "'trades_count', 'shares_traded', 'notional'" in refused["error"]
    assert "Traceback" not in other.stderr
    # The recorded group starts (and is not refused) on the same keyspace.
    async with running(ConsumerService(settings, load_definitions(counters))):
        pass


async def test_a_keyspace_from_before_groups_adopts_the_first_group_that_starts(
        cassandra_settings: CassandraSettings) -> None:
    """A keyspace whose registry table lacks the group and drop columns gets them from ``ensure_schema``; its
    counters, recorded with no group, take the group of the first consumer that registers, and another group
    is then refused."""
    definitions = parse_definitions('[[counter]]\nname = "volume"\ntopics = ["t"]\nkind = "sum"\nkey = "s"\n'
                                    'value = "q"\n', "a.toml")
    async with CassandraClient(cassandra_settings) as client:
        await client.execute("ALTER TABLE counters DROP (consumer_group, dropped_us, dropped_by)", prepared=False)
        await client.execute("INSERT INTO counters (name, kind, fingerprint, definition) VALUES (?, ?, ?, ?)",
                             ["volume", "sum", "old", definitions["volume"].model_dump_json(exclude_none=True)])
        assert not await client.schema_complete()
        await client.ensure_schema()
        assert await client.schema_complete()
        registry = CounterRegistry(client)
        with capture_logs() as logs:
            await registry.register(definitions, "host-a", "first")
        assert [entry["group"] for entry in logs if entry["event"] == "counter_group_adopted"] == ["first"]
        await registry.register(definitions, "host-b", "first")
        with pytest.raises(GroupMismatchError) as info:
            await registry.register(definitions, "host-c", "second")
        assert info.value.groups == {"first": ("volume",)}
        # Refused for one counter, a consumer records none of its new ones for its group.
        with_new = parse_definitions('[[counter]]\nname = "volume"\ntopics = ["t"]\nkind = "sum"\nkey = "s"\n'
                                     'value = "q"\n\n[[counter]]\nname = "fresh"\ntopics = ["t"]\nkind = "count"\n'
                                     'key = "s"\n', "b.toml")
        with pytest.raises(GroupMismatchError):
            await registry.register(with_new, "host-c", "second")
        assert await registry.record("fresh") is None
        # Groups that cannot overlap: another group may count other counters in the same keyspace.
        await registry.register(parse_definitions('[[counter]]\nname = "fresh"\ntopics = ["t"]\nkind = "count"\n'
                                                  'key = "s"\n', "c.toml"), "host-e", "second")
        assert await registry.groups() == {"volume": "first", "fresh": "second"}
        await registry.register(definitions, "host-d", "second", backfill={"volume"})  # a declared backfill


async def test_drop_while_a_consumer_counts_deletes_the_rows_and_the_consumer_never_writes_them_back(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``countersink drop shares_traded`` while a consumer holding its definition runs: every cell and tally
    of it is deleted, the consumer refuses it at its next registry check and writes none of it again (more
    events, flushes, its final release), the other counters stay exact, a restart with the old definitions
    is refused, and ``--forget`` releases the name."""
    topic = await topic_factory(partitions=3)
    group = f"d{os.urandom(4).hex()}"
    counters = write_definitions(tmp_path, topic)
    settings = _settings(kafka_settings, cassandra_settings, group, counters)
    first, truth = make_events(900, duplicates=30, seed=5)
    # New keys after the drop: rows no delete covers, so only the consumer's refusal keeps them unwritten.
    more, more_truth = make_events(600, duplicates=20, seed=6)
    more = [event.replace(b'"symbol": "S', b'"symbol": "N') for event in more]
    for field in (more_truth.count, more_truth.qty, more_truth.notional):
        for symbol in list(field):
            field["N" + symbol[1:]] = field.pop(symbol)
    await publish(kafka_settings, topic, first)
    monkeypatch.setattr(registry_module, "REFRESH_S", 0.2)  # a serving registry copy, read again after 0.2 s
    reads = CassandraClient(cassandra_settings)
    await reads.start()
    api = ReadApi(reads, ServeSettings(), registry=CounterRegistry(reads))
    http = TestClient(TestServer(api.app()))
    await http.start_server()
    with capture_logs() as logs:
        async with running(ConsumerService(settings, load_definitions(counters))):
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
            # A reset first: the consumer then writes the counter's epoch-1 cells (shares_traded@1), which its
            # refusal of the dropped counter let through (it compared cell names with the counter's name).
            reset = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "reset", "shares_traded")
            assert reset.returncode == 0, reset.stderr
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
            assert await _stored(cassandra_settings, "shares_traded") > 0
            assert (await http.get("/counters/shares_traded/S001")).status == 200
            dropped = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "shares_traded",
                                              "--yes", "--batch", "7", registry_check_s=1.0)
            assert dropped.returncode == 0, dropped.stderr
            assert "deleted" in dropped.stdout, dropped.stdout
            assert "the name stays refused" in dropped.stdout, dropped.stdout
            assert len(_logged(dropped.stderr, "drop_progress")) > 1  # a page of 7 rows at a time
            assert await _stored(cassandra_settings, "shares_traded") == 0
            await asyncio.sleep(0.3)
            assert (await http.get("/counters/shares_traded/S001")).status == 404  # serve forgets the name
            assert (await http.get("/counters/trades_count/S001")).status == 200
            await http.close()
            await reads.stop()
            await publish(kafka_settings, topic, more)
            await wait_until_flushed(cassandra_settings, group, await end_offsets(kafka_settings, {topic: 3}))
            assert await _stored(cassandra_settings, "shares_traded") == 0
    refusals = [entry for entry in logs if entry["event"] == "counter_dropped"]
    assert [entry["counter"] for entry in refusals] == ["shares_traded"]
    assert await _stored(cassandra_settings, "shares_traded") == 0  # nor by the release at the stop
    both = dataclasses.replace(truth, count=truth.count + more_truth.count,
                               notional=defaultdict(Decimal, {**truth.notional, **more_truth.notional}))
    values = await read_values(cassandra_settings, both)
    assert values["trades_count"] == dict(both.count)
    assert values["notional"] == dict(both.notional)
    assert set(values["shares_traded"].values()) == {None}
    # The GC folds the mutators that wrote the counter before the drop (retired after it): nothing of it
    # comes back into a tally, and the other counters keep their values.
    folded = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "gc", "--once", "--json",
                                     gc={"grace_s": 0})
    assert folded.returncode == 0, folded.stderr
    assert json.loads(folded.stdout.splitlines()[-1])["instances_folded"] > 0
    assert await _stored(cassandra_settings, "shares_traded") == 0
    assert await read_values(cassandra_settings, both) == values

    with pytest.raises(CounterDroppedError, match="was dropped from keyspace"):
        await ConsumerService(settings, load_definitions(counters)).start()
    again = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "consume", "--counters", str(counters),
                                    "--group", group)
    assert again.returncode == 2, again.stderr
    assert [entry["event"] for entry in _logged(again.stderr, "counter_dropped")] == ["counter_dropped"]
    unknown = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "get", "shares_traded", "S001")
    assert unknown.returncode == 2

    forgotten = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "shares_traded", "--yes",
                                        "--forget", registry_check_s=1.0)
    assert forgotten.returncode == 0, forgotten.stderr
    assert "name released" in forgotten.stdout
    async with CassandraClient(cassandra_settings) as client:
        assert await CounterRegistry(client).record("shares_traded") is None
        await CounterRegistry(client).register(load_definitions(counters), "host", group)  # the name is free


async def test_drop_of_an_unknown_counter_or_without_yes_exits_2(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings) -> None:
    """``drop`` of a name the registry lacks, or without ``--yes``, or on a keyspace whose registry has no drop
    marker yet, changes nothing and exits 2."""
    unconfirmed = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "volume")
    assert unconfirmed.returncode == 2
    assert "--yes" in _logged(unconfirmed.stderr, "drop_not_confirmed")[0]["error"]  # type: ignore[operator]
    unknown = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "volume", "--yes")
    assert unknown.returncode == 2, unknown.stderr
    assert _logged(unknown.stderr, "unknown_counter")
    async with CassandraClient(cassandra_settings) as client:
        await client.execute("ALTER TABLE counters DROP (dropped_us)", prepared=False)
    outdated = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "volume", "--yes")
    assert outdated.returncode == 2, outdated.stderr
    assert "run countersink schema first" in _logged(outdated.stderr, "schema_outdated")[0]["error"]  # type: ignore[operator]


async def test_drop_deletes_every_epoch_and_forget_its_resets_so_the_name_starts_empty(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """A counter reset twice holds cells and a tally in epochs 1 and 2 besides its own. ``drop`` deleted the
    epoch-0 ones alone, and ``--forget`` left its resets: defined again under the name, its reset keys read the old
    epochs' values back. Now every epoch's cells and tallies go, and the resets with ``--forget``; counters whose
    names start with the dropped one's are untouched."""
    from consumer.cassandra_store import CassandraStore
    from consumer.storage import ShardWrite
    from countersink.reader import CounterReader
    from schemas.kinds import KindSpec, new_state

    counters = tmp_path / "counters.toml"
    counters.write_text("".join(f'[[counter]]\nname = "{name}"\ntopics = ["t"]\nkind = "count"\nkey = ["k"]\n\n'
                                for name in ("hits", "hits2", "hits_a")))

    def one() -> bytes:
        state = new_state(KindSpec("count"))
        state.apply(1)
        return state.to_bytes()

    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(load_definitions(counters), "host", "g")
        store = CassandraStore(client)
        cells = ("hits", "hits@1", "hits@2", "hits2", "hits_a", "hits2@1")
        await store.write_shards(uuid.uuid4(), 1_000, 1_001,
                                 [ShardWrite(cell, key, one(), 1, True) for cell in cells for key in ("a", "b")],
                                 source=b"src")
        for cell in ("hits@1", "hits2@1"):
            await client.execute("UPDATE shards SET tallies[?] = ? WHERE part = ? AND key = ? AND born_us = ? "
                                 "AND mutator = ?", [cell, one(), *shard_slice("a"), *TALLY_ROW])
        for epoch in (1, 2):
            await client.execute("INSERT INTO resets (counter, epoch, id, keys) VALUES (?, ?, ?, ?)",
                                 ["hits", epoch, f"hits.{epoch}.x", {"a"}])
            await client.execute("INSERT INTO reset_positions (topic, partition, counter, epoch, offset) "
                                 "VALUES ('t', 0, 'hits', ?, ?)", [epoch, epoch])
        await client.execute("INSERT INTO resets (counter, epoch, id, keys) VALUES ('hits2', 1, 'hits2.1.x', {'a'})")

    dropped = await asyncio.to_thread(_cli, kafka_settings, cassandra_settings, "drop", "hits", "--yes", "--forget",
                                      registry_check_s=0.1)
    assert dropped.returncode == 0, dropped.stderr
    assert "deleted 6 shard cells and 1 tallies in 2 keys" in dropped.stdout, dropped.stdout
    assert "deleted its 2 resets" in dropped.stdout, dropped.stdout
    async with CassandraClient(cassandra_settings) as client:
        rows = as_dicts(await client.execute("SELECT part, key, born_us, tallies, states FROM shards",
                                             page_size=10_000))
        kept = {(slice_key(row["part"], row["key"]), cell) for row in rows if row["born_us"] < 2**62
                for cell in row["states"] or ()}
        assert kept == {(key, cell) for key in ("a", "b") for cell in ("hits2", "hits_a", "hits2@1")}
        assert {cell for row in rows for cell in row["tallies"] or ()} == {"hits2@1"}
        assert as_dicts(await client.execute("SELECT epoch FROM resets WHERE counter = 'hits'")) == []
        assert as_dicts(await client.execute("SELECT counter FROM reset_positions WHERE topic = 't' AND "
                                             "partition = 0")) == []
        assert len(as_dicts(await client.execute("SELECT epoch FROM resets WHERE counter = 'hits2'"))) == 1
        await CounterRegistry(client).register(load_definitions(counters), "host", "g")  # defined anew
        reader = CounterReader(client)
        assert await reader.get("hits", "a") is None  # epoch 2's cell, read back before
        assert await reader.get("hits2", "a") == 2  # its reset epoch's tally and cell

        # A position of the forgotten epoch 1 written late (a consumer of the old definitions meeting its control
        # record again in a replay), then the new counter's own epoch 1, whose control record is further on: the
        # old one's position placed the new reset at offset 5, and a mutator starting at 10 took it as applied.
        from countersink.resets import CassandraResets, read_point
        from schemas.resets import ResetPosition

        book = CassandraResets(client, cassandra_settings.replay_read_consistency, cassandra_settings.write_consistency)
        await book.record_positions([ResetPosition("hits.1.x", "hits", 1, "t", 0, 5)])
        await client.execute("INSERT INTO resets (counter, epoch, id, keys, partitions) VALUES (?, ?, ?, ?, ?)",
                             ["hits", 1, "hits.1.y", {"a"}, {"t": 1}])
        await book.record_positions([ResetPosition("hits.1.y", "hits", 1, "t", 0, 40)])
        assert await read_point(client, "hits", 1, "t", 0, reset_id="hits.1.y") == 40
        assert (await book.epochs_at("t", 0, ["hits"], 10)).epoch("hits", "a") == 0
        assert (await book.epochs_at("t", 0, ["hits"], 41)).epoch("hits", "a") == 1
