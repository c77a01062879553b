"""The consumer: one mutator per Kafka partition assignment, flushing whole-state shards to Cassandra."""
