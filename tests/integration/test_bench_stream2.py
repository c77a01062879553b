"""``make bench``'s second stream on the real servers, small: page views counted by a countersink consumer and by
Kafka Streams' HourlyCounts, each system's values compared with the truth computed while publishing, and the
comparison shown to fail on a value that differs."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from bench import kstreams, pipeline, stream2
from countersink.cassandra import CassandraClient
from countersink.kafka import ensure_topics
from countersink.reader import read_state
from countersink.settings import CassandraSettings, KafkaSettings
from schemas.kinds.distinct import DistinctEstimate
from tests.integration.test_first_hour import delete_topics

EVENTS = 6_000
PAGES = 300
PARTITIONS = 3


async def test_page_views_counted_by_countersink_and_kafka_streams_equal_the_truth(
        kafka_settings: KafkaSettings, cassandra_settings: CassandraSettings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's step as it runs it (a countersink run of the nine counters, one of the two Kafka Streams keeps,
    then HourlyCounts over page and country), on a topic of its own; then the same checks against a truth with
    one value changed in each counter checked."""
    monkeypatch.setattr(pipeline, "STACK", tmp_path)  # the consumer's definitions and log
    topic = f"bench-pageviews-{uuid.uuid4().hex[:10]}"
    group = "bench-countersink-pageviews-test"
    await ensure_topics(kafka_settings, {topic: PARTITIONS})
    try:
        truth = stream2.Truth(partitions=PARTITIONS)
        await pipeline.load(kafka_settings, topic, PARTITIONS, EVENTS, stream2.maker(PAGES, 3, truth), "views")
        run = await pipeline.countersink_rate(kafka_settings, cassandra_settings, PARTITIONS, EVENTS, group, {},
                                              topic=topic, counters_text=stream2.definitions(topic))
        prefix = stream2.renamed(group)
        problems = await stream2.check_values(cassandra_settings, truth, prefix)
        async with CassandraClient(cassandra_settings) as client:  # the daily bucket's key, as the floor names it
            page = sorted(truth.views)[0].split("|")[0]
            visitors = await read_state(client, f"{prefix}visitors", f"{page}|2025-11-26T00:00Z")
        # the two counters Kafka Streams keeps, counted alone (the bench's like-for-like run)
        like_group = "bench-countersink-pageviews-like-test"
        like_run = await pipeline.countersink_rate(
            kafka_settings, cassandra_settings, PARTITIONS, EVENTS, like_group, {}, topic=topic,
            counters_text=stream2.definitions(topic, only=stream2.KSTREAMS_COUNTERS))
        like_prefix = stream2.renamed(like_group)
        like_problems = await stream2.check_values(cassandra_settings, truth, like_prefix,
                                                   counters=stream2.KSTREAMS_COUNTERS)
        classpath = kstreams.build()
        ks_run = await stream2.kstreams_run(kafka_settings, PARTITIONS, EVENTS, 180, {}, tmp_path, classpath,
                                            commit_ms=200, topic=topic)
        ks, ks_problems = stream2.kstreams_figures(ks_run, truth, commit_ms=200)

        # every checked counter, one value off: each is reported, and nothing else
        views_key = sorted(truth.views)[0]
        country_key, revenue_key = sorted(truth.by_country)[-1], sorted(truth.revenue)[0]
        error_key, slow_key = sorted(truth.errors)[0], sorted(truth.slowest)[0]
        truth.views[views_key] += 1
        truth.by_country[country_key] -= 1
        truth.revenue[revenue_key] += Decimal("0.01")
        truth.errors[error_key] += 1
        truth.slowest[slow_key] += 0.01
        off = await stream2.check_values(cassandra_settings, truth, prefix)
        like_off = await stream2.check_values(cassandra_settings, truth, like_prefix,
                                              counters=stream2.KSTREAMS_COUNTERS)
    finally:
        await delete_topics(kafka_settings, topic)
    assert problems == []
    assert like_problems == []
    assert 0 < like_run.cassandra_rows < run.cassandra_rows  # two counters over two keys: fewer rows than nine
    assert truth.events == EVENTS
    assert 7 < truth.updates / EVENTS < 9  # nine counters, two of them under a filter
    assert len(truth.views) == PAGES  # one hour (72,000 events an hour): every page in it
    assert truth.revenue
    assert truth.errors
    assert 0 < run.cassandra_rows < run.rows  # shards written; counters sharing a key share its row
    # every (partition, row key) written at least once: the floor is below what was written, and not far
    assert len(truth.rows) <= run.cassandra_rows < 3 * len(truth.rows)
    assert visitors is not None
    estimate = visitors.value()
    assert isinstance(estimate, DistinctEstimate)
    assert estimate.estimate >= 1
    assert [p.split(": ")[0] for p in off] == [f"views/{views_key}", f"views_by_country/{country_key}",
                                               f"revenue/{revenue_key}", f"errors/{error_key}",
                                               f"slowest/{slow_key}"]
    assert [p.split(": ")[0] for p in like_off] == [f"views/{views_key}", f"views_by_country/{country_key}"]
    assert ks_run.committed == EVENTS, (tmp_path / "kstreams.log").read_text()[-3000:]
    assert ks["counts_checked"] == len(truth.views) + len(truth.by_country)
    assert ks_problems == []
    ks_off = stream2.kstreams_figures(ks_run, truth)[1]
    assert [p.split(": ")[0] for p in ks_off] == [f"page={views_key}", f"user.country={country_key}"]
