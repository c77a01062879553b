"""One log stream: structlog's records and every library's (stdlib logging, warnings, asyncio) rendered alike,
JSON lines with structured tracebacks in JSON mode, plain text when NO_COLOR is set."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from countersink.logs import cassandra_session_starting, configure_logging, get_logger
from tests.terminal import TextTerminal


@pytest.mark.usefixtures("restore_logging")
def test_every_record_is_a_json_line() -> None:
    """Our events, a library's error with a traceback, a warning and asyncio's complaints are JSON lines."""
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    get_logger("countersink.test").info("shards_flushed", partition=3, rows=10)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("acsylla").error("driver failed", exc_info=True)
        get_logger("countersink.test").exception("flush_failed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning, stacklevel=1)

    async def complain() -> None:
        asyncio.get_running_loop().call_exception_handler({"message": "Task exception was never retrieved"})

    asyncio.run(complain())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines[:3]] == ["shards_flushed", "driver failed", "flush_failed"]
    assert all({"timestamp", "level", "event"} <= set(line) for line in lines)
    assert lines[1]["logger"] == "acsylla"
    for line in lines[1:3]:
        (error,) = line["exception"]
        assert (error["exc_type"], error["exc_value"]) == ("ValueError", "boom")
        assert all("locals" not in frame for frame in error["frames"])  # locals may hold secrets
    assert "careful" in lines[3]["event"]
    assert lines[3]["logger"] == "py.warnings"
    assert lines[4]["logger"] == "asyncio"


@pytest.mark.usefixtures("restore_logging")
def test_no_color_is_honoured_on_a_terminal() -> None:
    """On a terminal the console renderer colours its lines, unless NO_COLOR asks for none."""
    coloured, plain = TextTerminal(), TextTerminal()
    configure_logging("INFO", "auto", stream=coloured)
    get_logger("t").warning("mutator_expired", partition=1)
    logging.getLogger("aiohttp").warning("from a library")
    configure_logging("INFO", "auto", no_color=True, stream=plain)
    get_logger("t").warning("mutator_expired", partition=1)
    logging.getLogger("aiohttp").warning("from a library")
    assert "\x1b[" in coloured.getvalue()
    assert "\x1b[" not in plain.getvalue()
    assert "mutator_expired" in plain.getvalue()
    assert "from a library" in plain.getvalue()
    assert len(plain.getvalue().splitlines()) == 2  # configured twice: one handler, not two


@pytest.mark.usefixtures("restore_logging")
def test_debug_records_are_dropped_below_the_level() -> None:
    """Our own debug lines are dropped at INFO; aiokafka's chatter is kept to CRITICAL."""
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    get_logger("t").debug("noise")
    logging.getLogger("aiokafka").error("connection refused")
    assert out.getvalue() == ""


def test_refused_settings_are_one_json_line_without_the_value() -> None:
    """A setting that fails validation ends the command with exit 2 and one JSON line naming the setting,
    not a Python traceback, and without echoing the value (it may be a secret)."""
    env = {**os.environ, "COUNTERSINK_CASSANDRA__PORT": "s3cr3t-not-a-port"}
    done = subprocess.run([sys.executable, "-m", "countersink.cli", "get", "likes", "p1"], env=env,
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    (line,) = [json.loads(x) for x in done.stderr.splitlines()]
    assert line["event"] == "settings_refused"
    assert line["error"].startswith("COUNTERSINK_CASSANDRA__PORT:")
    assert "s3cr3t" not in done.stderr


def test_the_sasl_exchange_is_not_logged_at_debug(restore_logging: None) -> None:
    """aiokafka logs every request and answer at DEBUG with their fields: the SASL ones carry the PLAIN password
    itself, or a SCRAM exchange (salt, iterations, proof) that an offline guesser needs. Both are redacted;
    the lines stay, naming the request."""
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1, SaslAuthenticateResponse_v1

    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream=stream)
    conn = logging.getLogger("aiokafka.conn")
    plain = SaslAuthenticateRequest_v1(b"\0countersink\0plain-pass-7d1e")
    scram = SaslAuthenticateResponse_v1(0, "", b"r=nonce9f,s=c2FsdC1zZWNyZXQtOGE=,i=4096", 0)
    conn.debug("Request to %s:%d %d: %s", "127.0.0.1", 9092, 3, plain)  # as aiokafka.conn logs them
    conn.debug("Response from %s:%d %d: %s", "127.0.0.1", 9092, 3, scram)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"].split(":")[0] for line in lines] == ["Request to 127.0.0.1", "Response from 127.0.0.1"]
    assert "SaslAuthenticateRequest_v1" in lines[0]["event"]
    assert "plain-pass-7d1e" not in stream.getvalue()
    assert "c2FsdC1zZWNyZXQtOGE" not in stream.getvalue()


def test_records_are_not_logged_at_debug(restore_logging: None) -> None:
    """At DEBUG aiokafka logs each produce request and fetch answer whole (the records' bytes: events, dead
    letters) and its producer each record's key and value: the lines stay, without them."""
    from aiokafka.producer.producer import log as producer_log
    from aiokafka.protocol.fetch import FetchResponse_v4
    from aiokafka.protocol.produce import ProduceRequest_v3

    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream=stream)
    event = b'{"card": "4111-1111-1111-1111"}'
    produce = ProduceRequest_v3(None, -1, 1000, [("events", [(0, event)])])
    fetch = FetchResponse_v4(0, [("events", [(0, 0, 1, 1, [], event)])])
    conn = logging.getLogger("aiokafka.conn")
    conn.debug("Request to %s:%d %d: %s", "127.0.0.1", 9092, 4, produce)  # as aiokafka.conn logs them
    conn.debug("Response from %s:%d %d: %s", "127.0.0.1", 9092, 5, fetch)
    producer_log.debug("Sending (key=%s value=%s) to %s", b"user-7", event, "events-0")
    lines = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert lines == ["Request to 127.0.0.1:9092 4: ProduceRequest_v3(<redacted>)",
                     "Response from 127.0.0.1:9092 5: FetchResponse_v4(<redacted>)",
                     "Sending (key=<6 bytes> value=<31 bytes>) to events-0"]
    assert "4111" not in stream.getvalue()


@pytest.mark.usefixtures("restore_logging")
def test_a_lost_connection_is_said_by_the_driver_except_while_a_session_starts() -> None:
    """A session that cannot start is one line, countersink's error (the driver's own lines of the connection it
    lost are dropped then); a node lost mid-run is said by the driver's line, the only one that says it."""
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    driver = logging.getLogger("acsylla")
    with cassandra_session_starting():
        driver.error("Socket read error 'connection reset by peer'")
        driver.error("Error decoding/consuming message")
    assert out.getvalue() == ""
    driver.error("Socket read error 'connection reset by peer'")
    driver.error("Unable to establish a control connection to host 127.0.0.1 because of the following error")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("acsylla", "Socket read error 'connection reset by peer'")]
