"""``countersink serve``'s secrets under attack, on a real server (HTTPS, bearer tokens) over real Cassandra.

A token in a request the HTTP parser refuses reaches neither the answer nor the log; revoking a token by
rewriting, breaking or deleting the tokens file takes effect on the running server and is said loudly; and
tokens over plain HTTP need ``allow_insecure``. The secured stack is not needed: the server's certificate is
made here, and Cassandra is the plain test server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from countersink.settings import CassandraSettings
from stack.secure import make_certificates
from stack.servers import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COUNTERS = '[[counter]]\nname = "likes"\nkind = "count"\ntopics = ["likes"]\nkey = ["post_id"]\n'


def _token(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex}"


@dataclass
class Serve:
    process: asyncio.subprocess.Process
    log: Path
    base: str
    tls: ssl.SSLContext | None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[dict[str, object]]:
        """Every line written, each a JSON object (a line that is not fails the test)."""
        return [json.loads(line) for line in self.text().splitlines() if line.strip()]

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls if self.tls else False))

    async def get(self, path: str, token: str | None = None) -> tuple[int, str, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session() as http, http.get(self.base + path, headers=headers) as response:
            return response.status, response.content_type, await response.text()

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), 60)


async def start_serve(cassandra: CassandraSettings, tmp_path: Path, tls: bool, **serve: object) -> Serve:
    """``countersink serve`` in a process of its own, JSON logs to a file."""
    port = free_port()
    counters = tmp_path / "counters.toml"
    counters.write_text(COUNTERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    env.update({"COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra.contact_points[0],
                "COUNTERSINK_CASSANDRA__PORT": str(cassandra.port),
                "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra.keyspace, "COUNTERSINK_LOG_FORMAT": "json",
                "COUNTERSINK_SERVE__HOST": "127.0.0.1", "COUNTERSINK_SERVE__PORT": str(port),
                "PYTHONPATH": str(REPO)})
    context = None
    if tls:
        certs = make_certificates(tmp_path / f"certs-{uuid.uuid4().hex[:6]}")
        env.update({"COUNTERSINK_SERVE__TLS_CERT": str(certs.server_cert),
                    "COUNTERSINK_SERVE__TLS_KEY": str(certs.server_key)})
        context = ssl.create_default_context(cafile=str(certs.ca_cert))
    env.update({f"COUNTERSINK_SERVE__{name.upper()}": str(value) for name, value in serve.items()})
    log = tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "countersink.cli", "serve", "--counters", str(counters), env=env, cwd=REPO,
            stdout=out, stderr=out)
    return Serve(process, log, f"{'https' if tls else 'http'}://127.0.0.1:{port}", context)


async def wait_until(serve: Serve, path: str, status: int, token: str | None = None, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    last: object = None
    while time.monotonic() < deadline:
        if serve.process.returncode is not None:
            pytest.fail(f"serve exited with {serve.process.returncode}:\n{serve.text()}")
        try:
            last = await serve.get(path, token)
            if last[0] == status:  # type: ignore[index]
                return
        except aiohttp.ClientConnectionError as exc:
            last = exc
        await asyncio.sleep(0.2)
    pytest.fail(f"{path} never answered {status} (last: {last!r}):\n{serve.text()}")


@pytest.fixture
async def stopped() -> AsyncIterator[list[Serve]]:
    """Servers to stop at the end of the test, whatever happens."""
    servers: list[Serve] = []
    yield servers
    for serve in servers:
        if serve.process.returncode is None:
            serve.process.kill()
            await serve.process.wait()


async def raw_exchange(serve: Serve, raw: bytes) -> bytes:
    """``raw`` sent as it is on a new TLS connection; everything the server answers until it closes."""
    host, port = serve.base.split("://")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=serve.tls)
    try:
        writer.write(raw)
        await writer.drain()
        answer = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            answer += chunk
        return answer
    finally:
        writer.close()


async def test_a_token_in_a_refused_request_reaches_neither_the_answer_nor_the_log(
        cassandra_settings: CassandraSettings, tmp_path: Path, stopped: list[Serve]) -> None:
    """Oversize and malformed Authorization and Cookie headers and request lines carrying the token, sent
    over HTTPS to a running server: each answered with a 4xx problem document that holds no part of the
    token; 404 and 405 are problem documents too; the server answers normally after; and once it has
    stopped, no line it wrote holds the token, and none is at ERROR."""
    token = _token("attack")
    secret = token.encode()
    serve = await start_serve(cassandra_settings, tmp_path, tls=True, tokens=token, max_header_bytes=2048,
                              max_url_bytes=1024)
    stopped.append(serve)
    await wait_until(serve, "/readyz", 200)
    pad = b"x" * 9000
    attacks = {
        "oversize authorization": b"Authorization: Bearer " + secret + pad,
        "oversize cookie": b"Cookie: session=" + secret + pad,
        "authorization with a control character": b"Authorization: Bearer " + secret + b"\x01",
        "cookie with a control character": b"Cookie: session=" + secret + b"\x00",
        "a header line without a name": b"Bearer " + secret,
    }
    requests = {name: b"GET /counters/likes/p1 HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n\r\n"
                for name, line in attacks.items()}
    requests["oversize request line"] = b"GET /counters/likes/" + secret + pad + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    requests["bad request line"] = b"GET /?access_token=" + secret + b" HTTP/1.1 extra\r\nHost: x\r\n\r\n"
    requests["not http"] = b"Authorization: Bearer " + secret + b"\r\n\r\n"
    for name, raw in requests.items():
        answer = await raw_exchange(serve, raw)
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        assert 400 <= status < 500, (name, answer[:300])
        assert b"content-type: application/problem+json" in head.lower(), (name, head)
        assert json.loads(body)["status"] == status, name
        assert secret[:12] not in answer, (name, answer[:300])
    for method, path, status in (("GET", "/no/such/path", 404), ("DELETE", "/counters/likes/p1", 405)):
        async with serve.session() as http, http.request(method, serve.base + path,
                                                          headers={"Authorization": f"Bearer {token}"}) as response:
            assert (response.status, response.content_type) == (status, "application/problem+json")
    assert (await serve.get("/counters/likes/p1", token))[0] == 200
    assert await serve.stop() == 0
    written = serve.text()
    assert token[:12] not in written
    assert [line for line in serve.lines() if line.get("level") in ("error", "critical")] == []


async def test_revoking_a_token_takes_effect_on_the_running_server(
        cassandra_settings: CassandraSettings, tmp_path: Path, stopped: list[Serve]) -> None:
    """As an operator revokes: the file T1, T2 rewritten as T2 and a token too short revokes both (nothing
    of a broken file is applied), unready, one ERROR line with the reason; fixed to T2, T2 only; the file
    deleted, no token and unready; a new file, its token. The log never holds a token."""
    t1, t2, t3 = _token("first"), _token("second"), _token("third")
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# the API's tokens\n{t1}\n{t2}\n")
    serve = await start_serve(cassandra_settings, tmp_path, tls=True, tokens_file=tokens_file)
    stopped.append(serve)
    await wait_until(serve, "/readyz", 200)
    for token in (t1, t2):
        assert (await serve.get("/counters/likes/p1", token))[0] == 200

    tokens_file.write_text(f"{t2}\nshort\n")
    await wait_until(serve, "/counters/likes/p1", 401, t1, within_s=5)
    assert (await serve.get("/counters/likes/p1", t2))[0] == 401
    status, _, body = await serve.get("/readyz")
    assert (status, body) == (503, "not ready: no bearer token is accepted\n")
    refusals = [line for line in serve.lines() if line.get("event") == "tokens_file_refused"]
    assert [(line["level"], line["cause"], line["revoked"]) for line in refusals] == [("error", "invalid", 2)]
    assert "line 2: a token shorter than 16 characters" in str(refusals[0]["reason"])

    tokens_file.write_text(f"{t2}\n")
    await wait_until(serve, "/counters/likes/p1", 200, t2, within_s=5)
    assert (await serve.get("/counters/likes/p1", t1))[0] == 401
    assert (await serve.get("/readyz"))[0] == 200

    tokens_file.unlink()
    await wait_until(serve, "/readyz", 503, within_s=5)
    assert (await serve.get("/counters/likes/p1", t2))[0] == 401
    missing = [line for line in serve.lines() if line.get("event") == "tokens_file_refused"][-1]
    assert (missing["level"], missing["cause"], missing["revoked"]) == ("error", "missing", 1)

    tokens_file.write_text(f"{t3}\n")
    await wait_until(serve, "/readyz", 200, within_s=5)
    assert (await serve.get("/counters/likes/p1", t3))[0] == 200
    assert (await serve.get("/counters/likes/p1", t2))[0] == 401
    metrics = (await serve.get("/metrics", t3))[2]
    assert 'countersink_serve_tokens_file_refused_total{reason="invalid"} 1.0' in metrics
    assert 'countersink_serve_tokens_file_refused_total{reason="missing"} 1.0' in metrics
    assert "countersink_serve_tokens_accepted 1.0" in metrics
    assert await serve.stop() == 0
    written = serve.text()
    assert [token for token in (t1, t2, t3) if token in written] == []


async def test_tokens_over_plain_http_need_allow_insecure(
        cassandra_settings: CassandraSettings, tmp_path: Path, stopped: list[Serve]) -> None:
    """Tokens without TLS: serve exits 2 at once with one line saying what to set; with allow_insecure it
    serves them, after a WARNING at start."""
    token = _token("plain")
    refused = await start_serve(cassandra_settings, tmp_path, tls=False, tokens=token)
    stopped.append(refused)
    assert await asyncio.wait_for(refused.process.wait(), 30) == 2
    (line,) = refused.lines()
    assert (line["level"], line["event"]) == ("error", "serve_settings_refused")
    assert "COUNTERSINK_SERVE__ALLOW_INSECURE=true" in str(line["error"])

    allowed = await start_serve(cassandra_settings, tmp_path, tls=False, tokens=token, allow_insecure="true")
    stopped.append(allowed)
    await wait_until(allowed, "/counters/likes/p1", 200, token)
    first = allowed.lines()[0]
    assert (first["level"], first["event"]) == ("warning", "serve_tokens_over_plain_http")
    assert await allowed.stop() == 0
    assert token not in refused.text() + allowed.text()
