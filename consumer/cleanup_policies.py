"""Which topics a consumer refuses to count because their log cleaner could defeat the publisher-retry window.

A mutator drops an event whose id it saw in the last ``retry_window_records`` records of its partition, and an
owner taking a partition over rebuilds that window by reading the log back (``consumer.applying``). On a topic
whose ``cleanup.policy`` includes ``compact``, the cleaner may remove an original because a later record with
the same message key (its retry) superseded it: the new owner would see the retry alone and count it again.
So such a topic is refused for counters that deduplicate by event id, at start and on each assignment.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.definitions import CounterSet
from schemas.errors import CompactedTopicError


def deduplicating(counters: CounterSet, window_records: int) -> dict[str, tuple[str, ...]]:
    """The counters that drop retries by event id, by topic (none when the window is off)."""
    if window_records <= 0:
        return {}
    found = {topic: tuple(c.name for c in counters.for_topic(topic) if c.event_id is not None)
             for topic in counters.topics}
    return {topic: names for topic, names in found.items() if names}


def compacted(policy: str) -> bool:
    """Whether a ``cleanup.policy`` value (``delete``, ``compact``, ``compact,delete``) lets the cleaner compact."""
    return "compact" in {part.strip().lower() for part in policy.split(",")}


def check_policies(counters: CounterSet, window_records: int, policies: Mapping[str, str]) -> None:
    """Raise :class:`CompactedTopicError` naming every topic of ``policies`` (topic -> cleanup.policy) that is
    compacted and counted by a counter that deduplicates by event id."""
    refused = {topic: names for topic, names in deduplicating(counters, window_records).items()
               if compacted(policies.get(topic, "delete"))}
    if refused:
        raise CompactedTopicError(refused, {topic: policies[topic] for topic in refused})
