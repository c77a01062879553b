"""The publisher-retry window: an update is dropped exactly when its (counter, event id) was carried by one of
the ``size`` records before it, checked against a plain list of every record seen."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.applying import RetryWindow
from schemas.events import Update

COUNTERS = ("trades", "shares")

# One record: for each counter, no update, an update without an event id, or one with an id from a small
# alphabet (so that repeats are common), or None for an invalid record (no updates, still a record).
records = st.lists(
    st.one_of(
        st.none(),
        st.lists(st.tuples(st.sampled_from(COUNTERS), st.one_of(st.none(), st.sampled_from("abcdefg"))),
                 max_size=2, unique_by=lambda u: u[0]),
    ),
    max_size=120,
)


def expected_fresh(history: list[list[tuple[str, str | None]]], record: list[tuple[str, str | None]],
                   size: int) -> list[tuple[str, str | None]]:
    recent = {(c, i) for r in (history[-size:] if size > 0 else []) for c, i in r if i is not None}
    return [(c, i) for c, i in record if i is None or (c, i) not in recent]


@settings(max_examples=300, deadline=None)
@given(records=records, size=st.integers(min_value=0, max_value=12))
def test_admit_drops_exactly_the_repeats_within_the_window(records: list, size: int) -> None:
    """admit() keeps an update unless its id was seen in the last ``size`` records, through every pruning."""
    window = RetryWindow(size)
    history: list[list[tuple[str, str | None]]] = []
    for record in records:
        if record is None:  # an invalid record: it takes a place in the window and carries no id
            window.push(())
            history.append([])
            continue
        updates = [Update(c, "k", 1, i) for c, i in record]
        fresh = window.admit(updates)
        assert [(u.counter, u.event_id) for u in fresh] == expected_fresh(history, record, size)
        history.append(record)
    for counter in COUNTERS:
        for event_id in "abcdefg":
            recent = {(c, i) for r in (history[-size:] if size > 0 else []) for c, i in r}
            assert window.seen(counter, event_id) == ((counter, event_id) in recent)


def test_memory_holds_at_most_two_windows_of_ids() -> None:
    """Ids older than the window are forgotten: a long run of unique ids keeps at most 2 × size of them."""
    window = RetryWindow(100)
    for n in range(10_000):
        window.admit([Update("trades", "k", 1, f"id{n}")])
        assert window.ids_held() <= 200


# Records as counters that share an id field under one filter see them: either every counter of the group has
# an update with the record's id, or none has (filtered out, or an invalid record: None).
grouped_records = st.lists(st.one_of(st.none(), st.tuples(st.booleans(), st.sampled_from("abcdef"),
                                                          st.sampled_from("abcdef"))), max_size=150)


@settings(max_examples=300, deadline=None)
@given(records=grouped_records, size=st.integers(min_value=0, max_value=12))
def test_a_shared_dict_decides_as_one_dict_per_counter(records: list, size: int) -> None:
    """Counters sharing one dict of ids (same id field, same filter) are told exactly what a dict each would
    tell them, through generation changes, with another counter beside them on its own."""
    shared, separate = RetryWindow(size), RetryWindow(size)
    shared.share({"trades": "id|[]", "shares": "id|[]", "buyers": "buyer_id|[]"})
    for record in records:
        if record is None:
            shared.push(())
            separate.push(())
            continue
        in_group, event_id, other_id = record
        updates = [Update("buyers", "k", 1, other_id)]
        if in_group:
            updates = [Update("trades", "k", 1, event_id), Update("shares", "k", 1, event_id), *updates]
        assert shared.admit(updates) == separate.admit(updates)
    for event_id in "abcdef":
        for counter in ("trades", "shares", "buyers"):
            assert shared.seen(counter, event_id) == separate.seen(counter, event_id)


def test_the_ids_held_are_estimated_at_their_own_lengths_counter_by_counter() -> None:
    """Two counters whose publishers make ids of 36 and 990 bytes: each dict's ids are charged at its own
    strings' size (one size for every id, taken from one dict, was a quarter of what they held, or 1.7 times)."""
    import sys

    from consumer.applying import RETRY_ID_BYTES

    window = RetryWindow(1_000)
    for i in range(1_500):  # a generation and a half: both generations hold ids
        window.push((("short", f"{i:036d}"), ("long", f"{i:0990d}")))
    held = [ids for generation in (window._current, window._previous) for ids in generation.values()]
    exact = sum(len(ids) * RETRY_ID_BYTES + sum(map(sys.getsizeof, ids)) for ids in held)
    assert 0.99 <= window.bytes_held() / exact <= 1.01, (window.bytes_held(), exact)
