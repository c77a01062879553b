"""A secured local stack: TLS everywhere, SCRAM users in Kafka, password roles in Cassandra.

Everything secret is made at start and written to files readable by the owner only (mode 0600):

- ``certs/``: a certificate authority, a server certificate for ``127.0.0.1`` and ``localhost`` (used by
  both servers), a client certificate, and a second authority that signed nothing the servers use (to show
  that a client trusting the wrong authority is refused). Made with ``cryptography``.
- Kafka: a ``SASL_SSL`` listener (SCRAM-SHA-512; users written by the broker's own storage tool when it
  formats its storage, its arguments passed in a 0600 argument file, never on a command line), an ``SSL``
  listener that requires a client certificate, and a second ``SASL_SSL`` listener on ``127.0.0.2``, an
  address the server certificate does not name (host-name checks must refuse it). The controller listener is
  TLS with client certificates too. The standard authorizer is on: the broker's certificate and the
  ``loader`` user are super users, ``countersink`` gets only :func:`kafka_acls`.
- Cassandra: ``client_encryption_options`` (TLS only, client certificates required: until the stack has
  replaced the default ``cassandra`` superuser, nobody without the stack's client key can try it),
  ``PasswordAuthenticator`` and ``CassandraAuthorizer``; at start one role per countersink process is created
  (see :data:`ROLES`), an administrator role takes over, the default superuser is dropped, and any other
  role found fails the start; the schema role makes the ``countersink`` keyspace and the others are granted
  what they need on it. JMX (nodetool) asks for a user and password (a 0600 password file).
- ``stack.json``: ports, paths, users and passwords, for tests and for ``countersink.env``.

``python -m stack up --secure`` starts it for people; the test session starts its own (tests/conftest.py).
The helpers ``python -m stack.secure COMMAND STACK_JSON`` (probe-kafka, probe-cassandra, setup-cassandra,
verify-roles) run in short-lived child processes, like :mod:`stack.probe`, and read their secrets from that
file: no secret is ever in a process's argv, where any local user can read it (``/proc/PID/cmdline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import ipaddress
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from stack.servers import (
    LOG4J2_VERSION,
    REPO,
    STACK_DIR,
    CassandraNode,
    KafkaServer,
    StackError,
    check_java,
    kafka_answers,
    request_stop_all,
    resolve_jars,
    stop_together,
)

# Cassandra roles, one per countersink process, and the permissions each one needs: (permission, table),
# a table of None meaning the whole keyspace. The schema role creates keyspaces (and owns what it creates);
# the others get their grants once the keyspace and its tables exist. MODIFY (which in Cassandra includes
# TRUNCATE, and cannot be split from it) only on the tables the process writes.
CONSUMER_WRITES = ("shards", "partitions", "mutators", "mutator_work", "counters", "reset_positions", "handovers",
                   "topic_ids")
GC_WRITES = ("shards", "mutators", "mutator_work", "gc_runs")
RESET_WRITES = ("resets", "reset_positions")
ROLES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "countersink_schema": (),
    "countersink_consumer": (("SELECT", None), *(("MODIFY", table) for table in CONSUMER_WRITES)),
    "countersink_gc": (("SELECT", None), *(("MODIFY", table) for table in GC_WRITES)),
    "countersink_reader": (("SELECT", None),),
    # serve's second login, for POST /counters/{name}/reset only (COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME)
    "countersink_serve_admin": (("SELECT", None), *(("MODIFY", table) for table in RESET_WRITES)),
}
KAFKA_USERS = ("countersink", "loader")
ADMIN_ROLE = "stack_admin"
# Kafka principals: the broker's certificate (brokers and controller talk to each other with it) and the
# loading tool are super users; countersink's user and client certificate get only the ACLs below.
BROKER_PRINCIPAL = "User:CN=localhost,O=countersink local stack"
CLIENT_CERT_PRINCIPAL = "User:CN=countersink,O=countersink local stack"
DEAD_LETTER_TOPIC = "countersink-dead-letter"
# Consumer groups countersink's principals may join and commit offsets for: those whose id starts with this.
GROUP_PREFIX = "countersink"
JMX_USER = "stack_jmx"


def kafka_acls(principals: list[str], dead_letter_topic: str = DEAD_LETTER_TOPIC,
               group_prefix: str = GROUP_PREFIX) -> list[list[str]]:
    """kafka-acls (AclCommand) arguments giving countersink what it uses: read and describe the topics and their
    configuration (the cleanup policy of a topic read by a counter with ``event_id`` is checked at start), read
    and describe the consumer groups whose id starts with ``group_prefix`` (another group's offsets are not
    its to move), and create, describe and write its dead-letter topic. Nothing else: no writes to event
    topics."""
    allow = [arg for principal in principals for arg in ("--allow-principal", principal)]
    return [
        ["--add", *allow, "--operation", "Read", "--operation", "Describe", "--operation", "DescribeConfigs",
         "--topic", "*"],
        ["--add", *allow, "--operation", "Read", "--operation", "Describe", "--group", group_prefix,
         "--resource-pattern-type", "prefixed"],
        ["--add", *allow, "--operation", "Create", "--operation", "Describe", "--operation", "Write",
         "--topic", dead_letter_topic],
    ]


def _write_secret(path: Path, data: bytes) -> None:
    """Write a file only its owner can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


# -------------------------------------------------------------------------------------------- certificates


@dataclasses.dataclass(frozen=True)
class Certificates:
    """PEM files of the secured stack (keys unencrypted, mode 0600)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path  # an authority that signed nothing the servers present
    elsewhere_cert: Path  # signed by the stack's authority for a host that is not ours (host-name checks)
    elsewhere_key: Path

    @property
    def server_keystore(self) -> Path:
        """Key and certificate chain in one PEM file: the form Kafka's and Cassandra's PEM keystores take."""
        return self.server_key.with_name("server-keystore.pem")


def make_certificates(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                      days: int = 30) -> Certificates:
    """A CA, a server certificate for ``hosts`` (server and client use: brokers talk to each other with it),
    a client certificate, and an unrelated CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "countersink local stack"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def authority(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(name(common))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False),
                               critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return key, cert

    def leaf(common: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
             usages: list[x509.ObjectIdentifier], names: list[x509.GeneralName]
             ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(common)).issuer_name(ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    ca_key, ca_cert = authority("countersink local CA")
    server_key, server_cert = leaf(hosts[0], ca_key, ca_cert,
                                   [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], alt_names)
    client_key, client_cert = leaf("countersink", ca_key, ca_cert, [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    _, other_ca_cert = authority("some other CA")
    elsewhere_names: list[x509.GeneralName] = [x509.DNSName("elsewhere.invalid"),
                                               x509.IPAddress(ipaddress.ip_address("192.0.2.1"))]
    elsewhere_key, elsewhere_cert = leaf("elsewhere.invalid", ca_key, ca_cert, [ExtendedKeyUsageOID.SERVER_AUTH],
                                         elsewhere_names)

    certs = Certificates(
        ca_cert=directory / "ca.pem", server_cert=directory / "server.pem", server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem", client_key=directory / "client-key.pem",
        other_ca_cert=directory / "other-ca.pem", elsewhere_cert=directory / "elsewhere.pem",
        elsewhere_key=directory / "elsewhere-key.pem",
    )
    _write_secret(certs.ca_cert, pem(ca_cert))
    _write_secret(certs.server_cert, pem(server_cert) + pem(ca_cert))
    _write_secret(certs.server_key, key_pem(server_key))
    _write_secret(certs.server_keystore, key_pem(server_key) + pem(server_cert) + pem(ca_cert))
    _write_secret(certs.client_cert, pem(client_cert))
    _write_secret(certs.client_key, key_pem(client_key))
    _write_secret(certs.other_ca_cert, pem(other_ca_cert))
    _write_secret(certs.elsewhere_cert, pem(elsewhere_cert) + pem(ca_cert))
    _write_secret(certs.elsewhere_key, key_pem(elsewhere_key))
    return certs


# ----------------------------------------------------------------------------------------------- Kafka


@dataclasses.dataclass
class SecureKafkaServer(KafkaServer):
    """A single-node KRaft broker whose every listener is TLS: SASL_SSL (SCRAM-SHA-512) on ``port``, SSL with
    required client certificates on ``ssl_port``, SASL_SSL on ``elsewhere_host:elsewhere_port`` (an address
    the certificate does not name), and the controller on ``controller_port`` (TLS with client certificates)."""

    ssl_port: int = 22193
    elsewhere_host: str = "127.0.0.2"
    elsewhere_port: int = 22195
    heap: str = "384m"
    certs: Certificates | None = None
    users: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ssl_bootstrap(self) -> str:
        return f"{self.host}:{self.ssl_port}"

    @property
    def elsewhere_bootstrap(self) -> str:
        return f"{self.elsewhere_host}:{self.elsewhere_port}"

    def _properties(self, data: Path) -> dict[str, str]:
        assert self.certs is not None
        props = super()._properties(data)
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        props.update({
            "listeners": f"SASL_SSL://{self.host}:{self.port},SSL://{self.host}:{self.ssl_port},"
                         f"ELSEWHERE://{self.elsewhere_host}:{self.elsewhere_port},"
                         f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"SASL_SSL://{self.host}:{self.port},SSL://{self.host}:{self.ssl_port},"
                                    f"ELSEWHERE://{self.elsewhere_host}:{self.elsewhere_port}",
            "listener.security.protocol.map": "CONTROLLER:SSL,SSL:SSL,SASL_SSL:SASL_SSL,ELSEWHERE:SASL_SSL",
            "inter.broker.listener.name": "SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.elsewhere.scram-sha-512.sasl.jaas.config": scram,
            # PEM stores: no keystore conversion, no keystore passwords.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certs.server_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certs.ca_cert),
            "ssl.client.auth": "required",
            "listener.name.sasl_ssl.ssl.client.auth": "none",
            "listener.name.elsewhere.ssl.client.auth": "none",
            # Authorization on: what a principal may do is what its ACLs say (kafka_acls), nothing more.
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"{BROKER_PRINCIPAL};User:loader",
        })
        return props

    def grant_acls(self, timeout: float = 120.0) -> None:
        """countersink's ACLs, written with the broker's own tool over the SSL listener as the broker."""
        assert self.certs is not None
        java = check_java()
        lib = resolve_jars("kafka-tools", self.version, [f"-Dlog4j2.version={LOG4J2_VERSION}"])
        client = self.root / "admin-client.properties"
        client.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={self.certs.ca_cert}\n"
                          f"ssl.keystore.type=PEM\nssl.keystore.location={self.certs.server_keystore}\n")
        tool = [java, f"-Dlog4j2.configurationFile={self.root}/log4j2.properties", "-cp", f"{lib}/*",
                "org.apache.kafka.tools.AclCommand", "--bootstrap-server", self.ssl_bootstrap,
                "--command-config", str(client)]
        commands = [[*tool, *args] for args in kafka_acls(["User:countersink", CLIENT_CERT_PRINCIPAL])]
        running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for command in commands]
        try:
            for process in running:
                try:
                    output, _ = process.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise StackError(f"kafka-acls did not finish within {timeout:.0f}s") from None
                if process.returncode != 0:
                    raise StackError(f"kafka-acls failed: {output.decode(errors='replace')[-800:]}")
        finally:
            # On a failure, a timeout or an interrupt, the tools still running would retry a broker about to be
            # stopped for minutes, orphaned.
            for process in running:
                if process.poll() is None:
                    process.kill()
                    process.wait()

    def _format_options(self) -> list[str]:
        # The storage tool writes the SCRAM credentials into the first metadata snapshot: the users exist
        # from the broker's first second, with no unauthenticated window to create them in. The options
        # reach the tool in an argument file (KafkaServer.start), not on its command line.
        return [option for user, password in self.users.items()
                for option in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")]

    def answers(self) -> bool:
        return _helper_succeeds("probe-kafka", self.root.parent / "stack.json", timeout=20.0)


# ------------------------------------------------------------------------------------------- Cassandra


@dataclasses.dataclass
class SecureCassandraNode(CassandraNode):
    """A Cassandra node that accepts only TLS clients holding a certificate of the stack's authority, and a
    password; JMX (nodetool) asks for the user and password in ``jmx_password_file``.

    Client certificates are required from the node's first second: Cassandra creates the well-known default
    superuser ``cassandra``/``cassandra`` at start, and until the stack has replaced it only a holder of the
    stack's client key (mode 0600) can even open a CQL session to try it. The storage port is TLS with client
    certificates too: without it, any local process could start a node of its own, join the cluster through
    that port (no password is asked there), read every role's hash and make itself a superuser."""

    heap: str = "768M"
    authenticator: str = "PasswordAuthenticator"
    certs: Certificates | None = None

    def _write_config(self) -> Path:
        assert self.certs is not None
        path = super()._write_config()
        # The same TLS for clients and for other nodes: the stack's certificate, its authority's alone trusted.
        tls = f"""\
  ssl_context_factory:
    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory
  keystore: {self.certs.server_keystore}
  truststore: {self.certs.ca_cert}
  require_client_auth: true
  accepted_protocols: [TLSv1.2, TLSv1.3]
"""
        with path.open("a") as yaml:
            yaml.write("client_encryption_options:\n  enabled: true\n  optional: false\n" + tls)
            yaml.write("server_encryption_options:\n  internode_encryption: all\n  legacy_ssl_storage_port_enabled: "
                       "false\n  require_endpoint_verification: true\n" + tls)
        return path

    def answers(self, peers: int | None = None) -> bool:
        return _helper_succeeds("probe-cassandra", self.root.parent / "stack.json", timeout=20.0)


# ----------------------------------------------------------------------------------------------- stack


@dataclasses.dataclass
class SecureStack:
    """One secured Kafka and one secured Cassandra, their certificates, users and roles under ``root``."""

    root: Path = STACK_DIR / "secure"
    kafka_port: int = 22192
    kafka_ssl_port: int = 22193
    kafka_controller_port: int = 22194
    kafka_elsewhere_port: int = 22195
    cassandra_port: int = 22142
    cassandra_storage_port: int = 22100
    cassandra_jmx_port: int = 22299
    kafka: SecureKafkaServer | None = None
    cassandra: SecureCassandraNode | None = None
    certs: Certificates | None = None
    kafka_users: dict[str, str] = dataclasses.field(default_factory=dict)
    cassandra_roles: dict[str, str] = dataclasses.field(default_factory=dict)
    admin_password: str = ""
    jmx_password: str = ""

    @property
    def description_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def jmx_password_file(self) -> Path:
        return self.root / "jmxremote.password"

    def prepare(self) -> None:
        """Certificates, passwords, and the two servers' configuration objects (nothing started yet)."""
        with contextlib.suppress(FileNotFoundError):
            for child in sorted(self.root.rglob("*"), reverse=True):
                child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self.certs = make_certificates(self.root / "certs")
        self.kafka_users = {user: secrets.token_urlsafe(18) for user in KAFKA_USERS}
        self.cassandra_roles = {role: secrets.token_urlsafe(18) for role in ROLES}
        self.admin_password = secrets.token_urlsafe(18)
        self.jmx_password = secrets.token_urlsafe(18)
        # The JVM reads it only if its owner alone may read it; nodetool takes the same file (-pwf).
        _write_secret(self.jmx_password_file, f"{JMX_USER} {self.jmx_password}\n".encode())
        self.kafka = SecureKafkaServer(
            port=self.kafka_port, ssl_port=self.kafka_ssl_port, controller_port=self.kafka_controller_port,
            elsewhere_port=self.kafka_elsewhere_port, root=self.root / "kafka", certs=self.certs,
            users=dict(self.kafka_users),
        )
        self.cassandra = SecureCassandraNode(
            native_port=self.cassandra_port, storage_port=self.cassandra_storage_port,
            jmx_port=self.cassandra_jmx_port, seeds=f"127.0.0.1:{self.cassandra_storage_port}",
            cluster_name="countersink-secure", root=self.root / "cassandra", certs=self.certs,
            jmx_password_file=self.jmx_password_file,
        )
        _write_secret(self.description_file, json.dumps(self.describe(), indent=2).encode())

    @classmethod
    def attach(cls, description_file: Path) -> SecureStack:
        """The secured stack that wrote ``description_file`` and runs (``python -m stack up --secure``):
        tests can run against it instead of starting their own. Stopping it stays with whoever started it."""
        described = json.loads(description_file.read_text())
        certs = Certificates(**{name: Path(path) for name, path in described["certs"].items()})
        kafka_host, _, kafka_port = described["kafka"]["sasl_ssl"].rpartition(":")
        elsewhere_host, _, elsewhere_port = described["kafka"]["elsewhere"].rpartition(":")
        stack = cls(root=description_file.parent, certs=certs, kafka_users=described["kafka"]["users"],
                    cassandra_roles=described["cassandra"]["roles"],
                    admin_password=described["cassandra"]["admin"]["password"],
                    jmx_password=described["cassandra"]["jmx"]["password"])
        stack.kafka = SecureKafkaServer(host=kafka_host, port=int(kafka_port),
                                        ssl_port=int(described["kafka"]["ssl"].rpartition(":")[2]),
                                        elsewhere_host=elsewhere_host, elsewhere_port=int(elsewhere_port),
                                        certs=certs, root=description_file.parent / "kafka")
        stack.cassandra = SecureCassandraNode(address=described["cassandra"]["host"],
                                              native_port=described["cassandra"]["port"], certs=certs,
                                              jmx_port=described["cassandra"]["jmx"]["port"],
                                              jmx_password_file=Path(described["cassandra"]["jmx"]["password_file"]),
                                              root=description_file.parent / "cassandra")
        return stack

    def describe(self) -> dict[str, Any]:
        assert self.certs is not None
        assert self.kafka is not None
        assert self.cassandra is not None
        return {
            "kafka": {"sasl_ssl": self.kafka.bootstrap, "ssl": self.kafka.ssl_bootstrap,
                      "elsewhere": self.kafka.elsewhere_bootstrap, "users": self.kafka_users},
            "cassandra": {"host": self.cassandra.address, "port": self.cassandra.native_port,
                          "roles": self.cassandra_roles,
                          "admin": {"name": ADMIN_ROLE, "password": self.admin_password},
                          "jmx": {"port": self.cassandra.jmx_port, "user": JMX_USER, "password": self.jmx_password,
                                  "password_file": str(self.jmx_password_file)}},
            "certs": {field.name: str(getattr(self.certs, field.name)) for field in dataclasses.fields(self.certs)},
        }

    def start(self, *, tied_to_parent: bool = False) -> None:
        """Start both (together), wait for both, then create the Cassandra roles."""
        self.spawn(tied_to_parent=tied_to_parent)
        self.finish_start()

    def spawn(self, *, tied_to_parent: bool = False) -> None:
        """Prepare and start both, without waiting for them: :meth:`finish_start` does the rest. Until it has,
        Cassandra's default superuser exists, and only a holder of the stack's client key can try it."""
        self.prepare()
        assert self.kafka is not None
        assert self.cassandra is not None
        try:
            self.kafka.start(tied_to_parent=tied_to_parent, wait=False)
            self.cassandra.start(tied_to_parent=tied_to_parent, wait=False)
        except BaseException:
            self.stop()
            raise

    def finish_start(self) -> None:
        """Wait for both servers :meth:`spawn` started, then grant Kafka's ACLs and create the Cassandra roles."""
        assert self.kafka is not None
        assert self.cassandra is not None
        try:
            self.kafka.wait_ready()
            self.kafka.grant_acls()
            self.cassandra.wait_ready()
            self.setup_roles()
        except BaseException:
            self.stop()
            raise

    def setup_roles(self) -> None:
        """As the default superuser: an administrator role and one role per process; then the default
        superuser is dropped, and the roles that exist are checked to be exactly these (anything else fails
        the start). In a child process that is killed if the driver never answers."""
        _run_helper("setup-cassandra", self.description_file, timeout=120.0)

    def verify_roles(self) -> None:
        """Raise :class:`StackError` when Cassandra holds a role the stack did not make."""
        _run_helper("verify-roles", self.description_file, timeout=60.0)

    def request_stop(self) -> None:
        """SIGTERM to both servers, without waiting: :meth:`stop` then waits."""
        request_stop_all((self.kafka, self.cassandra))

    def stop(self) -> None:
        stop_together((self.kafka, self.cassandra))

    def kafka_settings(self, user: str = "loader", **changes: Any) -> Any:
        """:class:`~countersink.settings.KafkaSettings` for ``user`` on the SASL_SSL listener."""
        return _kafka_settings(self.describe(), user).model_copy(update={"request_timeout_ms": 30_000, **changes})

    def cassandra_settings(self, role: str, keyspace: str = "countersink", **changes: Any) -> Any:
        """:class:`~countersink.settings.CassandraSettings` for ``role`` (or :data:`ADMIN_ROLE`) over TLS."""
        password = self.admin_password if role == ADMIN_ROLE else self.cassandra_roles[role]
        return _cassandra_settings(self.describe(), role, password).model_copy(update={
            "keyspace": keyspace, "connect_timeout_s": 5.0, "request_timeout_s": 12.0, **changes})

    async def grant(self, keyspace: str) -> None:
        """As the administrator: each process role's permissions on ``keyspace`` (see :data:`ROLES`)."""
        from countersink.cassandra import CassandraClient

        async with CassandraClient(self.cassandra_settings(ADMIN_ROLE), use_keyspace=False) as client:
            for statement in keyspace_grants(keyspace):
                await client.execute(statement, prepared=False, consistency="ONE")

    def write_env_file(self, path: Path) -> None:
        """``countersink.env``: the settings of a countersink process as the consumer's role and user."""
        local = {"COUNTERSINK_CONSUMER__HEALTH_HOST": "127.0.0.1", "COUNTERSINK_GC__HEALTH_HOST": "127.0.0.1"}
        settings = {**self.env("countersink_consumer"), **local}
        _write_secret(path, "".join(f"{k}={v}\n" for k, v in settings.items()).encode())

    def env(self, role: str, kafka_user: str = "countersink") -> dict[str, str]:
        """COUNTERSINK_* variables for a process that connects as ``role`` (Cassandra) and ``kafka_user``."""
        assert self.certs is not None
        assert self.kafka is not None
        assert self.cassandra is not None
        password = self.admin_password if role == ADMIN_ROLE else self.cassandra_roles[role]
        return {
            "COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": self.kafka.bootstrap,
            "COUNTERSINK_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "COUNTERSINK_KAFKA__SSL_CAFILE": str(self.certs.ca_cert),
            "COUNTERSINK_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
            "COUNTERSINK_KAFKA__SASL_USERNAME": kafka_user,
            "COUNTERSINK_KAFKA__SASL_PASSWORD": self.kafka_users[kafka_user],
            "COUNTERSINK_CASSANDRA__CONTACT_POINTS": self.cassandra.address,
            "COUNTERSINK_CASSANDRA__PORT": str(self.cassandra.native_port),
            "COUNTERSINK_CASSANDRA__USERNAME": role,
            "COUNTERSINK_CASSANDRA__PASSWORD": password,
            "COUNTERSINK_CASSANDRA__SSL_ENABLED": "true",
            "COUNTERSINK_CASSANDRA__SSL_TRUSTED_CERT": str(self.certs.ca_cert),
            "COUNTERSINK_CASSANDRA__SSL_CERT": str(self.certs.client_cert),
            "COUNTERSINK_CASSANDRA__SSL_PRIVATE_KEY": str(self.certs.client_key),
        }


def _helper_succeeds(command: str, description: Path, timeout: float) -> bool:
    """A probe in its own process (as :func:`stack.servers._probe`): it cannot block the caller."""
    try:
        return subprocess.run([sys.executable, "-m", "stack.secure", command, str(description)], cwd=REPO,
                              capture_output=True, timeout=timeout, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _run_helper(command: str, description: Path, timeout: float) -> None:
    """``python -m stack.secure COMMAND STACK_JSON`` in a child process; a failure raises with its output."""
    try:
        done = subprocess.run([sys.executable, "-m", "stack.secure", command, str(description)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise StackError(f"{command} did not finish within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise StackError(f"{command} failed: {(done.stdout + done.stderr).strip()[-800:]}")


# ---------------------------------------------------------------------- helpers run in child processes


def _kafka_settings(stack: dict[str, Any], user: str) -> Any:
    from countersink.settings import KafkaSettings

    return KafkaSettings(bootstrap_servers=[stack["kafka"]["sasl_ssl"]], security_protocol="SASL_SSL",
                         ssl_cafile=stack["certs"]["ca_cert"], sasl_mechanism="SCRAM-SHA-512",
                         sasl_username=user, sasl_password=stack["kafka"]["users"][user], request_timeout_ms=3000)


def _cassandra_settings(stack: dict[str, Any], user: str, password: str) -> Any:
    from countersink.settings import CassandraSettings

    return CassandraSettings(contact_points=[stack["cassandra"]["host"]], port=stack["cassandra"]["port"],
                             username=user, password=password, ssl_enabled=True,
                             ssl_trusted_cert=stack["certs"]["ca_cert"], ssl_cert=stack["certs"]["client_cert"],
                             ssl_private_key=stack["certs"]["client_key"], connect_timeout_s=3, request_timeout_s=5)


async def _kafka_answers(stack: dict[str, Any]) -> bool:
    from countersink.kafka import make_admin

    settings = _kafka_settings(stack, KAFKA_USERS[0])
    return await kafka_answers(",".join(settings.bootstrap_servers), make_admin(settings))


async def _cassandra_answers(stack: dict[str, Any]) -> bool:
    """The default superuser (before roles are set up) or the administrator (after) can log in over TLS."""
    from countersink.cassandra import CassandraClient

    for user, password in ((ADMIN_ROLE, stack["cassandra"]["admin"]["password"]), ("cassandra", "cassandra")):
        client = CassandraClient(_cassandra_settings(stack, user, password), use_keyspace=False)
        try:
            await asyncio.wait_for(client.start(), 8)
            await client.execute("SELECT release_version FROM system.local", prepared=False, consistency="ONE")
            return True
        except Exception:  # noqa: S112 - any failure means "not (yet) this way"; the caller probes again
            continue
        finally:
            with contextlib.suppress(Exception):
                await client.stop()
    return False


async def _setup_cassandra(stack: dict[str, Any]) -> None:
    from countersink.cassandra import CassandraClient

    admin = stack["cassandra"]["admin"]
    async with CassandraClient(_cassandra_settings(stack, "cassandra", "cassandra"), use_keyspace=False) as client:
        # Role statements cannot take bound parameters; the passwords are URL-safe base64, quoted as literals.
        await client.execute(f"CREATE ROLE IF NOT EXISTS {admin['name']} WITH PASSWORD = '{admin['password']}' "
                             "AND SUPERUSER = true AND LOGIN = true", prepared=False, consistency="ONE")
    async with CassandraClient(_cassandra_settings(stack, admin["name"], admin["password"]),
                               use_keyspace=False) as client:
        for role, password in stack["cassandra"]["roles"].items():
            await client.execute(f"CREATE ROLE IF NOT EXISTS {role} WITH PASSWORD = '{password}' AND LOGIN = true",
                                 prepared=False, consistency="ONE")
        for statement in schema_role_grants("countersink_schema"):
            await client.execute(statement, prepared=False, consistency="ONE")
        # The well-known default superuser would let anyone in; the administrator role replaces it.
        await client.execute("DROP ROLE IF EXISTS cassandra", prepared=False, consistency="ONE")
    # The default keyspace, made by the schema role and granted to the others, as docs/security.md says.
    schema = _cassandra_settings(stack, "countersink_schema", stack["cassandra"]["roles"]["countersink_schema"])
    async with CassandraClient(schema, use_keyspace=False) as client:
        await client.ensure_schema()
    async with CassandraClient(_cassandra_settings(stack, admin["name"], admin["password"]),
                               use_keyspace=False) as client:
        for statement in keyspace_grants(schema.keyspace):
            await client.execute(statement, prepared=False, consistency="ONE")
    await _verify_roles(stack)


async def _verify_roles(stack: dict[str, Any]) -> None:
    """Raise :class:`StackError` when Cassandra holds a role the stack did not make (or still the default
    superuser), a superuser other than the administrator, or a role granted to another (which then holds its
    rights, a superuser's too): someone got in while it was set up, or since."""
    from countersink.cassandra import CassandraClient, as_dicts

    admin = stack["cassandra"]["admin"]
    async with CassandraClient(_cassandra_settings(stack, admin["name"], admin["password"]),
                               use_keyspace=False) as client:
        rows = as_dicts(await client.execute("SELECT role, is_superuser, member_of FROM system_auth.roles",
                                             prepared=False, consistency="ONE"))
    unexpected = unexpected_roles({row["role"] for row in rows}, {admin["name"], *stack["cassandra"]["roles"]})
    if unexpected:
        raise StackError(f"Cassandra holds roles the stack did not make: {', '.join(unexpected)}; someone logged "
                         "in while it was set up or since: do not use this stack")
    # A role of the stack's made first by someone else keeps their password (CREATE ROLE IF NOT EXISTS), and the
    # stack's own logins as it then fail; one made a superuser is seen here.
    raised = sorted(row["role"] for row in rows if row["is_superuser"] and row["role"] != admin["name"])
    if raised:
        raise StackError(f"Cassandra holds superusers the stack did not make: {', '.join(raised)}; someone gave "
                         "a role of the stack that right: do not use this stack")
    # The stack grants no role to another; a role granted one (the administrator's, say) holds its rights.
    members = sorted(f"{row['role']} (of {', '.join(sorted(row['member_of']))})" for row in rows if row["member_of"])
    if members:
        raise StackError(f"Cassandra holds role grants the stack did not make: {'; '.join(members)}; someone granted "
                         "a role of the stack another's rights: do not use this stack")


def unexpected_roles(found: set[str], made: set[str]) -> list[str]:
    """The roles of ``found`` that are not among ``made`` (the default superuser included, once dropped)."""
    return sorted(found - made)


def schema_role_grants(role: str) -> list[str]:
    """What the schema role needs before any keyspace exists: to create keyspaces (it then owns them)."""
    return [f"GRANT CREATE ON ALL KEYSPACES TO {role}"]


def keyspace_grants(keyspace: str, roles: dict[str, tuple[tuple[str, str | None], ...]] | None = None) -> list[str]:
    """GRANT statements giving each process role its permissions on ``keyspace`` and its tables (which must
    exist: run them after ``countersink schema``)."""
    from schemas.cql import check_identifier

    ks = check_identifier(keyspace)
    return [f"GRANT {permission} ON KEYSPACE {ks} TO {role}" if table is None else
            f"GRANT {permission} ON TABLE {ks}.{check_identifier(table)} TO {role}"
            for role, permissions in (roles or ROLES).items() for permission, table in permissions]


def main(argv: list[str]) -> int:
    commands = ("probe-kafka", "probe-cassandra", "setup-cassandra", "verify-roles")
    if len(argv) != 2 or argv[0] not in commands:
        print(f"usage: python -m stack.secure {'|'.join(commands)} STACK_JSON", file=sys.stderr)
        return 2
    import logging

    from countersink.logs import quiet_driver_noise

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused connections are the normal "no"
    quiet_driver_noise()
    stack = json.loads(Path(argv[1]).read_text())
    if argv[0] == "probe-kafka":
        return 0 if asyncio.run(_kafka_answers(stack)) else 1
    if argv[0] == "probe-cassandra":
        return 0 if asyncio.run(_cassandra_answers(stack)) else 1
    try:
        asyncio.run(_setup_cassandra(stack) if argv[0] == "setup-cassandra" else _verify_roles(stack))
    except StackError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
