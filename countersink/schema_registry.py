"""The schema registry, through its Confluent-compatible REST API (the one every client speaks): writer schemas
by id for the consumer, and subjects registered by ``countersink publish``.

:class:`SchemaRegistryClient` is plain HTTP (aiohttp) to the documented endpoints ``GET /schemas/ids/{id}``
and ``POST /subjects/{subject}/versions``. :class:`SchemaLoader` fills the router's
:class:`~schemas.formats.SchemaCache` with every schema id a batch names before the batch is routed. A
registry that cannot be reached (refused, timed out, a 5xx) raises the retriable
:class:`SchemaRegistryUnavailableError`: a wait, never a dead letter. A 404 is an answer: the records naming
that id are dead letters with the id in their headers.

The password is a ``SecretStr``: it is sent in the Authorization header and nowhere else (never logged).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Collection, Hashable, Iterable
from typing import Any

from countersink.logs import get_logger
from countersink.redaction import server_words
from countersink.settings import SchemaRegistrySettings
from schemas.definitions import CounterSet
from schemas.errors import CountersinkError, InvalidEventError
from schemas.events import _parse_decimal, _parse_fast
from schemas.formats import (
    BadSchemaEventError,
    SchemaCache,
    SchemaError,
    TopicFormat,
    UnknownSchemaError,
    WriterSchema,
    _read_schema_file,
    schema_ids,
)

log = get_logger(__name__)

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistryUnavailableError(CountersinkError):
    """Raised when the schema registry cannot be reached or answers with a server error: try again later."""

    retriable = True


class SchemaRegistryRefusedError(CountersinkError):
    """Raised when the registry refuses a request for good (a 4xx other than an unknown schema id): a bad
    schema to register, wrong credentials."""


class SchemaRegistryNotConfiguredError(CountersinkError):
    """Raised at start when a topic takes its schemas from a registry and no registry URL is set."""


class SchemaRegistryClient:
    """A few calls of the Confluent-compatible API. ``async with`` or :meth:`start` / :meth:`stop`."""

    def __init__(self, settings: SchemaRegistrySettings) -> None:
        if settings.url is None:
            raise SchemaRegistryNotConfiguredError(
                "a topic reads Avro, Protobuf or JSON Schema records from a schema registry: set "
                "COUNTERSINK_SCHEMA_REGISTRY__URL (or give the topic's schema in a file: schema_file)")
        self.settings = settings
        self.url = settings.url.rstrip("/")
        self._session: Any = None

    async def __aenter__(self) -> SchemaRegistryClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _words(self, text: object) -> str:
        """The registry's (or the HTTP client's) reason, one bounded line without the password in any form."""
        password = self.settings.password.get_secret_value() if self.settings.password else None
        return server_words(text, [(self.settings.username, password)])

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.url.startswith("https://"):
            return False
        context = ssl.create_default_context(cafile=str(self.settings.ca_file) if self.settings.ca_file else None)
        return context

    async def start(self) -> None:
        import aiohttp

        if self._session is None:
            auth = None
            if self.settings.username is not None:
                password = self.settings.password.get_secret_value() if self.settings.password else ""
                auth = aiohttp.BasicAuth(self.settings.username, password)
            self._session = aiohttp.ClientSession(
                auth=auth, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
                connector=aiohttp.TCPConnector(ssl=self._ssl()), headers={"Accept": _CONTENT_TYPE})

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        import aiohttp

        await self.start()
        try:
            async with self._session.request(method, f"{self.url}{path}", json=body,
                                             headers={"Content-Type": _CONTENT_TYPE} if body else None) as answer:
                # Every chunk up to the bound: read(n) answers what has come so far, which cut a chunked answer
                # over 64 KiB short (its JSON unreadable: taken for a registry away, a wait for ever).
                limit = self.settings.max_schema_bytes * 2 + 65536
                text = b""
                while len(text) <= limit and (chunk := await answer.content.read(limit + 1 - len(text))):
                    text += chunk
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise SchemaRegistryUnavailableError(f"schema registry {self.url} cannot be reached: "
                                                 f"{type(exc).__name__}: {self._words(exc)}") from exc
        if status >= 500 or status == 429:
            raise SchemaRegistryUnavailableError(f"schema registry {self.url} answered {status}")
        if len(text) > limit:  # a schema (escaped in JSON) past COUNTERSINK_SCHEMA_REGISTRY__MAX_SCHEMA_BYTES
            raise SchemaError(f"the schema registry's answer to {method} {path} is over {limit} bytes: its schema is "
                              f"larger than {self.settings.max_schema_bytes} bytes (max_schema_bytes)")
        try:
            import json

            doc = json.loads(text) if text else None
        except ValueError as exc:
            raise SchemaRegistryUnavailableError(f"schema registry {self.url} answered {status} with no JSON") from exc
        return status, doc

    def _refused_credentials(self, status: int, what: str) -> SchemaRegistryRefusedError:
        # Its reason is not quoted: a registry (or a proxy before it) may echo the credentials it refused.
        return SchemaRegistryRefusedError(
            f"schema registry {self.url} refused the credentials ({status}) {what}: check "
            "COUNTERSINK_SCHEMA_REGISTRY__USERNAME and __PASSWORD, and what that user may do")

    async def schema_by_id(self, schema_id: int) -> tuple[str, str] | None:
        """(schema type: AVRO, PROTOBUF or JSON; schema text) of ``schema_id``; None when the registry does not
        know the id."""
        status, doc = await self._call("GET", f"/schemas/ids/{int(schema_id)}")
        if status == 404:
            return None
        if status in (401, 403):
            raise self._refused_credentials(status, f"to read schema id {schema_id}")
        if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            what = f"answered {status}" if status != 200 else "answered 200 without a schema"
            raise SchemaRegistryRefusedError(f"schema registry {self.url} {what} for schema id {schema_id}")
        if doc.get("references"):
            raise SchemaError("schemas with references are not supported")
        return str(doc.get("schemaType") or "AVRO"), doc["schema"]

    async def register(self, subject: str, schema_type: str, text: str) -> int:
        """Register ``text`` under ``subject`` (a new version, or the existing one when it is already there);
        returns its id."""
        from urllib.parse import quote

        body: dict[str, Any] = {"schema": text}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        status, doc = await self._call("POST", f"/subjects/{quote(subject, safe='')}/versions", body)
        if status in (401, 403):
            raise self._refused_credentials(status, f"to register subject {subject!r}")
        if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("id"), int):
            message = doc.get("message") if isinstance(doc, dict) else None
            raise SchemaRegistryRefusedError(f"schema registry refused the schema of subject {subject!r} "
                                             f"({status}): {self._words(message)}")
        return int(doc["id"])


def schema_cache(settings: SchemaRegistrySettings) -> SchemaCache:
    """The router's cache of writer schemas, bounded as ``settings`` say."""
    return SchemaCache(max_entries=settings.max_cached_schemas, unknown_retry_s=settings.unknown_schema_retry_s)


# At most this many ``schema_id_unknown`` lines a minute per topic: a producer naming random ids (each a dead
# letter) must not flood the log; the next line says how many were left out.
_UNKNOWN_LINES_PER_MINUTE = 20


# Schema ids looked up at once by one load: enough to take a burst of unknown ids at the registry's pace, few
# enough not to flood it.
_LOOKUPS_AT_ONCE = 16


class SchemaLoader:
    """Loads the writer schemas that records name into the router's cache, before the records are routed."""

    def __init__(self, settings: SchemaRegistrySettings, counters: CounterSet, cache: SchemaCache) -> None:
        self.cache = cache
        self._topics: dict[str, TopicFormat] = {n: t for n, t in counters.formats.items() if t.registry}
        self._readers: dict[str, str | None] = {
            name: None if t.reader_schema_file is None else _read_schema_file(
                t.reader_schema_file, counters.schema_base, settings.max_schema_bytes)
            for name, t in self._topics.items()}
        self._max_bytes = settings.max_schema_bytes
        # JSON Schema payloads are JSON: parsed as the router parses the topic's JSON (exact decimals or not).
        self._parsers = {name: _parse_decimal if any(c.number_mode == "decimal" for c in counters.for_topic(name))
                         else _parse_fast for name in self._topics}
        self._client = SchemaRegistryClient(settings) if self._topics else None
        self._unknown_said: dict[str, tuple[float, int, int]] = {}  # topic: (minute started, said, left out)

    @property
    def needed(self) -> bool:
        """True when a topic takes its schemas from the registry."""
        return self._client is not None

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.stop()

    async def load(self, topic: str, values: Iterable[bytes | None], holder: Hashable | None = None) -> None:
        """Fetch and compile every schema id of ``values`` not yet cached for ``topic``; ``holder`` (whoever
        routes them, if not at once) holds them in the cache until its next load or
        :meth:`~schemas.formats.SchemaCache.release`. Raises :class:`SchemaRegistryUnavailableError`
        (retriable) when the registry cannot answer."""
        await self.fetch(topic, self.uncached(topic, values, holder))

    def uncached(self, topic: str, values: Iterable[bytes | None], holder: Hashable | None = None) -> list[int]:
        """The schema ids of ``values`` to fetch before they are routed (:meth:`load` without the fetching: no
        request); ``holder`` holds them all, as with :meth:`load`."""
        if topic not in self._topics:
            return []
        return self.cache.missing(topic, schema_ids(values), holder)

    async def fetch(self, topic: str, missing: Collection[int]) -> None:
        """Fetch and compile the schemas of ``missing`` (ids of ``topic``) into the cache. Raises
        :class:`SchemaRegistryUnavailableError` (retriable) when the registry cannot answer."""
        format_ = self._topics.get(topic)
        if format_ is None or self._client is None or not missing:
            return
        # Several look-ups at once: a batch naming hundreds of ids the cache lacks (a producer writing random
        # ids, each a dead letter) waited for one answer after the other, and held every topic of the process.
        at_once, client = asyncio.Semaphore(_LOOKUPS_AT_ONCE), self._client

        async def entry_of(schema_id: int) -> WriterSchema | InvalidEventError:
            async with at_once:
                return await self._entry(client, topic, format_, schema_id)

        entries = await asyncio.gather(*(entry_of(schema_id) for schema_id in missing), return_exceptions=True)
        failed: BaseException | None = None
        for schema_id, entry in zip(missing, entries, strict=True):
            if isinstance(entry, BaseException) and not isinstance(entry, InvalidEventError):
                failed = failed or entry
            else:
                self.cache.put(topic, schema_id, entry)
        if failed is not None:
            raise failed  # the registry away: the ids it answered are kept, the others asked again

    async def _entry(self, client: SchemaRegistryClient, topic: str, format_: TopicFormat, schema_id: int
                     ) -> WriterSchema | InvalidEventError:
        try:
            found = await client.schema_by_id(schema_id)
            if found is None:
                self._say_unknown(topic, schema_id)
                return UnknownSchemaError(schema_id)
            schema_type, text = found
            entry = await asyncio.to_thread(WriterSchema, schema_id, schema_type, text, format_,
                                            self._parsers[topic], self._readers[topic], self._max_bytes)
            log.info("schema_loaded", topic=topic, schema_id=schema_id, schema_type=schema_type)
            return entry
        except SchemaError as exc:
            log.warning("schema_unusable", topic=topic, schema_id=schema_id, reason=str(exc))
            return BadSchemaEventError(schema_id, str(exc))

    def _say_unknown(self, topic: str, schema_id: int) -> None:
        now = time.monotonic()
        started, said, left_out = self._unknown_said.get(topic, (now, 0, 0))
        if now - started >= 60:
            started, said = now, 0
        if said < _UNKNOWN_LINES_PER_MINUTE:
            log.warning("schema_id_unknown", topic=topic, schema_id=schema_id, retry_after_s=self.cache.unknown_retry_s,
                        **({"ids_not_logged": left_out} if left_out else {}))
            said, left_out = said + 1, 0
        else:
            left_out += 1
        self._unknown_said[topic] = (started, said, left_out)
