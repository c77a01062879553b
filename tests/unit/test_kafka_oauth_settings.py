"""OAUTHBEARER settings: what they require, what they refuse, what they warn about, and how a token endpoint's
answer gives a token its lifetime (the real token endpoint and broker are in
tests/integration/test_kafka_oauth.py)."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from countersink.kafka import connection_options
from countersink.kafka_oauth import FALLBACK_LIFETIME_S, ClientCredentialsTokens, Token, token_lifetime
from countersink.settings import KafkaSettings

OAUTH = {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
         "sasl_oauth_token_url": "https://idp.example/oauth2/token", "sasl_oauth_client_id": "countersink",
         "sasl_oauth_client_secret": "secret-of-countersink"}


def test_oauthbearer_needs_the_token_url_client_id_and_secret_but_no_user_name() -> None:
    """Complete, OAUTHBEARER needs no SASL user name or password; any of its three missing is refused."""
    settings = KafkaSettings(**OAUTH)  # type: ignore[arg-type]
    assert settings.oauth
    assert settings.insecure_choices() == []
    for missing in ("sasl_oauth_token_url", "sasl_oauth_client_id", "sasl_oauth_client_secret"):
        with pytest.raises(ValidationError, match="SASL OAUTHBEARER needs sasl_oauth_token_url"):
            KafkaSettings(**{k: v for k, v in OAUTH.items() if k != missing})  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["ftp://idp.example/token", "https://user:pw@idp.example/token",
                                 "https://idp.example/a token", "idp.example/token", "https://"])
def test_a_token_url_that_is_not_plain_http_or_https_is_refused(url: str) -> None:
    """Only http(s) URLs without credentials in them (they would be logged with the URL) or spaces."""
    with pytest.raises(ValidationError, match="sasl_oauth_token_url"):
        KafkaSettings(**{**OAUTH, "sasl_oauth_token_url": url})  # type: ignore[arg-type]


def test_a_token_endpoint_over_http_is_refused_without_allow_insecure_and_a_warning_with_it() -> None:
    """http sends the client secret in the clear: refused, unless allowed, then a WARNING naming the URL and
    client id (never the secret); SASL_PLAINTEXT's warning names the client id as the user."""
    http = {**OAUTH, "sasl_oauth_token_url": "http://idp.example/token"}
    with pytest.raises(ValidationError, match="the client secret would cross the network in the clear"):
        KafkaSettings(**http)  # type: ignore[arg-type]
    allowed = KafkaSettings(**{**http, "allow_insecure": True, "security_protocol": "SASL_PLAINTEXT"})  # type: ignore[arg-type]
    assert allowed.insecure_choices() == [
        ("kafka_credentials_without_tls", {"user": "countersink", "mechanism": "OAUTHBEARER"}),
        ("kafka_token_endpoint_without_tls", {"token_url": "http://idp.example/token", "client_id": "countersink"})]


def test_the_client_secret_is_never_shown() -> None:
    """repr() of the settings, of the token provider and of the client options hide the secret."""
    settings = KafkaSettings(**OAUTH)  # type: ignore[arg-type]
    options = connection_options(settings)
    assert isinstance(options["sasl_oauth_token_provider"], ClientCredentialsTokens)
    assert "sasl_plain_password" not in options
    for shown in (repr(settings), str(settings), repr(options)):
        assert "secret-of-countersink" not in shown


def _jwt(claims: dict[str, object]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJub25lIn0.{body}."


@pytest.mark.parametrize(("answer", "lifetime"), [
    ({"access_token": "t", "expires_in": 300}, 300.0),
    ({"access_token": "t", "expires_in": "120"}, 120.0),  # some endpoints send a string
    ({"access_token": _jwt({"exp": 1_000_090}), "expires_in": 0}, 90.0),  # no usable expires_in: the exp claim
    ({"access_token": _jwt({"exp": 1_000_090})}, 90.0),
    ({"access_token": _jwt({"exp": 999_000})}, FALLBACK_LIFETIME_S),  # an exp in the past says nothing
    ({"access_token": "opaque", "expires_in": "soon"}, FALLBACK_LIFETIME_S),
    ({"access_token": "a.bm90IGpzb24.", "expires_in": float("nan")}, FALLBACK_LIFETIME_S),
])
def test_token_lifetime(answer: dict[str, object], lifetime: float) -> None:
    """expires_in first, then the JWT's exp claim, else a minute."""
    assert token_lifetime(answer, now_epoch=1_000_000) == lifetime


def test_a_token_is_due_at_80_percent_of_its_lifetime() -> None:
    """Refreshed from 80% of its lifetime on, expired at 100%."""
    token = Token("t", lifetime_s=100, fetched_at=1000)
    assert not token.due(1079.9)
    assert token.due(1080)
    assert not token.expired(1099.9)
    assert token.expired(1100)


def test_oauthbearer_without_sasl_is_refused_as_unused() -> None:
    """The mechanism on a connection without SASL would never be used (no token asked for, no login made):
    refused rather than left to look like a login."""
    with pytest.raises(ValidationError, match="sasl_mechanism is set but security_protocol is SSL"):
        KafkaSettings(security_protocol="SSL", sasl_mechanism="OAUTHBEARER")  # type: ignore[arg-type]
