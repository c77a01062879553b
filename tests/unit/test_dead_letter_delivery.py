"""A dead letter always fits the broker's limit, whatever part of the record is large, and one that was never
delivered keeps every window that skips its record from being committed."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from consumer.applying import Record
from consumer.dead_letters import DeadLetterLostError, DeadLetters, plan_republish
from countersink.settings import ConsumerSettings
from schemas.errors import NotRepublishableError, UnparseableEventError

LIMIT = 64 * 1024  # the broker's limit, in this test


class Broker:
    """A producer whose sends are refused as too large past LIMIT bytes of key, value and headers (or all, when
    ``down``); each accepted one is kept."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.kept: list[tuple[bytes | None, bytes | None, dict[str, bytes | None]]] = []

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None,
                   headers: list[tuple[str, bytes | None]] | None = None) -> asyncio.Future[None]:
        if self.down:
            raise KafkaConnectionError("no broker")
        # A header costs its two lengths too (varints: at least a byte each).
        size = len(value or b"") + len(key or b"") + sum(len(n) + len(v or b"") + 2 for n, v in headers or ())
        if size > LIMIT:
            raise MessageSizeTooLargeError(f"{size} bytes")
        self.kept.append((key, value, dict(headers or ())))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


TP = TopicPartition("events", 3)
ERROR = UnparseableEventError("", "not a UTF-8 JSON document")


@pytest.mark.parametrize(("record", "cut"), [
    (Record(7, b"x" * 200_000, None, b"k", [("trace", b"t")]), {"countersink.truncated"}),
    (Record(7, None, None, b"k" * 200_000), {"countersink.truncated.key"}),  # a tombstone with a 200 KB key
    (Record(7, b"{oops", None, b"k", [("blob", b"h" * 200_000), ("trace", b"t")]), {"countersink.truncated.headers"}),
    # Many empty headers: no bytes of names or values, yet past the limit (they were kept: the consumer stopped).
    (Record(7, b"{oops", None, b"k", [("", None)] * 100_000 + [("trace", b"t")]), {"countersink.truncated.headers"}),
])
def test_a_dead_letter_too_large_for_any_part_of_its_record_is_sent_cut_short(record: Record, cut: set[str]) -> None:
    """Only the value was cut: a record whose key or headers alone passed the limit could not be dead-lettered,
    and the consumer stopped (and, through its release, committed the window: the event lost). The key is cut
    and the record's own headers left out too, saying so; its source still names it."""
    async def run() -> Broker:
        broker = Broker()
        letters = DeadLetters(cast(AIOKafkaProducer, broker), ConsumerSettings(dead_letter_max_bytes=100_000))
        letters.queue(TP, record, ERROR)
        await letters.deliver()
        return broker

    broker = asyncio.run(run())
    [(key, value, headers)] = broker.kept
    assert {name for name in headers if name.startswith("countersink.truncated")} == cut
    assert headers["countersink.source"] == b"events/3/7"
    if "countersink.truncated.key" in cut:
        assert len(key or b"") == 1024
    if cut == {"countersink.truncated"}:  # the value alone was large: its headers go, and it can go back fixed
        assert headers["trace"] == b"t"
        assert plan_republish(list(headers.items()), value, key, b"{}").value == b"{}"
    if "countersink.truncated.headers" in cut:
        assert "blob" not in headers
        assert "trace" not in headers
        assert value == b"{oops"
        with pytest.raises(NotRepublishableError, match="key or headers were cut short"):
            plan_republish(list(headers.items()), value, key, b"{}")


def test_a_dead_letter_never_delivered_keeps_every_later_delivery_failing() -> None:
    """A flush awaits the deliveries it took and fails with the one that failed; the release after it found
    nothing left to await and committed the window that skipped the record. Every later deliver() says the
    dead letter was lost, so nothing commits that window."""
    async def run() -> None:
        letters = DeadLetters(cast(AIOKafkaProducer, Broker(down=True)), ConsumerSettings())
        letters.queue(TP, Record(7, b"{oops"), ERROR)
        taken = letters.take()  # what a flush awaits
        with pytest.raises(KafkaConnectionError):
            await asyncio.gather(*taken)
        with pytest.raises(DeadLetterLostError, match="not delivered"):
            await letters.deliver()  # the release's: nothing pending, and still not delivered
        with pytest.raises(DeadLetterLostError):
            await letters.deliver()

    asyncio.run(run())


@pytest.mark.parametrize("source", ["events/\u00b2/7", "events/\u0663/7", "events//7", "/3/7"])
def test_a_source_header_whose_partition_is_no_ascii_number_is_not_republished(source: str) -> None:
    """``countersink.source`` names the partition in ASCII digits; a header of other digits (a superscript two,
    which str.isdigit takes and int() refuses) is refused by name, not raised as a ValueError."""
    with pytest.raises(NotRepublishableError, match=r"its countersink\.source header is not TOPIC/PARTITION/OFFSET"):
        plan_republish([("countersink.source", source.encode())], b"{}", None)
    with pytest.raises(NotRepublishableError, match=r"^no countersink\.source header: not a dead letter"):
        plan_republish([], b"{}", None)


class TransactionalProducer:
    """A transactional producer's calls, with a coordinator that answers, never ends a commit, or has fenced it."""

    def __init__(self, commit: str = "answers") -> None:
        self.commit, self.calls = commit, []

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future[object]:
        self.calls.append("send")
        sent: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        sent.set_result(None)
        return sent

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        if self.commit == "fenced":
            from aiokafka.errors import ProducerFenced

            raise ProducerFenced
        if self.commit == "never":
            await asyncio.Event().wait()

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        await asyncio.Event().wait()  # a coordinator away: the abort never ends either


async def test_a_republished_copy_is_sent_in_a_transaction_that_ends_within_the_request_time() -> None:
    """Committed: nothing to say. Fenced by a run started meanwhile: said as such. A commit the coordinator
    never ends: said after the request time (aiokafka waits for it without a deadline), not held for good."""
    from countersink.dead_letters_cli import send_in_transaction

    plan = plan_republish([("countersink.source", b"t/0/5")], b'{"a": 1}', None, origin="dlq/0/7")
    for commit, expected in (("answers", None), ("fenced", "fenced")):
        producer = TransactionalProducer(commit)
        assert await send_in_transaction(cast(AIOKafkaProducer, producer), plan, 1.0) == expected
        assert producer.calls == ["begin", "send", "commit"]
    stuck = TransactionalProducer("never")
    started = asyncio.get_running_loop().time()
    failed = await asyncio.wait_for(send_in_transaction(cast(AIOKafkaProducer, stuck), plan, 0.2), 5)
    assert failed is not None
    assert "did not end within 0.2 s: it may be committed" in failed
    assert asyncio.get_running_loop().time() - started < 2
