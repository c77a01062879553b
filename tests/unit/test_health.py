"""The health server answers liveness, readiness and metrics through aiohttp, and refuses anything else
(quietly: what its parser refuses is neither quoted nor logged at ERROR); it listens on loopback by default."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from structlog.testing import capture_logs

from countersink.health import OUT_OF_DESCRIPTORS_LOG_EVERY_S, HealthServer, quiet_accept_errors
from countersink.settings import Settings


async def test_probes_and_metrics() -> None:
    """/healthz is 200; /readyz follows the readiness callable; /metrics serves Prometheus text."""
    ready = False
    server = HealthServer(0, lambda: ready, host="127.0.0.1")
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as response:
                assert (response.status, await response.text()) == (200, "ok\n")
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 503
            ready = True
            async with http.get(f"{base}/readyz") as response:
                assert response.status == 200
            async with http.get(f"{base}/metrics") as response:
                assert response.status == 200
                assert response.content_type == "text/plain"
                body = await response.text()
            assert "countersink_events_applied_total" in body
            async with http.post(f"{base}/healthz") as response:
                assert response.status == 405
            async with http.get(f"{base}/nope") as response:
                assert response.status == 404
    finally:
        await server.stop()
        await server.stop()  # safe twice


async def test_openmetrics_is_negotiated() -> None:
    """A scraper that asks for OpenMetrics gets it: the handler is prometheus-client's own."""
    server = HealthServer(0, lambda: True, host="127.0.0.1")
    await server.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{server.port}/metrics",
                headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as response:
            assert response.content_type == "application/openmetrics-text"
            assert (await response.text()).rstrip().endswith("# EOF")
    finally:
        await server.stop()


async def test_a_failing_refresh_still_answers() -> None:
    """A refresh before the scrape that fails or hangs is skipped: the scrape still answers 200."""
    calls = []

    async def broken() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cassandra away")
        await asyncio.sleep(60)

    server = HealthServer(0, lambda: True, host="127.0.0.1", before_scrape=broken)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(f"http://127.0.0.1:{server.port}/metrics") as response:
                    assert response.status == 200
        assert len(calls) == 2
    finally:
        await server.stop()


async def test_unready_says_why() -> None:
    """/readyz's 503 carries the reason the process gives (a consumer waiting for its topics names them)."""
    why = "waiting for topics: trades"
    server = HealthServer(0, lambda: False, host="127.0.0.1", why_not_ready=lambda: why)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{server.port}/readyz") as response:
                assert (response.status, await response.text()) == (503, "not ready: waiting for topics: trades\n")
            why = ""
            async with http.get(f"http://127.0.0.1:{server.port}/readyz") as response:
                assert (response.status, await response.text()) == (503, "not ready\n")
    finally:
        await server.stop()


async def test_it_listens_on_this_host_only_unless_told() -> None:
    """Without a host the health server listens on the loopback address only; the consumer's and the GC's
    settings default to it too (the image sets 0.0.0.0)."""
    server = HealthServer(0, lambda: True)
    await server.start()
    try:
        assert server._runner is not None
        assert [address[0] for address in server._runner.addresses] == ["127.0.0.1"]
    finally:
        await server.stop()
    settings = Settings()
    assert (settings.consumer.health_host, settings.gc.health_host) == ("127.0.0.1", "127.0.0.1")


async def test_a_request_the_parser_refuses_is_answered_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A header past aiohttp's limit: a problem document quoting none of it, and no log line at ERROR."""
    caplog.set_level(logging.DEBUG)
    server = HealthServer(0, lambda: True, host="127.0.0.1")
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nCookie: s=hdr-7f3b-" + b"x" * 9000 + b"\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
        writer.close()
    finally:
        await server.stop()
    assert answer.startswith(b"HTTP/1.1 400 ") or answer.startswith(b"HTTP/1.0 400 "), answer
    assert b"application/problem+json" in answer
    assert b"hdr-7f3b" not in answer
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "hdr-7f3b" not in caplog.text


async def test_the_consumer_listens_where_its_settings_say() -> None:
    """The consumer's health server takes COUNTERSINK_CONSUMER__HEALTH_HOST."""
    from consumer.service import ConsumerService
    from schemas.definitions import parse_definitions

    counters = parse_definitions('[[counter]]\nname = "n"\nkind = "count"\ntopics = ["t"]\nkey = ["k"]\n')
    service = ConsumerService(Settings(consumer={"health_host": "127.0.0.2"}), counters)  # type: ignore[arg-type]
    try:
        assert service.health.host == "127.0.0.2"
    finally:
        await service.close()


async def test_a_failing_handler_is_logged_with_its_type_and_place_not_its_message() -> None:
    """A handler that raises: a 500 problem document, and one ERROR line naming the error's type and where it
    was raised, without its message (which may quote the request)."""
    from aiohttp import web

    from countersink.health import QuietAppRunner

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("quoting quoted-header-value-7f3a")

    app = web.Application()
    app.router.add_get("/broken", broken)
    runner = QuietAppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as http, http.get(
                    f"http://127.0.0.1:{runner.addresses[0][1]}/broken") as response:
                assert (response.status, response.content_type) == (500, "application/problem+json")
                assert "7f3a" not in await response.text()
    finally:
        await runner.cleanup()
    failed = [("error", "http_request_failed", "RuntimeError")]
    assert [(e["log_level"], e["event"], e["error"]) for e in logs] == failed
    assert any("broken" in frame for frame in logs[0]["where"])
    assert "7f3a" not in repr(logs)


async def test_running_out_of_descriptors_is_one_line_every_few_seconds_not_one_per_connection() -> None:
    """asyncio reports accept()'s EMFILE once per waiting connection and retry (a flood of half-open
    connections made it 5,700 lines a second): one ``connections_refused`` line per interval, counting those
    left out; whatever else the loop reports still reaches the handler it had."""
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    elsewhere: list[str] = []
    loop.set_exception_handler(lambda _loop, context: elsewhere.append(context["message"]))
    now = [1000.0]
    try:
        quiet_accept_errors(loop, clock=lambda: now[0])
        flood = {"message": "socket.accept() out of system resource",
                 "exception": OSError(24, "Too many open files")}
        with capture_logs() as logs:
            for _ in range(5000):
                loop.call_exception_handler(flood)
            now[0] += OUT_OF_DESCRIPTORS_LOG_EVERY_S
            loop.call_exception_handler(flood)
            loop.call_exception_handler({"message": "Task exception was never retrieved"})
        refused = [line for line in logs if line["event"] == "connections_refused"]
        assert [line["same_since_last"] for line in refused] == [0, 4999]
        assert "Too many open files" in refused[0]["error"]
        assert elsewhere == ["Task exception was never retrieved"]
    finally:
        loop.set_exception_handler(before)
