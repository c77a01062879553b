"""Fixtures shared by the unit tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Whatever a test configures is undone: later tests see structlog's and logging's defaults."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)
    logging.getLogger("aiokafka").setLevel(logging.NOTSET)
