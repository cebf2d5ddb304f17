"""The balance units decide exactly as the straightforward version they replaced, on random small clusters.

units/balance.py finds a migration without scanning every VM for every source host (VMs grouped by
host once, hosts and VMs that cannot fit ruled out by bounds before the exact test). The reference
below is that straightforward version, kept verbatim apart from names: for each source in order, its
movable VMs by a scan of all VMs, least CPU-hungry first, each tested against every destination on
the whole table. Both must agree on the VM, the source, the candidates (in order), the reason and
the power advice. The clusters sit on the thresholds (loads at 64 / 80, memory near the limits,
hosts without CPUs, down and disabled hosts, pending entries) so every branch is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, pend, table, vm_report
from vmsched.contracts import HostState, HostStatus, VmReport
from vmsched.scheduling.balancing import balance_pass, movable_vms
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units import get_unit, validate_properties
from vmsched.scheduling.units.balance import (
    UTILIZATION_THRESHOLD_PCT,
    cpu_hunger,
    effective_load,
    even_distribution_balance,
    even_vm_count_balance,
    ha_reservation_balance,
    occupied_slots,
    power_saving_balance,
    sustained_for,
)
from vmsched.scheduling.units.balance_load import by_hunger as _by_hunger
from vmsched.scheduling.units.balance_load import cpu_reason as _cpu_reason
from vmsched.scheduling.units.balance_load import destination_mask as _destination_mask
from vmsched.scheduling.units.balance_load import mem_limit as _mem_limit
from vmsched.scheduling.units.balance_load import memory_reason as _memory_reason
from vmsched.scheduling.units.balance_load import memory_sources as _memory_sources
from vmsched.scheduling.units.balance_load import minutes as _minutes
from vmsched.scheduling.units.balance_load import order_by as _order
from vmsched.scheduling.units.balance_load import over_utilized as _over_utilized
from vmsched.scheduling.units.balance_power import _power_advice
from vmsched.scheduling.units.base import BalanceFn, BalanceOutcome, Migration, Props, VmsByHost, prop_bool, prop_int
from vmsched.scheduling.units.helpers import VCPU_CONSUMPTION_PCT, fmt_num, max_scheduling_memory_mb

T = 1_700_000_000.0


# ============================================================================ reference
def ref_vms_on(vms: Sequence[VmReport], host_id: str) -> list[VmReport]:
    return [v for v in vms if v.host_id == host_id]


@dataclass(frozen=True)
class RefFit:
    high: float
    min_free_mb: float

    def hosts_for(self, hosts: HostTable, vm: VmReport, allowed: BoolArray, load: FloatArray) -> list[int]:
        cpus = hosts.effective_cpus
        known = cpus > 0
        predicted = cpu_hunger(vm) / np.where(known, cpus, 1.0)
        mem_after = max_scheduling_memory_mb(hosts) - float(vm_cost(vm).mem_mb)
        ok = allowed & known & (load + predicted <= self.high) & (mem_after > self.min_free_mb)
        return [int(i) for i in np.flatnonzero(ok)]


def ref_find(
    hosts: HostTable,
    vms: Sequence[VmReport],
    sources: Sequence[int],
    destinations: BoolArray,
    fit: RefFit,
    load: FloatArray,
    reason: Callable[[int], str],
) -> Migration | None:
    for s in sources:
        allowed = destinations.copy()
        allowed[s] = False
        if not allowed.any():
            continue
        for vm in _by_hunger(ref_vms_on(vms, hosts.ids[s])):
            fits = fit.hosts_for(hosts, vm, allowed, load)
            if fits:
                return Migration(vm.vm_id, hosts.ids[s], tuple(hosts.ids[i] for i in fits), reason(s))
    return None


def ref_even_distribution(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    if int(np.count_nonzero(hosts.up)) < 2:
        return BalanceOutcome()
    high = float(prop_int(props, "HighUtilization", 80))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", 2)
    max_free = _mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = _mem_limit(props, "MinFreeMemoryForUnderUtilized", 0.0)
    load = effective_load(hosts)
    fit = RefFit(high, max_free)
    dest_ok = _destination_mask(hosts)
    over, over_for = _over_utilized(hosts, high, duration_s)
    low = min(UTILIZATION_THRESHOLD_PCT * high / 100.0, high - VCPU_CONSUMPTION_PCT)
    cpu_sources = _order(over, load, descending=True)
    reason = _cpu_reason(hosts, high, over_for)
    migration = ref_find(hosts, vms, cpu_sources, dest_ok & (load < low), fit, load, reason)
    if migration is None:
        sched = max_scheduling_memory_mb(hosts)
        mem_sources = _memory_sources(hosts, max_free, 2)
        mem_reason = _memory_reason(hosts, max_free)
        migration = ref_find(hosts, vms, mem_sources, dest_ok & (sched > min_free), fit, load, mem_reason)
    return BalanceOutcome(migration)


def ref_power_saving(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    migration = ref_power_saving_migration(hosts, vms, props)
    return BalanceOutcome(migration, _power_advice(hosts, props, migration))


def ref_power_saving_migration(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> Migration | None:
    if int(np.count_nonzero(hosts.up)) < 2:
        return None
    high = float(prop_int(props, "HighUtilization", 80))
    low = float(prop_int(props, "LowUtilization", 20))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", 2)
    max_free = _mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = _mem_limit(props, "MinFreeMemoryForUnderUtilized", math.inf)
    load = effective_load(hosts)
    fit = RefFit(high, max_free)
    dest_ok = _destination_mask(hosts)
    over, over_for = _over_utilized(hosts, high, duration_s)
    cpu_sources = _order(over, load, descending=True)
    reason = _cpu_reason(hosts, high, over_for)
    migration = ref_find(hosts, vms, cpu_sources, dest_ok & ~over, fit, load, reason)
    if migration is not None:
        return migration
    under_for = sustained_for(hosts, below=low)
    with np.errstate(invalid="ignore"):
        under = hosts.up & (hosts.vm_count > 0) & (under_for >= duration_s)
    occupied = (hosts.vm_count + hosts.pending_vm_count) > 0

    def under_reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} CPU {fmt_num(round(float(load[i]), 1))}% < LowUtilization {fmt_num(low)}%"
            f" for {_minutes(float(under_for[i]))}: evacuating it"
        )

    for s in _order(under, load, descending=False):
        healthy = dest_ok & ~over & ~under & occupied & (load >= low)
        for dest in (healthy, dest_ok & ~over & occupied & (load >= load[s])):
            found = ref_find(hosts, vms, [s], dest, fit, load, under_reason)
            if found is not None:
                return found
    sched = max_scheduling_memory_mb(hosts)
    tight_sources = _memory_sources(hosts, max_free, 2)
    sources = tight_sources + _order(hosts.up & (sched > min_free) & (hosts.vm_count >= 1), sched, True)
    tight = _memory_reason(hosts, max_free)

    def mem_reason(i: int) -> str:
        if i in tight_sources:
            return tight(i)
        return (
            f"host {hosts.ids[i]} free scheduling memory {fmt_num(round(float(sched[i])))} MB"
            f" > MinFreeMemoryForUnderUtilized {fmt_num(min_free)} MB: evacuating it"
        )

    return ref_find(hosts, vms, sources, dest_ok & (sched > max_free), fit, load, mem_reason)


def ref_even_vm_count(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    high = prop_int(props, "HighVmCount", 10)
    threshold = prop_int(props, "MigrationThreshold", 5)
    slots = occupied_slots(hosts, props)
    up = np.flatnonzero(hosts.up)
    if len(up) == 0:
        return BalanceOutcome()
    worst = int(up[int(np.argmax(slots[up]))])
    worst_slots = float(slots[worst])
    if worst_slots <= high:
        return BalanceOutcome()
    targets = _destination_mask(hosts) & (worst_slots - slots >= threshold)
    movable = _by_hunger(ref_vms_on(vms, hosts.ids[worst]))
    if not targets.any() or not movable:
        return BalanceOutcome()
    reason = (
        f"host {hosts.ids[worst]} has {fmt_num(worst_slots)} VM slots > HighVmCount {high};"
        f" targets have at least MigrationThreshold {threshold} fewer (<= {fmt_num(worst_slots - threshold)})"
    )
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[worst], candidates, reason))


def ref_ha_reservation(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    up = hosts.up
    n_up = int(np.count_nonzero(up))
    if not prop_bool(props, "HaReservation", False) or n_up < 2:
        return BalanceOutcome()
    over_pct = prop_int(props, "OverUtilization", 200)
    counts = np.maximum(hosts.ha_vm_count, 0.0)
    total = float(counts[up].sum())
    optimal = math.ceil(total / n_up)
    limit = optimal * over_pct / 100.0
    targets = _destination_mask(hosts) & (counts < optimal)
    if not targets.any():
        return BalanceOutcome()
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    for s in _order(up & (counts > limit), counts, descending=True):
        movable = _by_hunger([v for v in ref_vms_on(vms, hosts.ids[s]) if v.ha])
        if movable:
            reason = (
                f"host {hosts.ids[s]} runs {fmt_num(counts[s])} HA VMs > optimal {optimal}"
                f" x OverUtilization {over_pct}% = {fmt_num(limit)}"
            )
            return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[s], candidates, reason))
    return BalanceOutcome()


# (unit name, optimized, reference)
PAIRS: list[tuple[str, BalanceFn, BalanceFn]] = [
    ("OptimalForEvenCpuDistribution", even_distribution_balance, ref_even_distribution),
    ("OptimalForCpuPowerSaving", power_saving_balance, ref_power_saving),
    ("OptimalForEvenGuestDistribution", even_vm_count_balance, ref_even_vm_count),
    ("OptimalForHaReservation", ha_reservation_balance, ref_ha_reservation),
]


# ============================================================================ random clusters
LOADS = [0.0, 5.0, 15.0, 19.9, 20.0, 45.0, 63.9, 64.0, 70.0, 79.9, 80.0, 90.0, 100.0]


@st.composite
def host_states(draw: st.DrawFn, i: int) -> HostState:
    load = draw(st.sampled_from(LOADS))
    steps = draw(st.integers(0, 6))
    # Samples every minute up to T (or ending earlier), each near the host's load.
    end = T - draw(st.sampled_from([0.0, 0.0, 90.0]))
    series = [(end - 60.0 * (steps - k), draw(st.sampled_from([load, *LOADS]))) for k in range(steps + 1)]
    vm_count = draw(st.integers(0, 12))
    return host(
        f"h{i}",
        status=draw(st.sampled_from([HostStatus.UP] * 5 + [HostStatus.DOWN, HostStatus.MAINTENANCE])),
        enabled=draw(st.booleans() | st.just(True)),
        is_spm=draw(st.booleans()) and i == 0,
        cpu_cores=draw(st.sampled_from([0, 1, 2, 4, 4, 8])),
        cpu_threads=draw(st.sampled_from([0, 8, 16])),
        cpu_usage_pct=load,
        cpu_samples=series if steps else [],
        physical_mem_mb=draw(st.sampled_from([2048, 4096, 8192])),
        mem_committed_mb=draw(st.sampled_from([0, 1000, 3000, 4000, 6000])),
        vm_count=vm_count,
        ha_vm_count=draw(st.integers(0, vm_count)),
    )


@st.composite
def clusters(draw: st.DrawFn) -> tuple[HostTable, list[VmReport], dict[str, str]]:
    n = draw(st.integers(1, 7))
    states = [draw(host_states(i)) for i in range(n)]
    ids = [f"h{i}" for i in range(n)]
    vms = [
        vm_report(
            CLUSTER,
            f"vm{j}",
            draw(st.sampled_from([*ids, "elsewhere"])),
            mem_mb=draw(st.sampled_from([256, 512, 1024, 3000])),
            overhead_mb=draw(st.sampled_from([0, 64])),
            vcpus=draw(st.integers(1, 4)),
            cpu_usage_pct=draw(st.sampled_from([0.0, 5.0, 10.0, 25.0, 50.0, 100.0])),
            ha=draw(st.booleans()),
        )
        for j in range(draw(st.integers(0, 24)))
    ]
    pending = [
        pend(draw(st.sampled_from(ids)), mem_mb=draw(st.sampled_from([0, 512, 2048])), vcpus=draw(st.integers(0, 4)))
        for _ in range(draw(st.integers(0, 3)))
    ]
    t = table(
        *states,
        overcommit=draw(st.sampled_from([100, 150])),
        threads=draw(st.booleans()),
        pending=pending,
    )
    props: dict[str, Any] = {
        "HighUtilization": draw(st.sampled_from(["50", "64", "80", "90"])),
        "LowUtilization": draw(st.sampled_from(["0", "10", "20", "45"])),
        "CpuOverCommitDurationMinutes": draw(st.sampled_from(["1", "2", "3"])),
        "MaxFreeMemoryForOverUtilized": draw(st.sampled_from([None, "100", "1000", "3000", "7000"])),
        "MinFreeMemoryForUnderUtilized": draw(st.sampled_from([None, "100", "2000", "5000"])),
        "EnableAutomaticHostPowerManagement": draw(st.sampled_from(["true", "false"])),
        "HostsInReserve": draw(st.sampled_from(["0", "1", "3"])),
        "HighVmCount": draw(st.sampled_from(["0", "3", "10"])),
        "MigrationThreshold": draw(st.sampled_from(["2", "5"])),
        "SpmVmGrace": draw(st.sampled_from(["0", "5"])),
        "HaReservation": draw(st.sampled_from(["true", "false"])),
        "OverUtilization": draw(st.sampled_from(["100", "150", "200"])),
    }
    as_of = draw(st.sampled_from([T, T + 30.0, math.nan]))
    return replace(t, as_of=as_of), vms, {k: v for k, v in props.items() if v is not None}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters())
def test_units_decide_as_the_straightforward_version(cluster: tuple[HostTable, list[VmReport], dict[str, str]]) -> None:
    hosts, vms, given_props = cluster
    for name, fast, reference in PAIRS:
        props = validate_properties(get_unit(name), given_props)
        assert fast(hosts, vms, props) == reference(hosts, vms, props), name


def _host_by_host(vms: list[VmReport]) -> VmsByHost:
    """The VMs as the simulator holds them: host id -> VM id -> report."""
    grouped: dict[str, dict[str, VmReport]] = {}
    for v in vms:
        assert v.host_id is not None
        grouped.setdefault(v.host_id, {})[v.vm_id] = v
    return VmsByHost(grouped)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), in_flight=st.sets(st.sampled_from([f"vm{j}" for j in range(24)])), data=st.data())
def test_units_given_the_vms_host_by_host_decide_as_given_a_list(
    cluster: tuple[HostTable, list[VmReport], dict[str, str]], in_flight: set[str], data: st.DataObject
) -> None:
    """The simulator passes its VMs host by host (a source host's VMs read without walking all):
    the movable ones, and every unit's pick, are those of the same VMs as a list."""
    hosts, vms, given_props = cluster
    resting = data.draw(st.sets(st.sampled_from([f"vm{j}" for j in range(24)])))
    listed = list(movable_vms(vms, in_flight, resting))
    grouped = movable_vms(_host_by_host(vms), in_flight, resting)
    assert isinstance(grouped, VmsByHost)
    assert sorted(v.vm_id for v in grouped) == sorted(v.vm_id for v in listed)
    for h in {v.host_id for v in vms} | {"nowhere"}:
        assert grouped.on(str(h)) == [v for v in listed if v.host_id == h]
    for name, fast, _ in PAIRS:
        unit = get_unit(name)
        props = validate_properties(unit, given_props)
        assert fast(hosts, grouped, props) == fast(hosts, listed, props), name
        assert balance_pass(unit, props, hosts, grouped) == balance_pass(unit, props, hosts, listed), name


def test_a_pass_that_walks_many_sources_agrees() -> None:
    """Every host over-utilized and short of memory, no VM fitting anywhere but on the last one:
    the pass groups the VMs by host and skips hosts by their bounds, and still finds that VM."""
    n = 12
    states = [
        host(
            f"h{i}",
            cpu_usage_pct=90.0 if i < n - 1 else 10.0,
            cpu_samples=[(T - 300.0, 90.0), (T, 90.0)] if i < n - 1 else [(T, 10.0)],
            vm_count=3,
            mem_committed_mb=3900 if i < n - 2 else 0,
        )
        for i in range(n)
    ]
    vms = [
        vm_report(CLUSTER, f"vm{i}-{k}", f"h{i}", mem_mb=3000 if i < n - 2 else 256, vcpus=1, cpu_usage_pct=10.0)
        for i in range(n)
        for k in range(3)
    ]
    t = replace(table(*states), as_of=T)
    for name, fast, reference in PAIRS:
        props = validate_properties(get_unit(name), {"MaxFreeMemoryForOverUtilized": "500", "HaReservation": "true"})
        expected = reference(t, vms, props)
        assert fast(t, vms, props) == expected, name
    assert ref_even_distribution(t, vms, validate_properties(get_unit(PAIRS[0][0]), {})).migration is not None
