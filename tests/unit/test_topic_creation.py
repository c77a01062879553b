"""``ensure_topics`` returns once the broker answering metadata lists the topics it created: a reset made right
after finds their partitions."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from countersink import kafka
from countersink.settings import KafkaSettings


class LaggingAdmin:
    """An admin client whose broker lists a created topic only from its ``lag``-th listing after the creation,
    as a broker that learns of it from the controller a moment late does."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.created: list[str] = []
        self.listings_after_creation = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def list_topics(self) -> list[str]:
        if not self.created:
            return []
        self.listings_after_creation += 1
        return list(self.created) if self.listings_after_creation >= self.lag else []

    async def create_topics(self, topics: list[Any]) -> Any:
        self.created.extend(topic.name for topic in topics)
        return type("Response", (), {"topic_errors": [(t.name, 0, None) for t in topics]})()


@pytest.mark.parametrize("lag", [1, 4])
async def test_a_created_topic_is_listed_before_ensure_topics_returns(monkeypatch: pytest.MonkeyPatch, lag: int
                                                                      ) -> None:
    admin = LaggingAdmin(lag)
    monkeypatch.setattr(kafka, "make_admin", lambda settings: admin)
    await kafka.ensure_topics(KafkaSettings(bootstrap_servers=["127.0.0.1:1"]), {"events": 3})
    assert admin.created == ["events"]
    assert admin.listings_after_creation == lag  # asked until listed, not once more


async def test_a_topic_never_listed_is_waited_for_no_longer_than_the_request_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = LaggingAdmin(10**9)
    monkeypatch.setattr(kafka, "make_admin", lambda settings: admin)
    await kafka.ensure_topics(KafkaSettings(bootstrap_servers=["127.0.0.1:1"], request_timeout_ms=1_000), {"events": 3})
    assert 3 <= admin.listings_after_creation < 20  # backing off, up to half a second a time


class FlakyListingAdmin(LaggingAdmin):
    """Lists its topics at once, but its first listings after the creation fail as a broker away does."""

    def __init__(self, failures: int) -> None:
        super().__init__(lag=1)
        self.failures = failures

    async def list_topics(self) -> list[str]:
        if self.created and self.failures:
            self.failures -= 1
            raise KafkaConnectionError("broker away")
        return await super().list_topics()


@pytest.mark.parametrize("failures", [2, 10**9])
async def test_a_listing_that_fails_after_the_creation_is_retried_and_never_refuses_the_start(
        monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    """The topics are created: a listing failing as a broker away does is tried again, and if it never answers,
    ensure_topics returns all the same, after the request timeout (what misses is the caller's to say)."""
    admin = FlakyListingAdmin(failures)
    monkeypatch.setattr(kafka, "make_admin", lambda settings: admin)
    await kafka.ensure_topics(KafkaSettings(bootstrap_servers=["127.0.0.1:1"], request_timeout_ms=1_000), {"events": 3})
    assert admin.created == ["events"]
    assert admin.listings_after_creation == (1 if failures == 2 else 0)


async def test_a_listing_refused_for_good_after_the_creation_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = LaggingAdmin(1)

    async def refused() -> list[str]:
        if admin.created:
            raise TopicAuthorizationFailedError
        return []

    monkeypatch.setattr(admin, "list_topics", refused)
    monkeypatch.setattr(kafka, "make_admin", lambda settings: admin)
    with pytest.raises(TopicAuthorizationFailedError):
        await kafka.ensure_topics(KafkaSettings(bootstrap_servers=["127.0.0.1:1"]), {"events": 3})
