"""The configuration the local stack writes for Cassandra."""

from __future__ import annotations

from pathlib import Path

import yaml

from stack import servers


def test_cassandra_yaml_offers_the_memtables_of_cassandra_5(tmp_path: Path) -> None:
    """As Cassandra 5.0's own conf/cassandra.yaml: a table may choose ``memtable = 'trie'`` (the server refuses a
    configuration it does not define), and a table that chooses none keeps the skip-list memtable."""
    node = servers.CassandraNode(root=tmp_path / "cassandra")
    config = yaml.safe_load(node._write_config().read_text())
    configurations = config["memtable"]["configurations"]
    assert configurations["trie"] == {"class_name": "TrieMemtable"}
    assert configurations["skiplist"] == {"class_name": "SkipListMemtable"}
    assert configurations["default"] == {"inherits": "skiplist"}
