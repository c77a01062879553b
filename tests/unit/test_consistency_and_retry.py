"""Two small policies that decide safety and liveness: whether reads overlap writes on a keyspace's
replication, and how a step is retried (what, how long, and when a stop ends it)."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from countersink.cassandra import CassandraUnavailableError
from countersink.consistency import (
    ConsistencyError,
    beyond_replicas,
    check_deciding_reads,
    reads_see_writes,
    replication_factors,
)
from countersink.retry import Backoff, StopRequested, is_retriable, retrying, wait_until_reachable
from countersink.settings import CassandraSettings, Consistency, Settings
from gc_worker.cli import _one_run
from gc_worker.store import CassandraGcStore
from schemas.errors import DefinitionError

C = Consistency


@pytest.mark.parametrize(("read", "write", "factors", "overlap"), [
    (C.ONE, C.ONE, {"": 1}, True),
    (C.ONE, C.ONE, {"": 3}, False),
    (C.QUORUM, C.QUORUM, {"": 3}, True),
    (C.ONE, C.QUORUM, {"": 3}, False),
    (C.ALL, C.ONE, {"": 3}, True),
    (C.LOCAL_QUORUM, C.LOCAL_QUORUM, {"dc1": 3, "dc2": 3}, True),
    (C.QUORUM, C.LOCAL_QUORUM, {"dc1": 3, "dc2": 3}, False),  # 4 + 2 replicas of 6 need not meet
    (C.EACH_QUORUM, C.QUORUM, {"dc1": 3, "dc2": 3}, True),
    (C.LOCAL_ONE, C.ALL, {"dc1": 3, "dc2": 3}, True),
])
def test_reads_overlap_writes_only_when_their_replicas_must_meet(
        read: Consistency, write: Consistency, factors: dict[str, int], overlap: bool) -> None:
    """A read sees every acknowledged write exactly when read + write replicas exceed the replication
    factor (counted in the local data centre when both levels are local)."""
    assert reads_see_writes(read, write, factors, "dc1") is overlap


def test_replication_maps_are_read_as_the_keyspace_has_them() -> None:
    """SimpleStrategy is one data centre; NetworkTopologyStrategy counts each data centre."""
    assert replication_factors("{'class': 'SimpleStrategy', 'replication_factor': 3}") == {"": 3}
    assert replication_factors({"class": "org.apache.cassandra.locator.NetworkTopologyStrategy",
                                "dc1": "3", "dc2": "2"}) == {"dc1": 3, "dc2": 2}


def test_a_refusal_names_the_settings_and_the_keyspace() -> None:
    """The one-line refusal names the read setting, the write level and the replication."""
    settings = CassandraSettings(write_consistency=C.ONE, keyspace="ks")
    with pytest.raises(ConsistencyError, match=r"REPLAY_READ_CONSISTENCY=ONE .*WRITE_CONSISTENCY=ONE .* keyspace ks "):
        check_deciding_reads(settings, {"": 3}, {"replay_read_consistency": C.ONE})
    check_deciding_reads(settings, {"": 1}, {"replay_read_consistency": C.ONE})


@pytest.mark.parametrize(("level", "factors", "local_dc", "beyond"), [
    (C.THREE, {"": 1}, None, "waits for 3 replicas; keyspace ks keeps 1 (replication_factor=1)"),
    (C.TWO, {"": 1}, None, "waits for 2 replicas; keyspace ks keeps 1 (replication_factor=1)"),
    (C.THREE, {"": 3}, None, None),
    (C.TWO, {"dc1": 1, "dc2": 1}, None, None),  # two replicas, one in each data centre
    (C.THREE, {"dc1": 1, "dc2": 1}, "dc1", "waits for 3 replicas; keyspace ks keeps 2 (dc1=1, dc2=1)"),
    (C.LOCAL_QUORUM, {"dc1": 3}, "dc2", "waits for 1 replica in data centre dc2; keyspace ks keeps 0 (dc1=3)"),
    (C.LOCAL_ONE, {"dc1": 3, "dc2": 0}, "dc2", "waits for 1 replica in data centre dc2; keyspace ks keeps 0 "
                                               "(dc1=3, dc2=0)"),
    (C.LOCAL_QUORUM, {"dc1": 3}, "dc1", None),
    (C.LOCAL_QUORUM, {"dc1": 3}, None, None),  # which data centre is local is the driver's to say
    (C.QUORUM, {"": 1}, None, None),
    (C.ALL, {"": 5}, None, None),
    (C.THREE, {}, None, None),  # a keyspace not made yet
])
def test_a_level_beyond_the_replicas_kept_is_told(level: Consistency, factors: dict[str, int], local_dc: str | None,
                                                   beyond: str | None) -> None:
    """A level that waits for more replicas than the keyspace keeps is told, in words; one it keeps enough
    replicas for, or one it cannot tell, is not."""
    assert beyond_replicas(level, "ks", factors, local_dc) == beyond


def test_a_start_is_refused_on_a_write_or_read_level_beyond_the_replicas() -> None:
    """check_deciding_reads refuses a write level, or a deciding read level, that no request can meet."""
    with pytest.raises(ConsistencyError, match=r"^COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY=TWO waits for 2 replicas; "
                                               r"keyspace ks keeps 1 .*lower it$"):
        check_deciding_reads(CassandraSettings(write_consistency=C.TWO, keyspace="ks"), {"": 1},
                             {"replay_read_consistency": C.ONE})
    with pytest.raises(ConsistencyError, match=r"^COUNTERSINK_CASSANDRA__REPLAY_READ_CONSISTENCY=THREE waits for 3"):
        check_deciding_reads(CassandraSettings(write_consistency=C.ONE, keyspace="ks"), {"": 1},
                             {"replay_read_consistency": C.THREE})


def test_what_is_retried_is_what_the_error_says() -> None:
    """Servers away and refused connections are retriable; a refused authorization or a bad file is not."""
    assert is_retriable(CassandraUnavailableError("down"))
    assert is_retriable(KafkaConnectionError("down"))
    assert is_retriable(ConnectionRefusedError())
    assert not is_retriable(TopicAuthorizationFailedError())
    assert not is_retriable(DefinitionError("f", "c", "x", "bad"))


def test_pauses_double_up_to_their_cap_with_bounded_jitter() -> None:
    """Each pause is its nominal value moved by at most the jitter; nominal values double up to the cap."""
    pauses = Backoff(first_s=0.1, max_s=0.8, jitter=0.2).pauses()
    for nominal in (0.1, 0.2, 0.4, 0.8, 0.8):
        assert nominal * 0.8 <= pauses() <= nominal * 1.2


def test_retrying_retries_until_success_and_raises_what_is_not_retriable() -> None:
    """A retriable failure is retried; a non-retriable one surfaces at once."""
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise CassandraUnavailableError("down")
        return "done"

    async def refused() -> None:
        raise TopicAuthorizationFailedError()

    assert asyncio.run(retrying(flaky, backoff=Backoff(first_s=0.01, max_s=0.01))) == "done"
    assert len(attempts) == 3
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(retrying(refused))


def _stopped_within(seconds: float, wait: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """``wait`` (given a stop event, set 0.2 s in) ends with StopRequested within ``seconds``."""

    async def scenario() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await wait(stop)

    started = time.monotonic()
    with pytest.raises(StopRequested):
        asyncio.run(scenario())
    assert time.monotonic() - started < seconds


async def _down() -> None:
    raise CassandraUnavailableError("down")


def test_a_stop_ends_a_retry_pause_at_once() -> None:
    """A stop requested during a long pause ends it at once with StopRequested."""
    _stopped_within(2, lambda stop: retrying(_down, backoff=Backoff(first_s=30, max_s=30), stop=stop))


def test_a_process_waits_for_a_server_that_comes_back() -> None:
    """A starting process retries a server that refuses at first, until it answers."""
    attempts = []

    async def flaky() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaConnectionError("Unable to bootstrap")

    asyncio.run(wait_until_reachable("kafka", flaky, timeout_s=30))
    assert len(attempts) == 3


def test_a_process_gives_up_on_a_server_after_its_startup_timeout() -> None:
    """A starting process gives up once its startup timeout has passed, with the server's last error."""

    async def down() -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    started = time.monotonic()
    with pytest.raises(KafkaConnectionError):
        asyncio.run(wait_until_reachable("kafka", down, timeout_s=1.2))
    assert time.monotonic() - started < 5


def test_a_process_stops_waiting_for_servers_as_soon_as_it_is_asked_to() -> None:
    """A stop requested while the servers are away ends the wait at once, not after the startup timeout."""
    _stopped_within(2, lambda stop: wait_until_reachable("kafka", _down, timeout_s=120, stop=stop))


class _Rows:
    """One page of a driver result: no rows, no more pages."""

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def has_more_pages(self) -> bool:
        return False


class _LevelRecorder:
    """Stands in for CassandraClient: answers every read with no rows, and records each request's level."""

    def __init__(self, settings: CassandraSettings) -> None:
        self.settings = settings
        self.levels: dict[str, Consistency] = {}

    async def execute(self, cql_text: str, params: Sequence[Any], *, consistency: Consistency,
                      **_: object) -> _Rows:
        self.levels[cql_text.split(" FROM ")[1].split()[0]] = consistency
        return _Rows()


def test_the_gc_decides_from_reads_at_its_own_levels_not_the_serving_one() -> None:
    """With read_consistency ONE, the GC still reads the registry and the work lists at gc_list_consistency and
    instances at gc_read_consistency: a missed row there would collect a mutator whose shards were never folded."""
    client = _LevelRecorder(CassandraSettings(read_consistency=C.ONE))
    store = CassandraGcStore(client)  # type: ignore[arg-type]

    async def read_everything() -> None:
        await store.read_registry()
        async for _ in store.read_work(uuid.uuid4()):
            pass
        await store.read_key("IBM")

    asyncio.run(read_everything())
    assert client.levels == {"mutators": C.QUORUM, "mutator_work": C.QUORUM, "shards": C.ALL}


def test_the_gc_refuses_to_start_when_its_list_reads_need_not_meet_the_writes() -> None:
    """A GC run checks gc_list_consistency against the writes before reading anything: ONE against QUORUM
    writes on three replicas is refused by name (with gc_read_consistency left at ALL)."""
    settings = Settings(cassandra=CassandraSettings(gc_list_consistency=C.ONE))
    client = _LevelRecorder(settings.cassandra)

    async def three_replicas() -> dict[str, int]:
        return {"": 3}

    client.replication_factors = three_replicas  # type: ignore[attr-defined]
    with pytest.raises(ConsistencyError, match=r"GC_LIST_CONSISTENCY=ONE .*WRITE_CONSISTENCY=QUORUM"):
        asyncio.run(_one_run(settings, client, argparse.Namespace(consistency=None)))  # type: ignore[arg-type]
    assert client.levels == {}


@pytest.mark.parametrize("level", ["SERIAL", "LOCAL_SERIAL", "ONE", C.QUORUM])
def test_a_failure_at_a_level_no_keyspace_is_short_of_is_left_as_it_is(level: str) -> None:
    """An unavailable answer at SERIAL (an LWT's read), ONE or QUORUM is an outage, retried: the keyspace's
    replication is not even read (a consumer stopped on ValueError when Cassandra went away mid-LWT)."""
    import acsylla

    from countersink.cassandra import CassandraClient

    client = CassandraClient(CassandraSettings())

    async def never() -> dict[str, int]:
        raise AssertionError("the replication was read")

    client.replication_factors = never  # type: ignore[method-assign]
    failed = CassandraUnavailableError("no hosts")
    failed.__cause__ = acsylla.errors.CassErrorLibNoHostsAvailable("No hosts available")
    asyncio.run(client._refuse_unreachable(level, failed))
