"""The PEM files a TLS connection to Cassandra reads: an encrypted private key is refused before the driver sees
it, saying it is encrypted (the driver, given no pass phrase, says only that the key is invalid)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from countersink.cassandra import CassandraClient, CassandraError, _read_pem
from countersink.settings import CassandraSettings

_ENCRYPTIONS = {
    "pkcs8": serialization.PrivateFormat.PKCS8,  # -----BEGIN ENCRYPTED PRIVATE KEY-----
    "openssl": serialization.PrivateFormat.TraditionalOpenSSL,  # Proc-Type: 4,ENCRYPTED
}


@pytest.mark.parametrize("layout", sorted(_ENCRYPTIONS))
def test_an_encrypted_private_key_is_refused_saying_so(tmp_path: Path, layout: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "client.key"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, _ENCRYPTIONS[layout],
                                           serialization.BestAvailableEncryption(b"a pass phrase")))
    cert_file = tmp_path / "client.pem"
    cert_file.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    settings = CassandraSettings(ssl_enabled=True, ssl_cert=cert_file, ssl_private_key=key_file)
    with pytest.raises(CassandraError) as refused:
        CassandraClient(settings)._cluster()
    assert str(refused.value).startswith(f"COUNTERSINK_CASSANDRA__SSL_PRIVATE_KEY: {key_file} is encrypted, and "
                                         "countersink reads only an unencrypted key")
    assert refused.value.retriable is False


def test_an_unencrypted_private_key_is_read_as_it_is(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    text = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
    key_file = tmp_path / "client.key"
    key_file.write_text(text)
    assert _read_pem(key_file, "ssl_private_key") == text
