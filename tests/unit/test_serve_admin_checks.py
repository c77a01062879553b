"""The reset route's edges without servers: malformed bodies and keys answer 400 (not 500), refused attempts
leave a line without the token, admin settings that cannot work stop the start naming their variables, and a
failed reset's answer says what was recorded and whether retrying helps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka import errors
from pydantic import SecretStr
from structlog.testing import capture_logs

from countersink.cassandra import CassandraClient, CassandraError, CassandraUnavailableError
from countersink.resets import POSITIONS, PUBLISHING, RECORDING, ResetProgress
from countersink.serve import ReadApi, Resetting, TokenError, Tokens, serve
from countersink.settings import CassandraSettings, KafkaSettings, ServeSettings, Settings
from schemas.definitions import parse_definitions
from schemas.resets import Reset, ResetPosition

COUNTERS = parse_definitions('''
[[counter]]
name = "likes"
kind = "count"
topics = ["likes"]
key = ["post_id"]
''')
READ = "r3ad-token-of-the-test-0123456789"  # a test's read token
ADMIN = "adm1n-token-of-the-test-0123456789"  # a test's admin token
SETTINGS = ServeSettings(tokens=SecretStr(READ), admin_tokens=SecretStr(f"ops:{ADMIN}"),
                         admin_cassandra_username="countersink_serve_admin")


def _api() -> ReadApi:
    return ReadApi(CassandraClient(CassandraSettings()), SETTINGS, COUNTERS, resetting=Resetting(
        Tokens(SETTINGS, admin=True), CassandraClient(CassandraSettings()), KafkaSettings()))


async def test_malformed_bodies_and_keys_answer_400_not_500() -> None:
    """1024 nested brackets (the whole default body limit: deeper than the JSON parser goes), a key that is a
    lone surrogate, and malformed Idempotency-Keys are refused with 400, before anything is looked up."""
    async with TestClient(TestServer(_api().app())) as http:
        admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
        for body in (b"[" * 1024, b'{"keys": ["\\ud800"]}', b'{"keys": ["ok", "a\\udfffb"]}'):
            answer = await http.post("/counters/likes/reset", data=body, headers=admin)
            assert answer.status == 400, (body[:30], await answer.text())
            assert answer.content_type == "application/problem+json"
        for key in ("has space", "k" * 129, "caf\u00e9"):
            answer = await http.post("/counters/likes/reset", headers={**admin, "Idempotency-Key": key})
            assert answer.status == 400, (key, await answer.text())
            assert "Idempotency-Key" in (await answer.json())["detail"]


async def test_refused_reset_attempts_are_logged_without_the_token() -> None:
    """No token, a token nobody issued, and a read token on the reset route each leave a reset_refused line
    with the status and the counter, and no token anywhere in the log."""
    stranger = "x" * 24
    async with TestClient(TestServer(_api().app())) as http:
        with capture_logs() as logs:
            for headers in ({}, {"Authorization": f"Bearer {stranger}"}, {"Authorization": f"Bearer {READ}"}):
                await http.post("/counters/likes/reset", headers=headers)
    refused = [(e["status"], e["counter"]) for e in logs if e["event"] == "reset_refused"]
    assert refused == [(401, "likes"), (401, "likes"), (403, "likes")], logs
    text = json.dumps(logs, default=str)
    assert READ not in text
    assert stranger not in text


def test_two_admin_tokens_under_one_name_are_refused(tmp_path: Path) -> None:
    """A name is who a reset records as asking: one name given to two tokens, in the setting, in the file or
    across both, stops the start, naming the entries and never a token."""
    other = "an0ther-admin-token-0123456789"
    with pytest.raises(TokenError, match="entries 1 and 2 give one name to two tokens") as refused:
        Tokens(ServeSettings(admin_tokens=SecretStr(f"ops:{ADMIN},ops:{other}"), admin_cassandra_username="w"),
               admin=True)
    assert ADMIN not in str(refused.value)
    path = tmp_path / "admin-tokens"
    path.write_text(f"ops:{ADMIN}\n# a comment\nops:{other}\n")
    with pytest.raises(TokenError, match="lines 1 and 3 give one name"):
        Tokens(ServeSettings(admin_tokens_file=path, admin_cassandra_username="w"), admin=True)
    path.write_text(f"ops:{other}\n")
    with pytest.raises(TokenError, match="both name ops"):
        Tokens(ServeSettings(admin_tokens=SecretStr(f"ops:{ADMIN}"), admin_tokens_file=path,
                             admin_cassandra_username="w"), admin=True)


async def test_an_admin_role_without_its_password_stops_the_start() -> None:
    """Admin tokens and the admin role's user name without its password: serve exits 2 before connecting,
    naming the admin variables (not the read role's)."""
    settings = Settings(cassandra=CassandraSettings(contact_points=["192.0.2.1"]))
    with capture_logs() as logs:
        code = await serve(settings, SETTINGS.model_copy(update={"allow_insecure": True}), None, None)
    assert code == 2
    (refused,) = [e for e in logs if e["event"] == "serve_settings_refused"]
    assert "COUNTERSINK_SERVE__ADMIN_CASSANDRA_PASSWORD" in refused["error"]
    assert "COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME" in refused["error"]


def _recorded(stage: str, published: int) -> ResetProgress:
    reset = Reset("likes.3.abc", "likes", 3, frozenset(), (("likes", 2),))
    return ResetProgress(stage, reset, [ResetPosition(reset.reset_id, "likes", 3, "likes", p, 10 + p)
                                        for p in range(published)], 2, 1_700_000_000_000_000, "key-1")


@pytest.mark.parametrize(("exc", "status", "retry", "says"), [
    (errors.TopicAuthorizationFailedError(), 500, False, "grant it WRITE"),
    (errors.UnknownTopicOrPartitionError(), 500, False, "no longer exists"),
    (CassandraError("Unauthorized: no MODIFY on resets"), 500, False, "COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME"),
    (RuntimeError("unexpected"), 500, False, "RuntimeError"),
    (errors.KafkaConnectionError(), 503, True, "same Idempotency-Key"),
    (errors.KafkaTimeoutError(), 503, True, "same Idempotency-Key"),
    (CassandraUnavailableError("too few replicas"), 503, True, "same Idempotency-Key"),
])
def test_a_failed_reset_names_its_epoch_and_whether_retrying_helps(exc: Exception, status: int, retry: bool,
                                                                   says: str) -> None:
    """A reset failing after it was recorded answers with its epoch and id (detail, the reset member, the log);
    a failure no retry passes answers 500 without Retry-After saying what to fix, a passing one 503 with it."""
    with capture_logs() as logs:
        answer = _api()._reset_failed("likes", [], "ops", _recorded(PUBLISHING, 1), exc)
    assert answer.status == status
    assert ("Retry-After" in answer.headers) == retry
    assert answer.text is not None
    problem = json.loads(answer.text)
    assert problem["reset"] == {"stage": "publishing", "recorded": True, "epoch": 3, "id": "likes.3.abc",
                                "published": 1, "partitions": 2}
    assert "epoch 3 (id likes.3.abc)" in problem["detail"]
    assert says in problem["detail"]
    (failed,) = [e for e in logs if e["event"] == "reset_failed"]
    assert (failed["epoch"], failed["id"], failed["stage"], failed["error"]) == (
        3, "likes.3.abc", "publishing", type(exc).__name__)


def test_a_failure_before_recording_says_nothing_was_recorded() -> None:
    """Cassandra away while the epoch is claimed: 503, nothing recorded, reset again."""
    answer = _api()._reset_failed("likes", [], "ops", ResetProgress(RECORDING),
                                  CassandraUnavailableError("no host"))
    assert answer.status == 503
    assert answer.text is not None
    problem = json.loads(answer.text)
    assert problem["reset"] == {"stage": "recording", "recorded": False}
    assert "nothing was recorded" in problem["detail"]


def test_a_failure_recording_positions_after_every_control_record_is_the_reset_done() -> None:
    """Every control record out, recording their positions failed: 200 with the reset and a warning (the
    mutators that apply it record its positions), not a 503 inviting a second reset."""
    answer = _api()._reset_failed("likes", [], "ops", _recorded(POSITIONS, 2), CassandraUnavailableError("x"))
    assert answer.status == 200
    assert answer.text is not None
    body = json.loads(answer.text)
    assert (body["epoch"], body["id"]) == (3, "likes.3.abc")
    assert [p["offset"] for p in body["positions"]] == [10, 11]
    assert "took effect" in body["warning"]
