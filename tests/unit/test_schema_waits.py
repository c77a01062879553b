"""While the schema registry cannot be reached, only the partitions whose records name a schema not cached wait:
paused and read again from what their mutator applied, while the others are applied; the registry is asked
again in the background, and once it answers they go on. What asking again cannot mend ends the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from structlog.testing import capture_logs

from consumer.service import ConsumerService
from countersink.schema_registry import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
from countersink.settings import ConsumerSettings, SchemaRegistrySettings, Settings
from tests.unit.memory_store import MemoryLog, MemoryStore
from tests.unit.test_protocol_model import COUNTERS, DeadLetterTopic

AVRO, JSON = TopicPartition("views", 0), TopicPartition("orders", 1)


@dataclass
class Record:
    offset: int
    value: bytes


@dataclass
class Consumer:
    """The Kafka consumer's seek, pause and resume, as calls."""

    calls: list[tuple[str, TopicPartition, int | None]] = field(default_factory=list)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", tp, offset))

    def pause(self, tp: TopicPartition) -> None:
        self.calls.append(("pause", tp, None))

    def resume(self, tp: TopicPartition) -> None:
        self.calls.append(("resume", tp, None))


@dataclass
class Mutator:
    applied_through: int


class Schemas:
    """The loader: the registry away for topic ``views`` (each id there is missing), any other topic cached."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.answers: list[Exception | None] = []  # what each fetch meets, in turn (None: it answers)
        self.fetched: list[tuple[str, list[int]]] = []

    async def load(self, topic: str, values: Iterable[bytes | None], holder: object = None) -> None:
        self.loads.append(topic)
        if topic == "views":
            raise SchemaRegistryUnavailableError("the schema registry at http://registry did not answer")

    def uncached(self, topic: str, values: Iterable[bytes | None], holder: object = None) -> list[int]:
        return sorted({int(v[0]) for v in values if v}) if topic == "views" else []

    async def fetch(self, topic: str, ids: list[int]) -> None:
        self.fetched.append((topic, ids))
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer

    async def stop(self) -> None:
        return None


def _service() -> tuple[ConsumerService, Consumer, Schemas]:
    consumer, schemas = Consumer(), Schemas()
    settings = Settings(consumer=ConsumerSettings(group_id="g", health_port=0),
                        schema_registry=SchemaRegistrySettings(retry_max_s=0.2))
    service = ConsumerService(settings, COUNTERS, store=MemoryStore(), source=MemoryLog([]),
                              consumer=cast(AIOKafkaConsumer, consumer),
                              producer=cast(AIOKafkaProducer, DeadLetterTopic()))
    service.schemas = cast(Any, schemas)
    mutators = {AVRO: Mutator(41), JSON: Mutator(7)}
    service.ownership.applying = mutators.get  # type: ignore[assignment, method-assign]
    return service, consumer, schemas


async def test_a_registry_away_holds_only_the_partitions_that_need_it_until_it_answers() -> None:
    service, consumer, schemas = _service()
    batches: dict[TopicPartition, list[Any]] = {AVRO: [Record(50, b"\x03"), Record(51, b"\x04")],
                                                JSON: [Record(8, b"{}")]}
    ready, waiting = await service._load_schemas(batches)
    assert ready == {JSON: batches[JSON]}
    assert waiting == {AVRO: [3, 4]}
    assert service.schema_wait is None  # nothing waits yet: the partition may be revoked before it is held
    # Held: read again from what its mutator applied (41), not from the batch (50): nothing of it is applied.
    schemas.answers = [SchemaRegistryUnavailableError("still away")]
    with capture_logs() as logs:
        service._hold_for_schemas(AVRO, waiting[AVRO])
    assert [e["event"] for e in logs] == ["schema_registry_unavailable"]
    assert service.schema_wait == "the schema registry at http://registry did not answer"
    assert consumer.calls == [("seek", AVRO, 42), ("pause", AVRO, None)]
    assert service._schema_retry is not None
    # While it is away, a batch naming a schema not cached waits without asking; the others are applied.
    ready, waiting = await service._load_schemas({AVRO: [Record(42, b"\x05")], JSON: [Record(9, b"{}")]})
    assert (list(ready), waiting) == ([JSON], {AVRO: [5]})
    assert schemas.loads == ["views"]  # once: the rest of that batch, and the next, ask nothing
    service._hold_for_schemas(AVRO, waiting[AVRO])
    with capture_logs() as logs:
        await asyncio.wait_for(service._schema_retry, 5)
    # Asked twice: away, then answering for every id waited for; the partition goes on.
    assert schemas.fetched == [("views", [3, 4, 5]), ("views", [3, 4, 5])]
    assert consumer.calls[-1] == ("resume", AVRO, None)
    assert [e["event"] for e in logs] == ["schema_registry_available"]
    assert (service.schema_wait, service._schema_retry, service._schema_held) == (None, None, {})


async def test_a_refusal_met_while_asking_again_ends_the_loop() -> None:
    service, consumer, schemas = _service()
    schemas.answers = [SchemaRegistryRefusedError("the schema registry refused the credentials")]
    _, waiting = await service._load_schemas({AVRO: [Record(50, b"\x03")]})
    service._hold_for_schemas(AVRO, waiting[AVRO])
    assert service._schema_retry is not None
    await asyncio.wait_for(service._schema_retry, 5)
    assert isinstance(service.schema_error, SchemaRegistryRefusedError)
    assert ("resume", AVRO, None) not in consumer.calls
    service._started = True  # as start() leaves it, without the servers
    with pytest.raises(SchemaRegistryRefusedError, match="refused the credentials"):
        await asyncio.wait_for(service.run(), 5)


async def test_a_partition_revoked_before_it_is_held_leaves_the_consumer_ready() -> None:
    """The registry failed for a batch of a partition revoked before the hold (the rebalance ran while the
    request waited): nothing waits, and the consumer is ready; it stayed unready for good."""
    service, consumer, _ = _service()
    _, waiting = await service._load_schemas({AVRO: [Record(50, b"\x03")]})
    service.ownership.applying = {}.get  # type: ignore[assignment, method-assign]  # revoked meanwhile
    service._hold_for_schemas(AVRO, waiting[AVRO])
    assert (consumer.calls, service._schema_retry, service.schema_wait) == ([], None, None)


async def test_a_schema_still_failing_holds_only_the_partitions_that_need_it() -> None:
    """Two topics wait; the registry answers for one of them and keeps failing for the other: the first goes
    on, asked for every round; the second stays held until its own schema comes. A partition revoked while it
    waits is forgotten, and nothing then waits."""
    service, consumer, schemas = _service()
    other = TopicPartition("clicks", 0)
    service.ownership.applying = {AVRO: Mutator(41), other: Mutator(9)}.get  # type: ignore[assignment, method-assign]
    failing = SchemaRegistryUnavailableError("views: an HTML page, not the registry")

    async def fetch(topic: str, ids: list[int]) -> None:
        schemas.fetched.append((topic, ids))
        if topic == "views":
            raise failing

    schemas.fetch = fetch  # type: ignore[method-assign]
    service._registry_away = "away"
    service._hold_for_schemas(AVRO, [3])
    service._hold_for_schemas(other, [7])
    task = service._schema_retry
    assert task is not None
    for _ in range(200):
        if other not in service._schema_held:
            break
        await asyncio.sleep(0.01)
    assert ("resume", other, None) in consumer.calls
    assert ("resume", AVRO, None) not in consumer.calls
    assert service.schema_wait == "views: an HTML page, not the registry"
    await service.on_partitions_revoked([AVRO])
    await asyncio.wait_for(task, 5)
    assert (service._schema_retry, service.schema_wait) == (None, None)
    assert {topic for topic, _ in schemas.fetched} == {"views", "clicks"}
