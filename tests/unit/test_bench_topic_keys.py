"""``python -m bench.topic_keys``: the same page views in two topics, keyed by user and by page, and the rows
each topic's consumers must write at least."""

from __future__ import annotations

import json

from bench import stream2, topic_keys


def test_the_two_topics_hold_the_same_views_keyed_by_their_field() -> None:
    by_user = topic_keys.Topic("views-by-user", "user", stream2.Truth(partitions=12))
    by_page = topic_keys.Topic("views-by-page", "page", stream2.Truth(partitions=12))
    user_made, page_made = by_user.maker(40, 3), by_page.maker(40, 3)
    for i in range(2_000):
        user_key, user_value = user_made(i)
        page_key, page_value = page_made(i)
        event = json.loads(user_value)
        assert page_value == user_value  # the same view, in both topics
        assert user_key == event["user"]["id"].encode()
        assert page_key == event["page"].encode()
    assert by_user.truth.views == by_page.truth.views
    assert by_user.truth.by_country == by_page.truth.by_country
    # keyed by page, one partition writes each page-hour: its rows are the page-hours and each partition's
    # country-hours; keyed by user, every partition writes its own row of nearly every page-hour it sees
    page_hours, country_hours = len(by_page.truth.views), len(by_page.truth.by_country)
    assert len(by_page.rows) <= page_hours + 12 * country_hours
    assert len(by_page.rows) >= page_hours
    assert len(by_user.rows) > 2 * len(by_page.rows)


def test_the_table_sets_the_page_keyed_topic_beside_the_user_keyed_one() -> None:
    figures = {"user": {"events_per_s": 30_000.0, "consumer_cpu_s_per_million": 22.0,
                        "cassandra_cpu_s_per_million": 36.0, "rows_per_event": 0.9},
               "page": {"events_per_s": 48_000.0, "consumer_cpu_s_per_million": 11.0,
                        "cassandra_cpu_s_per_million": 18.0, "rows_per_event": 0.36}}
    text = topic_keys.table(figures, {"user": 0.87, "page": 0.29})
    assert "| user | 30,000 | 22.0 | 36.0 | 0.900 | 0.870 |" in text
    assert "| page | 48,000 | 11.0 | 18.0 | 0.360 | 0.290 |" in text
    assert "1.60× events/s, 0.40× rows per event, 0.50× Cassandra CPU, 0.50× consumer CPU" in text
