"""Kafka (KRaft) and Cassandra in Docker containers, through testcontainers' modules, for sessions where a
Docker engine answers (see ``tests/server_choice.py``). Imported only then: testcontainers is the ``docker``
extra, not a development dependency."""

from __future__ import annotations

from typing import Any

from stack import servers

# testcontainers' Kafka module configures Confluent's image (its start script is theirs); 7.9 is Apache Kafka
# 3.9 in KRaft mode. Cassandra is the version the local stack runs.
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"
CASSANDRA_IMAGE = f"cassandra:{servers.CASSANDRA_VERSION}"


def _modules() -> tuple[Any, Any]:
    try:  # testcontainers >= 4.10 keeps them under community/
        from testcontainers.community.cassandra import CassandraContainer
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.cassandra import CassandraContainer
        from testcontainers.kafka import KafkaContainer
    return KafkaContainer, CassandraContainer


class Containers:
    """``start()`` both servers and return their addresses; ``stop()`` removes whatever was started."""

    def __init__(self) -> None:
        self._running: list[Any] = []

    def start(self) -> tuple[str, str, int]:
        """(Kafka bootstrap servers, Cassandra host, Cassandra port)."""
        kafka_container, cassandra_container = _modules()
        try:
            kafka = kafka_container(KAFKA_IMAGE).with_kraft()
            kafka.with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            kafka.with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            kafka.with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            kafka.start(timeout=180)
            self._running.append(kafka)
            cassandra = cassandra_container(CASSANDRA_IMAGE)
            cassandra.with_env("MAX_HEAP_SIZE", "1G")
            cassandra.with_env("HEAP_NEWSIZE", "200M")
            cassandra.start()
            self._running.append(cassandra)
        except BaseException:
            self.stop()
            raise
        ((host, port),) = cassandra.get_contact_points()
        return str(kafka.get_bootstrap_server()), str(host), int(port)

    def stop(self) -> None:
        while self._running:
            self._running.pop().stop()
