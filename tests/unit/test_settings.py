"""Settings come from COUNTERSINK_* variables, validate what reaches CQL, and never print secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from countersink.cli import settings_problems
from countersink.settings import CassandraSettings, Consistency, Settings


def test_nested_sections_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Double-underscore variables fill nested sections; comma lists become lists."""
    monkeypatch.setenv("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", "k1:9092, k2:9092")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__CONTACT_POINTS", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY", "LOCAL_QUORUM")
    settings = Settings()
    assert settings.kafka.bootstrap_servers == ["k1:9092", "k2:9092"]
    assert settings.cassandra.contact_points == ["10.0.0.1", "10.0.0.2"]
    assert settings.cassandra.write_consistency is Consistency.LOCAL_QUORUM


def test_defaults_point_at_loopback() -> None:
    """With no environment, every setting has a working default for a local stack."""
    settings = Settings()
    assert settings.kafka.bootstrap_servers == ["127.0.0.1:9092"]
    assert settings.cassandra.port == 9042
    assert settings.cassandra.gc_read_consistency is Consistency.ALL


@pytest.mark.parametrize("keyspace", ["Bad", "1abc", "a;DROP KEYSPACE x", "a" * 49, "select", "table"])
def test_keyspace_must_be_a_plain_identifier(monkeypatch: pytest.MonkeyPatch, keyspace: str) -> None:
    """A keyspace name that is not [a-z][a-z0-9_]{0,47} is refused before it reaches CQL text (an empty variable
    is unset: the default keyspace; an empty name given otherwise is refused)."""
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__KEYSPACE", keyspace)
    with pytest.raises(ValidationError, match="keyspace"):
        Settings()
    with pytest.raises(ValidationError, match="keyspace"):
        CassandraSettings(keyspace="")


def test_replication_must_be_a_plain_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replication option carrying anything but a plain CQL map literal is refused."""
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__REPLICATION", "{'class': 'SimpleStrategy'}; DROP TABLE x")
    with pytest.raises(ValidationError, match="replication"):
        Settings()


@pytest.mark.parametrize("replication", ["{'class': 'SimpleStrategy', 'replication_factor': 0}",
                                         "{'class': 'NetworkTopologyStrategy', 'dc1': '0', 'dc2': 0}"])
def test_a_replication_that_places_no_replica_is_refused(monkeypatch: pytest.MonkeyPatch, replication: str) -> None:
    """Cassandra creates a keyspace whose factors are all 0, then answers every request "No hosts available"."""
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__REPLICATION", replication)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problems(refused.value) == [
        "COUNTERSINK_CASSANDRA__REPLICATION: the replication places no replica: give replication_factor (or a data "
        "center's factor) of at least 1"]
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__REPLICATION", "{'class': 'NetworkTopologyStrategy', 'dc1': 0, 'dc2': 3}")
    assert Settings().cassandra.replication.endswith("'dc2': 3}")


def test_secrets_never_appear_in_repr_or_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passwords are SecretStr: repr, str and a JSON dump hide them."""
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__USERNAME", "app")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__PASSWORD", "hunter2-cass")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__SSL_ENABLED", "true")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_USERNAME", "app")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_PASSWORD", "hunter2-kafka")
    settings = Settings()
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "hunter2" not in text
    assert settings.cassandra.password is not None
    assert settings.cassandra.password.get_secret_value() == "hunter2-cass"


def test_sasl_without_credentials_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Choosing a SASL protocol without mechanism, user and password is a start-up error."""
    monkeypatch.setenv("COUNTERSINK_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    with pytest.raises(ValidationError, match="SASL needs"):
        Settings()


@pytest.mark.parametrize("url", ["http://reg:hunter2-reg@127.0.0.1:8081", "https://hunter2-reg@registry/apis?x=1",
                                 "https://reg:hunter2-reg@registry", "https://reg:hunter2/reg@registry/apis"])
def test_a_registry_url_with_credentials_is_refused_without_them(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The registry's URL is logged and shown by serve's /readyz: a user name or password in it is refused,
    and the refusal does not repeat them. Any @ is refused, past the host too: a password holding "/" ends
    the host there (https://reg:hunter2/reg@registry). A query has no place in the registry's base URL
    either (countersink adds paths to it)."""
    monkeypatch.setenv("COUNTERSINK_SCHEMA_REGISTRY__URL", url)
    with pytest.raises(ValidationError, match="holds a user name or password") as refused:
        Settings()
    lines = settings_problems(refused.value)
    assert lines == ["COUNTERSINK_SCHEMA_REGISTRY__URL: the url holds a user name or password (user:password@host), "
                     "which would be logged with it: give them as COUNTERSINK_SCHEMA_REGISTRY__USERNAME and __PASSWORD"]
    monkeypatch.setenv("COUNTERSINK_SCHEMA_REGISTRY__URL", "https://registry/apis?by=x")
    with pytest.raises(ValidationError, match="without a query or fragment"):
        Settings()
    monkeypatch.setenv("COUNTERSINK_SCHEMA_REGISTRY__URL", "https://registry:8081/apis/ccompat/v7")
    assert Settings().schema_registry.url == "https://registry:8081/apis/ccompat/v7"


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("COUNTERSINK_GC__GRACE_S", "inf", "finite number"),
    ("COUNTERSINK_CONSUMER__MUTATOR_MAX_AGE_S", "inf", "finite number"),
    ("COUNTERSINK_CASSANDRA__REQUEST_TIMEOUT_S", "1e300", "less than or equal to 3600"),
    ("COUNTERSINK_CONSUMER__SESSION_TIMEOUT_MS", "99999999999999999999", "less than or equal to 3600000"),
    ("COUNTERSINK_GC__EVERY_S", "1e-9", "at least 1 s (0 runs once)"),
    ("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", " , ", "at least 1 item"),
    ("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", "a:9092,127.0.0.1:99999", "server 2 of 2 is not HOST:PORT"),
    ("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", ":9092", "server 1 of 1 is not HOST:PORT"),
    ("COUNTERSINK_CASSANDRA__CONTACT_POINTS", " ,", "at least 1 item"),
    # Listening addresses and the client id: refused at start, not by the socket or the encoder later in
    # words that name no variable.
    ("COUNTERSINK_SERVE__HOST", "not a host!", "not a host name or an address to listen on"),
    ("COUNTERSINK_CONSUMER__HEALTH_HOST", " ", "not a host name or an address to listen on"),
    ("COUNTERSINK_GC__HEALTH_HOST", "a b", "not a host name or an address to listen on"),
    ("COUNTERSINK_KAFKA__CLIENT_ID", "c" * 40_000, "at most 255 characters"),
    ("NO_COLOR", "x" * 1001, "at most 1000 characters"),  # no prefix: the variable is NO_COLOR
    # Credentials written into an address: refused, and never echoed (an error naming the server quoted them).
    ("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", "user:hunter2@kafka-1:9092", "no user or password"),
    ("COUNTERSINK_CASSANDRA__CONTACT_POINTS", "c1,user:hunter2@c2", "contact point 2 of 2 is not a host name"),
    # A port, which the driver would have joined to COUNTERSINK_CASSANDRA__PORT's (127.0.0.1:9042:9042).
    ("COUNTERSINK_CASSANDRA__CONTACT_POINTS", "127.0.0.1:9042", "the port is COUNTERSINK_CASSANDRA__PORT"),
])
def test_numbers_past_any_use_and_empty_server_lists_are_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str, reason: str) -> None:
    """What would fail later (an OverflowError, a struct error, an IndexError, a GC loop without pause) is a
    refusal naming the variable at start."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    (line,) = settings_problems(refused.value)
    assert line.startswith(f"{variable}: ")
    assert reason in line
    assert "hunter2" not in line


@pytest.mark.parametrize("variable", ["COUNTERSINK_CASSANDRA__SSL_TRUSTED_CERT", "COUNTERSINK_SCHEMA_REGISTRY__URL",
                                      "COUNTERSINK_CASSANDRA__USERNAME", "COUNTERSINK_CONSUMER__FLUSH_INTERVAL_S",
                                      "COUNTERSINK_CASSANDRA__CONTACT_POINTS", "COUNTERSINK_SERVE__TLS_CERT"])
def test_a_variable_set_empty_is_unset(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """A manifest template leaves a value it does not fill empty: that is the default, for every setting (a
    trusted certificate or a registry URL set empty was refused, a user name taken as unset); not serve's token
    variables (below)."""
    section, _, name = variable.removeprefix("COUNTERSINK_").lower().partition("__")
    unset = getattr(getattr(Settings(), section), name)
    monkeypatch.setenv(variable, "")
    assert getattr(getattr(Settings(), section), name) == unset


def test_listening_addresses_and_modes_in_any_case_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every address a process listens on (IPv4, IPv6, a name) is taken; modes are read in any case."""
    monkeypatch.setenv("COUNTERSINK_SERVE__HOST", "::")
    monkeypatch.setenv("COUNTERSINK_CONSUMER__HEALTH_HOST", "0.0.0.0")  # noqa: S104 - the setting under test
    monkeypatch.setenv("COUNTERSINK_GC__HEALTH_HOST", "gc-0.countersink.svc")
    monkeypatch.setenv("COUNTERSINK_CASSANDRA__SSL_VERIFY_IDENTITY", "IP")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_MECHANISM", "scram-sha-512")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_USERNAME", "u")
    monkeypatch.setenv("COUNTERSINK_KAFKA__SASL_PASSWORD", "p4ssword-of-the-test")
    settings = Settings()
    assert (settings.serve.host, settings.consumer.health_host, settings.gc.health_host) == (
        "::", "0.0.0.0", "gc-0.countersink.svc")  # noqa: S104
    assert (settings.cassandra.ssl_verify_identity, settings.kafka.sasl_mechanism) == ("ip", "SCRAM-SHA-512")


def test_a_kafka_server_without_a_port_is_kafkas_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS", "kafka-1,kafka-2:19092")
    assert Settings().kafka.bootstrap_servers == ["kafka-1", "kafka-2:19092"]


def test_an_options_help_names_the_variable_its_environment_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """An option's help gives the setting's default, and where the environment sets the variable says so instead
    of showing a default that is not the one in force (nor the value set)."""
    from countersink.cli import setting_default

    monkeypatch.delenv("COUNTERSINK_CONSUMER__GROUP_ID", raising=False)
    assert setting_default("consumer.group_id") == "(default: countersink, from COUNTERSINK_CONSUMER__GROUP_ID)"
    monkeypatch.setenv("COUNTERSINK_CONSUMER__GROUP_ID", "payments")
    shown = setting_default("consumer.group_id")
    assert shown == "(default: COUNTERSINK_CONSUMER__GROUP_ID, set in this environment; countersink where it is not)"
    assert "payments" not in shown


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("name", ["COUNTERSINK_SERVE__TOKENS", "COUNTERSINK_SERVE__TOKENS_FILE",
                                  "COUNTERSINK_SERVE__ADMIN_TOKENS", "COUNTERSINK_SERVE__ADMIN_TOKENS_FILE"])
def test_an_empty_token_variable_is_refused_not_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str,
                                                      value: str) -> None:
    """An empty variable is unset, but a token variable left empty (a secret that did not arrive) opened serve to
    anyone: it is refused, in the environment or in .env, naming the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=f"{name.removeprefix('COUNTERSINK_')}\n  is set but empty"):
        Settings()
    monkeypatch.delenv(name)
    monkeypatch.setenv(name.lower(), value)  # read in any case
    with pytest.raises(ValidationError, match="is set but empty"):
        Settings()
    monkeypatch.delenv(name.lower())
    (tmp_path / ".env").write_text(f"{name}={value}\n")
    (tmp_path / ".env").chmod(0o600)
    with pytest.raises(ValidationError, match="is set but empty"):
        Settings()
    (tmp_path / ".env").write_text(f"{name}\n")  # a bare name: no value at all
    with pytest.raises(ValidationError, match="is set but empty"):
        Settings()
