"""Selectors: oVirt's weight-normalization worked table, rank semantics, tie-breaking, and invariants."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import floats
from vmsched.scheduling.selection import (
    DEFAULT_SELECTOR,
    SELECTORS,
    TOTAL_DECIMALS,
    WeighedUnit,
    _order,
    dynamic_maximum_select,
    min_max_points,
    min_max_select,
    rank_points,
    rank_select,
    static_maximum_select,
)
from vmsched.scheduling.units.base import Direction

LOWER = Direction.LOWER_IS_BETTER
HIGHER = Direction.HIGHER_IS_BETTER


def unit(name: str, factor: float, raw: list[float], direction: Direction = LOWER, **kw: float) -> WeighedUnit:
    return WeighedUnit(name, factor, np.array(raw, dtype=np.float64), direction, **kw)


# ------------------------------------------------------- oVirt's weight-normalization table
TABLE_HOSTS = ["A", "B", "C"]


def table_units() -> list[WeighedUnit]:
    """oVirt's normalization example: CPU load x10 (hardcoded max 100 %), occupied memory x1 (hardcoded max 4096 MB)."""
    return [
        unit("cpu", 10, [90, 50, 10], maximum=100),
        unit("memory", 1, [1024, 2048, 4096], maximum=4096),
    ]


def test_rank_select_on_the_normalization_example() -> None:
    sel = rank_select(TABLE_HOSTS, table_units())
    assert floats(sel.points[0]) == [0, 1, 2]  # CPU: C is best
    assert floats(sel.points[1]) == [2, 1, 0]  # memory: A is best
    assert floats(sel.totals) == [2, 11, 20]  # points convention: highest wins
    assert sel.ordered_ids == ["C", "B", "A"]
    assert sel.best == "C"
    # oVirt's example counts rank as "number of hosts better" (lower wins): 10 x 2 + 0 = 20, 11, 2.
    n = len(TABLE_HOSTS)
    ovirt_rank = sum(u.factor for u in table_units()) * (n - 1) - sel.totals
    assert floats(ovirt_rank) == [20, 11, 2]


def test_static_maximum_select_on_the_normalization_example() -> None:
    sel = static_maximum_select(TABLE_HOSTS, table_units())
    assert floats(sel.totals) == [925, 550, 200]
    assert sel.ordered_ids == ["C", "B", "A"]
    assert not sel.higher_wins


def test_dynamic_maximum_select_on_the_normalization_example() -> None:
    sel = dynamic_maximum_select(TABLE_HOSTS, table_units())
    assert floats(sel.points[0]) == [100, 55, 11]  # 50 / 90 -> 55 (truncated, as in oVirt's example)
    assert floats(sel.totals) == [1025, 600, 210]
    assert sel.ordered_ids == ["C", "B", "A"]


def test_min_max_select_on_the_normalization_example() -> None:
    sel = min_max_select(TABLE_HOSTS, table_units())
    assert floats(sel.points[0]) == [0, 0.5, 1]
    assert np.allclose(sel.totals, [1, 10 * 0.5 + 2 / 3, 10])
    assert sel.ordered_ids == ["C", "B", "A"]


def test_selectors_are_registered() -> None:
    assert SELECTORS[DEFAULT_SELECTOR] is rank_select
    assert set(SELECTORS) == {
        "RankSelector",
        "StaticMaximumSelector",
        "DynamicMaximumSelector",
        "MinMaxSelector",
    }
    for name, fn in SELECTORS.items():
        assert fn(TABLE_HOSTS, table_units()).selector == name


# ------------------------------------------------------------------------------------ rank points
def test_rank_points_ties_share_the_better_rank() -> None:
    assert floats(rank_points(np.array([5.0, 5.0, 7.0]))) == [2, 2, 0]
    assert floats(rank_points(np.array([7.0, 5.0, 5.0, 1.0]))) == [0, 2, 2, 3]
    assert floats(rank_points(np.array([5.0, 5.0, 7.0]), HIGHER)) == [1, 1, 2]


def test_rank_points_edge_sizes() -> None:
    assert rank_points(np.array([], dtype=np.float64)).shape == (0,)
    assert floats(rank_points(np.array([42.0]))) == [0]
    assert floats(rank_points(np.array([3.0, 3.0, 3.0]))) == [2, 2, 2]


def brute_force_points(raw: list[float], direction: Direction) -> list[float]:
    n = len(raw)
    if direction is LOWER:
        return [float(n - 1 - sum(1 for y in raw if y < x)) for x in raw]
    return [float(n - 1 - sum(1 for y in raw if y > x)) for x in raw]


finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(finite, max_size=12), st.sampled_from([LOWER, HIGHER]))
def test_rank_points_match_definition(raw: list[float], direction: Direction) -> None:
    assert floats(rank_points(np.array(raw, dtype=np.float64), direction)) == brute_force_points(raw, direction)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=12), st.integers(1, 1000), st.integers(-1000, 1000))
def test_rank_points_depend_only_on_order(raw: list[int], scale: int, shift: int) -> None:
    # Integers keep every transform exact, so no two distinct weights can merge.
    base = np.array(raw, dtype=np.float64)
    points = rank_points(base)
    assert floats(rank_points(base * scale + shift)) == floats(points)
    assert floats(rank_points(base**3)) == floats(points)  # any strictly increasing map
    assert points.max() == len(raw) - 1  # the best host earns n - 1
    assert (points >= 0).all()


# ------------------------------------------------------------------------------------ rank_select
def test_missing_weights_count_as_zero() -> None:
    hosts = ["a", "b", "c"]
    u = WeighedUnit.from_mapping(hosts, "u", 1, {"b": 5.0, "c": -1.0})
    assert np.isnan(u.raw[0])
    sel = rank_select(hosts, [u])
    assert floats(sel.raw[0]) == [0, 5, -1]
    assert floats(sel.points[0]) == [1, 0, 2]
    assert sel.ordered_ids == ["c", "a", "b"]


def test_factor_weights_units() -> None:
    hosts = ["a", "b"]
    cpu = unit("cpu", 1, [10, 20])  # a better
    mem = unit("mem", 3, [20, 10])  # b better, counts 3x
    assert rank_select(hosts, [cpu, mem]).ordered_ids == ["b", "a"]
    assert rank_select(hosts, [unit("cpu", 4, [10, 20]), mem]).ordered_ids == ["a", "b"]
    # A zero factor switches a unit off.
    assert rank_select(hosts, [cpu, unit("mem", 0, [20, 10])]).ordered_ids == ["a", "b"]


def test_higher_is_better_unit() -> None:
    sel = rank_select(["a", "b", "c"], [unit("free_ram", 1, [100, 300, 200], HIGHER)])
    assert floats(sel.points[0]) == [0, 2, 1]
    assert sel.ordered_ids == ["b", "c", "a"]


def test_final_ties_break_by_host_id_whatever_the_input_order() -> None:
    raw = [5.0, 5.0, 5.0]
    assert rank_select(["c", "a", "b"], [unit("u", 1, raw)]).ordered_ids == ["a", "b", "c"]
    assert rank_select(["b", "c", "a"], [unit("u", 2, raw)]).ordered_ids == ["a", "b", "c"]
    # Totals 3 = 3 reached through different points and fractional factors still tie.
    sel = rank_select(["y", "x"], [unit("u", 0.1, [0, 1]), unit("v", 0.2, [1, 0])])
    assert sel.ordered_ids == ["x", "y"]


def test_no_hosts_and_no_units() -> None:
    sel = rank_select([], [unit("u", 1, [])])
    assert sel.order == []
    assert sel.best is None
    assert sel.to_score_table().hosts == []
    sel = rank_select(["b", "a"], [])
    assert floats(sel.totals) == [0, 0]
    assert sel.ordered_ids == ["a", "b"]


def test_one_host() -> None:
    sel = rank_select(["only"], [unit("u", 2, [123])])
    assert sel.best == "only"
    assert floats(sel.points[0]) == [0]


def test_misaligned_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="2 weights for 3 hosts"):
        rank_select(["a", "b", "c"], [unit("u", 1, [1, 2])])


def test_score_table_is_in_final_order() -> None:
    table = rank_select(TABLE_HOSTS, table_units()).to_score_table()
    assert table.selector == "RankSelector"
    assert table.hosts == ["C", "B", "A"]
    assert [u.unit for u in table.units] == ["cpu", "memory"]
    assert table.units[0].factor == 10
    assert table.units[0].raw == [10, 50, 90]
    assert table.units[0].points == [2, 1, 0]
    assert table.units[1].raw == [4096, 2048, 1024]
    assert table.units[1].points == [0, 1, 2]
    assert table.totals == [20, 11, 2]


# ------------------------------------------------------------------------------------ invariants
@st.composite
def weighing(draw: st.DrawFn) -> tuple[list[str], list[WeighedUnit]]:
    n = draw(st.integers(0, 8))
    ids = [f"h{i}" for i in range(n)]
    k = draw(st.integers(0, 4))
    units = []
    for j in range(k):
        raw = draw(st.lists(st.integers(-50, 50).map(float), min_size=n, max_size=n))
        factor = draw(st.integers(0, 5).map(float))
        units.append(unit(f"u{j}", factor, raw, draw(st.sampled_from([LOWER, HIGHER]))))
    return ids, units


@settings(max_examples=100, deadline=None)
@given(weighing(), st.randoms(use_true_random=False))
def test_rank_select_is_permutation_invariant(case: tuple[list[str], list[WeighedUnit]], rnd: random.Random) -> None:
    ids, units = case
    perm = list(range(len(ids)))
    rnd.shuffle(perm)
    shuffled_ids = [ids[i] for i in perm]
    shuffled = [WeighedUnit(u.unit, u.factor, u.raw[perm], u.direction) for u in units]
    a, b = rank_select(ids, units), rank_select(shuffled_ids, shuffled)
    assert a.ordered_ids == b.ordered_ids
    for pa, pb in zip(a.points, b.points, strict=True):
        assert floats(pa[perm]) == floats(pb)
    assert floats(a.totals[perm]) == floats(b.totals)


@settings(max_examples=100, deadline=None)
@given(weighing(), st.integers(1, 1000))
def test_scaling_raw_weights_keeps_the_ranking(case: tuple[list[str], list[WeighedUnit]], scale: int) -> None:
    ids, units = case
    scaled = [WeighedUnit(u.unit, u.factor, u.raw * scale, u.direction) for u in units]
    a, b = rank_select(ids, units), rank_select(ids, scaled)
    assert a.ordered_ids == b.ordered_ids
    assert floats(a.totals) == floats(b.totals)


@settings(max_examples=100, deadline=None)
@given(weighing())
def test_rank_totals_are_bounded_and_order_is_sorted(case: tuple[list[str], list[WeighedUnit]]) -> None:
    ids, units = case
    sel = rank_select(ids, units)
    n = len(ids)
    assert sorted(sel.order) == list(range(n))
    ordered = sel.totals[sel.order]
    assert (np.diff(ordered) <= 0).all()
    cap = sum(u.factor for u in units) * max(n - 1, 0)
    assert ((sel.totals >= 0) & (sel.totals <= cap)).all()


@settings(max_examples=100, deadline=None)
@given(weighing())
def test_a_host_best_in_every_unit_wins(case: tuple[list[str], list[WeighedUnit]]) -> None:
    ids, units = case
    if not ids:
        return
    # Make h0 strictly best in every unit.
    boosted = []
    for u in units:
        raw = u.raw.copy()
        raw[0] = raw.min() - 1 if u.direction is LOWER else raw.max() + 1
        boosted.append(WeighedUnit(u.unit, u.factor, raw, u.direction))
    sel = rank_select(ids, boosted)
    assert sel.totals[0] == sel.totals.max()
    if any(u.factor > 0 for u in units) and len(ids) > 1:
        assert sel.best == "h0"


# ------------------------------------------------------------------------------------ other selectors
def test_min_max_all_equal_is_zero() -> None:
    assert floats(min_max_points(np.array([3.0, 3.0]), LOWER)) == [0, 0]
    assert floats(min_max_points(np.array([1.0, 3.0]), HIGHER)) == [0, 1]
    assert min_max_points(np.array([], dtype=np.float64), LOWER).shape == (0,)


def test_static_maximum_without_maximum_falls_back_to_dynamic() -> None:
    units = [unit("cpu", 1, [90, 45])]
    assert floats(static_maximum_select(["a", "b"], units).totals) == [100, 50]


def test_maximum_selectors_handle_negative_and_higher_is_better() -> None:
    # Power-saving style negative weights: the busiest (-90) stays best.
    sel = dynamic_maximum_select(["a", "b"], [unit("ps", 1, [-90, -45])])
    assert floats(sel.totals) == [-100, -50]
    assert sel.best == "a"
    sel = dynamic_maximum_select(["a", "b"], [unit("free", 1, [100, 50], HIGHER)])
    assert floats(sel.totals) == [0, 50]
    assert sel.best == "a"
    assert floats(dynamic_maximum_select(["a"], [unit("z", 1, [0])]).totals) == [0]


@settings(max_examples=100, deadline=None)
@given(weighing(), st.sampled_from(sorted(SELECTORS)), st.integers(1, 10))
def test_the_best_few_are_the_head_of_the_whole_table(
    case: tuple[list[str], list[WeighedUnit]], selector: str, top: int
) -> None:
    """What the weigher answers without scores is exactly the start of what it answers with them."""
    ids, units = case
    chosen = SELECTORS[selector](ids, units)
    whole, head = chosen.to_score_table(), chosen.to_score_table(top)
    assert head.hosts == whole.hosts[:top]
    assert head.totals == whole.totals[:top]
    assert head.units == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 2.5, -1.0, 1e-12]), min_size=1, max_size=40),
    st.booleans(),
    st.booleans(),
)
def test_ties_break_by_host_id_whether_or_not_the_ids_come_sorted(
    totals: list[float], higher_wins: bool, shuffle: bool
) -> None:
    ids = [f"h{i:03d}" for i in range(len(totals))]
    if shuffle:
        ids = list(reversed(ids))
    order = _order(ids, np.array(totals), higher_wins)
    key = [(-t if higher_wins else t, h) for t, h in zip(np.round(totals, TOTAL_DECIMALS), ids, strict=True)]
    assert order == sorted(range(len(ids)), key=lambda i: key[i])
