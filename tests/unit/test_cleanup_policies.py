"""Which topics the consumer refuses for counters that drop publisher retries by event id: the compacted ones."""

from __future__ import annotations

import pytest

from consumer.cleanup_policies import check_policies, compacted, deduplicating
from schemas.definitions import parse_definitions
from schemas.errors import CompactedTopicError

COUNTERS = parse_definitions("""
[[counter]]
name = "trades"
topics = ["orders", "fills"]
kind = "count"
event_id = "id"

[[counter]]
name = "volume"
topics = ["orders"]
kind = "sum"
value = "qty"
event_id = "id"

[[counter]]
name = "prices"
topics = ["quotes"]
kind = "max"
value = "price"
""")


@pytest.mark.parametrize(("policy", "compacts"), [("delete", False), ("compact", True), ("compact,delete", True),
                                                  ("delete, compact", True), ("Compact", True), ("", False)])
def test_a_policy_compacts_when_it_names_compact(policy: str, compacts: bool) -> None:
    """cleanup.policy is a list: compact alone or with delete lets the cleaner compact."""
    assert compacted(policy) is compacts


def test_only_compacted_topics_of_counters_with_an_event_id_are_refused_naming_them() -> None:
    """orders is compacted and two counters deduplicate on it: both are named; quotes is compacted too but
    its counter has no event id; fills keeps delete. The line says what to do."""
    assert deduplicating(COUNTERS, 10_000) == {"fills": ("trades",), "orders": ("trades", "volume")}
    with pytest.raises(CompactedTopicError) as refused:
        check_policies(COUNTERS, 10_000, {"orders": "compact,delete", "fills": "delete", "quotes": "compact"})
    assert refused.value.topics == {"orders": ("trades", "volume")}
    (line,) = refused.value.lines
    assert line.startswith("topic 'orders' has cleanup.policy=compact,delete, and counters 'trades', 'volume' drop")
    assert "Set the topic's cleanup.policy to delete" in line
    check_policies(COUNTERS, 10_000, {"orders": "delete", "fills": "delete", "quotes": "compact"})


def test_a_window_of_no_records_deduplicates_nothing_so_nothing_is_refused() -> None:
    """With retry_window_records = 0 no retry is dropped, so compaction cannot make one count twice."""
    assert deduplicating(COUNTERS, 0) == {}
    check_policies(COUNTERS, 0, {"orders": "compact"})
