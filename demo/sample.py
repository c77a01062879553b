"""The demo's sample stream and the truth computed from it, independently of countersink."""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

SYMBOLS = ["IBM", "AAPL", "MSFT", "NVDA", "ORCL", "SAP", "ASML", "TSM"]
ENDPOINTS = ["/search", "/checkout", "/login"]
PAGES = ["/home", "/cart", "/help"]
SKUS = ["k1", "k2", "k3"]
BUTTONS = ["buy", "like", "share"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HOUR = 3600
SERIES_HOURS = 48  # trades carry event times over the last two days
# Records every counter of their topic must refuse (a record that merely fails a `where` filter is valid).
# Each refused by every counter of its topic (a key or item of a type none takes), so each is one dead letter and
# no counter counts it: a record lacking a field would only be skipped by the counters reading that field.
MALFORMED = {
    "demo-trades": [b"{not json", b'{"trade_id": "m1", "symbol": ["IBM"], "side": "buy", "buyer": "a", "price": 1}',
                    b'{"trade_id": "m2", "symbol": 12.5, "side": "buy", "buyer": "a", "qty": "12", "price": 1}',
                    b"[]"],
    "demo-likes": [b"\xff\xfe", b'{"like_id": "m3", "post_id": ["x"], "type": "like"}',
                   b'{"like_id": "m4", "post_id": 1.5, "type": "like"}'],
}


@dataclass
class Truth:
    qty: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    prices: defaultdict[str, list[Decimal]] = field(default_factory=lambda: defaultdict(list))
    buyers: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    latency: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    likes: Counter[str] = field(default_factory=Counter)
    malformed: int = 0
    duplicates: int = 0
    # Time series: the first hour of the range, trades and buyers per (symbol, hour start)
    series_start: int = 0
    hourly: Counter[tuple[str, int]] = field(default_factory=Counter)
    hourly_buyers: defaultdict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    # The schema-format topics: views per page (Avro), amount per sku (Protobuf), clicks per button (JSON Schema)
    views: Counter[str] = field(default_factory=Counter)
    revenue: Counter[str] = field(default_factory=Counter)
    clicks: Counter[str] = field(default_factory=Counter)

    def mean(self, symbol: str) -> float:
        values = self.qty[symbol]
        return float(Fraction(sum(values), len(values)))

    def stddev(self, symbol: str) -> float:
        values = self.qty[symbol]
        n = len(values)
        mean = Fraction(sum(values), n)
        return math.sqrt(float(sum((Fraction(v) - mean) ** 2 for v in values) / n))


def make_stream(trades: int, likes: int, api_calls: int, duplicates: int, malformed: int,
                seed: int = 2026, formatted: int = 0) -> tuple[dict[str, list[bytes]], Truth]:
    """Events per topic, with publisher retries (same id, same key, shortly after) and malformed records."""
    rng = random.Random(seed)
    # The last two whole hours' worth of days before now: within the counters' 30-day retention.
    truth = Truth(series_start=int(time.time()) // HOUR * HOUR - SERIES_HOURS * HOUR)
    topics: dict[str, list[bytes]] = {"demo-trades": [], "demo-likes": [], "demo-api-calls": []}
    for _ in range(trades):
        symbol = rng.choice(SYMBOLS)
        side = rng.choice(["buy", "sell"])
        qty = rng.randrange(1, 500) * (10 if rng.random() < 0.05 else 1)
        price = Decimal(rng.randrange(5_000, 50_000)) / 100
        buyer = f"acct-{rng.randrange(3_000)}"
        at = truth.series_start + rng.randrange(SERIES_HOURS * HOUR)
        trade = json.dumps({"trade_id": uuid.UUID(int=rng.getrandbits(128)).hex, "symbol": symbol, "side": side,
                            "qty": qty, "buyer": buyer,
                            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))})
        hour = at // HOUR * HOUR
        truth.hourly[(symbol, hour)] += 1
        if side == "buy":
            truth.hourly_buyers[(symbol, hour)].add(buyer)
        # The price goes in as a JSON number written from its exact decimal text (json.dumps has no Decimal).
        topics["demo-trades"].append(f'{trade[:-1]}, "price": {price}}}'.encode())
        truth.qty[symbol].append(qty)
        truth.prices[symbol].append(price)
        if side == "buy":
            truth.buyers[symbol].add(buyer)
    for _ in range(likes):
        post = f"post-{min(int(rng.paretovariate(1.2)), 400)}"
        kind = "like" if rng.random() < 0.9 else "unlike"
        topics["demo-likes"].append(json.dumps(
            {"like_id": uuid.UUID(int=rng.getrandbits(128)).hex, "post_id": post, "user": f"u{rng.randrange(9999)}",
             "type": kind}).encode())
        if kind == "like":
            truth.likes[post] += 1
    for _ in range(api_calls):
        endpoint = rng.choice(ENDPOINTS)
        latency = round(rng.lognormvariate(3.0, 0.6) * (3 if endpoint == "/checkout" else 1), 3)
        topics["demo-api-calls"].append(json.dumps({"endpoint": endpoint, "latency_ms": latency}).encode())
        truth.latency[endpoint].append(latency)
    for topic in ("demo-trades", "demo-likes"):
        events = topics[topic]
        for _ in range(duplicates // 2):
            position = rng.randrange(len(events))
            events.insert(min(len(events), position + rng.randrange(1, 40)), events[position])
            truth.duplicates += 1
    for i in range(malformed):
        topic = "demo-trades" if i % 2 == 0 else "demo-likes"
        bad = MALFORMED[topic][i // 2 % len(MALFORMED[topic])]
        topics[topic].insert(rng.randrange(len(topics[topic]) + 1), bad)
        truth.malformed += 1
    if formatted:
        topics.update(make_formatted(formatted, rng, truth))
    return topics, truth


def make_formatted(n: int, rng: random.Random, truth: Truth) -> dict[str, list[bytes]]:
    """``n`` records on each schema-format topic, encoded with the schemas of examples/formats and framed in the
    Confluent wire format (schema id 1: the inline mode reads every record with its topic's schema file)."""
    from schemas.formats import ProtoSchema, avro_encoder, frame

    folder = EXAMPLES / "formats"
    encode_view = avro_encoder((folder / "view.avsc").read_text())
    proto = ProtoSchema((folder / "purchase.proto").read_text())
    indexes = proto.indexes_of("shop.Purchase")
    encode_purchase = proto.encoder(indexes)
    topics: dict[str, list[bytes]] = {"demo-views": [], "demo-purchases": [], "demo-clicks": []}
    now_ms = int(time.time() * 1000)
    for _ in range(n):
        page = rng.choice(PAGES)
        topics["demo-views"].append(frame(1, encode_view({"page": page, "at": now_ms - rng.randrange(86_400_000)})))
        truth.views[page] += 1
        sku, amount = rng.choice(SKUS), rng.randrange(1, 10_000)
        topics["demo-purchases"].append(frame(1, encode_purchase(
            {"sku": sku, "amount": amount, "channel": rng.choice(["WEB", "APP"])}), indexes))
        truth.revenue[sku] += amount
        button = rng.choice(BUTTONS)
        topics["demo-clicks"].append(frame(1, json.dumps({"button": button, "user": f"u{rng.randrange(99)}"}).encode()))
        truth.clicks[button] += 1
    return topics
