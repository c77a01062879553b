"""Shapes of definition for ``python -m bench.hot_path --shapes``: one stream of events holding every field any
shape reads, and per shape the counters reading it.

Every shape but the last has three counters with event ids, as the bench's trades (count, sum, distinct of
one key), changed in one way: the key read from a nested field, an hourly bucket, an exact decimal sum, or the
third counter of another kind. *page views* is a stream shaped like real traffic and unlike trades: nine
counters over six keys (nested user fields, hourly and daily buckets, a decimal sum under a filter, latency
quantiles, top-k endpoints, an error count under a filter).
"""

from __future__ import annotations

import random
from collections.abc import Collection

TOPIC = "bench-trades"
# The events' times: 2025-11-26 00:00 UTC on, 20 events a second (each hour holds 72,000 of them).
START_S = 1_764_115_200
PER_SECOND = 20
EVENTS_PER_HOUR = PER_SECOND * 3600  # an hour of the stream: a round that makes each hour's new instances
ENDPOINTS = [f"{verb} /api/{name}" for verb in ("GET", "POST") for name in
             ("users", "orders", "items", "cart", "search", "login", "stats", "health")]
COUNTRIES = ["FR", "DE", "US", "GB", "JP", "BR", "IN", "ES", "IT", "NL"]


def event(i: int, rng: random.Random, symbols: int) -> bytes:
    """A trade (the bench's fields: id, symbol, qty, buyer, side) that is also a page view (user, page,
    endpoint, status, latency, amount, ts)."""
    symbol = f"S{rng.randrange(symbols):06d}"
    kind = "purchase" if rng.random() < 0.1 else "view"
    return (f'{{"id":"{i:012x}{rng.getrandbits(64):016x}","symbol":"{symbol}","qty":{rng.randrange(1, 10_000)},'
            f'"buyer":"u{rng.randrange(1_000_000)}","side":"{rng.choice(("buy", "sell"))}",'
            f'"price":{rng.randrange(1, 10_000_000) / 100},"type":"{kind}","page":"/p/{rng.randrange(symbols)}",'
            f'"endpoint":"{rng.choice(ENDPOINTS)}","status":{rng.choice((200, 200, 200, 200, 201, 404, 500))},'
            f'"latency_ms":{rng.randrange(1, 200_000) / 100},"bytes":{rng.randrange(100, 100_000)},'
            f'"amount":{rng.randrange(100, 100_000) / 100},'
            f'"user":{{"id":"{symbol}","country":"{rng.choice(COUNTRIES)}","plan":"free"}},'
            f'"ts":{START_S + i // PER_SECOND}}}').encode()


def _counter(name: str, body: str) -> str:
    return f'[[counter]]\nname = "{name}"\ntopics = ["{TOPIC}"]\n{body}\n\n'


def _three(key: str = '["symbol"]', extra: str = "", sum_body: str = 'value = "qty"',
           third: str = 'kind = "distinct"\nvalue = "buyer"') -> str:
    common = f'key = {key}\nevent_id = "id"\n{extra}'
    return (_counter("trades", f'kind = "count"\n{common}') + _counter("shares", f'kind = "sum"\n{sum_body}\n{common}')
            + _counter("third", f"{third}\n{common}"))


HOURLY = 'bucket = { field = "ts", size = "1h", format = "epoch_seconds" }\n'
KINDS = {
    "count": 'kind = "count"',
    "sum": 'kind = "sum"\nvalue = "bytes"',
    "min": 'kind = "min"\nvalue = "latency_ms"\nnumber = "float"',
    "max": 'kind = "max"\nvalue = "latency_ms"\nnumber = "float"',
    "mean": 'kind = "mean"\nvalue = "latency_ms"',
    "variance": 'kind = "variance"\nvalue = "latency_ms"',
    "distinct": 'kind = "distinct"\nvalue = "buyer"',
    "quantiles": 'kind = "quantiles"\nvalue = "latency_ms"',
    "top_k": 'kind = "top_k"\nvalue = "endpoint"',
}

# The page views' counters, by name: nine counters over seven keys.
PAGE_VIEW_COUNTERS: dict[str, str] = {
    "views": f'kind = "count"\nkey = ["page"]\n{HOURLY}event_id = "id"',
    "views_by_country": f'kind = "count"\nkey = ["user.country"]\n{HOURLY}event_id = "id"',
    "revenue": 'kind = "sum"\nkey = ["user.country"]\nvalue = "amount"\nnumber = "decimal"\n'
               f'{HOURLY}where = {{ type = ["purchase"] }}\nevent_id = "id"',
    "latency": f'kind = "quantiles"\nkey = ["endpoint"]\nvalue = "latency_ms"\n{HOURLY}',
    "top_endpoints": 'kind = "top_k"\nkey = ["user.country"]\nvalue = "endpoint"',
    "visitors": 'kind = "distinct"\nkey = ["page"]\nvalue = "user.id"\n'
                'bucket = { field = "ts", size = "1d", format = "epoch_seconds" }',
    "slowest": 'kind = "max"\nkey = ["endpoint"]\nvalue = "latency_ms"\nnumber = "float"',
    "bytes": 'kind = "mean"\nkey = ["endpoint", "status"]\nvalue = "bytes"',
    "errors": f'kind = "count"\nkey = ["endpoint"]\n{HOURLY}where = {{ status = [500, 503] }}',
}


def page_views(only: Collection[str] | None = None) -> str:
    """The page views' counters, or those named in ``only``, as a definitions file."""
    unknown = set(only or ()) - PAGE_VIEW_COUNTERS.keys()
    if unknown:
        raise ValueError(f"no page-view counter {sorted(unknown)}")
    return "".join(_counter(name, body) for name, body in PAGE_VIEW_COUNTERS.items() if only is None or name in only)


PAGE_VIEWS = page_views()

SHAPES: dict[str, str] = {
    "flat (the bench's)": _three(),
    "nested key (user.id)": _three(key='["user.id"]'),
    "hourly bucket": _three(extra=HOURLY),
    "exact decimal sum": _three(sum_body='value = "price"\nnumber = "decimal"'),
    **{f"kind: count, sum, {kind}": _three(third=body) for kind, body in KINDS.items()},
    "page views (9 counters)": PAGE_VIEWS,
}
FLAT = "flat (the bench's)"
# The shapes holding flat's three counters (the same kinds, keys and event ids) read another way: a nested key, an
# hourly bucket, an exact decimal. What they cost beyond flat is what the shape costs; the kinds' shapes change a
# counter instead.
FLAT_VARIANTS = ("nested key (user.id)", "hourly bucket", "exact decimal sum")
