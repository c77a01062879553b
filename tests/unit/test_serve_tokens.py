"""The read API's bearer tokens: several at once, a file read again after a change and applied whole or
not at all (a refused or deleted file revokes its tokens, loudly), weak tokens refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from structlog.testing import capture_logs

from countersink.metrics import METRICS
from countersink.serve import TokenError, Tokens, openapi_document
from countersink.settings import ServeSettings

A = "a" * 16
B = "b" * 20
C = "c" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_tokens_means_none_required() -> None:
    """Without tokens or a tokens file the API stays open, as before."""
    assert not Tokens(ServeSettings()).required


def test_every_comma_separated_token_is_accepted_and_nothing_else() -> None:
    """Two tokens in the variable (a rotation in progress): both pass; a prefix, a longer string, the
    empty string and a token with a space do not."""
    tokens = Tokens(ServeSettings(tokens=SecretStr(f"{A}, {B}")))
    assert tokens.required
    assert tokens.accepts(A)
    assert tokens.accepts(B)
    for wrong in (A[:-1], A + "a", "", f"{A} {B}", C):
        assert not tokens.accepts(wrong)


def test_a_tokens_setting_without_a_token_is_refused() -> None:
    """TOKENS set but empty (a secret that did not arrive) stops the start instead of serving without tokens."""
    with pytest.raises(TokenError, match="holds no token"):
        Tokens(ServeSettings(tokens=SecretStr(" , ")))


def test_an_empty_tokens_file_lets_nobody_in(tmp_path: Path) -> None:
    """A tokens file with no token still requires one: every guarded request is refused, and the tokens are
    not usable (the server reports unready)."""
    path = tmp_path / "tokens"
    path.write_text("# none yet\n")
    tokens = Tokens(ServeSettings(tokens_file=path))
    assert tokens.required
    assert not tokens.accepts(A)
    assert not tokens.usable()


def test_short_tokens_are_refused() -> None:
    """A token under 16 characters is not a secret: the server refuses to start with it."""
    with pytest.raises(TokenError, match="entry 2: a token shorter than 16"):
        Tokens(ServeSettings(tokens=SecretStr(f"{A},short")))


def test_a_changed_tokens_file_is_read_again_within_a_second(tmp_path: Path) -> None:
    """The file's tokens replace the old ones once a second has passed since the last look; comments and
    blank lines are ignored."""
    path = tmp_path / "tokens"
    path.write_text(f"# rotation\n{A}\n\n")
    clock = Clock()
    tokens = Tokens(ServeSettings(tokens_file=path), clock=clock)
    assert tokens.accepts(A)
    path.write_text(f"{B}\n")
    os.utime(path, ns=(1, 1))  # a different stamp even within the file system's time resolution
    clock.now = 0.5
    assert tokens.accepts(A)  # not looked at again yet
    clock.now = 1.6
    assert tokens.accepts(B)
    assert not tokens.accepts(A)


def refused(reason: str) -> float:
    return METRICS.serve_tokens_file_refused.labels(reason=reason)._value.get()


def test_a_rewrite_with_a_short_token_revokes_every_token_of_the_file_loudly(tmp_path: Path) -> None:
    """T1 and T2, rewritten as T2 and a token too short: the change cannot be applied whole, so neither T1
    (meant to be revoked) nor T2 is accepted; one ERROR line names the line at fault (never a token), the
    refusal is counted, and no token being left, the tokens are not usable. The file fixed, T2 is back."""
    path = tmp_path / "tokens"
    path.write_text(f"{A}\n{B}\n")
    clock = Clock()
    tokens = Tokens(ServeSettings(tokens_file=path), clock=clock)
    assert tokens.accepts(A)
    assert tokens.usable()
    before = refused("invalid")
    path.write_text(f"{B}\nshort-one\n")
    clock.now = 1.0
    with capture_logs() as logs:
        assert not tokens.accepts(A)
        assert not tokens.accepts(B)
        assert not tokens.usable()
        clock.now = 2.0
        assert not tokens.accepts(B)  # looked at again, unchanged: refused once, said once
    assert [(e["log_level"], e["event"]) for e in logs] == [("error", "tokens_file_refused")]
    assert "line 2: a token shorter than 16 characters" in logs[0]["reason"]
    assert (logs[0]["revoked"], logs[0]["accepted"]) == (2, 0)
    assert not [secret for secret in (A, B, "short-one") if secret in repr(logs)]
    assert refused("invalid") == before + 1
    assert METRICS.serve_tokens_accepted._value.get() == 0
    path.write_text(f"{B}\n")
    clock.now = 3.0
    assert tokens.accepts(B)
    assert not tokens.accepts(A)
    assert tokens.usable()


def test_a_deleted_tokens_file_revokes_its_tokens(tmp_path: Path) -> None:
    """Deleting the file revokes every token it held (ERROR, counted, unusable); the variable's tokens stay;
    a new file is read when it appears."""
    path = tmp_path / "tokens"
    path.write_text(f"{A}\n")
    clock = Clock()
    tokens = Tokens(ServeSettings(tokens_file=path, tokens=SecretStr(C)), clock=clock)
    before = refused("missing")
    path.unlink()
    clock.now = 1.0
    with capture_logs() as logs:
        assert not tokens.accepts(A)
    assert tokens.accepts(C)
    assert tokens.usable()
    assert [(e["log_level"], e["event"], e["cause"]) for e in logs] == [("error", "tokens_file_refused", "missing")]
    assert refused("missing") == before + 1
    path.write_text(f"{B}\n")
    clock.now = 2.0
    assert tokens.accepts(B)
    assert not tokens.accepts(A)


@pytest.mark.parametrize(("make_invalid", "cause", "says"), [
    (lambda path: path.write_bytes(A.encode() + b"\n\xff\xfe\n"), "invalid", "not UTF-8"),
    (lambda path: (path.unlink(), path.mkdir()), "unreadable", "cannot read it"),
    (lambda path: path.write_text((A + "\n") * 70_000), "invalid", "larger than"),
])
def test_a_file_made_unusable_revokes_its_tokens(tmp_path: Path, make_invalid, cause: str, says: str) -> None:  # type: ignore[no-untyped-def]
    """A file that is not UTF-8, cannot be read or is too large: nothing of it is applied, its old tokens are
    revoked, and the ERROR line says why."""
    path = tmp_path / "tokens"
    path.write_text(f"{A}\n")
    clock = Clock()
    tokens = Tokens(ServeSettings(tokens_file=path), clock=clock)
    make_invalid(path)
    clock.now = 1.0
    with capture_logs() as logs:
        assert not tokens.usable()
        assert not tokens.accepts(A)
    assert [(e["event"], e["cause"]) for e in logs] == [("tokens_file_refused", cause)]
    assert says in logs[0]["reason"]


def test_a_same_size_rewrite_with_the_same_time_stamp_is_seen(tmp_path: Path) -> None:
    """A token replaced by another of the same length, with the file's time stamp unchanged (two writes
    within the file system's time resolution): the content is what counts, so the old one is refused."""
    path = tmp_path / "tokens"
    path.write_text(f"{A}\n")
    stamp = path.stat().st_mtime_ns
    clock = Clock()
    tokens = Tokens(ServeSettings(tokens_file=path), clock=clock)
    path.write_text("z" * len(A) + "\n")
    os.utime(path, ns=(stamp, stamp))
    clock.now = 1.0
    assert not tokens.accepts(A)
    assert tokens.accepts("z" * len(A))


def test_a_token_that_is_not_utf8_is_refused_not_an_error() -> None:
    """A header value with bytes that are not UTF-8 (aiohttp decodes them with surrogateescape) is a wrong
    token, not an exception."""
    tokens = Tokens(ServeSettings(tokens=SecretStr(A)))
    assert not tokens.accepts(A + b"\xff".decode("utf-8", "surrogateescape"))


def test_an_unreadable_tokens_file_stops_the_start(tmp_path: Path) -> None:
    """A tokens file that cannot be read at start is a refused setting naming the file."""
    with pytest.raises(TokenError, match="cannot read it: the file does not exist"):
        Tokens(ServeSettings(tokens_file=tmp_path / "missing"))
    (tmp_path / "short").write_text(f"{A}\n\nshort\nalso-short\n")
    with pytest.raises(TokenError, match="lines 3, 4: tokens shorter than 16 characters"):
        Tokens(ServeSettings(tokens_file=tmp_path / "short"))


def test_https_needs_both_certificate_and_key(tmp_path: Path) -> None:
    """A certificate without its key (or the reverse) is refused when the settings are read."""
    with pytest.raises(ValidationError, match="both tls_cert and tls_key"):
        ServeSettings(tls_cert=tmp_path / "cert.pem")


def test_tokens_do_not_appear_in_the_settings_repr() -> None:
    """The tokens are secrets: repr() of the settings masks them."""
    settings = ServeSettings(tokens=SecretStr(A))
    assert A not in repr(settings)
    assert A not in str(settings)


def test_the_openapi_document_says_a_bearer_token_is_needed_when_one_is() -> None:
    """With tokens set, /openapi.json declares the bearer scheme for every path and a 401 answer; without
    tokens it declares neither."""
    guarded = openapi_document(ServeSettings(tokens=SecretStr(A)))
    assert guarded["security"] == [{"bearer": []}]
    assert guarded["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert all("401" in operation["get"]["responses"] for operation in guarded["paths"].values())
    open_document = openapi_document(ServeSettings())
    assert "security" not in open_document
    assert all("401" not in operation["get"]["responses"] for operation in open_document["paths"].values())


def test_admin_tokens_carry_a_name_and_only_the_name_comes_out(tmp_path: Path) -> None:
    """Admin tokens are NAME:TOKEN: an accepted one gives its name (what a reset records), any other None; a
    read token is not an admin token."""
    path = tmp_path / "admin"
    path.write_text(f"# admins\nops-oncall:{A}\nalice@example.org : {B}\n")
    settings = ServeSettings(tokens=SecretStr(C), admin_tokens_file=path, admin_cassandra_username="writer")
    admin = Tokens(settings, admin=True)
    assert (admin.name_of(A), admin.name_of(B), admin.name_of(C), admin.name_of("")) == (
        "ops-oncall", "alice@example.org", None, None)
    assert Tokens(settings).name_of(C) == ""


def test_an_admin_line_without_a_name_is_refused_without_quoting_it() -> None:
    """An admin entry that is not NAME:TOKEN (or whose name has a space) stops the start; the reason names the
    entry, never what it holds."""
    for entry in (A, f"two words:{A}", f":{A}", "ops:"):
        with pytest.raises(TokenError, match="entry 2: not NAME:TOKEN") as refused:
            Tokens(ServeSettings(admin_tokens=SecretStr(f"ops:{B},{entry}"), admin_cassandra_username="w"),
                   admin=True)
        assert A not in str(refused.value)


def test_admin_tokens_and_the_writing_role_come_together() -> None:
    """Admin tokens without the role that writes resets (or the role without tokens) are refused: a route
    nobody may call, or one that could not write, would only mislead."""
    with pytest.raises(ValidationError, match="set both or neither"):
        ServeSettings(admin_tokens=SecretStr(f"ops:{A}"))
    with pytest.raises(ValidationError, match="set both or neither"):
        ServeSettings(admin_cassandra_username="writer")
    assert ServeSettings(admin_tokens=SecretStr(f"ops:{A}"), admin_cassandra_username="writer").admin


def test_the_reset_operation_is_described_only_when_served() -> None:
    """/openapi.json describes POST /counters/{name}/reset, behind the admin scheme, only when it is served."""
    settings = ServeSettings(admin_tokens=SecretStr(f"ops:{A}"), admin_cassandra_username="writer")
    assert "/counters/{name}/reset" not in openapi_document(settings)["paths"]
    document = openapi_document(settings, resetting=True)
    operation = document["paths"]["/counters/{name}/reset"]["post"]
    assert operation["security"] == [{"admin": []}]
    assert {"401", "403"} <= set(operation["responses"])
    assert document["components"]["securitySchemes"]["admin"]["scheme"] == "bearer"
