"""Kafka clients built from :class:`~countersink.settings.KafkaSettings` (TLS and SASL included)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)

from countersink import kafka_records
from countersink.kafka_oauth import ClientCredentialsTokens, TokenEndpointError
from countersink.logs import get_logger
from countersink.retry import Backoff, is_retriable, retrying
from countersink.settings import KafkaSecurity, KafkaSettings
from countersink.tls import load_key_pair
from schemas.errors import CountersinkError


class KafkaSecurityError(CountersinkError):
    """Raised when Kafka refuses the connection for a reason retrying cannot fix: a certificate that does not
    verify or does not name the host, a missing client certificate, refused SASL credentials."""


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """A verifying TLS context when the protocol uses TLS, else None. An unreadable certificate or key file
    raises :class:`KafkaSecurityError` naming the setting."""
    if settings.security_protocol not in (KafkaSecurity.SSL, KafkaSecurity.SASL_SSL):
        return None
    try:
        context = ssl.create_default_context(cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None)
    except (OSError, ssl.SSLError) as exc:
        raise KafkaSecurityError(f"COUNTERSINK_KAFKA__SSL_CAFILE: cannot use {settings.ssl_cafile}: {_reason(exc)}"
                                 ) from None
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_certfile:
        try:
            load_key_pair(context, settings.ssl_certfile, settings.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(f"COUNTERSINK_KAFKA__SSL_CERTFILE/__SSL_KEYFILE: cannot use "
                                     f"{settings.ssl_certfile}: {_reason(exc)}") from None
    return context


class KafkaUnavailableError(CountersinkError):
    """Raised when no bootstrap server answered and none refused us for good: retry later."""

    retriable = True


async def start_admin(settings: KafkaSettings) -> AIOKafkaAdminClient:
    """A started admin client; a refusal raises :class:`KafkaSecurityError`, no answer
    :class:`KafkaUnavailableError` (both one line for a command to print)."""
    admin = make_admin(settings)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        await admin.close()
        await explain_refusal(settings)
        raise KafkaUnavailableError(f"cannot reach Kafka at {','.join(settings.bootstrap_servers)}: {exc}") from exc
    return admin


def _reason(exc: BaseException) -> str:
    return getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or getattr(
        exc, "strerror", None) or str(exc)


async def explain_refusal(settings: KafkaSettings, timeout_s: float = 5.0) -> None:
    """After a client could not bootstrap: raise :class:`KafkaSecurityError` when the first bootstrap server
    refuses us for a reason retrying cannot fix; return quietly when it is simply away (or answers now).

    aiokafka reports every failed bootstrap as one retriable "Unable to bootstrap" and keeps the cause in a
    log line; this asks again, once, with a single connection that raises the cause itself."""
    host, _, port_text = settings.bootstrap_servers[0].rpartition(":")
    where = settings.bootstrap_servers[0]
    options = connection_options(settings)
    try:
        async with asyncio.timeout(timeout_s):
            connection = await create_conn(
                host, int(port_text), client_id=settings.client_id, ssl_context=options.get("ssl_context"),
                security_protocol=options["security_protocol"], request_timeout_ms=settings.request_timeout_ms,
                sasl_mechanism=options.get("sasl_mechanism") or "PLAIN",
                sasl_plain_username=options.get("sasl_plain_username"),
                sasl_plain_password=options.get("sasl_plain_password"),
                sasl_oauth_token_provider=options.get("sasl_oauth_token_provider"))
            connection.close()
    except ssl.SSLCertVerificationError as exc:
        raise KafkaSecurityError(f"TLS with Kafka at {where} failed: {_reason(exc)} (check "
                                 "COUNTERSINK_KAFKA__SSL_CAFILE and the server's certificate)") from None
    except KafkaConnectionError:
        if options.get("ssl_context") is not None and await _client_certificate_refused(host, int(port_text),
                                                                                         options["ssl_context"]):
            if settings.ssl_certfile is None:
                raise KafkaSecurityError(f"Kafka at {where} requires a client certificate (set "
                                         "COUNTERSINK_KAFKA__SSL_CERTFILE and __SSL_KEYFILE)") from None
            raise KafkaSecurityError(f"Kafka at {where} refused the client certificate {settings.ssl_certfile} "
                                     "(is it signed by an authority the broker trusts?)") from None
    except TokenEndpointError as exc:
        # No token, so no login: the endpoint's refusal says what to check, and an endpoint that is away is
        # said too (the caller's "cannot reach Kafka" would point at the wrong server).
        if not exc.retriable:
            raise KafkaSecurityError(exc.args[0] if exc.args else str(exc)) from None
        get_logger(__name__).warning("kafka_token_endpoint_unavailable", error=exc.args[0] if exc.args else str(exc))
    except KafkaError as exc:
        if settings.oauth and not exc.retriable:
            raise KafkaSecurityError(
                f"Kafka at {where} refused the OAUTHBEARER token of client {settings.sasl_oauth_client_id!r}: "
                f"{exc.description if hasattr(exc, 'description') else exc} (check the broker's token validation "
                "and COUNTERSINK_KAFKA__SASL_OAUTH_CLIENT_ID and __SASL_OAUTH_SCOPE)") from None
        if not exc.retriable:
            raise KafkaSecurityError(f"Kafka at {where} refused the SASL login of user {settings.sasl_username!r}: "
                                     f"{exc.description if hasattr(exc, 'description') else exc} (check "
                                     "COUNTERSINK_KAFKA__SASL_USERNAME, __SASL_PASSWORD and __SASL_MECHANISM)"
                                     ) from None
    except (OSError, TimeoutError):
        return


async def _client_certificate_refused(host: str, port: int, context: ssl.SSLContext) -> bool:
    """True when the server ends a TLS session at once with a 'bad certificate' or 'certificate required'
    alert: in TLS 1.3 the client hears of it only after the handshake, on its first read."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), 5)
    except (OSError, TimeoutError):
        return False
    try:
        await asyncio.wait_for(reader.read(1), 2)
    except ssl.SSLError as exc:
        return any(alert in str(exc) for alert in ("BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE"))
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return False


def connection_options(settings: KafkaSettings) -> dict[str, Any]:
    """Options every aiokafka client takes: servers, client id, security."""
    options: dict[str, Any] = {
        "bootstrap_servers": list(settings.bootstrap_servers),
        "client_id": settings.client_id,
        "security_protocol": str(settings.security_protocol),
        "request_timeout_ms": settings.request_timeout_ms,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.oauth:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_oauth_token_provider"] = ClientCredentialsTokens(settings)
    elif settings.sasl_mechanism:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    return options


def make_client(settings: KafkaSettings) -> AIOKafkaClient:
    """A bare client, for requests aiokafka's consumer, producer and admin client do not send (its ``send``)."""
    return AIOKafkaClient(**connection_options(settings))


def make_producer(settings: KafkaSettings, **overrides: Any) -> AIOKafkaProducer:
    """An idempotent producer (acks=all), so its own retries never duplicate a record."""
    options = {"enable_idempotence": True, "acks": "all", "linger_ms": 5, **overrides}
    return AIOKafkaProducer(**connection_options(settings), **options)


def make_consumer(settings: KafkaSettings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    """A consumer whose fetches read a record with a header name that is not UTF-8 (see
    :mod:`countersink.kafka_records`) instead of failing on it."""
    kafka_records.install()
    return AIOKafkaConsumer(*topics, **connection_options(settings), **overrides)


def known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's position in ``tp`` (the next offset it fetches, past transaction markers and aborted
    records), or None while it has none or ``tp`` is not assigned; unlike awaiting ``position()``, never waits
    for one: a caller that must not wait while an offset is reset calls this.

    Runs the public ``position()`` up to its first wait only: with a valid position it returns without
    waiting, so one step of the coroutine gives the answer; a coroutine that would wait is closed instead.
    (``tests/integration/test_kafka_positions.py`` holds the newest aiokafka to that.)"""
    if tp not in consumer.assignment():
        return None
    step = consumer.position(tp)
    try:
        step.send(None)
    except StopIteration as done:
        return int(done.value)
    except IllegalStateError:  # unassigned since: the same answer as above
        return None
    step.close()
    return None


def make_admin(settings: KafkaSettings) -> AIOKafkaAdminClient:
    options = connection_options(settings)
    options.pop("client_id")
    return AIOKafkaAdminClient(**options, client_id=f"{settings.client_id}-admin")


async def broker_topic_defaults(admin: AIOKafkaAdminClient) -> tuple[int, int]:
    """The partitions and replication factor a broker gives a topic created without them (``num.partitions``,
    ``default.replication.factor``). Asked of the broker, because aiokafka's CreateTopics request predates the
    protocol version that lets the broker fill them in."""
    broker = min(int(b["node_id"]) for b in (await admin.describe_cluster())["brokers"])
    wanted = {"num.partitions": None, "default.replication.factor": None}
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(broker), wanted)])
    values = {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
    return int(values.get("num.partitions") or 1), int(values.get("default.replication.factor") or 1)


async def cleanup_policies(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, str]:
    """Each existing topic's ``cleanup.policy`` as the broker reports it (its own or the broker default)."""
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = await start_admin(settings)
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None}) for topic in wanted])
    finally:
        await admin.close()
    policies: dict[str, str] = {}
    for response in responses:
        # resources: (error code, error message, resource type, name, [(config name, value, ...), ...])
        for code, message, _type, name, entries in response.resources:
            if code:
                error = for_code(code)
                raise error(f"cannot read the configuration of topic {name}: {message or error.description}")
            for entry in entries:
                if entry[0] == "cleanup.policy":
                    policies[name] = str(entry[1])
    return policies


async def ensure_topics(settings: KafkaSettings, topics: dict[str, int | None], replication: int | None = 1, *,
                        configs: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Create topics that do not exist yet, with the given partition counts and replication factor; None takes
    the broker's default. ``configs`` gives some of them topic settings (``cleanup.policy``). A topic that exists
    is left as it is."""
    admin = make_admin(settings)
    try:
        await admin.start()
    except KafkaConnectionError:
        await admin.close()
        await explain_refusal(settings)
        raise
    try:
        existing = set(await admin.list_topics())
        todo = {name: count for name, count in topics.items() if name not in existing}
        if todo and (replication is None or None in todo.values()):
            default_count, default_replication = await broker_topic_defaults(admin)
            replication = replication or default_replication
            todo = {name: count or default_count for name, count in todo.items()}
        missing = [NewTopic(name, count, replication, topic_configs=dict((configs or {}).get(name, {})))
                   for name, count in todo.items()]
        if missing:
            raise_topic_errors(await admin.create_topics(missing))
            await _until_listed(admin, [topic.name for topic in missing], settings.request_timeout_ms / 1000)
    finally:
        await admin.close()


async def _until_listed(admin: AIOKafkaAdminClient, topics: list[str], timeout_s: float) -> None:
    """Wait until the broker answering metadata lists ``topics``. A topic's creation is answered once the
    controller has recorded it, and a broker may learn of it a moment later: until then a reset or a producer
    asking that broker finds no partition of it. A topic still unlisted after ``timeout_s`` is left to the
    caller's own look-up, which says what it misses. So is a listing that fails as a broker away or slow does:
    the topics are created, and a listing is no reason to refuse to start."""

    def retried(error: BaseException) -> bool:
        return isinstance(error, _NotListedYetError) or is_retriable(error)

    async def listed() -> None:
        if not set(topics) <= set(await admin.list_topics()):
            raise _NotListedYetError

    try:
        await retrying(listed, backoff=_LISTING_BACKOFF, deadline_s=timeout_s, retry_on=retried)
    except Exception as exc:
        if not retried(exc):
            raise


class _NotListedYetError(Exception):
    """A topic just created is not listed yet (``_until_listed``)."""


_LISTING_BACKOFF = Backoff(first_s=0.02, max_s=0.5)


def raise_topic_errors(response: Any) -> None:
    """Raise the Kafka error of the first topic a CreateTopics ``response`` refused, naming the topic and the
    broker's reason: aiokafka returns them per topic rather than raising."""
    for topic, code, *message in response.topic_errors:
        # Another process may create the same topic between our listing and our request: that is fine.
        # Anything else (a replication factor above the broker count, a policy) is said, not ignored.
        if code and code != TopicAlreadyExistsError.errno:
            error = for_code(code)
            raise error(f"cannot create topic {topic}: {message[0] if message else error.description}")


async def topic_partitions(settings: KafkaSettings, producer: AIOKafkaProducer, topics: Iterable[str]
                           ) -> list[tuple[str, int]]:
    """Every partition Kafka knows of ``topics``, as (topic, partition) in order; none of a topic that does not
    exist. The topics are listed first: the producer's own look-up of a topic that does not exist asks the
    brokers again and again for its whole request timeout (30 s by default) before saying so."""
    wanted = list(dict.fromkeys(topics))
    missing = set(await missing_topics(settings, wanted))
    found: list[tuple[str, int]] = []
    for topic in wanted:
        if topic not in missing:
            try:
                numbers = await producer.partitions_for(topic)
            except UnknownTopicOrPartitionError:  # deleted since it was listed
                numbers = set()
            found.extend((topic, p) for p in sorted(numbers or ()))
    return found


async def missing_topics(settings: KafkaSettings, topics: Iterable[str]) -> list[str]:
    """The topics of ``topics`` that do not exist, sorted."""
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    return sorted(set(topics) - existing)
