"""A mutator past its expiry never writes: flush refuses before touching storage."""

from __future__ import annotations

import uuid

import pytest

from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.protocol import MutatorExpiredError, flush
from consumer.storage import MutatorEntry, PartitionId
from schemas.definitions import parse_definitions
from schemas.events import EventRouter

COUNTERS = parse_definitions('[[counter]]\nname = "hits"\ntopics = ["t"]\nkind = "count"\nkey = ["page"]\n')


class RefusingStore:
    """Any storage call fails the test: an expired mutator must not reach storage at all."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"an expired mutator called store.{name}")


def _mutator(expires_us: int) -> Mutator:
    record = MutatorEntry(uuid.uuid4(), "g", "t", 0, "h", born_us=1_000, expires_us=expires_us)
    applier = Applier(EventRouter(COUNTERS), COUNTERS, "t", 0, RetryWindow(10))
    mutator = Mutator(record, PartitionId("g", "t", 0), applier, applied_through=-1, flushed_through=-1)
    mutator.apply(Record(0, b'{"page": "home"}'))
    return mutator


async def test_flush_after_expiry_is_refused_before_any_write() -> None:
    """At or past expires_us, flush raises MutatorExpiredError and leaves storage untouched."""
    mutator = _mutator(expires_us=5_000)
    with pytest.raises(MutatorExpiredError):
        await flush(RefusingStore(), mutator, now_us=5_000)  # type: ignore[arg-type]
    assert mutator.dirty == {("hits", "home")}  # nothing was marked written
