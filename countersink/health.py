"""``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP/1.1, for probes and Prometheus.

Small on purpose: three GET paths, bounded request size, one response per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from countersink.logs import get_logger
from countersink.metrics import METRICS

log = get_logger(__name__)

_MAX_REQUEST_BYTES = 8192


class HealthServer:
    """Serves liveness, readiness (a callable) and metrics on ``host:port``; ``port=0`` picks a free one."""

    def __init__(self, port: int, ready: Callable[[], bool], host: str = "0.0.0.0",  # noqa: S104
                 why_not_ready: Callable[[], str] | None = None) -> None:
        self.host = host
        self.port = port
        self._ready = ready
        self._why_not_ready = why_not_ready  # a line added to /readyz's 503 ("waiting for topics: a, b")
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("health_server_started", port=self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        if len(head) > _MAX_REQUEST_BYTES:
            await self._respond(writer, 431, b"request too large\n")
            return
        parts = head.split(b" ", 2)
        method, path = (parts[0], parts[1].split(b"?")[0]) if len(parts) >= 2 else (b"", b"")
        if method != b"GET":
            await self._respond(writer, 405, b"GET only\n")
        elif path == b"/healthz":
            await self._respond(writer, 200, b"ok\n")
        elif path == b"/readyz":
            ready = self._ready()
            why = "" if ready or self._why_not_ready is None else self._why_not_ready()
            body = b"ready\n" if ready else f"not ready{': ' + why if why else ''}\n".encode()
            await self._respond(writer, 200 if ready else 503, body)
        elif path == b"/metrics":
            await self._respond(writer, 200, generate_latest(METRICS.registry), CONTENT_TYPE_LATEST)
        else:
            await self._respond(writer, 404, b"not found\n")

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                       content_type: str = "text/plain; charset=utf-8") -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large", 503: "Unavailable"}
        writer.write(
            f"HTTP/1.1 {status} {reason.get(status, '')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
