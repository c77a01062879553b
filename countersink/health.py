"""``/healthz``, ``/readyz`` and ``/metrics`` for probes and Prometheus, served by aiohttp.

``/metrics`` is prometheus-client's own aiohttp handler (content negotiation, OpenMetrics, ``name[]``
filters); :func:`metrics_handler` lets a process refresh what is read at scrape time first (the driver's
counts, the GC status) and is shared with ``countersink serve``, as is :class:`QuietAppRunner`, which
answers what aiohttp's HTTP parser refuses with a problem document that quotes none of the request, and
logs it without the parser's message (it quotes the offending line: an ``Authorization`` header, a cookie).
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import LineTooLong
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


def problem_response(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    """An RFC 9457 problem document (``application/problem+json``): a status, its title and a reason."""
    title = HTTPStatus(status).phrase
    return web.Response(status=status, headers=headers, content_type="application/problem+json",
                        text=json.dumps({"title": title, "status": status, "detail": detail}))


def where_raised(exc: BaseException | None, frames: int = 6) -> list[str]:
    """The last ``frames`` frames of a traceback as ``file:line function``: where, without the message,
    which may quote the request."""
    if exc is None:
        return []
    return [f"{frame.filename}:{frame.lineno} {frame.name}"
            for frame in traceback.extract_tb(exc.__traceback__)[-frames:]]


def _parser_detail(status: int, exc: BaseException | None) -> str:
    if isinstance(exc, LineTooLong):
        return "the request line or a header line is longer than this server takes"
    if status < 500:
        return f"the request is not valid HTTP/1.1 ({type(exc).__name__ if exc else 'unparsed'})"
    if status == HTTPStatus.GATEWAY_TIMEOUT:
        return "the request took too long"
    return "the server failed to answer this request; its log says where"


class QuietRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, with its error answers and error logs replaced.

    aiohttp answers a request its parser refuses with the parser's message as the body, and logs it at ERROR
    with the message and stack frames: both quote the offending line, an ``Authorization`` header or a
    cookie among them, and anyone can send one. Here the answer is a problem document naming only the kind
    of error, the log line is at DEBUG, and a failure of the server itself (500) is logged at ERROR with the
    error's type and where it was raised, never its message."""

    on_refused: Callable[[int], None] | None = None

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            log.error("http_request_failed", status=status, error=type(exc).__name__ if exc else None,
                      where=where_raised(exc))
        else:
            log.debug("http_request_refused", status=status, error=type(exc).__name__ if exc else None)
        # A request the application routed was counted by its own middleware (serve's _observed), a failure
        # included; only what never reached it (the parser's refusals) is counted here.
        if self.on_refused is not None and getattr(request, "_match_info", None) is None:
            self.on_refused(status)
        if request.writer.output_size > 0:  # some of a response went out already: the connection is broken
            raise ConnectionError("response already started; cannot send an error answer")
        response = problem_response(status, _parser_detail(status, exc))
        # Never routed, so no on_response_prepare names the server: aiohttp's default names its and Python's versions.
        response.headers["Server"] = "countersink"
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError):
            # A body the client broke, met again when aiohttp reads what is left of it after the answer:
            # anyone can send one, so not an ERROR.
            log.debug("http_request_refused", status=400, error=type(exc).__name__)
            return
        log.error("http_connection_failed", message=str(args[0]) if args else None,
                  error=type(exc).__name__ if isinstance(exc, BaseException) else None,
                  where=where_raised(exc if isinstance(exc, BaseException) else None))

    def log_debug(self, *args: Any, **kw: Any) -> None:
        if self.debug:
            log.debug("http_connection_debug", message=str(args[0]) if args else None)


class _QuietServer(web.Server):
    def __init__(self, *args: Any, on_refused: Callable[[int], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_refused = on_refused

    def __call__(self) -> web.RequestHandler:
        handler = QuietRequestHandler(self, loop=self._loop, **self._kwargs)
        handler.on_refused = self._on_refused
        return handler


def _unquoted_expectations(handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                           on_refused: Callable[[int], None] | None
                           ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """``handler``, with an ``Expect`` header other than ``100-continue`` answered 417 by a problem document.
    aiohttp answers it itself, before any middleware, as plain text that quotes the header."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        expect = request.headers.get(hdrs.EXPECT)
        if expect and request.version >= HttpVersion11 and expect.lower() != "100-continue":
            status = int(HTTPStatus.EXPECTATION_FAILED)
            log.debug("http_request_refused", status=status, error="unknown Expect")
            if on_refused is not None:
                on_refused(status)
            return problem_response(status, "the only expectation taken is 100-continue")
        return await handler(request)

    return handle


# What asyncio says when accept() finds no descriptor left: once per waiting connection and retry, so a
# flood of connections made it thousands of lines a second, each with its stack.
_OUT_OF_DESCRIPTORS = "socket.accept() out of system resource"
OUT_OF_DESCRIPTORS_LOG_EVERY_S = 10.0


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, clock: Callable[[], float] = time.monotonic) -> None:
    """Make ``loop`` log accept()'s running out of descriptors as one ``connections_refused`` line at most
    every :data:`OUT_OF_DESCRIPTORS_LOG_EVERY_S`, counting those it left out; anything else goes to the
    handler it had."""
    previous = loop.get_exception_handler()
    last = [float("-inf")]
    left_out = [0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith(_OUT_OF_DESCRIPTORS):
            if previous is None:
                loop.default_exception_handler(context)
            else:
                previous(loop, context)
            return
        now = clock()
        if now - last[0] < OUT_OF_DESCRIPTORS_LOG_EVERY_S:
            left_out[0] += 1
            return
        exc = context.get("exception")
        log.error("connections_refused", error=f"no file descriptor left to accept a connection "
                  f"({getattr(exc, 'strerror', None) or exc}): as many connections are open as the process may "
                  "hold; they are accepted again once some close", same_since_last=left_out[0])
        last[0], left_out[0] = now, 0

    loop.set_exception_handler(handler)


class QuietAppRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections are each a :class:`QuietRequestHandler`;
    ``on_refused(status)`` is called for each request answered by :meth:`QuietRequestHandler.handle_error`
    (refused by the parser, or failed)."""

    def __init__(self, app: web.Application, *, on_refused: Callable[[int], None] | None = None,
                 shutdown_timeout: float = 60.0, **handler_args: Any) -> None:
        super().__init__(app, shutdown_timeout=shutdown_timeout, **handler_args)
        self._handler_args = handler_args
        self._on_refused = on_refused

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the application's start-up, and the handler it routes with
        return _QuietServer(_unquoted_expectations(made.request_handler, self._on_refused),
                            request_factory=made.request_factory,
                            handler_cancellation=made.handler_cancellation, on_refused=self._on_refused,
                            **self._handler_args)


class HealthServer:
    """Serves liveness, readiness (a callable) and metrics on ``host:port``; ``port=0`` picks a free one.
    ``start()``/``stop()`` (safe twice)."""

    def __init__(self, port: int, ready: Callable[[], bool], host: str = "127.0.0.1",
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
        runner = QuietAppRunner(self.app(), access_log=None, shutdown_timeout=1)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("health_server_started", host=self.host, port=self.port)

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
