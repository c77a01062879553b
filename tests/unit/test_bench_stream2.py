"""``make bench``'s second stream: the truth its checks compare with (exact decimals, the filters' counter
updates), and its section of the report beside the trades with the ratios #32's targets name."""

from __future__ import annotations

import json
import random
import zlib
from decimal import Decimal

import pytest

from bench import shapes, stream2
from bench.pipeline import Report
from bench.report import stream2_section


def test_the_truth_follows_each_counter_its_filter_and_its_bucket() -> None:
    truth = stream2.Truth()
    events = [json.loads(shapes.event(i, random.Random(i), 50)) for i in range(3)]
    events[0].update(type="purchase", amount=0.1, status=500, ts=shapes.START_S + 3_599, latency_ms=2.5)
    events[1].update(type="purchase", amount=0.2, status=200, ts=shapes.START_S + 3_600, latency_ms=9.5)
    events[2].update(type="view", amount=7.0, status=503, ts=shapes.START_S + 3_601, latency_ms=1.0,
                     page=events[1]["page"], user={**events[1]["user"], "country": events[0]["user"]["country"]},
                     endpoint=events[1]["endpoint"])
    events[1]["user"]["country"] = events[0]["user"]["country"]
    for event in events:
        truth.add(json.dumps(event).encode())
    assert truth.events == 3
    assert truth.updates == 3 * 7 + 2 + 2  # two purchases (revenue), two errors (500, 503)
    country = events[0]["user"]["country"]
    # 0.1 and 0.2 as decimals, exactly; the 00:00 and 01:00 buckets apart
    assert truth.revenue == {f"{country}|2025-11-26T00:00Z": Decimal("0.1"),
                             f"{country}|2025-11-26T01:00Z": Decimal("0.2")}
    assert truth.views[f"{events[1]['page']}|2025-11-26T01:00Z"] == 2
    assert truth.by_country == {f"{country}|2025-11-26T00:00Z": 1, f"{country}|2025-11-26T01:00Z": 2}
    assert truth.errors[f"{events[1]['endpoint']}|2025-11-26T01:00Z"] == 1
    assert truth.slowest[events[1]["endpoint"]] == 9.5
    assert truth.hourly_counts()[f"user.country={country}|2025-11-26T01:00Z"] == 2


def test_the_rows_each_partition_writes_at_least_once_are_counted_once() -> None:
    truth = stream2.Truth(partitions=2)
    event = json.loads(shapes.event(0, random.Random(1), 50))
    truth.add(json.dumps(event).encode(), b"a")
    assert len(truth.rows) == 6  # seven instance keys, but at 00:00 a page's hour and day are one key: one row
    later = json.dumps({**event, "ts": event["ts"] + 3_600}).encode()
    truth.add(later, b"a")
    assert len(truth.rows) == 6 + 3  # its hour's page, country and endpoint rows (the day's are written already)
    truth.add(later, b"a")
    assert len(truth.rows) == 9
    other = next(key for key in (b"b", b"c", b"d", b"e") if zlib.crc32(key) % 2 != zlib.crc32(b"a") % 2)
    truth.add(later, other)
    assert len(truth.rows) == 9 + 7  # another partition's consumer writes its own rows


def test_a_variant_names_its_settings_by_section_and_a_bad_one_is_refused() -> None:
    assert stream2.variant("consumer.flush_spacing=30, cassandra.write_batch_rows=20") == (
        "consumer.flush_spacing=30, cassandra.write_batch_rows=20",
        {"consumer": {"flush_spacing": "30"}, "cassandra": {"write_batch_rows": "20"}})
    for bad in ("kafka.acks=1", "flush_spacing=30", "consumer.flush_spacing", "consumer.a-b=1"):
        with pytest.raises(ValueError, match=r"SECTION\.NAME=VALUE"):
            stream2.variant(bad)


def test_the_definitions_are_the_nine_page_view_counters_on_the_stream_topic() -> None:
    text = stream2.definitions("views-topic")
    assert text.count("[[counter]]") == stream2.COUNTERS == 9
    assert text.count('topics = ["views-topic"]') == 9
    assert shapes.TOPIC not in text


def test_the_run_like_kafka_streams_keeps_its_two_counters_alone() -> None:
    text = stream2.definitions("views-topic", only=stream2.KSTREAMS_COUNTERS)
    assert text.count("[[counter]]") == 2
    assert 'name = "views"' in text
    assert 'name = "views_by_country"' in text
    assert text.count('size = "1h"') == 2  # hourly, as HourlyCounts' windows
    with pytest.raises(ValueError, match="no page-view counter"):
        stream2.definitions(only=["view"])


def _figures(rate: float, consumer: float, per_update: float, rows: float) -> dict[str, float]:
    return {"events_per_s": rate, "consumer_cpu_s_per_million": consumer, "consumer_cpu_us_per_update": per_update,
            "cassandra_cpu_s_per_million": 20.0, "kafka_cpu_s_per_million": 3.0, "shards_per_event": 8.0,
            "rows_per_event": rows, "cassandra_cpu_us_per_row": 10.0}


def test_the_section_sets_the_second_stream_beside_the_trades_with_the_ratios() -> None:
    report = Report(events=1_000_000, cpu_s_per_million=12.0, rows_per_event=0.3, cassandra_rows_per_event=0.1,
                    server_cpu_s_per_million={"Cassandra": 8.0, "Kafka": 2.0}, rates={"countersink": 60_000.0})
    report.kstreams = {"events_per_s": 30_000.0, "jvm_cpu_s_per_million": 30.0, "kafka_cpu_s_per_million": 8.0}
    assert stream2_section(report) == []
    report.stream2 = {
        "events": 1_000_000, "pages": 20_000, "partitions": 12, "load_s": 9.0, "updates_per_event": 8.0,
        "rows_floor_per_event": 1.25, "countersink": _figures(20_000.0, 40.0, 5.0, 2.0),
        "variants": {"consumer.flush_spacing=30": _figures(21_000.0, 38.0, 4.75, 1.5)}, "checks": [],
        "variant_checks": [],
        "kstreams": {"events_per_s": 10_000.0, "committed": 1_000_000, "jvm_cpu_s_per_million": 50.0,
                     "kafka_cpu_s_per_million": 13.0, "counts_checked": 400_000},
        "kstreams_checks": []}
    text = "\n".join(stream2_section(report))
    # trades: 12 CPU s per million events over three counters = 4 µs per update; the page views' 5 is 1.25×
    assert "| trades | 3 (count, sum, distinct) | 60,000 | 12.0 | 4.00 | 8.0 | 2.0 | 0.30 | 0.10 | 80.0 |" in text
    assert "| page views: consumer CPU per counter update ÷ trades' | 1.25× | ≤ 1.3× | met |" in text
    assert "| countersink ÷ Kafka Streams EOS, events/s, trades | 2.00× | ≥ 1.5× | met |" in text
    assert "page views (9 counters against its 2) | 2.00× | ≥ 1.5× | met |" in text
    assert "(JVM + Kafka), page views | 1.00× |" in text  # (40 + 20 + 3) ÷ (50 + 13)
    assert "| page views, `consumer.flush_spacing=30` | 9 | 21,000 |" in text
    assert "`consumer.flush_spacing=30` ÷ the default: Cassandra rows per event, Cassandra CPU per event | 0.75×, " \
           "1.00× |" in text
    assert "1.25 rows per event on this stream" in text
    assert "400,000 hourly counts" in text
    assert "0 mismatched" in text
    assert "same two counters" not in text  # a report without the run (made before it) has no such line
    report.stream2["like_kstreams"] = {**_figures(25_000.0, 20.0, 10.0, 1.0), "cassandra_cpu_s_per_million": 15.0}
    report.stream2["like_kstreams_checks"] = []
    text = "\n".join(stream2_section(report))
    assert "| page views, Kafka Streams' two counters alone | 2 (views per page and per country, hourly) | 25,000 |" \
           in text
    assert "| countersink ÷ Kafka Streams EOS, events/s, page views, the same two counters | 2.50× |" in text
    assert "| whole pipeline CPU per event ÷ Kafka Streams', page views, the same two counters | 0.60× |" in text
    assert "keeping Kafka Streams' two counters alone, every views and views per country checked: 0" in text
    report.stream2["checks"] = ["views/x|h: 2 != 3"]
    report.stream2["countersink"]["consumer_cpu_us_per_update"] = 6.0
    text = "\n".join(stream2_section(report))
    assert "1 mismatched" in text
    assert "views/x|h: 2 != 3" in text
    assert "| 1.50× | ≤ 1.3× | **missed** |" in text
