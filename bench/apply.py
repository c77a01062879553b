"""Apply throughput per kind (decode + route + apply), stored bytes per state, and the hot-path choice.

    python -m bench.apply [--events N] [--seed S]

Every kind is measured in the same run on the same events, so the ratios compare like with like. The
last table compares pydantic validation per event with the router's precompiled extractors.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from schemas.definitions import CounterSet, parse_definitions
from schemas.events import EventRouter, Update, apply_updates
from schemas.kinds import State

COUNTERS: list[tuple[str, str]] = [
    ("count", 'kind = "count"'),
    ("sum_integer", 'kind = "sum"\nvalue = "qty"'),
    ("sum_decimal", 'kind = "sum"\nnumber = "decimal"\nvalue = "price"'),
    ("sum_float", 'kind = "sum"\nnumber = "float"\nvalue = "price"'),
    ("min_float", 'kind = "min"\nnumber = "float"\nvalue = "price"'),
    ("max_integer", 'kind = "max"\nvalue = "qty"'),
    ("mean_float", 'kind = "mean"\nvalue = "price"'),
    ("variance_float", 'kind = "variance"\nvalue = "price"'),
    ("distinct", 'kind = "distinct"\nvalue = "user"'),
    ("quantiles", 'kind = "quantiles"\nvalue = "price"'),
    ("top_k", 'kind = "top_k"\nvalue = "page"'),
]


def definitions() -> CounterSet:
    text = "".join(
        f'[[counter]]\nname = "{name}"\ntopics = ["t_{name}"]\nkey = "symbol"\n{body}\n\n'
        for name, body in COUNTERS
    )
    return parse_definitions(text, "bench")


def events(n: int, keys: int, rng: random.Random) -> list[bytes]:
    out = []
    for i in range(n):
        event = {
            "trade_id": f"t-{i}",
            "symbol": f"S{rng.randrange(keys)}",
            "side": rng.choice(("buy", "sell")),
            "qty": rng.randrange(1, 10_000),
            "price": round(rng.lognormvariate(4, 1), 2),
            "user": f"u{rng.randrange(50_000)}",
            "page": f"/p/{int(rng.paretovariate(1.2))}",
            "ts": 1_795_000_000 + i,
        }
        out.append(json.dumps(event).encode())
    return out


def best_of(repeats: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def throughput(cs: CounterSet, raws: list[bytes], repeats: int) -> dict[str, float]:
    router = EventRouter(cs)
    rates = {}
    for name, _ in COUNTERS:
        topic = f"t_{name}"

        def run(topic: str = topic) -> None:
            states: dict[tuple[str, str], State] = {}
            route = router.route
            for raw in raws:
                apply_updates(states, route(topic, raw), cs)

        rates[name] = len(raws) / best_of(repeats, run)
    return rates


def stored_bytes(cs: CounterSet, n: int, cardinalities: list[int], seed: int) -> dict[str, list[float]]:
    router = EventRouter(cs)
    table: dict[str, list[float]] = {name: [] for name, _ in COUNTERS}
    for keys in cardinalities:
        raws = events(n, keys, random.Random(seed))
        for name, _ in COUNTERS:
            states: dict[tuple[str, str], State] = {}
            for raw in raws:
                apply_updates(states, router.route(f"t_{name}", raw), cs)
            table[name].append(sum(len(s.to_bytes()) for s in states.values()) / len(states))
    return table


class TradeEvent(BaseModel):
    """What a pydantic-per-event router would validate for the ``shares`` counter."""

    model_config = ConfigDict(strict=True, frozen=True)

    symbol: str
    side: str
    qty: int
    trade_id: str


class PriceEvent(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)

    symbol: str
    price: float


class UserEvent(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)

    symbol: str
    user: str


class PageEvent(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)

    symbol: str
    page: str


_TOPIC_COUNTERS = """
[[counter]]
name = "shares"
topics = ["trades"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "trade_id"
where = { side = "buy" }
"""
_MORE_COUNTERS = """
[[counter]]
name = "price_max"
topics = ["trades"]
kind = "max"
number = "float"
key = "symbol"
value = "price"

[[counter]]
name = "buyers"
topics = ["trades"]
kind = "distinct"
key = "symbol"
value = "user"

[[counter]]
name = "pages"
topics = ["trades"]
kind = "top_k"
key = "symbol"
value = "page"
"""


def pydantic_vs_extractors(raws: list[bytes], repeats: int, counters: int) -> tuple[float, float]:
    """Events/s through the router vs one pydantic model per counter (1 or 4 counters on the topic)."""
    cs = parse_definitions(_TOPIC_COUNTERS + (_MORE_COUNTERS if counters > 1 else ""))
    router = EventRouter(cs)

    def with_router() -> None:
        route = router.route
        for raw in raws:
            route("trades", raw)

    models = [
        (TradeEvent, lambda e: Update("shares", e.symbol, e.qty, e.trade_id) if e.side == "buy" else None),
        (PriceEvent, lambda e: Update("price_max", e.symbol, e.price, None)),
        (UserEvent, lambda e: Update("buyers", e.symbol, e.user, None)),
        (PageEvent, lambda e: Update("pages", e.symbol, e.page, None)),
    ][:counters]

    def with_pydantic() -> None:
        for raw in raws:
            updates = []
            for model, build in models:
                u = build(model.model_validate_json(raw))
                if u is not None:
                    updates.append(u)

    return len(raws) / best_of(repeats, with_router), len(raws) / best_of(repeats, with_pydantic)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=20_000, help="events per kind and per measurement")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timed runs")
    args = parser.parse_args(argv)
    cs = definitions()
    raws = events(args.events, 100, random.Random(args.seed))

    print(f"apply throughput: {args.events} events per kind, 100 keys, best of {args.repeats}")
    rates = throughput(cs, raws, args.repeats)
    fastest = max(rates.values())
    print(f"{'kind':<16}{'events/s':>12}{'vs fastest':>12}")
    for name, rate in sorted(rates.items(), key=lambda kv: -kv[1]):
        print(f"{name:<16}{rate:>12,.0f}{rate / fastest:>12.2f}")

    cardinalities = [1, 100, 1000]
    print(f"\nstored bytes per state after {args.events} events, by number of keys")
    table = stored_bytes(cs, args.events, cardinalities, args.seed)
    print(f"{'kind':<16}" + "".join(f"{f'{k} keys':>12}" for k in cardinalities))
    for name, sizes in table.items():
        print(f"{name:<16}" + "".join(f"{s:>12,.0f}" for s in sizes))

    print("\nroute one topic: precompiled extractors vs a pydantic model per counter (events/s)")
    print(f"{'counters on topic':<20}{'extractors':>12}{'pydantic':>12}{'ratio':>8}")
    for counters in (1, 4):
        ours, theirs = pydantic_vs_extractors(raws, args.repeats, counters)
        print(f"{counters:<20}{ours:>12,.0f}{theirs:>12,.0f}{ours / theirs:>8.2f}")


if __name__ == "__main__":
    main()
