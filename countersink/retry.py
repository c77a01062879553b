"""One retry policy for every process: retry what the error itself says is retriable, with capped
exponential backoff and jitter, and stop at once when asked to stop.

Whether an error is worth retrying is the error's own word: countersink's errors and aiokafka's both carry
a ``retriable`` class attribute (``CassandraUnavailableError``, a broker connection refused or timed out),
and a refused TCP connection (``OSError``) is retriable too. Nothing else is retried here: a fenced mutator,
a refused setting or a bug surfaces at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from countersink.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class StopRequested(Exception):
    """Raised by :func:`retrying` when a stop was requested before the step succeeded."""


def is_retriable(error: BaseException) -> bool:
    """True when ``error`` says a later attempt may succeed (a server away, a timeout)."""
    if isinstance(error, OSError):
        return True
    return bool(getattr(error, "retriable", False))


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Pauses between attempts: ``first_s``, then doubling up to ``max_s``, each moved by up to ``jitter``
    of itself at random (so processes that failed together do not retry in step)."""

    first_s: float = 0.1
    max_s: float = 5.0
    jitter: float = 0.2

    def pauses(self) -> Callable[[], float]:
        """A fresh sequence of pauses: each call returns the next."""
        nominal = self.first_s

        def next_pause() -> float:
            nonlocal nominal
            pause = nominal * (1 + random.uniform(-self.jitter, self.jitter))
            nominal = min(nominal * 2, self.max_s)
            return pause

        return next_pause


async def pause_unless_stopped(seconds: float, stop: asyncio.Event | None) -> bool:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile. True when stopped."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    if stop.is_set():
        return True
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def retrying(
    step: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff = Backoff(),
    stop: asyncio.Event | None = None,
    deadline_s: float | None = None,
    retry_on: Callable[[BaseException], bool] = is_retriable,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Run ``step`` until it succeeds; retry the errors ``retry_on`` accepts, pausing as ``backoff`` says.

    Raises the step's error when it is not retriable, or when the next pause would end past ``deadline_s``
    (seconds from now); :class:`StopRequested` (from the last error) when ``stop`` is set before a retry or
    during a pause. ``on_retry`` hears each retried error and the pause before the next attempt.
    """
    pauses = backoff.pauses()
    give_up_at = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        if stop is not None and stop.is_set():
            raise StopRequested("stop requested")
        try:
            return await step()
        except Exception as error:
            if not retry_on(error):
                raise
            pause = pauses()
            if give_up_at is not None and time.monotonic() + pause > give_up_at:
                raise
            if on_retry is not None:
                on_retry(error, pause)
            if await pause_unless_stopped(pause, stop):
                raise StopRequested("stop requested") from error


async def wait_until_reachable(what: str, step: Callable[[], Awaitable[None]], *, timeout_s: float,
                               stop: asyncio.Event | None = None) -> None:
    """Run ``step`` (idempotent: connect, create a schema) until the server it needs answers, up to
    ``timeout_s``: a process (re)started while Kafka or Cassandra is briefly away waits for them rather than
    exiting. Raises the last error after ``timeout_s``; :class:`StopRequested` as soon as ``stop`` is set."""
    def waiting(error: BaseException, pause_s: float) -> None:
        log.warning("waiting_for_server", server=what, error=str(error), wait_s=round(pause_s, 3))

    await retrying(step, backoff=Backoff(first_s=0.5, max_s=5.0), stop=stop, deadline_s=timeout_s, on_retry=waiting)
