"""One log stream for the whole process, through structlog: JSON lines when stderr is not a terminal,
readable key=value lines when it is. A command that answers a person (``get``, ``explain``, ``list``) shows
a terminal only its warnings and errors, each one plain line (``error: ...``): its output is the values.

countersink logs with structlog; aiokafka, acsylla, asyncio and Python's warnings log through the standard
library. Their records go through the same processors and the same renderer, so a JSON stream holds JSON
lines only (a traceback is a structured ``exception`` field, not lines of text), and every line has the
same ``timestamp``, ``level`` and ``event`` keys. On a terminal, colours follow ``NO_COLOR``
(https://no-color.org): set and not empty, none.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, Literal, TextIO

import structlog

_HANDLER_NAME = "countersink"
# A traceback as a structured field, without local variables: they may hold credentials or event payloads.
_TRACEBACK_AS_FIELDS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False))


Style = Literal["json", "console", "person"]


def log_style(fmt: str, *, terminal: bool, person: bool = False, level: str = "INFO") -> Style:
    """How log lines look: ``json`` (the format asked for, or ``auto`` off a terminal: services, pipes, files),
    ``console`` (key=value lines, ``auto`` on a terminal), or ``person`` (``auto`` on a terminal for a command
    that answers a person, below DEBUG: warnings and errors only, one plain line each)."""
    if fmt == "json" or (fmt == "auto" and not terminal):
        return "json"
    if fmt == "auto" and person and level != "DEBUG":
        return "person"
    return "console"


def configure_logging(level: str = "INFO", fmt: str = "auto", *, no_color: bool = False,
                      stream: TextIO | None = None, person: bool = False) -> None:
    """Configure structlog and the standard library logging that aiokafka, acsylla and asyncio use.
    ``person``: the command answers a person (see :func:`log_style`)."""
    global _debug
    _debug = level == "DEBUG"
    out = stream or sys.stderr
    terminal = out.isatty()
    style = log_style(fmt, terminal=terminal, person=person, level=level)
    if style == "person":
        level = "WARNING"  # what went right is the command's output
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    rendering: list[structlog.types.Processor]
    if style == "json":
        rendering = [_TRACEBACK_AS_FIELDS, structlog.processors.JSONRenderer()]
    elif style == "person":
        rendering = [_TRACEBACK_AS_FIELDS, _PersonRenderer(colors=not no_color)]
    else:
        rendering = [structlog.dev.ConsoleRenderer(colors=terminal and not no_color)]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *rendering],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # One write() per line, newline included: print() writes the newline separately, and lines of
        # processes sharing one log file or pipe then interleave mid-line.
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    # The libraries' records: the same processors, with the library's logger name.
    handler = logging.StreamHandler(out)  # also one write() per line: message and terminator together
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(_RedactKafkaPayloads())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:  # configured again: replaced
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn(...) from any library: a log line like any other
    # aiokafka logs every refused connection at ERROR while a broker restarts; our own logs say it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL if level != "DEBUG" else logging.DEBUG)
    quiet_driver_noise()


class _PersonRenderer:
    """``error: <what went wrong>`` on one line: the ``error`` field (or the event's name); a warning adds its
    other fields as ``key=value``. No timestamp. The level word is red, unless colours are off."""

    def __init__(self, *, colors: bool) -> None:
        self._colors = colors

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        level = str(event.pop("level", "error"))
        for noise in ("timestamp", "logger", "logger_name", "exception"):
            event.pop(noise, None)
        name = str(event.pop("event", ""))
        text = str(event.pop("error", "") or name)
        # An error says it all in its line; a warning's details (what, how many) are part of it.
        details = "" if level in ("error", "critical") else " ".join(
            f"{key}={value}" for key, value in event.items() if not key.startswith("_"))
        word = f"\x1b[31m{level}\x1b[0m" if self._colors else level
        return f"{word}: {text}" + (f" ({details})" if details else "")


_debug = False  # set by configure_logging: at DEBUG the driver's every line is shown


class _RedactKafkaPayloads(logging.Filter):
    """aiokafka logs every request and answer at DEBUG with their fields. A SASL authentication's bytes carry
    the password itself with PLAIN, and with SCRAM what an offline guesser needs (salt, iterations, proof); a
    produce request and a fetch answer carry the records (events, dead letters: whatever the events hold), and
    its producer logs each record's key and value as it takes it. Such a line is kept, with the request's
    name only, or the key's and value's sizes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.args, tuple):
            return True
        if record.msg == _SENDING and len(record.args) == 3:
            key, value, where = record.args
            record.args = (_size(key), _size(value), where)
        elif any(_carries_payload(arg) for arg in record.args):
            record.args = tuple(f"{type(arg).__name__}(<redacted>)" if _carries_payload(arg) else arg
                                for arg in record.args)
        return True


_SENDING = "Sending (key=%s value=%s) to %s"  # aiokafka.producer's line for each record it takes
_PAYLOAD_TYPES = ("SaslAuthenticate", "ProduceRequest", "FetchResponse")


def _carries_payload(value: object) -> bool:
    return type(value).__name__.startswith(_PAYLOAD_TYPES)


def _size(value: object) -> str:
    if value is None:
        return "None"
    return f"<{len(value)} bytes>" if isinstance(value, bytes | bytearray) else "<redacted>"


_CONNECT_FAILURES = re.compile(r"Unable to establish a control connection|Connection pool was unable to connect")
# What the driver says of a connection that closed or sent what it cannot read: while a session is being
# created, the error countersink raises says it (with what to check); later, a node lost mid-run, it is the
# only line that does, and is kept.
_CONNECTION_LOST = re.compile(r"Error decoding/consuming message|Socket read error")
_sessions_starting = 0  # CassandraClient.start()s under way in this process


@contextlib.contextmanager
def cassandra_session_starting() -> Iterator[None]:
    """While the block runs, the driver's lines of a lost connection belong to a start, whose error says it."""
    global _sessions_starting
    _sessions_starting += 1
    try:
        yield
    finally:
        _sessions_starting -= 1


class _DropShardingNotice(logging.Filter):
    """The Cassandra driver reports, at ERROR and on every connection, that the server does not describe
    ScyllaDB shards. Apache Cassandra never does: it is not an error, and it drowned real ones.

    It also reports a first connection that failed (refused credentials, an untrusted certificate, a node that
    answers no CQL or expects TLS), which the error countersink raises says once, with what to check: a failed
    start stays one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # Refused connections are also said, with the address, by countersink's own error or waiting line.
        return "sharding info" not in message and not (
            record.levelno < logging.CRITICAL and not _debug and (
                _CONNECT_FAILURES.search(message) is not None
                or (_sessions_starting > 0 and _CONNECTION_LOST.search(message) is not None)))


def quiet_driver_noise() -> None:
    driver = logging.getLogger("acsylla")
    if not any(isinstance(f, _DropShardingNotice) for f in driver.filters):
        driver.addFilter(_DropShardingNotice())


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
