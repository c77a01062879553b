"""Real Apache Kafka (KRaft) and Apache Cassandra 5.0 as plain JVM processes, assembled from Maven artifacts.

Used by ``python -m stack`` (``make services-up`` / ``make services-down``) and by the test session. Jars
are resolved once per version into ``~/.cache/countersink/<server>-<version>/lib`` and reused without
network afterwards. Every server gets a fresh data directory per start; readiness is a real client call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

KAFKA_VERSION = "4.3.1"
CASSANDRA_VERSION = "5.0.9"
# Apicurio Registry 2.4.2 is the newest release whose artifacts Maven Central serves in full (see
# stack/maven/schema-registry/pom.xml); it speaks the Confluent-compatible API under /apis/ccompat/v7.
SCHEMA_REGISTRY_VERSION = "2.4.2.Final"
# Kafka 4.x moved the broker to log4j2 but ships no SLF4J 1.x binding for it.
LOG4J2_VERSION = "2.25.4"

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE_DIR = Path(os.environ.get("COUNTERSINK_CACHE_DIR", Path.home() / ".cache" / "countersink"))
STACK_DIR = Path(os.environ.get("COUNTERSINK_STACK_DIR", REPO / ".stack"))


class StackError(RuntimeError):
    """A server could not be assembled, started or reached; the message says what to do."""


# --------------------------------------------------------------------------------------------- helpers


def say(message: str) -> None:
    """Progress for people: straight to the process's stderr, past any test-runner capture."""
    print(f"[stack] {message}", file=sys.__stderr__, flush=True)


def check_java() -> str:
    """Return the path of a Java 17 runtime, or raise with a one-line reason."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise StackError("Java 17 is required but `java` was not found (install openjdk-17-jre-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or match.group(1) != "17":
        found = match.group(1) if match else "unknown"
        raise StackError(f"Java 17 is required (Cassandra 5.0 runs on 11 or 17 only); {java} is Java {found}")
    return java


# Linux's default net.ipv4.ip_local_port_range: where the kernel picks clients' own local ports.
LINUX_EPHEMERAL_RANGE = range(32768, 61000)


def ephemeral_ports() -> range:
    """This machine's range of local ports given to clients (Linux's default when it cannot be read)."""
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return range(low, high + 1)


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise a one-line error when something already listens on host:port; warn of a port any client may be
    given as its own (the server may then find it taken, or this very check connect to itself)."""
    clients = ephemeral_ports()
    if port in clients:
        say(f"warning: port {port} for {what} is in this machine's range of client ports "
            f"({clients.start}-{clients.stop - 1}): a client may hold it when the server starts; pick one below "
            f"{clients.start}")
    if listens(host, port):
        raise StackError(f"port {host}:{port} for {what} is already taken; stop what uses it or pick another port")


def listens(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


# Where free_port looks: below Linux's ephemeral range, above every port the stack, the tests and the benchmarks
# fix.
FREE_PORTS = range(30000, LINUX_EPHEMERAL_RANGE.start)
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing holds now, for a server to be started next, never the same twice in one process. Below
    the ephemeral range, so no client is given it as its own local port: a readiness probe sent before the
    server listens cannot connect to itself, and no outgoing connection takes it meanwhile (a port from
    ``bind(0)`` is in that range)."""
    start = secrets.randbelow(len(FREE_PORTS))
    for i in range(len(FREE_PORTS)):
        port = FREE_PORTS[(start + i) % len(FREE_PORTS)]
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise StackError(f"no free port on {host} in {FREE_PORTS.start}-{FREE_PORTS.stop - 1}")


def resolve_jars(server: str, version: str, extra: Sequence[str] = ()) -> Path:
    """Resolve a server's runtime jars into the cache (once per version) and return the lib folder."""
    target = CACHE_DIR / f"{server}-{version}"
    lib = target / "lib"
    done = target / ".complete"
    if done.exists():
        return lib
    mvn = shutil.which("mvn")
    if not mvn:
        raise StackError(f"Maven is required once to fetch {server} {version} jars but `mvn` was not found")
    say(f"resolving {server} {version} from Maven Central into {lib} (first time only)")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    cmd = [
        mvn, "-B", "-q", "-f", str(HERE / "maven" / server / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={lib}",
        f"-D{server}.version={version}", *extra,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join([line for line in proc.stdout.splitlines() if "ERROR" in line][:5])
        raise StackError(f"Maven could not resolve {server} {version}:\n{tail}")
    done.write_text(json.dumps({"version": version, "seconds": round(time.monotonic() - started, 1)}))
    say(f"resolved {server} {version} in {time.monotonic() - started:.0f}s")
    return lib


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the thread that started us ends (Linux prctl).

    The signal follows the *thread*, not the process: start tied servers from a thread that outlives them.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read or write (mode 0600 from its creation on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_argument_file(path: Path, arguments: Sequence[str]) -> None:
    """A java launcher argument file (``java @FILE``): the main class and its arguments, one quoted per line,
    mode 0600. What it holds never appears in the process's command line."""
    quoted = ['"' + argument.replace("\\", "\\\\").replace('"', '\\"') + '"' for argument in arguments]
    write_private(path, ("\n".join(quoted) + "\n").encode())


@dataclasses.dataclass
class JvmProcess:
    """One server JVM: its command, its folders, and the running process once started."""

    name: str
    command: list[str]
    home: Path
    log_file: Path
    pid: int | None = None
    _popen: subprocess.Popen[bytes] | None = None

    def start(self, *, tied_to_parent: bool) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self._popen = subprocess.Popen(
                self.command,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if tied_to_parent else None,
            )
        self.pid = self._popen.pid

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``. Safe to call twice."""
        if self.pid is None:
            return
        _terminate(self.pid, timeout)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)
        self.pid = None

    def request_stop(self) -> None:
        """SIGTERM without waiting: :meth:`stop` then waits (see :func:`stop_together`)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL at once (a crash), for failure tests."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            if self._popen is not None:
                self._popen.wait(timeout=30)
            self.pid = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text()
        return status.split(") ", 1)[1][:1] != "Z"
    return True


def _terminate(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not _pid_alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class _Stoppable(Protocol):
    process: JvmProcess | None

    def stop(self) -> None: ...


def request_stop_all(servers: Iterable[_Stoppable | None]) -> None:
    """SIGTERM to each server's process, without waiting: its ``stop()`` then waits."""
    for server in servers:
        if server is not None and server.process is not None:
            server.process.request_stop()


def stop_together(servers: Iterable[_Stoppable | None]) -> None:
    """Stop servers side by side: every one is sent SIGTERM before any is waited for (a Cassandra node takes
    about 5 s to drain here; one after another, a test session's eight servers took 30 s to stop)."""
    present = [server for server in servers if server is not None]
    request_stop_all(present)
    for server in present:
        server.stop()


def _wait_ready(proc: JvmProcess, probe: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``probe`` until it answers True; fail early if the JVM exits. Returns seconds waited."""
    started = time.monotonic()
    while True:
        if not proc.alive():
            raise StackError(f"{what} exited during start-up; last log lines:\n{proc.log_tail()}")
        if probe():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise StackError(f"{what} not ready after {timeout:.0f}s; last log lines:\n{proc.log_tail()}")
        time.sleep(0.5)


# ----------------------------------------------------------------------------------------------- Kafka


def kraft_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding, never starting with '-'
    (the storage tool would read such an id as an option)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


@dataclasses.dataclass
class KafkaServer:
    """A single-node KRaft broker+controller on 127.0.0.1."""

    port: int = 9092
    controller_port: int = 9093
    host: str = "127.0.0.1"
    version: str = KAFKA_VERSION
    heap: str = "512m"
    root: Path = STACK_DIR / "kafka"
    process: JvmProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _properties(self, data: Path) -> dict[str, str]:
        """The broker's server.properties; a secured broker adds its listeners and TLS settings."""
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            # Tests form groups constantly; the default 3 s join delay would dominate their run time.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "log.segment.bytes": str(64 * 1024 * 1024),
            # The cleaner looks for work every second (15 s by default): tests of compacted topics wait for it.
            "log.cleaner.backoff.ms": "1000",
        }

    def _format_options(self) -> list[str]:
        """Extra options of the storage format step (a secured broker writes its SCRAM users there). They
        reach the tool through a java argument file (mode 0600, deleted after), never its command line."""
        return []

    def _write_config(self, data: Path) -> Path:
        props = self._properties(data)
        path = self.root / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.root / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.root}/logs/server.log\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = WARN\n"
            "logger.apache.name = org.apache.kafka\nlogger.apache.level = WARN\n"
            # The one line that says the broker is up stays visible in the log.
            "logger.server.name = kafka.server.KafkaRaftServer\nlogger.server.level = INFO\n"
        )
        return path

    def start(self, *, tied_to_parent: bool = False, timeout: float = 120.0, wait: bool = True) -> float:
        """Format fresh storage, start the broker, and (by default) wait until an admin client answers."""
        started = time.monotonic()
        java = check_java()
        check_port_free(self.host, self.port, "Kafka")
        check_port_free(self.host, self.controller_port, "the Kafka controller")
        lib = resolve_jars("kafka", self.version, [f"-Dlog4j2.version={LOG4J2_VERSION}"])
        shutil.rmtree(self.root, ignore_errors=True)
        data = self.root / "data"
        data.mkdir(parents=True)
        config = self._write_config(data)
        jvm = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dkafka.logs.dir={self.root}/logs",
            f"-Dlog4j2.configurationFile={self.root}/log4j2.properties",
            "-cp", f"{lib}/*",
        ]
        cluster_id = kraft_cluster_id()
        # The tool's arguments may hold passwords (SCRAM users): any local user reads a command line in
        # /proc/PID/cmdline, so they go to the launcher in an argument file only we can read.
        arguments = self.root / "format.args"
        write_argument_file(arguments, ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config),
                                        *self._format_options()])
        try:
            fmt = subprocess.run([*jvm, f"@{arguments}"], capture_output=True, text=True, check=False, cwd=self.root)
        finally:
            arguments.unlink()
        if fmt.returncode != 0:
            raise StackError(f"formatting Kafka storage failed: {fmt.stdout[-800:]}{fmt.stderr[-800:]}")
        self.process = JvmProcess("kafka", [*jvm, "kafka.Kafka", str(config)], self.root,
                                  self.root / "logs" / "stdout.log")
        self.process.start(tied_to_parent=tied_to_parent)
        if wait:
            self.wait_ready(timeout)
        return time.monotonic() - started

    def wait_ready(self, timeout: float = 120.0) -> float:
        assert self.process is not None
        return _wait_ready(self.process, self.answers, timeout, f"Kafka on {self.bootstrap}")

    def answers(self) -> bool:
        return self.answers_at(self.bootstrap)

    @staticmethod
    def answers_at(bootstrap: str) -> bool:
        return _probe(["kafka", bootstrap], timeout=20.0)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def restart(self, *, tied_to_parent: bool = False, timeout: float = 120.0) -> float:
        """Stop and start the same broker on its existing data (a broker restart, not a new cluster)."""
        assert self.process is not None
        self.process.stop()
        started = time.monotonic()
        self.process.start(tied_to_parent=tied_to_parent)
        _wait_ready(self.process, self.answers, timeout, f"Kafka on {self.bootstrap}")
        return time.monotonic() - started


async def kafka_answers(bootstrap: str, admin: Any = None) -> bool:
    """True when the broker answers a metadata request (an admin client lists topics). ``admin``: an
    unstarted admin client to ask with (a secured broker's, with its credentials); one for ``bootstrap``
    otherwise."""
    from aiokafka.admin import AIOKafkaAdminClient

    if admin is None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await asyncio.wait_for(admin.start(), 5)
        await asyncio.wait_for(admin.list_topics(), 5)
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


# ------------------------------------------------------------------------------------------- Cassandra

_JVM17_OPTIONS = [
    "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1", "-XX:G1HeapRegionSize=16m",
    "-XX:G1RSetUpdatingPauseTimePercent=5", "-XX:MaxGCPauseMillis=300", "-XX:InitiatingHeapOccupancyPercent=70",
    "-Xss256k",
    "-Djava.net.preferIPv4Stack=true", "-Djdk.attach.allowAttachSelf=true",
    "-Dio.netty.tryReflectionSetAccessible=true", "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11", "-Dchronicle.analytics.disable=true",
    "-Dcassandra-foreground=yes", "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    # Test and demo clusters are thrown away: skip fsync of system tables so schema changes take
    # milliseconds instead of seconds. Never set this on a node that keeps data.
    "-Dcassandra.unsafesystem=true",
    "-Dcassandra.superuser_setup_delay_ms=0",
]
_JPMS_OPTIONS = [
    *[f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.management/com.sun.jmx.remote.security",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
        "java.base/java.lang.ref", "jdk.unsupported/sun.misc", "jdk.compiler/com.sun.tools.javac.file",
        "jdk.attach/sun.tools.attach")],
    *[f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util")],
]


@dataclasses.dataclass
class CassandraNode:
    """One Cassandra 5.0 node. Several nodes share ports on different loopback addresses (as ccm does)."""

    address: str = "127.0.0.1"
    native_port: int = 9042
    storage_port: int = 7000
    jmx_port: int = 7199
    seeds: str = "127.0.0.1:7000"
    cluster_name: str = "countersink"
    initial_token: str | None = None
    heap: str = "1G"
    version: str = CASSANDRA_VERSION
    root: Path = STACK_DIR / "cassandra"
    authenticator: str = "AllowAllAuthenticator"
    # JMX (nodetool) without a login unless this names a password file ("USER PASSWORD" lines, mode 0600):
    # the path is on the command line, the password only in the file.
    jmx_password_file: Path | None = None
    process: JvmProcess | None = None

    def _write_config(self) -> Path:
        tokens = f"num_tokens: 1\ninitial_token: {self.initial_token}\n" if self.initial_token else "num_tokens: 4\n"
        yaml = f"""\
cluster_name: {self.cluster_name}
{tokens}allocate_tokens_for_local_replication_factor: 3
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
auto_bootstrap: false
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_segment_size: 32MiB
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{self.seeds}"
listen_address: {self.address}
rpc_address: {self.address}
storage_port: {self.storage_port}
native_transport_port: {self.native_port}
start_native_transport: true
authenticator: {self.authenticator}
authorizer: {"CassandraAuthorizer" if self.authenticator == "PasswordAuthenticator" else "AllowAllAuthorizer"}
role_manager: CassandraRoleManager
auto_snapshot: false
snapshot_before_compaction: false
hinted_handoff_enabled: true
max_hint_window: 3h
concurrent_reads: 16
concurrent_writes: 16
concurrent_counter_writes: 16
read_request_timeout: 5000ms
write_request_timeout: 2000ms
cas_contention_timeout: 1000ms
request_timeout: 10000ms
disk_failure_policy: stop
commit_failure_policy: stop
# Cassandra 5.0's own memtable configurations (its conf/cassandra.yaml): a table may choose memtable = 'trie'
memtable:
  configurations:
    skiplist:
      class_name: SkipListMemtable
    trie:
      class_name: TrieMemtable
    default:
      inherits: skiplist
"""
        path = self.root / "conf" / "cassandra.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml)
        (self.root / "conf" / "logback.xml").write_text(f"""\
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{self.root}/logs/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
  <logger name="org.apache.cassandra" level="INFO"/>
  <logger name="com.thinkaurelius.thrift" level="ERROR"/>
</configuration>
""")
        return path

    def _command(self, java: str, lib: Path) -> list[str]:
        jamm = next(lib.glob("jamm-*.jar"), None)
        if jamm is None:
            raise StackError(f"no jamm jar in {lib}; delete {lib.parent} and start again")
        return [
            java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *_JVM17_OPTIONS, *_JPMS_OPTIONS,
            f"-javaagent:{jamm}",
            f"-Dcassandra.config=file://{self.root}/conf/cassandra.yaml",
            f"-Dcassandra.storagedir={self.root}/data",
            f"-Dcassandra.logdir={self.root}/logs",
            f"-Dlogback.configurationFile={self.root}/conf/logback.xml",
            f"-Dcassandra.jmx.local.port={self.jmx_port}",
            *([] if self.jmx_password_file is None else [
                "-Dcom.sun.management.jmxremote.authenticate=true",
                f"-Dcom.sun.management.jmxremote.password.file={self.jmx_password_file}"]),
            "-cp", f"{self.root}/conf:{lib}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def start(self, *, tied_to_parent: bool = False, timeout: float = 240.0, wait: bool = True) -> float:
        """Fresh data directory, start the node, and (by default) wait until CQL answers."""
        started = time.monotonic()
        java = check_java()
        check_port_free(self.address, self.native_port, f"Cassandra CQL on {self.address}")
        check_port_free(self.address, self.storage_port, f"Cassandra storage on {self.address}")
        lib = resolve_jars("cassandra", self.version)
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "data").mkdir(parents=True)
        self._write_config()
        self.process = JvmProcess(f"cassandra@{self.address}", self._command(java, lib), self.root,
                                  self.root / "logs" / "stdout.log")
        self.process.start(tied_to_parent=tied_to_parent)
        if wait:
            self.wait_ready(timeout)
        return time.monotonic() - started

    def wait_ready(self, timeout: float = 240.0) -> float:
        assert self.process is not None
        return _wait_ready(self.process, self.answers, timeout, f"Cassandra on {self.address}:{self.native_port}")

    def nodetool(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``nodetool -h ADDRESS -p JMX_PORT ARGS`` from the node's own jars, to the end. Credentials go in
        ``args`` as ``-u USER -pwf FILE`` (never ``-pw``: a command line is readable by every local user)."""
        lib = resolve_jars("cassandra", self.version)
        command = [check_java(), *_JPMS_OPTIONS, "-cp", f"{lib}/*", "org.apache.cassandra.tools.NodeTool",
                   "-h", self.address, "-p", str(self.jmx_port), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def answers(self, peers: int | None = None) -> bool:
        return probe_cassandra(self.address, self.native_port, peers)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=60)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def restart(self, *, tied_to_parent: bool = False, timeout: float = 240.0) -> float:
        """Start the node again on its existing data (after stop or kill)."""
        assert self.process is not None
        self.process.stop(timeout=60)
        started = time.monotonic()
        self.process.start(tied_to_parent=tied_to_parent)
        self.wait_ready(timeout)
        return time.monotonic() - started


def probe_cassandra(address: str, port: int, peers: int | None = None, timeout: float = 20.0) -> bool:
    """Run :func:`cassandra_answers` in a child process that is killed after ``timeout`` seconds."""
    return _probe(["cassandra", address, str(port), *([str(peers)] if peers is not None else [])], timeout)


def _probe(args: list[str], timeout: float) -> bool:
    """A readiness probe in its own process: it cannot block the caller or share its event loop."""
    command = [sys.executable, "-m", "stack.probe", *args]
    try:
        return subprocess.run(command, cwd=REPO, capture_output=True, timeout=timeout, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


async def cassandra_answers(address: str, port: int, expected_peers: int | None = None) -> bool:
    """True when a CQL client can run ``SELECT release_version FROM system.local`` (and sees its peers)."""
    import acsylla

    cluster = acsylla.create_cluster([address], port=port, connect_timeout=2.0, request_timeout=3.0,
                                     log_level="disabled")
    try:
        session = await asyncio.wait_for(cluster.create_session(), 6)
    except Exception:
        return False
    try:
        result = await session.execute(acsylla.create_statement("SELECT release_version FROM system.local"))
        if result.first() is None:
            return False
        if expected_peers is not None:
            peers = await session.execute(acsylla.create_statement("SELECT peer FROM system.peers_v2"))
            return len(list(peers)) >= expected_peers
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            await session.close()


@dataclasses.dataclass
class CassandraCluster:
    """Three nodes on 127.0.0.1-3, fixed tokens, no bootstrap: the ccm layout, for replication tests.

    Uses its own ports (CQL 9142, storage 7100) so it can run beside the single node.
    """

    size: int = 3
    native_port: int = 9142
    storage_port: int = 7100
    heap: str = "768M"
    root: Path = STACK_DIR / "cassandra-cluster"
    nodes: list[CassandraNode] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        step = 2**64 // self.size
        self.nodes = [
            CassandraNode(
                address=f"127.0.0.{i + 1}", native_port=self.native_port, storage_port=self.storage_port,
                jmx_port=7300 + i, seeds=f"127.0.0.1:{self.storage_port}", cluster_name="countersink-cluster",
                initial_token=str(-(2**63) + i * step), heap=self.heap, root=self.root / f"node{i + 1}",
            )
            for i in range(self.size)
        ]

    @property
    def contact_points(self) -> list[str]:
        return [node.address for node in self.nodes]

    def spawn_seed(self, *, tied_to_parent: bool = False) -> None:
        """Start the seed node without waiting for it: :meth:`start` then waits for it and starts the others."""
        self.nodes[0].start(tied_to_parent=tied_to_parent, wait=False)

    def spawn_others_once_the_seed_listens(self, *, tied_to_parent: bool = False) -> bool:
        """After :meth:`spawn_seed`: start the other nodes, without waiting, once the seed accepts CQL
        connections (a node joins through its seed); whether they are started."""
        seed = self.nodes[0]
        if all(node.process is not None for node in self.nodes[1:]):
            return True
        if seed.process is None or not listens(seed.address, seed.native_port, timeout=0.05):
            return False
        self._spawn_others(tied_to_parent=tied_to_parent)
        return True

    def _spawn_others(self, *, tied_to_parent: bool) -> None:
        """Start the nodes other than the seed that are not started yet, without waiting for them."""
        for node in self.nodes[1:]:
            if node.process is None:
                node.start(tied_to_parent=tied_to_parent, wait=False)

    def start(self, *, tied_to_parent: bool = False, timeout: float = 360.0) -> float:
        """Start the seed first, then the others together (unless :meth:`spawn_seed` and
        :meth:`spawn_others_once_the_seed_listens` did); ready when every node sees its peers."""
        started = time.monotonic()
        seed = self.nodes[0]
        if seed.process is None:
            seed.start(tied_to_parent=tied_to_parent, wait=False)
        seed.wait_ready(timeout)
        self._spawn_others(tied_to_parent=tied_to_parent)
        for node in self.nodes:
            node.wait_ready(timeout)
            assert node.process is not None
            _wait_ready(node.process, lambda n=node: n.answers(peers=self.size - 1),
                        timeout, f"Cassandra {node.address} seeing {self.size - 1} peers")
        return time.monotonic() - started

    def request_stop(self) -> None:
        """SIGTERM to every node, without waiting: :meth:`stop` then waits."""
        request_stop_all(self.nodes)

    def stop(self) -> None:
        stop_together(self.nodes)


# ------------------------------------------------------------------------------------- schema registry


def build_schema_registry(version: str = SCHEMA_REGISTRY_VERSION) -> Path:
    """Build the registry's runnable jar into the cache (once per version) and return its path."""
    target = CACHE_DIR / f"schema-registry-{version}"
    runner = target / "build" / "schema-registry-runtime-1-runner.jar"
    if (target / ".complete").exists() and runner.exists():
        return runner
    mvn = shutil.which("mvn")
    if not mvn:
        raise StackError(f"Maven is required once to build schema registry {version} but `mvn` was not found")
    say(f"building schema registry (Apicurio {version}) from Maven Central into {target} (first time only)")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(HERE / "maven" / "schema-registry", target / "project")
    started = time.monotonic()
    cmd = [mvn, "-B", "-q", "-f", str(target / "project" / "pom.xml"), "package", "-DskipTests",
           f"-Dapicurio.version={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join([line for line in proc.stdout.splitlines() if "ERROR" in line][:5])
        raise StackError(f"Maven could not build schema registry {version}:\n{tail}")
    built = target / "project" / "target"
    (target / "build").mkdir()
    shutil.move(built / "schema-registry-runtime-1-runner.jar", runner)
    shutil.move(built / "lib", target / "build" / "lib")
    shutil.rmtree(target / "project" / "target", ignore_errors=True)
    (target / ".complete").write_text(json.dumps({"version": version, "seconds": round(time.monotonic() - started, 1)}))
    say(f"built schema registry {version} in {time.monotonic() - started:.0f}s")
    return runner


@dataclasses.dataclass
class SchemaRegistryServer:
    """Apicurio Registry with in-memory storage on 127.0.0.1: every start is an empty registry. Clients use
    its Confluent-compatible API at :attr:`url`."""

    port: int = 8085  # 8080-8082 are the health and serve ports of countersink's own processes
    host: str = "127.0.0.1"
    version: str = SCHEMA_REGISTRY_VERSION
    heap: str = "256m"
    root: Path = STACK_DIR / "schema-registry"
    # HTTPS only, with this certificate chain and key (PEM), when both are set; ``ca_file`` is what a client
    # trusts it with (the readiness probe uses it).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    ca_file: Path | None = None
    process: JvmProcess | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what ``COUNTERSINK_SCHEMA_REGISTRY__URL`` names)."""
        scheme = "https" if self.tls_cert is not None else "http"
        return f"{scheme}://{self.host}:{self.port}/apis/ccompat/v7"

    def _http_options(self) -> list[str]:
        if self.tls_cert is None or self.tls_key is None:
            return [f"-Dquarkus.http.port={self.port}"]
        # Plain HTTP is turned off: the registry answers over TLS only.
        return [f"-Dquarkus.http.ssl-port={self.port}", "-Dquarkus.http.insecure-requests=disabled",
                f"-Dquarkus.http.ssl.certificate.files={self.tls_cert}",
                f"-Dquarkus.http.ssl.certificate.key-files={self.tls_key}", "-Dquarkus.http.port=0"]

    def start(self, *, tied_to_parent: bool = False, timeout: float = 120.0, wait: bool = True) -> float:
        started = time.monotonic()
        java = check_java()
        check_port_free(self.host, self.port, "the schema registry")
        runner = build_schema_registry(self.version)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        command = [
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            *self._http_options(), f"-Dquarkus.http.host={self.host}",
            # The stack's root folder on the command line: `python -m stack down` stops only its own processes.
            f"-Dcountersink.stack={self.root}",
            "-jar", str(runner),
        ]
        self.process = JvmProcess("schema-registry", command, self.root, self.root / "logs" / "stdout.log")
        self.process.start(tied_to_parent=tied_to_parent)
        if wait:
            self.wait_ready(timeout)
        return time.monotonic() - started

    def wait_ready(self, timeout: float = 120.0) -> float:
        assert self.process is not None
        return _wait_ready(self.process, self.answers, timeout, f"the schema registry on {self.url}")

    def answers(self) -> bool:
        return schema_registry_answers(self.url, ca_file=self.ca_file)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def restart(self, *, tied_to_parent: bool = False, timeout: float = 120.0) -> float:
        """Start it again (empty: the storage is in memory)."""
        assert self.process is not None
        self.process.stop()
        started = time.monotonic()
        self.process.start(tied_to_parent=tied_to_parent)
        self.wait_ready(timeout)
        return time.monotonic() - started


def schema_registry_answers(url: str, timeout: float = 3.0, ca_file: Path | None = None) -> bool:
    """True when ``GET {url}/subjects`` answers 200 (a list of subjects); an https URL is trusted with
    ``ca_file``."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout, context=context) as answer:  # noqa: S310
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


# -------------------------------------------------------------------------------- state for the CLI


STATE_FILE = STACK_DIR / "state.json"


def save_state(entries: dict[str, dict[str, object]]) -> None:
    STACK_DIR.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(entries, indent=2))


def load_state() -> dict[str, dict[str, object]]:
    try:
        state: dict[str, dict[str, object]] = json.loads(STATE_FILE.read_text())
        return state
    except (OSError, ValueError):
        return {}


def stop_recorded() -> list[str]:
    """Stop every server recorded by ``python -m stack up``; returns what was stopped."""
    stopped = []
    for name, entry in load_state().items():
        pid = entry.get("pid")
        if isinstance(pid, int) and _pid_alive(pid) and _is_our_jvm(pid):
            _terminate(pid, 60)
            stopped.append(f"{name} (pid {pid})")
    with contextlib.suppress(OSError):
        STATE_FILE.unlink()
    return stopped


def _is_our_jvm(pid: int) -> bool:
    """Guard against a recycled pid: only stop a process whose command line points into our stack dir."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(STACK_DIR) in cmdline
