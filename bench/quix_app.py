"""The reference a Python team would otherwise write: Quix Streams counting trades by symbol, exactly-once.

    python -m bench.quix_app BOOTSTRAP TOPIC GROUP STATE_DIR

Per symbol it keeps the trade count and the sum of ``qty`` in Quix's RocksDB state, with
``processing_guarantee="exactly-once"`` (Kafka transactions, state changelogs). It runs until SIGTERM.
The topic is keyed by symbol, so no repartitioning is needed: Quix is given its easiest form of the job.
"""

from __future__ import annotations

import sys
from typing import Any

from quixstreams import Application, State


def count_trade(value: dict[str, Any], state: State) -> None:
    state.set("trades", state.get("trades", 0) + 1)
    state.set("shares", state.get("shares", 0) + value["qty"])


def main(bootstrap: str, topic_name: str, group: str, state_dir: str) -> None:
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", state_dir=state_dir, commit_interval=1.0,
                      loglevel="WARNING")
    topic = app.topic(topic_name, value_deserializer="json")
    frame = app.dataframe(topic)
    frame.update(count_trade, stateful=True)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:5])
