"""``python -m stack.tls_offer``: what the Cassandra driver (acsylla, with the OpenSSL it bundles) offers in a
TLS handshake, and which protocol version it accepts from a server that speaks no newer one.

A local TLS server, capped in turn at TLS 1.3, 1.2, 1.1 and 1.0 and accepting every suite, takes one
connection from the driver and reports the version and suite agreed and the suites both sides have in
common (the driver's offer, as far as this Python's OpenSSL knows the suites). No Cassandra is involved:
this measures the client alone. docs/security.md quotes its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from stack.secure import make_certificates


def _one_handshake(context: ssl.SSLContext, listener: socket.socket, results: list[str]) -> None:
    listener.settimeout(10)
    try:
        connection, _ = listener.accept()
    except OSError as exc:
        results.append(f"no connection ({exc})")
        return
    try:
        with context.wrap_socket(connection, server_side=True) as tls:
            cipher = tls.cipher()
            offered = [suite for suite, _, _ in tls.shared_ciphers() or []]
            results.append(f"{tls.version()} {cipher[0] if cipher else '?'}")
            results.append("offered: " + " ".join(offered))
    except (OSError, ssl.SSLError) as exc:
        results.append(f"refused: {exc}")


async def _driver_connects(port: int, ca_pem: str) -> None:
    import acsylla

    cluster = acsylla.create_cluster(["127.0.0.1"], port=port, connect_timeout=3, ssl_enabled=True,
                                     ssl_trusted_cert=ca_pem, log_level="disabled",
                                     ssl_verify_flags=acsylla.SSLVerifyFlags.PEER_CERT)
    with contextlib.suppress(Exception):  # the server is not Cassandra: only the handshake matters
        await asyncio.wait_for(cluster.create_session(), 8)


def measure(cap: ssl.TLSVersion, certs_dir: Path) -> list[str]:
    certs = make_certificates(certs_dir)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0 and 1.1 are what is being measured
        context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        context.maximum_version = cap
    context.set_ciphers("ALL:@SECLEVEL=0")
    results: list[str] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        server = threading.Thread(target=_one_handshake, args=(context, listener, results))
        server.start()
        asyncio.run(_driver_connects(listener.getsockname()[1], certs.ca_cert.read_text()))
        server.join()
    return results


def main() -> int:
    print(f"this Python's OpenSSL: {ssl.OPENSSL_VERSION}")
    with tempfile.TemporaryDirectory() as scratch:
        for cap in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1):
            lines = measure(cap, Path(scratch))
            print(f"server capped at {cap.name}: {lines[0]}")
            if cap is ssl.TLSVersion.TLSv1_3 and len(lines) > 1:
                print(f"  {lines[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
