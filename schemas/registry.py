"""The counter registry's pure half: what of a definition is its meaning, its fingerprint, and what changed.

A consumer records every counter it keeps (``counters`` table) before it counts anything. Beside the definition
the record holds the format of each of its topics (``topic_formats``: their ``[[topic]]`` tables, a JSON topic
as ``{"format": "json"}``) as the consumer last started with them, so that a trace without the definitions
file decodes records as the consumer does; a record made before formats were recorded has none, and a trace
refuses such a topic rather than take its records for JSON. The fingerprint
covers what stored state means: the kind, the key and value fields, ``where``, the bucket, the number mode
and the sketch sizes, and the retention. ``topics``, ``event_id``, ``coerce``, ``required`` and ``top`` may
change under the same name: they decide which events arrive, not what a stored state means.

Retention is part of the meaning because every row of a bucket is written with a TTL ending at the bucket's
expiry under the retention of its writer: under a new retention a bucket would hold rows of both, and the GC
and the readers, which treat a bucket's rows as expiring together, would show it half timed (its untimed rows
alone once the timed ones are hidden). Only a counter with retention has the entry, so the fingerprints of the
others are those recorded before retention was part of it; a record whose fingerprint differs but whose
meaning does not (recorded before) is accepted.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schemas.definitions import RECORDED, Bucket, CounterDefinition, CounterSet
from schemas.formats import TopicFormat

REGISTRY_SOURCE = "the counter registry"
_RETAIN_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60))
_BUCKET_UNITS = _RETAIN_UNITS[1:]


def _in_largest_unit(seconds: int, units: tuple[tuple[str, int], ...]) -> str:
    unit, size = next((unit, size) for unit, size in units if seconds % size == 0)
    return f"{seconds // size}{unit}"


def _retention(seconds: int) -> str:
    """A retention in its largest whole unit (``14d`` and ``2w`` are one retention: ``2w``)."""
    return _in_largest_unit(seconds, _RETAIN_UNITS)


def _bucket(bucket: Bucket) -> dict[str, Any]:
    """A bucket with its size in its largest whole unit: buckets are cut by their width in seconds alone, so
    ``24h`` and ``1d`` (or ``60m`` and ``1h``) make the same buckets under the same keys."""
    return {**bucket.model_dump(mode="json"), "size": _in_largest_unit(bucket.seconds, _BUCKET_UNITS)}


def _allowed(values: tuple[Any, ...]) -> list[Any]:
    """A ``where`` list as the set it is (an event passes when its value is any of them): ordered by its JSON
    text, each value once. ``true`` and ``1`` stay two values, as matching keeps them."""
    unique = {json.dumps(value): value for value in values}
    return [unique[text] for text in sorted(unique)]


def meaning(definition: CounterDefinition) -> dict[str, Any]:
    """The parts of a definition that stored state depends on, with every default made explicit."""
    spec = definition.spec
    return {
        "kind": definition.kind,
        "key": list(definition.key),
        "value": definition.value,
        "where": {path: _allowed(values) for path, values in sorted(definition.where.items())},
        "bucket": _bucket(definition.bucket) if definition.bucket else None,
        "number": definition.number_mode,
        "lg_k": spec.lg_k if definition.kind == "distinct" else None,
        "k": spec.k if definition.kind == "quantiles" else None,
        "max_map_size": 2 ** spec.lg_max_map_size if definition.kind == "top_k" else None,
        **({} if definition.retain_seconds is None else {"retain": _retention(definition.retain_seconds)}),
    }


def fingerprint(definition: CounterDefinition) -> str:
    """SHA-256 of the canonical JSON of :func:`meaning`, in hex."""
    text = json.dumps(meaning(definition), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def to_record(definition: CounterDefinition) -> str:
    """The whole definition as JSON, as the registry stores it."""
    return definition.model_dump_json(exclude_none=True)


def from_record(text: str) -> CounterDefinition:
    return CounterDefinition.model_validate_json(text, context={RECORDED: True})


def changes(registered: CounterDefinition, new: CounterDefinition) -> list[str]:
    """What differs in meaning between two definitions of one name, as ``field: old -> new``."""
    old_meaning, new_meaning = meaning(registered), meaning(new)
    fields = list(old_meaning) + [field for field in new_meaning if field not in old_meaning]
    # Compared as JSON text, as fingerprinted: Python holds ``True == 1``, which a where list must not.
    texts = [(field, json.dumps(old_meaning.get(field)), json.dumps(new_meaning.get(field))) for field in fields]
    return [f"{field}: {old} -> {new}" for field, old, new in texts if old != new]


def refusal(registered: CounterDefinition, new: CounterDefinition, registered_by: object) -> str | None:
    """Why ``new`` may not be counted under the name ``registered`` holds in the registry; None when their
    meanings agree."""
    changed = changes(registered, new)
    if not changed:
        return None
    reason = (f"its meaning differs from the definition recorded in the counter registry ({'; '.join(changed)}), "
              f"registered by {registered_by}. Changing a counter in place would apply events with the new "
              "meaning to state kept with the old one: give the new definition a new name")
    if any(change.startswith("retain:") for change in changed):
        reason += (". A bucket's rows expire with the retention they were written under, so a new retention would "
                   "leave buckets half timed: define a new counter (a new name) with the new retention, and read "
                   "the old one until its buckets have expired")
    return reason


def registered_set(definitions: list[CounterDefinition]) -> CounterSet:
    return CounterSet(tuple(sorted(definitions, key=lambda d: d.name)), REGISTRY_SOURCE)


def formats_record(counters: CounterSet, definition: CounterDefinition) -> str:
    """The formats of ``definition``'s topics in ``counters``, as the registry stores them (canonical JSON)."""
    formats = {topic: (counters.formats.get(topic) or TopicFormat(name=topic)).model_dump(
        mode="json", by_alias=True, exclude_none=True) for topic in definition.topics}
    return json.dumps(formats, sort_keys=True, separators=(",", ":"))


def recorded_format(topic: str, records: list[str | None]) -> TopicFormat | str:
    """The format of ``topic`` that the ``topic_formats`` records of its counters agree on, or why it is not
    known: a record without formats (made before they were recorded), or records that disagree."""
    found: dict[str, TopicFormat] = {}
    for text in records:
        table = None if text is None else json.loads(text).get(topic)
        if table is None:
            return (f"the counter registry does not say topic {topic!r}'s format (a counter on it was recorded "
                    "before formats were; its consumer records them when it starts again)")
        found[json.dumps(table, sort_keys=True)] = TopicFormat.model_validate(table)
    if len(found) != 1:
        return f"the counter registry holds {len(found)} different formats of topic {topic!r}"
    return next(iter(found.values()))
