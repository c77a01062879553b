"""Consume the topics the counter definitions name and keep every counter exact.

Runs until SIGTERM or SIGINT, then flushes, releases its partitions and exits 0 (1 if that did not finish
within COUNTERSINK_CONSUMER__SHUTDOWN_TIMEOUT_S). After a rebalance callback failed (``rebalance_failed``) it
stops the same way and exits 1, for its supervisor to restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from pathlib import Path

from consumer.dead_letters import DeadLetterLoopError
from consumer.handovers import HandoverRefusedError
from consumer.service import ConsumerService, CounterRedefinedError, RebalanceFailedError
from countersink.cli import load_definitions_or_refuse, run_async, setting_default, stop_on_signals
from countersink.consistency import ConsistencyError
from countersink.logs import get_logger
from countersink.retry import StopRequested
from countersink.schema_registry import SchemaRegistryNotConfiguredError, SchemaRegistryRefusedError
from countersink.settings import Settings, given_options, with_options
from schemas.errors import CompactedTopicError, CounterDroppedError, DefinitionChangedError, GroupMismatchError

log = get_logger(__name__)

# Young-generation collections every 50,000 allocations instead of 700: a mutator allocates states, rows and
# window ids that live for its whole life, and each young collection walks them again (about a sixth of the
# batch path's time on a stream of new keys, measured with bench/hot_path.py). Cycles are rare here.
GC_THRESHOLDS = (50_000, 20, 20)


def tune_garbage_collector() -> None:
    """Once started: what exists now lives as long as the process (modules, clients), so the collector stops
    walking it (``gc.freeze``), and young collections run less often."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counters", type=Path, metavar="FILE",
                        help="counter definitions file " + setting_default("consumer.counters_file"))
    parser.add_argument("--group", help="Kafka consumer group " + setting_default("consumer.group_id"))
    parser.add_argument("--create-topics", action="store_true",
                        help="create missing topics, COUNTERSINK_CONSUMER__TOPIC_PARTITIONS partitions each; "
                        "without it the consumer waits, unready, until they exist "
                        + setting_default("consumer.create_topics"))


def run(args: argparse.Namespace, settings: Settings) -> int:
    options = given_options(args, ("counters_file", "--counters", "counters"), ("group_id", "--group", "group"),
                            ("create_topics", "--create-topics", "create_topics"))
    if options:
        settings = settings.model_copy(update={"consumer": with_options(settings.consumer, options)})
    counters = load_definitions_or_refuse(settings.consumer.counters_file, settings.cassandra.max_row_bytes)
    if counters is None:
        return 2
    return run_async(consume(settings, counters), graceful=True)


async def consume(settings: Settings, counters: object) -> int:
    try:
        service = ConsumerService(settings, counters)  # type: ignore[arg-type]
    except (SchemaRegistryNotConfiguredError, DeadLetterLoopError) as exc:
        log.error("settings_refused", error=str(exc))
        return 2
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
        except GroupMismatchError as exc:
            log.error("group_refused", error=exc.line)  # one line: the recorded group, and what to do
            await service.close()
            return 2
        except CounterDroppedError as exc:
            for problem in exc.problems:
                log.error("counter_dropped", error=problem.line)
            await service.close()
            return 2
        except DefinitionChangedError as exc:
            for problem in exc.problems:
                log.error("definition_changed", error=problem.line)
            await service.close()
            return 2
        except CompactedTopicError as exc:
            for topic, line in zip(sorted(exc.topics), exc.lines, strict=True):
                log.error("topic_refused", topic=topic, policy=exc.policies[topic], error=line)
            await service.close()
            return 2
        except Exception as exc:
            # e.g. a server still away after startup_timeout_s: every client is closed on this path too.
            log.error("consumer_start_failed", error=str(exc) or type(exc).__name__)
            await service.close()
            return 1
        except BaseException:
            await service.close()  # every client closed before the error is reported: no "Unclosed" noise
            raise
        tune_garbage_collector()
        code = 0
        last_flush = True
        try:
            await service.run()
        except CounterRedefinedError as exc:
            # Its partitions are left as after a crash: a last flush would move past records without the new
            # counter. Their next owners replay what it applied since its last flush, with the new definitions.
            log.error("counter_redefined", error=str(exc),
                      action="exiting without a last flush: its partitions are taken over as after a crash")
            code, last_flush = 2, False
        except RebalanceFailedError:
            code = 1  # rebalance_failed says why
        except SchemaRegistryRefusedError as exc:
            # Wrong credentials, or a user the registry lets read no schema: no retry fixes that (exit 1, as a
            # refused Kafka or Cassandra login). What was applied is flushed as at any stop: the batch that needed
            # the schema was not applied, and a takeover that needed it is abandoned (its partition's next owner
            # replays it).
            log.error("schema_registry_refused", error=str(exc))
            code = 1
        except HandoverRefusedError as exc:
            # One line: which counter is counted here that these definitions lack, and what to do. The other
            # partitions are released as at any stop; the refused one was never counted, and its next owner takes
            # it over.
            log.error("handover_refused", error=exc.line)
            code = 2
        finally:
            try:
                await asyncio.wait_for(service.stop() if last_flush else service.close(),
                                       settings.consumer.shutdown_timeout_s)
            except TimeoutError:
                log.error("shutdown_timed_out", seconds=settings.consumer.shutdown_timeout_s)
                return 1
    return code
