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
from countersink.serve import ReadApi, Resetting, Tokens, openapi_document
from countersink.settings import CassandraSettings, KafkaSettings, ServeSettings, Settings
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


ADMIN = ServeSettings(tokens=SecretStr(TOKEN), admin_tokens=SecretStr(f"ops:{TOKEN[::-1]}"),
                      admin_cassandra_username="countersink_serve_admin")


def _resetting() -> Resetting:
    return Resetting(Tokens(ADMIN, admin=True), CassandraClient(CassandraSettings()), KafkaSettings())


def _routes(tracing: Settings | None = None, resetting: bool = False) -> set[str]:
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), COUNTERS, tracing=tracing,
                  resetting=_resetting() if resetting else None)
    return {resource.canonical for resource in api.app().router.resources()}


@pytest.mark.parametrize(("tracing", "resetting"), [(False, False), (True, False), (True, True)])
def test_the_document_describes_exactly_the_counter_routes(tracing: bool, resetting: bool) -> None:
    """Every /counters (and, where traces and resets are served, /trace and the reset) route of the server is a
    path of the document and every path a route; the operational routes (probes, metrics, the document itself)
    are the only ones left out."""
    document = openapi_document(ServeSettings(), COUNTERS, tracing=tracing, resetting=resetting)
    validate(document)
    paths = set(document["paths"])
    routes = _routes(Settings() if tracing else None, resetting)
    assert {route for route in routes if route.startswith(("/counters", "/trace"))} == paths
    assert ("/trace/{topic}" in paths) is tracing
    assert ("/counters/{name}/reset" in paths) is resetting
    assert routes - paths == {"/healthz", "/readyz", "/metrics", "/openapi.json"}


async def test_the_reset_route_answers_401_without_an_admin_token_and_403_to_a_read_token() -> None:
    """POST /counters/{name}/reset: no token and a token nobody issued answer 401, a read token 403, each the
    documented problem document; the guard answers before the handler (nothing reaches Cassandra or Kafka).
    GET of the same path still reads the instance named reset (a read token passes the guard)."""
    document = openapi_document(ADMIN, COUNTERS, resetting=True)
    responses = document["paths"]["/counters/{name}/reset"]["post"]["responses"]
    api = ReadApi(CassandraClient(CassandraSettings()), ADMIN, COUNTERS, resetting=_resetting())
    async with TestClient(TestServer(api.app())) as http:
        for headers, status in (({}, 401), ({"Authorization": "Bearer " + "x" * 20}, 401),
                                ({"Authorization": f"Bearer {TOKEN}"}, 403)):
            answer = await http.post("/counters/likes/reset", json={"keys": ["p1"]}, headers=headers)
            assert answer.status == status
            schema = responses[str(status)]["content"][answer.content_type]["schema"]
            body = await answer.json(content_type=None)
            assert not list(OAS31Validator({**schema, "components": document["components"]}).iter_errors(body))
        refused = await http.get("/counters/likes/reset")
        assert refused.status == 401  # the read route, guarded by the read tokens
        admin = {"Authorization": f"Bearer {TOKEN[::-1]}"}
        for body in ({"keys": []}, {"keys": "p1"}, {"keys": ["p1"], "all": True}, ["p1"], {"keys": [""]}):
            # refused before anything is looked up: an empty list of keys is not "every key"
            answer = await http.post("/counters/likes/reset", json=body, headers=admin)
            assert answer.status == 400, (body, await answer.text())
        answer = await http.post("/counters/likes/reset", data=b"{not json", headers=admin)
        assert answer.status == 400


async def test_with_tokens_every_operation_answers_the_documented_401() -> None:
    """With tokens set, the document requires a bearer token for every operation and lists 401; each
    operation, asked without a token, answers 401 with a body that matches the documented schema."""
    settings = ServeSettings(tokens=SecretStr(TOKEN))
    document = openapi_document(settings, COUNTERS)
    assert document["security"] == [{"bearer": []}]
    api = ReadApi(CassandraClient(CassandraSettings()), settings, COUNTERS)
    async with TestClient(TestServer(api.app())) as http:
        for path, operations in document["paths"].items():  # every one a GET here
            url = re.sub(r"\{name\}", "likes", path).replace("{key}", "p1")
            answer = await http.get(url, params={"from": "now-1h", "to": "now"} if "series" in path else None)
            documented = operations["get"]["responses"]
            assert answer.status == 401
            assert answer.content_type in documented["401"]["content"], url
            schema = documented["401"]["content"][answer.content_type]["schema"]
            body = await answer.json(content_type=None)
            errors = list(OAS31Validator({**schema, "components": document["components"]}).iter_errors(body))
            assert not errors, (url, errors)
