"""Settings that point countersink at servers that do not answer: nothing listens on ports 1 and 2 of
127.0.0.1 (below every port a test server takes, so a connection is refused at once)."""

from __future__ import annotations

KAFKA_DOWN = {"COUNTERSINK_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"}
CASSANDRA_DOWN_PORT = "2"
CASSANDRA_DOWN = {"COUNTERSINK_CASSANDRA__PORT": CASSANDRA_DOWN_PORT, "COUNTERSINK_CASSANDRA__CONNECT_TIMEOUT_S": "2"}
