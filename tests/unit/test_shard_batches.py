"""How a flush's shard rows are grouped into requests: several instances per unlogged batch, within
Cassandra's warning thresholds (10 partitions, 5 KiB), every row sent exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from consumer.cassandra_store import CassandraStore
from consumer.storage import ShardWrite
from countersink.settings import CassandraSettings


class RecordingClient:
    """Stands in for CassandraClient: records every request instead of sending it."""

    def __init__(self, batch_rows: int) -> None:
        self.settings = CassandraSettings(write_batch_rows=batch_rows)
        self.requests: list[list[tuple[str, Sequence[Any]]]] = []

    async def execute(self, cql_text: str, params: Sequence[Any], **_: object) -> None:
        self.requests.append([(cql_text, params)])

    async def execute_batch(self, statements: Sequence[tuple[str, Sequence[Any]]], **_: object) -> None:
        self.requests.append(list(statements))


def shard_requests(writes: list[ShardWrite], batch_rows: int = 10) -> list[list[tuple[str, Sequence[Any]]]]:
    client = RecordingClient(batch_rows)
    asyncio.run(CassandraStore(client).write_shards(uuid.uuid4(), 1, writes))  # type: ignore[arg-type]
    return [[s for s in request if "INTO shards" in s[0]] for request in client.requests
            if any("INTO shards" in s[0] for s in request)]


def write(i: int, state_bytes: int = 40) -> ShardWrite:
    return ShardWrite("trades", f"S{i:06d}", bytes(state_bytes), 7, False)


def test_rows_go_ten_to_a_request_and_each_exactly_once() -> None:
    """Shard rows go ten to a request, each exactly once."""
    requests = shard_requests([write(i) for i in range(95)])
    assert [len(r) for r in requests] == [10] * 9 + [5]
    assert sorted(params[1] for r in requests for _, params in r) == [f"S{i:06d}" for i in range(95)]


def test_a_batch_stays_under_four_kib() -> None:
    """A batch of shard rows stays under 4 KiB."""
    requests = shard_requests([write(i, state_bytes=1500) for i in range(7)])
    assert [len(r) for r in requests] == [2, 2, 2, 1]
    assert all(sum(len(params[3]) for _, params in r) <= 4096 for r in requests)


def test_a_large_state_goes_alone() -> None:
    """A state too large to share a batch is sent alone."""
    requests = shard_requests([write(0), write(1, state_bytes=10_000), write(2)])
    assert [len(r) for r in requests] == [1, 1, 1]


def test_one_row_per_request_when_batching_is_off() -> None:
    """With write_batch_rows 1, each row is its own request."""
    assert [len(r) for r in shard_requests([write(i) for i in range(3)], batch_rows=1)] == [1, 1, 1]
