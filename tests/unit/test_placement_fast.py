"""Placement's fast paths decide exactly as the straightforward code they replaced, on random inputs.

Deciding at 10,000 hosts without passes over every host in Python rests on a few equivalences,
each checked here against the plain version (kept below as the reference):

* rank points by counting whole-number weights (with a few far outliers) equal rank points by
  sorting; the best `top` hosts of a selector are the head of its whole order;
* a table moved through many row updates (columns shared when unchanged, changed object columns
  patched, factors, the index of where VMs run and the derived per-host values kept from version to
  version) reads as a table built afresh from the same states;
* a sub-table (taken lazily, chained, by mask or by positions) reads as its rows of the table;
* a filter chain that runs the filters judging a host by its own row over one table, copying it
  once, removes the same hosts, for the same reasons, as copying the table after each filter;
* the affinity rank of hosts grouped by what they break equals ranking each host.

tests/unit/test_simulation_decisions.py checks the whole: simulations decide as recorded before.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, vm
from vmsched.contracts import ClusterReport, HostState, HostStatus, PendingEntry, VmSpec
from vmsched.scheduling.hosts import (
    BOOLEAN_COLUMNS,
    NUMERIC_COLUMNS,
    OBJECT_COLUMNS,
    FloatArray,
    HostTable,
    SortedIds,
    constant,
)
from vmsched.scheduling.pipeline import Removal, run_filters, summarize
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.selection import WeighedUnit, _order, rank_points, rank_select
from vmsched.scheduling.units import get_unit, validate_properties
from vmsched.scheduling.units.affinity import DEFAULT_SCORE, _rank_broken
from vmsched.scheduling.units.base import Direction
from vmsched.scheduling.units.helpers import known_cpus, max_scheduling_memory_mb, spm_load_share

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ============================================================================ references
def ref_rank_points(raw: FloatArray, direction: Direction) -> list[float]:
    """Competition rank points by sorting (the code before counting)."""
    n = raw.shape[0]
    ordered = np.sort(raw)
    if direction is Direction.LOWER_IS_BETTER:
        better = np.searchsorted(ordered, raw, side="left")
    else:
        better = n - np.searchsorted(ordered, raw, side="right")
    out: list[float] = ((n - 1) - better).astype(np.float64).tolist()
    return out


def ref_rank_broken(broken: list[list[float]], tie_break: Sequence[float] | None) -> list[float]:
    """oVirt's affinity rank, one key per host (rank_by_broken_priorities before grouping)."""
    n = len(broken)
    tb = tie_break if tie_break is not None else [0.0] * n
    keys = [(tuple(sorted(p, reverse=True)), -tb[i]) for i, p in enumerate(broken)]
    ordered = sorted(keys)
    return [DEFAULT_SCORE + bisect.bisect_left(ordered, k) for k in keys]


def ref_holding(t: HostTable, members: frozenset[str]) -> list[bool]:
    return [not (members.isdisjoint(t.vm_ids[i]) and members.isdisjoint(t.pending_vm_ids[i])) for i in range(len(t))]


def ref_members_on(t: HostTable, members: frozenset[str]) -> list[float]:
    return [float(len(members & (t.vm_ids[i] | t.pending_vm_ids[i]))) for i in range(len(t))]


def ref_locate(t: HostTable, vm_ids: frozenset[str]) -> dict[str, str]:
    root, found = t.cluster, {}
    for h, running, pending in zip(root.ids, root.vm_ids, root.pending_vm_ids, strict=True):
        for v in vm_ids & (running | pending):
            found[v] = h
    return found


def ref_run_filters(hosts: HostTable, v: VmSpec, policy: str) -> tuple[list[str], list[Removal]]:
    """The chain as it was: the table copied after every filter that removes a host."""
    rows: list[Removal] = []
    for call in BUILTIN_POLICIES[policy].filter_calls():
        if len(hosts) == 0:
            break
        unit = get_unit(call.unit)
        assert unit.filter is not None
        verdict = unit.filter(hosts, v, validate_properties(unit, call.properties))
        gone = np.flatnonzero(~verdict.keep).tolist()
        rows.extend(Removal(hosts.ids[i], unit.name, r) for i, r in zip(gone, verdict.reasons, strict=True))
        if gone:
            hosts = hosts.take(np.asarray(verdict.keep, dtype=np.bool_).copy())
    return list(hosts.ids), rows


def ref_summary(candidates: int, available: int, removed: Sequence[Removal]) -> str:
    """summarize before the lazy removals: every row counted."""
    head = f"{available}/{candidates} hosts available"
    if not removed:
        return head
    counts = Counter(f.filter for f in removed)
    reasons: dict[str, set[str]] = {}
    for f in removed:
        reasons.setdefault(f.filter, set()).add(f.reason)
    parts = []
    for name, n in counts.most_common():
        distinct = reasons[name]
        why = next(iter(distinct)) if len(distinct) == 1 else (get_unit(name).summary or name)
        parts.append(f"{n} {name} ({why})")
    return f"{head}: " + ", ".join(parts)


# ============================================================================ strategies
T0 = 1_700_000_000.0
VMS = [f"vm-{i}" for i in range(8)]

#: Hosts that sit on the filters' thresholds: few or no cores, full or free memory, swapping, loads
#: over 80% for a while, networks and CPU models missing, down, SPM, VMs running on them.
hosts_st = st.builds(
    lambda i, cores, threads, free, swap, up, spm, nets, models, vms, loads: host(
        f"h{i:02d}",
        cpu_cores=cores,
        cpu_threads=threads,
        physical_mem_mb=8192,
        mem_free_mb=free,
        swap_total_mb=swap,
        swap_free_mb=swap // 2,
        status=HostStatus.UP if up else HostStatus.DOWN,
        is_spm=spm,
        networks=nets,
        cpu_models=models,
        vm_ids=sorted(vms),
        vm_count=len(vms),
        mem_committed_mb=1024 * len(vms),
        vcpus_committed=2 * len(vms),
        cpu_samples=[(T0 - 60.0 * (len(loads) - k), load) for k, load in enumerate(loads)],
    ),
    st.integers(0, 40),
    st.sampled_from([0, 2, 4, 8]),
    st.sampled_from([0, 8]),
    st.sampled_from([0, 512, 1100, 4096, 8192]),
    st.sampled_from([0, 0, 4096]),
    st.booleans(),
    st.booleans(),
    st.lists(st.sampled_from(["n1", "n2"]), max_size=2),
    st.lists(st.sampled_from(["Skylake", "Haswell"]), max_size=2),
    st.sets(st.sampled_from(VMS), max_size=2),
    st.lists(st.sampled_from([10.0, 79.0, 81.0, 95.0]), max_size=4),
)
tables_st = st.lists(hosts_st, min_size=1, max_size=14, unique_by=lambda h: h.report.host_id)
vms_st = st.builds(
    lambda mem, vcpus, nets, model, swap, pinned: vm(
        mem_mb=mem, vcpus=vcpus, networks=nets, cpu_model=model, use_swap=swap, pinned_hosts=pinned
    ),
    st.sampled_from([512, 1024, 4096]),
    st.sampled_from([1, 2, 6]),
    st.lists(st.sampled_from(["n1", "n2"]), max_size=2),
    st.sampled_from([None, None, "Skylake"]),
    st.booleans(),
    st.lists(st.sampled_from(["h00", "h01", "h02"]), max_size=2),
)


def _table(hosts: list[HostState], threads: bool = False, pending: Sequence[PendingEntry] = ()) -> HostTable:
    ordered = sorted(hosts, key=lambda h: h.report.host_id)
    settings_ = ClusterReport(cluster_id="c1", memory_overcommit_pct=150, count_threads_as_cores=threads)
    return HostTable.from_states(ordered, settings_).with_pending(pending, now=T0)


def _same_columns(a: HostTable, b: HostTable) -> None:
    assert tuple(a.ids) == tuple(b.ids)
    for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in OBJECT_COLUMNS:
        assert tuple(getattr(a, name)) == tuple(getattr(b, name)), name


def _derived_as_computed(t: HostTable) -> None:
    """What tables keep from version to version equals what the plain formulas give now."""
    cpus = np.where(t.cpu_threads > 0, t.cpu_threads, t.cpu_cores) if t.settings.count_threads_as_cores else t.cpu_cores
    np.testing.assert_array_equal(t.effective_cpus, cpus)
    known = (t.cpu_cores > 0) & (cpus > 0)
    got_known, got_cpus = known_cpus(t)
    np.testing.assert_array_equal(got_known, known)
    np.testing.assert_array_equal(got_cpus, np.where(known, cpus, 1.0))
    share = np.where(t.is_spm, 10.0 / np.where(cpus > 0, cpus, 1.0), 0.0)
    np.testing.assert_array_equal(spm_load_share(t, t.effective_cpus), share)
    pct = float(t.settings.memory_overcommit_pct)
    sched = pct * t.physical_mem_mb / 100.0 - t.mem_committed_mb - t.reserved_mem_mb - t.pending_mem_mb
    np.testing.assert_array_equal(max_scheduling_memory_mb(t), sched)
    for net in ("n1", "n2", "n3"):
        assert t.has_network(net).tolist() == [net in n for n in t.networks]


def _lookups_as_scanned(t: HostTable, data: st.DataObject) -> None:
    for _ in range(3):
        members = frozenset(data.draw(st.sets(st.sampled_from([*VMS, "pending-x", "nowhere"]), max_size=3)))
        assert t.holding(members).tolist() == ref_holding(t, members)
        assert t.members_on(members).tolist() == ref_members_on(t, members)
        assert t.locate(members) == ref_locate(t, members)
    for h in t.ids:
        assert t.position(h) == list(t.ids).index(h)
    assert t.position("nope") is None


# ============================================================================ selection
weights_st = st.one_of(
    st.lists(st.integers(-300, 300).map(float), min_size=1, max_size=60),
    st.lists(st.sampled_from([0.0, -0.0, 3.0, 7.0, 1e9, 2e9, 1e12]), min_size=1, max_size=60),
    st.lists(st.floats(-1e6, 1e6, allow_nan=False) | st.just(math.nan), min_size=1, max_size=40),
    st.lists(st.sampled_from([math.inf, -math.inf, 5.0]), min_size=1, max_size=20),
)


@FAST
@given(weights_st, st.sampled_from(list(Direction)))
def test_rank_points_by_counting_equal_rank_points_by_sorting(raw: list[float], direction: Direction) -> None:
    values = np.array(raw, dtype=np.float64)
    assert rank_points(values, direction).tolist() == ref_rank_points(values, direction)
    if len(raw) > 1 and len(set(raw)) == 1 and not math.isnan(raw[0]):
        assert rank_points(values, direction).strides == (0,)  # one value, stored once


@FAST
@given(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 2.0000000001, 5.0, math.nan]), min_size=1, max_size=40),
    st.integers(1, 8),
    st.booleans(),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_the_best_top_hosts_are_the_head_of_the_whole_order(
    totals: list[float], top: int, higher_wins: bool, ids_sorted: bool, rnd: object
) -> None:
    ids = [f"h{i:02d}" for i in range(len(totals))]
    if not ids_sorted:
        rnd.shuffle(ids)  # type: ignore[attr-defined]
    host_ids: Sequence[str] = SortedIds(ids) if ids_sorted else tuple(ids)
    values = np.array(totals)
    assert _order(host_ids, values, higher_wins, top) == _order(host_ids, values, higher_wins)[:top]


@FAST
@given(
    st.lists(st.lists(st.integers(0, 5).map(float), min_size=6, max_size=6), min_size=1, max_size=3), st.integers(1, 6)
)
def test_a_selection_of_the_top_orders_and_totals_as_the_whole(columns: list[list[float]], top: int) -> None:
    ids = SortedIds(f"h{i}" for i in range(6))
    units = [WeighedUnit(f"u{k}", float(k + 1), np.array(c)) for k, c in enumerate(columns)]
    units.append(WeighedUnit("flat", 3.0, constant(6, 4.0)))
    whole, best = rank_select(ids, units), rank_select(ids, units, top=top)
    assert best.order == whole.order[:top]
    assert best.totals.tolist() == whole.totals.tolist()
    as_arrays = rank_select(ids, [WeighedUnit(u.unit, u.factor, np.array(u.raw)) for u in units])
    assert whole.totals.tolist() == as_arrays.totals.tolist()  # a constant adds what its array would


# ============================================================================ tables
@FAST
@given(tables_st, st.booleans(), st.lists(st.lists(hosts_st, min_size=1, max_size=3), max_size=90), st.data())
def test_a_table_after_many_row_updates_reads_as_a_table_built_afresh(
    hosts: list[HostState], threads: bool, steps: list[list[HostState]], data: st.DataObject
) -> None:
    """Up to 90 versions: changed object columns patched then flattened, factors and the VM index
    extended then rebuilt, derived values kept while their columns stay the same."""
    states = {h.report.host_id: h for h in hosts}
    t = _table(hosts, threads)
    _derived_as_computed(t)
    for step in steps:
        changes = {}
        for h in step:  # the new state of an existing host (a step's ids are renamed onto the table's)
            hid = data.draw(st.sampled_from(sorted(states)))
            changes[hid] = h.model_copy(update={"report": h.report.model_copy(update={"host_id": hid})})
        t = t.updated(changes)
        states.update(changes)
        if data.draw(st.booleans()):
            _derived_as_computed(t)
            _lookups_as_scanned(t, data)
    fresh = _table(list(states.values()), threads)
    _same_columns(t, fresh)
    _derived_as_computed(t)
    _lookups_as_scanned(t, data)


@FAST
@given(tables_st, st.data())
def test_pending_folded_in_or_not_reads_as_summed(hosts: list[HostState], data: st.DataObject) -> None:
    ids = sorted(h.report.host_id for h in hosts)
    t = _table(hosts)
    for _ in range(3):
        entries = [
            pend(data.draw(st.sampled_from([*ids, "elsewhere"])), mem_mb=256, vcpus=1)
            for _ in range(data.draw(st.integers(0, 3)))
        ]
        t = t.with_pending(entries, now=T0)
        expected = {h: [e for e in entries if e.host_id == h] for h in ids}
        assert t.pending_mem_mb.tolist() == [256.0 * len(expected[h]) for h in ids]
        assert list(t.pending_vm_ids) == [frozenset(e.vm_id for e in expected[h]) for h in ids]
        assert t.pending_rows() == tuple(i for i, h in enumerate(ids) if expected[h])
        _lookups_as_scanned(t, data)


def test_folding_nothing_into_a_table_with_pending_keeps_its_state_not_an_older_one() -> None:
    plain = _table([host("h00", mem_free_mb=1000), host("h01", mem_free_mb=2000)])
    pending = plain.with_pending([pend("h00", mem_mb=300)], now=T0)
    assert pending.with_pending([], now=T0 + 1).pending_mem_mb.tolist() == [0.0, 0.0]
    assert pending.with_pending([], now=T0 + 1).as_of == T0 + 1
    changed = replace(pending, mem_free_mb=np.array([5.0, 6.0]))
    again = changed.with_pending([], now=T0)
    assert again.mem_free_mb.tolist() == [5.0, 6.0]
    assert again.pending_mem_mb.tolist() == [0.0, 0.0]


@FAST
@given(
    tables_st, st.lists(st.tuples(st.booleans(), st.randoms(use_true_random=False)), min_size=1, max_size=3), st.data()
)
def test_sub_tables_read_as_their_rows(
    hosts: list[HostState], cuts: list[tuple[bool, object]], data: st.DataObject
) -> None:
    """Chains of sub-tables, taken by mask or by positions (ascending or not), with pending."""
    ids = sorted(h.report.host_id for h in hosts)
    whole = _table(hosts, pending=[pend(ids[0], mem_mb=100), pend(ids[-1], vcpus=2)])
    t, rows = whole, list(range(len(whole)))
    for by_mask, rnd in cuts:
        keep = [data.draw(st.booleans()) for _ in rows]
        picked = [i for i, k in enumerate(keep) if k]
        if not by_mask:
            rnd.shuffle(picked)  # type: ignore[attr-defined]
        t = t.take(np.array(keep, dtype=np.bool_) if by_mask else np.array(picked, dtype=np.intp))
        rows = [rows[i] for i in picked]
        expected = whole.take(np.array(rows, dtype=np.intp)) if rows else whole.take(np.zeros(0, dtype=np.intp))
        assert tuple(t.ids) == tuple(whole.ids[r] for r in rows)
        for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS):
            np.testing.assert_array_equal(getattr(t, name), getattr(whole, name)[rows], err_msg=name)
        for name in OBJECT_COLUMNS:
            assert tuple(getattr(t, name)) == tuple(getattr(whole, name)[r] for r in rows), name
        _same_columns(t, expected)
        _derived_as_computed(t)
        _lookups_as_scanned(t, data)


# ============================================================================ filters
@FAST
@given(tables_st, vms_st, st.sampled_from(["none", "power_saving"]), st.data())
def test_a_filter_chain_by_rows_removes_what_copying_after_each_filter_removes(
    hosts: list[HostState], v: VmSpec, policy: str, data: st.DataObject
) -> None:
    ids = sorted(h.report.host_id for h in hosts)
    entries = [pend(data.draw(st.sampled_from(ids)), mem_mb=2048, vcpus=2) for _ in range(data.draw(st.integers(0, 2)))]
    t = _table(hosts, threads=data.draw(st.booleans()), pending=entries)
    if data.draw(st.booleans()):  # a migration: the VM runs on one of the hosts
        v = v.model_copy(update={"current_host": data.draw(st.sampled_from(ids)), "cpu_usage_pct": 50.0})
    out = run_filters(t, v, BUILTIN_POLICIES[policy].filter_calls())
    survivors, removed = ref_run_filters(t, v, policy)
    assert list(out.survivors.ids) == survivors
    assert summarize(len(t), len(survivors), out.removals) == ref_summary(len(t), len(survivors), removed)
    assert list(out.removals) == removed


# ============================================================================ affinity
@FAST
@given(
    st.integers(1, 40),
    st.lists(
        st.tuples(st.lists(st.booleans(), min_size=40, max_size=40), st.sampled_from([1.0, 2.0, 5.0])), max_size=4
    ),
    st.none() | st.lists(st.sampled_from([0.0, 1.0, 2.0, 1.5]), min_size=40, max_size=40),
)
def test_affinity_ranks_of_hosts_grouped_by_what_they_break_equal_ranking_each(
    n: int, groups: list[tuple[list[bool], float]], tie_break: list[float] | None
) -> None:
    broken = [(np.array(mask[:n], dtype=np.bool_), priority) for mask, priority in groups]
    lists = [[p for mask, p in broken if mask[i]] for i in range(n)]
    tb = None if tie_break is None else tie_break[:n]
    got = _rank_broken(n, broken, None if tb is None else np.array(tb))
    assert got.tolist() == ref_rank_broken(lists, tb)
