"""The read API's HTTP layer: input bounds, errors as problem documents, OpenAPI, probes.

Reads themselves are covered on real Cassandra in tests/integration/test_reader.py; here the Cassandra
client is never started, so any request that got past validation would fail with a 500.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr
from structlog.testing import capture_logs

from countersink.cassandra import CassandraClient, CassandraUnavailableError
from countersink.reader import to_jsonable
from countersink.registry import CounterRegistry
from countersink.serve import ReadApi, api_runner, openapi_document
from countersink.serve import run as serve_command
from countersink.settings import CassandraSettings, ServeSettings, Settings
from schemas.definitions import parse_definitions
from schemas.kinds import KindSpec, new_state

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
    ("/counters/likes/", 400, "a path names no empty key: read it with /counters/{name}?key="),
    ("/counters/likes?key=a&key=b&key=c&key=d", 400, "at most 3 keys"),
    ("/counters/likes?key=a&key=" + "k" * 1025, 400, "a key is 1 to 1024 bytes"),
    ("/counters/likes/%5C", 400, "a lone backslash is not an instance key"),
    ("/counters/likes/a%5C", 400, "a backslash in a key escapes \\ or | only"),
    ("/counters/likes/%C3", 400, "the URL's escapes are not UTF-8 text"),
    ("/counters/likes?key=%FF", 400, "the URL's escapes are not UTF-8 text"),
    ("/counters/likes?key=%ED%A0%80", 400, "the URL's escapes are not UTF-8 text"),
    ("/counters/likes?key=C:%5Cpath", 400, "a backslash in a key escapes \\ or | only"),
    ("/counters/likes?key=%5C", 400, "a lone backslash is not an instance key"),
    ("/counters/likes/%5C/series?from=now-1h&to=now", 400, "a lone backslash is not an instance key"),
    ("/counters/likes/p1/series?from=now-1000000d&to=now", 400, "'now-1000000d' is outside the times a range"),
    ("/counters/likes/p1/series?from=0001-01-01T00:00%2B01:00&to=now", 400, "is outside the times a range"),
    # a keyed counter's /series without ?key= is the instance "series": range parameters were ignored
    ("/counters/likes/series?from=garbage&to=garbage&step=zzz", 400, "has key fields: a series of it names its"),
    # a parameter the path does not take (a typo read at the default level), or a single one given twice
    ("/counters/likes/p1?consistncy=ALL", 400, "no query parameter 'consistncy' here; this path takes: consistency"),
    ("/counters/likes/p1?key=p2", 400, "no query parameter 'key' here; this path takes: consistency"),
    ("/counters/likes?key=a&consistency=ONE&consistency=ALL", 400, "give consistency once"),
    ("/counters/likes/p1/series?from=now-1h&to=now&from=now-2h", 400, "give from once"),
    ("/counters/likes/series?key=p1&key=p2&from=now-1h&to=now", 400, "give key once"),
    ("/counters/likes?key=a&" + "x" * 2000 + "=1", 400, "no query parameter '" + "x" * 40 + "'... here"),
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
    """Health, readiness and metrics answer; only GET is allowed on reads. No answer names Python's or aiohttp's
    version."""
    assert (await http.get("/healthz")).status == 200
    for path in ("/healthz", "/counters/no_such/p1", "/openapi.json"):
        assert (await http.get(path)).headers["Server"] == "countersink"
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
    assert set(served["paths"]) == {"/counters/{name}/{key}", "/counters/{name}", "/counters/{name}/{key}/series",
                                    "/counters/{name}/series"}
    keyless = {p["name"]: p for p in served["paths"]["/counters/{name}/series"]["get"]["parameters"]}
    assert set(keyless) == {"name", "key", "from", "to", "step", "rollup", "consistency"}
    series = {p["name"]: p for p in served["paths"]["/counters/{name}/{key}/series"]["get"]["parameters"]}
    assert (series["from"]["required"], series["to"]["required"], series["step"]["required"]) == (True, True, False)
    name = served["paths"]["/counters/{name}"]["get"]["parameters"][0]
    assert name["schema"]["enum"] == ["likes"]
    keys = served["paths"]["/counters/{name}"]["get"]["parameters"][1]
    assert keys["schema"]["maxItems"] == 3
    for path in served["paths"].values():
        for response in path["get"]["responses"].values():
            for media in response.get("content", {}).values():
                for ref in [media["schema"], *media["schema"].get("oneOf", [])]:
                    if "$ref" in ref:
                        assert ref["$ref"].rsplit("/", 1)[1] in served["components"]["schemas"]


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


TOKEN = "served-token-" + "s" * 24


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, int]]:
    """The API behind the runner `serve` uses (the parser's limits and refusals are the runner's), with a token
    and small line limits, on a free local port: (host, port)."""
    api = ReadApi(CassandraClient(CassandraSettings()),
                  ServeSettings(tokens=SecretStr(TOKEN), max_url_bytes=1024, max_header_bytes=2048), COUNTERS)
    runner = api_runner(api, shutdown_timeout=1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield "127.0.0.1", runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def exchange(address: tuple[str, int], raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` on a new connection; the answer's status, headers and body."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(raw)
        await writer.drain()
        head, _, body = (await asyncio.wait_for(reader.read(65536), 10)).partition(b"\r\n\r\n")
    finally:
        writer.close()
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _request(*header_lines: bytes, line: bytes = b"GET /counters/likes/p1 HTTP/1.1") -> bytes:
    return line + b"\r\nHost: test\r\n" + b"".join(h + b"\r\n" for h in header_lines) + b"\r\n"


SECRET = TOKEN.encode()
PAD = b"x" * 3000


@pytest.mark.parametrize("raw", [
    _request(b"Authorization: Bearer " + SECRET + PAD),  # past max_header_bytes: the parser's LineTooLong
    _request(b"Cookie: session=" + SECRET + PAD),
    _request(b"Authorization: Bearer " + SECRET + b"\x01"),  # a control character in the value
    _request(b"Cookie: session=" + SECRET + b"\x7f; other=1"),
    _request(b"Bearer " + SECRET),  # a header line without a name
    _request(line=b"GET /counters/likes/" + SECRET + PAD + b" HTTP/1.1"),  # past the request line's limit
    _request(line=b"GET /counters/likes/p1?token=" + SECRET + b" HTTP/7.3"),
    _request(line=b"G\x01T /" + SECRET + b" HTTP/1.1"),
    b"Bearer " + SECRET + b"\r\n\r\n",  # not HTTP at all
], ids=["long-authorization", "long-cookie", "bad-char-authorization", "bad-char-cookie", "no-header-name",
        "long-request-line", "bad-version", "bad-method", "not-http"])
async def test_what_the_parser_refuses_is_answered_and_logged_without_the_request(
        served: tuple[str, int], raw: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """A request aiohttp's parser refuses, with the token in the offending line: a 4xx problem document that
    quotes none of it, no line at ERROR, and the token in no log record (countersink's or a library's, at
    any level) and nowhere in the answer."""
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs:
        status, headers, body = await exchange(served, raw)
    assert 400 <= status < 500, body
    assert headers["content-type"].startswith("application/problem+json")
    assert json.loads(body)["status"] == status
    assert SECRET not in body
    assert TOKEN not in json.dumps(headers)
    assert [entry for entry in logs if entry["log_level"] in ("error", "critical")] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert TOKEN not in repr(logs)
    assert TOKEN not in caplog.text
    assert all(TOKEN not in repr(r.args) and r.exc_info is None for r in caplog.records)


async def test_a_token_that_is_not_utf8_answers_401(served: tuple[str, int]) -> None:
    """A bearer token with bytes that are not UTF-8 is a wrong token: 401, not a server error."""
    status, _, body = await exchange(served, _request(b"Authorization: Bearer " + SECRET + b"\xff\xfe"))
    assert status == 401, body


async def test_every_refusal_is_a_problem_document(served: tuple[str, int]) -> None:
    """404 (an unknown path), 405 (with its Allow header), 413, 401 and the parser's 400: each an
    application/problem+json document with its status, none quoting the request."""
    base = f"http://{served[0]}:{served[1]}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        cases = [("GET", "/no/such/path", auth, None, 404), ("POST", "/counters/likes/p1", auth, None, 405),
                 ("GET", "/counters/likes/p1", auth, b"x" * 2000, 413), ("GET", "/no/such/path", {}, None, 401),
                 ("GET", "/counters/likes/p1", {"Authorization": "Bearer wrong-" + TOKEN}, None, 401),
                 ("GET", "/counters/likes/p1", {**auth, "X-Padding": "p" * 3000}, None, 400)]
        for method, path, headers, data, expected in cases:
            async with http.request(method, base + path, headers=headers, data=data) as response:
                body = await response.text()
                assert response.status == expected, (method, path, body)
                assert response.content_type == "application/problem+json", body
                document = json.loads(body)
                assert (document["status"], bool(document["title"]), bool(document["detail"])) == (expected, True, True)
                assert "no/such" not in body
                assert TOKEN not in body
                if expected == 405:
                    assert response.headers["Allow"] == "GET,HEAD"


@pytest.mark.parametrize("path", [b"/counters/likes/p1", b"/no/such/path", b"/healthz"])
async def test_an_unknown_expectation_is_refused_without_quoting_it(served: tuple[str, int], path: bytes) -> None:
    """An ``Expect`` header other than 100-continue, carrying the token: a 417 problem document (aiohttp's own
    answer, sent before any middleware, is plain text that quotes the header) with the token nowhere in it."""
    raw = _request(b"Authorization: Bearer " + SECRET, b"Expect: " + SECRET, line=b"GET " + path + b" HTTP/1.1")
    status, headers, body = await exchange(served, raw)
    assert status == 417, body
    assert headers["content-type"].startswith("application/problem+json")
    assert json.loads(body)["status"] == 417
    assert SECRET not in body
    assert TOKEN not in json.dumps(headers)


async def test_a_client_that_leaves_in_the_middle_of_a_chunked_body_adds_no_error_line(
        served: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    """A chunked body cut short by the client (the request already being handled): no ERROR line and no 500
    counted as a server failure, since anyone can do it."""
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs:
        _, writer = await asyncio.open_connection(*served)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"10\r\n" + SECRET[:4])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.sleep(0.5)
    assert [entry for entry in logs if entry["log_level"] in ("error", "critical")] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [entry for entry in logs if entry["event"] == "http_request_refused"], logs


async def test_a_broken_chunked_body_adds_no_error_line_with_the_pure_python_parser(
        served: tuple[str, int], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """With aiohttp's pure-Python parser (no C extension, or AIOHTTP_NO_EXTENSIONS set), a chunked body whose
    trailer is too long fails after the headers were taken: a 400 problem document, no ERROR line (neither for
    the request nor for the rest of the body aiohttp reads after the answer), and the token nowhere."""
    from aiohttp import http_parser, web_protocol

    monkeypatch.setattr(web_protocol, "HttpRequestParser", http_parser.HttpRequestParserPy)
    caplog.set_level(logging.DEBUG)
    raw = (b"POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: " + SECRET
           + PAD + b"\r\n\r\n")
    with capture_logs() as logs:
        status, headers, body = await exchange(served, raw)
        await asyncio.sleep(0.3)
    assert status == 400, body
    assert headers["content-type"].startswith("application/problem+json")
    assert SECRET not in body
    assert [entry for entry in logs if entry["log_level"] in ("error", "critical")] == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert TOKEN not in repr(logs)


async def test_expect_100_continue_still_gets_its_answer(served: tuple[str, int]) -> None:
    """``Expect: 100-continue`` is answered as before: an interim 100, then the request's own answer."""
    reader, writer = await asyncio.open_connection(*served)
    try:
        writer.write(_request(b"Authorization: Bearer " + SECRET, b"Expect: 100-continue",
                              line=b"GET /openapi.json HTTP/1.1"))
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        final = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
    finally:
        writer.close()
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    assert final.startswith(b"HTTP/1.1 200")


async def test_a_forbidden_answer_from_aiohttp_is_a_problem_document() -> None:
    """serve answers no 403 of its own; one raised by aiohttp (plain text there) leaves as a problem document too."""
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), COUNTERS)
    app = api.app()

    async def forbidden(request: web.Request) -> web.Response:
        raise web.HTTPForbidden()

    app.router.add_get("/forbidden", forbidden)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/forbidden")
        assert (response.status, response.content_type) == (403, "application/problem+json")
        assert (await response.json(content_type=None))["title"] == "Forbidden"


def _args() -> argparse.Namespace:
    return argparse.Namespace(counters=None, host="127.0.0.1", port=0, consistency=None)


@pytest.mark.parametrize("where", ["tokens", "tokens_file"])
def test_tokens_over_plain_http_stop_the_start(tmp_path, where: str) -> None:
    """Bearer tokens (in the variable or a file) without TLS and without allow_insecure: exit 2 at once with
    one line naming the settings that fix it, before any wait for Cassandra, and no token in it."""
    (tmp_path / "tokens").write_text(TOKEN + "\n")
    serve = {"tokens": TOKEN} if where == "tokens" else {"tokens_file": str(tmp_path / "tokens")}
    with capture_logs() as logs:
        assert serve_command(_args(), Settings(serve=serve)) == 2  # type: ignore[arg-type]
    assert [entry["event"] for entry in logs] == ["serve_settings_refused"]
    assert "COUNTERSINK_SERVE__TLS_CERT" in logs[0]["error"]
    assert "ALLOW_INSECURE=true" in logs[0]["error"]
    assert TOKEN not in repr(logs)


def test_allow_insecure_serves_tokens_over_plain_http_with_a_warning() -> None:
    """With allow_insecure, the same settings start (here up to the wait for a Cassandra that is not there),
    with a WARNING first."""
    settings = Settings(serve={"tokens": TOKEN, "allow_insecure": True, "startup_timeout_s": 0.2},  # type: ignore[arg-type]
                        cassandra={"port": 1, "connect_timeout_s": 0.2})  # type: ignore[arg-type]
    with capture_logs() as logs:
        assert serve_command(_args(), settings) == 1
    assert (logs[0]["log_level"], logs[0]["event"]) == ("warning", "serve_tokens_over_plain_http")
    assert logs[-1]["event"] == "cassandra_unreachable"
    assert TOKEN not in repr(logs)


@pytest.mark.parametrize(("host", "warned"), [(None, True), ("10.1.2.3", True), ("127.0.0.1", False),
                                              ("::1", False), ("localhost", False)])
def test_serving_without_tokens_beyond_loopback_warns(host: str | None, warned: bool) -> None:
    """No token and a listen address other than loopback (the default is every interface): anyone who reaches
    it reads every counter, so a WARNING says so first; on loopback, nothing is said."""
    settings = Settings(serve={"startup_timeout_s": 0.2},  # type: ignore[arg-type]
                        cassandra={"port": 1, "connect_timeout_s": 0.2})  # type: ignore[arg-type]
    args = argparse.Namespace(counters=None, host=host, port=0, consistency=None)
    with capture_logs() as logs:
        assert serve_command(args, settings) == 1
    warnings = [entry for entry in logs if entry["event"] == "serve_without_tokens"]
    assert len(warnings) == warned, logs
    if warned:
        assert warnings[0]["log_level"] == "warning"
        assert "COUNTERSINK_SERVE__TOKENS_FILE" in warnings[0]["why"]


async def test_a_trace_waits_within_its_time_and_a_queue_past_its_bound_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One trace runs at a time: those waiting for it are answered 504 once the time allowed (the wait
    included) is up, rather than whenever their turn comes; past MAX_TRACES_WAITING, 503 at once."""
    from countersink import serve as serve_module

    first_started = asyncio.Event()

    async def slow_trace(client: object, settings: object, query: object, counters: object) -> object:
        first_started.set()
        await asyncio.sleep(30)
        raise AssertionError("the trace outlived its time")

    monkeypatch.setattr(serve_module, "trace_records", slow_trace)
    monkeypatch.setattr(serve_module, "TRACE_TIMEOUT_S", 1)
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), COUNTERS, tracing=Settings())
    async with TestClient(TestServer(api.app())) as client:
        asked = asyncio.get_running_loop().time()
        running = asyncio.ensure_future(client.get("/trace/likes?offset=0:1"))
        await asyncio.wait_for(first_started.wait(), timeout=10)
        waiting = [asyncio.ensure_future(client.get(f"/trace/likes?offset=0:{n}"))
                   for n in range(2, 2 + serve_module.MAX_TRACES_WAITING)]
        for _ in range(1000):  # until every one waits
            if api._traces_waiting == serve_module.MAX_TRACES_WAITING:
                break
            await asyncio.sleep(0.01)
        refused = await client.get("/trace/likes?offset=0:99")
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "5"
        assert "4 traces are waiting" in (await refused.json(content_type=None))["detail"]
        answers = await asyncio.wait_for(asyncio.gather(running, *waiting), timeout=10)
        assert [a.status for a in answers] == [504] * (1 + serve_module.MAX_TRACES_WAITING)
        # Each within its own second, the wait included; one after the other would take five.
        assert asyncio.get_running_loop().time() - asked < 3


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"GET /heal"])
async def test_a_connection_that_sends_no_whole_request_is_closed_after_the_idle_time(sent: bytes) -> None:
    """Each open connection holds a descriptor: one silent from its start or stopped inside its request is
    closed after IDLE_TIMEOUT_S, while a whole request on another connection is answered meanwhile."""
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(idle_timeout_s=1), COUNTERS)
    runner = api_runner(api)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        await writer.drain()
        started = asyncio.get_running_loop().time()
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as answer:
            assert answer.status == 200
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""  # closed by the server, nothing answered
        assert 0.9 < asyncio.get_running_loop().time() - started < 5
        writer.close()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("target", ["/counters/likes/%zz", "/counters/likes/50%", "/counters/likes?key=%A"])
def test_a_percent_that_starts_no_escape_is_refused(target: str) -> None:
    """Sent as written (a client library would escape the % itself): read as its own text, it named another
    key than %25zz's; refused."""
    from countersink.serve import _refuse_loose_escapes

    with pytest.raises(web.HTTPBadRequest) as refused:
        _refuse_loose_escapes(target)
    assert "a % in the URL starts an escape of two hex digits" in refused.value.text  # type: ignore[operator]
    _refuse_loose_escapes("/counters/likes/50%25?key=%C3%A9")


def test_values_past_the_largest_double_are_valid_json() -> None:
    """A float sum past the largest double reads as infinity: JSON has no such number (nor NaN), so it is written
    as Protocol Buffers' JSON writes it, and a strict parser reads the whole answer."""
    total = new_state(KindSpec("sum", number="float"))
    for value in (1e308, 1e308):
        total.apply(value)
    values = {"total": total.value(), "points": [float("-inf"), float("nan"), 1.5]}
    assert json.loads(json.dumps(to_jsonable(values), allow_nan=False)) == {
        "total": "Infinity", "points": ["-Infinity", "NaN", 1.5]}


async def test_a_failed_request_is_counted_once(served: tuple[str, int]) -> None:
    """A request that fails in its route (here: the Cassandra client was never started) is a 500 counted under
    its route by the middleware; it was counted a second time under ``unparsed`` by the runner's error handler,
    which counts only what the parser refused. A request the parser refuses is still counted there."""
    from countersink.metrics import METRICS

    def counted(route: str, status: str) -> float:
        return METRICS.serve_requests.labels(route=route, status=status)._value.get()  # type: ignore[attr-defined,no-any-return]

    routed, unparsed = counted("/counters/{name}/{key}", "500"), counted("unparsed", "500")
    with capture_logs():
        status, _, _ = await exchange(served, _request(b"Authorization: Bearer " + TOKEN.encode()))
    assert status == 500
    assert counted("/counters/{name}/{key}", "500") == routed + 1
    assert counted("unparsed", "500") == unparsed
    refused = counted("unparsed", "400")
    status, _, _ = await exchange(served, b"GET /\x00 HTTP/1.1\r\nHost: test\r\n\r\n")
    assert status == 400
    assert counted("unparsed", "400") == refused + 1


def test_the_document_describes_keys_as_the_server_takes_them() -> None:
    """A series' key is an instance key as a single read's is (the server refuses a lone backslash in both);
    /trace's key is a record's message key, any text (it took the instance keys' pattern, and the server answers
    key=%5C); every key's description says it is bounded in bytes (the schema can only count characters)."""
    spec = openapi_document(ServeSettings(), COUNTERS, tracing=True)

    def key_of(path: str) -> dict[str, object]:
        (found,) = [p["schema"] for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "key"]
        return found  # type: ignore[no-any-return]

    assert key_of("/counters/{name}/{key}/series") == key_of("/counters/{name}/{key}")
    assert "pattern" not in key_of("/trace/{topic}")
    for path in ("/counters/{name}/{key}", "/trace/{topic}"):
        assert "at most 1024 bytes of UTF-8" in str(key_of(path)["description"])


async def test_admin_tokens_alone_guard_the_reads_too() -> None:
    """With admin tokens and no read tokens, every route but the probes needs a token (an admin one: admins read
    too); reads, /metrics and /openapi.json answered anyone."""
    from countersink.serve import Resetting, Tokens
    from countersink.settings import KafkaSettings

    admin = "ops:" + "a" * 24
    settings = ServeSettings(admin_tokens=SecretStr(admin), admin_cassandra_username="writer")
    client = CassandraClient(CassandraSettings())
    api = ReadApi(client, settings, COUNTERS,
                  resetting=Resetting(Tokens(settings, admin=True), client, KafkaSettings()))
    async with TestClient(TestServer(api.app())) as http:
        for path in ("/counters/likes/p1", "/metrics", "/openapi.json"):
            assert (await http.get(path)).status == 401, path
        assert (await http.get("/healthz")).status == 200
        # Past the guard with the admin token: the request reaches validation (a bad name, before any read).
        answer = await http.get("/counters/Likes/p1", headers={"Authorization": "Bearer " + "a" * 24})
        assert answer.status == 400


class RegistryAwayAfterFirstLookup:
    """A registry that knows ``likes`` once, then has to read Cassandra again and finds too few replicas."""

    def __init__(self) -> None:
        self.lookups = 0

    async def lookup(self, name: str) -> tuple[bool, object]:
        self.lookups += 1
        if self.lookups > 1:
            raise CassandraUnavailableError("too few replicas")
        return True, None


@pytest.mark.parametrize("path", ["/counters/likes/p1/series?from=now-1h&to=now",
                                  "/counters/likes/series?from=now-1h&to=now"])
async def test_a_registry_read_that_fails_inside_a_request_is_a_problem_document(path: str) -> None:
    """Without a definitions file, serve looks counters up in the registry, which may read Cassandra on any
    look-up: a failure there is answered as every read's failure is (503, Retry-After), not as aiohttp's 500."""
    registry = RegistryAwayAfterFirstLookup()
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), None,
                  registry=cast(CounterRegistry, registry))
    async with TestClient(TestServer(api.app())) as client:
        response = await client.get(path)
        assert response.status == 503
        assert response.content_type == "application/problem+json"
        assert response.headers["Retry-After"] == "2"
    assert registry.lookups == 2


async def test_a_chunked_body_is_read_only_for_a_caller_with_a_token_and_within_the_idle_time() -> None:
    """The token is checked before a chunked body is read: a caller without one is answered 401 at once, not
    after a body it never ends (each such connection held a descriptor for good). A caller with one that stops
    sending its body is answered 408 after the idle time."""
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(tokens=SecretStr(TOKEN), idle_timeout_s=1),
                  COUNTERS)
    runner = api_runner(api, shutdown_timeout=1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        address = runner.addresses[0][:2]
        started = asyncio.get_running_loop().time()
        status, _, _ = await exchange(address, b"POST /counters/likes/reset HTTP/1.1\r\nHost: test\r\n"
                                               b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"ke")
        assert status == 401
        assert asyncio.get_running_loop().time() - started < 0.9
        status, _, body = await exchange(address, b"POST /counters/likes/reset HTTP/1.1\r\nHost: test\r\n"
                                                  b"Authorization: Bearer " + SECRET + b"\r\n"
                                                  b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"ke")
        assert status == 408, body
        assert "did not come within 1" in json.loads(body)["detail"]
        # A byte now and then, each within the idle time, to a probe (no token needed): one deadline for the
        # whole body (each read's own held the connection for as long as the bytes came).
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
        started = asyncio.get_running_loop().time()
        answer = b""
        for _ in range(10):
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(100), 0.6)
            if answer:
                break
            writer.write(b"1\r\nx\r\n")
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert asyncio.get_running_loop().time() - started < 3
    finally:
        await runner.cleanup()


async def test_the_probes_are_answered_however_many_reads_are_running() -> None:
    """At max_requests reads at once, a read is refused 503 but /healthz and /readyz are answered: a liveness
    probe refused under load had the process restarted while Cassandra was slow."""
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(max_requests=1), COUNTERS)
    async with TestClient(TestServer(api.app())) as client:
        api._handling = 1  # as while one read runs
        assert (await client.get("/counters/likes/p1")).status == 503
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/readyz")).status == 503  # not connected: answered, not refused
        assert "more than" not in await (await client.get("/readyz")).text()


async def test_a_refused_reset_names_no_text_of_the_caller_s_choosing() -> None:
    """Anyone may send a reset without the admin token: its refusal's line names the counter only when the path
    names one, never 4 KB of text of the caller's."""
    from countersink.serve import Resetting, Tokens
    from countersink.settings import KafkaSettings

    settings = ServeSettings(admin_tokens=SecretStr("ops:" + "a" * 24), admin_cassandra_username="writer")
    cassandra = CassandraClient(CassandraSettings())
    api = ReadApi(cassandra, settings, COUNTERS,
                  resetting=Resetting(Tokens(settings, admin=True), cassandra, KafkaSettings()))
    async with TestClient(TestServer(api.app())) as client:
        with capture_logs() as logs:
            assert (await client.post("/counters/INJECTED" + "A" * 1000 + "/reset")).status == 401
            assert (await client.post("/counters/likes/reset")).status == 401
    assert [e["counter"] for e in logs if e["event"] == "reset_refused"] == ["(not a counter name)", "likes"]


async def test_a_trace_of_a_topic_no_counter_reads_is_refused_before_kafka_is_read() -> None:
    """A read token traces records of counted topics only: another topic (Kafka's own among them) is refused
    404 before anything is read, also when serve is given a definitions file."""
    from countersink.commands.trace import TraceQuery, TraceRefusedError
    from countersink.commands.trace import trace as trace_records

    for topic in ("others", "__consumer_offsets"):
        with pytest.raises(TraceRefusedError, match=f"no counter reads topic '{topic}'"):
            await trace_records(CassandraClient(CassandraSettings()), Settings(), TraceQuery(topic, offset=(0, 0)),
                                COUNTERS)


async def test_the_document_and_a_trace_answer_503_when_the_registry_cannot_be_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a definitions file, /openapi.json and /trace read the counter registry: Cassandra away is 503
    with Retry-After, as for every read, not a 500 logged as a failure of the server."""
    from countersink import serve as serve_module

    class RegistryAway:
        async def counters(self) -> object:
            raise CassandraUnavailableError("no host available")

    async def trace_away(client: object, settings: object, query: object, counters: object) -> object:
        raise CassandraUnavailableError("no host available")

    monkeypatch.setattr(serve_module, "trace_records", trace_away)
    api = ReadApi(CassandraClient(CassandraSettings()), ServeSettings(), None, tracing=Settings(),
                  registry=cast(CounterRegistry, RegistryAway()))
    async with TestClient(TestServer(api.app())) as client:
        with capture_logs() as logs:
            for path in ("/openapi.json", "/trace/likes?offset=0:1"):
                response = await client.get(path)
                assert (response.status, response.headers.get("Retry-After")) == (503, "2"), path
    assert [e for e in logs if e["log_level"] == "error"] == []


async def test_a_request_the_parser_refuses_names_no_versions(served: tuple[str, int]) -> None:
    """A request aiohttp's parser refuses is answered by no route: its Server header was aiohttp's own, naming
    Python's version and aiohttp's."""
    status, headers, _ = await exchange(served, _request(b"Authorization: Bearer " + SECRET + PAD))
    assert status == 400
    assert headers["server"] == "countersink"
