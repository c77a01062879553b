"""What each counter of a mixed topic must hold, computed without countersink's router: the oracle of the
mixed-topic tests (and of a kill -9 phase: it depends only on the records published).

:func:`per_counter_truth` reads a definitions file's counters and the records of their topic, in log order,
and decides for each record and counter as docs/counters.md says a counter does: filtered out by ``where``;
not applicable when one of its key, value or bucket fields is absent or null (refused instead when the
counter is ``required``); refused for a field of the wrong type or a missing event id; else counted. It
covers the shapes the tests use (kinds count, sum, min and max with integer values; payload paths and
``@key``, ``@key.PATH``, ``@timestamp``, ``@header.NAME``, ``@partition``; hourly-or-coarser buckets of the
record time; ``countersink.apply-to``) and refuses any other shape, so that it is never silently wrong.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.definitions import CounterDefinition, CounterSet

_ABSENT = object()
_LIMIT = 2**64


@dataclass(frozen=True)
class TruthRecord:
    """One record as published: its payload, and what of the record a counter may read."""

    value: bytes
    key: bytes | None = None
    timestamp_ms: int | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int = 0


@dataclass
class PerCounterTruth:
    """``values``: counter -> instance key -> value; ``refused``: record index -> the counters that refused it
    (``("*",)`` for a record refused as a whole); ``skipped``: (counter, reason) -> how many."""

    values: dict[str, dict[str, int]] = field(default_factory=dict)
    refused: dict[int, tuple[str, ...]] = field(default_factory=dict)
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)


def _supported(definition: CounterDefinition) -> None:
    if definition.kind not in ("count", "sum", "min", "max") or definition.number_mode not in (None, "integer"):
        raise NotImplementedError(f"{definition.name}: kind {definition.kind} is not modelled by the truth")
    if definition.coerce or definition.retain is not None:
        raise NotImplementedError(f"{definition.name}: coerce and retain are not modelled by the truth")
    if definition.bucket is not None and (definition.bucket.field != "@timestamp"
                                          or definition.bucket.seconds % 3600):
        raise NotImplementedError(f"{definition.name}: only buckets of whole hours of @timestamp are modelled")


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise TypeError(f"{what} is not UTF-8") from None


def _read(path: str, event: dict[str, Any], record: TruthRecord) -> Any:
    """The value at ``path``; ``_ABSENT`` when absent; ``TypeError`` when it cannot be read."""
    if path.startswith("@") and not path.startswith("@@"):
        part, _, rest = path[1:].partition(".")
        if part == "timestamp":
            return _ABSENT if record.timestamp_ms is None or record.timestamp_ms < 0 else record.timestamp_ms
        if part == "partition":
            return record.partition
        if part == "header":
            found: Any = _ABSENT
            for name, value in record.headers:
                if name == rest:
                    found = value
            return found if found is _ABSENT or found is None else _text(found, "header")
        if record.key is None:
            return None if not rest else _ABSENT
        if not rest:
            return _text(record.key, "key")
        try:
            node: Any = json.loads(record.key)
        except ValueError:
            raise TypeError("key is not JSON") from None
        names = rest.split(".")
    else:
        node = event
        names = (path[1:] if path.startswith("@@") else path).split(".")
    for name in names:
        if node is None:
            return _ABSENT
        if not isinstance(node, dict):
            raise TypeError(f"{path}: not an object")
        node = node.get(name, _ABSENT)
        if node is _ABSENT:
            return _ABSENT
    return node


def _quiet(path: str, event: dict[str, Any], record: TruthRecord) -> Any:
    try:
        return _read(path, event, record)
    except TypeError:
        return _ABSENT


def _matches(definition: CounterDefinition, event: dict[str, Any], record: TruthRecord) -> bool:
    for path, allowed in definition.where.items():
        v = _quiet(path, event, record)
        if isinstance(v, list | dict) or not any(type(v) is type(a) and v == a for a in allowed):
            return False
    return True


def _key_part(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | str):
        return str(v).replace("\\", "\\\\").replace("|", "\\|")
    raise TypeError("not a key")


def _decide(definition: CounterDefinition, event: dict[str, Any], record: TruthRecord
            ) -> tuple[str, str | None, int | None, str | None, str | None]:
    """(``counted``/``filtered``/``skipped``/``refused``, instance key, value, skip reason, event id)."""
    if not _matches(definition, event, record):
        return "filtered", None, None, None, None
    needed = [("key", p) for p in definition.key]
    if definition.value is not None:
        needed.append(("value", definition.value))
    if definition.bucket is not None:
        needed.append(("bucket", definition.bucket.field))
    for role, path in needed:
        try:
            v = _read(path, event, record)
        except TypeError:
            continue
        if v is _ABSENT or v is None:
            if definition.required:
                return "refused", None, None, None, None
            return "skipped", None, None, f"{role}_{'missing' if v is _ABSENT else 'null'}", None
    try:
        parts = [_key_part(_read(p, event, record)) for p in definition.key]
        if definition.bucket is not None:
            ms = _read(definition.bucket.field, event, record)
            if type(ms) is not int:
                raise TypeError("not a time")
            start = ms // 1000 // definition.bucket.seconds * definition.bucket.seconds
            parts.append(time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(start)))
        value = None
        if definition.value is not None:
            value = _read(definition.value, event, record)
            if type(value) is not int or not -_LIMIT < value < _LIMIT:
                raise TypeError("not an integer")
        ident = None
        if definition.event_id is not None:
            ident = _read(definition.event_id, event, record)
            if type(ident) not in (str, int):
                raise TypeError("no event id")
    except TypeError:
        return "refused", None, None, None, None
    key = "|".join(parts)
    if len(key.encode()) > 1024:
        return "refused", None, None, None, None
    return "counted", key, value, None, None if ident is None else str(ident)


def per_counter_truth(definitions: CounterSet, topic: str, records: Iterable[TruthRecord]) -> PerCounterTruth:
    """What each counter on ``topic`` must hold after reading ``records`` (in log order), and which records
    must be dead-lettered naming which counters. A counter with ``event_id`` counts an id once per partition:
    the retry window is taken to hold the whole stream (fewer records per partition than the consumer's
    ``retry_window_records``)."""
    counters = definitions.for_topic(topic)
    for definition in counters:
        _supported(definition)
    truth = PerCounterTruth(values={c.name: {} for c in counters})
    ids: dict[tuple[int, str], set[str]] = {}
    for index, record in enumerate(records):
        try:
            event = json.loads(record.value)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            truth.refused[index] = ("*",)
            continue
        only = None
        for name, header in record.headers:
            if name == "countersink.apply-to":
                only = {n.strip() for n in header.decode().split(",") if n.strip()}
        refused = []
        for definition in counters:
            if only is not None and definition.name not in only:
                continue
            decision, key, value, reason, ident = _decide(definition, event, record)
            if decision == "skipped":
                truth.skipped[(definition.name, reason or "")] += 1
            elif decision == "refused":
                refused.append(definition.name)
            elif decision == "counted":
                assert key is not None
                if ident is not None:  # a publisher retry: an id this counter took in this partition before
                    seen = ids.setdefault((record.partition, definition.name), set())
                    if ident in seen:
                        continue
                    seen.add(ident)
                held = truth.values[definition.name]
                if definition.kind == "count":
                    held[key] = held.get(key, 0) + 1
                elif definition.kind == "sum":
                    held[key] = held.get(key, 0) + (value or 0)
                elif definition.kind == "max":
                    held[key] = max(held.get(key, value or 0), value or 0)
                else:
                    held[key] = min(held.get(key, value or 0), value or 0)
        if refused:
            truth.refused[index] = tuple(refused)
    return truth
