"""Compare what countersink reads with the truth: exact kinds exactly, sketches within their stated bounds."""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass

from countersink.reader import CounterReader
from demo.sample import ENDPOINTS, HOUR, SERIES_HOURS, Truth
from schemas.timeseries import BUCKET_FORMAT


@dataclass(frozen=True)
class Row:
    counter: str
    kind: str
    key: str
    value_text: str
    truth_text: str
    ok: bool
    instance: str | None = None  # the instance key read, when it is not ``key`` (top-k reads one instance)
    buckets: tuple[str, ...] = ()  # the instance keys a roll-up merges

    @property
    def instance_key(self) -> str:
        return self.key if self.instance is None else self.instance


async def compare(reader: CounterReader, truth: Truth) -> list[Row]:
    rows: list[Row] = []
    symbols = sorted(truth.qty, key=lambda s: -len(truth.qty[s]))[:3]
    for symbol in symbols:
        qty, prices = truth.qty[symbol], truth.prices[symbol]
        exact = [
            ("shares_traded", "sum", sum(qty)),
            ("trades", "count", len(qty)),
            ("low_price", "min", min(prices)),
            ("high_price", "max", max(prices)),
        ]
        for counter, kind, expected in exact:
            got = await reader.get(counter, symbol)
            rows.append(Row(counter, kind, symbol, str(got), str(expected), got == expected))
        mean = await reader.get("mean_qty", symbol)
        rows.append(Row("mean_qty", "mean", symbol, f"{mean!r}", f"{truth.mean(symbol)!r}",
                        isinstance(mean, float) and math.isclose(mean, truth.mean(symbol), rel_tol=1e-12)))
        spread = await reader.get("qty_spread", symbol)
        stddev = getattr(spread, "stddev", None)
        rows.append(Row("qty_spread", "stddev", symbol, f"{stddev!r}", f"{truth.stddev(symbol)!r}",
                        isinstance(stddev, float) and math.isclose(stddev, truth.stddev(symbol), rel_tol=1e-9)))
        buyers = await reader.get("buyers", symbol)
        true_buyers = len(truth.buyers[symbol])
        low, high = getattr(buyers, "lower_bound", math.nan), getattr(buyers, "upper_bound", math.nan)
        estimate = getattr(buyers, "estimate", math.nan)
        rows.append(Row("buyers", "distinct", symbol, f"{estimate:.1f} [{low:.0f}..{high:.0f}]",
                        str(true_buyers), low <= true_buyers <= high))
    for endpoint in ENDPOINTS:
        latency = await reader.get("latency_ms", endpoint)
        values = sorted(truth.latency[endpoint])
        p99 = dict(getattr(latency, "quantiles", ())).get(0.99, math.nan)
        eps = getattr(latency, "normalized_rank_error", 0.0)
        # KLL's guarantee is on ranks: the estimate's true rank is within ±eps of 0.99.
        rank = bisect.bisect_right(values, p99) / len(values)
        exact_p99 = values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]
        rows.append(Row("latency_ms", "p99", endpoint, f"{p99:.3f} (rank {rank:.4f})",
                        f"{exact_p99:.3f} (±{eps:.4f} rank)", abs(rank - 0.99) <= eps))
    top = await reader.get("top_posts", "")
    items = getattr(top, "items", ())
    true_top = truth.likes.most_common(3)
    for post, count in true_top:
        found = next((i for i in items if i.item == post), None)
        text = f"{found.estimate} [{found.lower_bound}..{found.upper_bound}]" if found else "(not reported)"
        rows.append(Row("top_posts", "top-k", post, text, str(count),
                        found is not None and found.lower_bound <= count <= found.upper_bound, instance=""))
    for post, count in true_top[:2]:
        got = await reader.get("likes", post)
        rows.append(Row("likes", "count", post, str(got), str(count), got == count))
    rows.extend(await compare_series(reader, truth, symbols[0]))
    for counter, kind, held in (("views_by_page", "count, avro", truth.views),
                                ("revenue_by_sku", "sum, protobuf", truth.revenue),
                                ("clicks_by_button", "count, json-s", truth.clicks)):
        for key, expected in sorted(held.items())[:2]:
            got = await reader.get(counter, key)
            rows.append(Row(counter, kind, key, str(got), str(expected), got == expected))
    return rows


async def compare_series(reader: CounterReader, truth: Truth, symbol: str) -> list[Row]:
    """Hourly buckets read as a range: merged per day and over the two days, beside the truth."""
    rows: list[Row] = []
    start, end = truth.series_start, truth.series_start + SERIES_HOURS * HOUR
    days = await reader.rollup("trades_per_hour", symbol, start, end, "1d")
    for day in days:
        first, last = int(day.start.timestamp()), int(day.end.timestamp())
        expected = sum(n for (s, hour), n in truth.hourly.items() if s == symbol and first <= hour < last)
        rows.append(Row("trades_per_hour", "count, 1d", f"{symbol} {day.start:%m-%d %H:%M}", str(day.value),
                        str(expected), day.value == expected, buckets=_bucket_keys(symbol, first, last)))
    buyers = await reader.rollup("buyers_per_hour", symbol, start, end)
    true_buyers = len(set().union(*(b for (s, _), b in truth.hourly_buyers.items() if s == symbol)))
    low, high = getattr(buyers.value, "lower_bound", math.nan), getattr(buyers.value, "upper_bound", math.nan)
    rows.append(Row("buyers_per_hour", "distinct, 48h", symbol,
                    f"{getattr(buyers.value, 'estimate', math.nan):.1f} [{low:.0f}..{high:.0f}]",
                    str(true_buyers), low <= true_buyers <= high, buckets=_bucket_keys(symbol, start, end)))
    return rows


def _bucket_keys(symbol: str, start: int, end: int) -> tuple[str, ...]:
    return tuple(f"{symbol}|{time.strftime(BUCKET_FORMAT, time.gmtime(hour))}" for hour in range(start, end, HOUR))
