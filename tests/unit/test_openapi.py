"""The OpenAPI document of the read API is valid OpenAPI 3.1 (checked by openapi-spec-validator, a maintained
validator), describes exactly the read routes the server registers, and, with tokens, the 401 every one of
them answers without one. tests/integration/test_openapi_contract.py walks it against a running serve."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from pydantic import SecretStr

from countersink.cassandra import CassandraClient
from countersink.serve import ReadApi, openapi_document
from countersink.settings import CassandraSettings, ServeSettings, Settings
from schemas.definitions import parse_definitions

COUNTERS = parse_definitions('''
[[counter]]
name = "likes"
kind = "count"
topics = ["likes"]
key = ["post_id"]

[[counter]]
name = "total"
kind = "count"
topics = ["likes"]
''')
TOKEN = "t0ken-of-the-test-0123456789abcdef"  # noqa: S105  # a test's bearer token


@pytest.mark.parametrize(("settings", "counters"), [
    (ServeSettings(), None),
    (ServeSettings(max_keys=3), COUNTERS),
    (ServeSettings(tokens=SecretStr(TOKEN)), COUNTERS),
])
def test_the_document_is_valid_openapi_3_1(settings: ServeSettings, counters: object) -> None:
    """openapi-spec-validator finds nothing wrong, with and without a definitions file and tokens."""
    document = openapi_document(settings, counters)  # type: ignore[arg-type]
    validate(document)  # raises OpenAPIValidationError naming the first problem
    assert document["openapi"] == "3.1.0"


def test_a_broken_document_is_refused_by_the_validator() -> None:
    """The validator can fail: a response without its required description, a dangling reference."""
    document = openapi_document(ServeSettings(), COUNTERS)
    del document["paths"]["/counters/{name}/{key}"]["get"]["responses"]["200"]["description"]
    with pytest.raises(Exception, match="description"):
        validate(document)
    document = openapi_document(ServeSettings(), COUNTERS)
    document["components"]["schemas"].pop("Series")
    with pytest.raises(Exception, match="Series"):
        validate(document)


def _routes(tracing: Settings | None = None) -> set[str]:
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), COUNTERS, tracing=tracing)
    return {resource.canonical for resource in api.app().router.resources()}


@pytest.mark.parametrize("tracing", [False, True])
def test_the_document_describes_exactly_the_counter_routes(tracing: bool) -> None:
    """Every /counters (and, where traces are served, /trace) route of the server is a path of the document and
    every path a route; the operational routes (probes, metrics, the document itself) are the only ones left out."""
    paths = set(openapi_document(ServeSettings(), COUNTERS, tracing=tracing)["paths"])
    routes = _routes(Settings() if tracing else None)
    assert {route for route in routes if route.startswith(("/counters", "/trace"))} == paths
    assert ("/trace/{topic}" in paths) is tracing
    assert routes - paths == {"/healthz", "/readyz", "/metrics", "/openapi.json"}


async def test_with_tokens_every_operation_answers_the_documented_401() -> None:
    """With tokens set, the document requires a bearer token for every operation and lists 401; each
    operation, asked without a token, answers 401 with a body that matches the documented schema."""
    settings = ServeSettings(tokens=SecretStr(TOKEN))
    document = openapi_document(settings, COUNTERS)
    assert document["security"] == [{"bearer": []}]
    api = ReadApi(CassandraClient(CassandraSettings()), settings, COUNTERS)
    async with TestClient(TestServer(api.app())) as http:
        for path, operations in document["paths"].items():
            url = re.sub(r"\{name\}", "likes", path).replace("{key}", "p1")
            answer = await http.get(url, params={"from": "now-1h", "to": "now"} if "series" in path else None)
            documented = operations["get"]["responses"]
            assert answer.status == 401
            assert answer.content_type in documented["401"]["content"], url
            schema = documented["401"]["content"][answer.content_type]["schema"]
            body = await answer.json(content_type=None)
            errors = list(OAS31Validator({**schema, "components": document["components"]}).iter_errors(body))
            assert not errors, (url, errors)
