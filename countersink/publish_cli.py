"""``countersink publish``: JSON lines from a file or stdin to a Kafka topic, one record per line.

Each line goes as it is (its numbers keep their text: a decimal is never rounded on the way). The record's
key, when ``--key`` names fields, is their values joined by ``|``: events of one key go to one partition,
which is where a publisher's retry is recognised and dropped. With ``--key-separator SEP`` each line is
``KEY SEP JSON`` instead (as ``kafka-console-producer``'s ``parse.key``): the text before the first ``SEP`` is the
record's key, sent as it is, and the rest is the value. With ``--timestamp FIELD`` the record's Kafka timestamp
is the line's top-level ``FIELD`` (an integer, milliseconds since 1970), so events published later keep their
own time; without it the producer stamps each record with the time it is sent. The producer is idempotent
(acks=all), so its own retries never duplicate a record.

With ``--format avro|protobuf|json-schema`` and ``--schema FILE``, the schema is registered in the schema
registry (``COUNTERSINK_SCHEMA_REGISTRY__URL``) under the subject ``TOPIC-value`` (or ``--subject``), and each
line is encoded with it and sent in the Confluent wire format: magic byte 0, the schema's id, (for Protobuf the
message indexes of ``--message``), then the payload. Lines are JSON objects in every format (for Protobuf in
the proto3 JSON mapping: enum names, RFC 3339 timestamps).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from aiokafka.errors import KafkaError
from pydantic_core import from_json

from countersink.cli import EXIT_USAGE, run_async
from countersink.kafka import make_producer, missing_topics
from countersink.logs import get_logger
from countersink.schema_registry import SchemaRegistryClient, SchemaRegistryUnavailableError
from countersink.settings import Settings
from countersink.topics_cli import _topic_name
from schemas.bounded import nested_deeper_than, read_text_at_most
from schemas.errors import CountersinkError
from schemas.events import DEFAULT_MAX_DEPTH
from schemas.formats import (
    FORMATS,
    SCHEMA_TYPE,
    ProtoSchema,
    SchemaError,
    avro_encoder,
    frame,
    json_schema_encoder,
)

log = get_logger(__name__)


class BadLineError(ValueError):
    """Raised for an input line that cannot be published: not a JSON object, too long, or without its key."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", type=_topic_name, help="the topic to publish to (it must exist)")
    parser.add_argument("file", nargs="?", default="-", metavar="FILE",
                        help="JSON lines to publish; - reads stdin (default: -)")
    parser.add_argument("--key", action="append", default=[], metavar="FIELD",
                        help="field path whose value keys the record (repeat for several, joined by |); "
                        "without it records have no key and are spread over the partitions")
    parser.add_argument("--key-separator", metavar="SEP",
                        help="each line is KEY SEP JSON: the text before the first SEP is the record's key "
                        "(not part of the value); not with --key")
    parser.add_argument("--timestamp", metavar="FIELD",
                        help="the record's timestamp is the line's top-level FIELD, an integer of milliseconds "
                        "since 1970 (default: the time the record is sent)")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="the records' format (default: json, each line as it is); the others need --schema")
    parser.add_argument("--schema", type=Path, metavar="FILE",
                        help="the writer schema (.avsc, .proto or JSON Schema), registered in the schema registry")
    parser.add_argument("--message", metavar="NAME", help="protobuf: the full name of the message (pkg.Name)")
    parser.add_argument("--subject", metavar="SUBJECT", help="the registry subject (default: TOPIC-value)")


def record_key(event: Any, fields: list[str]) -> bytes | None:
    """The Kafka key of ``event``: the values of ``fields`` (dotted paths) as text, joined by ``|``."""
    if not fields:
        return None
    parts = []
    for path in fields:
        value = event
        for name in path.split("."):
            if not isinstance(value, dict) or name not in value:
                raise BadLineError(f"no field {path!r} for the key")
            value = value[name]
        if isinstance(value, bool):
            parts.append("true" if value else "false")
        elif isinstance(value, str | int):
            parts.append(str(value).replace("\\", "\\\\").replace("|", "\\|"))
        else:
            raise BadLineError(f"key field {path!r} is not a string, integer or boolean")
    try:
        return "|".join(parts).encode()
    except UnicodeEncodeError:
        raise BadLineError("a key field holds a lone surrogate (\\ud800 to \\udfff), which no UTF-8 key can carry"
                           ) from None


def parse_line(line: bytes, fields: list[str], max_bytes: int) -> tuple[bytes, bytes | None]:
    """The record's value and key for one input line."""
    value, key, _ = parse_record(line, LineFormat(fields), max_bytes)
    return value, key


@dataclasses.dataclass(frozen=True)
class LineFormat:
    """Where a line's record key and timestamp come from: ``--key`` fields or ``--key-separator``, and
    ``--timestamp``."""

    key_fields: list[str] = dataclasses.field(default_factory=list)
    key_separator: bytes | None = None
    timestamp_field: str | None = None


_BOM = b"\xef\xbb\xbf"


def json_event(text: bytes) -> Any:
    """The JSON object a line holds, read by the parser the consumer reads a JSON event with (a line it would
    refuse whole, a lone surrogate's escape in any field among them, is refused here; NaN, which it reads, is
    not)."""
    try:
        event = from_json(text)
    except ValueError as exc:
        raise BadLineError(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise BadLineError("not a JSON object")
    # As the consumer looks: only a text with more brackets than the bound can pass it.
    if text.count(b"{") + text.count(b"[") > DEFAULT_MAX_DEPTH and nested_deeper_than(event, DEFAULT_MAX_DEPTH):
        raise BadLineError(f"nested deeper than {DEFAULT_MAX_DEPTH} levels, which the consumer refuses whole")
    return event


# Kafka's timestamps are milliseconds in a signed 64-bit integer; -1 means none, so none below 0 is sent.
MAX_TIMESTAMP_MS = 2**63 - 1


def parse_record(line: bytes, form: LineFormat, max_bytes: int) -> tuple[bytes, bytes | None, int | None]:
    """The record's value, key and timestamp (None: the producer's clock) for one input line."""
    value = line.rstrip(b"\r\n").removeprefix(_BOM)  # a file's first line as a Windows editor saves it
    key = None
    if form.key_separator is not None:
        key, found, value = value.partition(form.key_separator)
        if not found:
            raise BadLineError(f"no key separator {form.key_separator.decode(errors='replace')!r}")
    if len(value) > max_bytes:
        raise BadLineError(f"longer than {max_bytes} bytes (COUNTERSINK_CONSUMER__MAX_EVENT_BYTES)")
    if key is not None and len(key) > max_bytes:
        raise BadLineError(f"key longer than {max_bytes} bytes (COUNTERSINK_CONSUMER__MAX_EVENT_BYTES)")
    event = json_event(value)
    if key is None:
        key = record_key(event, form.key_fields)
    timestamp = None
    if form.timestamp_field is not None:
        timestamp = event.get(form.timestamp_field)
        if type(timestamp) is not int or not 0 <= timestamp <= MAX_TIMESTAMP_MS:
            raise BadLineError(f"timestamp field {form.timestamp_field!r} is not an integer of milliseconds "
                               "since 1970")
    return value, key, timestamp


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How a line becomes a record's value in a schema format: the registered schema's id, and an encoder."""

    schema_id: int
    encode: Callable[[Any], bytes]
    indexes: tuple[int, ...] | None = None

    def value(self, line: bytes) -> bytes:
        event = json_event(line.removeprefix(_BOM))
        try:
            payload = self.encode(event)
        except ValueError as exc:  # one line (protoc's and jsonschema's texts hold newlines)
            raise BadLineError(" ".join(str(exc).split())[:500]) from None
        return frame(self.schema_id, payload, self.indexes)


async def register(settings: Settings, topic: str, choice: SchemaChoice) -> Encoding:
    """Register the schema (its subject: ``TOPIC-value`` unless given) and return the encoding of lines."""
    format_, message, subject = choice.format, choice.message, choice.subject
    max_bytes = settings.schema_registry.max_schema_bytes
    text = read_text_at_most(choice.schema, max_bytes)
    indexes = None
    if format_ == "avro":
        encode = avro_encoder(text, max_bytes=max_bytes)
    elif format_ == "protobuf":
        if not message:
            raise SchemaError("--message names the protobuf message the lines are (pkg.Name)")
        proto = await asyncio.to_thread(ProtoSchema, text, max_bytes=max_bytes)
        indexes = proto.indexes_of(message)
        encode = proto.encoder(indexes)
    else:
        encode = json_schema_encoder(text, max_bytes=max_bytes)
    async with SchemaRegistryClient(settings.schema_registry) as client:
        schema_id = await client.register(subject or f"{topic}-value", SCHEMA_TYPE[format_], text)
    log.info("schema_registered", subject=subject or f"{topic}-value", schema_id=schema_id, format=format_)
    return Encoding(schema_id, encode, indexes)


@dataclasses.dataclass(frozen=True)
class SchemaChoice:
    """``--format``, ``--schema``, ``--message`` and ``--subject`` of a schema format."""

    format: str
    schema: Path
    message: str | None = None
    subject: str | None = None


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.key_separator is not None and (args.key or not args.key_separator):
        log.error("usage_refused", error="--key-separator is a non-empty text, and takes the place of --key")
        return EXIT_USAGE
    form = LineFormat(args.key, None if args.key_separator is None else args.key_separator.encode(),
                      args.timestamp)
    choice = None
    if args.format == "json" and (args.schema or args.message or args.subject):
        # A schema given without its format was ignored: the lines went as JSON text to a topic of another format.
        log.error("usage_refused", error="--schema, --message and --subject go with --format avro, protobuf or "
                  "json-schema")
        return EXIT_USAGE
    if args.format != "protobuf" and args.message:
        log.error("usage_refused", error="--message names a Protobuf message: it goes with --format protobuf")
        return EXIT_USAGE
    if args.format != "json":
        if args.schema is None:
            log.error("usage_refused", error=f"--format {args.format} needs --schema FILE")
            return EXIT_USAGE
        choice = SchemaChoice(args.format, args.schema, args.message, args.subject)
    if args.file == "-":
        if sys.stdin is None:  # closed (`<&-`): nothing to read, said as such
            log.error("usage_refused", error="standard input is closed: give a file, or pipe the lines in")
            return EXIT_USAGE
        return run_async(publish(settings, args.topic, sys.stdin.buffer, form, from_pipe=_is_pipe(sys.stdin),
                                 schema=choice))
    try:
        stream = Path(args.file).open("rb")  # noqa: SIM115 - closed below, after the run
    except OSError as exc:
        log.error("usage_refused", error=f"{args.file}: {exc.strerror}")
        return EXIT_USAGE
    with stream:
        return run_async(publish(settings, args.topic, stream, form, from_pipe=False, schema=choice))


async def publish(settings: Settings, topic: str, stream: IO[bytes], form: LineFormat, *,
                  from_pipe: bool, schema: SchemaChoice | None = None) -> int:
    """Publish every line of ``stream``; stop at the first line that cannot be published (exit 2). With a
    ``schema``, it is registered first and every line is encoded with it."""
    if missing := await missing_topics(settings.kafka, [topic]):
        log.error("topic_missing", topic=missing[0],
                  hint=f"create it first: countersink topics create {missing[0]}")
        return EXIT_USAGE
    encoding = None
    if schema is not None:
        try:
            encoding = await register(settings, topic, schema)
        except SchemaRegistryUnavailableError as exc:  # a server away: exit 1, as for Kafka (docs/running.md)
            log.error("schema_registry_unavailable", error=str(exc))
            return 1
        except (OSError, UnicodeDecodeError, CountersinkError) as exc:
            log.error("schema_refused", error=str(exc))
            return EXIT_USAGE
    from tqdm import tqdm

    limit = settings.consumer.max_event_bytes
    producer = make_producer(settings.kafka)
    await producer.start()
    acks = _Acknowledged()
    progress = tqdm(unit=" records", desc=f"publish {topic}", file=sys.stderr, disable=not sys.stderr.isatty())
    try:
        async for number, line in _lines(stream, from_pipe=from_pipe, limit=limit + 2):
            if not line.removeprefix(_BOM).strip():  # an empty line (a file saved with a BOM and no line)
                continue
            try:
                value, key, timestamp = parse_record(line, form, limit)
                if encoding is not None:
                    value = encoding.value(value)
            except BadLineError as exc:
                if await acks.settle():
                    log.error("line_refused", line=number, error=str(exc), published_before=acks.count)
                    return EXIT_USAGE
                return acks.failed()
            try:
                acks.pending.append((number, await producer.send(topic, value, key=key, timestamp_ms=timestamp)))
            except KafkaError as exc:  # refused before sending (a record too large for the producer)
                acks.failure = acks.failure or (number, exc)
                acks.unacknowledged.append(number)
                await acks.settle()
                return acks.failed()
            progress.update()
            if len(acks.pending) >= 10_000 and not await acks.settle():  # bounded: a batch of acknowledgements
                return acks.failed()
        if not await acks.settle():
            return acks.failed()
    except asyncio.CancelledError:  # Ctrl-C: what was acknowledged is said, for a run again from that line on
        await producer.stop()  # sends what it holds, and waits for its answers
        await acks.settle()
        log.warning("publish_interrupted", published=acks.count, first_line_not_published=acks.first_unacknowledged(),
                    note="lines before it were all acknowledged; some after it may have been (keys in other "
                    "partitions)")
        raise
    finally:
        progress.close()
        await producer.stop()
    print(f"published {acks.count} record{'' if acks.count == 1 else 's'} to {topic}")
    return 0


class _Acknowledged:
    """The records sent (line number, future), and what Kafka acknowledged of them: said when a run stops early,
    so that it can be run again from the first line not published (a record Kafka refused fails with the others
    of its request, which may hold earlier lines)."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, asyncio.Future[Any]]] = []
        self.count = 0
        self.failure: tuple[int, BaseException] | None = None
        self.unacknowledged: list[int] = []

    async def settle(self) -> bool:
        """Wait for every answer; True when all were acknowledged so far."""
        outcomes = await asyncio.gather(*(future for _, future in self.pending), return_exceptions=True)
        for (number, _), outcome in zip(self.pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.unacknowledged.append(number)
                if self.failure is None or number < self.failure[0]:
                    self.failure = (number, outcome)
            else:
                self.count += 1
        self.pending.clear()
        return self.failure is None

    def first_unacknowledged(self) -> int | None:
        numbers = [number for number, _ in self.pending] + self.unacknowledged
        return min(numbers) if numbers else None

    def failed(self) -> int:
        """Say what Kafka refused: the lines of the refused requests (Kafka refuses a request whole, so the line
        at fault is among them, not always the first), and what was published."""
        assert self.failure is not None
        _, exc = self.failure
        log.error("publish_failed", error=f"{type(exc).__name__}: {exc}"[:500], published=self.count,
                  first_line_not_published=self.first_unacknowledged(),
                  lines_not_published=len(self.unacknowledged) + len(self.pending),
                  note="every line before the first not published was; Kafka refuses a request whole, so the line "
                  "at fault may be a later one")
        return 1


def _is_pipe(stream: IO[str]) -> bool:
    """Whether ``stream`` is read as a pipe by the event loop (a pipe, a socket or a terminal, which may have
    nothing new for a while); anything else (a file, /dev/null under cron or ``docker run`` without ``-i``) is
    read as a file: the event loop cannot watch a character device, and waited on it for good."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stream.isatty()


async def _lines(stream: IO[bytes], *, from_pipe: bool, limit: int) -> Any:
    """(line number, line) of ``stream``. Standard input is read by the event loop as a pipe, so the producer
    keeps sending while a pipe or a terminal has nothing new, and Ctrl-C ends a run waiting for a line at once
    (a thread blocked reading it held the process until the next line came). A line longer than ``limit`` comes
    as ``limit`` bytes and more, which :func:`parse_record` refuses as too long."""
    number = 0
    if from_pipe:
        reader = asyncio.StreamReader(limit=limit)
        try:
            await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), stream)
        except ValueError:  # a regular file given as standard input: read as a file (it never waits)
            from_pipe = False
        else:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # past the limit: the line is refused, and the run stops there
                    line = b"x" * limit + b"\n"
                if not line:
                    return
                number += 1
                yield number, line
    while line := stream.readline(limit):
        number += 1
        yield number, line
