"""Reading counters: typed values, explain, list, and the command line, on real Cassandra."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

import countersink.reader as reader_module
from consumer.cassandra_store import CassandraStore
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient
from countersink.reader import CounterReader
from countersink.settings import CassandraSettings
from schemas.kinds import KindSpec, new_state
from tests.integration.serve_support import running_serve

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


async def _two_shards(client: CassandraClient) -> tuple[uuid.UUID, uuid.UUID]:
    """Two mutators of two partitions, each holding part of ``notional`` for key IBM."""
    store = CassandraStore(client)
    ids = []
    for partition, amounts in ((0, ["10.25", "0.10"]), (1, ["5.05"])):
        record = MutatorEntry(uuid.uuid4(), "g", "trades", partition, "test", 1_000_000, 9_000_000)
        await store.register_mutator(record)
        await store.create_partition(PartitionId("g", "trades", partition), record.id, record.born_us, 41)
        state = new_state(KindSpec("sum", number="decimal"))
        for amount in amounts:
            state.apply(Decimal(amount))
        write = ShardWrite("notional", "IBM", state.to_bytes(), 42, True)
        await store.write_shards(record.id, record.born_us, record.born_us + 1, [write], source=b"test")
        ids.append(record.id)
    return ids[0], ids[1]


async def test_get_explain_and_list(cassandra_settings: CassandraSettings) -> None:
    """get merges every shard exactly (Decimal), explain names each shard's mutator and partition, list
    finds the instance, and an instance never counted reads as None."""
    async with CassandraClient(cassandra_settings) as client:
        first, second = await _two_shards(client)
        reader = CounterReader(client)
        assert await reader.get("notional", "IBM") == Decimal("15.40")
        assert await reader.get_many("notional", ["IBM", "MSFT"]) == {"IBM": Decimal("15.40"), "MSFT": None}
        explanation = await reader.explain("notional", "IBM")
        assert explanation.kind == "sum"
        assert (explanation.value, explanation.tally) == (Decimal("15.40"), None)
        assert {(s.mutator, s.topic, s.partition, s.through_offset, s.value) for s in explanation.shards} == {
            (first, "trades", 0, 42, Decimal("10.35")), (second, "trades", 1, 42, Decimal("5.05"))}
        assert len(explanation.partitions) == 2
        keys, page = await reader.list_instances("notional")
        assert (keys, page) == (["IBM"], None)


@pytest.mark.parametrize("lookahead_rows", [100, 2])
async def test_list_pages_through_every_key_a_limit_at_a_time(cassandra_settings: CassandraSettings,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              lookahead_rows: int) -> None:
    """list_instances returns at most ``limit`` keys and a page token; following the tokens yields every key
    of the counter exactly once, though each key has several rows (three mutators) and counters share keys,
    and none that only another counter has; a page token is offered only when another key follows."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        for _ in range(3):
            await store.write_shards(uuid.uuid4(), 0, 1, [ShardWrite(counter, f"k{i:02d}", b"\x02\x01\x01", 0, True)
                                                          for counter in ("likes", "views") for i in range(23)],
                                     source=b"test")
        await store.write_shards(uuid.uuid4(), 0, 1, [ShardWrite("views", f"v{i:02d}", b"\x02\x01\x01", 0, True)
                                                      for i in range(9)], source=b"test")
        # Keys of an hour's bucket share a few partitions (schemas.cql.shard_slice), each key a slice of them.
        hour = "2026-11-22T10:00Z"
        await store.write_shards(uuid.uuid4(), 0, 1, [ShardWrite(counter, f"b{i:02d}|{hour}", b"\x02\x01\x01", 0, True)
                                                      for counter in ("likes", "views") for i in range(12)],
                                 source=b"test")
        # A look-ahead of two rows a request crosses other keys' rows in several.
        monkeypatch.setattr(reader_module, "_LIST_LOOKAHEAD_ROWS", lookahead_rows)
        reader = CounterReader(client)
        for limit, expected_pages in ((5, 7), (35, 1), (1, 35)):
            seen: list[str] = []
            pages = 0
            page = None
            while True:
                keys, page = await reader.list_instances("likes", limit=limit, page=page)
                # Every page offered holds a key: the last key's remaining rows and the rows of keys only
                # "views" has do not make an empty page.
                assert 1 <= len(keys) <= limit
                seen.extend(keys)
                pages += 1
                if page is None:
                    break
            assert sorted(seen) == sorted([f"k{i:02d}" for i in range(23)] + [f"b{i:02d}|{hour}" for i in range(12)])
            assert pages == expected_pages
        # A token cut short (a copy and paste that lost its end): refused as the caller's, not a server failure.
        _, token = await reader.list_instances("likes", limit=5)
        assert token is not None
        with pytest.raises(reader_module.PageTokenError, match="not a page token of this listing"):
            await reader.list_instances("likes", limit=5, page=token[:-12])


async def test_command_line_get_and_explain_json(cassandra_settings: CassandraSettings) -> None:
    """`countersink get --json` prints exact decimals as strings; `explain --json` lists the shards."""
    async with CassandraClient(cassandra_settings) as client:
        await _two_shards(client)
    env = {**os.environ, "COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra_settings.contact_points[0],
           "COUNTERSINK_CASSANDRA__PORT": str(cassandra_settings.port),
           "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra_settings.keyspace}

    async def countersink(*args: str) -> dict[str, object]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "countersink.cli", *args, env=env, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()
        return json.loads(out)  # type: ignore[no-any-return]

    assert await countersink("get", "notional", "IBM", "--json") == {"counter": "notional", "values": {"IBM": "15.40"}}
    explained = await countersink("explain", "notional", "IBM", "--json")
    assert len(explained["shards"]) == 2  # type: ignore[arg-type]


async def test_serve_answers_reads_over_http(cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """`countersink serve` answers one read, a multi-get and /openapi.json with exact values from Cassandra,
    and exits 0 on SIGTERM."""
    import aiohttp

    async with CassandraClient(cassandra_settings) as client:
        await _two_shards(client)
    counters = tmp_path / "counters.toml"
    counters.write_text('[[counter]]\nname = "notional"\nkind = "sum"\nnumber = "decimal"\ntopics = ["trades"]\n'
                        'key = ["symbol"]\nvalue = "notional"\n')
    async with running_serve(cassandra_settings, counters) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/counters/notional/IBM") as one:
            assert one.status == 200
            assert await one.json() == {"counter": "notional", "key": "IBM", "kind": "sum", "value": "15.40"}
        async with http.get(base + "/counters/notional", params=[("key", "IBM"), ("key", "MSFT")]) as many:
            assert await many.json() == {"counter": "notional", "values": {
                "IBM": {"kind": "sum", "value": "15.40"}, "MSFT": {"kind": "sum", "value": None}}}
        async with http.get(base + "/counters/volume/IBM") as unknown:
            assert unknown.status == 404
        async with http.get(base + "/openapi.json") as spec:
            assert "/counters/{name}/{key}" in (await spec.json())["paths"]


async def test_list_after_the_empty_key_alone_was_reset(cassandra_settings: CassandraSettings) -> None:
    """A reset of the empty key alone: list took that key's epoch for the counter's and failed for good
    (``ValueError: 'likes' is not in list``); it lists the other keys, and the empty key once counted again."""
    async with CassandraClient(cassandra_settings) as client:
        store = CassandraStore(client)
        one = b"\x02\x01\x01"
        await store.write_shards(uuid.uuid4(), 0, 1, [ShardWrite("likes", key, one, 0, True) for key in ("", "a")],
                                 source=b"test")
        await client.execute("INSERT INTO resets (counter, epoch, id, keys) VALUES ('likes', 1, 'likes.1.x', {''})")
        reader = CounterReader(client)
        assert await reader.list_instances("likes") == (["a"], None)
        await store.write_shards(uuid.uuid4(), 2, 3, [ShardWrite("likes@1", "", one, 0, True)], source=b"test")
        assert await reader.list_instances("likes") == (["", "a"], None)
