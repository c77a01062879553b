"""COUNTERSINK_CASSANDRA__SSL_VERIFY_IDENTITY: a certificate from the trusted authority for another host is
refused when the identity is checked, and only then.

The peer is a bare TLS endpoint on 127.0.0.1 presenting a certificate for ``elsewhere.invalid``: the check
happens in the driver's handshake, before any CQL, so no Cassandra is needed to show it (the integration
tests show the check passing against a real node whose certificate names it)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersink.cassandra import CassandraClient, CassandraError, CassandraUnavailableError
from countersink.settings import CassandraSettings
from stack.secure import Certificates, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def elsewhere(certs: Certificates) -> Iterator[int]:
    """A TLS endpoint on 127.0.0.1 whose certificate, from the trusted authority, names another host."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certs.elsewhere_cert), str(certs.elsewhere_key))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            try:
                with context.wrap_socket(connection, server_side=True) as tls:
                    tls.settimeout(1)
                    tls.recv(16)
            except OSError:
                pass

    server = threading.Thread(target=accept, daemon=True)
    server.start()
    yield int(listener.getsockname()[1])
    stop.set()
    server.join()
    listener.close()


def _settings(certs: Certificates, port: int, identity: str) -> CassandraSettings:
    return CassandraSettings(contact_points=["127.0.0.1"], port=port, ssl_enabled=True,
                             ssl_trusted_cert=certs.ca_cert, ssl_verify_identity=identity, connect_timeout_s=2)


async def test_a_certificate_for_another_host_is_refused_when_the_identity_is_checked(
        certs: Certificates, elsewhere: int) -> None:
    """With ssl_verify_identity=ip, the handshake fails and says the certificate does not match the host."""
    refusal = r"TLS with Cassandra at 127\.0\.0\.1:\d+ failed: .*does not match"
    with pytest.raises(CassandraError, match=refusal) as refused:
        await CassandraClient(_settings(certs, elsewhere, "ip")).start()
    assert not isinstance(refused.value, CassandraUnavailableError)  # not retried


async def test_without_the_identity_check_the_same_certificate_passes_the_handshake(
        certs: Certificates, elsewhere: int) -> None:
    """With ssl_verify_identity=none the chain alone is checked: the handshake passes and only the missing
    Cassandra behind it stops the connection (a retriable 'cannot connect')."""
    with pytest.raises(CassandraUnavailableError, match="cannot connect to Cassandra"):
        await CassandraClient(_settings(certs, elsewhere, "none")).start()


def test_the_identity_setting_takes_only_known_values(tmp_path: Path) -> None:
    """ip, dns and none are accepted; anything else is refused when the settings are read."""
    for value in ("ip", "dns", "none"):
        assert CassandraSettings(ssl_verify_identity=value).ssl_verify_identity == value
    with pytest.raises(ValueError, match="ssl_verify_identity"):
        CassandraSettings(ssl_verify_identity="yes")
