"""Consume the topics the counter definitions name and keep every counter exact.

Runs until SIGTERM or SIGINT, then flushes, releases its partitions and exits 0 (1 if that did not finish
within COUNTERSINK_CONSUMER__SHUTDOWN_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from aiokafka.errors import KafkaError

from consumer.service import ConsumerService
from countersink.cli import load_definitions_or_refuse, run_async, stop_on_signals
from countersink.consistency import ConsistencyError
from countersink.logs import get_logger
from countersink.retry import StopRequested
from countersink.settings import Settings
from schemas.errors import CountersinkError

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counters", type=Path,
                        help="counter definitions file (default: COUNTERSINK_CONSUMER__COUNTERS_FILE)")
    parser.add_argument("--group", help="Kafka consumer group (default: COUNTERSINK_CONSUMER__GROUP_ID)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    updates = {}
    if args.counters:
        updates["counters_file"] = args.counters
    if args.group:
        updates["group_id"] = args.group
    if updates:
        settings = settings.model_copy(update={"consumer": settings.consumer.model_copy(update=updates)})
    counters = load_definitions_or_refuse(settings.consumer.counters_file)
    if counters is None:
        return 2
    return run_async(consume(settings, counters), graceful=True)


async def consume(settings: Settings, counters: object) -> int:
    service = ConsumerService(settings, counters)  # type: ignore[arg-type]
    with stop_on_signals(service.request_stop):
        if service.stop_requested:
            log.info("consumer_stopped_before_start")
            return 0
        try:
            await service.start()
        except ConsistencyError as exc:
            log.error("settings_refused", error=str(exc))
            await service.close()
            return 2
        except StopRequested:
            log.info("consumer_stopped_before_start")
            await service.close()
            return 0
        except (CountersinkError, KafkaError) as exc:
            # A refused login or certificate, a server away past the start-up timeout: one line, exit 1.
            log.error("consumer_start_failed", error=str(exc))
            await service.close()
            return 1
        try:
            await service.run()
        finally:
            try:
                await asyncio.wait_for(service.stop(), settings.consumer.shutdown_timeout_s)
            except TimeoutError:
                log.error("shutdown_timed_out", seconds=settings.consumer.shutdown_timeout_s)
                return 1
    return 0
