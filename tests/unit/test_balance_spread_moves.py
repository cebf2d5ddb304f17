"""EvenCpuSpread's move search over (VM x destination) arrays picks what trying each VM of the
busiest hosts in turn on every destination picks: the same VM, source, candidates and gain."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, table, vm_report
from vmsched.contracts import VmReport
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import FloatArray, HostTable, IndexArray
from vmsched.scheduling.units.balance_load import cpu_hunger, destination_mask, effective_load
from vmsched.scheduling.units.balance_spread_moves import MAX_SOURCES, excess, search
from vmsched.scheduling.units.helpers import max_scheduling_memory_mb

T = 1_700_000_000.0
vmr = partial(vm_report, CLUSTER)


def _end(ends: list[int], dest: IndexArray, load: FloatArray, none: float) -> FloatArray:
    first = float(load[ends[0]]) if ends else none
    second = float(load[ends[1]]) if len(ends) > 1 else none
    out: FloatArray = np.where(dest == ends[0], second, first) if ends else np.full(len(dest), none)
    return out


def reference(
    hosts: HostTable, vms: list[VmReport], load: FloatArray, order: list[int], band: tuple[float, float], margin: float
) -> tuple[tuple[str, str, tuple[str, ...], float, float] | None, float]:
    """The scan the unit ran before: each source in turn, each of its VMs on every destination."""
    lo, hi = band
    cpus = hosts.effective_cpus
    sched = max_scheduling_memory_mb(hosts)
    dest = np.flatnonzero(destination_mask(hosts) & (cpus > 0))
    spread = float(load[order[-1]] - load[order[0]])
    highs, lows = order[::-1][:3], order[:3]
    best: tuple[float, float] | None = None
    pick = None
    best_gain = -math.inf
    sources = 0
    for s in order[::-1][:20]:
        movable = [v for v in vms if v.host_id == hosts.ids[s]] if cpus[s] > 0 else []
        if not movable:
            continue
        sources += 1
        if sources > MAX_SOURCES:
            break
        for vm in movable:
            hunger = cpu_hunger(vm)
            new_src = float(load[s]) - hunger / float(cpus[s])
            new_dst = load[dest] + hunger / cpus[dest]
            fits = (new_dst <= 80.0) & (sched[dest] - float(vm_cost(vm).mem_mb) > 0.0) & (dest != s)
            gain = (excess(float(load[s]), lo, hi) - excess(new_src, lo, hi)) + (
                excess(load[dest], lo, hi) - excess(new_dst, lo, hi)
            )
            rest_max = _end([i for i in highs if i != s], dest, load, -math.inf)
            rest_min = _end([i for i in lows if i != s], dest, load, math.inf)
            top = np.maximum(np.maximum(rest_max, new_dst), new_src)
            narrowed = spread - (top - np.minimum(np.minimum(rest_min, new_dst), new_src))
            ok = fits & (narrowed >= 0.0)
            if not ok.any():
                continue
            best_gain = max(best_gain, float(gain[ok].max()))
            good = ok & (gain >= margin)
            if not good.any():
                continue
            k = int(np.lexsort((-narrowed[good], -gain[good]))[0])
            score = (float(gain[good][k]), float(narrowed[good][k]))
            if best is None or score > best:
                best = score
                names = tuple(hosts.ids[int(d)] for d in dest[good])
                pick = (vm.vm_id, hosts.ids[s], names, *score)
    return pick, best_gain


hosts_st = st.lists(
    st.tuples(st.sampled_from([8, 32, 64]), st.floats(0, 90), st.sampled_from([4096, 65536])), min_size=2, max_size=7
)
vms_st = st.lists(st.tuples(st.integers(0, 6), st.sampled_from([1, 2, 4, 8, 16]), st.floats(0, 100)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(hosts_st, vms_st, st.sampled_from([4.0, 6.0, 8.0]), st.sampled_from([0.5, 1.0, 3.0]))
def test_the_array_search_picks_what_the_scan_picked(
    specs: list[tuple[int, float, int]], placed: list[tuple[int, int, float]], threshold: float, margin: float
) -> None:
    states = [
        host(f"h{i}", cpu_cores=c, cpu_usage_pct=load, physical_mem_mb=mem, mem_free_mb=mem, vm_count=1)
        for i, (c, load, mem) in enumerate(specs)
    ]
    hosts = replace(table(*states), as_of=T)
    vms = [
        vmr(f"v{n}", f"h{h % len(specs)}", vcpus=vcpus, cpu_usage_pct=pct, mem_mb=2048 * vcpus)
        for n, (h, vcpus, pct) in enumerate(placed)
    ]
    load = effective_load(hosts)
    order = [int(i) for i in np.argsort(load, kind="stable")]
    mean = float(load.mean())
    band = (mean - threshold / 2, mean + threshold / 2)
    found = search(hosts, vms, load, order, band, 80.0, margin)
    expected, best_gain = reference(hosts, vms, load, order, band, margin)
    assert found.best_gain == best_gain
    if expected is None:
        assert found.move is None
        return
    move = found.move
    assert move is not None
    got = (move.vm.vm_id, hosts.ids[move.source], tuple(hosts.ids[d] for d in move.targets), move.gain, move.narrowed)
    assert got == expected
