"""structlog set-up: JSON lines when stderr is not a terminal, readable key=value when it is."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """Configure structlog and the standard library logging that aiokafka and acsylla use."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # One write() per line, newline included: print() writes the newline separately, and lines of
        # processes sharing one log file or pipe then interleave mid-line.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    # aiokafka logs every refused connection at ERROR while a broker restarts; our own logs say it once.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL if level != "DEBUG" else logging.DEBUG)
    quiet_driver_noise()


class _DropShardingNotice(logging.Filter):
    """The Cassandra driver reports, at ERROR and on every connection, that the server does not describe
    ScyllaDB shards. Apache Cassandra never does: it is not an error, and it drowned real ones.

    It also reports a first connection that failed (refused credentials, an untrusted certificate), which
    the error countersink raises says once, with what to check: a failed start stays one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "sharding info" not in message and not message.startswith("Unable to establish a control connection")


def quiet_driver_noise() -> None:
    driver = logging.getLogger("acsylla")
    if not any(isinstance(f, _DropShardingNotice) for f in driver.filters):
        driver.addFilter(_DropShardingNotice())


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
