"""A private key that needs a pass phrase is refused with a line saying so, never asked for: OpenSSL's own
prompt waits on a terminal for ever (a service stalls at start) or lands in the log."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from countersink.kafka import KafkaSecurityError, ssl_context
from countersink.serve import TokenError, server_tls
from countersink.settings import KafkaSettings, ServeSettings
from stack.secure import make_certificates

REFUSAL = "the private key is encrypted, and countersink reads only an unencrypted key"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The stack's server certificate, its key unencrypted, and the same key under a pass phrase."""
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), password=None)
    encrypted = certs.server_key.with_name("server-encrypted.key")
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"pass phrase")))
    return certs.server_cert, certs.server_key, encrypted


def test_serve_refuses_an_encrypted_key_and_takes_a_plain_one(keys: tuple[Path, Path, Path]) -> None:
    cert, plain, encrypted = keys
    assert server_tls(ServeSettings(tls_cert=cert, tls_key=plain)) is not None
    with pytest.raises(TokenError, match=f"COUNTERSINK_SERVE__TLS_CERT/__TLS_KEY: cannot use .*: {REFUSAL}"):
        server_tls(ServeSettings(tls_cert=cert, tls_key=encrypted))


def test_kafka_refuses_an_encrypted_client_key_and_takes_a_plain_one(keys: tuple[Path, Path, Path]) -> None:
    cert, plain, encrypted = keys
    assert ssl_context(KafkaSettings(security_protocol="SSL", ssl_certfile=cert, ssl_keyfile=plain)) is not None
    with pytest.raises(KafkaSecurityError, match=f"__SSL_KEYFILE: cannot use .*: {REFUSAL}"):
        ssl_context(KafkaSettings(security_protocol="SSL", ssl_certfile=cert, ssl_keyfile=encrypted))
