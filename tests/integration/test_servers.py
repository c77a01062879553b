"""The servers the rest of the suite stands on: real Kafka and real Cassandra answer, and failures surface."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.kafka import make_consumer, make_producer
from countersink.logs import quiet_driver_noise
from countersink.metrics import METRICS
from countersink.settings import CassandraSettings, Consistency, KafkaSettings
from schemas.cql import SchemaVersionError
from stack.servers import free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


async def test_kafka_round_trip_through_a_consumer_group(kafka_settings: KafkaSettings, topic_factory) -> None:
    """Every record produced to a 3-partition topic comes back exactly once through a consumer group."""
    topic = await topic_factory(partitions=3)
    sent = {f"event-{i}".encode() for i in range(300)}
    async with make_producer(kafka_settings) as producer:
        await asyncio.gather(*(await asyncio.gather(*(producer.send(topic, value, key=value) for value in sent))))
    received: list[bytes] = []
    consumer = make_consumer(kafka_settings, topic, group_id=f"g-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    async with consumer:
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            received.extend(record.value for records in batches.values() for record in records)
        await consumer.commit()
        assert {tp.partition for tp in consumer.assignment()} == {0, 1, 2}
    assert sorted(received) == sorted(sent)


async def test_cassandra_schema_rows_at_quorum_and_lwt(cassandra_settings: CassandraSettings) -> None:
    """The schema exists in a fresh keyspace; rows written at QUORUM read back; LWTs apply once."""
    mutator = uuid.uuid4()
    async with CassandraClient(cassandra_settings) as client:
        await client.execute(
            "UPDATE shards USING TIMESTAMP ? SET states = states + ? WHERE part = ? AND key = ? AND born_us = ? "
            "AND mutator = ?", [1_000, {"likes": b"\x01\x01state"}, "post-1", "", 900, mutator],
            consistency=Consistency.QUORUM)
        result = await client.execute(
            "SELECT mutator, states[?] AS state, writetime(states[?]) AS ts FROM shards WHERE part = ?",
            ["likes", "likes", "post-1"], consistency=Consistency.QUORUM)
        # The driver returns uuid columns as text; countersink's store converts them where it reads them.
        expected = {"mutator": str(mutator), "state": b"\x01\x01state", "ts": 1_000}
        assert as_dicts(result) == [expected]

        claim = ("INSERT INTO partitions (consumer_group, topic, partition, owner, flush_seq) VALUES (?, ?, ?, ?, 0) "
                 "IF NOT EXISTS")
        client.sample_driver_metrics()
        assert METRICS.cassandra_connections._value.get() >= 1  # the driver's open connections are visible
        first = as_dicts(await client.execute(claim, ["g", "t", 0, mutator], idempotent=False))
        second = as_dicts(await client.execute(claim, ["g", "t", 0, uuid.uuid4()], idempotent=False))
        assert first[0]["[applied]"] is True
        assert second[0]["[applied]"] is False
        assert second[0]["owner"] == str(mutator)


async def test_cassandra_down_is_a_named_retriable_error(base_cassandra_settings: CassandraSettings) -> None:
    """Connecting where no Cassandra listens fails fast with CassandraUnavailableError, not a hang."""
    settings = base_cassandra_settings.model_copy(update={"port": free_port(), "connect_timeout_s": 1.0})
    started = time.monotonic()
    with pytest.raises(CassandraUnavailableError, match="cannot connect to Cassandra") as caught:
        await CassandraClient(settings).start()
    assert caught.value.retriable is True
    assert time.monotonic() - started < 15


async def test_a_port_that_does_not_speak_cql_is_one_line_that_says_what_to_check(
    base_cassandra_settings: CassandraSettings, caplog: pytest.LogCaptureFixture,
) -> None:
    """Something other than Cassandra's native transport at the address (a web server, a TLS-only node to a
    client without TLS) closes the connection: one retriable error that names the port and TLS to check, and
    not the driver's own "Error decoding" line before it."""

    async def answer_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = base_cassandra_settings.model_copy(update={"contact_points": ["127.0.0.1"], "port": port,
                                                          "connect_timeout_s": 2.0})
    quiet_driver_noise()
    try:
        with caplog.at_level(logging.INFO), pytest.raises(CassandraUnavailableError) as caught:
            await CassandraClient(settings).start()
    finally:
        server.close()
        await server.wait_closed()
    assert caught.value.retriable is True
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "COUNTERSINK_CASSANDRA__SSL_ENABLED" in str(caught.value)
    assert [r.getMessage() for r in caplog.records if r.name == "acsylla"] == []


async def test_kafka_down_is_a_connection_error(kafka_settings: KafkaSettings) -> None:
    """A producer pointed where no broker listens fails to start with KafkaConnectionError."""
    settings = kafka_settings.model_copy(update={"bootstrap_servers": [f"127.0.0.1:{free_port()}"],
                                                  "request_timeout_ms": 2000})
    producer = make_producer(settings)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()


@pytest.mark.cluster
async def test_three_nodes_rf3_quorum_survives_one_node_down(cassandra_cluster) -> None:
    """With RF=3 and one of three nodes stopped, QUORUM reads and writes succeed, ALL fails, and after the
    node returns ALL succeeds again."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.cluster_client", ",".join(cassandra_cluster.contact_points),
        str(cassandra_cluster.native_port), cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None
    assert child.stdout is not None

    async def step() -> dict[str, object]:
        while True:
            line = await asyncio.wait_for(child.stdout.readline(), 180)  # type: ignore[union-attr]
            assert line, "the client process ended early"
            if line.startswith(b"RESULT "):
                return json.loads(line[7:])  # type: ignore[no-any-return]

    try:
        assert (await step())["step"] == "written_at_all"
        stopped = cassandra_cluster.nodes[2]
        stopped.stop()
        try:
            child.stdin.write(b"node_stopped\n")
            down = await step()
        finally:
            stopped.restart(tied_to_parent=True)
        assert down["quorum_rows"] == 2
        assert str(down["all_while_down"]).startswith("unavailable")
        child.stdin.write(b"node_restarted\n")
        assert (await step())["all_rows"] == 2
        assert await asyncio.wait_for(child.wait(), 30) == 0
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_a_keyspace_not_yet_created_says_how_to_create_it(base_cassandra_settings: CassandraSettings) -> None:
    """Connecting to a keyspace that does not exist is retriable (a schema job may be creating it) and the
    error says what creates it, instead of the driver's "unable to set keyspace"."""
    settings = base_cassandra_settings.model_copy(update={"keyspace": f"missing_{uuid.uuid4().hex[:8]}"})
    with pytest.raises(CassandraUnavailableError, match="create it with `countersink schema`") as raised:
        async with CassandraClient(settings):
            pass
    assert raised.value.retriable


async def test_a_keyspace_of_an_older_schema_is_refused_with_what_to_do(cassandra_settings: CassandraSettings) -> None:
    """A keyspace recording an older schema version is refused by name, not written in the old layout."""
    async with CassandraClient(cassandra_settings) as client:
        await client.ensure_schema()
        await client.execute("UPDATE schema_meta SET version = 1 WHERE name = 'countersink'")
        with pytest.raises(SchemaVersionError, match=rf"{cassandra_settings.keyspace}.*schema 1.*needs 4.*drop"):
            await client.ensure_schema()
        # Schema 2 (shards clustered by mutator alone, a tombstone per folded cell) and schema 3 (a partition per
        # key, tallies static) are refused the same way.
        for older in (2, 3):
            await client.execute("UPDATE schema_meta SET version = ? WHERE name = 'countersink'", [older])
            with pytest.raises(SchemaVersionError,
                               match=rf"{cassandra_settings.keyspace}.*schema {older}.*needs 4.*drop"):
                await client.ensure_schema()
