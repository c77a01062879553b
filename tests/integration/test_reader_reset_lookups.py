"""What a read asks Cassandra about resets, on real Cassandra: a read of several keys looks the counter's resets
up once, and a keyspace made before resets is not asked for its tables on every read."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient
from countersink.reader import CounterReader
from countersink.resets import EPOCHS_KEPT_S, NO_TABLE_RECHECK_S, EpochsCache
from countersink.settings import CassandraSettings
from schemas.kinds import KindSpec, new_state

pytestmark = pytest.mark.integration
KEYS = [f"K{i}" for i in range(12)]


class CountingClient(CassandraClient):
    """A real client that counts the statements it runs, by their first words."""

    def __init__(self, settings: CassandraSettings) -> None:
        super().__init__(settings)
        self.asked: Counter[str] = Counter()

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if "FROM resets" in query:
            self.asked["resets"] += 1
        elif "system_schema.tables" in query:
            self.asked["tables"] += 1
        elif "FROM shards" in query:
            self.asked["shards"] += 1
        return await super().execute(query, *args, **kwargs)


async def _count(client: CassandraClient) -> None:
    store = CassandraStore(client)
    record = MutatorEntry(uuid.uuid4(), "g", "trades", 0, "test", 1_000_000, 9_000_000)
    await store.register_mutator(record)
    await store.create_partition(PartitionId("g", "trades", 0), record.id, record.born_us, 41)
    writes = []
    for i, key in enumerate(KEYS):
        state = new_state(KindSpec("sum", number="decimal"))
        state.apply(Decimal(i))
        writes.append(ShardWrite("notional", key, state.to_bytes(), 42, True))
    await store.write_shards(record.id, record.born_us, record.born_us + 1, writes, source=b"test")


async def test_a_read_of_several_keys_looks_the_resets_up_once(cassandra_settings: CassandraSettings) -> None:
    """get_many of 12 keys reads the counter's resets once, and each key's shards: the right values."""
    client = CountingClient(cassandra_settings)
    async with client:
        await _count(client)
        client.asked.clear()
        values = await CounterReader(client).get_many("notional", KEYS)
    assert values == {key: Decimal(i) for i, key in enumerate(KEYS)}
    assert client.asked["resets"] == 1, client.asked
    assert client.asked["shards"] == len(KEYS), client.asked


async def test_a_keyspace_without_the_resets_table_is_not_asked_on_every_read(
        cassandra_settings: CassandraSettings) -> None:
    """In a keyspace made before resets (no resets table), 20 reads in a row ask system_schema once; once
    NO_TABLE_RECHECK_S has passed it is asked again, and a table made meanwhile is then seen."""
    client = CountingClient(cassandra_settings)
    async with client:
        await _count(client)
        await client.execute("DROP TABLE resets", prepared=False)
        client.asked.clear()
        reader = CounterReader(client)
        for _ in range(20):
            assert await reader.get("notional", "K3") == Decimal(3)
        assert (client.asked["tables"], client.asked["resets"]) == (1, 0), client.asked
        await client.execute("CREATE TABLE resets (counter text, epoch bigint, id text, keys set<text>, "
                             "partitions map<text, int>, requested_by text, requested_us bigint, "
                             "PRIMARY KEY (counter, epoch))", prepared=False)
        await asyncio.sleep(NO_TABLE_RECHECK_S)
        assert await reader.get_many("notional", ["K1", "K2"]) == {"K1": Decimal(1), "K2": Decimal(2)}
        assert (client.asked["tables"], client.asked["resets"]) == (2, 1), client.asked


class StoppedClock:
    """A clock that moves only when the test moves it: "the keys' reads start within ``kept_s`` of each other"
    holds however slowly a loaded machine runs them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OrderedClient(CountingClient):
    """A counting client that also notes when each request of the resets and of the shards starts and ends."""

    def __init__(self, settings: CassandraSettings) -> None:
        super().__init__(settings)
        self.events: list[str] = []

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        what = "resets" if "FROM resets" in query else "shards" if "FROM shards" in query else "other"
        self.events.append(f"{what} sent")
        try:
            return await super().execute(query, *args, **kwargs)
        finally:
            self.events.append(f"{what} answered")


@pytest.mark.parametrize("cached", [False, True])
async def test_a_read_of_several_keys_with_the_resets_no_longer_kept_sends_them_with_the_states(
        cassandra_settings: CassandraSettings, cached: bool) -> None:
    """serve's read of 12 keys of a counter whose resets it read before but keeps no longer (past 0.5 s) reads
    them once, sent with the keys' states rather than before them; the right values."""
    from countersink.state_cache import StateCache

    client = OrderedClient(cassandra_settings)
    async with client:
        await _count(client)
        clock = StoppedClock()
        epochs = EpochsCache(client, kept_s=0.5, clock=clock)
        await epochs.get("notional")  # read once: a guess from here on
        clock.now = 0.6  # no longer kept; stopped there while the keys are read
        client.asked.clear()
        client.events.clear()
        reader = CounterReader(client, cache=StateCache(1 << 20) if cached else None, epochs=epochs)
        values = await reader.get_many("notional", KEYS)
    assert values == {key: Decimal(i) for i, key in enumerate(KEYS)}
    assert client.asked["resets"] == 1, client.asked
    assert client.asked["shards"] == len(KEYS), client.asked
    assert client.events.index("shards sent") < client.events.index("resets answered"), client.events


async def test_serves_read_of_several_keys_with_the_resets_no_longer_kept_sends_them_with_the_states(
        cassandra_settings: CassandraSettings) -> None:
    """``GET /counters/{name}?key=...`` of 12 keys, the counter's resets read before but no longer kept: the
    resets read once, sent with the keys' states rather than before them; the right values."""
    from aiohttp.test_utils import TestClient, TestServer
    from pydantic import SecretStr

    from countersink.serve import ReadApi
    from countersink.settings import ServeSettings
    from schemas.definitions import parse_definitions

    counters = parse_definitions('[[counter]]\nname = "notional"\nkind = "sum"\ntopics = ["trades"]\n'
                                 'key = ["sym"]\nvalue = "n"\nnumber = "decimal"\n')
    token = "r3ad-token-of-the-test-0123456789"  # noqa: S105 (a test's read token)
    client = OrderedClient(cassandra_settings)
    async with client:
        await _count(client)
        api = ReadApi(client, ServeSettings(tokens=SecretStr(token)), counters)
        clock = StoppedClock()
        api.epochs = EpochsCache(client, clock=clock)  # serve's, with a clock the test moves
        await api.epochs.get("notional")  # read once: a guess from here on
        clock.now = EPOCHS_KEPT_S + 0.1  # no longer kept; stopped there while the keys are read
        client.asked.clear()
        client.events.clear()
        async with TestClient(TestServer(api.app())) as http:
            answer = await http.get("/counters/notional", params=[("key", key) for key in KEYS],
                                    headers={"Authorization": f"Bearer {token}"})
            assert answer.status == 200, await answer.text()
            body = await answer.json()
    assert {key: Decimal(str(found["value"])) for key, found in body["values"].items()} == {
        key: Decimal(i) for i, key in enumerate(KEYS)}
    assert client.asked["resets"] == 1, client.asked
    assert client.asked["shards"] == len(KEYS), client.asked
    assert client.events.index("shards sent") < client.events.index("resets answered"), client.events
