"""``countersink backfill COUNTER`` and ``countersink reprocess COUNTER --from TIME``.

backfill: a counter whose definition has ``since`` is counted by the live consumers from a hand-over offset in
each partition on (the first live mutator's start, recorded once); this counts the retained log below it, from
``since``, for that counter alone, and records each partition finished (``countersink.backfills``).

reprocess: a reset of every key of the counter (``countersink reset``), then a backfill into the reset's epoch
from ``--from`` up to the reset's point (its control record) in each partition.

Both print progress per partition while they run, and may be killed and run again at any point: the next run
goes on from what the last one committed. ``backfill`` also resumes a reprocess that did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from aiokafka import TopicPartition

from consumer.applying import Applier, RecordsLostError, RetryWindow
from consumer.cassandra_store import CassandraStore
from consumer.dead_letters import DeadLetters
from consumer.kafka_source import KafkaRecordSource
from consumer.protocol import FencedError
from consumer.schema_source import SchemaLoadingSource
from countersink.backfills import (
    CounterDroppedDuringBackfillError,
    Handover,
    Span,
    backfill_group,
    backfill_partition,
    fill_end,
    fix_start,
    mark_finished,
    read_handovers,
    record_plan,
    registry_look,
)
from countersink.cassandra import CassandraClient
from countersink.cli import (
    EXIT_FAILED,
    EXIT_USAGE,
    counter_name,
    load_definitions_or_refuse,
    positive_int,
    run_async,
    setting_default,
)
from countersink.kafka import make_consumer, make_producer, topic_partitions
from countersink.logs import get_logger
from countersink.registry import CounterRegistry
from countersink.resets import (
    CassandraResets,
    claim_epoch,
    command_requester,
    next_epoch,
    publish_controls,
    read_points,
    read_resets,
    recorded_then_settled,
)
from countersink.retry import Backoff, pause_unless_stopped
from countersink.schema_registry import SchemaLoader
from countersink.schema_registry import schema_cache as make_schema_cache
from countersink.settings import Settings, given_options, with_options
from countersink.topic_ids import TopicRecreatedError, recreated_topics
from schemas import formats, registry
from schemas.definitions import CounterSet, since_ms
from schemas.errors import CounterDroppedError, CountersinkError, DefinitionChangedError, GroupMismatchError
from schemas.events import EventRouter
from schemas.resets import Epochs, Reset, cell_name, current_epochs, new_reset_id

log = get_logger(__name__)

PROGRESS_EVERY_S = 5.0


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("counter", type=counter_name, help="the counter, as its definition names it")
    parser.add_argument("--counters", type=Path, metavar="FILE",
                        help="the definitions file the live consumers run " + setting_default("consumer.counters_file"))
    parser.add_argument("--group", help="the live consumers' group " + setting_default("consumer.group_id"))


def _wait_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait-s", type=positive_int, default=300, metavar="SECONDS",
                        help="how long to wait for the live consumers to record where they count a counter with since "
                        "from in each partition (they do when they take it over with the definition)")


def add_backfill_arguments(parser: argparse.ArgumentParser) -> None:
    _common_arguments(parser)
    _wait_argument(parser)


def add_reprocess_arguments(parser: argparse.ArgumentParser) -> None:
    _common_arguments(parser)
    parser.add_argument("--from", dest="since", required=True, metavar="TIME",
                        help='count again from this RFC 3339 time (with its offset, e.g. 2026-11-01T00:00:00Z) or '
                        '"earliest"')
    _wait_argument(parser)


def _settings_of(args: argparse.Namespace, settings: Settings) -> Settings:
    options = given_options(args, ("counters_file", "--counters", "counters"), ("group_id", "--group", "group"))
    if options:
        settings = settings.model_copy(update={"consumer": with_options(settings.consumer, options)})
    return settings


def run_backfill(args: argparse.Namespace, settings: Settings) -> int:
    settings = _settings_of(args, settings)
    counters = _definitions_with(args.counter, settings)
    if counters is None:
        return EXIT_USAGE
    return run_async(Backfill(settings, counters, args.counter).backfill(args.wait_s))


def _offsets(first: int, end: int) -> str:
    """The offsets ``first`` to ``end`` (excluded) as said in progress lines: a partition may hold none of them
    (nothing published there since the time given, or before its hand-over)."""
    return f"offsets {first}..{end - 1}" if end > first else "no offsets"


def _instant(since: str) -> int | str | None:
    """A ``since`` as the instant it names (None for ``earliest``); its text when it names none (a record made
    before times before 1970 were refused)."""
    try:
        return since_ms(since)
    except ValueError:
        return since


def run_reprocess(args: argparse.Namespace, settings: Settings) -> int:
    settings = _settings_of(args, settings)
    try:
        at = since_ms(args.since)
    except ValueError as exc:
        log.error("usage_refused", error=str(exc))
        return EXIT_USAGE
    if at is not None and at > time.time() * 1000:
        # It would reset the counter and count nothing again: the counter emptied, with no word of it.
        log.error("usage_refused", error=f"--from {args.since} is in the future: there is nothing after it to count "
                  f"again (to empty the counter, countersink reset {args.counter})")
        return EXIT_USAGE
    counters = _definitions_with(args.counter, settings)
    if counters is None:
        return EXIT_USAGE
    return run_async(Backfill(settings, counters, args.counter).reprocess(args.since, args.wait_s))


def _definitions_with(counter: str, settings: Settings) -> CounterSet | None:
    """The definitions file, None (refused, said) when it cannot be read or does not define ``counter``."""
    counters = load_definitions_or_refuse(settings.consumer.counters_file, settings.cassandra.max_row_bytes)
    if counters is not None and counter not in counters:
        log.error("usage_refused", error=f"no counter {counter!r} in {counters.source}")
        return None
    return counters


class Backfill:
    """One backfill or reprocess of one counter, run from the command line."""

    def __init__(self, settings: Settings, counters: CounterSet, counter: str) -> None:
        self.settings, self.counters, self.counter = settings, counters, counter
        self.group = settings.consumer.group_id
        self.host = f"{socket.gethostname()}:backfill"
        self._printed: dict[tuple[str, int], float] = {}
        # Called with the name of each step of a reprocess's setup once it is done (a test stops it there).
        self.on_step: Callable[[str], None] = lambda step: None
        self.reached = ""  # the last step of a reprocess's setup done ("": none)

    async def _checked(self, client: CassandraClient, *, since_required: bool) -> bool:
        """The counter is recorded for the live group with this meaning; its backfill group is declared."""
        row = await CounterRegistry(client).record(self.counter)
        if row is None or row.get("kind") is None:
            log.error("backfill_refused", counter=self.counter,
                      error=f"{self.counter!r} is not in the counter registry: start the live consumers with its "
                      "definition first (they record where they count it from)")
            return False
        recorded_group = row.get("consumer_group")
        if recorded_group != self.group:
            log.error("backfill_refused", counter=self.counter,
                      error=f"{self.counter!r} is counted by consumer group {recorded_group!r}, not {self.group!r}: "
                      f"run with --group {recorded_group}")
            return False
        recorded_since = registry.from_record(row["definition"]).since
        if since_required and recorded_since is None:
            log.error("backfill_refused", counter=self.counter,
                      error=f"{self.counter!r} was first counted without since: its live mutators counted it from "
                      "where they started, and a backfill would count those events twice (use countersink reprocess "
                      f"{self.counter} --from TIME)")
            return False
        since = self.counters[self.counter].since
        # One instant however written (2026-11-01T01:00:00+01:00 is 2026-11-01T00:00:00Z, a TOML time is its text).
        if recorded_since is not None and since is not None and _instant(since) != _instant(recorded_since):
            log.error("backfill_refused", counter=self.counter,
                      error=f"{self.counter!r} has since = {since!r} in {self.counters.source}, but it was first "
                      f"counted with since = {recorded_since!r}, which is fixed then: put it back (to count again "
                      f"from another time, use countersink reprocess {self.counter} --from TIME)")
            return False
        given = self.counters[self.counter].topics
        others = [t for t in registry.from_record(row["definition"]).topics if t not in given]
        if others:
            # Recorded by a consumer whose definitions gave the counter those topics too (the registry never
            # forgets one: a rolling deploy may still count it). Read as the file says: a topic removed is not
            # read again, and one still counted is the file's to give.
            log.warning("topics_not_read", counter=self.counter, topics=others,
                        note=f"the counter registry records {self.counter!r} on these topics too, which "
                        f"{self.counters.source} does not give it: this run reads none of them")
        recreated = await self._recreated_topics(client)
        if recreated:
            for error in recreated:
                log.error("backfill_refused", counter=self.counter, error=str(error))
            return False
        try:
            # Meaning and drop checked as any consumer's; the backfill's own group is the declared exception.
            await CounterRegistry(client).register(CounterSet((self.counters[self.counter],), self.counters.source),
                                                   self.host, backfill_group(self.group, self.counter),
                                                   backfill={self.counter})
        except (CounterDroppedError, DefinitionChangedError, GroupMismatchError) as exc:
            for problem in getattr(exc, "problems", (exc,)):
                log.error("backfill_refused", counter=self.counter, error=problem.line)
            return False
        return True

    async def _recreated_topics(self, client: CassandraClient) -> list[TopicRecreatedError]:
        """The counter's topics deleted and created again since the keyspace recorded their ids: the hand-over
        offsets and positions recorded are the old topics' (countersink.topic_ids)."""
        return list((await recreated_topics(self.settings.kafka, client, self.counters[self.counter].topics,
                                            self.host)).values())

    async def _partitions(self) -> list[tuple[str, int]]:
        producer = make_producer(self.settings.kafka)
        await producer.start()
        try:
            return await topic_partitions(self.settings.kafka, producer, self.counters[self.counter].topics)
        finally:
            await producer.stop()

    async def _starts(self, partitions: Sequence[tuple[str, int]], since: str) -> dict[tuple[str, int], int]:
        """Where ``since`` falls in each partition: its log start for ``earliest``, else the first record at or
        after the time (the log end when there is none)."""
        consumer = make_consumer(self.settings.kafka, enable_auto_commit=False, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t, p in partitions]
            at = since_ms(since)
            if at is None:
                begin = await consumer.beginning_offsets(tps)
                return {(tp.topic, tp.partition): int(begin[tp]) for tp in tps}
            found = await consumer.offsets_for_times(dict.fromkeys(tps, at))
            end = await consumer.end_offsets(tps)
            return {(tp.topic, tp.partition): int(end[tp]) if found.get(tp) is None else int(found[tp].offset)
                    for tp in tps}
        finally:
            await consumer.stop()

    def _progress(self, topic: str, partition: int, first: int, through: int, end: int) -> None:
        now = time.monotonic()
        if through < end - 1 and now - self._printed.get((topic, partition), float("-inf")) < PROGRESS_EVERY_S:
            return
        self._printed[(topic, partition)] = now
        done = max(0, through + 1 - first)
        share = 100.0 if end <= first else min(100.0, 100.0 * done / (end - first))
        print(f"  {topic}/{partition}: counted through offset {through} of {first}..{end - 1} ({share:.0f}%)",
              flush=True)

    async def _run(self, client: CassandraClient, cell: str, epochs: Epochs | None,
                   spans: Sequence[Span]) -> int:
        """Backfill every span of ``cell``, one partition after the other, each recorded finished."""
        settings, config = self.settings, self.settings.consumer
        schema_cache = make_schema_cache(settings.schema_registry)
        schemas = SchemaLoader(settings.schema_registry, self.counters, schema_cache)
        router = EventRouter(self.counters, max_event_bytes=config.max_event_bytes,
                             max_future_skew_s=config.max_future_skew_s,
                             decoders=formats.decoders(self.counters.formats, schema_cache, self.counters.schema_base))
        store = CassandraStore(client)
        resets = CassandraResets(client, store.read_cl, store.write_cl)
        kafka = KafkaRecordSource(settings.kafka)
        source = SchemaLoadingSource(kafka, schemas) if schemas.needed else kafka
        group = backfill_group(self.group, cell)

        def applier(topic: str, partition: int) -> Applier:
            return Applier(router, self.counters, topic, partition, RetryWindow(config.retry_window_records), resets,
                           only=frozenset({self.counter}), epochs_from=epochs)

        # Before each write, as a live consumer: a counter dropped meanwhile is never written back.
        look = registry_look(client, self.counter, config.registry_check_s)
        # The counter's refusals below H: no live consumer sent them (consumer.dead_letters' topic and limits).
        producer = make_producer(settings.kafka)
        await producer.start()
        dead_letters = DeadLetters(producer, config)
        counting = "a partition"  # the partition being counted, for a run taken over
        try:
            for span in spans:
                counting = f"{span.topic}/{span.partition}"
                started = await backfill_partition(
                    store, source, functools.partial(applier, span.topic, span.partition), span, group, self.host,
                    flush_interval_s=config.flush_interval_s, flush_max_dirty=config.flush_max_dirty,
                    on_progress=self._progress, before_write=look, dead_letters=dead_letters)
                await mark_finished(client, self.group, cell, span.topic, span.partition)
                print(f"  {span.topic}/{span.partition}: done, {_offsets(span.first, span.end)} counted "
                      f"(this run from {started})", flush=True)
        except RecordsLostError as exc:
            log.error("backfill_failed", counter=self.counter, error=str(exc),
                      action="the retained log no longer holds them: nothing more can be counted there")
            return EXIT_FAILED
        except CounterDroppedDuringBackfillError as exc:
            log.error("backfill_refused", counter=self.counter, error=str(exc))
            return EXIT_USAGE
        except FencedError:
            # Another run of this command (its mutator claimed the partition after this one): it goes on from
            # what this run flushed, and this run's state, never written past its last flush, is dropped.
            log.error("backfill_taken_over", counter=self.counter, partition=counting,
                      error=f"another run of this backfill of {cell} took {counting} over while this one counted it",
                      action="that run counts on from this one's last flush (nothing is counted twice); this one "
                             "stopped: run it again once the other has ended to see every partition finished")
            return EXIT_FAILED
        finally:
            dead_letters.abandon()
            await producer.stop()
            await kafka.stop()
            await schemas.stop()
        print(f"backfill of {cell} finished: every partition counted up to its hand-over", flush=True)
        return 0

    async def _wait_for_handovers(self, client: CassandraClient, partitions: Sequence[tuple[str, int]],
                                  wait_s: int) -> dict[tuple[str, int], int] | None:
        """The hand-over of the counter in every partition, once the live consumers have recorded them all;
        None (said) when they have not within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        pauses = Backoff(first_s=0.5, max_s=5.0).pauses()
        while True:
            handovers = await read_handovers(client, self.group, self.counter)
            missing = [tp for tp in partitions if tp not in handovers or handovers[tp].offset is None]
            if not missing:
                return {tp: int(h.offset) for tp, h in handovers.items() if h.offset is not None}
            if time.monotonic() >= deadline:
                log.error("backfill_refused", counter=self.counter,
                          error=f"no live consumer recorded where it counts {self.counter} from in "
                          f"{', '.join(f'{t}/{p}' for t, p in missing)} within {wait_s}s: run the consumers "
                          "with its definition")
                return None
            print(f"waiting for the live consumers to take {', '.join(f'{t}/{p}' for t, p in missing)} with "
                  f"{self.counter}", flush=True)
            await pause_unless_stopped(pauses(), None)

    async def backfill(self, wait_s: int) -> int:
        definition = self.counters[self.counter]
        async with CassandraClient(self.settings.cassandra, app="countersink-backfill") as client:
            resets = await read_resets(client, self.counter, self.settings.cassandra.replay_read_consistency)
            # First the epoch a reprocess stopped before its reset would have taken (per-key resets take epochs
            # too): said whatever else is resumed (an earlier reprocess, finished or not, is the current epoch's).
            planned = max((r.epoch for r in resets), default=0) + 1
            stopped = await read_handovers(client, self.group, cell_name(self.counter, planned))
            if stopped:
                # Nothing to resume: the counter is as it was. Said, and a counter with since is backfilled.
                since = next(iter(stopped.values())).reprocess_from
                why = (f"a reprocess of {self.counter} was stopped before it reset anything (the counter is as it "
                       f"was): to count again from {since}, run countersink reprocess {self.counter} --from {since} "
                       "again")
                if definition.since is None:
                    log.error("backfill_refused", counter=self.counter, error=why)
                    return EXIT_USAGE
                log.warning("reprocess_not_started", counter=self.counter, error=why)
            epoch = current_epochs(resets).all_keys.get(self.counter, 0)
            if epoch:
                reset = next(r for r in resets if r.epoch == epoch)
                plan = await read_handovers(client, self.group, cell_name(self.counter, epoch))
                # A plan left by a reprocess that lost its epoch to another reset is not this reset's.
                if plan and all(h.reset_id in (None, reset.reset_id) for h in plan.values()):
                    return await self._resume_reprocess(client, reset, plan, wait_s)
            if definition.since is None:
                log.error("backfill_refused", counter=self.counter,
                          error=f"{self.counter!r} has no since in {self.counters.source}: there is nothing before "
                          "its hand-over to count (countersink reprocess counts again from a time)")
                return EXIT_USAGE
            if not await self._checked(client, since_required=True):
                return EXIT_USAGE
            partitions = await self._partitions()
            if not partitions:
                log.error("backfill_refused", counter=self.counter, error="Kafka knows no partition of its topics")
                return EXIT_FAILED
            handovers = await self._wait_for_handovers(client, partitions, wait_s)
            if handovers is None:
                return EXIT_FAILED
            starts = await self._starts(partitions, definition.since)
            spans = []
            group = backfill_group(self.group, self.counter)
            print(f"backfill of {self.counter} since {definition.since}, group {group}:", flush=True)
            for topic, partition in partitions:
                h = handovers[(topic, partition)]
                first = await fix_start(client, self.group, self.counter, topic, partition,
                                        min(starts[(topic, partition)], h))
                spans.append(Span(topic, partition, first, h))
                print(f"  {topic}/{partition}: {_offsets(first, h)}, live from {h}", flush=True)
            return await self._run(client, self.counter, None, spans)

    async def _ends(self, client: CassandraClient, reset: Reset, plan: Mapping[tuple[str, int], int | None],
                    points: Mapping[tuple[str, int], int], live: Mapping[tuple[str, int], int]
                    ) -> dict[tuple[str, int], int]:
        """Record the end of each planned partition's span that has none yet and return every end known: the
        reset's point P there, or the counter's hand-over H when that is later (a counter whose live mutators
        first took the partition with it after the reset count from H on, the epoch's reset already applied
        at their start: (P, H) is the reprocess's to count). A partition whose point is not known is left out."""
        cell = cell_name(self.counter, reset.epoch)
        ends: dict[tuple[str, int], int] = {}
        for (topic, partition), end in sorted(plan.items()):
            if end is None:
                point = points.get((topic, partition))
                if point is None:
                    continue
                end = await fill_end(client, self.group, cell, topic, partition,
                                     max(point, live.get((topic, partition), point)))
            ends[(topic, partition)] = end
        return ends

    async def _resume_reprocess(self, client: CassandraClient, reset: Reset, plan: Mapping[tuple[str, int], Handover],
                                wait_s: int) -> int:
        """Go on with the reprocess of the counter's current epoch from its recorded plan; refuse (exit 2) when
        its reset is not in every planned partition (killed while publishing it: a new reprocess is needed)."""
        cell = cell_name(self.counter, reset.epoch)
        if not await self._checked(client, since_required=False):
            return EXIT_USAGE
        since = next((h.reprocess_from for h in plan.values() if h.reprocess_from), None)
        live: dict[tuple[str, int], int] = {}
        if any(h.offset is None for h in plan.values()):
            found = await self._wait_for_handovers(client, sorted(plan), wait_s)
            if found is None:
                return EXIT_FAILED
            live = found
        points = await read_points(client, self.counter, reset.epoch, dict(reset.partitions), reset_id=reset.reset_id)
        ends = await self._ends(client, reset, {tp: h.offset for tp, h in plan.items()}, points, live)
        missing = sorted(tp for tp in plan if tp not in ends)
        if missing:
            log.error("backfill_refused", counter=self.counter,
                      error=f"the reprocess of {self.counter} into epoch {reset.epoch} was stopped before its reset "
                      f"reached {', '.join(f'{t}/{p}' for t, p in missing)}: its span there is unknown; run "
                      f"countersink reprocess {self.counter} --from {since or 'TIME'} again")
            return EXIT_USAGE
        spans = [Span(t, p, min(h.start_offset if h.start_offset is not None else ends[(t, p)], ends[(t, p)]),
                      ends[(t, p)]) for (t, p), h in sorted(plan.items())]
        print(f"resuming the reprocess of {self.counter} into epoch {reset.epoch}"
              f"{f' from {since}' if since else ''}:", flush=True)
        return await self._run(client, cell, Epochs({self.counter: reset.epoch}, {}, {(self.counter, reset.epoch)}),
                               spans)

    async def reprocess(self, since: str, wait_s: int) -> int:
        """Reset every key of the counter, then count it again from ``since``. Its plan (the reset it will be,
        ``since`` and each partition's start) is recorded before the reset, each partition's end (the reset's
        point, or a later hand-over) after it: killed at any step, ``countersink backfill COUNTER`` goes on
        from what was recorded, or refuses to when the reset did not reach every partition. Interrupted (Ctrl-C),
        it says which of those it is (``reprocess_interrupted``)."""
        self.reached = ""
        try:
            return await self._reprocess(since, wait_s)
        except asyncio.CancelledError:
            log.warning("reprocess_interrupted", counter=self.counter, step=self.reached or "none",
                        next_step=self._after_interruption(since))
            raise

    def _reached(self, step: str) -> None:
        self.reached = step
        self.on_step(step)

    def _after_interruption(self, since: str) -> str:
        again = shlex.join(["countersink", "reprocess", self.counter, "--from", since])
        if self.reached in ("", "planned"):
            return f"nothing was reset: to count again, run {again}"
        if self.reached in ("reset", "published"):
            return (f"the counter reads the new epoch, which holds only what is counted again: run {again} (a new "
                    "epoch, which supersedes this one)")
        return f"resume it: countersink backfill {self.counter} (it counts what is left)"

    async def _reprocess(self, since: str, wait_s: int) -> int:
        async with CassandraClient(self.settings.cassandra, app="countersink-reprocess") as client:
            partitions = await self._partitions()
            if not partitions:
                log.error("reprocess_refused", counter=self.counter, error="Kafka knows no partition of its topics")
                return EXIT_FAILED
            if not await self._checked(client, since_required=False):
                return EXIT_USAGE
            # The hand-overs first (every counter has them, with since or without): a partition first taken with
            # the counter after the reset is counted live from H > P on, and the reprocess counts up to H there.
            found = await self._wait_for_handovers(client, partitions, wait_s)
            if found is None:
                return EXIT_FAILED
            live = found
            # The starts first: a time after the reset would otherwise fall past its control records.
            starts = await self._starts(partitions, since)
            counts = {topic: 1 + max((p for t, p in partitions if t == topic), default=-1)
                      for topic in self.counters[self.counter].topics}
            write_cl = self.settings.cassandra.write_consistency
            requested_by = command_requester()
            epoch = await next_epoch(client, self.counter, write_cl)
            reset = Reset(new_reset_id(self.counter, epoch), self.counter, epoch, frozenset(),
                          tuple(sorted(counts.items())))
            cell = cell_name(self.counter, epoch)
            plan = {where: starts[where] for where in partitions}
            claimed_us = None
            if await record_plan(client, self.group, cell, plan, reset.reset_id, since, requested_by) is None:
                self._reached("planned")
                claimed_us = await recorded_then_settled(claim_epoch(client, reset, requested_by, write_cl))
            if claimed_us is None:
                log.error("reprocess_refused", counter=self.counter,
                          error=f"another reset of {self.counter} took epoch {epoch} meanwhile; nothing was reset: "
                          "run the reprocess again")
                return EXIT_FAILED
            # The epoch is this reset's: its plan is made its own again (a run planning the same epoch may have
            # written over it) and claimed, which no other run's plan writes over.
            taken = await record_plan(client, self.group, cell, plan, reset.reset_id, since, requested_by,
                                      claimed_us=claimed_us)
            if taken is not None:
                raise CountersinkError(f"reset {taken} holds the plan of {cell}, whose epoch is {reset.reset_id}'s")
            self._reached("reset")
            producer = make_producer(self.settings.kafka)
            await producer.start()
            try:
                async def send(topic: str, partition: int, value: bytes, headers: list[tuple[str, bytes]]) -> int:
                    return int((await (await producer.send(topic, value, partition=partition, headers=headers))).offset)

                positions = await publish_controls(reset, partitions, send)
            finally:
                await producer.stop()
            self._reached("published")
            await CassandraResets(client, self.settings.cassandra.replay_read_consistency,
                                  write_cl).record_positions(positions)
            self._reached("positions")
            print(f"reset every key of {self.counter}: epoch {reset.epoch}, id {reset.reset_id}, by {requested_by}",
                  flush=True)
            points = {(p.topic, p.partition): p.offset for p in positions}
            spans = []
            for topic, partition in partitions:
                where = (topic, partition)
                end = (await self._ends(client, reset, {where: None}, points, live))[where]
                spans.append(Span(topic, partition, min(starts[where], end), end))
                print(f"  {topic}/{partition}: control record at {points[where]}; counting "
                      f"{_offsets(min(starts[where], end), end)} again", flush=True)
                self._reached(f"end {topic}/{partition}")
            return await self._run(client, cell, Epochs({self.counter: reset.epoch}, {}, {(self.counter, reset.epoch)}),
                                   spans)
