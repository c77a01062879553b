"""The read API's HTTP layer: input bounds, errors as problem documents, OpenAPI, probes.

Reads themselves are covered on real Cassandra in tests/integration/test_reader.py; here the Cassandra
client is never started, so any request that got past validation would fail with a 500.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from countersink.cassandra import CassandraClient
from countersink.serve import ReadApi, openapi_document
from countersink.serve import run as serve_command
from countersink.settings import CassandraSettings, ServeSettings, Settings
from schemas.definitions import parse_definitions

COUNTERS = parse_definitions('''
[[counter]]
name = "likes"
kind = "count"
topics = ["likes"]
key = ["post_id"]
''')


@pytest.fixture
async def http() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(max_keys=3), COUNTERS)
    async with TestClient(TestServer(api.app())) as client:
        yield client


@pytest.mark.parametrize(("path", "status", "detail"), [
    ("/counters/Likes/p1", 400, "counter names match"),
    ("/counters/no_such/p1", 404, "no counter 'no_such'"),
    ("/counters/likes/p1?consistency=MOST", 400, "consistency is one of"),
    ("/counters/likes/" + "k" * 1025, 400, "a key is 1 to 1024 bytes"),
    ("/counters/likes", 400, "give at least one ?key="),
    ("/counters/likes?key=a&key=b&key=c&key=d", 400, "at most 3 keys"),
    ("/counters/likes?key=a&key=", 400, "a key is 1 to 1024 bytes"),
])
async def test_bad_requests_are_refused_before_any_read(http: TestClient, path: str, status: int,  # type: ignore[type-arg]
                                                         detail: str) -> None:
    """Bad requests get a problem+json answer before any Cassandra read."""
    response = await http.get(path)
    assert response.status == status
    assert response.content_type == "application/problem+json"
    body = await response.json(content_type=None)
    assert body["status"] == status
    assert detail in body["detail"]


async def test_probes_and_metrics(http: TestClient) -> None:  # type: ignore[type-arg]
    """Health, readiness and metrics answer; only GET is allowed on reads."""
    assert (await http.get("/healthz")).status == 200
    assert (await http.get("/readyz")).status == 503  # no Cassandra connection
    await http.get("/counters/Bad/x")
    exposition = await (await http.get("/metrics")).text()
    assert 'countersink_serve_requests_total{route="/counters/{name}/{key}",status="400"}' in exposition
    assert (await http.post("/counters/likes/x")).status == 405


async def test_openapi_describes_every_read(http: TestClient) -> None:  # type: ignore[type-arg]
    """The OpenAPI document describes the reads (one key, several keys, a range) with the configured limits."""
    served = await (await http.get("/openapi.json")).json()
    assert served == openapi_document(ServeSettings(max_keys=3), COUNTERS)
    assert served["openapi"].startswith("3.1")
    assert set(served["paths"]) == {"/counters/{name}/{key}", "/counters/{name}", "/counters/{name}/{key}/series"}
    series = {p["name"]: p for p in served["paths"]["/counters/{name}/{key}/series"]["get"]["parameters"]}
    assert (series["from"]["required"], series["to"]["required"], series["step"]["required"]) == (True, True, False)
    name = served["paths"]["/counters/{name}"]["get"]["parameters"][0]
    assert name["schema"]["enum"] == ["likes"]
    keys = served["paths"]["/counters/{name}"]["get"]["parameters"][1]
    assert keys["schema"]["maxItems"] == 3
    for path in served["paths"].values():
        for response in path["get"]["responses"].values():
            for media in response.get("content", {}).values():
                ref = media["schema"]["$ref"].rsplit("/", 1)[1]
                assert ref in served["components"]["schemas"]


@pytest.mark.parametrize("content", [None, '[[counter]]\nname = "likes"\nkind = "count"\nlg_k = 12\n'])
def test_a_missing_or_bad_definitions_file_exits_2_with_one_line(tmp_path, content: str | None) -> None:
    """`serve --counters` refuses a missing or invalid file as `consume` does: exit 2, the file named, no
    traceback, and no server started."""
    path = tmp_path / "counters.toml"
    if content is not None:
        path.write_text(content)
    args = argparse.Namespace(counters=path, host=None, port=None, consistency=None)
    with capture_logs() as logs:
        assert serve_command(args, Settings()) == 2
    assert [entry["event"] for entry in logs] == ["definitions_refused"]
    assert str(path) in logs[0]["error"]
