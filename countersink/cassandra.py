"""A Cassandra session with bounded in-flight requests, a bounded wait for a slot, and named errors.

In the spirit of a connection pool with a FIFO pending queue: at most ``max_in_flight`` requests run at
once; a caller waits at most ``queue_timeout_s`` for a slot (asyncio's semaphore wakes waiters in FIFO
order) and then gets :class:`CassandraOverloadedError` instead of piling up unbounded work. Node
discovery, token-aware routing and reconnection come from the driver (acsylla, over the DataStax C++
driver).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import acsylla

from countersink.consistency import beyond_replicas, may_exceed_replicas, replication_factors
from countersink.logs import cassandra_session_starting, get_logger
from countersink.metrics import METRICS
from countersink.settings import CassandraSettings, Consistency
from schemas import cql
from schemas.bounded import read_text_at_most
from schemas.errors import CountersinkError

log = get_logger(__name__)

# The driver's words when the first connection closes before a CQL answer.
_CLOSED_ON_HELLO = "Connection closed prematurely"


class CassandraError(CountersinkError):
    """Raised when a Cassandra request fails for a reason that retrying will not fix."""


class CassandraUnavailableError(CassandraError):
    """Raised when no node, or too few replicas, could serve a request, or it timed out; retry later."""

    retriable = True


class ConsistencyUnreachableError(CassandraError):
    """Raised when a request's consistency level waits for more replicas than the keyspace keeps: no retry
    can meet it (Cassandra, through the driver, reports it as too few replicas, or no host available)."""


class CassandraOverloadedError(CassandraUnavailableError):
    """Raised when no in-flight slot came free within ``queue_timeout_s``."""


_UNAVAILABLE = (acsylla.errors.CassErrorServerUnavailable, acsylla.errors.CassErrorLibNoHostsAvailable)

_RETRIABLE = (
    acsylla.errors.CassErrorServerUnavailable,
    acsylla.errors.CassErrorServerWriteTimeout,
    acsylla.errors.CassErrorServerReadTimeout,
    acsylla.errors.CassErrorServerOverloaded,
    acsylla.errors.CassErrorServerIsBootstrapping,
    acsylla.errors.CassErrorServerWriteFailure,
    acsylla.errors.CassErrorServerReadFailure,
    acsylla.errors.CassErrorLibNoHostsAvailable,
    acsylla.errors.CassErrorLibRequestTimedOut,
    acsylla.errors.CassErrorLibUnableToConnect,
    acsylla.errors.CassErrorLibRequestQueueFull,
    acsylla.errors.CassErrorLibWriteError,
    acsylla.errors.CassErrorLibNoStreams,
    acsylla.errors.CassExceptionConnectionError,
)


_DEADLINE_MARGIN_S = 5.0
# How often the watchdog looks for requests past their deadline: a lost answer is noticed this much late at most.
_WATCHDOG_TICK_S = 0.5


def _consistency(level: Consistency | str) -> acsylla.Consistency:
    return acsylla.Consistency[str(level)]


class CassandraClient:
    """One session per process. ``start()``/``stop()`` or ``async with``; ``stop()`` is safe twice.


    Result rows come back as the driver gives them: note that uuid columns arrive as text.
    """

    def __init__(self, settings: CassandraSettings, *, use_keyspace: bool = True, app: str = "countersink",
                 credentials: str = "COUNTERSINK_CASSANDRA__USERNAME and __PASSWORD"):
        """``use_keyspace=False`` connects without selecting the keyspace (to create or drop it). ``credentials``:
        the settings a refusal of the credentials names (another role's, for a client logged in as it)."""
        self.settings = settings
        self._credentials = credentials
        self.keyspace = settings.keyspace
        self._use_keyspace = use_keyspace
        self._app = app
        self._session: Any = None
        self._prepared: dict[str, Any] = {}
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._in_flight = 0
        # The requests awaited, by number: their deadline and the task awaiting; the numbers of those the
        # watchdog cancelled for being past it (see _run).
        self._awaited: dict[int, tuple[float, asyncio.Task[Any]]] = {}
        self._expired: set[int] = set()
        self._numbers = itertools.count()
        self._watchdog: asyncio.TimerHandle | None = None  # its next look, while requests are awaited
        self._watchdog_loop: asyncio.AbstractEventLoop | None = None
        self._timeouts_counted = {"connection": 0, "request": 0}  # the session's running counts, as last added

    async def __aenter__(self) -> CassandraClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _cluster(self) -> Any:
        s = self.settings
        options: dict[str, Any] = {
            "port": s.port,
            "connect_timeout": s.connect_timeout_s,
            "request_timeout": s.request_timeout_s,
            "consistency": _consistency(s.write_consistency),
            "serial_consistency": acsylla.Consistency[str(s.serial_consistency)],
            "token_aware_routing": True,
            "core_connections_per_host": s.connections_per_host,
            "num_threads_io": s.io_threads,
            "exponential_reconnect_base_delay_ms": 500,
            "exponential_reconnect_max_delay_ms": 10_000,
            "heartbeat_interval_sec": 5,
            "log_level": "error",
            "application_name": self._app,
            # No host_listener_callback: a Python callback invoked from the driver's threads while a
            # session closes aborted the process once in our test runs.
        }
        if s.local_dc:
            options["load_balance_dc_aware"] = s.local_dc
        if s.username:
            options["username"] = s.username
            options["password"] = s.password.get_secret_value() if s.password else ""
        if s.ssl_enabled:
            options["ssl_enabled"] = True
            options["ssl_verify_flags"] = _VerifyFlags(
                (_PEER_CERT | _PEER_IDENTITY[s.ssl_verify_identity]) if s.ssl_verify else 0)
            if s.ssl_verify and s.ssl_verify_identity == "dns":
                options["hostname_resolution"] = True  # the driver compares the name of each node's address
            for name in ("ssl_trusted_cert", "ssl_cert", "ssl_private_key"):
                path = getattr(s, name)
                if path is not None:
                    options[name] = _read_pem(path, name)
        return acsylla.create_cluster(list(s.contact_points), **options)

    async def start(self) -> None:
        if self._session is not None:
            return
        try:
            self._timeouts_counted = {"connection": 0, "request": 0}  # a new session counts from 0
            with cassandra_session_starting():
                creating = asyncio.ensure_future(
                    self._cluster().create_session(keyspace=self.keyspace if self._use_keyspace else None))
                try:
                    self._session = await asyncio.shield(creating)
                except asyncio.CancelledError:
                    await _close_when_created(creating)
                    raise
        except acsylla.errors.CassErrorServerBadCredentials as exc:
            user = f"user {self.settings.username!r}" if self.settings.username else "no user name"
            raise CassandraError(
                f"Cassandra refused the credentials ({user}; check {self._credentials})"
            ) from exc
        except _TLS_REFUSED as exc:
            # Retrying cannot fix a certificate: say what TLS refused, at once.
            check = ("the names in the node's certificate, and COUNTERSINK_CASSANDRA__SSL_VERIFY_IDENTITY"
                     if isinstance(exc, acsylla.errors.CassErrorSslIdentityMismatch) else
                     "COUNTERSINK_CASSANDRA__SSL_TRUSTED_CERT, __SSL_CERT and __SSL_PRIVATE_KEY")
            raise CassandraError(f"TLS with Cassandra at {self._where()} failed: {_tls_reason(exc)} (check {check})"
                                 ) from exc
        except acsylla.errors.CassErrorLibUnableToSetKeyspace as exc:
            # Still retried: a schema job may be creating it right now. But say what makes the wait end.
            raise CassandraUnavailableError(
                f"Cassandra at {self._where()} has no keyspace {self.keyspace!r} yet: create it with "
                "`countersink schema`"
            ) from exc
        except (acsylla.errors.CassException, OSError) as exc:
            # Something that is not a native transport answered (a web server, a node expecting TLS).
            check = (" (what listens there closed the connection on CQL's first bytes: check that the port is "
                     "Cassandra's native transport port, and COUNTERSINK_CASSANDRA__SSL_ENABLED if the node expects "
                     "TLS)" if _CLOSED_ON_HELLO in str(exc) else "")
            raise CassandraUnavailableError(
                f"cannot connect to Cassandra at {self._where()}: {type(exc).__name__}: {exc}{check}"
            ) from exc
        log.info("cassandra_connected", contact_points=list(self.settings.contact_points), keyspace=self.keyspace)

    def _where(self) -> str:
        return f"{','.join(self.settings.contact_points)}:{self.settings.port}"

    async def stop(self) -> None:
        session, self._session = self._session, None
        self._prepared.clear()
        if not self._awaited and self._watchdog is not None:  # requests still awaited keep their deadlines
            self._watchdog.cancel()
            self._watchdog = None
        if session is not None:
            await session.close()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def _prepare(self, cql_text: str) -> Any:
        prepared = self._prepared.get(cql_text)
        if prepared is None:
            prepared = await self._run(self._session.create_prepared(cql_text), cql_text)
            self._prepared[cql_text] = prepared
        return prepared

    async def _run(self, awaitable: Any, what: str) -> Any:
        """Await one driver call inside an in-flight slot, translating driver errors to ours."""
        if self._session is None:
            raise CassandraError("the Cassandra client is not started")
        try:
            if self._slots.locked():
                await asyncio.wait_for(self._slots.acquire(), self.settings.queue_timeout_s)
            else:
                await self._slots.acquire()  # a slot is free: no timer and no task for the common case
        except TimeoutError:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never awaited: close it so Python does not warn
            METRICS.cassandra_queue_timeouts.inc()
            raise CassandraOverloadedError(
                f"no Cassandra request slot free within {self.settings.queue_timeout_s}s "
                f"({self.settings.max_in_flight} in flight)"
            ) from None
        self._in_flight += 1
        METRICS.cassandra_in_flight.set(self._in_flight)
        started = time.perf_counter()
        # The driver times requests out itself; a deadline is a net under it, so that an answer lost anywhere
        # becomes a retriable error instead of a task that waits forever. One watchdog keeps every
        # request's deadline, not a timer per request: a flush sends thousands of requests, and a timer each
        # (asyncio.timeout) cost about 5 µs a request, as much as binding five rows (python -m bench.versions
        # flushes).
        task, number, cancelling = asyncio.current_task(), next(self._numbers), 0
        if task is not None:
            self._awaited[number] = (started + self.settings.request_timeout_s + _DEADLINE_MARGIN_S, task)
            loop = asyncio.get_running_loop()
            if self._watchdog is None or self._watchdog_loop is not loop:
                self._watchdog, self._watchdog_loop = loop.call_later(_WATCHDOG_TICK_S, self._watch), loop
            cancelling = task.cancelling()
        try:
            return await awaitable
        except asyncio.CancelledError:
            if number not in self._expired or task is None or task.uncancel() > cancelling:
                raise  # cancelled by its caller (too), not for its deadline
            METRICS.cassandra_errors.labels(kind="no_answer").inc()
            raise CassandraUnavailableError(f"no answer within {self.settings.request_timeout_s}s "
                                            f"[{_short(what)}]") from None
        except _RETRIABLE as exc:
            METRICS.cassandra_errors.labels(kind="retriable").inc()
            raise CassandraUnavailableError(f"{type(exc).__name__}: {exc} [{_short(what)}]") from exc
        except acsylla.errors.CassException as exc:
            METRICS.cassandra_errors.labels(kind="fatal").inc()
            raise CassandraError(f"{type(exc).__name__}: {exc} [{_short(what)}]") from exc
        finally:
            self._awaited.pop(number, None)
            self._expired.discard(number)
            self._in_flight -= 1
            METRICS.cassandra_in_flight.set(self._in_flight)
            METRICS.cassandra_request_seconds.observe(time.perf_counter() - started)
            self._slots.release()

    def _watch(self) -> None:
        """Cancel each request still awaited past its deadline (``_run`` turns that into a retriable error), and
        look again later while any is awaited: an idle client has no timer."""
        loop = asyncio.get_running_loop()
        try:
            self._cancel_overdue(time.perf_counter(), loop)
        finally:  # whatever happened, requests still awaited keep a watchdog
            self._watchdog = loop.call_later(_WATCHDOG_TICK_S, self._watch) if self._awaited else None

    def _cancel_overdue(self, now: float, loop: asyncio.AbstractEventLoop) -> None:
        for number, (deadline, task) in list(self._awaited.items()):
            if task.done() or task.get_loop() is not loop:
                # Ended without leaving _run (its event loop closed under it): nothing is waiting any more.
                del self._awaited[number]
            elif deadline <= now and number not in self._expired:
                self._expired.add(number)
                task.cancel()

    async def execute(
        self,
        cql_text: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        consistency: Consistency | str | None = None,
        serial_consistency: str | None = None,
        page_size: int | None = None,
        page_state: bytes | None = None,
        prepared: bool = True,
        idempotent: bool = True,
        tracing: bool = False,
    ) -> Any:
        """Run one statement (prepared once and cached by default) and return the driver's result. With
        ``tracing``, Cassandra records the request in ``system_traces``."""
        level = _consistency(consistency or self.settings.write_consistency)
        if prepared:
            statement = (await self._prepare(cql_text)).bind(page_size=page_size, page_state=page_state)
            if isinstance(params, Mapping):
                statement.bind_dict(dict(params))
            elif params:
                statement.bind_list(list(params))
        else:
            statement = acsylla.create_statement(cql_text, parameters=len(params) if params else None,
                                                 page_size=page_size, page_state=page_state)
            if params:
                statement.bind_list(list(params))
        statement.set_consistency(level)
        if serial_consistency:
            statement.set_serial_consistency(acsylla.Consistency[serial_consistency])
        statement.set_is_idempotent(idempotent)
        if tracing:
            statement.set_tracing(True)
        try:
            return await self._run(self._session.execute(statement), cql_text)
        except CassandraUnavailableError as exc:
            await self._refuse_unreachable(consistency or self.settings.write_consistency, exc)
            raise

    async def execute_batch(
        self,
        statements: Sequence[tuple[str, Sequence[Any]]],
        *,
        logged: bool = False,
        consistency: Consistency | str | None = None,
        timestamp_us: int | None = None,
        idempotent: bool = True,
    ) -> Any:
        """Run statements as one batch. An unlogged batch on one partition is applied atomically; so is a
        conditional one (not ``idempotent``: its conditions hold once)."""
        batch = acsylla.create_batch_logged() if logged else acsylla.create_batch_unlogged()
        for cql_text, params in statements:
            # prepared once per process: a flush's rows are looked up, not awaited, one by one
            prepared = self._prepared.get(cql_text) or await self._prepare(cql_text)
            statement = prepared.bind()
            statement.bind_list(params if isinstance(params, list) else list(params))
            batch.add_statement(statement)
        batch.set_consistency(_consistency(consistency or self.settings.write_consistency))
        batch.set_is_idempotent(idempotent)
        if timestamp_us is not None:
            batch.set_timestamp(timestamp_us)
        try:
            return await self._run(self._session.execute_batch(batch),
                                   "BATCH " + (statements[0][0] if statements else ""))
        except CassandraUnavailableError as exc:
            await self._refuse_unreachable(consistency or self.settings.write_consistency, exc)
            raise

    async def _refuse_unreachable(self, level: Consistency | str, failed: CassandraUnavailableError) -> None:
        """Raise :class:`ConsistencyUnreachableError` when ``failed`` (too few replicas, or no host available)
        is a request at a level that waits for more replicas than the keyspace keeps; else return (``failed``
        stands: nodes may be down, and retrying may help)."""
        if not isinstance(failed.__cause__, _UNAVAILABLE) or str(level) not in Consistency.__members__:
            return  # SERIAL and LOCAL_SERIAL (an LWT's reads) wait for a quorum, which every keyspace has
        level = Consistency(str(level))
        if not may_exceed_replicas(level):
            return
        try:
            factors = await self.replication_factors()
        except CassandraError:
            return  # the keyspace's replication unknown: an outage, not a level to refuse
        beyond = beyond_replicas(level, self.keyspace, factors, self.settings.local_dc)
        if beyond is not None:
            raise ConsistencyUnreachableError(f"consistency {level} {beyond}: ask for a lower level") from failed

    async def ensure_schema(self, replication: str | None = None) -> None:
        """Create the keyspace and tables if missing (idempotent).

        A schema already complete at this version is only read, never created again: a consumer whose role
        may select and modify but not create (least privilege) starts on what ``countersink schema`` made."""
        if await self.schema_complete():
            return
        replication = replication or self.settings.replication
        if not as_dicts(await self.execute("SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
                                           [self.keyspace], consistency=Consistency.ONE)):
            problem = cql.replication_problem(replication, await self._nodes_per_data_center())
            if problem is not None:  # not created: a keyspace no statement could then write, and none could change
                raise CassandraError(f"keyspace {self.keyspace!r} not created: {problem}")
        await self.execute(cql.create_keyspace(self.keyspace, replication), prepared=False,
                           consistency=Consistency.ONE)
        for statement in cql.create_tables(self.keyspace):
            await self.execute(statement, prepared=False, consistency=Consistency.ONE)
        # Tables made before a column was added keep their old shape under CREATE ... IF NOT EXISTS.
        for table in cql.ADDED_COLUMNS:
            await self.execute(cql.add_columns(self.keyspace, table), prepared=False, consistency=Consistency.ONE)
        await self.execute(cql.shards_options(self.keyspace), prepared=False, consistency=Consistency.ONE)
        await self.execute(cql.record_schema_version(self.keyspace), prepared=False)

    async def _nodes_per_data_center(self) -> dict[str, int]:
        """The cluster's nodes by data center, as the node answering knows them (itself and its peers)."""
        nodes: dict[str, int] = {}
        for table in ("system.local", "system.peers"):
            for row in as_dicts(await self.execute(f"SELECT data_center FROM {table}", prepared=False,  # noqa: S608
                                                   consistency=Consistency.ONE)):
                nodes[row["data_center"]] = nodes.get(row["data_center"], 0) + 1
        return nodes

    async def schema_complete(self) -> bool:
        """True when every table exists and the keyspace records this schema version (or a later one)."""
        tables = as_dicts(await self.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?", [self.keyspace],
            consistency=Consistency.ONE))
        if not cql.table_names(self.keyspace) <= {row["table_name"] for row in tables}:
            return False
        rows = as_dicts(await self.execute(cql.read_schema_version(self.keyspace), prepared=False,
                                           consistency=Consistency.ONE))
        if rows and int(rows[0]["version"]) < cql.SCHEMA_VERSION:
            # Tables of an older layout exist under the same names: creating ours "if not exists" would keep
            # theirs, and every write would fail (or worse, land where no reader looks).
            raise cql.SchemaVersionError(
                f"keyspace {self.keyspace!r} holds countersink schema {rows[0]['version']}; this version needs "
                f"{cql.SCHEMA_VERSION}, and no migration exists before the first release: drop the keyspace "
                "or choose another (COUNTERSINK_CASSANDRA__KEYSPACE)")
        if not (rows and int(rows[0]["version"]) >= cql.SCHEMA_VERSION):
            return False
        return await self._columns_complete()

    async def _columns_complete(self) -> bool:
        """True when every column added since a table was first made (``cql.ADDED_COLUMNS``) is there."""
        for table, added in cql.ADDED_COLUMNS.items():
            columns = as_dicts(await self.execute(
                "SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ?",
                [self.keyspace, table], consistency=Consistency.ONE))
            if not {name for name, _ in added} <= {row["column_name"] for row in columns}:
                return False
        return True

    async def replication_factors(self) -> dict[str, int]:
        """Replicas per data centre of the keyspace as it exists (``""`` for SimpleStrategy)."""
        result = await self.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
                                    [self.keyspace], consistency=Consistency.ONE)
        rows = as_dicts(result)
        return replication_factors(dict(rows[0]["replication"])) if rows else {}

    def connections(self) -> int:
        """Open connections to Cassandra nodes right now (0 before start, after stop, or with every node down)."""
        return 0 if self._session is None else int(self._session.metrics().stats_total_connections)

    def sample_driver_metrics(self) -> None:
        """Copy the driver's own view (open connections, timeouts) into the process metrics.

        Connections drop when a node goes away and come back when the driver reconnects, so this gauge
        shows discovery and reconnection without a callback from the driver's threads.
        """
        if self._session is None:
            return
        stats = self._session.metrics()
        METRICS.cassandra_connections.set(stats.stats_total_connections)
        # The driver keeps running counts per session: the counter grows by what they grew since last time.
        counts = {"connection": stats.errors_connection_timeouts, "request": stats.errors_request_timeouts}
        for level, count in counts.items():
            grown = int(count) - self._timeouts_counted[level]
            if grown > 0:
                METRICS.cassandra_driver_timeouts.labels(level=level).inc(grown)
                self._timeouts_counted[level] = int(count)


# The driver's verification flags (cass_ssl_set_verify_flags), combined as the C API intends. acsylla's enum
# cannot express a combination, and its PEER_IDENTITY member aliases PEER_CERT's value.
_PEER_CERT = 0x01
_PEER_IDENTITY = {"none": 0x00, "ip": 0x02, "dns": 0x04}


class _VerifyFlags:
    """What acsylla's ``create_cluster`` reads from an ``SSLVerifyFlags`` member: its ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value


_TLS_REFUSED = (
    acsylla.errors.CassErrorSslInvalidPeerCert,
    acsylla.errors.CassErrorSslNoPeerCert,
    acsylla.errors.CassErrorSslIdentityMismatch,
    acsylla.errors.CassErrorSslInvalidCert,
    acsylla.errors.CassErrorSslInvalidPrivateKey,
    acsylla.errors.CassErrorSslProtocolError,
)


def _tls_reason(exc: BaseException) -> str:
    """The driver's reason without its layers of prefixes: 'self signed certificate in certificate chain'."""
    return str(exc).rsplit(": ", 1)[-1] or type(exc).__name__


MAX_PEM_BYTES = 1024 * 1024  # a certificate chain or key, read whole


def _read_pem(path: Path, setting: str) -> str:
    """A PEM file named by a setting; a missing or unreadable one is a configuration error, not a retry."""
    try:
        text = read_text_at_most(path, MAX_PEM_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        raise CassandraError(f"COUNTERSINK_CASSANDRA__{setting.upper()}: cannot read {path}: "
                             f"{getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    if "-----BEGIN " not in text:
        raise CassandraError(f"COUNTERSINK_CASSANDRA__{setting.upper()}: {path} is not a PEM file")
    # PKCS #8's "ENCRYPTED PRIVATE KEY", or OpenSSL's older "Proc-Type: 4,ENCRYPTED" header. The driver is given
    # no pass phrase, and says only that the key is invalid.
    if setting == "ssl_private_key" and ("-----BEGIN ENCRYPTED " in text or "Proc-Type: 4,ENCRYPTED" in text):
        raise CassandraError(f"COUNTERSINK_CASSANDRA__SSL_PRIVATE_KEY: {path} is encrypted, and countersink reads "
                             "only an unencrypted key: write it decrypted (openssl pkey -in KEY -out PLAIN_KEY) to a "
                             "file only this user can read")
    return text


async def _close_when_created(creating: asyncio.Future[Any]) -> None:
    """Let a session being created end, then close it. acsylla's ``create_session`` must not be cancelled: a
    cancelled one blocks the event loop for good (a SIGTERM during a GC loop's connect hung it)."""
    while not creating.done():
        try:
            await asyncio.wait({creating})
        except asyncio.CancelledError:
            continue
    if not creating.cancelled() and creating.exception() is None:
        await creating.result().close()


# A password written into CQL text (CREATE ROLE ... WITH PASSWORD = '...', which takes no bound value there)
_PASSWORD_LITERAL = re.compile(r"(?i)(password\s*=\s*)'(?:[^']|'')*'")


def _short(cql_text: str) -> str:
    """The statement as an error names it: its first 120 characters, any password literal masked."""
    return " ".join(_PASSWORD_LITERAL.sub(r"\1'***'", cql_text).split())[:120]


def as_dicts(result: Any) -> list[dict[str, Any]]:
    """All rows of one result page as dicts."""
    return [row.as_dict() for row in result]
