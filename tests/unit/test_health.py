"""The health server answers liveness, readiness and metrics, and refuses anything else."""

from __future__ import annotations

import asyncio

from countersink.health import HealthServer


async def _get(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    response = await reader.read()
    writer.close()
    status = int(response.split(b" ", 2)[1])
    return status, response.split(b"\r\n\r\n", 1)[1]


async def test_probes_and_metrics() -> None:
    """/healthz is 200; /readyz follows the readiness callable; /metrics serves Prometheus text."""
    ready = False
    server = HealthServer(0, lambda: ready, host="127.0.0.1")
    await server.start()
    try:
        assert await _get(server.port, b"GET /healthz HTTP/1.1\r\n\r\n") == (200, b"ok\n")
        assert (await _get(server.port, b"GET /readyz HTTP/1.1\r\n\r\n"))[0] == 503
        ready = True
        assert (await _get(server.port, b"GET /readyz HTTP/1.1\r\n\r\n"))[0] == 200
        status, body = await _get(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status == 200
        assert b"countersink_events_applied" in body
        assert (await _get(server.port, b"POST /healthz HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await _get(server.port, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
    finally:
        await server.stop()
        await server.stop()  # safe twice


async def test_unready_says_why() -> None:
    """/readyz's 503 carries the reason the process gives (a consumer waiting for its topics names them)."""
    why = "waiting for topics: trades"
    server = HealthServer(0, lambda: False, host="127.0.0.1", why_not_ready=lambda: why)
    await server.start()
    try:
        answer = await _get(server.port, b"GET /readyz HTTP/1.1\r\n\r\n")
        assert answer == (503, b"not ready: waiting for topics: trades\n")
        why = ""
        assert await _get(server.port, b"GET /readyz HTTP/1.1\r\n\r\n") == (503, b"not ready\n")
    finally:
        await server.stop()
