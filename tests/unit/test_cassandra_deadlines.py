"""The net under the driver's own timeouts: a request whose answer never comes ends as a retriable error at its
deadline (one watchdog keeps every request's), while a caller's own cancellation stays a cancellation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import countersink.cassandra as cassandra_module
from countersink.cassandra import CassandraClient, CassandraUnavailableError
from countersink.metrics import METRICS
from countersink.settings import CassandraSettings


class _Session:
    """A started session as far as the client's bookkeeping goes (no request reaches it: each test awaits a
    future it controls, as the driver's answer)."""

    closed = False

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> CassandraClient:
    monkeypatch.setattr(cassandra_module, "_DEADLINE_MARGIN_S", 0.0)
    monkeypatch.setattr(cassandra_module, "_WATCHDOG_TICK_S", 0.05)
    started = CassandraClient(CassandraSettings(request_timeout_s=0.3))
    started._session = _Session()
    return started


def _no_answers() -> int:
    return int(METRICS.cassandra_errors.labels(kind="no_answer")._value.get())


def test_a_lost_answer_is_a_retriable_error_at_its_deadline(client: CassandraClient) -> None:
    async def scenario() -> tuple[float, Any]:
        lost: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.1, answered.set_result, "rows")
        other = asyncio.create_task(client._run(answered, "SELECT answered"))
        started = time.monotonic()
        with pytest.raises(CassandraUnavailableError, match=r"no answer within 0.3s \[SELECT lost\]") as caught:
            async with asyncio.timeout(5):  # without the net, this test ends here instead of hanging
                await client._run(lost, "SELECT lost")
        took = time.monotonic() - started
        assert caught.value.retriable
        assert await other == "rows"  # the other request, answered in time, was left alone
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # the watchdog's cancel undone
        assert client.in_flight == 0
        assert not client._awaited
        assert not client._expired
        await client.stop()
        return took, client._watchdog

    before = _no_answers()
    took, watchdog = asyncio.run(scenario())
    assert 0.3 <= took < 1.5
    assert _no_answers() - before == 1
    assert watchdog is None  # stopped with the client


def test_a_callers_cancellation_is_not_turned_into_an_error(client: CassandraClient) -> None:
    async def scenario() -> None:
        never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request = asyncio.create_task(client._run(never, "SELECT never"))
        await asyncio.sleep(0.05)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert client.in_flight == 0
        assert not client._awaited
        # A request cancelled by its caller after its deadline passed stays cancelled too.
        late: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        request = asyncio.create_task(client._run(late, "SELECT late"))
        await asyncio.sleep(0.05)
        # The watchdog's look, then the caller's cancel, before the task runs again.
        client._cancel_overdue(float("inf"), asyncio.get_running_loop())
        assert client._expired
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await client.stop()

    asyncio.run(scenario())


def test_the_watchdog_starts_again_in_a_new_event_loop(client: CassandraClient) -> None:
    """A client used from one event loop, then another (its first watchdog ended with its loop), still has a net."""
    async def lost_answer() -> None:
        with pytest.raises(CassandraUnavailableError):
            async with asyncio.timeout(5):
                await client._run(asyncio.get_running_loop().create_future(), "SELECT lost")

    asyncio.run(lost_answer())
    asyncio.run(lost_answer())


def test_a_request_awaited_through_a_stop_keeps_its_deadline(client: CassandraClient) -> None:
    async def scenario() -> None:
        request = asyncio.create_task(client._run(asyncio.get_running_loop().create_future(), "SELECT lost"))
        await asyncio.sleep(0.05)
        await client.stop()  # another task stops the client while the request is awaited
        with pytest.raises(CassandraUnavailableError):
            async with asyncio.timeout(5):
                await request

    asyncio.run(scenario())


def test_a_request_left_in_a_closed_event_loop_does_not_stop_the_watchdog(client: CassandraClient) -> None:
    """A request whose event loop was closed under it (its task never cancelled) is forgotten, not cancelled
    from another loop: the watchdog goes on keeping the deadlines of the requests after it."""
    closed = asyncio.new_event_loop()
    left = closed.create_task(client._run(closed.create_future(), "SELECT left"))
    closed.run_until_complete(asyncio.sleep(0.01))
    closed.close()

    async def lost_answer() -> None:
        await asyncio.sleep(0.35)  # past the left request's deadline before this one starts
        with pytest.raises(CassandraUnavailableError):
            async with asyncio.timeout(5):
                await client._run(asyncio.get_running_loop().create_future(), "SELECT lost")

    asyncio.run(lost_answer())
    assert not left.done()
    assert not client._awaited


def test_a_password_in_a_statement_never_reaches_an_error_message() -> None:
    """Errors name the statement by its first characters; CREATE ROLE takes its password as a literal (no
    bound value there), which is masked, quotes inside it included."""
    from countersink.cassandra import _short

    text = "CREATE ROLE IF NOT EXISTS app WITH PASSWORD = 'it''s hunter2' AND LOGIN = true"
    assert _short(text) == "CREATE ROLE IF NOT EXISTS app WITH PASSWORD = '***' AND LOGIN = true"
    assert "hunter2" not in _short("ALTER ROLE app WITH\n  HASHED PASSWORD='hunter2'")
