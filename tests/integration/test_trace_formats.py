"""A trace without a definitions file (definitions from the counter registry) on real Kafka, Cassandra and a
schema registry: the topics' formats come from the registry as the consumer recorded them, or the trace is
refused; an Avro or Protobuf record is never reported dead-lettered as unparseable JSON."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from consumer.service import ConsumerService
from countersink.cassandra import CassandraClient
from countersink.commands.trace import TraceQuery, TraceRefusedError
from countersink.commands.trace import trace as trace_records
from countersink.registry import CounterRegistry
from countersink.schema_registry import SchemaRegistryClient
from countersink.serve import ReadApi
from countersink.settings import (
    CassandraSettings,
    ConsumerSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    ServeSettings,
    Settings,
)
from schemas.definitions import load_definitions
from schemas.formats import ProtoSchema, avro_encoder, frame
from stack.loading import end_offsets, publish, wait_until_flushed
from tests.integration.consumer_support import running
from tests.integration.test_trace import FORMAT_DEFINITIONS, PURCHASE, VIEW, _trace

pytestmark = pytest.mark.integration


async def test_a_trace_from_the_registry_decodes_as_the_consumer_recorded_or_refuses(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, topic_factory: Any,
        schema_registry_url: str, tmp_path: Path) -> None:
    """With no definitions given, an Avro and a Protobuf record are traced as counted (the formats the consumer
    recorded in the counter registry), by the command's function and by /trace. A registry row without formats
    (recorded by an earlier version) makes the trace refuse, naming --counters, until the consumer starts again
    and records them."""
    avro, proto = await topic_factory("avro", partitions=1), await topic_factory("proto", partitions=1)
    async with SchemaRegistryClient(SchemaRegistrySettings(url=schema_registry_url)) as schemas:
        view_id = await schemas.register(f"{avro}-value", "AVRO", json.dumps(VIEW))
        purchase_id = await schemas.register(f"{proto}-value", "PROTOBUF", PURCHASE)
    encode_view = avro_encoder(json.dumps(VIEW))
    schema = ProtoSchema(PURCHASE)
    encode_purchase = schema.encoder(schema.indexes_of("shop.Purchase"))
    await publish(kafka_settings, avro, [frame(view_id, encode_view({"id": f"v{i}", "page": f"/p{i % 2}", "n": i + 1}))
                                         for i in range(3)])
    await publish(kafka_settings, proto, [frame(purchase_id, encode_purchase({"sku": "A1", "amount": 7}), (0,))])
    group = f"t{os.urandom(4).hex()}"
    counters = tmp_path / "counters.toml"
    counters.write_text(FORMAT_DEFINITIONS.replace("{avro}", avro).replace("{proto}", proto))
    settings = Settings(kafka=kafka_settings, cassandra=cassandra_settings,
                        schema_registry=SchemaRegistrySettings(url=schema_registry_url),
                        consumer=ConsumerSettings(group_id=group, counters_file=counters,
                                                  dead_letter_topic=f"dlq-{group}", flush_interval_s=0.3,
                                                  health_port=0))
    definitions = load_definitions(counters)
    flushed = await end_offsets(kafka_settings, {avro: 1, proto: 1})
    async with running(ConsumerService(settings, definitions)):
        await wait_until_flushed(cassandra_settings, group, flushed)

    async with CassandraClient(cassandra_settings) as client:
        async def traced(topic: str, offset: tuple[int, int]) -> dict[str, Any]:
            result = await trace_records(client, settings, TraceQuery(topic, offset))  # no definitions given
            (record,) = result.records
            return {t.counter: t for t in record.counters}

        view = (await traced(avro, (0, 1)))["views_by_page"]
        assert (view.outcome, view.key, view.in_value) == ("counted", "/p1", True), view
        purchase = (await traced(proto, (0, 0)))["amount_by_sku"]
        assert (purchase.outcome, purchase.key, purchase.value_now) == ("counted", "A1", 7), purchase

        api = ReadApi(client, ServeSettings(), registry=CounterRegistry(client), tracing=settings)
        async with TestClient(TestServer(api.app())) as http:
            answer = await http.get(f"/trace/{avro}", params={"offset": "0:2"})
            assert answer.status == 200, await answer.text()
            (record,) = (await answer.json())["records"]
            assert [(c["counter"], c["outcome"], c["key"]) for c in record["counters"]] == [
                ("views_by_page", "counted", "/p0")]

        # A row as an earlier version recorded it: no formats. Refused, not traced as JSON.
        await client.execute("UPDATE counters SET topic_formats = null WHERE name = ?", ["views_by_page"])
        with pytest.raises(TraceRefusedError, match=f"pass --counters FILE: the counter registry does not say "
                                                    f"topic '{avro}'"):
            await traced(avro, (0, 1))
        assert (await traced(proto, (0, 0)))["amount_by_sku"].outcome == "counted"  # its row has them
        refused = await asyncio.to_thread(_trace, kafka_settings, cassandra_settings, "--topic", avro, "--offset",
                                          "0:1")
        assert refused.returncode == 2, refused.stderr
        assert "pass --counters FILE" in refused.stderr
        async with TestClient(TestServer(api.app())) as http:
            answer = await http.get(f"/trace/{avro}", params={"offset": "0:1"})
            assert answer.status == 404, await answer.text()
            assert "pass --counters FILE" in (await answer.json())["detail"]
        async with running(ConsumerService(settings, definitions)):
            pass  # a start records the formats over the old row
        assert (await traced(avro, (0, 1)))["views_by_page"].outcome == "counted"
