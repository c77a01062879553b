"""``/healthz``, ``/readyz`` and ``/metrics`` for probes and Prometheus, served by aiohttp.

``/metrics`` is prometheus-client's own aiohttp handler (content negotiation, OpenMetrics, ``name[]``
filters); :func:`metrics_handler` lets a process refresh what is read at scrape time first (the driver's
counts, the GC status) and is shared with ``countersink serve``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from countersink.logs import get_logger
from countersink.metrics import METRICS

log = get_logger(__name__)

BeforeScrape = Callable[[], Awaitable[None]]

# A refresh that takes longer than this is skipped for this scrape: the scrape still answers, with what the
# process last knew, well inside Prometheus' default 10 s scrape timeout.
SCRAPE_REFRESH_TIMEOUT_S = 2.0


def metrics_handler(before_scrape: BeforeScrape | None = None
                    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The ``/metrics`` handler: ``before_scrape`` (bounded in time, its failures logged), then the registry."""
    export = make_aiohttp_handler(METRICS.registry)

    async def handle(request: web.Request) -> web.StreamResponse:
        if before_scrape is not None:
            try:
                await asyncio.wait_for(before_scrape(), SCRAPE_REFRESH_TIMEOUT_S)
            except Exception as exc:  # a metric that cannot be refreshed must not fail the whole scrape
                log.warning("metrics_refresh_failed", error=str(exc) or type(exc).__name__)
        return await export(request)

    return handle


class HealthServer:
    """Serves liveness, readiness (a callable) and metrics on ``host:port``; ``port=0`` picks a free one.
    ``start()``/``stop()`` (safe twice)."""

    def __init__(self, port: int, ready: Callable[[], bool], host: str = "0.0.0.0",  # noqa: S104
                 before_scrape: BeforeScrape | None = None, why_not_ready: Callable[[], str] | None = None) -> None:
        self.host = host
        self.port = port
        self._ready = ready
        self._before_scrape = before_scrape
        self._why_not_ready = why_not_ready  # a line added to /readyz's 503 ("waiting for topics: a, b")
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        # Probes send no body: anything larger than a request line and a few headers is refused.
        app = web.Application(client_max_size=1024)
        app.add_routes([
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", metrics_handler(self._before_scrape)),
        ])
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("health_server_started", port=self.port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready = self._ready()
        why = "" if ready or self._why_not_ready is None else self._why_not_ready()
        return web.Response(status=200 if ready else 503,
                            text="ready\n" if ready else f"not ready{': ' + why if why else ''}\n")
