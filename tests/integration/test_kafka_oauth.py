"""SASL OAUTHBEARER on a real Kafka broker, with a real token endpoint over HTTPS.

The module starts its own single-node broker (own ports, own data directory, stopped at the end) with a
SASL_PLAINTEXT listener that takes OAUTHBEARER only, validated by Kafka's unsecured JWS validator
(``OAuthBearerUnsecuredValidatorCallbackHandler``, its default: unsigned JWTs, ``exp`` and a required scope
checked). The identity provider is a small aiohttp server issuing such JWTs for the client credentials grant;
Kafka is the server under test. The broker ends each session when its token expires
(``connections.max.reauth.ms``), so a client that did not refresh its token would be refused on reconnecting.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
from aiohttp import web
from pydantic import SecretStr
from structlog.testing import capture_logs

from countersink.kafka import KafkaSecurityError, ensure_topics, make_consumer, make_producer, start_admin
from countersink.kafka_oauth import ClientCredentialsTokens, TokenEndpointError
from countersink.settings import KafkaSecurity, KafkaSettings
from stack.secure import Certificates, make_certificates
from stack.servers import KafkaServer, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLIENT_ID = "countersink-oauth"
SECRET = "s3cret-" + uuid.uuid4().hex  # a test IdP's client secret
SCOPE = "kafka"
LIFETIME_S = 4.0  # short: a test of a few seconds sees several tokens


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@dataclass
class IdentityProvider:
    """A token endpoint for one client: unsigned JWTs (``alg: none``) for the client credentials grant."""

    client_id: str
    secret: str
    lifetime_s: float
    issued: list[str] = field(default_factory=list)
    refused: int = 0

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        user, _, password = base64.b64decode(credentials or "Og==").decode().partition(":")
        if scheme != "Basic" or (unquote_plus(user), unquote_plus(password)) != (self.client_id, self.secret):
            self.refused += 1
            return web.json_response({"error": "invalid_client", "error_description": "client authentication failed"},
                                     status=401)
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        now = time.time()
        claims = {"sub": self.client_id, "iat": math.floor(now), "exp": math.ceil(now + self.lifetime_s),
                  "scope": str(form.get("scope", ""))}
        jwt = f"{_b64({'alg': 'none'})}.{_b64(claims)}."
        self.issued.append(jwt)
        return web.json_response({"access_token": jwt, "token_type": "Bearer", "expires_in": self.lifetime_s})


@dataclass
class OAuthKafkaServer(KafkaServer):
    """The stack's broker plus a SASL_PLAINTEXT listener on ``oauth_port`` taking OAUTHBEARER only. The
    PLAINTEXT listener stays for the broker itself (and the readiness probe)."""

    oauth_port: int = 0
    heap: str = "384m"

    @property
    def oauth_bootstrap(self) -> str:
        return f"{self.host}:{self.oauth_port}"

    def _properties(self, data: Path) -> dict[str, str]:
        props = super()._properties(data)
        module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
        props.update({
            "listeners": f"PLAINTEXT://{self.host}:{self.port},OAUTH://{self.oauth_bootstrap},"
                         f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port},OAUTH://{self.oauth_bootstrap}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,OAUTH:SASL_PLAINTEXT",
            "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
            # The broker's own (unused) login, and the unsecured validator's one option: the scope it requires.
            "listener.name.oauth.oauthbearer.sasl.jaas.config":
                f'{module} required unsecuredLoginStringClaim_sub="broker" unsecuredValidatorRequiredScope="{SCOPE}";',
            # A session lasts as long as its token: the broker closes a connection whose token has expired.
            "listener.name.oauth.oauthbearer.connections.max.reauth.ms": "600000",
        })
        return props


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("oauth-certs"))


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthKafkaServer]:
    broker = OAuthKafkaServer(port=free_port(), controller_port=free_port(), oauth_port=free_port(),
                              root=tmp_path_factory.mktemp("oauth-kafka"))
    try:
        broker.start(timeout=180)
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
async def idp(certs: Certificates) -> AsyncIterator[tuple[IdentityProvider, str]]:
    import ssl

    provider = IdentityProvider(CLIENT_ID, SECRET, LIFETIME_S)
    app = web.Application()
    app.router.add_post("/oauth2/token", provider.token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=context)
    await site.start()
    try:
        yield provider, f"https://127.0.0.1:{port}/oauth2/token"
    finally:
        await runner.cleanup()


def _settings(broker: OAuthKafkaServer, url: str, certs: Certificates, secret: str = SECRET) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=[broker.oauth_bootstrap], security_protocol=KafkaSecurity.SASL_PLAINTEXT,
        allow_insecure=True, sasl_mechanism="OAUTHBEARER", sasl_oauth_token_url=url,
        sasl_oauth_client_id=CLIENT_ID, sasl_oauth_client_secret=SecretStr(secret), sasl_oauth_scope=SCOPE,
        sasl_oauth_cafile=certs.ca_cert, request_timeout_ms=10_000)


async def test_produce_and_consume_with_oauthbearer_across_token_refreshes(
    oauth_broker: OAuthKafkaServer, idp: tuple[IdentityProvider, str], certs: Certificates
) -> None:
    """Through countersink's client factories with OAUTHBEARER, a topic is created and 24 records sent one
    every 0.5 s arrive in order, while the broker ends every session when its 4 s token expires: the
    clients reconnect with refreshed tokens (several fetched, each client fetching at most one per 80% of a
    lifetime)."""
    provider, url = idp
    settings = _settings(oauth_broker, url, certs)
    topic = f"oauth-{uuid.uuid4().hex[:8]}"
    await ensure_topics(settings, {topic: 1})
    issued_before = len(provider.issued)
    producer = make_producer(settings)
    consumer = make_consumer(settings, topic, auto_offset_reset="earliest", enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    started = time.monotonic()
    try:
        received: list[bytes] = []

        async def receive() -> None:
            while len(received) < 24:
                batch = await consumer.getmany(timeout_ms=500)
                received.extend(r.value for records in batch.values() for r in records if r.value is not None)

        reader = asyncio.create_task(receive())
        for i in range(24):
            await producer.send_and_wait(topic, f"r{i}".encode())
            await asyncio.sleep(0.5)
        await asyncio.wait_for(reader, 30)
    finally:
        await consumer.stop()
        await producer.stop()
    elapsed = time.monotonic() - started
    assert received == [f"r{i}".encode() for i in range(24)]
    assert elapsed > 3 * LIFETIME_S
    # Two clients, each needing a token at its start and after each expiry it reconnected past.
    fetched = len(provider.issued) - issued_before
    assert fetched >= 4, f"only {fetched} tokens fetched in {elapsed:.0f}s"
    assert fetched <= 2 * (elapsed / (0.8 * LIFETIME_S) + 2), f"{fetched} tokens fetched in {elapsed:.0f}s"


async def test_the_provider_reuses_a_token_until_80_percent_of_its_lifetime(
    idp: tuple[IdentityProvider, str], oauth_broker: OAuthKafkaServer, certs: Certificates
) -> None:
    """One fetch serves every call (and concurrent calls) until 80% of the lifetime has passed; then the next
    call fetches a new token."""
    provider, url = idp
    tokens = ClientCredentialsTokens(_settings(oauth_broker, url, certs))
    first = await asyncio.gather(*(tokens.token() for _ in range(5)))
    assert len(set(first)) == 1
    assert tokens.fetched == 1
    await asyncio.sleep(0.5 * LIFETIME_S)
    assert await tokens.token() == first[0]
    await asyncio.sleep(0.4 * LIFETIME_S)  # past 80%, before expiry
    second = await tokens.token()
    assert second != first[0]
    assert tokens.fetched == 2
    assert provider.issued[-1] == second


async def test_a_token_endpoint_that_goes_away_leaves_the_live_token_in_use_until_it_expires(
    oauth_broker: OAuthKafkaServer, certs: Certificates
) -> None:
    """An endpoint of its own, stopped after the first token: past 80% of the lifetime the provider keeps the
    live token with one kafka_token_refresh_failed WARNING; past its expiry it raises the retriable
    TokenEndpointError naming the endpoint (aiokafka then counts the connection as failed and retries)."""
    import ssl

    provider = IdentityProvider(CLIENT_ID, SECRET, LIFETIME_S)
    app = web.Application()
    app.router.add_post("/oauth2/token", provider.token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    url = f"https://127.0.0.1:{port}/oauth2/token"
    tokens = ClientCredentialsTokens(_settings(oauth_broker, url, certs))
    try:
        first = await tokens.token()
    finally:
        await runner.cleanup()
    await asyncio.sleep(0.85 * LIFETIME_S)
    with capture_logs() as logs:
        assert await tokens.token() == first
    assert [(e["event"], e["log_level"]) for e in logs] == [("kafka_token_refresh_failed", "warning")]
    assert f"cannot reach the token endpoint {url}" in logs[0]["error"]
    await asyncio.sleep(0.2 * LIFETIME_S)
    with pytest.raises(TokenEndpointError, match="cannot reach the token endpoint") as away:
        await tokens.token()
    assert away.value.retriable
    assert provider.issued == [first]


async def test_a_wrong_client_secret_is_one_clear_error_without_the_secret(
    oauth_broker: OAuthKafkaServer, idp: tuple[IdentityProvider, str], certs: Certificates
) -> None:
    """A wrong client secret: start_admin raises KafkaSecurityError naming the token endpoint, the client
    and the settings to check; `countersink topics create` (the secret in its environment) exits 1 with that
    one error line. Neither says the secret, nor does the command's every line at DEBUG; no token was issued."""
    provider, url = idp
    wrong = "wrong-" + uuid.uuid4().hex
    issued = len(provider.issued)
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError) as refused:
        await start_admin(_settings(oauth_broker, url, certs, secret=wrong))
    message = str(refused.value)
    assert f"the token endpoint {url} refused client '{CLIENT_ID}'" in message
    assert "HTTP 401, invalid_client: client authentication failed" in message
    assert "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_ID, __SASL_OAUTH_CLIENT_SECRET" in message
    assert wrong not in message
    assert SECRET not in message
    assert time.monotonic() - started < 20

    env = {**os.environ, "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": oauth_broker.oauth_bootstrap,
           "COUNTERSINK_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "COUNTERSINK_KAFKA__ALLOW_INSECURE": "true",
           "COUNTERSINK_KAFKA__SASL_MECHANISM": "OAUTHBEARER", "COUNTERSINK_KAFKA__SASL_OAUTH_TOKEN_URL": url,
           "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_ID": CLIENT_ID, "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_SECRET": wrong,
           "COUNTERSINK_KAFKA__SASL_OAUTH_SCOPE": SCOPE, "COUNTERSINK_KAFKA__SASL_OAUTH_CAFILE": str(certs.ca_cert),
           "COUNTERSINK_LOG_FORMAT": "json"}
    outputs = {}
    for level in ("INFO", "DEBUG"):
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "topics", "create",
                                                       "oauth-refused"], cwd=REPO, env={
                                                           **env, "COUNTERSINK_LOG_LEVEL": level},
                                      capture_output=True, text=True, timeout=60)
        outputs[level] = run.stdout + run.stderr
        assert run.returncode == 1, outputs[level]
        assert wrong not in outputs[level]
    lines = [json.loads(line) for line in outputs["INFO"].splitlines()]
    assert [line["level"] for line in lines] == ["warning", "error"], outputs["INFO"]  # ALLOW_INSECURE's, then ours
    assert lines[1]["error"] == message, outputs["INFO"]
    assert len(provider.issued) == issued


async def test_debug_logs_of_an_oauthbearer_login_hold_neither_token_nor_secret(
    oauth_broker: OAuthKafkaServer, idp: tuple[IdentityProvider, str], certs: Certificates
) -> None:
    """`countersink topics create` with the right secret, at DEBUG (aiokafka logs every request, the SASL one
    by name only): the topic is created, and no line holds the client secret or a token the command fetched."""
    provider, url = idp
    issued = len(provider.issued)
    topic = f"oauth-debug-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": oauth_broker.oauth_bootstrap,
           "COUNTERSINK_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "COUNTERSINK_KAFKA__ALLOW_INSECURE": "true",
           "COUNTERSINK_KAFKA__SASL_MECHANISM": "OAUTHBEARER", "COUNTERSINK_KAFKA__SASL_OAUTH_TOKEN_URL": url,
           "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_ID": CLIENT_ID, "COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_SECRET": SECRET,
           "COUNTERSINK_KAFKA__SASL_OAUTH_SCOPE": SCOPE, "COUNTERSINK_KAFKA__SASL_OAUTH_CAFILE": str(certs.ca_cert),
           "COUNTERSINK_LOG_FORMAT": "json", "COUNTERSINK_LOG_LEVEL": "DEBUG"}
    run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "countersink.cli", "topics", "create", topic,
                                                   "--partitions", "1"], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=60)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "SaslAuthenticateRequest_v1(<redacted>)" in output  # the request that carries the token was logged
    tokens = provider.issued[issued:]
    assert tokens
    for token in tokens:
        assert token not in output
        assert token.split(".")[1] not in output  # nor its claims
    assert SECRET not in output
    admin = await start_admin(_settings(oauth_broker, url, certs))
    try:
        assert topic in await admin.list_topics()
    finally:
        await admin.close()
