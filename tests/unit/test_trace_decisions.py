"""The trace's reading of the router, the HTTP trace's parameters, and the registry's refusal lines."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from consumer.applying import Record
from countersink.commands.trace import COUNTED, DEAD_LETTERED, FILTERED, LATE, NOT_APPLICABLE, route_decisions
from countersink.registry import dropped_reason, group_reason
from countersink.serve import MAX_TRACE_SCAN, _trace_query
from countersink.settings import ConsumerSettings
from schemas.definitions import parse_definitions

COUNTERS = parse_definitions("""
[[counter]]
name = "bought"
topics = ["trades"]
kind = "sum"
key = "symbol"
value = "qty"
event_id = "id"
where = { side = "buy" }

[[counter]]
name = "hourly"
topics = ["trades"]
kind = "count"
key = "symbol"
bucket = { field = "ts", size = "1h", format = "epoch_seconds" }
retain = "1d"
""", "t.toml")
DECIDE = route_decisions(COUNTERS, ConsumerSettings())


def _decide(event: dict[str, object], timestamp_ms: int | None = None) -> dict[str, tuple[str, object]]:
    decisions = DECIDE("trades", Record(0, json.dumps(event).encode(), timestamp_ms), 0)
    return {name: (d.outcome, d.key if d.outcome == COUNTED else d.reason) for name, d in decisions.items()}


def test_each_counter_gets_the_routers_outcome() -> None:
    """Counted with its instance, filtered naming the filter, late past retention, not applicable when a
    counter's field is absent, and dead-lettered for the counter that refused it only (each counter decides
    for itself); an event refused as a whole is dead-lettered for every counter."""
    ts = 1_795_000_000
    assert _decide({"id": "a", "symbol": "IBM", "side": "buy", "qty": 5, "ts": ts}, ts * 1000) == {
        "bought": (COUNTED, "IBM"), "hourly": (COUNTED, "IBM|2026-11-18T11:00Z")}
    assert _decide({"id": "b", "symbol": "IBM", "side": "sell", "qty": 5, "ts": ts}, ts * 1000)["bought"] == (
        FILTERED, "where side in ['buy']")
    late = _decide({"id": "c", "symbol": "IBM", "side": "sell", "ts": ts}, (ts + 3 * 86400) * 1000)
    assert late["hourly"][0] == LATE
    dead = _decide({"id": "d", "symbol": "IBM", "side": "buy", "qty": "five", "ts": ts}, ts * 1000)
    assert dead["bought"] == (DEAD_LETTERED, 'WrongTypeError at qty: expected an integer, got string "five"')
    assert dead["hourly"] == (COUNTED, "IBM|2026-11-18T11:00Z")
    skipped = _decide({"id": "e", "side": "buy", "qty": 5, "ts": ts}, ts * 1000)
    assert skipped == {"bought": (NOT_APPLICABLE, "key_missing"), "hourly": (NOT_APPLICABLE, "key_missing")}
    whole = DECIDE("trades", Record(0, b"not json", ts * 1000), 0)
    assert {name: d.outcome for name, d in whole.items()} == {"bought": DEAD_LETTERED, "hourly": DEAD_LETTERED}
    # A dead letter sent back for "hourly" alone: "bought" filters it out for that header, not for its where
    # (the reason said "where side in ['buy']" of a record whose side is buy).
    event = {"id": "f", "symbol": "IBM", "side": "buy", "qty": 5, "ts": ts}
    back = DECIDE("trades", Record(0, json.dumps(event).encode(), ts * 1000, None,
                                   (("countersink.apply-to", b"hourly"),)), 0)
    assert (back["bought"].outcome, back["hourly"].outcome) == (FILTERED, COUNTED)
    assert back["bought"].reason is not None
    assert back["bought"].reason.startswith("countersink.apply-to names hourly, not this one")


@pytest.mark.parametrize(("query", "ok"), [
    ("offset=2:15", True), ("event_id=t1&key=IBM&scan=50", True), ("", False), ("offset=2:1&event_id=t1", False),
    ("offset=x", False), ("offset=1:2&scan=3", False), (f"event_id=t1&scan={MAX_TRACE_SCAN + 1}", False),
    ("event_id=t1&scan=0", False), ("event_id=" + "x" * 1025, False),
])
def test_http_trace_parameters_are_bounded(query: str, ok: bool) -> None:
    """Exactly one of offset and event_id; key and scan only with event_id; every size bounded."""
    request = make_mocked_request("GET", f"/trace/trades?{query}", match_info={"topic": "trades"})
    if ok:
        assert _trace_query(request).topic == "trades"
    else:
        with pytest.raises(web.HTTPBadRequest):
            _trace_query(request)


def test_refusal_lines_say_why_and_what_to_do() -> None:
    """A second group's refusal names the recorded group and both ways out; a drop's names the release."""
    line = group_reason("ks", "new", {"old": ["a", "b"]})
    assert "keyspace 'ks' counts 'a', 'b' by consumer group 'old'" in line
    assert "--group old" in line
    assert "COUNTERSINK_CASSANDRA__KEYSPACE" in line
    dropped = dropped_reason("ks", "a", {"dropped_us": 1_795_000_000_000_000, "dropped_by": "host:1"})
    assert "dropped from keyspace 'ks' at 2026-11-18T11:06:40Z by host:1" in dropped
    assert "countersink drop a --yes --forget" in dropped


def test_the_retry_window_of_a_trace_reads_past_a_resets_control_record() -> None:
    """A reset's control record among the records before the traced one: trace's window raised "reset ... was
    not looked up before its control record applied" (exit 1 for every record after any reset of the topic);
    it takes its place as a record without ids, and a retry after it is still one."""
    import asyncio

    from countersink.commands.trace import _retry_window
    from schemas.resets import Reset, control_record, new_reset_id
    from tests.unit.memory_store import MemoryLog

    reset = Reset(new_reset_id("bought", 1), "bought", 1, frozenset({"IBM"}))
    value, headers = control_record(reset)
    first = json.dumps({"id": "e1", "symbol": "IBM", "side": "buy", "qty": 1}).encode()
    log = MemoryLog([first, value, first, json.dumps({"id": "e2", "symbol": "IBM", "side": "buy", "qty": 1}).encode()],
                    headers=[(), headers, (), ()])
    for record, fresh in ((log.records[2], set()), (log.records[3], {"bought"})):
        counted, last_seen = asyncio.run(_retry_window(log, COUNTERS, ConsumerSettings(), DECIDE, "trades", 0, record,
                                                       {}))
        assert counted == fresh
        assert last_seen[("bought", "e1")] == (0 if record.offset == 2 else 2)
