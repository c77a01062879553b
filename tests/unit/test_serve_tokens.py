"""The read API's bearer tokens: several at once, a file read again after a change, weak tokens refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

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
    """A tokens file with no token still requires one: every guarded request is refused."""
    path = tmp_path / "tokens"
    path.write_text("# none yet\n")
    tokens = Tokens(ServeSettings(tokens_file=path))
    assert tokens.required
    assert not tokens.accepts(A)


def test_short_tokens_are_refused() -> None:
    """A token under 16 characters is not a secret: the server refuses to start with it."""
    with pytest.raises(TokenError, match="shorter than 16"):
        Tokens(ServeSettings(tokens=SecretStr("short")))


def test_a_changed_tokens_file_is_read_again_within_a_second(tmp_path: Path) -> None:
    """The file's tokens replace the old ones once a second has passed since the last look; comments and
    blank lines are ignored; a file that disappears keeps the tokens last read."""
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
    path.unlink()
    clock.now = 3.0
    assert tokens.accepts(B)


def test_an_unreadable_tokens_file_stops_the_start(tmp_path: Path) -> None:
    """A tokens file that cannot be read at start is a refused setting naming the file."""
    with pytest.raises(TokenError, match="cannot read"):
        Tokens(ServeSettings(tokens_file=tmp_path / "missing"))


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
