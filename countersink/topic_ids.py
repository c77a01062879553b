"""Which topic a name stands for: Kafka's topic ids, and the one a keyspace counted.

A topic deleted and created again under its name starts its offsets at 0 again. countersink keeps its
positions in Cassandra (the ``partitions`` rows), not in Kafka: a consumer taking such a partition over went on
from where the old topic's counting stopped, and the new topic's records up to that offset were never counted,
with nothing to say so. Kafka gives every topic an id of its own (Metadata v10 on, Kafka 2.8 and later): the
keyspace records the id of each topic it counts the first time a consumer claims one of its partitions
(``topic_ids``, an LWT: every consumer then compares with that one), and a claim or a flush that finds Kafka's id
changed stops the partition instead of counting on (``consumer.ownership``).

aiokafka speaks Metadata up to v5, which has no ids: :class:`TopicIdsRequest` is Metadata v10 to v12 in its
protocol types, sent by a client of its own (:class:`KafkaTopicIds`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection
from io import BytesIO
from typing import Any, Protocol, TypeAlias

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Schema, TaggedFields

from countersink.cassandra import CassandraClient, as_dicts
from countersink.kafka import make_client
from countersink.logs import get_logger
from countersink.settings import KafkaSettings
from schemas.errors import CountersinkError

log = get_logger(__name__)

_NO_ID = uuid.UUID(int=0)  # Kafka's Uuid.ZERO: the id of a topic it does not know
_UNKNOWN_TOPIC_OR_PARTITION = 3


class _Uuid(AbstractType[uuid.UUID]):  # type: ignore[misc]
    """Kafka's ``uuid`` field: 16 bytes, most significant first."""

    @classmethod
    def encode(cls, value: uuid.UUID) -> bytes:
        return value.bytes

    @classmethod
    def decode(cls, data: BytesIO) -> uuid.UUID:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("Buffer underrun decoding a uuid")
        return uuid.UUID(bytes=raw)


_BROKERS = ("brokers", CompactArray(("node_id", Int32), ("host", CompactString("utf-8")), ("port", Int32),
                                    ("rack", CompactString("utf-8")), ("tags", TaggedFields)))
_PARTITIONS = ("partitions", CompactArray(
    ("error_code", Int16), ("partition_index", Int32), ("leader_id", Int32), ("leader_epoch", Int32),
    ("replica_nodes", CompactArray(Int32)), ("isr_nodes", CompactArray(Int32)),
    ("offline_replicas", CompactArray(Int32)), ("tags", TaggedFields)))
_TOPICS = ("topics", CompactArray(
    ("error_code", Int16), ("name", CompactString("utf-8")), ("topic_id", _Uuid), ("is_internal", Boolean),
    _PARTITIONS, ("topic_authorized_operations", Int32), ("tags", TaggedFields)))


class TopicIdsResponse_v10(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(("throttle_time_ms", Int32), _BROKERS, ("cluster_id", CompactString("utf-8")),
                    ("controller_id", Int32), _TOPICS, ("cluster_authorized_operations", Int32),
                    ("tags", TaggedFields))


class TopicIdsResponse_v11(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 11
    SCHEMA = Schema(("throttle_time_ms", Int32), _BROKERS, ("cluster_id", CompactString("utf-8")),
                    ("controller_id", Int32), _TOPICS, ("tags", TaggedFields))


class TopicIdsResponse_v12(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = TopicIdsResponse_v11.SCHEMA


_REQUESTED_TOPICS = ("topics", CompactArray(("topic_id", _Uuid), ("name", CompactString("utf-8")),
                                            ("tags", TaggedFields)))


class TopicIdsRequest_v10(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 10
    RESPONSE_TYPE = TopicIdsResponse_v10
    SCHEMA = Schema(_REQUESTED_TOPICS, ("allow_auto_topic_creation", Boolean),
                    ("include_cluster_authorized_operations", Boolean),
                    ("include_topic_authorized_operations", Boolean), ("tags", TaggedFields))


class TopicIdsRequest_v11(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 11
    RESPONSE_TYPE = TopicIdsResponse_v11
    SCHEMA = Schema(_REQUESTED_TOPICS, ("allow_auto_topic_creation", Boolean),
                    ("include_topic_authorized_operations", Boolean), ("tags", TaggedFields))


class TopicIdsRequest_v12(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = TopicIdsResponse_v12
    SCHEMA = TopicIdsRequest_v11.SCHEMA


TopicIdsRequestStruct: TypeAlias = TopicIdsRequest_v10 | TopicIdsRequest_v11 | TopicIdsRequest_v12


class TopicIdsRequest(Request[TopicIdsRequestStruct]):  # type: ignore[misc]
    """Metadata of some topics, by name, at the highest of v10 to v12 the broker takes; never creates one."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[TopicIdsRequestStruct]) -> TopicIdsRequestStruct:
        topics: list[tuple[uuid.UUID, str, dict[int, bytes]]] = [(_NO_ID, name, {}) for name in self._topics]
        if request_struct_class.API_VERSION == 10:
            return request_struct_class(topics, False, False, False, {})
        return request_struct_class(topics, False, False, {})


class KafkaTopicIds:
    """:func:`kafka_topic_ids` through a client of its own (aiokafka's consumers keep theirs private), made at
    the first question and closed by :meth:`close`."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._client: AIOKafkaClient | None = None
        self._making = asyncio.Lock()  # the takeovers of a rebalance ask at once: one client for all

    async def __call__(self, topics: list[str]) -> dict[str, uuid.UUID | None]:
        async with self._making:
            if self._client is None:
                client = make_client(self._settings)
                try:
                    await client.bootstrap()
                except BaseException:
                    await client.close()
                    raise
                self._client = client
        return await kafka_topic_ids(self._client, topics)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


class TopicIdsUnsupportedError(CountersinkError):
    """The broker answers no Metadata request of version 10 or later (Kafka before 2.8): topics have no ids."""


async def kafka_topic_ids(client: AIOKafkaClient, topics: list[str]) -> dict[str, uuid.UUID | None]:
    """Kafka's id of each topic, None for one it does not know (deleted, or not created yet). Raises
    :class:`TopicIdsUnsupportedError` when the broker has no topic ids, and aiokafka's errors (retriable ones
    among them) for a request that fails."""
    node = client.get_random_node()
    if node is None:
        await client.force_metadata_update()
        node = client.get_random_node()
    try:
        answer: Any = await client.send(node, TopicIdsRequest(sorted(set(topics))))
    except NotImplementedError as exc:  # no version of ours within the broker's range
        raise TopicIdsUnsupportedError(f"the broker has no topic ids: {exc}") from exc
    ids: dict[str, uuid.UUID | None] = dict.fromkeys(topics)
    for error_code, name, topic_id, *_ in answer.topics:
        if error_code == 0:
            # A broker of a cluster on ZooKeeper whose inter-broker protocol predates topic ids (an upgrade half
            # done) answers the zero id: no id yet, as for a topic it does not know.
            ids[name] = None if topic_id == _NO_ID else topic_id
        elif error_code != _UNKNOWN_TOPIC_OR_PARTITION:
            raise for_code(error_code)(f"metadata of topic {name!r}")
    return ids


class TopicRecreatedError(CountersinkError):
    """A topic's name stands for another topic than the one the keyspace counted (deleted and created again)."""

    def __init__(self, topic: str, counted: uuid.UUID, now: uuid.UUID | None) -> None:
        what = "no longer exists" if now is None else f"is now another topic (id {now})"
        super().__init__(
            f"topic {topic!r} {what}: this keyspace counted the topic of id {counted}. A topic deleted and created "
            f"again starts its offsets over, and counting it on from where the old one stopped would skip its "
            f"first records; its partitions are not consumed. Count the new topic with a new consumer group and "
            f"keyspace, or under a new name")
        self.topic, self.counted, self.now = topic, counted, now


class TopicCheck(Protocol):
    """Whether topics still are the ones a keyspace counted."""

    async def changed(self, topics: Collection[str], within_s: float | None = None) -> dict[str, TopicRecreatedError]:
        """The topics among ``topics`` whose name now stands for another topic, each with its error; raises
        :class:`TimeoutError` when that takes more than ``within_s``."""
        ...

    async def close(self) -> None:
        """Close what it asks Kafka through."""
        ...


class NoTopicChecks:
    """Every topic taken for the one counted: the protocol model's in-memory store has no Kafka ids."""

    async def changed(self, topics: Collection[str], within_s: float | None = None) -> dict[str, TopicRecreatedError]:
        return {}

    async def close(self) -> None:
        pass


NO_TOPIC_CHECKS = NoTopicChecks()


class TopicIds:
    """The ids of the topics a consumer counts: Kafka's now, against the one the keyspace recorded first.

    ``kafka_ids`` asks Kafka (:class:`KafkaTopicIds`). The recorded id of a topic
    never changes once written, so this keeps it; Kafka's is asked every time."""

    def __init__(self, kafka_ids: KafkaTopicIds, client: CassandraClient, recorded_by: str | None) -> None:
        """``recorded_by`` None: only compares (a reader's role may not write), a topic not recorded unchanged."""
        self._kafka_ids, self._client, self._recorded_by = kafka_ids, client, recorded_by
        self._recorded: dict[str, uuid.UUID] = {}
        self.unsupported = False  # the broker has no topic ids: nothing is checked (logged once)

    async def changed(self, topics: Collection[str], within_s: float | None = None) -> dict[str, TopicRecreatedError]:
        """The topics among ``topics`` whose name now stands for another topic than the one recorded, each
        with its error; a topic not recorded yet is recorded with Kafka's id. A topic Kafka does not know now
        (deleted, not created again yet) is not changed: what was read of it was the recorded one's."""
        if self.unsupported or not topics:
            return {}
        async with asyncio.timeout(within_s):
            return await self._changed(topics)

    async def _changed(self, topics: Collection[str]) -> dict[str, TopicRecreatedError]:
        try:
            now = await self._kafka_ids(sorted(set(topics)))
        except TopicIdsUnsupportedError as exc:
            self.unsupported = True
            log.warning("topic_ids_unsupported", error=str(exc),
                        hint="a topic deleted and created again under its name is not noticed (Kafka 2.8 or later "
                             "gives topics ids)")
            return {}
        changed: dict[str, TopicRecreatedError] = {}
        for topic, kafka_id in now.items():
            if kafka_id is None:
                continue
            recorded = self._recorded.get(topic) or await self._record(topic, kafka_id)
            if recorded is not None and recorded != kafka_id:
                changed[topic] = TopicRecreatedError(topic, recorded, kafka_id)
        return changed

    async def close(self) -> None:
        await self._kafka_ids.close()

    async def _record(self, topic: str, kafka_id: uuid.UUID) -> uuid.UUID | None:
        """The id recorded for ``topic``: ``kafka_id`` if none was. An LWT: every consumer of the keyspace then
        compares with the same id; retried after a lost answer, it finds its own row. Only compared: the id
        recorded, None if none is."""
        if self._recorded_by is None:
            read = as_dicts(await self._client.execute("SELECT topic_id FROM topic_ids WHERE topic = ?", [topic]))
            if not read or read[0]["topic_id"] is None:
                return None
            self._recorded[topic] = uuid.UUID(str(read[0]["topic_id"]))
            return self._recorded[topic]
        rows = as_dicts(await self._client.execute(
            "INSERT INTO topic_ids (topic, topic_id, recorded_us, recorded_by) VALUES (?, ?, ?, ?) IF NOT EXISTS",
            [topic, kafka_id, time.time_ns() // 1000, self._recorded_by], idempotent=False))
        applied = not rows or rows[0].get("[applied]")
        recorded = kafka_id if applied else uuid.UUID(str(rows[0]["topic_id"]))  # the driver answers text
        if applied:
            log.info("topic_id_recorded", topic=topic, topic_id=str(kafka_id))
        self._recorded[topic] = recorded
        return recorded


async def recreated_topics(settings: KafkaSettings, client: CassandraClient, topics: Collection[str],
                           recorded_by: str | None, within_s: float | None = None) -> dict[str, TopicRecreatedError]:
    """One check of :class:`TopicIds` for a command run once (backfill, trace), over a Kafka client made for it."""
    check = TopicIds(KafkaTopicIds(settings), client, recorded_by)
    try:
        return await check.changed(topics, within_s)
    finally:
        await check.close()


__all__ = ["NO_TOPIC_CHECKS", "KafkaTopicIds", "NoTopicChecks", "TopicCheck", "TopicIds", "TopicIdsRequest",
           "TopicIdsUnsupportedError", "TopicRecreatedError", "kafka_topic_ids", "recreated_topics"]
