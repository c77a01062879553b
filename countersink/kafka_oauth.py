"""SASL OAUTHBEARER for Kafka: access tokens from an OAuth 2.0 / OIDC token endpoint (client credentials grant).

aiokafka asks a token provider for a token each time it opens a connection. :class:`ClientCredentialsTokens`
keeps the last token and fetches a new one once 80% of its lifetime has passed (the refresh point of Kafka's own
Java client), so a connection opened at any moment presents a token that is still valid. A token endpoint that
does not answer when a refresh is due is not fatal while the old token lives: the old one is used, with a
WARNING. Neither the client secret nor a token is ever logged or put in an error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import KafkaError

from countersink.logs import get_logger
from countersink.redaction import server_words, shown_url
from countersink.settings import KafkaSettings

log = get_logger(__name__)

REFRESH_FRACTION = 0.8  # of a token's lifetime, after which the next connection gets a new one
FALLBACK_LIFETIME_S = 60.0  # a token with neither expires_in nor an exp claim is used this long
MAX_ANSWER_BYTES = 64 * 1024  # a token endpoint's answer is untrusted input: read at most this much


class TokenEndpointError(KafkaError):  # type: ignore[misc]  # aiokafka ships no type hints
    """Raised (to aiokafka, which then treats the connection as failed) when the token endpoint could not be
    reached or gave no usable token: retriable, the next connection attempt asks again."""

    retriable = True


class TokenRefusedError(TokenEndpointError):
    """Raised when the token endpoint refused the client (wrong client id or secret, unknown scope: an HTTP
    400 or 401 answer): retrying cannot fix it."""

    retriable = False


@dataclass(frozen=True)
class Token:
    value: str
    lifetime_s: float
    fetched_at: float  # monotonic

    def due(self, now: float) -> bool:
        """Time to fetch the next one (80% of the lifetime gone)."""
        return now >= self.fetched_at + REFRESH_FRACTION * self.lifetime_s

    def expired(self, now: float) -> bool:
        return now >= self.fetched_at + self.lifetime_s


def token_lifetime(answer: dict[str, Any], now_epoch: float) -> float:
    """Seconds the token in a token endpoint's ``answer`` lives: ``expires_in`` (RFC 6749 §5.1); without it,
    the JWT's ``exp`` claim (read, not verified: only the broker judges the token); else a minute."""
    expires_in = answer.get("expires_in")
    if isinstance(expires_in, int | float | str):
        try:
            seconds = float(expires_in)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    parts = str(answer.get("access_token", "")).split(".")
    if len(parts) == 3:
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except (ValueError, binascii.Error):
            claims = None
        exp = claims.get("exp") if isinstance(claims, dict) else None
        if isinstance(exp, int | float) and exp > now_epoch:
            return float(exp - now_epoch)
    return FALLBACK_LIFETIME_S


class ClientCredentialsTokens(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no type hints
    """aiokafka's token provider for OAUTHBEARER: the client credentials grant against
    ``sasl_oauth_token_url``, one token shared by every connection of the client until it is due."""

    def __init__(self, settings: KafkaSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not (settings.sasl_oauth_token_url and settings.sasl_oauth_client_id
                and settings.sasl_oauth_client_secret):
            raise ValueError("OAUTHBEARER needs sasl_oauth_token_url, sasl_oauth_client_id, sasl_oauth_client_secret")
        self._url = settings.sasl_oauth_token_url
        self._shown_url = shown_url(self._url)  # its query may hold a credential: never logged
        self._client_id = settings.sasl_oauth_client_id
        self._secret = settings.sasl_oauth_client_secret
        self._scope = settings.sasl_oauth_scope
        self._cafile = settings.sasl_oauth_cafile
        self._timeout_s = settings.request_timeout_ms / 1000
        self._clock = clock
        self._token: Token | None = None
        self._lock = asyncio.Lock()
        self.fetched = 0  # tokens fetched so far (the tests count refreshes with it)

    def __repr__(self) -> str:
        return f"ClientCredentialsTokens(url={self._shown_url!r}, client_id={self._client_id!r})"

    async def token(self) -> str:
        """A token that is not yet due, fetched now if needed. Raises :class:`TokenRefusedError` or
        :class:`TokenEndpointError` (both :class:`~aiokafka.errors.KafkaError`) when there is none to give."""
        async with self._lock:  # many connections open at once: one fetch
            held = self._token
            if held is not None and not held.due(self._clock()):
                return held.value
            try:
                self._token = await self._fetch()
            except TokenRefusedError:
                raise
            except TokenEndpointError as exc:
                if held is None or held.expired(self._clock()):
                    raise
                log.warning("kafka_token_refresh_failed", token_url=self._shown_url, client_id=self._client_id,
                            error=str(exc), expires_in_s=round(held.fetched_at + held.lifetime_s - self._clock(), 1))
                return held.value
            return self._token.value

    def _ssl(self) -> ssl.SSLContext | None:
        if not self._url.lower().startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=str(self._cafile) if self._cafile else None)
        except (OSError, ssl.SSLError) as exc:
            raise TokenRefusedError(f"COUNTERSINK_KAFKA__SASL_OAUTH_CAFILE: cannot use {self._cafile}: "
                                    f"{getattr(exc, 'strerror', None) or exc}") from None

    async def _fetch(self) -> Token:
        import aiohttp  # here: only processes that use OAUTHBEARER pay for importing it

        form = {"grant_type": "client_credentials", **({"scope": self._scope} if self._scope else {})}
        # RFC 6749 §2.3.1: id and secret are form-encoded, then sent with HTTP Basic authentication.
        pair = f"{_form_encode(self._client_id)}:{_form_encode(self._secret.get_secret_value())}"
        headers = {"Accept": "application/json", "Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
        where = f"the token endpoint {self._shown_url}"
        started = self._clock()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s)) as session, \
                    session.post(self._url, data=form, headers=headers, ssl=self._ssl() or False,
                                 allow_redirects=False) as answer:
                status = answer.status
                body = b""
                while len(body) <= MAX_ANSWER_BYTES and (
                        chunk := await answer.content.read(MAX_ANSWER_BYTES + 1 - len(body))):
                    body += chunk
        except aiohttp.ClientSSLError as exc:
            raise TokenRefusedError(f"TLS with {where} failed: {_ssl_reason(exc)} (check "
                                    "COUNTERSINK_KAFKA__SASL_OAUTH_CAFILE)") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = self._clean(str(exc).replace(self._url, self._shown_url))
            raise TokenEndpointError(f"cannot reach {where}: {type(exc).__name__} {reason}".rstrip()) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise TokenEndpointError(f"{where} answered more than {MAX_ANSWER_BYTES} bytes")
        answer_json = _json_object(body)
        if status in (400, 401, 403):
            error = self._clean(str(answer_json.get("error", "")))
            description = self._clean(str(answer_json.get("error_description", "")))
            reason = ": ".join(part for part in (error, description) if part) or "no reason given"
            raise TokenRefusedError(f"{where} refused client {self._client_id!r} (HTTP {status}, {reason}; check "
                                    "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_ID, __SASL_OAUTH_CLIENT_SECRET and "
                                    "__SASL_OAUTH_SCOPE)")
        if status != 200:
            raise TokenEndpointError(f"{where} answered HTTP {status}")
        value = answer_json.get("access_token")
        if not isinstance(value, str) or not value or not value.isascii() or not value.isprintable() or " " in value:
            raise TokenEndpointError(f"{where} answered without a usable access_token")
        lifetime = token_lifetime(answer_json, time.time())
        self.fetched += 1
        log.debug("kafka_token_fetched", token_url=self._shown_url, client_id=self._client_id, lifetime_s=lifetime)
        return Token(value, lifetime, started)

    def _clean(self, text: str) -> str:
        """The endpoint's own words, bounded to one printable line and never repeating the secret, in any form
        it was sent in (form-encoded, paired with the id, base64 behind Basic: an endpoint may echo them)."""
        return server_words(text, [(self._client_id, self._secret.get_secret_value())])


def _form_encode(text: str) -> str:
    from urllib.parse import quote_plus

    return quote_plus(text)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _ssl_reason(exc: BaseException) -> str:
    cause = getattr(exc, "certificate_error", None) or getattr(exc, "os_error", None) or exc
    return str(getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or cause)
