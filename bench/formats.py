"""The consumer's hot path per record format: the bench's trades as JSON, Avro, Protobuf and JSON Schema.

    python -m bench.formats [--events N] [--symbols N] [--rounds N]

The same trades (``bench.pipeline.trade``) and counters (``bench.pipeline.definitions``: a count, a sum and a
distinct, with event ids), encoded in each format; Avro, Protobuf and JSON Schema in the Confluent wire format
with their writer schema already in the cache (as after the first record of a schema id). Each format runs
``Mutator.apply_batch`` on batches of 500, the consumer's path, keys repeating, interleaved round by round;
printed: CPU µs per event (best round) and the ratio to JSON. Every format takes the batch path
(``schemas.fast_route``): Avro and Protobuf records as the decoded fields counters read
(``schemas.formats.converter``), JSON Schema records not checked against their schema as their JSON text
(``schemas.formats.json_text_reader``); ``json (router)`` is JSON with its fast path turned off, every record
through the router, for scale. No Kafka, no Cassandra, no registry.
"""

from __future__ import annotations

import argparse
import json
import random
import uuid

from bench.hot_path import batched, cpu_us_per_event
from bench.pipeline import TOPIC, definitions, trade
from consumer.applying import Applier, Mutator, Record, RetryWindow
from consumer.storage import MutatorEntry, PartitionId
from schemas import formats
from schemas.definitions import parse_definitions
from schemas.events import EventRouter, _parse_fast

AVRO = {"type": "record", "name": "Trade", "fields": [
    {"name": "id", "type": "string"}, {"name": "symbol", "type": "string"}, {"name": "qty", "type": "long"},
    {"name": "buyer", "type": "string"}, {"name": "side", "type": "string"}]}
PROTO = """syntax = "proto3";
message Trade { string id = 1; string symbol = 2; int64 qty = 3; string buyer = 4; string side = 5; }
"""
JSON_SCHEMA = {"type": "object", "properties": {"qty": {"type": "integer"}}}
FORMATS = ("json", "json (router)", "avro", "protobuf", "json-schema")


def mutator(format_: str, cache: formats.SchemaCache) -> Mutator:
    """``json (router)``: JSON without its fast path, every record through the router as the others go."""
    table = "" if format_.startswith("json ") or format_ == "json" else (
        f'[[topic]]\nname = "{TOPIC}"\nformat = "{format_}"\n')
    counters = parse_definitions(table + definitions(TOPIC), "bench")
    router = EventRouter(counters, decoders=formats.decoders(counters.formats, cache, None))
    applier = Applier(router, counters, TOPIC, 0, RetryWindow(10_000))
    if format_ == "json (router)":
        applier.fast = None
    entry = MutatorEntry(uuid.uuid4(), "bench", TOPIC, 0, "bench", 0, 2**62)
    return Mutator(entry, PartitionId("bench", TOPIC, 0), applier, -1, -1)


def encoders(cache: formats.SchemaCache) -> dict[str, object]:
    avro = formats.avro_encoder(json.dumps(AVRO))
    proto = formats.ProtoSchema(PROTO)
    encode_proto = proto.encoder((0,))
    for schema_id, (format_, kind, text) in enumerate(
            [("avro", "AVRO", json.dumps(AVRO)), ("protobuf", "PROTOBUF", PROTO),
             ("json-schema", "JSON", json.dumps(JSON_SCHEMA))], start=1):
        topic = formats.TopicFormat(name=TOPIC, format=format_)  # type: ignore[arg-type]
        # JSON Schema payloads are parsed as the consumer parses them (schemas.events' JSON parser).
        cache.put(TOPIC, schema_id, formats.WriterSchema(schema_id, kind, text, topic, _parse_fast))
    return {
        "json": lambda raw: raw,
        "json (router)": lambda raw: raw,
        "avro": lambda raw: formats.frame(1, avro(json.loads(raw))),
        "protobuf": lambda raw: formats.frame(2, encode_proto(json.loads(raw)), (0,)),
        "json-schema": lambda raw: formats.frame(3, raw),
    }


def measure(events: int, symbols: int, rounds: int, seed: int = 7) -> dict[str, float]:
    rng = random.Random(seed)
    raw = [trade(i, rng, symbols)[1] for i in range(events)]
    best: dict[str, float] = {}
    # One cache per format: WriterSchema entries are per (topic, id), and each format has its own ids.
    caches = {f: formats.SchemaCache() for f in FORMATS}
    streams = {}
    for format_ in FORMATS:
        encode = encoders(caches[format_])[format_]
        streams[format_] = [Record(i, encode(r)) for i, r in enumerate(raw)]  # type: ignore[operator]
    for _ in range(rounds):
        for format_ in FORMATS:
            warm = mutator(format_, caches[format_])
            batched(warm, streams[format_])  # keys repeating: every symbol seen once before the timed run
            timed = mutator(format_, caches[format_])
            batched(timed, streams[format_][: events // 2])
            rest = [Record(r.offset, r.value) for r in streams[format_][events // 2:]]
            us = cpu_us_per_event(batched, timed, rest, tuned=True)
            best[format_] = min(best.get(format_, us), us)
            del warm
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.formats", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--symbols", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    best = measure(args.events, args.symbols, args.rounds)
    print(f"{args.events // 2} events per round, {args.symbols} symbols, best of {args.rounds} rounds, "
          "apply_batch, collector tuned, keys repeating")
    print(f"{'format':<14} {'µs/event':>9} {'× json':>7}")
    for format_ in FORMATS:
        print(f"{format_:<14} {best[format_]:>9.2f} {best[format_] / best['json']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
