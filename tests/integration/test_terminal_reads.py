"""On a terminal, ``countersink get``, ``explain`` and ``list`` against real Cassandra show what was asked
for and no log lines."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings
from tests.integration.test_reader import _two_shards
from tests.terminal import run_on_terminal

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


async def test_read_commands_on_a_terminal_show_values_only(cassandra_settings: CassandraSettings) -> None:
    """``get`` shows the value alone (no cassandra_connected line, no JSON), ``list`` the keys, ``explain``
    its report without log lines."""
    async with CassandraClient(cassandra_settings) as client:
        await _two_shards(client)
    env = {**os.environ, "COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra_settings.contact_points[0],
           "COUNTERSINK_CASSANDRA__PORT": str(cassandra_settings.port),
           "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra_settings.keyspace, "PYTHONPATH": str(REPO)}
    env.pop("COUNTERSINK_LOG_FORMAT", None)

    async def on_terminal(*args: str) -> tuple[int, str]:
        return await asyncio.to_thread(run_on_terminal, [sys.executable, "-m", "countersink.cli", *args], env,
                                       str(REPO))

    assert await on_terminal("get", "notional", "IBM") == (0, "notional 'IBM': 15.40\n")
    assert await on_terminal("list", "notional") == (0, "IBM\n")
    code, explained = await on_terminal("explain", "notional", "IBM")
    assert code == 0, explained
    assert "cassandra_connected" not in explained
    assert "notional 'IBM'" in explained.splitlines()[0]
