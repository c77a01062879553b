"""The client side of the three-node test, run as its own process and stepped through stdin/stdout.

It runs in a child process because closing a driver session that lived through a node going down and
coming back aborted the whole test process twice in CI (inside the driver's ``cass_session_close``; never
reproduced outside the test run). The child reports every result before it exits and then ends with
``os._exit`` without closing that session, so the suite's verdict rests on the behaviour under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid

from countersink.cassandra import CassandraClient, CassandraUnavailableError, as_dicts
from countersink.settings import CassandraSettings, Consistency

INSERT = "UPDATE shards SET states = states + ? WHERE part = ? AND key = '' AND born_us = 1 AND mutator = ?"
READ = "SELECT count(*) AS n FROM shards WHERE part = ?"


def report(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)  # other stdout lines (driver, logs) are not results


async def wait_for(line: str) -> None:
    got = (await asyncio.to_thread(sys.stdin.readline)).strip()
    assert got == line, f"expected {line!r}, got {got!r}"


async def main(contact_points: list[str], port: int) -> None:
    settings = CassandraSettings(contact_points=contact_points, port=port, keyspace=f"t_{uuid.uuid4().hex[:12]}",
                                 request_timeout_s=5.0,
                                 replication="{'class': 'SimpleStrategy', 'replication_factor': 3}")
    async with CassandraClient(settings, use_keyspace=False) as admin:
        await admin.ensure_schema()
    client = CassandraClient(settings)
    await client.start()
    await client.execute(INSERT, [{"c": b"a"}, "k", uuid.uuid4()], consistency=Consistency.ALL)
    report(step="written_at_all")
    await wait_for("node_stopped")
    await client.execute(INSERT, [{"c": b"b"}, "k", uuid.uuid4()], consistency=Consistency.QUORUM)
    quorum = as_dicts(await client.execute(READ, ["k"], consistency=Consistency.QUORUM))[0]["n"]
    try:
        await client.execute(READ, ["k"], consistency=Consistency.ALL)
        all_while_down = "succeeded"
    except CassandraUnavailableError as exc:
        all_while_down = f"unavailable: {exc}"[:200]
    report(step="node_down", quorum_rows=quorum, all_while_down=all_while_down)
    await wait_for("node_restarted")
    deadline = time.monotonic() + 90
    while True:  # the driver reconnects to the returned node on its own schedule
        try:
            rows = as_dicts(await client.execute(READ, ["k"], consistency=Consistency.ALL))[0]["n"]
            break
        except CassandraUnavailableError:
            if time.monotonic() > deadline:
                rows = -1
                break
            await asyncio.sleep(1)
    report(step="node_back", all_rows=rows)
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].split(","), int(sys.argv[2])))
