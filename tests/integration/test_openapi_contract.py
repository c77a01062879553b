"""The OpenAPI document against a running ``countersink serve`` on real Cassandra: every operation it
describes, asked with the values its parameters allow (and with values they refuse), answers a status the
document lists for it, in a media type it lists, with a body its schema accepts."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from consumer.cassandra_store import CassandraStore
from consumer.storage import MutatorEntry, PartitionId, ShardWrite
from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings
from schemas.definitions import load_definitions
from schemas.kinds import KindSpec, new_state
from schemas.timeseries import bucket_key, iso
from tests.integration.serve_support import running_serve

pytestmark = pytest.mark.integration
HOUR = 1_795_000_000 // 3600 * 3600
KEYS = ["AAPL", "MSFT"]
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
name = "notional"
kind = "sum"
number = "decimal"
topics = ["trades"]
key = ["symbol"]
value = "amount"

[[counter]]
name = "hourly_notional"
kind = "sum"
number = "decimal"
topics = ["trades"]
key = ["symbol"]
value = "amount"
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }
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
    counters_file = tmp_path / "counters.toml"
    counters_file.write_text(DEFINITIONS)
    counters = load_definitions(counters_file)
    shards = [("total", "", "7.5"), ("notional", "AAPL", "3"), ("notional", "MSFT", "4.25")]
    for start in (HOUR, HOUR + 3600):
        shards.append(("hourly", bucket_key(counters["hourly"], "", start), "2.25"))
        shards += [("hourly_notional", bucket_key(counters["hourly_notional"], key, start), "1") for key in KEYS]
    async with CassandraClient(cassandra_settings) as client:
        await _write(client, shards)
    async with running_serve(cassandra_settings, counters_file) as base:
        yield base


@dataclass(frozen=True)
class Call:
    path: str  # the document's path template
    url: str  # path and query, encoded


def _parameter_values(parameter: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """Values for one parameter from its schema: ``(value, allowed)``, the allowed first."""
    schema = parameter["schema"]
    name = parameter["name"]
    if "enum" in schema:
        yield from ((value, True) for value in schema["enum"])
        yield ("no_such_" + name, False)
    elif schema.get("type") == "array":
        items = schema["items"]
        yield (KEYS[:1], True)
        yield (KEYS, True)
        if "maxItems" in schema:
            yield ([f"k{i}" for i in range(schema["maxItems"] + 1)], False)
        alternatives = items.get("oneOf", [items])
        # The empty key: allowed where the document lists it beside the keys (an instance whose key is "").
        yield ([""], any(alternative.get("const") == "" for alternative in alternatives))
        yield (["x" * (alternatives[0]["maxLength"] + 1)], False)
    elif schema.get("type") == "boolean":
        yield from ((value, True) for value in ("true", "false"))
        yield ("maybe", False)
    elif name == "key":
        yield from ((key, True) for key in KEYS)
        yield ("x" * (schema["maxLength"] + 1), False)
        yield ("\\", False)
    elif name in ("from", "to"):
        yield (iso(HOUR) if name == "from" else iso(HOUR + 7200), True)
        yield ("yesterday-ish", False)
    elif name == "step":
        yield from (("1h", True), ("2h", True), ("0h", False), ("90m", True))
    else:
        raise AssertionError(f"the walk has no values for parameter {name!r}: teach it")


def _calls(document: dict[str, Any]) -> Iterator[Call]:
    """For each operation: every allowed value of each parameter in turn (the others at their first allowed
    value), then each refused value, then each optional parameter left out and each required one missing."""
    for path, operations in document["paths"].items():
        if not path.startswith("/counters") or "get" not in operations:
            # /trace/{topic} reads Kafka: tests/integration/test_trace.py asks it over HTTP; POST
            # /counters/{name}/reset writes: tests/integration/test_serve_resets.py holds it to its schema.
            continue
        parameters = operations["get"]["parameters"]
        values = {p["name"]: list(_parameter_values(p)) for p in parameters}
        names = values["name"]
        for name, _ in names:
            for parameter in parameters:
                for value, _allowed in values[parameter["name"]]:
                    if parameter["name"] == "name":
                        continue
                    chosen = {p["name"]: values[p["name"]][0][0] for p in parameters if p["required"]}
                    chosen.update({"name": name, parameter["name"]: value})
                    yield Call(path, _url(path, parameters, chosen))
            base = {p["name"]: values[p["name"]][0][0] for p in parameters if p["required"]}
            yield Call(path, _url(path, parameters, {**base, "name": name}))
            for parameter in parameters:
                if parameter["required"] and parameter["in"] == "query":
                    yield Call(path, _url(path, parameters, {k: v for k, v in base.items()
                                                             if k != parameter["name"]} | {"name": name}))


def _url(path: str, parameters: list[dict[str, Any]], chosen: dict[str, Any]) -> str:
    url = path
    query = []
    for parameter in parameters:
        if parameter["name"] not in chosen:
            continue
        value = chosen[parameter["name"]]
        if parameter["in"] == "path":
            url = url.replace("{" + parameter["name"] + "}", quote(str(value), safe=""))
        else:
            query += [(parameter["name"], item) for item in (value if isinstance(value, list) else [value])]
    return url + ("?" + "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query) if query else "")


async def test_every_operation_answers_what_the_document_says(served: str) -> None:
    """The served document is valid OpenAPI 3.1; then, for every operation, each call the walk derives from the
    document answers a documented status with a documented media type and a body its schema accepts. Every
    operation answers 200 to some call and 400 or 404 to some other, so the walk reaches both (a 500, or a
    status, media type or body the document does not give, fails it)."""
    async with aiohttp.ClientSession() as http:
        async with http.get(served + "/openapi.json") as answer:
            document = await answer.json()
        validate(document)
        components = document["components"]
        seen: dict[str, set[int]] = {path: set() for path, operations in document["paths"].items()
                                     if path.startswith("/counters") and "get" in operations}
        problems = []
        calls = list(_calls(document))
        for call in calls:
            async with http.get(served + call.url) as answer:
                body = await answer.read()
                status, media = answer.status, answer.content_type
            seen[call.path].add(status)
            responses = document["paths"][call.path]["get"]["responses"]
            documented = responses.get(str(status)) or responses.get("default")
            if documented is None:
                problems.append(f"{call.url}: {status} is not among {sorted(responses)}: {body[:200]!r}")
                continue
            if media not in documented.get("content", {}):
                problems.append(f"{call.url}: {status} {media} is not among {sorted(documented.get('content', {}))}")
                continue
            schema = documented["content"][media]["schema"]
            errors = [e.message for e in OAS31Validator({**schema, "components": components}).iter_errors(
                json.loads(body))]
            if errors:
                problems.append(f"{call.url}: {status} body does not match its schema: {errors[:3]}")
    assert not problems, "\n".join(problems)
    assert len(calls) > 100
    for path, statuses in seen.items():
        assert 200 in statuses, (path, statuses)
        assert statuses & {400, 404}, (path, statuses)
    # A consistency level the keyspace cannot meet (TWO, THREE on the test's keyspace of one replica) is the
    # documented 400, saying why without quoting the statement the driver's error names; no retry helps.
    async with aiohttp.ClientSession() as http, http.get(served + "/counters/total?consistency=THREE") as answer:
        assert answer.status == 400, await answer.text()
        assert "Retry-After" not in answer.headers
        detail = (await answer.json(content_type=None))["detail"]
    assert detail.startswith("consistency THREE waits for 3 replicas; keyspace "), detail
    assert "SELECT" not in detail, detail
    assert "[" not in detail, detail
