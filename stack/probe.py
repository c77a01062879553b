"""``python -m stack.probe cassandra HOST PORT [PEERS]`` / ``kafka BOOTSTRAP``: exit 0 when a client gets an answer.

Run as its own short-lived process so that a driver call that never returns cannot block the caller: the
caller kills it after a deadline and simply probes again.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from stack.servers import cassandra_answers, kafka_answers


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "kafka":
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # refused connections are the normal "no"
        return 0 if asyncio.run(kafka_answers(argv[1])) else 1
    if len(argv) < 3 or argv[0] != "cassandra":
        print("usage: python -m stack.probe cassandra HOST PORT [PEERS] | kafka BOOTSTRAP", file=sys.stderr)
        return 2
    peers = int(argv[3]) if len(argv) > 3 else None
    return 0 if asyncio.run(cassandra_answers(argv[1], int(argv[2]), peers)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
