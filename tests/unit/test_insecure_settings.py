"""Credentials never leave without TLS unless a setting says so, and every protection given up is a WARNING at
start: SASL over plain text, a Cassandra password without TLS, an unchecked certificate or host name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from countersink.cli import warn_insecure
from countersink.settings import CassandraSettings, KafkaSettings, Settings
from tests.servers_down import CASSANDRA_DOWN

REPO = Path(__file__).resolve().parents[2]
SASL = {"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "app", "sasl_password": "pw-of-app"}


def test_sasl_over_plain_text_is_refused_without_allow_insecure() -> None:
    """SASL_PLAINTEXT with complete credentials is a settings error naming the way out, PLAIN or SCRAM alike."""
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        with pytest.raises(ValidationError, match="SASL_PLAINTEXT sends the SASL credentials without TLS"):
            KafkaSettings(security_protocol="SASL_PLAINTEXT", **{**SASL, "sasl_mechanism": mechanism})


def test_sasl_over_plain_text_with_allow_insecure_is_a_warning() -> None:
    """Allowed explicitly, SASL_PLAINTEXT starts and says what it gives up (user, never the password)."""
    settings = KafkaSettings(security_protocol="SASL_PLAINTEXT", allow_insecure=True, **SASL)
    assert settings.insecure_choices() == [("kafka_credentials_without_tls",
                                            {"user": "app", "mechanism": "SCRAM-SHA-512"})]


def test_a_cassandra_password_without_tls_is_refused_without_allow_insecure() -> None:
    """A user name and password with ssl_enabled false is a settings error; with TLS it is accepted quietly."""
    credentials = {"username": "app", "password": "pw"}
    with pytest.raises(ValidationError, match="without TLS cross the network in the clear"):
        CassandraSettings(**credentials)  # type: ignore[arg-type]
    assert CassandraSettings(ssl_enabled=True, **credentials).insecure_choices() == []  # type: ignore[arg-type]


@pytest.mark.parametrize(("settings", "refusal"), [
    ({"username": "app", "ssl_enabled": True}, "username is set without password: a login needs both"),
    ({"password": "pw", "ssl_enabled": True}, "password is set without username: a login needs both"),
    ({"ssl_trusted_cert": "ca.pem"}, "ssl_trusted_cert is set but ssl_enabled is false"),
    ({"ssl_cert": "c.pem", "ssl_private_key": "k.pem"}, "ssl_cert, ssl_private_key are set but ssl_enabled"),
    ({"ssl_enabled": True, "ssl_cert": "c.pem"}, "ssl_cert and ssl_private_key (the client certificate and"),
])
def test_cassandra_settings_nothing_would_use_are_refused(settings: dict[str, object], refusal: str) -> None:
    """Half a login, or TLS files while TLS is off (the driver then connects in the clear without a word):
    refused, saying what to set."""
    with pytest.raises(ValidationError, match=re.escape(refusal)):
        CassandraSettings(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(("settings", "refusal"), [
    ({"ssl_cafile": "ca.pem"}, "ssl_cafile is set but security_protocol is PLAINTEXT, which does not use it"),
    ({"security_protocol": "SASL_SSL", **SASL, "ssl_keyfile": "k.pem"}, "ssl_keyfile is set without ssl_certfile"),
    ({"sasl_username": "app", "sasl_password": "pw"}, "sasl_username, sasl_password are set but security_protocol "
                                                      "is PLAINTEXT"),
    ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "sasl_mechanism is set but security_protocol is SSL"),
])
def test_kafka_settings_the_protocol_would_not_use_are_refused(settings: dict[str, object], refusal: str) -> None:
    """TLS files with PLAINTEXT or SASL settings without SASL were left unused, silently: refused."""
    with pytest.raises(ValidationError, match=re.escape(refusal)):
        KafkaSettings(**settings)  # type: ignore[arg-type]


def test_a_cassandra_password_without_tls_with_allow_insecure_is_a_warning() -> None:
    """Allowed explicitly, the credentials without TLS start and are named in a warning (the user only)."""
    settings = CassandraSettings(allow_insecure=True, **{"username": "app", "password": "pw"})  # type: ignore[arg-type]
    assert settings.insecure_choices() == [("cassandra_credentials_without_tls", {"user": "app"})]


def test_unchecked_certificates_and_host_names_are_warnings() -> None:
    """ssl_verify=false (Cassandra) and ssl_check_hostname=false (Kafka over TLS) each give a warning; the
    defaults and plain connections without credentials give none."""
    assert Settings().insecure_choices() == []
    unverified = CassandraSettings(ssl_enabled=True, ssl_verify=False, contact_points=["c1"])
    assert unverified.insecure_choices() == [("cassandra_certificate_not_verified", {"contact_points": ["c1"]})]
    unchecked = KafkaSettings(security_protocol="SASL_SSL", ssl_check_hostname=False, bootstrap_servers=["k1:1"],
                              **SASL)
    assert unchecked.insecure_choices() == [("kafka_host_name_not_checked", {"bootstrap_servers": ["k1:1"]})]
    # Without TLS there is no host name to check: nothing to warn about beyond the plain connection itself.
    assert KafkaSettings(ssl_check_hostname=False).insecure_choices() == []


def test_each_insecure_choice_is_logged_as_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """warn_insecure logs one WARNING per protection given up, with no secret in it."""
    monkeypatch.setenv("COUNTERSINK_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("COUNTERSINK_KAFKA__ALLOW_INSECURE", "true")
    for name, value in SASL.items():
        monkeypatch.setenv(f"COUNTERSINK_KAFKA__{name.upper()}", value)
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__USERNAME", "app")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__PASSWORD", "pw-of-cassandra")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__ALLOW_INSECURE", "true")
    with capture_logs() as logs:
        warn_insecure(Settings())
    assert [(entry["event"], entry["log_level"]) for entry in logs] == [
        ("kafka_credentials_without_tls", "warning"), ("cassandra_credentials_without_tls", "warning")]
    assert "pw-of" not in repr(logs)


def _countersink(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSINK_")}
    return subprocess.run([sys.executable, "-m", "countersink.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**clean, "COUNTERSINK_LOG_FORMAT": "json", **env})


def test_a_command_refuses_to_start_or_warns_at_start() -> None:
    """``countersink get`` with a Cassandra password and no TLS exits 2 before connecting, naming the setting;
    with allow_insecure it logs the warning first and goes on (to a Cassandra where nothing listens)."""
    env = {"COUNTERSINK_CASSANDRA__USERNAME": "app", "COUNTERSINK_CASSANDRA__PASSWORD": "pw-of-cassandra",
           **CASSANDRA_DOWN}
    refused = _countersink("get", "shares", "IBM", env=env)
    assert refused.returncode == 2, refused.stderr
    (line,) = [json.loads(text) for text in refused.stderr.splitlines() if text.strip()]
    assert line["event"] == "settings_refused"
    assert "COUNTERSINK_CASSANDRA__ALLOW_INSECURE" in line["error"]
    allowed = _countersink("get", "shares", "IBM", env={**env, "COUNTERSINK_CASSANDRA__ALLOW_INSECURE": "true"})
    lines = [json.loads(text) for text in allowed.stderr.splitlines() if text.strip()]
    assert [(entry["event"], entry["level"]) for entry in lines][:1] == [("cassandra_credentials_without_tls",
                                                                           "warning")]
    assert allowed.returncode == 1  # nothing listens there
    assert "pw-of-cassandra" not in allowed.stderr + refused.stderr


def test_a_file_of_secrets_other_users_may_read_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .env holding a secret, a key or a tokens file that group or others may read is a WARNING naming the
    setting, the file, its mode and the fix (never the secret); 0600 files and a .env without secrets are not."""
    env_file, tokens, key = tmp_path / ".env", tmp_path / "tokens", tmp_path / "serve-key.pem"
    env_file.write_text("COUNTERSINK_CASSANDRA__USERNAME=app\nCOUNTERSINK_CASSANDRA__PASSWORD=pw-of-cassandra\n")
    tokens.write_text("a-token-of-sixteen-chars-or-more\n")
    key.write_text("not parsed here\n")
    for path, mode in ((env_file, 0o640), (tokens, 0o604), (key, 0o600)):
        path.chmod(mode)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__ALLOW_INSECURE", "true")
    monkeypatch.setenv("COUNTERSINK_SERVE__TOKENS_FILE", str(tokens))
    monkeypatch.setenv("COUNTERSINK_SERVE__TLS_KEY", str(key))
    monkeypatch.setenv("COUNTERSINK_SERVE__TLS_CERT", str(key))
    readable = [fields for event, fields in Settings().insecure_choices() if event == "secret_file_readable_by_others"]
    assert readable == [
        {"setting": ".env", "path": ".env", "mode": "640", "fix": "chmod go-r .env"},
        {"setting": "COUNTERSINK_SERVE__TOKENS_FILE", "path": str(tokens), "mode": "604",
         "fix": f"chmod go-r {tokens}"}]
    assert "pw-of" not in repr(readable)
    env_file.write_text("COUNTERSINK_LOG_LEVEL=INFO\n")  # no secret in it: its mode is its own business
    tokens.chmod(0o600)
    assert [event for event, _ in Settings().insecure_choices() if event == "secret_file_readable_by_others"] == []
