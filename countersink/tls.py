"""What the TLS contexts built from settings share."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import NoReturn


class EncryptedKeyError(ssl.SSLError):
    """A private key that needs a pass phrase: countersink reads only unencrypted keys."""

    def __init__(self) -> None:
        super().__init__(0, "the private key is encrypted, and countersink reads only an unencrypted key: write it "
                         "decrypted (openssl pkey -in KEY -out PLAIN_KEY) to a file only this user can read")

    def __str__(self) -> str:
        return str(self.strerror)


def _refuse_encrypted_key() -> NoReturn:
    # OpenSSL asks for a pass phrase only for an encrypted key; without this callback it prompts on the
    # terminal (a service waits there for ever) or prints the prompt into the log.
    raise EncryptedKeyError


def load_key_pair(context: ssl.SSLContext, cert: Path | str, key: Path | str | None) -> None:
    """``context.load_cert_chain`` that never asks for a pass phrase: an encrypted key raises
    :class:`EncryptedKeyError` (an ``ssl.SSLError``) saying so."""
    context.load_cert_chain(str(cert), str(key) if key is not None else None, password=_refuse_encrypted_key)
