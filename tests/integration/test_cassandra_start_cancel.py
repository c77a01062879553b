"""A ``CassandraClient.start`` cancelled while it connects ends at once and leaves no session open.

acsylla's ``create_session`` blocks the event loop for good once cancelled; a SIGTERM during the GC loop's first
connect hung ``countersink gc --every`` (found by running docs/running.md's GC block)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


async def _cancel_a_start(settings: CassandraSettings, after_s: float) -> dict[str, object]:
    client = CassandraClient(settings)
    starting = asyncio.ensure_future(client.start())
    await asyncio.sleep(after_s)
    starting.cancel()
    await asyncio.wait({starting})
    seen: dict[str, object] = {"cancelled": starting.cancelled(),
                               "error": None if starting.cancelled() else starting.exception(),
                               "session_left": client.connections() > 0 and starting.cancelled()}
    await client.stop()
    async with CassandraClient(settings) as again:  # the server still takes a session
        seen["again"] = again.connections()
    return seen


@pytest.mark.parametrize("after_s", [0.0, 0.001, 0.005])
def test_a_cancelled_start_ends_and_leaves_no_session(cassandra_settings: CassandraSettings, after_s: float) -> None:
    """In a process of its own (a blocked event loop, holding the interpreter, cannot time itself out): the
    cancelled start ends within 30 s, without an error, and a cancelled one keeps no session."""
    script = ("import asyncio, json, sys; from countersink.settings import CassandraSettings; "
              "from tests.integration.test_cassandra_start_cancel import _cancel_a_start; "
              "print(json.dumps(asyncio.run(_cancel_a_start(CassandraSettings.model_validate_json(sys.argv[1]), "
              "float(sys.argv[2]))), default=repr))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", script, cassandra_settings.model_dump_json(), str(after_s)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("a cancelled CassandraClient.start blocked its event loop")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["error"] is None, seen
    assert seen["session_left"] is False, seen
    assert seen["again"] > 0
