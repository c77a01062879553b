"""Local Kafka and Cassandra servers for tests, the demo and benchmarks (not part of the installed package)."""
