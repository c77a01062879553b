"""``countersink serve``: counters over HTTP as JSON, for services that do not speak Python.

``GET /counters/{name}/{key}`` reads one instance, ``GET /counters/{name}?key=a&key=b`` several at once, and
``GET /counters/{name}/{key}/series?from=&to=[&step=|&rollup=true]`` a bucketed counter's buckets in a range,
one per bucket, merged per step, or merged into one. A counter with no key fields has one instance (its key is
empty): ``GET /counters/{name}`` reads it and ``GET /counters/{name}/series`` its buckets. ``/openapi.json``
describes them. ``/healthz``, ``/readyz`` and ``/metrics`` are there for probes and Prometheus. Reads go
straight to Cassandra (tally + shards, merged), like ``countersink get``; the server keeps no cache, so a value
is as fresh as the last flush.

Untrusted input is bounded: names must be counter identifiers, keys are limited in size and number, ranges
in buckets, and a read that takes longer than ``request_timeout_s`` answers 504 rather than holding the
connection. The request target, header lines, bodies and requests handled at once are bounded too (414,
400, 413, 503).

With ``tls_cert``/``tls_key`` the server speaks HTTPS only. With bearer tokens set (``tokens`` or
``tokens_file``), every route but ``/healthz`` and ``/readyz`` answers 401 without one of them; tokens are
compared in constant time, and a tokens file is read again within a second of a change (rotation without a
restart: add the new token, move the clients, remove the old one). A tokens file is applied whole or not at
all: one that cannot be read, holds a bad line or is deleted revokes every token it held. Tokens without
TLS need ``allow_insecure``.

With admin tokens (``admin_tokens``/``admin_tokens_file``, ``NAME:TOKEN`` each) and a Cassandra role that may
write the resets tables (``admin_cassandra_username``), ``POST /counters/{name}/reset`` resets a counter (a
JSON body ``{"keys": [...]}``, or none for every key) as ``countersink reset`` does, recorded as asked by the
token's name; a read token there answers 403. Without them the route is not served.

Every answer of 400 or more is a problem document (RFC 9457), aiohttp's own 404 and 405 and its HTTP
parser's refusals included, and none quotes the request: a header the parser refuses (an oversize
``Authorization``) reaches neither the answer nor the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import re
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiohttp import web
from aiokafka import errors
from pydantic import ValidationError

from countersink.cassandra import (
    CassandraClient,
    CassandraError,
    CassandraOverloadedError,
    CassandraUnavailableError,
    ConsistencyUnreachableError,
)
from countersink.cli import (
    consistency_level,
    load_definitions_or_refuse,
    port_number,
    run_async,
    setting_default,
    stop_on_signals,
)
from countersink.commands.trace import TraceQuery, TraceRefusedError
from countersink.commands.trace import trace as trace_records
from countersink.consistency import level_beyond_replicas
from countersink.gc_runs import GcAgeSampler
from countersink.health import QuietAppRunner, metrics_handler, problem_response, quiet_accept_errors
from countersink.kafka import KafkaSecurityError, KafkaUnavailableError
from countersink.logs import get_logger
from countersink.metrics import METRICS
from countersink.reader import CounterReader, read_value, to_jsonable
from countersink.registry import CounterRegistry
from countersink.resets import (
    IDEMPOTENCY_KEY,
    IDEMPOTENCY_KEY_RULE,
    MAX_RESET_KEYS,
    EpochsCache,
    ResetDone,
    ResetProgress,
    ResetRefusedError,
    first_line,
    keys_of_no_instance,
    positions_not_recorded,
    reset_counter,
    took_effect,
)
from countersink.retry import StopRequested, wait_until_reachable
from countersink.schema_registry import SchemaRegistryRefusedError, SchemaRegistryUnavailableError
from countersink.settings import (
    CassandraSettings,
    Consistency,
    KafkaSettings,
    ReadSettings,
    ServeSettings,
    Settings,
    given_options,
    with_options,
)
from countersink.state_cache import StateCache
from countersink.tls import load_key_pair
from schemas import timeseries
from schemas.definitions import NAME_PATTERN, CounterDefinition, CounterSet
from schemas.errors import CounterDroppedError, DefinitionChangedError, MalformedInstanceKeyError
from schemas.events import DEFAULT_MAX_KEY_BYTES, decode_instance_key
from schemas.timeseries import SeriesPoint, TimeRangeError

log = get_logger(__name__)

class ReadApi:
    """The HTTP handlers over one Cassandra client. Unknown names answer 404: names not in ``counters`` when
    given, else names not in the counter ``registry`` (when it has entries)."""

    def __init__(self, client: CassandraClient, settings: ServeSettings, counters: CounterSet | None = None,
                 consistency: Consistency | None = None, *, registry: CounterRegistry | None = None,
                 read_settings: ReadSettings | None = None, tokens: Tokens | None = None,
                 tracing: Settings | None = None, resetting: Resetting | None = None) -> None:
        self.client = client
        # The writing role's client and the Kafka settings that ``POST /counters/{name}/reset`` uses; None: no
        # such route.
        self.resetting = resetting
        self._resets = asyncio.Semaphore(1)  # one reset at a time: each publishes with a producer of its own
        self._running: dict[asyncio.Task[ResetDone], tuple[str, str, ResetProgress]] = {}
        self._stopping = False  # set by finish_resets: no reset starts any more
        # The Kafka and consumer settings that ``/trace/{topic}`` reads records with; None: no such route.
        self.tracing = tracing
        self._traces = asyncio.Semaphore(1)  # one trace at a time: each reads Kafka with a client of its own
        self._traces_waiting = 0
        self.registry = registry
        self.settings = settings
        self.read_settings = read_settings or ReadSettings()
        self.counters = counters
        self.consistency = consistency or client.settings.read_consistency
        self._reads = asyncio.Semaphore(settings.concurrency)
        # What range reads may hold of those: a single read waits behind at most this many chunks of ranges
        # (a 1,000-bucket series is 42 chunks; 100 such series had single reads wait 4.4 s behind them).
        self._range_reads = asyncio.Semaphore(max(1, settings.concurrency // 4))
        self.cache = (StateCache(settings.state_cache_bytes, settings.state_cache_max_age_s, settings.max_staleness_s)
                      if settings.state_cache_bytes else None)
        # Each counter's resets read at most twice a second: a read costs one request (countersink.resets).
        self.epochs = EpochsCache(self.client)
        self._cache_counted = {"recent": 0, "checked": 0, "patched": 0, "hit": 0, "partial": 0, "miss": 0}
        self._gc_age = GcAgeSampler(client)
        self.tokens = tokens or Tokens(settings)
        self.admin_tokens = resetting.tokens if resetting is not None else None
        self._handling = 0
        # What query parameters each described operation takes: the OpenAPI document's (_refuse_unknown_parameters)
        self._query_rules = query_rules(openapi_document(settings, tracing=tracing is not None,
                                                         resetting=resetting is not None))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_observed, _problems, self._guard],
                              client_max_size=self.settings.max_body_bytes)
        if self.resetting is not None:  # before /counters/{name}/{key}, whose GET reads an instance named reset
            app.add_routes([web.post(_RESET_PATH, self.reset)])
        app.add_routes([
            web.get("/counters/{name}/series", self.keyless_series),
            web.get("/counters/{name}/{key}", self.get_one),
            web.get("/counters/{name}/{key}/series", self.series),
            web.get("/counters/{name}", self.get_many),
            web.get("/openapi.json", self.openapi),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", metrics_handler(self._before_scrape)),
        ])
        if self.tracing is not None:  # a route only where the document has its path
            app.add_routes([web.get("/trace/{topic}", self.trace)])
        app.on_response_prepare.append(_without_versions)
        app[_API] = self
        return app

    # --- the guard in front of every route

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        """Bounds first (cheap, and before any work for an unknown caller), then the token, then a slot."""
        if len(request.raw_path) > self.settings.max_url_bytes:
            raise _problem(web.HTTPRequestURITooLong,
                           f"request targets are at most {self.settings.max_url_bytes} bytes")
        _refuse_loose_escapes(request.raw_path)
        if request.content_length is not None:
            self._refuse_large_body(request.content_length)
        resource = request.match_info.route.resource
        if self.admin_tokens is not None and resource is not None and resource.canonical == _RESET_PATH \
                and request.method == "POST":
            try:
                request[_ADMIN_NAME] = self._check_admin_token(request, self.admin_tokens)
            except web.HTTPException as exc:
                # Every refused attempt at a reset leaves a line (never the token): who tried is in the peer.
                # (Named only when it is a counter's name: anyone may send any text there, up to the URL's bound.)
                name = request.match_info.get("name", "")
                log.warning("reset_refused", counter=name if NAME_PATTERN.fullmatch(name) else "(not a counter name)",
                            status=exc.status, peer=request.remote, error=exc.reason)
                raise
        elif request.path not in _OPEN_PATHS and self.guarded:
            self._check_token(request)
        # A chunked body is read only for a caller the token let in, and for no longer than a connection may idle.
        if request.content_length is None:
            await self._read_chunked_body(request)
        if resource is not None:
            _refuse_unknown_parameters(request, self._query_rules.get((request.method, resource.canonical)))
        # The probes are answered however busy the reads are: a liveness probe refused under load would have the
        # process restarted when Cassandra is slow, which makes matters worse.
        if self._handling >= self.settings.max_requests and request.path not in _OPEN_PATHS:
            raise _problem(web.HTTPServiceUnavailable,
                           f"more than {self.settings.max_requests} requests at once; try again", retry_after=1)
        self._handling += 1
        try:
            return await handler(request)
        finally:
            self._handling -= 1

    def _refuse_large_body(self, size: int) -> None:
        limit = self.settings.max_body_bytes
        if size > limit:
            raise _problem(web.HTTPRequestEntityTooLarge, f"request bodies are at most {limit} bytes",
                           max_size=limit, actual_size=size)

    async def _read_chunked_body(self, request: web.Request) -> None:
        """A chunked body announces no length: read at most one byte past the limit to know (what was read is kept
        for the handler: a reset's keys must not be lost on the way)."""
        limit = self.settings.max_body_bytes
        size = 0
        chunks: list[bytes] = []
        # One deadline for the whole body: a byte sent now and then (anyone may, to the probes) held the
        # connection for as long as each read's own limit was met.
        try:
            async with asyncio.timeout(self.settings.idle_timeout_s):
                while request.body_exists and size <= limit:
                    chunk = await request.content.read(limit + 1 - size)
                    if not chunk:
                        break
                    size += len(chunk)
                    chunks.append(chunk)
        except TimeoutError:
            raise _problem(web.HTTPRequestTimeout, f"the request body did not come within "
                           f"{self.settings.idle_timeout_s} s") from None
        except (web.RequestPayloadError, ConnectionResetError) as exc:
            # Broken or cut short by the client, which anyone can do: refused, not a server failure.
            log.debug("http_request_refused", status=400, error=type(exc).__name__)
            raise _problem(web.HTTPBadRequest, "the request body is not valid chunked coding, or was cut "
                           "short") from None
        request[_CHUNKED_BODY] = b"".join(chunks)
        self._refuse_large_body(size)

    @property
    def guarded(self) -> bool:
        """Whether the routes but /healthz and /readyz need a token (:func:`needs_token`)."""
        return needs_token(self.tokens, self.admin_tokens)

    def _check_token(self, request: web.Request) -> None:
        """A read token, or an admin token (admins read too)."""
        given = _bearer(request)
        if not self.tokens.accepts(given) and (self.admin_tokens is None or self.admin_tokens.name_of(given) is None):
            raise _unauthorized("the bearer token is not valid")

    def _check_admin_token(self, request: web.Request, admin_tokens: Tokens) -> str:
        """The name of the request's admin token; 403 for a read token, 401 for anything else."""
        given = _bearer(request)
        name = admin_tokens.name_of(given)
        if name is not None:
            return name
        if self.tokens.required and self.tokens.accepts(given):
            raise _problem(web.HTTPForbidden, "this route needs an admin token; a read token only reads")
        raise _unauthorized("the bearer token is not valid")

    # --- reads

    async def get_one(self, request: web.Request, key: str | None = None) -> web.Response:
        name = await self._counter(request)
        key = _checked_key(request.match_info["key"]) if key is None else key
        level = _consistency(request)
        kind, value = await self._read(name, key, level)
        return web.json_response({"counter": name, "key": key, "kind": kind, "value": to_jsonable(value)})

    async def get_many(self, request: web.Request) -> web.Response:
        name = await self._counter(request)
        keys = list(dict.fromkeys(request.query.getall("key", [])))
        if not keys and await self._keyless(name):
            return await self.get_one(request, key="")
        if not keys:
            raise _problem(web.HTTPBadRequest, "give at least one ?key= (only a counter with no key fields "
                           "is read without one)")
        if len(keys) > self.settings.max_keys:
            raise _problem(web.HTTPBadRequest, f"at most {self.settings.max_keys} keys per request")
        for key in keys:
            if key:  # an empty ?key= reads the instance of events whose one key field is the empty text
                _checked_key(key)
        level = _consistency(request)
        # The counter's resets once for every key: kept, or read once alongside the keys' first requests (each
        # key's read takes them from EpochsCache, waiting for the read in flight: read_value).
        results = await asyncio.gather(*(self._read(name, key, level) for key in keys))
        return web.json_response({
            "counter": name,
            "values": {key: {"kind": kind, "value": to_jsonable(value)} for key, (kind, value) in
                       zip(keys, results, strict=True)},
        })

    async def keyless_series(self, request: web.Request) -> web.Response:
        """``/counters/{name}/series``: the series of a counter with no key fields; of any other counter, the
        series of the instance ``?key=`` names (the only way to name the empty key, which no path holds), and
        without one the instance whose key is ``series`` (as ``/counters/{name}/{key}``; range parameters then
        are a 400: they ask for a series)."""
        name = await self._counter(request)
        keys = request.query.getall("key", [])
        if len(keys) > 1:
            raise _problem(web.HTTPBadRequest, "a series reads one instance: give one ?key=")
        if await self._keyless(name):
            if keys and keys[0]:
                raise _problem(web.HTTPBadRequest, f"counter {name!r} has no key fields: its one series is read "
                               "without ?key= (or with an empty one)")
            return await self.series(request, key="")
        if keys:
            return await self.series(request, key=_checked_key(keys[0]) if keys[0] else "")
        ranged = sorted(p for p in ("from", "to", "step", "rollup") if p in request.query)
        if ranged:
            # Asked for a series, answered the instance "series" with its range ignored: said instead.
            raise _problem(web.HTTPBadRequest, f"counter {name!r} has key fields: a series of it names its instance, "
                           f"/counters/{name}/KEY/series or /counters/{name}/series?key=KEY (without "
                           f"{' or '.join(ranged)}, this path reads the instance whose key is series)")
        return await self.get_one(request, key="series")

    async def _keyless(self, name: str) -> bool:
        definition = await self._definition(name)
        return definition is not None and not definition.key

    async def series(self, request: web.Request, key: str | None = None) -> web.Response:
        name = await self._counter(request)
        key = _checked_key(request.match_info["key"]) if key is None else key
        level = _consistency(request)
        definition = await self._definition(name)
        if definition is None:
            raise _problem(web.HTTPNotFound, f"counter {name!r} is not recorded yet: its bucket size is not known")
        query = request.query
        if "from" not in query or "to" not in query:
            raise _problem(web.HTTPBadRequest, "give ?from= and ?to= (ISO-8601 with an offset, now, now-6h)")
        rollup = query.get("rollup", "false").lower()
        if rollup not in ("true", "false"):
            raise _problem(web.HTTPBadRequest, "rollup is true or false")
        reader = CounterReader(self.client, level, max_range_buckets=self.read_settings.max_range_buckets,
                               reads=self._reads, cache=self.cache, epochs=self.epochs,
                               range_reads=self._range_reads)
        try:
            start, end = timeseries.parse_instant(query["from"]), timeseries.parse_instant(query["to"])
            step = timeseries.parse_duration(query["step"]) if "step" in query else None
            if step is not None and rollup == "true":
                raise TimeRangeError("give step or rollup=true, not both")
            async with self._cassandra_answers():
                points: list[SeriesPoint]
                if rollup == "true":
                    points = [await reader.rollup(definition, key, start, end)]
                elif step is not None:
                    points = await reader.rollup(definition, key, start, end, step)
                else:
                    points = await reader.series(definition, key, start, end)
        except TimeRangeError as exc:
            raise _problem(web.HTTPBadRequest, str(exc)) from None
        return web.json_response({"counter": name, "key": key, "kind": definition.kind,
                                  "from": timeseries.iso(start), "to": timeseries.iso(end), "step": step,
                                  "points": to_jsonable(points)})

    async def _read(self, name: str, key: str, level: Consistency) -> tuple[str | None, object]:
        async with self._cassandra_answers(), self._reads:
            found = await read_value(self.client, name, key, level, self.cache, self.epochs)
        if found is None:
            definition = await self._definition(name)
            # Nothing read: a key of other fields, or naming no bucket of a bucketed counter, never holds anything.
            why = None if definition is None else timeseries.why_no_instance(definition, key)
            if why is not None:
                raise _problem(web.HTTPBadRequest, why)
            return (definition.kind if definition else None), None
        return found

    async def _definition(self, name: str) -> CounterDefinition | None:
        definition = self.counters.get(name) if self.counters else None
        if definition is None and self.registry is not None:
            async with self._cassandra_answers():  # a refresh of the registry may read it now
                definition = (await self.registry.lookup(name))[1]
        return definition

    @contextlib.asynccontextmanager
    async def _cassandra_answers(self) -> AsyncIterator[None]:
        """Within ``request_timeout_s``, and Cassandra's refusals as problem documents."""
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                yield
        except TimeoutError:
            raise _problem(web.HTTPGatewayTimeout,
                           f"Cassandra did not answer within {self.settings.request_timeout_s}s") from None
        except CassandraOverloadedError as exc:
            raise _problem(web.HTTPServiceUnavailable, _unquoted(exc), retry_after=1) from None
        except CassandraUnavailableError as exc:
            # e.g. too few replicas up for the consistency level: the caller may retry or ask for a lower level
            raise _problem(web.HTTPServiceUnavailable, _unquoted(exc), retry_after=2) from None
        except ConsistencyUnreachableError as exc:  # more replicas than the keyspace keeps: no retry helps
            raise _problem(web.HTTPBadRequest, _unquoted(exc)) from None

    async def _counter(self, request: web.Request) -> str:
        name = request.match_info["name"]
        if not NAME_PATTERN.fullmatch(name):
            raise _problem(web.HTTPBadRequest, f"counter names match {NAME_PATTERN.pattern}")
        if self.counters is not None and self.counters.get(name) is None:
            raise _problem(web.HTTPNotFound, f"no counter {name!r} in {self.counters.source}")
        if self.counters is None and self.registry is not None:
            async with self._cassandra_answers():
                known, _ = await self.registry.lookup(name)
            if not known:
                raise _problem(web.HTTPNotFound, f"no counter {name!r} in the counter registry")
        return name

    async def trace(self, request: web.Request) -> web.Response:
        """``/trace/{topic}?offset=P:O`` or ``?event_id=ID[&key=K][&scan=N]``: what the record did in each counter
        on the topic, as ``countersink trace --json`` prints it (docs/reading.md)."""
        if self.tracing is None:
            raise _problem(web.HTTPNotFound, "tracing is not served here")
        query = _trace_query(request)
        if self._traces.locked() and self._traces_waiting >= MAX_TRACES_WAITING:
            raise _problem(web.HTTPServiceUnavailable, f"{MAX_TRACES_WAITING} traces are waiting for the one "
                           "running: ask again later", retry_after=5)
        try:
            # The wait for the running trace counts in the time allowed: a client is answered within it, and
            # a trace its client gave up on is not run long after.
            async with asyncio.timeout(TRACE_TIMEOUT_S):
                self._traces_waiting += 1
                try:
                    await self._traces.acquire()
                finally:
                    self._traces_waiting -= 1
                try:
                    result = await trace_records(self.client, self.tracing, query, self.counters)
                finally:
                    self._traces.release()
        except TraceRefusedError as exc:
            raise _problem(web.HTTPNotFound, str(exc)) from None
        except CassandraError as exc:  # the registry, the ownership rows: away, overloaded, or refusing
            retry = isinstance(exc, CassandraUnavailableError)
            raise _problem(web.HTTPServiceUnavailable, _unquoted(exc), retry_after=2 if retry else None) from None
        except (SchemaRegistryUnavailableError, KafkaUnavailableError) as exc:
            raise _problem(web.HTTPServiceUnavailable, _unquoted(exc), retry_after=2) from None
        except errors.KafkaError as exc:  # lost while reading the records
            raise _problem(web.HTTPServiceUnavailable, f"Kafka did not answer the trace's reads: {exc}",
                           retry_after=2) from None
        except KafkaSecurityError as exc:  # a grant or a setting of serve's to fix: no retry helps
            log.error("trace_failed", topic=query.topic, error=str(exc))
            raise _problem(web.HTTPServiceUnavailable, f"serve cannot read Kafka: {exc}") from None
        except SchemaRegistryRefusedError as exc:  # the same, of the registry (its words are never quoted)
            log.error("trace_failed", topic=query.topic, error=str(exc))
            raise _problem(web.HTTPServiceUnavailable, f"serve cannot read the schema registry: {exc}") from None
        except TimeoutError:
            raise _problem(web.HTTPGatewayTimeout, f"the trace did not finish within {TRACE_TIMEOUT_S} s") from None
        return web.json_response({"topic": query.topic, "notes": result.notes,
                                  "records": to_jsonable(result.records)})

    # --- changes

    async def reset(self, request: web.Request) -> web.Response:
        """``POST /counters/{name}/reset`` with ``{"keys": [...]}`` or no body (every key): as ``countersink reset
        --json``, recorded as asked by the admin token's name. With an ``Idempotency-Key``, a request repeated
        with the same key answers the reset the first one recorded (completing it if it was cut short)."""
        resetting = self.resetting
        if resetting is None:
            raise _problem(web.HTTPNotFound, "resets are not served here")
        name = await self._counter(request)
        keys = await self._reset_keys(request)
        request_key = _idempotency_key(request)
        requested_by = request[_ADMIN_NAME]
        self._refuse_if_stopping(name, requested_by)
        async with self._cassandra_answers():
            known, definition = await CounterRegistry(resetting.client).lookup(name)
        if not known or definition is None:
            raise _problem(web.HTTPNotFound, f"no counter {name!r} in the counter registry: a consumer records "
                           "it when it starts")
        unfit = keys_of_no_instance(definition, keys)
        if unfit is not None:
            raise _problem(web.HTTPBadRequest, unfit)
        cassandra = resetting.client.settings
        progress = ResetProgress()
        await self._resets.acquire()
        try:
            # Waited for a slot: a client gone meanwhile (timed out, and perhaps retrying) gets no reset it cannot
            # learn of; and a server told to stop meanwhile starts none.
            if request.transport is None or request.transport.is_closing():
                log.warning("reset_not_started", counter=name, requested_by=requested_by, request_key=request_key,
                            why="the client closed the connection before the reset started")
                raise _problem(web.HTTPBadRequest, "the client closed the connection before the reset started")
            self._refuse_if_stopping(name, requested_by)
            task = asyncio.create_task(reset_counter(
                resetting.client, resetting.kafka, definition, keys, requested_by, cassandra.write_consistency,
                cassandra.replay_read_consistency, request_key=request_key, progress=progress))
        except BaseException:
            self._resets.release()
            raise
        # The reset runs to its end whatever becomes of this request (shielded): a shutdown awaits it
        # (finish_resets), and the next reset starts only after it.
        self._running[task] = (name, requested_by, progress)
        log.info("reset_started", counter=name, keys=len(keys), requested_by=requested_by, request_key=request_key)

        def finished(_: asyncio.Task[ResetDone]) -> None:
            self._running.pop(task, None)
            self._resets.release()

        task.add_done_callback(finished)
        try:
            done = await asyncio.shield(task)
        except ResetRefusedError as exc:
            log.warning("reset_refused", counter=name, requested_by=requested_by, status=409, error=str(exc))
            raise _problem(web.HTTPConflict, str(exc)) from None
        except Exception as exc:  # each failure is answered with what was recorded, and logged
            return self._reset_failed(name, keys, requested_by, progress, exc)
        log.info("reset_requested", counter=name, keys=len(keys), requested_by=requested_by,
                 epoch=done.reset.epoch, id=done.reset.reset_id, request_key=request_key, repeated=done.repeated)
        return web.json_response(done.as_json())

    def _refuse_if_stopping(self, name: str, requested_by: str) -> None:
        if self._stopping:
            log.warning("reset_refused", counter=name, requested_by=requested_by, status=503,
                        error="the server is stopping")
            raise _problem(web.HTTPServiceUnavailable, "the server is stopping: no reset starts now (another "
                           "replica, or this one once restarted, takes it)", retry_after=2)

    def _reset_failed(self, name: str, keys: list[str], requested_by: str, progress: ResetProgress,
                      exc: Exception) -> web.Response:
        """The answer to a reset that failed, saying what was recorded (epoch and id) and whether to retry."""
        recorded, what = progress.reset, progress.recorded()
        log.error("reset_failed", counter=name, requested_by=requested_by, error=type(exc).__name__,
                  message=first_line(exc), **progress.as_json())
        if (done := took_effect(progress, keys, requested_by)) is not None:
            return web.json_response({**done.as_json(), "warning": positions_not_recorded(exc)})
        again = ("nothing to complete: reset again" if recorded is None else
                 "POST again with the same Idempotency-Key to complete this reset (without one, a retry is a new "
                 "reset)" if progress.request_key else
                 "the events counted since it in those partitions are not read until a reset that follows: reset "
                 "again, with an Idempotency-Key that a retry repeats")
        if _permanent(exc):
            return _reset_problem(HTTPStatus.INTERNAL_SERVER_ERROR, f"the reset failed and retrying as it is will "
                                  f"not help: {_what_to_fix(exc)}; {what}. Once fixed, {again}", progress)
        return _reset_problem(HTTPStatus.SERVICE_UNAVAILABLE, f"the reset did not complete ({type(exc).__name__}): "
                              f"{what}; {again}", progress, retry_after=2)

    async def finish_resets(self, timeout_s: float) -> None:
        """Refuse new resets and await the running ones for at most ``timeout_s``; those still running then are
        logged (``reset_interrupted``, with their epoch and id when recorded) and cancelled."""
        self._stopping = True
        running = dict(self._running)
        if not running:
            return
        _, pending = await asyncio.wait(running, timeout=timeout_s)
        for task in pending:
            name, requested_by, progress = running[task]
            log.error("reset_interrupted", counter=name, requested_by=requested_by, waited_s=timeout_s,
                      **progress.as_json())
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _reset_keys(self, request: web.Request) -> list[str]:
        """The keys a reset's body names: none (no body, or ``{}``) is every key."""
        body = request[_CHUNKED_BODY] if _CHUNKED_BODY in request else await request.read()
        if not body.strip():
            return []
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes (1024 x "[")
            raise _problem(web.HTTPBadRequest, 'the body is JSON: {"keys": ["k1", "k2"]}, or none') from None
        if not isinstance(document, dict) or set(document) - {"keys"}:
            raise _problem(web.HTTPBadRequest, 'the body is an object whose only member is keys')
        keys = document.get("keys", [])
        limit = min(self.settings.max_keys, MAX_RESET_KEYS)
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
            raise _problem(web.HTTPBadRequest, "keys is a list of strings")
        if "keys" in document and not keys:
            # An empty selection must not become every key: that is asked for without keys.
            raise _problem(web.HTTPBadRequest, "keys names at least one key; to reset every key, send no body")
        if len(keys) > limit:
            raise _problem(web.HTTPBadRequest, f"a reset names at most {limit} keys")
        return [_checked_key(key) for key in dict.fromkeys(keys)]

    # --- operations

    async def openapi(self, request: web.Request) -> web.Response:
        counters = self.counters
        if counters is None and self.registry is not None:
            async with self._cassandra_answers():
                counters = await self.registry.counters()
        return web.json_response(openapi_document(self.settings, counters, tracing=self.tracing is not None,
                                                  resetting=self.resetting is not None))

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        if not self.tokens.usable():
            # Every guarded request would answer 401: out of the load balancer until a token is valid again.
            return web.Response(status=503, text="not ready: no bearer token is accepted\n")
        ready = self.client.connections() > 0
        return web.Response(status=200 if ready else 503, text="ready\n" if ready else "not ready\n")

    async def _before_scrape(self) -> None:
        self.client.sample_driver_metrics()
        self._sample_cache()
        await self._gc_age()

    def _sample_cache(self) -> None:
        """Copy the state cache's running counts into the process metrics (counters grow by what they grew)."""
        if self.cache is None:
            return
        counts = {"recent": self.cache.recent_hits, "checked": self.cache.checked_hits,
                  "patched": self.cache.patched_reads,
                  "hit": self.cache.hits - self.cache.checked_hits - self.cache.recent_hits,
                  "partial": self.cache.partial,
                  "miss": self.cache.misses}
        for outcome, count in counts.items():
            grown = count - self._cache_counted[outcome]
            if grown > 0:
                METRICS.serve_state_cache_reads.labels(outcome=outcome).inc(grown)
                self._cache_counted[outcome] = count
        METRICS.serve_state_cache_bytes.set(self.cache.size_bytes)


@dataclass(frozen=True)
class Resetting:
    """What ``POST /counters/{name}/reset`` needs: the admin tokens, a client logged in as the role that writes
    the resets tables, and the Kafka settings its control records are published with."""

    tokens: Tokens
    client: CassandraClient
    kafka: KafkaSettings


def needs_token(tokens: Tokens, admin_tokens: Tokens | None) -> bool:
    """Whether every route but /healthz and /readyz needs a token: read tokens are set, or admin tokens (which read
    too: with admin tokens alone, reads were open to anyone, tokens or none)."""
    return tokens.required or admin_tokens is not None


def _bearer(request: web.Request) -> str:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise _unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    return given.strip()


# Kafka refusals that no retry undoes: the user lacks a grant, the topic went away, a record is refused.
_PERMANENT_KAFKA = (errors.TopicAuthorizationFailedError, errors.ClusterAuthorizationFailedError,
                    errors.AuthenticationFailedError, errors.UnknownTopicOrPartitionError,
                    errors.RecordTooLargeError, errors.MessageSizeTooLargeError, errors.UnsupportedVersionError)


def _permanent(exc: Exception) -> bool:
    """True for a reset failure that a retry as it is would meet again (a grant, a topic, a role to fix, or a
    failure nobody expected); False for one that passes (a server away, a timeout, a connection lost)."""
    if isinstance(exc, CassandraUnavailableError | OSError | TimeoutError):
        return False
    return not isinstance(exc, errors.KafkaError) or isinstance(exc, _PERMANENT_KAFKA)


def _what_to_fix(exc: Exception) -> str:
    if isinstance(exc, errors.TopicAuthorizationFailedError | errors.ClusterAuthorizationFailedError):
        return ("Kafka refused serve's user (COUNTERSINK_KAFKA__*) to write the counter's topics: grant it WRITE on "
                "them (docs/security.md, \"Admin tokens\")")
    if isinstance(exc, errors.AuthenticationFailedError):
        return "Kafka refused serve's credentials (COUNTERSINK_KAFKA__SASL_*)"
    if isinstance(exc, errors.MessageSizeTooLargeError | errors.RecordTooLargeError):
        return ("Kafka refused the control record as too large: raise the topic's max.message.bytes (a control "
                "record holds the reset's keys)")
    if isinstance(exc, errors.UnknownTopicOrPartitionError):
        return "a topic of the counter no longer exists in Kafka"
    if isinstance(exc, CassandraError):
        return (f"Cassandra refused the reset's request as the admin role (COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME)"
                f": {first_line(exc)} (docs/security.md: the grants it needs; on a keyspace made by an earlier "
                "version, run countersink schema)")
    if isinstance(exc, errors.KafkaError):
        return f"Kafka refused the control record: {type(exc).__name__}"
    return f"{type(exc).__name__} (reset_failed in serve's log)"


def _reset_problem(status: HTTPStatus, detail: str, progress: ResetProgress, retry_after: int | None = None
                   ) -> web.Response:
    """A problem document for a failed reset, with a ``reset`` member saying what was recorded (its stage, and
    its epoch and id once recorded)."""
    return web.Response(status=status, content_type=_PROBLEM, headers=(
        {"Retry-After": str(retry_after)} if retry_after else None), text=json.dumps(
        {"title": status.phrase, "status": int(status), "detail": detail, "reset": progress.as_json()}))


def _idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` (``IDEMPOTENCY_KEY_RULE``), None without one; 400 otherwise."""
    given = request.headers.getall("Idempotency-Key", [])
    if not given:
        return None
    if len(given) > 1 or not IDEMPOTENCY_KEY.fullmatch(given[0]):
        raise _problem(web.HTTPBadRequest, f"Idempotency-Key is one header of {IDEMPOTENCY_KEY_RULE}")
    return given[0]


_SURROGATE = re.compile("[\ud800-\udfff]")
_LOOSE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _refuse_loose_escapes(target: str) -> None:
    """400 for a request target whose escapes name no text: a % not followed by two hex digits, or escaped
    bytes that are no UTF-8. Left as they were, they read as their own characters (``%C3`` as the key ``%C3``,
    the same key as ``%25C3``) or as U+FFFD, another key than the one asked."""
    if _LOOSE_PERCENT.search(target):
        raise _problem(web.HTTPBadRequest, "a % in the URL starts an escape of two hex digits (%25 is a % itself)")
    if "%" in target:
        try:
            urllib.parse.unquote_to_bytes(target).decode("utf-8")
        except UnicodeDecodeError:
            raise _problem(web.HTTPBadRequest, "the URL's escapes are not UTF-8 text") from None


def _checked_key(key: str) -> str:
    """A key a request gives: 1 to the bytes an event's key may have, and an instance key at all. (The empty
    key of the one instance of a counter with no key fields is not given: /counters/{name} reads it.)"""
    if _SURROGATE.search(key):
        # JSON's \ud800 escapes decode to text that is no UTF-8: no event's key could be it.
        raise _problem(web.HTTPBadRequest, "a key is Unicode text: a lone surrogate (\\ud800 to \\udfff) is not")
    if not key or len(key.encode()) > DEFAULT_MAX_KEY_BYTES:
        raise _problem(web.HTTPBadRequest, f"a key is 1 to {DEFAULT_MAX_KEY_BYTES} bytes (a counter with no key "
                       "fields is read without one)")
    try:
        decode_instance_key(key)
    except MalformedInstanceKeyError:
        if key == "\\":
            raise _problem(web.HTTPBadRequest, "a lone backslash is not an instance key") from None
        # Instance keys escape \ and | (docs/counters.md): any other backslash names an instance none can be.
        raise _problem(web.HTTPBadRequest, "a backslash in a key escapes \\ or | only: write \\ as \\\\ "
                       "and a | inside a field as \\|") from None
    return key


# What one HTTP trace may search at most, back from the end of each partition (the command line has no bound).
MAX_TRACE_SCAN = 100_000
TRACE_TIMEOUT_S = 60  # the longest a trace (its wait, Kafka reads, then Cassandra) may take before it answers 504
MAX_TRACES_WAITING = 4  # traces waiting for the running one; another is answered 503 at once
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _unquoted(exc: Exception) -> str:
    """A Cassandra error for a client: without the statement the driver's error names (``[SELECT ...]``), which
    is for the server's log, not for whoever asks."""
    text = str(exc)
    return text[:text.rindex(" [")] if text.endswith("]") and " [" in text else text


def query_rules(document: dict[str, Any]) -> dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]]:
    """Each described operation's query parameters, by (method, path): every name it takes, and those it takes
    more than once (an array)."""
    rules = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            query = [p for p in operation.get("parameters", []) if p["in"] == "query"]
            rules[(method.upper(), path)] = (frozenset(p["name"] for p in query), frozenset(
                p["name"] for p in query if p["schema"].get("type") == "array"))
    return rules


def _refuse_unknown_parameters(request: web.Request,
                               rule: tuple[frozenset[str], frozenset[str]] | None) -> None:
    """400 for a query parameter the operation does not take (a typo: ``?consistncy=ALL`` would read at the
    default level), or one it takes once given twice (which of them would count?)."""
    if rule is None:  # a path the document does not describe (probes, /metrics): parameters ignored
        return
    taken, repeatable = rule
    seen: set[str] = set()
    for name, _ in request.query.items():  # items: iterating the keys gives each name once
        if name not in taken:
            named = f"{name[:40]!r}{'...' if len(name) > 40 else ''}"
            takes = ", ".join(sorted(taken)) or "none"
            raise _problem(web.HTTPBadRequest, f"no query parameter {named} here; this path takes: {takes}")
        if name in seen and name not in repeatable:
            raise _problem(web.HTTPBadRequest, f"give {name} once")
        seen.add(name)


def _trace_query(request: web.Request) -> TraceQuery:
    """The trace a request asks for, each parameter bounded; 400 for anything else."""
    topic, query = request.match_info["topic"], request.query
    if not _TOPIC.fullmatch(topic):
        raise _problem(web.HTTPBadRequest, "a topic name is 1 to 249 of A-Z a-z 0-9 . _ -")
    if ("offset" in query) == ("event_id" in query):
        raise _problem(web.HTTPBadRequest, "give ?offset=PARTITION:OFFSET or ?event_id=ID (with &key=K)")
    if "offset" in query:
        if "key" in query or "scan" in query:
            raise _problem(web.HTTPBadRequest, "key and scan go with event_id")
        match = re.fullmatch(r"([0-9]{1,9}):([0-9]{1,18})", query["offset"])
        if match is None:
            raise _problem(web.HTTPBadRequest, "offset is PARTITION:OFFSET, like 2:1500")
        return TraceQuery(topic, offset=(int(match.group(1)), int(match.group(2))))
    event_id, key = query["event_id"], query.get("key")
    if not 0 < len(event_id.encode()) <= DEFAULT_MAX_KEY_BYTES or (
            key is not None and not 0 < len(key.encode()) <= DEFAULT_MAX_KEY_BYTES):
        raise _problem(web.HTTPBadRequest, f"event_id and key are 1 to {DEFAULT_MAX_KEY_BYTES} bytes")
    scan_text = query.get("scan", "10000")
    if not (scan_text.isascii() and scan_text.isdigit()) or not 1 <= int(scan_text) <= MAX_TRACE_SCAN:
        raise _problem(web.HTTPBadRequest, f"scan is 1 to {MAX_TRACE_SCAN} records")
    return TraceQuery(topic, event_id=event_id, key=key, scan=int(scan_text))


def _consistency(request: web.Request) -> Consistency:
    raw = request.query.get("consistency")
    api: ReadApi = request.app[_API]
    if raw is None:
        return api.consistency
    try:
        return Consistency(raw.upper())
    except ValueError:
        raise _problem(web.HTTPBadRequest, f"consistency is one of {', '.join(Consistency)}") from None


def _problem(error: type[web.HTTPException], detail: str, retry_after: int | None = None,
             headers: dict[str, str] | None = None, **details: Any) -> web.HTTPException:
    """An RFC 9457 problem document, so clients get a reason and not just a status."""
    headers = {**(headers or {}), **({"Retry-After": str(retry_after)} if retry_after else {})}
    document = problem_response(error.status_code, detail)
    return error(text=document.text, content_type=document.content_type, headers=headers or None, **details)


_PROBLEM = "application/problem+json"


@web.middleware
async def _problems(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
    """aiohttp's own refusals (404, 405, ...) as problem documents too; never quoting the request."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == _PROBLEM:
            raise
        if isinstance(exc, web.HTTPMethodNotAllowed):
            detail = f"this path answers {', '.join(sorted(exc.allowed_methods))} only"
        elif isinstance(exc, web.HTTPNotFound) and _KEY_EMPTY_IN_PATH.fullmatch(request.path):
            # /counters/{name}/: no route has an empty segment; the empty key is read with ?key=
            return problem_response(400, "a path names no empty key: read it with /counters/{name}?key=")
        elif isinstance(exc, web.HTTPNotFound):
            detail = "no such path; /openapi.json describes the paths this server answers"
        else:
            detail = HTTPStatus(exc.status).description or HTTPStatus(exc.status).phrase
        kept = {name: value for name, value in exc.headers.items() if name in ("Allow", "Retry-After",
                                                                               "WWW-Authenticate")}
        return problem_response(exc.status, detail, headers=kept or None)


def _unauthorized(detail: str) -> web.HTTPException:
    return _problem(web.HTTPUnauthorized, detail, headers={"WWW-Authenticate": 'Bearer realm="countersink"'})


_RESET_PATH = "/counters/{name}/reset"
_KEY_EMPTY_IN_PATH = re.compile(r"/counters/[^/]+/")
_ADMIN_NAME = web.RequestKey("admin_name", str)
_CHUNKED_BODY = web.RequestKey("chunked_body", bytes)
# Probes must answer without credentials: an orchestrator's health checks carry none.
_OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_MIN_TOKEN_CHARS = 16
_MAX_TOKENS_FILE_BYTES = 1 << 20


class TokenError(ValueError):
    """Raised when serve's credentials cannot be used as set: tokens that cannot be read or are too short to
    be secrets, a certificate that cannot be loaded, or tokens over plain HTTP without ``allow_insecure``."""


class Tokens:
    """The bearer tokens the server accepts: from ``tokens`` and from ``tokens_file``.

    The file is read at start (one that cannot be used stops the start) and looked at again at most once a
    second, when a request or a readiness probe comes. A change is applied whole or not at all, and never
    fails open: a file that cannot be read, is not UTF-8 text, is larger than 1 MiB or holds a token shorter
    than 16 characters is refused, and so is a deleted file; either way every token the file held is revoked
    (the change may have been meant to revoke one). A refusal is logged at ERROR with the reason (never a
    token) and counted in ``countersink_serve_tokens_file_refused_total{reason}``; while no token is
    accepted, :meth:`usable` is false and the server reports unready."""

    def __init__(self, settings: ServeSettings, clock: Callable[[], float] = time.monotonic, *,
                 admin: bool = False) -> None:
        self._admin = admin  # the admin tokens (NAME:TOKEN each), else the read tokens
        secret, self._file = (settings.admin_tokens, settings.admin_tokens_file) if admin else (
            settings.tokens, settings.tokens_file)
        self._variable = "COUNTERSINK_SERVE__ADMIN_TOKENS" if admin else "COUNTERSINK_SERVE__TOKENS"
        fixed = secret.get_secret_value().replace(",", "\n") if secret else ""
        self._fixed = _parse_tokens(fixed, self._variable, unit="entry", named=admin)
        if secret is not None and not self._fixed:
            # Set but empty (a secret that did not arrive): refuse rather than serve without tokens.
            raise TokenError(f"{self._variable} is set but holds no token")
        self._clock = clock
        self._from_file: list[tuple[str, bytes]] = []
        self._seen: bytes | str | None = None  # a digest of the content last looked at, or why it was unreadable
        self._checked_at = float("-inf")
        if self._file is not None:
            self._reload(strict=True)
        both = sorted({name for name, _ in self._fixed} & {name for name, _ in self._from_file}) if admin else []
        if both:
            raise TokenError(f"{self._variable} and {self._variable}_FILE both name {', '.join(both)}: each admin "
                             "token has a name of its own")
        self._count_accepted()

    @property
    def required(self) -> bool:
        return bool(self._fixed) or self._file is not None

    @property
    def count(self) -> int:
        """How many tokens are accepted now."""
        return len(self._fixed) + len(self._from_file)

    def refresh(self) -> None:
        """Look at the tokens file again if a second has passed since the last look."""
        if self._file is not None and self._clock() - self._checked_at >= 1.0:
            self._reload(strict=False)

    def usable(self) -> bool:
        """False when tokens are required and none is accepted: every guarded request would answer 401."""
        self.refresh()
        return not self.required or self.count > 0

    def accepts(self, token: str) -> bool:
        """True when ``token`` is one of the accepted tokens; every one is compared, in constant time each."""
        return self.name_of(token) is not None

    def name_of(self, token: str) -> str | None:
        """The name of ``token`` when it is accepted (an empty name for a read token), else None. Every accepted
        token is compared, in constant time each."""
        self.refresh()
        # Header values are decoded with surrogateescape: a byte that is not UTF-8 must not fail the encoding.
        given = token.encode("utf-8", "surrogateescape")
        matched: str | None = None
        for name, accepted in (*self._fixed, *self._from_file):
            if hmac.compare_digest(given, accepted):
                matched = name
        return matched

    def _count_accepted(self) -> None:
        if not self._admin:  # the gauge counts the read tokens
            METRICS.serve_tokens_accepted.set(self.count)

    def _reload(self, *, strict: bool) -> None:
        assert self._file is not None
        self._checked_at = self._clock()
        seen, text, cause, reason = _read_tokens_file(self._file)
        if seen == self._seen:
            return
        self._seen = seen
        tokens: list[tuple[str, bytes]] = []
        if text is not None:
            try:
                tokens = _parse_tokens(text, "", unit="line", named=self._admin)
            except TokenError as exc:
                cause, reason = "invalid", str(exc)
        if reason is not None:
            if strict:
                raise TokenError(f"{self._variable}_FILE ({self._file}): {reason}")
            revoked, self._from_file = len(self._from_file), []
            if not self._admin:
                METRICS.serve_tokens_file_refused.labels(reason=cause).inc()
            self._count_accepted()
            log.error("tokens_file_refused", path=str(self._file), reason=reason, cause=cause,
                      revoked=revoked, accepted=self.count, **({"admin": True} if self._admin else {}))
            return
        self._from_file = tokens
        self._count_accepted()
        if not strict:
            (log.info if self.count else log.warning)("tokens_reloaded", path=str(self._file), tokens=len(tokens),
                                                      accepted=self.count, **({"admin": True} if self._admin else {}))


def _read_tokens_file(path: Path) -> tuple[bytes | str, str | None, str, str | None]:
    """(what identifies this state of the file, its text, the kind of refusal, the reason) — the text or the
    reason is None. The state is a digest of the content, so that the tokens are not kept twice."""
    try:
        with path.open("rb") as file:
            content = file.read(_MAX_TOKENS_FILE_BYTES + 1)
    except FileNotFoundError:
        return "missing", None, "missing", "cannot read it: the file does not exist"
    except OSError as exc:
        reason = f"cannot read it: {exc.strerror or type(exc).__name__}"
        return reason, None, "unreadable", reason
    digest = hashlib.sha256(content).digest()
    if len(content) > _MAX_TOKENS_FILE_BYTES:
        return digest, None, "invalid", f"it is larger than {_MAX_TOKENS_FILE_BYTES} bytes"
    try:
        return digest, content.decode("utf-8"), "", None
    except UnicodeDecodeError as exc:
        return digest, None, "invalid", f"it is not UTF-8 text (byte {exc.start})"


_TOKEN_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


def _parse_tokens(text: str, source: str, *, unit: str, named: bool = False) -> list[tuple[str, bytes]]:
    """One token per line (blank lines and ``#`` comments ignored), ``NAME:TOKEN`` when ``named``; each token
    at least 16 characters, each name 1 to 64 of ``A-Z a-z 0-9 . _ @ -``. A refusal names the lines (or
    comma-separated entries) at fault, never what they hold."""
    tokens: list[tuple[str, bytes]] = []
    short: list[str] = []
    unnamed: list[str] = []
    named_at: dict[str, str] = {}
    twice: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        name = ""
        if named:
            name, _, token = token.partition(":")
            name, token = name.strip(), token.strip()
            if not _TOKEN_NAME.fullmatch(name) or not token:
                unnamed.append(str(number))
                continue
            if name in named_at:
                # A name says who reset: two tokens under one name could not be told apart, nor one revoked.
                twice.append(f"{named_at[name]} and {number}")
            named_at.setdefault(name, str(number))
        if len(token) < _MIN_TOKEN_CHARS:
            short.append(str(number))
        tokens.append((name, token.encode("utf-8", "surrogateescape")))
    prefix = source + ": " if source else ""
    if unnamed:
        raise TokenError(f"{prefix}{_lines(unit, unnamed)}: not NAME:TOKEN (a name is 1 to 64 of "
                         "A-Z a-z 0-9 . _ @ -)")
    if twice:
        raise TokenError(f"{prefix}{unit.replace('y', 'ie')}s {'; '.join(twice)} give one name to two tokens (each "
                         "admin token has a name of its own: it is who a reset records as asking)")
    if short:
        raise TokenError(f"{prefix}{_lines(unit, short)}: "
                         f"{'a token' if len(short) == 1 else 'tokens'} shorter than {_MIN_TOKEN_CHARS} characters")
    return tokens


def _lines(unit: str, numbers: list[str]) -> str:
    return f"{unit} {numbers[0]}" if len(numbers) == 1 else f"{unit.replace('y', 'ie')}s {', '.join(numbers)}"


def _loopback(host: str) -> bool:
    """True when ``host`` (an address, or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def server_tls(settings: ServeSettings) -> ssl.SSLContext | None:
    """The HTTPS context (TLS 1.2 or later) when a certificate and key are set."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        load_key_pair(context, settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise TokenError(f"COUNTERSINK_SERVE__TLS_CERT/__TLS_KEY: cannot use {settings.tls_cert}: "
                         f"{getattr(exc, 'reason', None) or getattr(exc, 'strerror', None) or exc}") from None
    return context


_API = web.AppKey("api", ReadApi)


@web.middleware
async def _observed(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        METRICS.serve_requests.labels(route=route, status=str(status)).inc()
        METRICS.serve_request_seconds.labels(route=route).observe(time.perf_counter() - started)


STOP_TIMEOUT_S = 5.0  # the longest a stop waits for running resets, then for the requests in flight


def api_runner(api: ReadApi, *, shutdown_timeout: float = STOP_TIMEOUT_S) -> web.AppRunner:
    """The runner of ``api``'s application. The parser's own limits (a request line or header line past them
    is answered 400 before routing) and its refusals answered and logged without quoting the request."""

    def refused(status: int) -> None:
        METRICS.serve_requests.labels(route="unparsed", status=str(status)).inc()

    return QuietAppRunner(api.app(), access_log=None, shutdown_timeout=shutdown_timeout, on_refused=refused,
                          max_line_size=api.settings.max_url_bytes + 64,
                          max_field_size=api.settings.max_header_bytes,
                          keepalive_timeout=api.settings.idle_timeout_s)


def openapi_document(settings: ServeSettings, counters: CounterSet | None = None, *,
                     tracing: bool = False, resetting: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 description served at ``/openapi.json``."""
    name_schema: dict[str, Any] = {"type": "string", "pattern": NAME_PATTERN.pattern}
    if counters is not None:
        name_schema["enum"] = sorted(c.name for c in counters.counters)
    # A backslash escapes \ or | only (instance keys, docs/counters.md); the lone backslash names no instance.
    # JSON Schema counts characters; the server counts the key's UTF-8 bytes (a key of 600 "é" is refused).
    in_bytes = f"at most {DEFAULT_MAX_KEY_BYTES} bytes of UTF-8 (maxLength bounds its characters)"
    key_schema = {"type": "string", "minLength": 1, "maxLength": DEFAULT_MAX_KEY_BYTES,
                  "pattern": r"^(?:[^\\]|\\[\\|])*$", "not": {"const": "\\"}, "description": in_bytes}
    consistency = {"name": "consistency", "in": "query", "required": False,
                   "schema": {"type": "string", "enum": list(Consistency)},
                   "description": "read consistency level, in any case (default: "
                                  "COUNTERSINK_CASSANDRA__READ_CONSISTENCY)"}
    # The query of a range read, the same for keyed and keyless series.
    range_query = [
        {"name": "from", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "ISO-8601 with an offset (2026-11-22T10:00Z), a date, now, now-6h"},
        {"name": "to", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "end of the range, excluded; same forms as from"},
        {"name": "step", "in": "query", "required": False,
         "schema": {"type": "string", "pattern": "^[1-9][0-9]{0,6}[smhdwSMHDW]$"},
         "description": "merge the buckets of each step (a multiple of the bucket size); the unit in any case"},
        {"name": "rollup", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
         "description": "merge every bucket of the range into one point"},
        consistency]
    value = {"description": "int or decimal string for sums, number for means, an object for sketches "
                            "(estimate with bounds), null when nothing was counted"}
    problem = {"description": "a problem document",
               "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    errors = {"400": problem, "404": problem, "413": problem, "414": problem, "503": problem, "504": problem}
    guarded = settings.tokens is not None or settings.tokens_file is not None
    if guarded:
        errors["401"] = problem
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "countersink read API", "version": version("countersink"),
                 "description": "Exact counters kept from Kafka events, read from Cassandra."},
        "paths": {
            "/counters/{name}/{key}": {"get": {
                "summary": "The value of one counter instance",
                "operationId": "getCounter",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": name_schema},
                               {"name": "key", "in": "path", "required": True, "schema": key_schema,
                                "description": "the instance key, URL-encoded"},
                               consistency],
                "responses": {"200": {"description": "the value", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Instance"}}}}, **errors},
            }},
            "/counters/{name}/{key}/series": {"get": {
                "summary": "A bucketed counter's buckets in a time range: each, merged per step, or merged into one",
                "operationId": "getSeries",
                "description": "Buckets whose start lies in [from, to). Merging is the kinds' own: exact for sums, "
                               "counts, min, max, mean and variance; sketches merge with their bounds. At most "
                               "COUNTERSINK_READ__MAX_RANGE_BUCKETS buckets per request.",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": name_schema},
                               {"name": "key", "in": "path", "required": True, "schema": key_schema,
                                "description": "the instance key without its bucket, URL-encoded"},
                               *range_query],
                "responses": {"200": {"description": "the points, in time order", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Series"}}}}, **errors},
            }},
            "/counters/{name}/series": {"get": {
                "summary": "The buckets of a bucketed counter with no key fields in a time range",
                "operationId": "getKeylessSeries",
                "description": "As /counters/{name}/{key}/series, for the one instance of a counter with no "
                               "key fields. For a counter with key fields: with ?key=, the series of that "
                               "instance (?key= empty: events whose one key field is the empty text, which no "
                               "path names); without it, this path reads the instance whose key is series, as "
                               "/counters/{name}/{key}, and answers 400 to range parameters.",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": name_schema},
                               {"name": "key", "in": "query", "required": False,
                                "schema": {k: v for k, v in key_schema.items() if k != "minLength"},
                                "description": "a counter with key fields: the instance key without its bucket "
                                               "(empty: the instance whose key is empty); form-encoded, so + is a "
                                               "space and %2B a +"},
                               *range_query],
                "responses": {"200": {"description": "the points, in time order (or, for a counter with key fields, "
                                      "the value of its instance series)", "content": {"application/json": {
                    "schema": {"oneOf": [{"$ref": "#/components/schemas/Series"},
                                         {"$ref": "#/components/schemas/Instance"}]}}}}, **errors},
            }},
            "/counters/{name}": {"get": {
                "summary": "The values of several instances of one counter, or the one of a counter without keys",
                "operationId": "getCounters",
                "description": "With key parameters, their values (Instances). Without any, the value of the one "
                               "instance of a counter with no key fields (Instance, its key empty); a counter "
                               "with key fields answers 400. An empty key (?key=) reads the instance whose key "
                               "is empty: events whose one key field is the empty text.",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": name_schema},
                               {"name": "key", "in": "query", "required": False, "style": "form", "explode": True,
                                "schema": {"type": "array", "items": {"oneOf": [key_schema, {"const": ""}]},
                                           "maxItems": settings.max_keys},
                                "description": "form-encoded, so + is a space and %2B a +"},
                               consistency],
                "responses": {"200": {"description": "the values by key, or the keyless instance's value",
                                      "content": {"application/json": {"schema": {"oneOf": [
                                          {"$ref": "#/components/schemas/Instances"},
                                          {"$ref": "#/components/schemas/Instance"}]}}}}, **errors},
            }},
        },
        "components": {"schemas": {
            "Instance": {"type": "object", "required": ["counter", "key", "kind", "value"], "properties": {
                "counter": {"type": "string"}, "key": {"type": "string"},
                "kind": {"type": ["string", "null"]}, "value": value}},
            "Instances": {"type": "object", "required": ["counter", "values"], "properties": {
                "counter": {"type": "string"},
                "values": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                    "kind": {"type": ["string", "null"]}, "value": value}}}}},
            "Series": {"type": "object", "required": ["counter", "key", "kind", "from", "to", "points"],
                       "properties": {
                           "counter": {"type": "string"}, "key": {"type": "string"}, "kind": {"type": "string"},
                           "from": {"type": "string"}, "to": {"type": "string"},
                           "step": {"type": ["integer", "null"], "description": "seconds"},
                           "points": {"type": "array", "items": {
                               "type": "object", "required": ["start", "end", "value", "buckets_counted"],
                               "properties": {"start": {"type": "string"}, "end": {"type": "string"}, "value": value,
                                              "buckets_counted": {"type": "integer"}}}}}},
            "Problem": {"type": "object", "properties": {
                "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"},
                "reset": {"type": "object", "required": ["stage", "recorded"], "description": "a reset that failed: "
                          "how far it went, and once recorded its epoch, id and control records published",
                          "properties": {"stage": {"type": "string", "enum": ["partitions", "recording", "publishing",
                                                                              "positions"]},
                                         "recorded": {"type": "boolean"}, "epoch": {"type": "integer"},
                                         "id": {"type": "string"}, "published": {"type": "integer"},
                                         "partitions": {"type": "integer"}}}}},
        }},
    }
    if tracing:
        document["paths"]["/trace/{topic}"] = {"get": {
            "summary": "What one record of a topic did in each counter on it",
            "operationId": "traceRecord",
            "description": "As countersink trace --json (docs/reading.md): the record at offset, or the records "
                           "whose event id is event_id among the last scan records of each partition (of the "
                           "key's partition only, with key).",
            "parameters": [
                {"name": "topic", "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": _TOPIC.pattern}},
                {"name": "offset", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,9}:[0-9]{1,18}$"}},
                {"name": "event_id", "in": "query", "required": False,
                 "schema": {"type": "string", "minLength": 1, "maxLength": DEFAULT_MAX_KEY_BYTES,
                            "description": in_bytes}},
                # A record's message key: any text (no instance key's escapes).
                {"name": "key", "in": "query", "required": False, "schema": {
                    "type": "string", "minLength": 1, "maxLength": DEFAULT_MAX_KEY_BYTES, "description": in_bytes}},
                {"name": "scan", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": MAX_TRACE_SCAN, "default": 10_000}}],
            "responses": {"200": {"description": "what was searched, and each record traced", "content": {
                "application/json": {"schema": {"type": "object", "required": ["topic", "notes", "records"]}}}},
                **errors},
        }}
    if resetting:
        document["paths"][_RESET_PATH] = {"post": {
            "summary": "Reset a counter (some of its keys, or every key): count them again from now",
            "operationId": "resetCounter",
            "description": "As countersink reset --json (docs/operations.md, \"Resetting a counter\"), recorded as "
                           "asked by the admin token's name. Without a body (or with {}), every key of the counter. "
                           "Needs an admin token: a read token answers 403.",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": name_schema},
                           {"name": "Idempotency-Key", "in": "header", "required": False,
                            "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY.pattern},
                            "description": "the same on every attempt of one reset: a request whose key was "
                                           "recorded with a reset of the counter answers that reset (completing "
                                           "it) instead of making a second. Clients that retry must send one."}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "properties": {"keys": {
                    "type": "array", "items": key_schema, "minItems": 1,
                    "maxItems": min(settings.max_keys, MAX_RESET_KEYS)}}}}}},
            "security": [{"admin": []}],
            "responses": {"200": {"description": "the reset as recorded: its epoch, id, who asked, when, and its "
                                  "point in each partition (counts from offset + 1 on)", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Reset"}}}},
                **errors, "401": problem, "403": problem, "409": problem, "500": problem},
        }}
        document["components"]["schemas"]["Reset"] = {
            "type": "object", "required": ["counter", "keys", "epoch", "id", "requested_by", "requested_at",
                                           "positions"],
            "properties": {
                "counter": {"type": "string"}, "keys": {"type": "array", "items": {"type": "string"}},
                "epoch": {"type": "integer"}, "id": {"type": "string"}, "requested_by": {"type": "string"},
                "requested_at": {"type": "string"},
                "warning": {"type": "string", "description": "the reset took effect, but recording its positions "
                            "failed: the consumers record them as they apply it"},
                "superseded_by": {"type": "integer", "description": "a reset asked for again (its Idempotency-Key) "
                                  "not completed: this later epoch resets every key it does"},
                "positions": {"type": "array", "items": {
                    "type": "object", "required": ["topic", "partition", "offset"], "properties": {
                        "topic": {"type": "string"}, "partition": {"type": "integer"},
                        "offset": {"type": "integer", "description": "the control record's offset"}}}}}}
        document["components"].setdefault("securitySchemes", {})["admin"] = {
            "type": "http", "scheme": "bearer", "description": "an admin token (COUNTERSINK_SERVE__ADMIN_TOKENS_FILE)"}
    if guarded:
        # Every path described here needs a token; /healthz and /readyz, which stay open, are not described.
        document["components"].setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
        document["security"] = [{"bearer": []}]
    return document


# --- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counters", type=Path, metavar="FILE",
                        help="definitions file: names not in it answer 404; refused if it means otherwise than "
                        "the counter registry (default: the counter registry the consumers keep in Cassandra)")
    parser.add_argument("--host", help="listen address " + setting_default("serve.host"))
    parser.add_argument("--port", type=port_number, help="listen port " + setting_default("serve.port"))
    parser.add_argument("--consistency", type=consistency_level, metavar="LEVEL",
                        help="default read consistency, any case: " + ", ".join(Consistency) + " "
                        + setting_default("cassandra.read_consistency"))


def run(args: argparse.Namespace, settings: Settings) -> int:
    serve_settings = with_options(settings.serve, given_options(args, ("host", "--host", "host"),
                                                                ("port", "--port", "port")))
    counters = None
    if args.counters:
        counters = load_definitions_or_refuse(args.counters, settings.cassandra.max_row_bytes)
        if counters is None:
            return 2
    return run_async(serve(settings, serve_settings, counters, args.consistency), graceful=True)


async def serve(settings: Settings, serve_settings: ServeSettings, counters: CounterSet | None,
                consistency: Consistency | None, *, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then finish in-flight requests and exit 0."""
    stop = stop or asyncio.Event()
    with stop_on_signals(stop.set):
        return await _serve_until(stop, settings, serve_settings, counters, consistency)


async def _serve_until(stop: asyncio.Event, settings: Settings, serve_settings: ServeSettings,
                       counters: CounterSet | None, consistency: Consistency | None) -> int:
    quiet_accept_errors(asyncio.get_running_loop())
    # Settings first: a refused one stops the start at once, before any wait for Cassandra.
    try:
        tls = server_tls(serve_settings)
        tokens = Tokens(serve_settings)
        admin_tokens = Tokens(serve_settings, admin=True) if serve_settings.admin else None
        admin_cassandra = _admin_cassandra(settings.cassandra, serve_settings)
        guarded = needs_token(tokens, admin_tokens)
        if guarded and tls is None and not serve_settings.allow_insecure:
            raise TokenError("bearer tokens over plain HTTP can be read by anyone on the path: set "
                             "COUNTERSINK_SERVE__TLS_CERT and __TLS_KEY, or COUNTERSINK_SERVE__ALLOW_INSECURE=true "
                             "if a TLS proxy on this host is the only client")
    except (TokenError, ValueError) as exc:
        log.error("serve_settings_refused", error=str(exc))
        return 2
    if guarded and tls is None:
        log.warning("serve_tokens_over_plain_http", allow_insecure=True,
                    why="tokens and requests cross the network readable; only safe behind a TLS proxy on this host")
    if not guarded and not _loopback(serve_settings.host):
        log.warning("serve_without_tokens", host=serve_settings.host,
                    why="anyone who reaches this address reads every counter and /metrics: set "
                        "COUNTERSINK_SERVE__TOKENS_FILE (or __TOKENS) with TLS, or listen on 127.0.0.1")
    client = CassandraClient(settings.cassandra, app="countersink-serve")
    writer = CassandraClient(admin_cassandra, app="countersink-serve-admin", credentials=_ADMIN_CREDENTIALS
                             ) if admin_cassandra else None
    started = time.monotonic()
    try:
        # A server (re)started while Cassandra is briefly away waits for it; a stop meanwhile ends the wait.
        await wait_until_reachable("cassandra", client.start, timeout_s=serve_settings.startup_timeout_s, stop=stop)
        if writer is not None:
            await wait_until_reachable("cassandra", writer.start, timeout_s=serve_settings.startup_timeout_s,
                                       stop=stop)
    except StopRequested:
        log.info("serve_stopped_before_start")
        await client.stop()
        return 0
    except CassandraError as exc:
        log.error("cassandra_unreachable", error=str(exc), waited_s=round(time.monotonic() - started, 1),
                  role=admin_cassandra.username if writer is not None and admin_cassandra else None)
        await client.stop()
        return 1
    async with client, (writer or contextlib.nullcontext()):
        if not await _levels_reachable(client, consistency, writer):
            return 2
        if counters is not None and not await _file_agrees_with_registry(client, counters, consistency):
            return 2
        # Without a definitions file, the names and kinds the consumers recorded.
        registry = CounterRegistry(client, consistency) if counters is None else None
        resetting = Resetting(admin_tokens, writer, settings.kafka) if admin_tokens and writer else None
        api = ReadApi(client, serve_settings, counters, consistency, registry=registry,
                      read_settings=settings.read, tokens=tokens, tracing=settings, resetting=resetting)
        runner = api_runner(api)
        await runner.setup()
        site = web.TCPSite(runner, serve_settings.host, serve_settings.port, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else serve_settings.port
        log.info("serve_started", host=serve_settings.host, port=port, https=tls is not None,
                 tokens_required=api.guarded, counters=str(counters.source) if counters else None,
                 resets=resetting is not None)
        try:
            await stop.wait()
        finally:
            # Resets first: shielded from the request that asked, each is awaited (within the stop timeout,
            # while new ones answer 503) before the server closes and cancels what it still handles.
            await api.finish_resets(STOP_TIMEOUT_S)
            await runner.cleanup()
            log.info("serve_stopped")
    return 0


async def _levels_reachable(client: CassandraClient, consistency: Consistency | None,
                            writer: CassandraClient | None) -> bool:
    """False (logged) when serve's default read level, or its resets' write level, waits for more replicas
    than the keyspace keeps: every read (or reset) would fail."""
    levels = {"--consistency" if consistency else "COUNTERSINK_CASSANDRA__READ_CONSISTENCY":
              consistency or client.settings.read_consistency}
    if writer is not None:
        levels["COUNTERSINK_CASSANDRA__WRITE_CONSISTENCY"] = writer.settings.write_consistency
    try:
        factors = await client.replication_factors()
    except CassandraError:
        return True  # not known now: each request at such a level then says why it fails
    beyond = level_beyond_replicas(levels, client.keyspace, factors, client.settings.local_dc)
    if beyond is not None:
        log.error("settings_refused", error=beyond)
    return beyond is None


async def _file_agrees_with_registry(client: CassandraClient, counters: CounterSet,
                                     consistency: Consistency | None) -> bool:
    """Whether a definitions file given to serve means what the consumers recorded for its counters (False after
    a line per counter that does not: dropped, or recorded with another key, bucket or kind). serve reads the
    stored states by the file's definitions: another bucket size read no bucket, another key shape any key."""
    try:
        await CounterRegistry(client, consistency).check(counters)
    except (DefinitionChangedError, CounterDroppedError) as exc:
        event = "definition_changed" if isinstance(exc, DefinitionChangedError) else "counter_dropped"
        for problem in exc.problems:
            log.error(event, error=problem.line)
        return False
    return True


async def _without_versions(request: web.Request, response: web.StreamResponse) -> None:
    """A Server header naming no versions (aiohttp's own says Python's and its own: a scanner's first question)."""
    response.headers["Server"] = "countersink"


_ADMIN_CREDENTIALS = "COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME and __ADMIN_CASSANDRA_PASSWORD"


def _admin_cassandra(cassandra: CassandraSettings, serve_settings: ServeSettings) -> CassandraSettings | None:
    """The Cassandra settings of the role that writes resets (validated like any: no password in the clear
    without ``allow_insecure``), or None when admin routes are not served."""
    if serve_settings.admin_cassandra_username is None:
        return None
    if serve_settings.admin_cassandra_password is None:
        # Connecting with an empty password would fail later, blaming the read role's settings.
        raise ValueError("COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME is set without "
                         "COUNTERSINK_SERVE__ADMIN_CASSANDRA_PASSWORD: set the admin role's password too")
    fields = {**dict(cassandra), "username": serve_settings.admin_cassandra_username,
              "password": serve_settings.admin_cassandra_password}
    try:
        return CassandraSettings.model_validate(fields)
    except ValidationError as exc:
        raise ValueError("COUNTERSINK_SERVE__ADMIN_CASSANDRA_USERNAME: "
                         + "; ".join(str(e["msg"]) for e in exc.errors())) from None
