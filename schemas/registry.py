"""The counter registry's pure half: what of a definition is its meaning, its fingerprint, and what changed.

A consumer records every counter it keeps (``counters`` table) before it counts anything. The fingerprint
covers what stored state means: the kind, the key and value fields, ``where``, the bucket, the number mode
and the sketch sizes. ``topics``, ``event_id``, ``coerce`` and ``top`` may change under the same name: they
decide which events arrive, not what a stored state means.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schemas.definitions import CounterDefinition, CounterSet

REGISTRY_SOURCE = "the counter registry"


def meaning(definition: CounterDefinition) -> dict[str, Any]:
    """The parts of a definition that stored state depends on, with every default made explicit."""
    spec = definition.spec
    return {
        "kind": definition.kind,
        "key": list(definition.key),
        "value": definition.value,
        "where": {path: list(values) for path, values in sorted(definition.where.items())},
        "bucket": definition.bucket.model_dump(mode="json") if definition.bucket else None,
        "number": definition.number_mode,
        "lg_k": spec.lg_k if definition.kind == "distinct" else None,
        "k": spec.k if definition.kind == "quantiles" else None,
        "max_map_size": 2 ** spec.lg_max_map_size if definition.kind == "top_k" else None,
    }


def fingerprint(definition: CounterDefinition) -> str:
    """SHA-256 of the canonical JSON of :func:`meaning`, in hex."""
    text = json.dumps(meaning(definition), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def to_record(definition: CounterDefinition) -> str:
    """The whole definition as JSON, as the registry stores it."""
    return definition.model_dump_json(exclude_none=True)


def from_record(text: str) -> CounterDefinition:
    return CounterDefinition.model_validate_json(text)


def changes(registered: CounterDefinition, new: CounterDefinition) -> list[str]:
    """What differs in meaning between two definitions of one name, as ``field: old -> new``."""
    old_meaning, new_meaning = meaning(registered), meaning(new)
    return [f"{field}: {json.dumps(old_meaning[field])} -> {json.dumps(new_meaning[field])}"
            for field in old_meaning if old_meaning[field] != new_meaning[field]]


def registered_set(definitions: list[CounterDefinition]) -> CounterSet:
    return CounterSet(tuple(sorted(definitions, key=lambda d: d.name)), REGISTRY_SOURCE)
