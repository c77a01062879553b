"""A token endpoint or schema registry that echoes the credentials it refused (some do, and so may a proxy in
front of them) never gets them into countersink's errors, in any form HTTP carried them: raw, form-encoded,
paired with the user, base64 behind ``Basic``. Real HTTP servers on 127.0.0.1 answer as such servers do."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from countersink.kafka_oauth import ClientCredentialsTokens, TokenRefusedError
from countersink.redaction import MAX_WORDS_CHARS, server_words
from countersink.schema_registry import SchemaRegistryClient, SchemaRegistryRefusedError
from countersink.settings import KafkaSettings, SchemaRegistrySettings

SECRET = "S3cr3t-XYZZY/pw+1234 ä"  # noqa: S105 (a test's distinctive secret)
USER = "revc-client"


def forms_of(user: str, secret: str) -> list[str]:
    """What a leak would look like: the secret and its encodings, alone and paired with the user."""
    encoded = [secret, urllib.parse.quote_plus(secret), urllib.parse.quote(secret, safe="")]
    pairs = [f"{u}:{s}" for u in (user, urllib.parse.quote_plus(user)) for s in encoded]
    raw = [p.encode(charset) for p in pairs for charset in ("utf-8", "latin-1")]
    return [*encoded, *pairs, *(base64.b64encode(r).decode().rstrip("=") for r in raw)]


def assert_hidden(text: str) -> None:
    for form in forms_of(USER, SECRET):
        assert form not in text, (form, text)
    assert "S3cr3t" not in text, text  # the secret's start, raw
    assert "UzNjcjN0" not in text, text  # and in base64


Echo = Callable[[web.Request, str], web.Response]

ECHOES: dict[str, Echo] = {
    "authorization header": lambda request, form: web.json_response(
        {"error": "invalid_client", "error_description": "bad credentials " + request.headers["Authorization"]},
        status=401),
    "form-encoded pair": lambda request, form: web.json_response(
        {"error": "invalid_client", "error_description": "client "
         + base64.b64decode(request.headers["Authorization"].split()[1]).decode() + " refused"}, status=401),
    "decoded secret": lambda request, form: web.json_response(
        {"error": "invalid_client", "error_description": "secret " + SECRET + " refused"}, status=400),
    "secret past the length bound": lambda request, form: web.json_response(
        {"error": "invalid_client", "error_description": "x" * (MAX_WORDS_CHARS - 8) + " " + SECRET}, status=403),
    "registry message": lambda request, form: web.json_response(
        {"error_code": 42201, "message": "Invalid schema from " + request.headers.get("Authorization", "")
         + " " + base64.b64decode(request.headers["Authorization"].split()[1]).decode("latin-1")
         + " " + request.headers["Authorization"].split()[1]}, status=422),
}


@pytest.fixture
async def echoing() -> AsyncIterator[Callable[[str], str]]:
    """A server answering every request by ``ECHOES[name]``; the fixture gives its URL for a name."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return ECHOES[request.match_info["name"]](request, request.match_info["name"])

    app = web.Application()
    app.router.add_route("*", "/{name}/{rest:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield lambda name: f"http://127.0.0.1:{port}/{urllib.parse.quote(name)}"
    await runner.cleanup()


@pytest.mark.parametrize("echo", ["authorization header", "form-encoded pair", "decoded secret",
                                  "secret past the length bound"])
async def test_a_token_endpoint_echoing_the_client_secret_is_quoted_without_it(
        echoing: Callable[[str], str], echo: str) -> None:
    """The endpoint's refusal keeps its error code and words, never the secret in any form it was sent in."""
    settings = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER", allow_insecure=True,
                             sasl_oauth_token_url=echoing(echo) + "/token", sasl_oauth_client_id=USER,
                             sasl_oauth_client_secret=SECRET)  # type: ignore[arg-type]
    with pytest.raises(TokenRefusedError) as refused:
        await ClientCredentialsTokens(settings).token()
    assert "invalid_client" in str(refused.value), refused.value
    assert_hidden(str(refused.value))


async def test_a_registry_refusing_the_credentials_is_not_quoted(echoing: Callable[[str], str]) -> None:
    """A 401 says which settings to check, not what the registry answered; another refusal quotes the registry's
    message without the password in any form."""
    ECHOES["unauthorized"] = lambda request, form: web.json_response(
        {"error_code": 401, "message": "Unauthorized: " + request.headers["Authorization"]}, status=401)
    for name, expected in (("unauthorized", "refused the credentials (401)"), ("registry message", "Invalid schema")):
        settings = SchemaRegistrySettings(url=echoing(name), username=USER, password=SECRET,
                                          allow_insecure=True)  # type: ignore[arg-type]
        async with SchemaRegistryClient(settings) as client:
            with pytest.raises(SchemaRegistryRefusedError) as refused:
                await client.register("revc-value", "AVRO", '"string"')
        assert expected in str(refused.value), refused.value
        assert_hidden(str(refused.value))
    settings = SchemaRegistrySettings(url=echoing("unauthorized"), username=USER, password=SECRET,
                                      allow_insecure=True)  # type: ignore[arg-type]
    async with SchemaRegistryClient(settings) as client:  # a consumer's look-up of a record's schema
        with pytest.raises(SchemaRegistryRefusedError) as refused:
            await client.schema_by_id(7)
    assert "refused the credentials (401) to read schema id 7" in str(refused.value), refused.value
    assert_hidden(str(refused.value))


def test_a_password_cut_by_the_length_bound_leaves_no_part_behind() -> None:
    """Redacted before it is cut: a secret straddling the bound is gone whole, not cut to a prefix."""
    words = server_words("y" * (MAX_WORDS_CHARS - 4) + SECRET, [(USER, SECRET)])
    assert len(words) == MAX_WORDS_CHARS
    assert "S3cr" not in words


@pytest.mark.parametrize("url", ["https://u:pa/ss@idp.example/token", "https://idp.example/t?u=a@b"])
def test_a_token_url_holding_an_at_sign_anywhere_is_refused(url: str) -> None:
    """A password holding "/" ends the host early; a check of the host alone let it through (and the URL is
    logged)."""
    with pytest.raises(ValueError, match="sasl_oauth_token_url"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", sasl_oauth_token_url=url,
                      sasl_oauth_client_id=USER, sasl_oauth_client_secret=SECRET)  # type: ignore[arg-type]


@pytest.mark.parametrize(("url", "why"), [("https://u:pa/ss@registry.example", "user name or password"),
                                          ("https://registry.example/?key=s3cr3t", "without a query")])
def test_a_registry_url_with_credentials_or_a_query_is_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        SchemaRegistrySettings(url=url)


def test_a_token_url_is_shown_without_its_query() -> None:
    """A query may carry a credential (``?client_secret=``): the start-up warning shows the URL without it."""
    url_with_query = "http://idp.example/token?client_secret=s3cr3t"
    settings = KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER", allow_insecure=True,
                             sasl_oauth_token_url=url_with_query, sasl_oauth_client_id=USER,
                             sasl_oauth_client_secret=SECRET)  # type: ignore[arg-type]
    shown = dict(settings.insecure_choices())["kafka_token_endpoint_without_tls"]
    assert shown == {"token_url": "http://idp.example/token?…", "client_id": USER}
    assert "s3cr3t" not in repr(ClientCredentialsTokens(settings))
