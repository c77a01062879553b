"""The secured stack's own start, watched from outside as a local attacker would: every command line of the
machine read while it starts (no secret may be in one), and a loop logging in to Cassandra as the default
superuser from the moment the node starts (it must never get in). Its own stack, on ports 23xxx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import ssl
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersink.cassandra import CassandraClient
from stack.secure import ADMIN_ROLE, SecureStack
from stack.servers import STACK_DIR, StackError

pytestmark = pytest.mark.integration

CQL_PORT = 23142
JMX_PORT = 23199


# ------------------------------------------------------------------------------------------ the watchers


class CommandLines(threading.Thread):
    """Reads /proc/*/cmdline of every process on the machine every few milliseconds, keeping each one seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[bytes] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        self.seen.add((entry / "cmdline").read_bytes())
            time.sleep(0.005)

    def holding(self, text: str) -> list[str]:
        """The command lines seen that hold ``text`` (arguments joined by spaces)."""
        lines = (line.replace(b"\0", b" ").decode(errors="replace") for line in self.seen)
        return [line for line in lines if text in line]


def _frame(opcode: int, body: bytes) -> bytes:
    return struct.pack(">BBhBi", 0x04, 0, 0, opcode, len(body)) + body


def _read_frame(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    header = b""
    while len(header) < 9:
        chunk = sock.recv(9 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    _, _, _, opcode, length = struct.unpack(">BBhBi", header)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return opcode, body


def _short_string(text: str) -> bytes:
    return struct.pack(">H", len(text)) + text.encode()


def default_superuser_login(host: str, port: int) -> str:
    """One try, in CQL's own protocol, as ``cassandra``/``cassandra`` over TLS without a client certificate
    (and trusting any server certificate, as an attacker would): ``no-listener``, ``tls-refused``,
    ``login-refused``, or ``logged-in`` (after which it creates a superuser role of its own, as the attack
    did)."""
    try:
        raw = socket.create_connection((host, port), timeout=2)
    except OSError:
        return "no-listener"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(raw) as sock:
            sock.sendall(_frame(0x01, struct.pack(">H", 1) + _short_string("CQL_VERSION") + _short_string("3.0.0")))
            opcode, _ = _read_frame(sock)
            if opcode == 0x03:  # AUTHENTICATE: answer with PLAIN credentials
                token = b"\0cassandra\0cassandra"
                sock.sendall(_frame(0x0F, struct.pack(">i", len(token)) + token))
                opcode, _ = _read_frame(sock)
                if opcode != 0x10:  # AUTH_SUCCESS
                    return "login-refused"
            elif opcode != 0x02:  # READY: no authentication at all
                return "login-refused"
            query = f"CREATE ROLE intruder_{uuid.uuid4().hex[:8]} WITH PASSWORD = 'x' AND SUPERUSER = true " \
                    "AND LOGIN = true"
            sock.sendall(_frame(0x07, struct.pack(">i", len(query)) + query.encode() + struct.pack(">HB", 1, 0)))
            _read_frame(sock)
            return "logged-in"
    except (OSError, ssl.SSLError, ConnectionError):
        return "tls-refused"


class DefaultSuperuser(threading.Thread):
    """Tries :func:`default_superuser_login` again and again until stopped, noting when each outcome came."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.outcomes: list[tuple[float, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            outcome = default_superuser_login("127.0.0.1", self.port)
            self.outcomes.append((time.monotonic(), outcome))
            if outcome == "no-listener":
                time.sleep(0.01)

    def count(self, outcome: str, before: float = float("inf")) -> int:
        return sum(1 for at, seen in self.outcomes if seen == outcome and at < before)


@dataclasses.dataclass
class WatchedStack(SecureStack):
    """A secured stack that notes when its role setup ended."""

    setup_ended: float = 0.0

    def setup_roles(self) -> None:
        super().setup_roles()
        self.setup_ended = time.monotonic()


@dataclasses.dataclass
class Watched:
    stack: WatchedStack
    command_lines: CommandLines
    attacker: DefaultSuperuser
    start_error: BaseException | None


@pytest.fixture(scope="module")
def watched() -> Iterator[Watched]:
    """A secured stack started while its command lines are read and the default superuser is tried; both
    watchers keep going until the module ends (the tests below start nodetool too)."""
    stack = WatchedStack(root=STACK_DIR / "test" / "secure-start", kafka_port=23192, kafka_ssl_port=23193,
                         kafka_controller_port=23194, kafka_elsewhere_port=23195, cassandra_port=CQL_PORT,
                         cassandra_storage_port=23100, cassandra_jmx_port=JMX_PORT)
    command_lines, attacker = CommandLines(), DefaultSuperuser(CQL_PORT)
    command_lines.start()
    attacker.start()
    error: BaseException | None = None
    try:
        try:
            stack.start(tied_to_parent=True)
        except StackError as exc:
            error = exc
        time.sleep(1)
        yield Watched(stack, command_lines, attacker, error)
    finally:
        attacker.done.set()
        command_lines.done.set()
        attacker.join(10)
        command_lines.join(10)
        stack.stop()


def test_the_default_superuser_never_gets_in_while_the_stack_starts(watched: Watched) -> None:
    """From before the node starts until after the stack is up, logins as cassandra/cassandra without the
    stack's client certificate reach the node and are all refused; the start succeeds."""
    assert watched.start_error is None, watched.start_error
    attacker = watched.attacker
    assert attacker.count("logged-in") == 0, attacker.outcomes[-5:]
    # The loop was at the door while the default superuser still existed: the node answered it before the
    # stack's roles were made, and refused it in TLS.
    assert attacker.count("tls-refused", before=watched.stack.setup_ended) >= 5, attacker.outcomes[-5:]
    assert attacker.count("no-listener") >= 1


async def test_no_role_but_the_stacks_exists_and_another_one_fails_the_check(watched: Watched) -> None:
    """After the start, Cassandra holds the stack's roles only; a role added since makes the check fail
    with its name."""
    assert watched.start_error is None, watched.start_error
    stack = watched.stack
    async with CassandraClient(stack.cassandra_settings(ADMIN_ROLE), use_keyspace=False) as admin:
        rows = await admin.execute("SELECT role FROM system_auth.roles", prepared=False, consistency="ONE")
        assert sorted(row.as_dict()["role"] for row in rows) == sorted([ADMIN_ROLE, *stack.cassandra_roles])
        stack.verify_roles()
        await admin.execute("CREATE ROLE sneaked_in WITH PASSWORD = 'sneaked-in' AND LOGIN = true",
                            prepared=False, consistency="ONE")
        try:
            with pytest.raises(StackError, match="roles the stack did not make: sneaked_in"):
                stack.verify_roles()
        finally:
            await admin.execute("DROP ROLE sneaked_in", prepared=False, consistency="ONE")
        # One of the stack's own roles made a superuser: the check names it.
        await admin.execute("ALTER ROLE countersink_reader WITH SUPERUSER = true", prepared=False, consistency="ONE")
        try:
            with pytest.raises(StackError, match="superusers the stack did not make: countersink_reader"):
                stack.verify_roles()
        finally:
            await admin.execute("ALTER ROLE countersink_reader WITH SUPERUSER = false", prepared=False,
                                consistency="ONE")
        # One of the stack's roles granted the administrator's role (a superuser by inheritance): named too.
        await admin.execute(f"GRANT {ADMIN_ROLE} TO countersink_reader", prepared=False, consistency="ONE")
        try:
            granted = rf"grants the stack did not make: countersink_reader \(of {ADMIN_ROLE}\)"
            with pytest.raises(StackError, match=granted):
                stack.verify_roles()
        finally:
            await admin.execute(f"REVOKE {ADMIN_ROLE} FROM countersink_reader", prepared=False, consistency="ONE")
        stack.verify_roles()


def _nodetool(watched: Watched, *args: str) -> subprocess.CompletedProcess[str]:
    assert watched.stack.cassandra is not None
    return watched.stack.cassandra.nodetool(*args, "status")


def test_nodetool_needs_the_jmx_password(watched: Watched) -> None:
    """nodetool without credentials, or with a wrong password, is refused; with the user and the 0600
    password file (-pwf, nothing secret in its argv) it answers."""
    assert watched.start_error is None, watched.start_error
    description = json.loads(watched.stack.description_file.read_text())["cassandra"]["jmx"]
    anonymous = _nodetool(watched)
    assert anonymous.returncode != 0
    assert "credentials" in (anonymous.stdout + anonymous.stderr).lower(), anonymous.stdout + anonymous.stderr
    wrong = watched.stack.root / "wrong-jmx-password"
    wrong.write_text(f"{description['user']} not-the-password\n")
    wrong.chmod(0o600)
    refused = _nodetool(watched, "-u", description["user"], "-pwf", str(wrong))
    assert refused.returncode != 0
    assert "UN  127.0.0.1" not in refused.stdout
    password_file = Path(description["password_file"])
    assert password_file.stat().st_mode & 0o777 == 0o600
    allowed = _nodetool(watched, "-u", description["user"], "-pwf", str(password_file))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "UN  127.0.0.1" in allowed.stdout


def test_no_command_line_holds_a_secret(watched: Watched) -> None:
    """No command line read while the stack started and ran (its servers, the storage tool, the ACL tool,
    the probes and setup helpers, nodetool, and any other process of the machine) holds one of its
    passwords; the watcher did see the short-lived ones."""
    assert watched.start_error is None, watched.start_error
    stack = watched.stack
    lines = watched.command_lines
    # The watcher saw the short-lived tools, so it would have seen a password in theirs.
    # (The storage tool is named in its argument file, so its command line shows that file's name.)
    for tool in ("format.args|kafka.tools.StorageTool", "AclCommand", "stack.secure setup-cassandra",
                 "stack.secure probe-kafka", "kafka.Kafka", "CassandraDaemon", "NodeTool"):
        assert any(lines.holding(name) for name in tool.split("|")), f"never saw {tool}"
    secrets = [*stack.kafka_users.values(), *stack.cassandra_roles.values(), stack.admin_password,
               stack.jmx_password]
    for secret in secrets:
        assert lines.holding(secret) == [], f"a command line holds {secret[:4]}..."
