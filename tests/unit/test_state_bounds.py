"""Each kind's largest stored state, from its definition alone, against states filled to that maximum; and
the refusal of definitions whose counters could write a shard row Cassandra would refuse."""

from __future__ import annotations

from decimal import Decimal

import pytest

from schemas.definitions import parse_definitions
from schemas.errors import RowTooLargeError
from schemas.events import DEFAULT_MAX_KEY_BYTES
from schemas.kinds import KINDS, KindSpec, State, new_state, state_from_bytes
from schemas.kinds._codec import MAX_DECIMAL_EXPONENT, MAX_INT_BYTES
from schemas.kinds._extremum import MaxState, MinState
from schemas.kinds._moments import MeanState, VarianceState
from schemas.kinds.count import CountState
from schemas.kinds.quantiles import kll_max_bytes
from schemas.kinds.sum import DecimalSum, FloatSum, IntegerSum
from schemas.shard_rows import DEFAULT_MAX_ROW_BYTES, cell_bound, row_groups, state_bound

# The largest integer and decimal the readers accept, and the largest fixed-point sum.
_BIG = (1 << (MAX_INT_BYTES * 8 - 1)) - 1
_BIG_DECIMAL = Decimal((1, tuple(int(d) for d in str(_BIG)), -MAX_DECIMAL_EXPONENT))
_MAX_SHIFT_FIXED = _BIG << (MAX_INT_BYTES * 8)  # the longest odd mantissa, shifted as far as the reader allows


def _bound(spec: KindSpec) -> int:
    return KINDS[spec.kind].max_stored_bytes(spec, DEFAULT_MAX_KEY_BYTES)


def _round_trips(state: State) -> bytes:
    data = state.to_bytes()
    # A state at the bound is one the reader accepts (a sketch's map may come back in another order).
    assert len(state_from_bytes(data).to_bytes()) == len(data)
    return data


@pytest.mark.parametrize(("spec", "state"), [
    (KindSpec("count"), CountState((1 << 70) - 1)),
    (KindSpec("sum", number="integer"), IntegerSum(-_BIG)),
    (KindSpec("sum", number="decimal"), DecimalSum(_BIG_DECIMAL)),
    (KindSpec("sum", number="float"), FloatSum(_MAX_SHIFT_FIXED)),
    (KindSpec("min", number="integer"), MinState("integer", -_BIG)),
    (KindSpec("max", number="decimal"), MaxState("decimal", _BIG_DECIMAL)),
    (KindSpec("min", number="float"), MinState("float", -1.5e308)),
    (KindSpec("mean", number="integer"), MeanState("integer", (1 << 70) - 1, -_BIG)),
    (KindSpec("mean", number="decimal"), MeanState("decimal", (1 << 70) - 1, _BIG_DECIMAL)),
    (KindSpec("variance", number="float"), VarianceState("float", (1 << 70) - 1, _MAX_SHIFT_FIXED,
                                                         _MAX_SHIFT_FIXED)),
    (KindSpec("variance", number="decimal"), VarianceState("decimal", (1 << 70) - 1, _BIG_DECIMAL, _BIG_DECIMAL)),
])
def test_exact_kinds_reach_their_bound_and_no_further(spec: KindSpec, state: State) -> None:
    """A state holding the longest number its reader accepts is exactly as long as the kind's bound."""
    assert len(_round_trips(state)) == _bound(spec)


@pytest.mark.parametrize("lg_k", [4, 8, 12, 16])
def test_a_full_hll_sketch_is_its_bound(lg_k: int) -> None:
    """A distinct sketch past its list and set modes, one byte per register, is exactly the bound; on the way
    there it is never larger."""
    spec = KindSpec("distinct", lg_k=lg_k)
    state, largest = new_state(spec), 0
    for i in range(8 << lg_k):
        state.apply(str(i))
        if i % max(1, (1 << lg_k) // 16) == 0:
            largest = max(largest, len(state.to_bytes()))
    largest = max(largest, len(_round_trips(state)))
    assert largest == _bound(spec)


@pytest.mark.parametrize("lg_max_map_size", [3, 6, 10])
def test_top_k_full_of_the_longest_items_is_its_bound(lg_max_map_size: int) -> None:
    """A top-k sketch tracking as many distinct items of the longest length the router accepts as its map
    holds reaches exactly the bound, and purging keeps it there or below."""
    spec = KindSpec("top_k", lg_max_map_size=lg_max_map_size, top=1000)
    state, largest, sampled = new_state(spec), 0, 0
    most_tracked = 3 * (1 << lg_max_map_size) // 4
    for i in range(6 << lg_max_map_size):
        state.apply(f"{i}-".ljust(DEFAULT_MAX_KEY_BYTES, "x"))
        tracked = int(state._sketch.num_active_items)  # type: ignore[attr-defined]
        assert tracked <= most_tracked
        if tracked == most_tracked or i % 64 == 0:  # the peaks just before each purge, and samples between
            largest = max(largest, len(_round_trips(state)))
            sampled += 1
    assert sampled > 6
    assert largest == _bound(spec)


@pytest.mark.parametrize("k", [8, 200, 4096])
def test_kll_never_outgrows_its_bound_up_to_two_to_the_62_values(k: int) -> None:
    """A quantiles sketch doubled by merging a copy into itself until it holds 2**62 values (as many levels
    as any stream makes) stays within the bound at every size; the bound is the largest serialization its
    levels could hold, and the one at the reader's 61 levels."""
    spec = KindSpec("quantiles", k=k)
    state = new_state(spec)
    for i in range(3 * k):
        state.apply(float(i % 977))
    levels_seen = 0
    while int(state._sketch.n) < 2**62:  # type: ignore[attr-defined]
        assert len(_round_trips(state)) <= _bound(spec)
        kll = bytes(state._sketch.serialize())  # type: ignore[attr-defined]
        levels = kll[18] if kll[0] == 5 else 1  # the KLL preamble's level count (one level until estimating)
        assert len(kll) <= kll_max_bytes(k, levels)
        levels_seen = max(levels_seen, levels)
        state.merge(state.copy())
    assert levels_seen >= 40


def test_every_kind_has_a_bound_and_the_library_limit_is_kept() -> None:
    """Every kind answers; the largest sketches the definitions allow are the ones that outgrow a state's
    16 MiB limit (a top-k of 65536 items of 1 KiB), not the defaults."""
    for kind in KINDS:
        assert _bound(KindSpec(kind)) > 0
    assert _bound(KindSpec("top_k", lg_max_map_size=16)) > 16 * 1024 * 1024
    assert _bound(KindSpec("distinct", lg_k=21)) < 3 * 1024 * 1024
    assert _bound(KindSpec("quantiles", k=65535)) < 2 * 1024 * 1024


def _file(*counters: str) -> str:
    return "".join(f'[[counter]]\ntopics = ["t"]\n{body}\n' for body in counters)


TOP_8192 = 'name = "top_users"\nkind = "top_k"\nkey = "symbol"\nvalue = "user"\nmax_map_size = 8192'
HLL_21 = 'name = "traders"\nkind = "distinct"\nkey = "site"\nvalue = "user"\nlg_k = 21'


def test_counters_that_can_share_a_row_too_large_are_refused_naming_them_and_the_bound() -> None:
    """A top-k of 8192 and a distinct of lg_k 21 keyed by different one-part keys of one topic can meet in one
    row of about 8.1 MiB: refused when loaded, with both names and the bound; either alone is accepted."""
    with pytest.raises(RowTooLargeError) as refused:
        parse_definitions(_file(TOP_8192, HLL_21), "c.toml")
    error = refused.value
    assert error.counters == ("top_users", "traders")
    assert error.bound > DEFAULT_MAX_ROW_BYTES
    assert "c.toml: counter 'top_users': with 'traders', sharing rows of topic 't'" in error.line
    assert str(error.bound) in error.line
    assert "COUNTERSINK_CASSANDRA__MAX_ROW_BYTES" in error.line
    parse_definitions(_file(TOP_8192), "c.toml")
    parse_definitions(_file(HLL_21), "c.toml")


def test_keys_of_different_lengths_or_topics_never_share_a_row() -> None:
    """The same two counters with two-part and one-part keys (a bucket is a part), or on two topics, cannot
    meet in a row: both are accepted; a keyless counter shares with one-part keys (both can be "")."""
    two_parts = HLL_21.replace('key = "site"', 'key = ["site", "desk"]')
    parse_definitions(_file(TOP_8192, two_parts), "c.toml")
    parse_definitions(_file(TOP_8192) + _file(HLL_21).replace('["t"]', '["u"]'), "c.toml")
    keyless = HLL_21.replace('key = "site"\n', "")
    with pytest.raises(RowTooLargeError):
        parse_definitions(_file(TOP_8192, keyless), "c.toml")
    bucketed = HLL_21.replace('key = "site"', 'key = "site"\nbucket = { field = "ts", size = "1h" }')
    groups = row_groups(parse_definitions(_file(TOP_8192, bucketed), "c.toml"))
    assert [(g.parts, [c.name for c in g.counters]) for g in groups] == [(1, ["top_users"]), (2, ["traders"])]


def test_the_limit_is_a_setting_and_a_state_past_what_a_state_may_be_is_refused_whatever_it_is() -> None:
    """Raising max_row_bytes accepts the pair; a top-k of 65536 items is refused at any limit, once."""
    parse_definitions(_file(TOP_8192, HLL_21), "c.toml", max_row_bytes=16 * 1024 * 1024)
    huge = 'name = "huge"\nkind = "top_k"\nvalue = "user"\nmax_map_size = 65536'
    with pytest.raises(RowTooLargeError) as refused:
        parse_definitions(_file(huge), "c.toml", max_row_bytes=1 << 30)
    assert refused.value.counters == ("huge",)
    assert len(refused.value.problems) == 1
    assert "more than a stored state may be" in refused.value.line


def test_the_largest_default_combination_fits() -> None:
    """Every kind at its defaults on one key of one topic makes a row far below the limit."""
    kinds = ["sum", "count", "min", "max", "mean", "variance", "distinct", "quantiles", "top_k"]
    text = _file(*(f'name = "c_{kind}"\nkind = "{kind}"\nkey = "k"' + ("" if kind == "count" else '\nvalue = "v"')
                   for kind in kinds))
    (group,) = row_groups(parse_definitions(text, "c.toml"))
    assert group.bound == 2048 + sum(cell_bound(c) for c in group.counters) < 300_000
    assert all(cell_bound(c) > state_bound(c) for c in group.counters)
