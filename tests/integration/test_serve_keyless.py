"""``countersink serve`` on real Cassandra: counters with no key fields are read over HTTP (their one instance
and its buckets), and a key that is no instance key is a 400 problem document."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest

from consumer.cassandra_store import CassandraStore
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings
from schemas.definitions import load_definitions
from schemas.kinds import KindSpec, new_state
from schemas.timeseries import bucket_key, iso
from tests.integration.serve_support import running_serve

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
HOUR = 1_795_000_000 // 3600 * 3600  # a bucket start (2026-11-18T...)
DEFINITIONS = """
[[counter]]
name = "total"
kind = "sum"
number = "decimal"
topics = ["trades"]
value = "amount"

[[counter]]
name = "hourly"
kind = "sum"
number = "decimal"
topics = ["trades"]
value = "amount"
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }

[[counter]]
name = "hourly_by_symbol"
kind = "sum"
number = "decimal"
topics = ["trades"]
key = ["symbol"]
value = "amount"
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }

[[counter]]
name = "notional"
kind = "sum"
number = "decimal"
topics = ["trades"]
key = ["symbol"]
value = "amount"
"""


async def _write(client: CassandraClient, shards: list[tuple[str, str, str]]) -> None:
    """One mutator's shards: (counter, instance key, decimal amount) each."""
    store = CassandraStore(client)
    record = MutatorEntry(uuid.uuid4(), "g", "trades", 0, "test", 1_000_000, 9_000_000)
    await store.register_mutator(record)
    await store.create_partition(PartitionId("g", "trades", 0), record.id, record.born_us, 41)
    writes = []
    for counter, key, amount in shards:
        state = new_state(KindSpec("sum", number="decimal"))
        state.apply(Decimal(amount))
        writes.append(ShardWrite(counter, key, state.to_bytes(), 42, True))
    await store.write_shards(record.id, record.born_us, record.born_us + 1, writes, source=b"test")


@pytest.fixture
async def served(cassandra_settings: CassandraSettings, tmp_path: Path) -> AsyncIterator[str]:
    """The base URL of a running ``countersink serve`` over the shards written here."""
    counters = tmp_path / "counters.toml"
    counters.write_text(DEFINITIONS)
    definitions = load_definitions(counters)
    hourly, by_symbol = definitions["hourly"], definitions["hourly_by_symbol"]
    async with CassandraClient(cassandra_settings) as client:
        await _write(client, [("total", "", "7.5"), ("hourly", bucket_key(hourly, "", HOUR), "2.25"),
                              ("hourly", bucket_key(hourly, "", HOUR + 3600), "1"), ("notional", "series", "3"),
                              ("notional", "", "4"), ("hourly_by_symbol", bucket_key(by_symbol, "", HOUR), "5"),
                              ("hourly_by_symbol", bucket_key(by_symbol, "IBM", HOUR + 3600), "6")])
    async with running_serve(cassandra_settings, counters) as base:
        yield base


async def _get(base: str, path: str) -> tuple[int, str, object]:
    async with aiohttp.ClientSession() as http, http.get(base + path) as answer:
        return answer.status, answer.content_type, await answer.json(content_type=None)


async def test_a_keyless_counter_is_read_over_http(served: str) -> None:
    """``/counters/{name}`` reads the one instance of a counter with no key fields, and
    ``/counters/{name}/series`` the buckets of a bucketed one; the OpenAPI document describes both."""
    assert await _get(served, "/counters/total") == (200, "application/json", {
        "counter": "total", "key": "", "kind": "sum", "value": "7.5"})
    span = f"from={iso(HOUR)}&to={iso(HOUR + 7200)}"
    status, _, series = await _get(served, f"/counters/hourly/series?{span}")
    assert status == 200, series
    assert isinstance(series, dict)
    assert (series["counter"], series["key"]) == ("hourly", "")
    assert [point["value"] for point in series["points"]] == ["2.25", "1"]
    status, _, rolled = await _get(served, f"/counters/hourly/series?{span}&rollup=true")
    assert isinstance(rolled, dict)
    assert [point["value"] for point in rolled["points"]] == ["3.25"]
    # A key given to a counter without key fields names no series (it answered the whole counter's, as "x").
    status, _, refused = await _get(served, f"/counters/hourly/x/series?{span}")
    assert status == 400, refused
    assert isinstance(refused, dict)
    assert "has no key fields: its one series is named by the empty text" in refused["detail"]
    status, _, spec = await _get(served, "/openapi.json")
    assert isinstance(spec, dict)
    assert {"/counters/{name}", "/counters/{name}/series"} <= set(spec["paths"])


async def test_a_keyed_counter_keeps_its_instance_named_series(served: str) -> None:
    """For a counter with key fields, ``/counters/{name}/series`` is still the instance whose key is
    ``series``, and ``/counters/{name}`` without a key is a 400 problem."""
    assert await _get(served, "/counters/notional/series") == (200, "application/json", {
        "counter": "notional", "key": "series", "kind": "sum", "value": "3"})
    status, media, problem = await _get(served, "/counters/notional")
    assert (status, media) == (400, "application/problem+json")
    assert isinstance(problem, dict)
    assert "give at least one ?key=" in problem["detail"]


async def test_the_series_of_a_key_is_read_with_a_key_parameter_the_empty_key_too(served: str) -> None:
    """The series of the empty key of a keyed counter had no URL (``/counters/{name}//series`` names no route):
    ``/counters/{name}/series?key=`` reads it, and ``?key=IBM`` as ``/counters/{name}/IBM/series`` does; two
    keys are a 400 problem."""
    span = f"from={iso(HOUR)}&to={iso(HOUR + 7200)}"
    status, _, empty = await _get(served, f"/counters/hourly_by_symbol/series?key=&{span}")
    assert status == 200, empty
    assert isinstance(empty, dict)
    assert (empty["key"], [p["value"] for p in empty["points"]]) == ("", ["5", None])
    by_query = await _get(served, f"/counters/hourly_by_symbol/series?key=IBM&{span}")
    assert by_query == await _get(served, f"/counters/hourly_by_symbol/IBM/series?{span}")
    assert isinstance(by_query[2], dict)
    assert [p["value"] for p in by_query[2]["points"]] == [None, "6"]
    status, media, problem = await _get(served, f"/counters/hourly_by_symbol/series?key=a&key=b&{span}")
    assert (status, media) == (400, "application/problem+json"), problem
    status, _, problem = await _get(served, f"/counters/hourly/series?key=x&{span}")  # a keyless counter
    assert status == 400, problem
    assert (await _get(served, f"/counters/hourly/series?key=&{span}"))[0] == 200


async def test_the_instance_of_an_empty_key_is_read_with_an_empty_key_parameter(served: str) -> None:
    """Events whose one key field is the empty text are counted in the instance whose key is empty: the path
    cannot name it, ``?key=`` reads it, beside other keys."""
    assert await _get(served, "/counters/notional?key=&key=series") == (200, "application/json", {
        "counter": "notional", "values": {"": {"kind": "sum", "value": "4"}, "series": {"kind": "sum", "value": "3"}}})


@pytest.mark.parametrize("path", ["/counters/notional/%5C", "/counters/notional?key=%5C",
                                  "/counters/hourly/%5C/series?from=now-1h&to=now",
                                  "/counters/notional?key=" + "k" * 1025])
async def test_a_malformed_key_is_a_400_problem(served: str, path: str) -> None:
    """A key that is no instance key (a lone backslash, more bytes than an event's key may have) answers 400
    with a problem document."""
    status, media, problem = await _get(served, path)
    assert (status, media) == (400, "application/problem+json"), problem
    assert isinstance(problem, dict)
    assert problem["status"] == 400


async def test_a_definitions_file_that_means_otherwise_than_the_registry_is_refused(
        cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """serve reads stored states by its file's definitions: a file recording another bucket size than the
    consumers' read no bucket (200, nothing counted), one with other key fields any key. It is refused at start,
    exit 2, with the consumers' own definition_changed line; a file meaning what the registry records is served."""
    import asyncio
    import os
    import sys

    from countersink.registry import CounterRegistry
    from schemas.definitions import parse_definitions

    recorded = tmp_path / "recorded.toml"
    recorded.write_text(DEFINITIONS)
    async with CassandraClient(cassandra_settings) as client:
        await CounterRegistry(client).register(parse_definitions(DEFINITIONS, str(recorded)), "test")
    otherwise = tmp_path / "otherwise.toml"
    otherwise.write_text(DEFINITIONS.replace('size = "1h", format = "epoch_seconds" }\n\n[[counter]]\nname = '
                                             '"hourly_by_symbol"', 'size = "1d", format = "epoch_seconds" }\n\n'
                                             '[[counter]]\nname = "hourly_by_symbol"', 1))
    assert otherwise.read_text() != DEFINITIONS
    env = {**os.environ, "COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra_settings.contact_points[0],
           "COUNTERSINK_CASSANDRA__PORT": str(cassandra_settings.port),
           "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra_settings.keyspace, "COUNTERSINK_SERVE__PORT": "0",
           "PYTHONPATH": str(REPO)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "countersink.cli", "serve", "--counters", str(otherwise), env=env, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        said, _ = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:  # served the file instead of refusing it: stopped, not left running
            process.kill()
            await process.wait()
    assert process.returncode == 2, said.decode()
    assert b"definition_changed" in said, said.decode()
    assert b"'hourly'" in said, said.decode()
    async with running_serve(cassandra_settings, recorded) as base:
        assert (await _get(base, "/counters/total"))[0] == 200
