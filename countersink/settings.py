"""Process settings, read from ``COUNTERSINK_*`` environment variables (and an optional ``.env`` file).

Nested sections use a double underscore: ``COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS``,
``COUNTERSINK_CASSANDRA__CONTACT_POINTS``. Nothing else in countersink reads the environment.
Secrets are :class:`pydantic.SecretStr`, so they never appear in logs or reprs.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from countersink.redaction import shown_url
from schemas import cql
from schemas.errors import CountersinkError

_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
_BARE_IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}")


def _listening_host(value: str) -> str:
    """A host name or an address to listen on (``0.0.0.0``, ``::``, ``127.0.0.1``, ``pod-1.local``): refused at
    start, naming its variable, rather than by the socket later in words that name none."""
    if not (_HOST.fullmatch(value) or _BARE_IPV6.fullmatch(value)):
        raise ValueError("not a host name or an address to listen on (0.0.0.0, ::, 127.0.0.1, a name)")
    return value


def _lower(value: Any) -> Any:
    """A before-validator: names of levels, modes and formats are read in any case."""
    return value.lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    """A before-validator: names of levels, modes and formats are read in any case."""
    return value.upper() if isinstance(value, str) else value


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _AnyCase(StrEnum):
    """An enum whose values are accepted in any case (``one``, ``One``, ``ONE``), from flags and variables."""

    @classmethod
    def _missing_(cls, value: object) -> _AnyCase | None:
        if isinstance(value, str):
            for member in cls:
                if member.value.lower() == value.lower():
                    return member
        return None


class Consistency(_AnyCase):
    """Cassandra consistency levels countersink accepts for reads and writes."""

    ONE = "ONE"
    TWO = "TWO"
    THREE = "THREE"
    QUORUM = "QUORUM"
    ALL = "ALL"
    LOCAL_QUORUM = "LOCAL_QUORUM"
    EACH_QUORUM = "EACH_QUORUM"
    LOCAL_ONE = "LOCAL_ONE"


class SerialConsistency(_AnyCase):
    """Consistency of the Paxos phase of lightweight transactions."""

    SERIAL = "SERIAL"
    LOCAL_SERIAL = "LOCAL_SERIAL"


MAX_TOPIC_PARTITIONS = 100_000  # of a topic countersink creates (the setting, and topics create --partitions)


class _Section(BaseModel):
    # inf and nan are no duration or size: refused with the variable named, not an OverflowError later.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class KafkaSecurity(_AnyCase):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class KafkaSettings(_Section):
    """How to reach Kafka. TLS and SASL are off by default and on with ``security_protocol``."""

    bootstrap_servers: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["127.0.0.1:9092"],
                                                              min_length=1)
    client_id: str = Field(default="countersink", min_length=1, max_length=255)
    security_protocol: KafkaSecurity = KafkaSecurity.PLAINTEXT
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = Field(default=None, pattern=r"^(PLAIN|SCRAM-SHA-256|SCRAM-SHA-512|OAUTHBEARER)$")
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # OAUTHBEARER: access tokens from an OAuth 2.0 / OIDC token endpoint, client credentials grant (the client
    # id and secret sent with HTTP Basic authentication), each token used until 80% of its lifetime has passed.
    # No "@" anywhere: a password holding "/" would end the host early and pass a check of the host alone.
    sasl_oauth_token_url: str | None = Field(default=None, pattern=r"^https?://[^\s/?#@]+([/?#][^\s@]*)?$",
                                             max_length=2000)
    sasl_oauth_client_id: str | None = None
    sasl_oauth_client_secret: SecretStr | None = None
    sasl_oauth_scope: str | None = None
    # the authorities that sign the token endpoint's certificate (PEM); unset: the system's trust store
    sasl_oauth_cafile: Path | None = None
    request_timeout_ms: int = Field(default=30_000, ge=1_000, le=3_600_000)
    # SASL over a connection without TLS (SASL_PLAINTEXT) is refused unless this is true: the user name, and
    # with PLAIN the password, cross the network in the clear (SCRAM's exchange can be replayed to a guesser;
    # an OAUTHBEARER token is a password until it expires). So is a token endpoint reached over plain http.
    allow_insecure: bool = False

    _split = field_validator("bootstrap_servers", mode="before")(_split_csv)

    _mechanism_upper = field_validator("sasl_mechanism", mode="before")(_upper)

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_and_port(cls, servers: list[str]) -> list[str]:
        for server in servers:
            host, colon, port = server.rpartition(":")
            if not colon:
                host, port = server, "9092"
            # A host name, an IPv4 address or a bracketed IPv6 one: nothing else, so that credentials written into
            # the address (user:password@host) are refused here rather than echoed by an error naming the server.
            if (not _HOST.fullmatch(host) or not (port.isascii() and port.isdigit())
                    or not 1 <= int(port) <= 65535):
                raise ValueError(f"server {servers.index(server) + 1} of {len(servers)} is not HOST:PORT with a port "
                                 "of 1 to 65535 (a host name, or an address; no user or password)")
        return servers

    @property
    def oauth(self) -> bool:
        """SASL with OAUTHBEARER: tokens from the token endpoint instead of a user name and password."""
        return self.sasl_mechanism == "OAUTHBEARER" and self.security_protocol.startswith("SASL")

    @model_validator(mode="after")
    def _nothing_set_in_vain(self) -> KafkaSettings:
        # A certificate or a password the protocol never sends is a configuration that believes itself
        # safer than it is (TLS files with PLAINTEXT connect in the clear, without a word).
        tls = self.security_protocol in (KafkaSecurity.SSL, KafkaSecurity.SASL_SSL)
        unused = [name for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, name) and not tls]
        if not self.security_protocol.startswith("SASL"):
            unused += [name for name in ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_oauth_token_url",
                                         "sasl_oauth_client_id", "sasl_oauth_client_secret", "sasl_oauth_scope",
                                         "sasl_oauth_cafile") if getattr(self, name)]
        if unused:
            raise ValueError(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} set but security_protocol "
                             f"is {self.security_protocol.value}, which does not use "
                             f"{'it' if len(unused) == 1 else 'them'}: choose the protocol that does (SSL, "
                             "SASL_SSL), or unset them")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile is set without ssl_certfile, the certificate it is the key of")
        return self

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaSettings:
        if self.oauth:
            if not (self.sasl_oauth_token_url and self.sasl_oauth_client_id and self.sasl_oauth_client_secret):
                raise ValueError("SASL OAUTHBEARER needs sasl_oauth_token_url, sasl_oauth_client_id and "
                                 "sasl_oauth_client_secret")
        elif self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError("SASL needs sasl_mechanism, sasl_username and sasl_password")
        if self.security_protocol is KafkaSecurity.SASL_PLAINTEXT and not self.allow_insecure:
            raise ValueError("SASL_PLAINTEXT sends the SASL credentials without TLS: use SASL_SSL (or set "
                             "COUNTERSINK_KAFKA__ALLOW_INSECURE=true to accept that)")
        if self._oauth_over_http and not self.allow_insecure:
            raise ValueError("sasl_oauth_token_url is http: the client secret would cross the network in the clear; "
                             "use https (or set COUNTERSINK_KAFKA__ALLOW_INSECURE=true to accept that)")
        return self

    @property
    def _oauth_over_http(self) -> bool:
        return self.oauth and (self.sasl_oauth_token_url or "").lower().startswith("http://")

    def insecure_choices(self) -> list[tuple[str, dict[str, Any]]]:
        """What these settings give up (a log event and its fields each), for a WARNING at start."""
        choices: list[tuple[str, dict[str, Any]]] = []
        if self.security_protocol is KafkaSecurity.SASL_PLAINTEXT:
            choices.append(("kafka_credentials_without_tls", {
                "user": self.sasl_oauth_client_id if self.oauth else self.sasl_username,
                "mechanism": self.sasl_mechanism}))
        if self._oauth_over_http:
            shown = shown_url(self.sasl_oauth_token_url or "")  # its query may hold a credential
            choices.append(("kafka_token_endpoint_without_tls", {"token_url": shown,
                                                                 "client_id": self.sasl_oauth_client_id}))
        if self.security_protocol in (KafkaSecurity.SSL, KafkaSecurity.SASL_SSL) and not self.ssl_check_hostname:
            choices.append(("kafka_host_name_not_checked", {"bootstrap_servers": list(self.bootstrap_servers)}))
        return choices


class CassandraSettings(_Section):
    """How to reach Cassandra, and at which consistency countersink reads and writes."""

    contact_points: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["127.0.0.1"], min_length=1)
    port: int = Field(default=9042, ge=1, le=65535)
    keyspace: str = "countersink"
    local_dc: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    ssl_enabled: bool = False
    ssl_trusted_cert: Path | None = None
    ssl_cert: Path | None = None
    ssl_private_key: Path | None = None
    ssl_verify: bool = True
    # Whether the node's certificate must also name it: "ip" (the address connected to is in the certificate),
    # "dns" (the name its address resolves back to is), or "none" (any certificate of a trusted authority).
    ssl_verify_identity: str = Field(default="none", pattern=r"^(none|ip|dns)$")
    write_consistency: Consistency = Consistency.QUORUM
    read_consistency: Consistency = Consistency.QUORUM
    serial_consistency: SerialConsistency = SerialConsistency.SERIAL
    # The GC reads a whole partition before deleting shards; ALL guarantees it sees every shard even when
    # writes were acknowledged by fewer replicas. QUORUM is enough when writes are QUORUM too.
    gc_read_consistency: Consistency = Consistency.ALL
    # A takeover reads the shards of the mutator whose flush it finishes, and writes what they lack: a stale
    # read would lose events. Like the GC's, this read must overlap the writes (see overlapping_reads).
    replay_read_consistency: Consistency = Consistency.QUORUM
    # The GC's reads of the mutator registry and of each mutator's work list decide which shards it folds and
    # when a mutator is collected: a registry row or a work-list row missed there is a mutator whose shards are
    # never folded, or a live one taken for gone. Like the two above, these reads must overlap the writes,
    # whatever read_consistency serving uses.
    gc_list_consistency: Consistency = Consistency.QUORUM
    connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    request_timeout_s: float = Field(default=12.0, gt=0, le=3600)
    # Bounded in-flight requests per process, with a bounded wait for a slot (seed 003's pending queue).
    max_in_flight: int = Field(default=256, ge=1, le=32_768)
    queue_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    # Shard rows of different instances sent in one request (an unlogged batch, at most 4 KiB). Above 10,
    # Cassandra warns (unlogged_batch_across_partitions_warn_threshold): a log line a minute, and a warning
    # sent back with every such batch.
    write_batch_rows: int = Field(default=10, ge=1, le=100)
    # Rows of a bucket past its retention stay this long after its expiry before Cassandra drops them, hidden
    # from reads meanwhile: a bucket disappears whole unless clocks disagree by more than this.
    retention_grace_s: int = Field(default=3600, ge=60, le=30 * 86400)
    # The largest shard row (one key's cells of every counter that can share it) a definitions file may make,
    # judged from the definitions when they are loaded: Cassandra refuses a mutation over its max_mutation_size
    # (16 MiB by default) for good. Raise it only with Cassandra's commitlog_segment_size (twice the limit).
    max_row_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)
    connections_per_host: int = Field(default=1, ge=1, le=64)
    io_threads: int = Field(default=1, ge=1, le=32)
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    # A user name and password without TLS (ssl_enabled false) are refused unless this is true: the driver
    # sends them in the clear.
    allow_insecure: bool = False

    _split = field_validator("contact_points", mode="before")(_split_csv)

    _identity_lower = field_validator("ssl_verify_identity", mode="before")(_lower)

    @field_validator("contact_points")
    @classmethod
    def _hosts(cls, points: list[str]) -> list[str]:
        for at, point in enumerate(points, 1):
            # An IPv6 address holds two colons at least: one alone is a port (127.0.0.1:9042).
            if not _HOST.fullmatch(point) and not (_BARE_IPV6.fullmatch(point) and point.count(":") >= 2):
                raise ValueError(f"contact point {at} of {len(points)} is not a host name or an address (no port, "
                                 "user or password: the port is COUNTERSINK_CASSANDRA__PORT)")
        return points

    @model_validator(mode="after")
    def _nothing_set_in_vain(self) -> CassandraSettings:
        unused = [name for name in ("ssl_trusted_cert", "ssl_cert", "ssl_private_key") if getattr(self, name)]
        if unused and not self.ssl_enabled:
            raise ValueError(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} set but ssl_enabled is "
                             "false, so Cassandra is reached without TLS: set COUNTERSINK_CASSANDRA__SSL_ENABLED=true, "
                             "or unset them")
        if bool(self.username) != bool(self.password):
            raise ValueError(f"{'username' if self.username else 'password'} is set without "
                             f"{'password' if self.username else 'username'}: a login needs both")
        if bool(self.ssl_cert) != bool(self.ssl_private_key):
            raise ValueError("ssl_cert and ssl_private_key (the client certificate and its key) go together")
        return self

    @model_validator(mode="after")
    def _credentials_over_tls(self) -> CassandraSettings:
        if self._credentials_in_clear() and not self.allow_insecure:
            raise ValueError("a user name and password without TLS cross the network in the clear: set "
                             "COUNTERSINK_CASSANDRA__SSL_ENABLED=true (or COUNTERSINK_CASSANDRA__ALLOW_INSECURE=true "
                             "to accept that)")
        return self

    def _credentials_in_clear(self) -> bool:
        return bool(self.username or self.password) and not self.ssl_enabled

    def insecure_choices(self) -> list[tuple[str, dict[str, Any]]]:
        """What these settings give up (a log event and its fields each), for a WARNING at start."""
        choices: list[tuple[str, dict[str, Any]]] = []
        if self._credentials_in_clear():
            choices.append(("cassandra_credentials_without_tls", {"user": self.username}))
        if self.ssl_enabled and not self.ssl_verify:
            choices.append(("cassandra_certificate_not_verified", {"contact_points": list(self.contact_points)}))
        return choices

    # Keyspace and replication reach CQL text (they cannot be bound parameters): validate them up front.
    @field_validator("keyspace")
    @classmethod
    def _valid_keyspace(cls, value: str) -> str:
        try:
            return cql.check_identifier(value)
        except cql.InvalidIdentifierError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("replication")
    @classmethod
    def _valid_replication(cls, value: str) -> str:
        try:
            return cql.check_replication(value)
        except cql.InvalidIdentifierError as exc:
            raise ValueError(str(exc)) from None


class ConsumerSettings(_Section):
    """The consumer process: group, flushing, rotation, publisher-retry window, dead letters, shutdown."""

    group_id: str = Field(default="countersink", min_length=1, max_length=200)
    counters_file: Path = Path("counters.toml")
    auto_offset_reset: str = Field(default="earliest", pattern=r"^(earliest|latest)$")
    flush_interval_s: float = Field(default=1.0, gt=0, le=3600)
    # While flushes take longer than flush_interval_s / flush_spacing and a backlog remains, they start
    # flush_spacing times the last one's duration apart: fewer, larger flushes (more events in each row).
    flush_spacing: float = Field(default=10.0, ge=1, le=100)
    # also bounds what a takeover replays after a crash: the open window's instances are read and rewritten
    flush_max_dirty: int = Field(default=50_000, ge=1, le=100_000_000)
    # A mutator rotates (clean retire, fresh mutator) at this age, so the GC can fold its shards.
    mutator_max_age_s: float = Field(default=3600.0, ge=1, le=30 * 86_400)
    # Rotating frees a mutator's in-memory state; the budget bounds memory under any key cardinality.
    mutator_memory_budget_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, le=1024**4)
    # All mutators of the process together: past it, the largest rotate first.
    memory_budget_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024, le=1024**4)
    retry_window_records: int = Field(default=10_000, ge=0, le=10_000_000)
    dead_letter_topic: str = Field(default="countersink-dead-letter", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    # Partitions and replication factor of the dead-letter topic when the consumer creates it; unset, the
    # broker's num.partitions and default.replication.factor. A topic that exists is left as it is.
    dead_letter_partitions: int | None = Field(default=None, ge=1, le=100_000)
    dead_letter_replication_factor: int | None = Field(default=None, ge=1, le=32_767)
    # A dead letter the broker refuses as too large is sent again cut to this many bytes, with the reason.
    dead_letter_max_bytes: int = Field(default=512 * 1024, ge=1024, le=64 * 1_048_576)
    # Records deleted by retention before they were counted: "stop" consuming that partition (and report
    # unready) until an operator decides, or "skip" them, log and count them, and go on.
    on_records_lost: str = Field(default="stop", pattern=r"^(stop|skip)$")
    max_event_bytes: int = Field(default=1_048_576, ge=64, le=64 * 1_048_576)
    # A bucketed event whose time is further ahead of its record's Kafka timestamp is dead-lettered. Like
    # max_event_bytes, it decides what counts: every consumer of a group must use the same value.
    max_future_skew_s: int = Field(default=86_400, ge=0, le=10**12)  # 10**12: never refused for it
    max_poll_records: int = Field(default=2_000, ge=1, le=1_000_000)
    shutdown_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # How long a starting consumer waits for the servers.
    startup_timeout_s: float = Field(default=120.0, gt=0, le=86_400)
    flush_retry_max_s: float = Field(default=5.0, gt=0, le=600)
    # How often a running consumer reads the counter registry for counters dropped since it started: it writes
    # none of theirs from then on. `countersink drop` waits twice this before it deletes a counter's rows.
    registry_check_s: float = Field(default=10.0, gt=0, le=3600)
    # How long a crashed member's partitions wait before the group moves them: the floor of recovery time.
    # 6 s is the broker's default group.min.session.timeout.ms; heartbeats go every quarter of it.
    session_timeout_ms: int = Field(default=6_000, ge=1_000, le=3_600_000)
    health_port: int = Field(default=8080, ge=0, le=65535)  # 0 disables the health and metrics server
    # Where the health server listens: this host only by default; the image sets 0.0.0.0 (probes, Prometheus).
    health_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    # Topics the definitions name that do not exist: created at start (True), or waited for, unready (False).
    create_topics: bool = False
    # partitions of a topic the consumer creates
    topic_partitions: int = Field(default=3, ge=1, le=MAX_TOPIC_PARTITIONS)
    # Replicas of a topic the consumer or `topics create` creates; unset, the broker's default.replication.factor.
    topic_replication_factor: int | None = Field(default=None, ge=1, le=32_767)

    _listens = field_validator("health_host")(_listening_host)

    _choice_lower = field_validator("auto_offset_reset", "on_records_lost", mode="before")(_lower)


class GcSettings(_Section):
    """The GC worker: which mutators are final, how much it does at once, how long it keeps collected ones."""

    # A mutator is final once retired for this long. It must exceed the clock skew between any two machines
    # that run consumers or GC workers (see docs/running.md, "Running the GC").
    grace_s: float = Field(default=300.0, ge=0, le=30 * 86_400)
    # 0 runs once and exits (for cron); a positive interval runs in a loop.
    every_s: float = Field(default=0.0, ge=0, le=30 * 86_400)
    concurrency: int = Field(default=16, ge=1, le=1024)
    # Registry rows of collected mutators are deleted after this long; `explain` shows them until then.
    forget_after_s: float = Field(default=7 * 24 * 3600.0, ge=0, le=10 * 365 * 86_400)
    progress_interval_s: float = Field(default=10.0, gt=0, le=86_400)  # how often a non-interactive run logs progress
    health_port: int = Field(default=8081, ge=0, le=65535)  # the loop's metrics and health; 0 disables
    health_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)  # as the consumer's

    _listens = field_validator("health_host")(_listening_host)

    @field_validator("every_s")
    @classmethod
    def _whole_pauses(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError("a loop's interval is at least 1 s (0 runs once)")
        return v


class ServeSettings(_Section):
    """``countersink serve``: the HTTP JSON read API."""

    host: str = Field(default="0.0.0.0", min_length=1, max_length=255)  # noqa: S104 - a service listens on all
    port: int = Field(default=8082, ge=0, le=65535)
    max_keys: int = Field(default=100, ge=1, le=10_000)  # keys one multi-get may ask for
    concurrency: int = Field(default=64, ge=1, le=4096)  # Cassandra reads in flight across all requests
    request_timeout_s: float = Field(default=5.0, gt=0, le=300)
    startup_timeout_s: float = Field(default=120.0, gt=0, le=86_400)  # how long a starting server waits for Cassandra
    # HTTPS: both or neither (PEM files; the key unencrypted, readable by the server's user only).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Bearer tokens; when any is set, everything but /healthz and /readyz needs one. Several (comma-separated,
    # or one per line in the file) so that a new token can be rolled out before the old one is removed.
    tokens: SecretStr | None = None
    tokens_file: Path | None = None  # read at start and again within a second of any change
    # Tokens without TLS (tls_cert/tls_key) are refused at start unless this is set: then they cross the
    # network readable, which is only safe behind a TLS-terminating proxy on the same host.
    allow_insecure: bool = False
    max_url_bytes: int = Field(default=4096, ge=256, le=65_536)  # longer request targets answer 414
    max_header_bytes: int = Field(default=8190, ge=1024, le=65_536)  # per header line; longer ones answer 400
    max_body_bytes: int = Field(default=1024, ge=0, le=1_048_576)  # the API reads no body; larger ones answer 413
    max_requests: int = Field(default=256, ge=1, le=65_536)  # handled at once; more answer 503 at once
    # A connection that sends no complete request for this long is closed: one silent from its start, one
    # stopped inside its headers, one idle between requests (each open connection holds a file descriptor).
    idle_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # Merged states of instances read recently, answered while the partition's stamps are unchanged (each read
    # reads those alone first; countersink.state_cache); 0 turns the cache off.
    state_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0, le=64 * 1024**3)
    # How long a merge is answered from before its states are read again whatever the stamps say: a bound on
    # what a lagging replica could keep at a consistency where reads need not see acknowledged writes. At most
    # a day (a stamp lives 30 days unless written again: schemas.cql.STAMP_TTL_S).
    state_cache_max_age_s: float = Field(default=60.0, gt=0, le=86_400)
    # How stale an answer may be: a merge whose stamps a read found unchanged less than this long ago answers
    # again without reading Cassandra (a hot instance polled many times a second costs a read per this long).
    # 0, the default, checks the stamps on every read, so a read sees every flush acknowledged before it; above
    # 0 it may miss those of the last max_staleness_s seconds (and a reset of that long ago). get, explain,
    # ranges and /trace never answer stale. Keep it at or under the consumers' flush_interval_s.
    max_staleness_s: float = Field(default=0.0, ge=0, le=60)
    # Admin tokens (NAME:TOKEN, comma-separated, or one per line in the file), for the routes that change
    # something (POST /counters/{name}/reset). The name is what a reset records as who asked; the token never
    # leaves the server. They read too; a read token on an admin route answers 403.
    admin_tokens: SecretStr | None = None
    admin_tokens_file: Path | None = None  # read at start and again within a second of any change
    # The Cassandra role that may write the resets tables (the read role cannot). Unset: no admin route is
    # served. The other connection settings (contact points, TLS) are COUNTERSINK_CASSANDRA__'s.
    admin_cassandra_username: str | None = Field(default=None, min_length=1, max_length=200)
    admin_cassandra_password: SecretStr | None = None

    _listens = field_validator("host")(_listening_host)

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("HTTPS needs both tls_cert and tls_key")
        return self

    @model_validator(mode="after")
    def _admin_complete(self) -> ServeSettings:
        has_tokens = self.admin_tokens is not None or self.admin_tokens_file is not None
        if has_tokens != (self.admin_cassandra_username is not None):
            raise ValueError("admin routes need both admin tokens (admin_tokens or admin_tokens_file) and the "
                             "Cassandra role that writes resets (admin_cassandra_username): set both or neither")
        if self.admin_cassandra_password is not None and self.admin_cassandra_username is None:
            raise ValueError("admin_cassandra_password is set without admin_cassandra_username")
        return self

    @property
    def admin(self) -> bool:
        """Whether the admin routes are served."""
        return self.admin_cassandra_username is not None


class ReadSettings(_Section):
    """Range reads of bucketed counters (``countersink get --from/--to``, ``serve``'s series, the reader)."""

    max_range_buckets: int = Field(default=1000, ge=1, le=100_000)  # buckets one range read may cover
    range_concurrency: int = Field(default=32, ge=1, le=1024)  # bucket reads in flight for one range read


class SchemaRegistrySettings(_Section):
    """Where Avro, Protobuf and JSON Schema topics find their writer schemas (a Confluent-compatible API)."""

    # The API's base URL, e.g. http://127.0.0.1:8085/apis/ccompat/v7 (the stack's Apicurio) or http://host:8081
    # (Confluent, Karapace). None: only JSON topics and topics with inline schemas (schema_file) can be read.
    # Credentials go in username and password, never in the URL: it is logged and shown by /readyz.
    url: str | None = Field(default=None, pattern=r"^https?://\S+$", max_length=2000)
    # A CA bundle to trust for an https URL. When it is set, the URL must be https: a registry's answer
    # decides how every record is read, so with TLS configured it is trusted only over TLS.
    ca_file: Path | None = None
    username: str | None = None
    password: SecretStr | None = None
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    # Bounds on a schema from the registry (untrusted input): its size, before anything parses it.
    max_schema_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    # A registry that cannot be reached is waited for, unready, with backoff up to this pause.
    retry_max_s: float = Field(default=10.0, gt=0, le=600)
    # A schema id the registry did not know (404: its records are dead letters) is asked again after this long,
    # so that a schema registered after its first records were read (a registry whose followers lag) is used.
    unknown_schema_retry_s: float = Field(default=30.0, ge=0, le=86400)
    # Writer schemas kept in memory (ids come from records: a producer can name any of 2**31); past this, those
    # no record named for two minutes are dropped, and fetched again if named.
    max_cached_schemas: int = Field(default=1000, ge=10, le=1_000_000)
    # A user name and password over http are refused unless this is true: they would cross in the clear.
    allow_insecure: bool = False

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, v: str | None) -> str | None:
        # "@" anywhere, not in the host part alone: a password holding "/" ends urlsplit's host early.
        if v is not None and "@" in v:
            raise ValueError("the url holds a user name or password (user:password@host), which would be logged "
                             "with it: give them as COUNTERSINK_SCHEMA_REGISTRY__USERNAME and __PASSWORD")
        if v is not None and ("?" in v or "#" in v):
            raise ValueError("the url is the registry's base, to which countersink adds paths: give it without a "
                             "query or fragment")
        return v

    @model_validator(mode="after")
    def _tls_when_asked(self) -> SchemaRegistrySettings:
        plain_http = self.url is not None and self.url.startswith("http://")
        if self.ca_file is not None and plain_http:
            raise ValueError("ca_file is set, so the registry is trusted only over TLS: its url must be https://")
        if plain_http and (self.username or self.password) and not self.allow_insecure:
            raise ValueError("a user name and password over http cross the network in the clear: use an https:// "
                             "url (or COUNTERSINK_SCHEMA_REGISTRY__ALLOW_INSECURE=true to accept that)")
        return self


class OptionRefusedError(CountersinkError):
    """A command-line option whose value its setting refuses (the line names the option)."""


_SectionT = TypeVar("_SectionT", bound=_Section)


def given_options(args: Any, *options: tuple[str, str, str]) -> dict[str, tuple[str, Any]]:
    """``{field: (option, value)}`` for each ``(field, option, attribute of args)`` the command line gave (not
    None, and not False for a flag): what :func:`with_options` takes."""
    given = ((field, option, getattr(args, attribute)) for field, option, attribute in options)
    return {field: (option, value) for field, option, value in given if value is not None and value is not False}


def with_options(section: _SectionT, options: dict[str, tuple[str, Any]]) -> _SectionT:
    """``section`` with the values options give (``{field: (option, value)}``), each checked as its variable
    would be: a value the setting refuses raises :class:`OptionRefusedError` naming the option, never echoed."""
    try:
        return type(section).model_validate({**dict(section), **{f: v for f, (_, v) in options.items()}})
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = str(problem["loc"][0]) if problem["loc"] else ""
        option = options[field][0] if field in options else field
        raise OptionRefusedError(f"{option}: {problem['msg'].removeprefix('Value error, ')}") from None


class Settings(BaseSettings):
    """Settings shared by every countersink process."""

    model_config = SettingsConfigDict(
        env_prefix="COUNTERSINK_", env_nested_delimiter="__", env_file=".env", extra="ignore", frozen=True,
        # A variable set to "" is unset (its default), as templated manifests leave a value they do not fill.
        env_ignore_empty=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    cassandra: CassandraSettings = Field(default_factory=CassandraSettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    gc: GcSettings = Field(default_factory=GcSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    read: ReadSettings = Field(default_factory=ReadSettings)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    log_format: str = Field(default="auto", pattern=r"^(auto|json|console)$")
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    # https://no-color.org: the cross-tool NO_COLOR variable (no prefix); set and not empty, console logs are plain.
    no_color_variable: str = Field(default="", validation_alias="NO_COLOR", max_length=1000)
    _env_paths: list[Path] = PrivateAttr(default_factory=list)  # the .env files read

    def __init__(self, **values: Any) -> None:
        # A misspelt variable would otherwise fall back to its default in silence: refuse it, as a bad value is.
        env_file = values.get("_env_file", self.model_config.get("env_file"))
        # A .env another user could write may turn checks off or point the process, with its password, at
        # another server: refused before it is read.
        problems = [("untrusted_settings_file", name, problem) for name, problem in untrusted_env_files(
            _env_files(env_file))]
        if not problems:
            problems = [("unknown_setting", name[len(PREFIX):], problem)
                        for name, problem in unknown_variables(os.environ, _dotenv_names(env_file))]
        if not problems:
            problems = [("empty_guard", name[len(PREFIX):], problem)
                        for name, problem in empty_guards(os.environ, _dotenv_values(env_file))]
        if problems:
            raise ValidationError.from_exception_data("Settings", [
                InitErrorDetails(type=PydanticCustomError(kind, problem), loc=(where,), input=None)
                for kind, where, problem in problems])
        super().__init__(**values)
        self._env_paths = _env_files(env_file)

    @property
    def no_color(self) -> bool:
        return bool(self.no_color_variable)

    def insecure_choices(self) -> list[tuple[str, dict[str, Any]]]:
        """Every security the settings give up, each a WARNING log event and its fields: credentials sent
        without TLS (allowed by ``allow_insecure``), a certificate or host name unchecked, a file of secrets
        that other users may read."""
        return [*self.kafka.insecure_choices(), *self.cassandra.insecure_choices(), *self._readable_secrets()]

    def _readable_secrets(self) -> list[tuple[str, dict[str, Any]]]:
        # Warned of, not refused (as a .env others may write is): the process still runs as configured, but
        # anyone on the host who reads the file holds what it guards. A Kubernetes Secret mounted as a file is
        # 0644 unless its volume's defaultMode says otherwise.
        files = [(".env", path) for path in self._env_paths if _holds_secrets(path)]
        files += [(f"{PREFIX}{section.upper()}__{name.upper()}", path) for section, name, path in (
            ("kafka", "ssl_keyfile", self.kafka.ssl_keyfile),
            ("cassandra", "ssl_private_key", self.cassandra.ssl_private_key),
            ("serve", "tls_key", self.serve.tls_key), ("serve", "tokens_file", self.serve.tokens_file),
            ("serve", "admin_tokens_file", self.serve.admin_tokens_file)) if path is not None]
        choices = []
        for setting, path in files:
            try:
                mode = Path(path).stat().st_mode
            except OSError:
                continue  # not there: the setting's own check says so
            if mode & 0o044:
                choices.append(("secret_file_readable_by_others", {
                    "setting": setting, "path": str(path), "mode": f"{mode & 0o777:o}", "fix": f"chmod go-r {path}"}))
        return choices

    # Names of levels and formats are accepted in any case: COUNTERSINK_LOG_LEVEL=debug.
    _level_upper = field_validator("log_level", mode="before")(_upper)
    _format_lower = field_validator("log_format", mode="before")(_lower)


PREFIX = "COUNTERSINK_"

# Variables of the project's own tools that share the prefix but are not settings of any process, so that a
# developer's shell may hold them while running countersink (docs/settings.md, "Not settings").
NOT_SETTINGS = frozenset({
    "COUNTERSINK_TEST_KAFKA",  # tests: the Kafka to test against (tests/conftest.py)
    "COUNTERSINK_TEST_CASSANDRA",  # tests: the Cassandra to test against
    "COUNTERSINK_TEST_SERVERS",  # tests: how to start servers (auto, stack, testcontainers)
    "COUNTERSINK_TEST_SECURE_STACK",  # tests: the stack.json of a running secured stack
    "COUNTERSINK_TEST_SCHEMA_REGISTRY",  # tests: the schema registry (URL) to test against
    "COUNTERSINK_CACHE_DIR",  # stack/: where downloaded server releases are kept
    "COUNTERSINK_STACK_DIR",  # stack/: data and logs of the local servers
    "COUNTERSINK_STACK_KAFKA_PORT",  # stack/: ports and size of the local servers
    "COUNTERSINK_STACK_KAFKA_CONTROLLER_PORT",
    "COUNTERSINK_STACK_CASSANDRA_PORT",
    "COUNTERSINK_STACK_CASSANDRA_NODES",
    "COUNTERSINK_STACK_SCHEMA_REGISTRY_PORT",
})


def setting_variables() -> frozenset[str]:
    """Every variable that sets a setting: ``COUNTERSINK_SECTION__NAME``, or ``COUNTERSINK_NAME`` at the top."""
    names = set()
    for name, field in Settings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            names |= {f"{PREFIX}{name.upper()}__{inner.upper()}" for inner in model.model_fields}
        elif field.validation_alias is None:  # NO_COLOR has no prefix
            names.add(f"{PREFIX}{name.upper()}")
    return frozenset(names)


def _sections() -> frozenset[str]:
    return frozenset(name for name, field in Settings.model_fields.items()
                     if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel))


def _example_of(section: str) -> str:
    model: Any = Settings.model_fields[section].annotation
    return f"{PREFIX}{section.upper()}__{next(iter(model.model_fields)).upper()}"


def unknown_variables(environ: Mapping[str, str], dotenv: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(name, problem)`` for each prefixed variable (of the environment, then of ``.env``) that is neither a
    setting nor one of :data:`NOT_SETTINGS`; the problem names the nearest setting. Values are never read."""
    known = setting_variables()
    sections = _sections()
    problems = []
    for source, names in (("", environ), (" (in .env)", dotenv)):
        for name in sorted(names):
            upper = name.upper()  # variables are read in any case
            if upper.startswith(PREFIX) and upper not in known and upper not in NOT_SETTINGS:
                section = upper[len(PREFIX):].lower()
                nearest = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
                hint = f"; did you mean {nearest[0]}?" if nearest else " (docs/settings.md lists them)"
                if section in sections:  # a whole section in one variable (pydantic-settings' JSON form)
                    hint = (f": a section is set one variable per setting ({upper}__NAME, "
                            f"{_example_of(section)} for one), not as a whole")
                problems.append((name, f"not a setting{source}{hint}"))
    return problems


def _env_files(env_file: Any) -> list[Path]:
    files = [env_file] if isinstance(env_file, str | Path) else list(env_file or ())
    return [Path(path) for path in files if Path(path).is_file()]


def untrusted_env_files(files: Iterable[Path]) -> list[tuple[str, str]]:
    """``(path, problem)`` for each settings file that another user owns or may write (group or others)."""
    problems = []
    for path in files:
        status = path.stat()
        if status.st_uid != os.geteuid():
            problems.append((str(path), f"is owned by another user (uid {status.st_uid}); "
                                                 "settings are read only from a file this user owns"))
        elif status.st_mode & 0o022:
            problems.append((str(path), f"may be written by other users (mode "
                                                 f"{status.st_mode & 0o777:o}); chmod go-w {path}"))
    return problems


# Settings whose values are secrets: a .env holding one of them is a file of secrets.
_SECRET_NAMES = ("PASSWORD", "SECRET", "TOKENS")


def _holds_secrets(path: Path) -> bool:
    from dotenv import dotenv_values

    return any(value and any(word in name.upper() for word in _SECRET_NAMES)
               for name, value in dotenv_values(path).items())


def _dotenv_names(env_file: Any) -> list[str]:
    return list(_dotenv_values(env_file))


def _dotenv_values(env_file: Any) -> dict[str, str | None]:
    from dotenv import dotenv_values

    return {name: value for path in _env_files(env_file) for name, value in dotenv_values(path).items()}


# Settings whose absence opens what they guard: serve answers without tokens when none is set. An empty variable
# is otherwise unset (env_ignore_empty); for these it is a secret that did not arrive (a manifest's
# ${SERVE_TOKENS} with its variable missing), refused rather than served without tokens.
GUARDS = ("COUNTERSINK_SERVE__TOKENS", "COUNTERSINK_SERVE__TOKENS_FILE", "COUNTERSINK_SERVE__ADMIN_TOKENS",
          "COUNTERSINK_SERVE__ADMIN_TOKENS_FILE")


def empty_guards(environ: Mapping[str, str], dotenv: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """``(name, problem)`` for each of :data:`GUARDS` set (in the environment, or else in ``.env``) to nothing
    but blanks. The value is never quoted: it is blank."""
    # Variables are read in any case (countersink_serve__tokens sets SERVE__TOKENS): compared in capitals.
    environ = {name.upper(): value for name, value in environ.items()}
    dotenv = {name.upper(): value for name, value in dotenv.items()}
    problems = []
    for name in GUARDS:
        if name not in environ and name not in dotenv:
            continue
        value = environ[name] if name in environ else dotenv[name]
        if value is None or not value.strip():  # a bare NAME line in .env is None: unset by pydantic-settings too
            problems.append((name, "is set but empty: a secret that did not arrive; serve would answer without "
                                   "tokens. Unset it to serve without tokens"))
    return problems
