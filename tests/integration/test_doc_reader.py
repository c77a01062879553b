"""The Python example of docs/reading.md, run as written against real Cassandra."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from countersink.cassandra import CassandraClient
from countersink.settings import CassandraSettings
from tests.docblocks import doc_block
from tests.integration.test_serve_keyless import _write

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def doc_example() -> str:
    """The ```python block marked python-reader in docs/reading.md, exactly as the reader sees it."""
    return doc_block("docs/reading.md", "python-reader")


async def test_the_reading_example_runs_as_written(cassandra_settings: CassandraSettings, tmp_path: Path) -> None:
    """The block prints the values its comments state, read from Cassandra through the settings."""
    async with CassandraClient(cassandra_settings) as client:
        await _write(client, [("shares_traded", "IBM", "15.40")])
    script = tmp_path / "example.py"
    script.write_text(doc_example())
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    env.update({"COUNTERSINK_CASSANDRA__CONTACT_POINTS": cassandra_settings.contact_points[0],
                "COUNTERSINK_CASSANDRA__PORT": str(cassandra_settings.port),
                "COUNTERSINK_CASSANDRA__KEYSPACE": cassandra_settings.keyspace, "PYTHONPATH": str(REPO),
                "COUNTERSINK_LOG_FORMAT": "json"})
    process = await asyncio.create_subprocess_exec(sys.executable, str(script), env=env, cwd=tmp_path,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    printed = out.decode().splitlines()
    stated = re.findall(r"print\(.*\)  # (.*)", doc_example())
    assert printed == stated == ["15.40", "{'IBM': Decimal('15.40'), 'MSFT': None}"]
