"""Reading a counter instance: merge the tally and every shard of its partition, in one read.

Reads never coordinate with writers. A GC batch replaces shards by the tally atomically within the
partition, so a read sees the state before it or after it, never a mix.
"""

from __future__ import annotations

from countersink.cassandra import CassandraClient, as_dicts
from countersink.settings import Consistency
from schemas.kinds import State, state_from_bytes


async def read_state(
    client: CassandraClient, counter: str, key: str, consistency: Consistency | None = None
) -> State | None:
    """The merged state of one instance, or None when nothing was ever counted for it."""
    result = await client.execute(
        "SELECT tally, state FROM shards WHERE counter = ? AND key = ?",
        [counter, key],
        consistency=consistency or client.settings.read_consistency,
    )
    merged: State | None = None
    tally_seen = False
    for row in as_dicts(result):
        blobs = [row["state"]]
        if not tally_seen:
            blobs.append(row["tally"])  # static: the same on every row of the partition
            tally_seen = True
        for blob in blobs:
            if blob is None:
                continue
            state = state_from_bytes(blob)
            if merged is None:
                merged = state
            else:
                merged.merge(state)
    return merged
