"""Kafka clients built from :class:`~countersink.settings.KafkaSettings` (TLS and SASL included)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from countersink.settings import KafkaSecurity, KafkaSettings


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """A verifying TLS context when the protocol uses TLS, else None."""
    if settings.security_protocol not in (KafkaSecurity.SSL, KafkaSecurity.SASL_SSL):
        return None
    context = ssl.create_default_context(cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None)
    context.check_hostname = settings.ssl_check_hostname
    if settings.ssl_certfile:
        context.load_cert_chain(str(settings.ssl_certfile), str(settings.ssl_keyfile) if settings.ssl_keyfile else None)
    return context


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
    if settings.sasl_mechanism:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value() if settings.sasl_password else None
    return options


def make_producer(settings: KafkaSettings, **overrides: Any) -> AIOKafkaProducer:
    """An idempotent producer (acks=all), so its own retries never duplicate a record."""
    options = {"enable_idempotence": True, "acks": "all", "linger_ms": 5, **overrides}
    return AIOKafkaProducer(**connection_options(settings), **options)


def make_consumer(settings: KafkaSettings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(*topics, **connection_options(settings), **overrides)


def known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's position in ``tp`` (the next offset it fetches, past transaction markers and aborted
    records), or None while it has none; unlike ``position()``, never waits for one. Reads the client's
    subscription state: ``position()`` would block a caller that must not wait while an offset is reset."""
    subscription = consumer._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None or tp not in assignment.tps:
        return None
    state = assignment.state_value(tp)
    return int(state.position) if state.has_valid_position else None


def make_admin(settings: KafkaSettings) -> AIOKafkaAdminClient:
    options = connection_options(settings)
    options.pop("client_id")
    return AIOKafkaAdminClient(**options, client_id=f"{settings.client_id}-admin")


async def ensure_topics(settings: KafkaSettings, topics: dict[str, int], replication: int = 1) -> None:
    """Create topics that do not exist yet, with the given partition counts."""
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, count, replication) for name, count in topics.items() if name not in existing]
        if missing:
            # Another process may create the same topic between our listing and our request.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(missing)
    finally:
        await admin.close()


async def missing_topics(settings: KafkaSettings, topics: Iterable[str]) -> list[str]:
    """The topics of ``topics`` that do not exist, sorted."""
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    return sorted(set(topics) - existing)
