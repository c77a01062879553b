"""The counter registry on real Cassandra: consumers record their definitions, readers learn names and kinds
from it, and a changed meaning under a recorded name is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from countersink.cassandra import CassandraClient
from countersink.registry import CounterRegistry
from countersink.serve import ReadApi
from countersink.settings import CassandraSettings, KafkaSettings, ServeSettings
from schemas.definitions import parse_definitions
from schemas.errors import DefinitionChangedError
from stack.loading import child_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEFINITIONS = """
[[counter]]
name = "shares_bought"
topics = ["trades"]
kind = "sum"
key = "symbol"
value = "qty"

[[counter]]
name = "traders"
topics = ["trades"]
kind = "distinct"
key = "symbol"
value = "user.id"
"""


@pytest.fixture
async def client(cassandra_settings: CassandraSettings) -> AsyncIterator[CassandraClient]:
    async with CassandraClient(cassandra_settings) as session:
        yield session


async def test_recording_is_idempotent_and_readers_see_every_counter(client: CassandraClient) -> None:
    """Recording the same definitions twice is fine; the registry then lists each with its kind."""
    registry = CounterRegistry(client)
    assert await registry.counters() is None
    await registry.register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
    # The same meaning from another file, with another topic and an event id: still the same counter.
    await registry.register(parse_definitions(DEFINITIONS.replace('["trades"]', '["trades", "more"]', 1)
                                              .replace('value = "qty"', 'value = "qty"\nevent_id = "id"'),
                                              "b.toml"), "host-b")
    known = await CounterRegistry(client).counters()
    assert known is not None
    assert {c.name: c.kind for c in known} == {"shares_bought": "sum", "traders": "distinct"}
    # Its record gains the topic (a reset publishes to the recorded topics); the rest of the first record stays.
    assert known["shares_bought"].topics == ("trades", "more")
    assert known["shares_bought"].event_id is None
    assert known["traders"].topics == ("trades",)
    # A consumer of the first file (a rolling deploy) removes no topic.
    await registry.register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
    known = await CounterRegistry(client).counters()
    assert known is not None
    assert known["shares_bought"].topics == ("trades", "more")


async def test_a_changed_meaning_is_refused_naming_every_changed_counter(client: CassandraClient) -> None:
    """A definition whose kind, value or sketch size changed under a recorded name is refused, each named."""
    registry = CounterRegistry(client)
    await registry.register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
    changed = DEFINITIONS.replace('value = "qty"', 'value = "price"').replace('value = "user.id"',
                                                                              'value = "user.id"\nlg_k = 14')
    with pytest.raises(DefinitionChangedError) as info:
        await registry.register(parse_definitions(changed, "b.toml"), "host-b")
    lines = [problem.line for problem in info.value.problems]
    assert len(lines) == 2
    assert 'value: "qty" -> "price"' in lines[0]
    assert "registered by host-a" in lines[0]
    assert "lg_k: 12 -> 14" in lines[1]


async def test_a_changed_retention_is_refused_and_an_equal_one_is_not(client: CassandraClient) -> None:
    """A bucketed counter recorded with retain 30d: registering it with 60d is refused, saying to define a
    new counter; with 720h (the same retention) it is accepted, as is a counter recorded before retention
    was part of the fingerprint."""
    retained = ('[[counter]]\nname = "views"\ntopics = ["t"]\nkind = "count"\nkey = "page"\n'
                'bucket = { field = "ts", size = "1h" }\nretain = "30d"\n')
    registry = CounterRegistry(client)
    await registry.register(parse_definitions(retained, "a.toml"), "host-a")
    with pytest.raises(DefinitionChangedError) as info:
        await registry.register(parse_definitions(retained.replace("30d", "60d"), "b.toml"), "host-b")
    assert 'retain: "30d" -> "60d"' in info.value.line
    assert "define a new counter (a new name) with the new retention" in info.value.line
    await registry.register(parse_definitions(retained.replace("30d", "720h"), "c.toml"), "host-c")
    # Recorded by a version whose fingerprint left retention out: the meaning is the same, so it is accepted.
    await client.execute("UPDATE counters SET fingerprint = 'recorded-before' WHERE name = 'views'", [])
    await registry.register(parse_definitions(retained, "d.toml"), "host-d")
    with pytest.raises(DefinitionChangedError):
        await registry.register(parse_definitions(retained.replace('retain = "30d"\n', ""), "e.toml"), "host-e")


async def test_a_consumer_started_with_a_changed_definition_refuses_to_start(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, client: CassandraClient,
        tmp_path: Path) -> None:
    """``countersink consume`` with a changed meaning under a recorded name exits 2 with one line saying why."""
    await CounterRegistry(client).register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS.replace('kind = "sum"', 'kind = "max"'))
    env = child_env(kafka_settings, cassandra_settings, consumer={"health_port": 0})
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "consume",
                                   "--counters", str(counters)], cwd=REPO, env=env, capture_output=True, text=True,
                                   timeout=120)
    assert done.returncode == 2, done.stderr
    refused = [json.loads(line) for line in done.stderr.splitlines() if '"definition_changed"' in line]
    assert len(refused) == 1, done.stderr
    assert 'kind: "sum" -> "max"' in refused[0]["error"]
    assert "Traceback" not in done.stderr
    assert "Unclosed" not in done.stderr


def _cli(cassandra: CassandraSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra.contact_points[0],
           "COUNTERSINK_CASSANDRA__PORT": str(cassandra.port), "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra.keyspace,
           "COUNTERSINK_LOG_FORMAT": "json"}
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


async def test_reads_know_the_recorded_counters_without_a_definitions_file(
        cassandra_settings: CassandraSettings, client: CassandraClient) -> None:
    """``get``/``explain``/``list`` refuse a name the registry lacks (exit 2, with a suggestion); a known one
    reads, and ``get --json`` says its kind."""
    await CounterRegistry(client).register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
    for command in (["get", "shares_bougth", "IBM"], ["explain", "shares_bougth", "IBM"], ["list", "shares_bougth"]):
        done = await asyncio.to_thread(_cli, cassandra_settings, *command)
        assert done.returncode == 2, done.stderr
        refused = json.loads(done.stderr.strip().splitlines()[-1])
        assert refused["event"] == "unknown_counter"
        assert "did you mean shares_bought?" in refused["error"]
    known = await asyncio.to_thread(_cli, cassandra_settings, "get", "traders", "IBM", "--json")
    assert known.returncode == 0, known.stderr
    assert json.loads(known.stdout) == {"counter": "traders", "kind": "distinct", "values": {"IBM": None}}


async def test_serve_without_definitions_answers_404_for_names_the_registry_lacks(
        cassandra_settings: CassandraSettings, client: CassandraClient) -> None:
    """The read API without ``--counters`` learns names from the registry, also names recorded after it started."""
    api = ReadApi(client, ServeSettings(), registry=CounterRegistry(client))
    async with TestClient(TestServer(api.app())) as http:
        before = await http.get("/counters/traders/IBM")
        assert before.status == 200  # an empty registry checks nothing (a keyspace from before it)
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS, "a.toml"), "host-a")
        api.registry = CounterRegistry(client)  # a fresh copy, as one five seconds older would be
        unknown = await http.get("/counters/volume/IBM")
        assert unknown.status == 404
        assert "counter registry" in (await unknown.json())["detail"]
        known = await http.get("/counters/traders/IBM")
        assert await known.json() == {"counter": "traders", "key": "IBM", "kind": "distinct", "value": None}
        spec = await (await http.get("/openapi.json")).json()
        assert "shares_bought" in json.dumps(spec)


async def test_a_keyspace_from_before_the_registry_checks_no_names(client: CassandraClient) -> None:
    """Without the counters table (a keyspace made before it), readers check no names instead of failing."""
    await client.execute("DROP TABLE counters", prepared=False)
    registry = CounterRegistry(client)
    assert await registry.counters() is None
    assert await registry.lookup("anything") == (True, None)
