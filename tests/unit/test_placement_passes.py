"""The cheaper passes of a decision at 10,000 hosts equal the plain code they replaced.

Each fast path here is checked against the straightforward version, kept below as the reference:

* the best-N search and the order read whole-number rank totals as they are (no rounding, no
  negated copy) and give the order the rounded, negated totals gave;
* a mask is all / any True by counting, as by its reductions;
* a sub-table taken at negative positions counts them from the end, and one taken at positions
  past the end raises, as numpy's bounds-checked take did (later takes skip the checks);
* the Network filter judged per distinct set of networks keeps and explains as judging each
  network at each host; CPUTopology's kept mask keeps the hosts the formula keeps;
* pending VM ids folded as changed rows over the empty column read as the column of sets.

tests/unit/test_simulation_decisions.py and tests/unit/test_placement_fast.py check the whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, table, vm
from vmsched.contracts import PendingEntry
from vmsched.scheduling.hosts import HostTable, IndexArray, SortedIds, all_true, any_true
from vmsched.scheduling.selection import TOTAL_DECIMALS, WeighedUnit, _best_rows, _order, _whole_sums, rank_select
from vmsched.scheduling.units import get_unit, validate_properties

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ============================================================================ references
def ref_best_rows(primary: np.ndarray, top: int) -> IndexArray | None:
    """_best_rows before: on keys where lower wins (the totals negated when higher wins)."""
    bound = primary.min()
    for _ in range(top):
        if np.isnan(bound):
            return None
        rows: IndexArray = np.flatnonzero(primary <= bound)
        if len(rows) >= top:
            return rows
        bound = primary[primary > bound].min()
    return None


def ref_order(host_ids: Sequence[str], totals: np.ndarray, higher_wins: bool) -> list[int]:
    """The whole order before: totals rounded, best first, ties by host id."""
    key = np.round(totals, TOTAL_DECIMALS)
    primary = -key if higher_wins else key
    return sorted(range(len(host_ids)), key=lambda i: (float(primary[i]), host_ids[i]))


def ref_network_verdict(t: HostTable, required: list[str]) -> tuple[list[bool], list[str]]:
    """Each network tested at each host: kept hosts, and the removed hosts' reasons."""
    keep, reasons = [], []
    for i in range(len(t)):
        missing = [net for net in required if net not in t.networks[i]]
        keep.append(not missing)
        if missing:
            noun = "network" if len(missing) == 1 else "networks"
            reasons.append(f"missing {noun} " + ", ".join(f"'{m}'" for m in missing))
    return keep, reasons


# ============================================================================ selection
whole_totals = st.lists(st.integers(-50, 50).map(float), min_size=1, max_size=40)


@FAST
@given(whole_totals | st.lists(st.sampled_from([0.0, 1.5, 2.0, math.nan]), min_size=1, max_size=30), st.integers(1, 8))
def test_the_best_rows_read_as_they_are_equal_the_best_rows_of_the_negated_keys(totals: list[float], top: int) -> None:
    assume(top < len(totals))  # as _order asks: fewer best than hosts
    key = np.array(totals)
    for higher_wins in (False, True):
        got = _best_rows(key, top, higher_wins)
        want = ref_best_rows(-key if higher_wins else key, top)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.tolist() == want.tolist()


@FAST
@given(whole_totals, st.integers(1, 8) | st.none(), st.booleans(), st.booleans())
def test_whole_totals_order_unrounded_as_rounded(
    totals: list[float], top: int | None, higher_wins: bool, ids_sorted: bool
) -> None:
    ids = [f"h{i:02d}" for i in range(len(totals))]
    host_ids: Sequence[str] = SortedIds(ids) if ids_sorted else tuple(reversed(ids))
    values = np.array(totals)
    whole = _order(host_ids, values, higher_wins, top, whole=True)
    assert whole == _order(host_ids, values, higher_wins, top)
    assert whole == ref_order(host_ids, values, higher_wins)[: top if top is not None else None]


@FAST
@given(
    st.lists(st.lists(st.integers(0, 9).map(float), min_size=8, max_size=8), min_size=1, max_size=4),
    st.lists(st.sampled_from([1.0, 2.0, 3.0, 99.0, -1.0, 1.5, 0.1]), min_size=4, max_size=4),
    st.integers(1, 8),
)
def test_rank_select_orders_as_summing_and_rounding_the_points(
    columns: list[list[float]], factors: list[float], top: int
) -> None:
    ids = SortedIds(f"h{i}" for i in range(8))
    units = [WeighedUnit(f"u{k}", factors[k], np.array(c)) for k, c in enumerate(columns)]
    sel = rank_select(ids, units, top=top)
    totals = np.zeros(8)
    for u, p in zip(units, sel.points, strict=True):
        totals = totals + u.factor * np.asarray(p)
    assert sel.totals.tolist() == totals.tolist()
    assert sel.order == ref_order(ids, totals, True)[:top]


def test_totals_are_left_unrounded_only_when_rounding_cannot_change_them() -> None:
    unit = WeighedUnit("u", 2.0, np.zeros(3))
    assert _whole_sums([unit, WeighedUnit("v", -7.0, np.zeros(3))], 10_000)
    assert not _whole_sums([unit, WeighedUnit("v", 1.5, np.zeros(3))], 10_000)  # fractions: rounded
    assert not _whole_sums([WeighedUnit("v", 1e6, np.zeros(3))], 10_000)  # 1e10 x 1e9 is past 2**53


# ============================================================================ masks
@FAST
@given(st.lists(st.booleans(), max_size=50))
def test_masks_counted_say_what_their_reductions_say(bits: list[bool]) -> None:
    mask = np.array(bits, dtype=np.bool_)
    assert all_true(mask) == bool(mask.all())
    assert any_true(mask) == bool(mask.any())


# ============================================================================ sub-tables
def _cluster(n: int) -> HostTable:
    return table(*(host(f"h{i}", mem_free_mb=1000 + i, cpu_cores=1 + i) for i in range(n)))


@FAST
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.lists(st.integers(-n, n - 1), max_size=12))))
def test_a_sub_table_at_negative_positions_counts_them_from_the_end(case: tuple[int, list[int]]) -> None:
    n, positions = case
    t = _cluster(n)
    pos = np.array(positions, dtype=np.intp)
    sub = t.take(pos)
    plain = [p % n for p in positions]
    assert list(sub.ids) == [t.ids[p] for p in plain]
    assert sub.mem_free_mb.tolist() == t.mem_free_mb.take(pos).tolist()
    assert list(sub.networks) == [t.networks[p] for p in plain]


def test_a_sub_table_past_the_end_raises_as_before() -> None:
    t = _cluster(4)
    with pytest.raises(IndexError):
        t.take(np.array([1, 4], dtype=np.intp))
    with pytest.raises(IndexError):
        t.take(np.array([-5], dtype=np.intp))


# ============================================================================ filters
NETS = ["a", "b", "c", "d"]


@FAST
@given(
    st.lists(st.sets(st.sampled_from(NETS)), min_size=1, max_size=12),
    st.lists(st.sampled_from(NETS), min_size=1, max_size=4),
    st.lists(st.booleans(), max_size=12),
)
def test_the_network_filter_per_distinct_set_equals_each_network_at_each_host(
    host_nets: list[set[str]], wanted: list[str], drop: list[bool]
) -> None:
    t = table(*(host(f"h{i}", networks=sorted(nets)) for i, nets in enumerate(host_nets)))
    keep_rows = np.array([not (drop[i] if i < len(drop) else False) for i in range(len(t))], dtype=np.bool_)
    for hosts in (t, t.take(keep_rows)):  # the whole table, and a sub-table of it
        unit = get_unit("Network")
        assert unit.filter is not None
        verdict = unit.filter(hosts, vm(networks=wanted), validate_properties(unit, {}))
        keep, reasons = ref_network_verdict(hosts, list(dict.fromkeys(wanted)))
        assert verdict.keep.tolist() == keep
        assert list(verdict.reasons) == reasons


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=10),
    st.booleans(),
    st.integers(1, 2),
)
def test_cpu_topology_keeps_the_hosts_the_formula_keeps(
    topo: list[tuple[int, int, int]], exclusive: bool, threads: int
) -> None:
    t = table(*(host(f"h{i}", cpu_sockets=s, cpu_cores=c, cpu_threads=th) for i, (s, c, th) in enumerate(topo)))
    unit = get_unit("CPUTopology")
    assert unit.filter is not None
    spec = vm(vcpus=2, cpu_threads_per_core=threads, exclusive_cpus=exclusive)
    verdict = unit.filter(t, spec, validate_properties(unit, {}))
    want = []
    for s, c, th in topo:
        known = c > 0 and s > 0
        per_core = th // max(c, 1) if known and th > 0 else 1
        want.append(known and (per_core >= threads if spec.exclusive_cpus else True))
    assert verdict.keep.tolist() == want
    assert len(verdict.reasons) == want.count(False)
    assert all(verdict.reasons)  # each removed host has its reason


# ============================================================================ pending
@FAST
@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4096)), max_size=20),
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4096)), max_size=20),
)
def test_pending_vm_ids_fold_as_the_sets_of_each_host(
    first: list[tuple[int, int]], more: list[tuple[int, int]]
) -> None:
    t = _cluster(8)
    entries: list[PendingEntry] = [pend(f"h{h}", mem_mb=m) for h, m in first]
    extra: list[PendingEntry] = [pend(f"h{h}", mem_mb=m) for h, m in more]
    folded = t.with_pending(entries)
    for got, every in ((folded, entries), (folded.with_more_pending(extra), entries + extra)):
        sets = [frozenset(e.vm_id for e in every if e.host_id == h) for h in got.ids]
        assert list(got.pending_vm_ids) == sets
        assert [got.pending_vm_ids[i] for i in range(len(got))] == sets
        assert got.pending_rows() == tuple(i for i, s in enumerate(sets) if s)
        mem = [float(sum(e.mem_mb for e in every if e.host_id == h)) for h in got.ids]
        assert got.pending_mem_mb.tolist() == mem
        assert got.with_pending(every).pending_vm_ids == got.pending_vm_ids  # refolded from scratch
    assert list(t.pending_vm_ids) == [frozenset()] * 8  # the table folded into is as it was
