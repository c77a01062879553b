"""The CRDT laws, checked for every kind by one parametrized hypothesis suite.

Exact kinds (count, sum, min, max, mean, variance in every number mode) must satisfy every law bit for
bit: equal ``to_bytes()`` and equal ``value()``.

Idempotence: min, max and distinct are semilattices, so ``a ⊔ a = a``. count, sum, mean, variance,
quantiles and top_k merge disjoint replicas by addition (one shard per mutator; the storage layout, not
merge, makes re-writing a shard harmless), so for them ``a ⊔ a`` must equal the state of every value
applied twice, which is what the idempotence test checks instead.

Sketch kinds are held to what their library guarantees:

* ``distinct`` (HLL): union is idempotent, commutative and associative, so merged states agree on the
  estimate exactly; a sketch filled in order uses the HIP estimator while a merged one uses the composite
  estimator, so "parts merged vs whole stream" is checked against the documented error bound.
* ``quantiles`` (KLL): merging is not idempotent (a self-merge counts every value twice) and compaction is
  randomized, so count/min/max are checked exactly and quantiles by rank error within the documented ε
  (exactly when no compaction can have happened).
* ``top_k`` (frequent items): merging is not idempotent either (a self-merge doubles every frequency);
  total weight is checked exactly and every item's true frequency must lie within the reported bounds,
  which is a deterministic guarantee of the sketch.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.kinds import KindSpec, State, new_state, state_from_bytes
from schemas.kinds.distinct import relative_standard_error
from schemas.kinds.quantiles import normalized_rank_error

settings.register_profile("laws", max_examples=200, deadline=None)
LAWS = settings.get_profile("laws")


@dataclass(frozen=True)
class Case:
    name: str
    spec: KindSpec
    values: st.SearchStrategy[Any]
    max_values: int = 30

    def new(self) -> State:
        return new_state(self.spec)

    def fill(self, values: list[Any]) -> State:
        s = self.new()
        for v in values:
            s.apply(v)
        return s


_ints = st.integers(-(2**64) + 1, 2**64 - 1)
_decimals = st.builds(lambda c, e: Decimal(c).scaleb(e), st.integers(-(10**15), 10**15), st.integers(-8, 4))
# The router turns -0.0 into 0.0 before any kind sees it; the strategy does the same.
_floats = st.floats(allow_nan=False, allow_infinity=False).map(lambda x: x if x else 0.0)
_moderate_floats = st.floats(-1e12, 1e12, allow_nan=False).map(lambda x: x if x else 0.0)
_items = st.one_of(st.just(""), st.integers(0, 60).map(str))  # the empty text is a value too

EXACT = [
    Case("count", KindSpec("count"), st.none()),
    Case("sum_integer", KindSpec("sum", number="integer"), _ints),
    Case("sum_decimal", KindSpec("sum", number="decimal"), _decimals),
    Case("sum_float", KindSpec("sum", number="float"), _floats | _ints),
    Case("min_integer", KindSpec("min", number="integer"), _ints),
    Case("min_decimal", KindSpec("min", number="decimal"), _decimals),
    Case("min_float", KindSpec("min", number="float"), _floats),
    Case("max_integer", KindSpec("max", number="integer"), _ints),
    Case("max_decimal", KindSpec("max", number="decimal"), _decimals),
    Case("max_float", KindSpec("max", number="float"), _floats),
    Case("mean_integer", KindSpec("mean", number="integer"), _ints),
    Case("mean_decimal", KindSpec("mean", number="decimal"), _decimals),
    Case("mean_float", KindSpec("mean", number="float"), _floats | _ints),
    Case("variance_integer", KindSpec("variance", number="integer"), _ints),
    Case("variance_decimal", KindSpec("variance", number="decimal"), _decimals),
    Case("variance_float", KindSpec("variance", number="float"), _floats | _ints),
]
SKETCHES = [
    Case("distinct_lg12", KindSpec("distinct", lg_k=12), _items),
    Case("distinct_lg4", KindSpec("distinct", lg_k=4), _items, max_values=60),
    Case("quantiles_k200", KindSpec("quantiles", k=200), _moderate_floats),
    Case("quantiles_k8", KindSpec("quantiles", k=8), _moderate_floats, max_values=120),
    Case("top_k_256", KindSpec("top_k", lg_max_map_size=8), _items),
    Case("top_k_8", KindSpec("top_k", lg_max_map_size=3), _items, max_values=80),
]
ALL = EXACT + SKETCHES


def _ranks_within(state: State, values: list[float], eps: float) -> None:
    """Every reported quantile's true rank in ``values`` is within ``eps`` of the asked rank."""
    ordered = sorted(values)
    n = len(ordered)
    for rank in (0.1, 0.25, 0.5, 0.75, 0.9):
        q = state.quantile(rank)  # type: ignore[attr-defined]
        below = sum(1 for v in ordered if v < q) / n
        at_or_below = sum(1 for v in ordered if v <= q) / n
        assert below - eps <= rank <= at_or_below + eps, (rank, q, below, at_or_below, eps)


def check_same(case: Case, a: State, b: State) -> None:
    """Exact kinds: same bytes and value. Sketches: equal on what merges of them keep exactly."""
    kind = case.spec.kind
    if kind == "distinct":
        assert a.value().estimate == b.value().estimate  # type: ignore[attr-defined]
    elif kind == "quantiles":
        va, vb = a.value(), b.value()  # type: ignore[var-annotated]
        assert (va.count, va.min, va.max) == (vb.count, vb.min, vb.max)
    elif kind == "top_k":
        assert a.value().total_weight == b.value().total_weight  # type: ignore[attr-defined]
    else:
        assert a.to_bytes() == b.to_bytes()
        assert a.value() == b.value()


def check_describes(case: Case, state: State, values: list[Any], *, copies: int = 1) -> None:
    """The state is a faithful summary of ``values`` (each counted ``copies`` times), within its bound."""
    kind = case.spec.kind
    if kind == "distinct":
        true = len(set(values))
        est = state.value().estimate  # type: ignore[attr-defined]
        # Four standard deviations of the merged (composite) estimator, plus one for tiny counts.
        assert abs(est - true) <= 4 * relative_standard_error(case.spec.lg_k, merged=True) * true + 1
    elif kind == "quantiles":
        v = state.value()  # type: ignore[var-annotated]
        assert v.count == copies * len(values)
        if values:
            assert (v.min, v.max) == (min(values), max(values))
            exact = len(values) * copies <= case.spec.k
            _ranks_within(state, values, 1e-12 if exact else 2 * normalized_rank_error(case.spec.k))
    elif kind == "top_k":
        v = state.value()  # type: ignore[var-annotated]
        assert v.total_weight == copies * len(values)
        for item, f in Counter(values).items():
            lo, hi = state.bounds(item)  # type: ignore[attr-defined]
            assert lo <= copies * f <= hi
            assert hi - lo <= v.apriori_error
    else:
        assert check_same(case, state, case.fill(values * copies)) is None


def merged(*states: State) -> State:
    out = states[0].copy()
    for s in states[1:]:
        out.merge(s)
    return out


def stream(case: Case) -> st.SearchStrategy[list[Any]]:
    return st.lists(case.values, max_size=case.max_values)


ids = [c.name for c in ALL]


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_merge_is_commutative(case: Case, data: st.DataObject) -> None:
    """a ⊔ b equals b ⊔ a."""
    xs, ys = data.draw(stream(case)), data.draw(stream(case))
    a, b = case.fill(xs), case.fill(ys)
    ab, ba = merged(a, b), merged(b, a)
    check_same(case, ab, ba)
    check_describes(case, ab, xs + ys)


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_merge_is_associative(case: Case, data: st.DataObject) -> None:
    """(a ⊔ b) ⊔ c equals a ⊔ (b ⊔ c)."""
    xs, ys, zs = (data.draw(stream(case)) for _ in range(3))
    a, b, c = case.fill(xs), case.fill(ys), case.fill(zs)
    left, right = merged(merged(a, b), c), merged(a, merged(b, c))
    check_same(case, left, right)
    check_describes(case, left, xs + ys + zs)


SEMILATTICES = frozenset({"min", "max", "distinct"})


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_merge_is_idempotent_or_counts_twice(case: Case, data: st.DataObject) -> None:
    """a ⊔ a equals a for min/max/distinct, and equals "every value applied twice" for additive kinds."""
    xs, ys = data.draw(stream(case)), data.draw(stream(case))
    a = merged(case.fill(xs), case.fill(ys))
    twice = merged(a, a)
    if case.spec.kind in SEMILATTICES:
        check_same(case, twice, a)
        check_same(case, merged(twice, a), a)
    else:
        check_describes(case, twice, xs + ys, copies=2)


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_merging_new_changes_nothing(case: Case, data: st.DataObject) -> None:
    """a ⊔ new() and new() ⊔ a both equal a, bytes included for exact kinds."""
    values = data.draw(stream(case))
    a = case.fill(values)
    before = repr(a.value())
    for result in (merged(a, case.new()), merged(case.new(), a)):
        check_same(case, result, a)
        check_describes(case, result, values)
        assert repr(result.value()) == before
    assert repr(a.value()) == before


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_bytes_round_trip(case: Case, data: st.DataObject) -> None:
    """from_bytes(to_bytes(s)) has the value of s, and (exact kinds) the same bytes."""
    values = data.draw(stream(case))
    s = case.fill(values)
    raw = s.to_bytes()
    back = state_from_bytes(raw)
    assert type(back) is type(s)
    assert repr(back.value()) == repr(s.value())
    assert repr(back.copy().value()) == repr(s.value())
    check_describes(case, back, values)
    if case.spec.kind not in ("distinct", "quantiles", "top_k"):
        # The sketch libraries rehash (HLL sets, frequent-items maps) or re-flag (KLL) what they read,
        # so their bytes are not a fixed point of a round trip; their values are, checked above.
        assert back.to_bytes() == raw
        assert back.copy().to_bytes() == raw


@pytest.mark.parametrize("case", ALL, ids=ids)
@LAWS
@given(data=st.data())
def test_merged_parts_equal_the_whole_stream(case: Case, data: st.DataObject) -> None:
    """For any split of a stream, merging the parts' states equals applying the whole stream."""
    values = data.draw(stream(case))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=4)))
    bounds = [0, *cuts, len(values)]
    parts = [case.fill(values[i:j]) for i, j in itertools.pairwise(bounds)]
    order = data.draw(st.permutations(range(len(parts))))
    result = case.new()
    for i in order:
        result.merge(parts[i])
    check_describes(case, result, values)


@pytest.mark.parametrize("case", ALL, ids=ids)
def test_merge_leaves_other_unchanged(case: Case) -> None:
    """merge(other) mutates only the receiver."""
    a, b = case.fill([]), case.new()
    sample: Callable[[], Any] = {
        "count": lambda: None,
        "distinct": lambda: "x",
        "top_k": lambda: "x",
    }.get(case.spec.kind, lambda: 7 if case.spec.number == "integer" else 7.0)
    for _ in range(5):
        b.apply(Decimal(7) if case.spec.number == "decimal" and case.spec.kind != "count" else sample())
    raw = b.to_bytes()
    a.merge(b)
    a.merge(b)
    assert b.to_bytes() == raw
    assert a.size_bytes() > 0


def test_float_sum_is_exact_where_naive_addition_is_not() -> None:
    """A float sum equals the correctly rounded exact sum, whatever the order."""
    values = [1e16, 1.0, -1e16, 0.1, 0.2, 0.3]
    s = Case("f", KindSpec("sum", number="float"), _floats).fill(values)
    assert s.value() == math.fsum(values) == 1.6
    assert sum(values) != 1.6


def test_variance_has_no_cancellation() -> None:
    """Variance of large, close values is exact where the naive float formula loses everything."""
    s = Case("v", KindSpec("variance", number="float"), _floats).fill([1e9 + 1, 1e9 + 2, 1e9 + 3])
    v = s.value()
    assert v.variance == pytest.approx(2 / 3, rel=1e-15)  # type: ignore[attr-defined]
    assert v.sample_variance == 1.0  # type: ignore[attr-defined]
    assert v.mean == 1e9 + 2  # type: ignore[attr-defined]


def test_empty_min_and_max_read_none() -> None:
    """An empty min or max has no value, not 0."""
    for kind in ("min", "max"):
        assert new_state(KindSpec(kind)).value() is None


def test_decimal_sum_keeps_every_digit() -> None:
    """A decimal sum is never rounded, however many digits it needs."""
    s = Case("d", KindSpec("sum", number="decimal"), _decimals).fill(
        [Decimal("12345678901234567890123456789.01"), Decimal("0.000000001")]
    )
    assert s.value() == Decimal("12345678901234567890123456789.010000001")


def test_distinct_counts_the_empty_text_as_a_value() -> None:
    """DataSketches' HLL skips an empty string: the empty text is counted all the same, once, apart from every
    other text, through its stored bytes and a merge too."""
    empty = new_state(KindSpec("distinct"))
    for value in ("", ""):
        empty.apply(value)
    assert empty.value().estimate == 1.0  # type: ignore[attr-defined]
    both = state_from_bytes(empty.to_bytes())
    other = new_state(KindSpec("distinct"))
    for value in ("x", "0", "-1"):
        other.apply(value)
    both.merge(other)
    assert both.value().estimate == pytest.approx(4.0, abs=1e-6)  # type: ignore[attr-defined]
