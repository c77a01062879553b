"""What a new keyspace's replication may ask of the cluster it is created on."""

from __future__ import annotations

import pytest

from schemas.cql import replication_problem


@pytest.mark.parametrize(("replication", "nodes", "problem"), [
    ("{'class': 'SimpleStrategy', 'replication_factor': 1}", {"dc1": 1}, None),
    ("{'class': 'SimpleStrategy', 'replication_factor': 3}", {"dc1": 1},
     "more replicas than the cluster has nodes (1)"),
    ("{'class': 'SimpleStrategy', 'replication_factor': 3}", {"dc1": 2, "dc2": 1}, None),
    ("{'class': 'NetworkTopologyStrategy', 'dc1': 3}", {"dc1": 3}, None),
    ("{'class': 'NetworkTopologyStrategy', 'dc1': '3', 'dc2': 2}", {"dc1": 3, "dc2": 1},
     "more replicas than data center 'dc2' has nodes (1)"),
    ("{'class': 'NetworkTopologyStrategy', 'east': 1}", {"datacenter1": 3}, "names data center 'east'"),
    ("{'class': 'org.apache.cassandra.locator.NetworkTopologyStrategy', 'replication_factor': 2}",
     {"a": 2, "b": 1}, "data center 'b' has nodes (1)"),
])
def test_a_replication_the_cluster_cannot_place_is_named(replication: str, nodes: dict[str, int],
                                                         problem: str | None) -> None:
    """More replicas than nodes, or a data center the cluster lacks: Cassandra creates such a keyspace, and every
    write needing a quorum then fails as "No hosts available" (``schema`` retried that for two minutes and left
    a keyspace no command could use); the keyspace is not created, and why is said."""
    found = replication_problem(replication, nodes)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found
