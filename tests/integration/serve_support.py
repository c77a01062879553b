"""A real ``countersink serve`` in a child process, for the tests that read over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import pytest

from countersink.settings import CassandraSettings
from stack.servers import free_port

REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def running_serve(cassandra: CassandraSettings, counters: Path, ready_within_s: float = 30.0, *,
                        env: Mapping[str, str] | None = None, output: Path | None = None) -> AsyncIterator[str]:
    """Start ``serve`` over ``counters`` on a free loopback port, wait for ``/readyz``, yield its base URL; on
    the way out, SIGTERM must end it with exit code 0. ``env``: more settings; ``output``: a file that gets
    what it prints (its log)."""
    port = free_port()
    env = {**os.environ, "COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra.contact_points[0],
           "COUNTERSINK_CASSANDRA__PORT": str(cassandra.port), "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra.keyspace,
           "COUNTERSINK_SERVE__HOST": "127.0.0.1", "COUNTERSINK_SERVE__PORT": str(port), "PYTHONPATH": str(REPO),
           **(env or {})}
    sink = output.open("ab") if output is not None else None
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "countersink.cli", "serve", "--counters", str(counters), env=env, cwd=REPO,
        stdout=sink or asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(int(ready_within_s * 10)):
                try:
                    async with http.get(base + "/readyz") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                if process.returncode is not None:
                    said = (await asyncio.to_thread(output.read_text) if output is not None else
                            (await process.stdout.read()).decode())  # type: ignore[union-attr]
                    pytest.fail(f"countersink serve exited with {process.returncode}: {said}")
                await asyncio.sleep(0.1)
            else:
                pytest.fail("countersink serve never became ready")
        yield base
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if sink is not None:
            sink.close()
