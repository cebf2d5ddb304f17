"""Balance units (units/balance.py): hand-computed cases, oVirt's even-VM-count worked example, invariants.

Hosts come from tests.factories (4 cores, 4096 MB, no reserve, idle unless told otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, pend, table, vm_report
from vmsched.contracts import ClusterReport, HostState, HostStatus, VmReport
from vmsched.errors import InvalidProperty
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units.balance import (
    POWER_OFF,
    POWER_ON,
    even_distribution_balance,
    even_vm_count_balance,
    ha_reservation_balance,
    occupied_slots,
    power_saving_balance,
)
from vmsched.scheduling.units.base import validate_properties
from vmsched.scheduling.units.weights import EVEN_CPU, EVEN_GUEST, HA_RESERVATION, POWER_SAVING_CPU

T = 1_700_000_000.0


def at(t: HostTable, as_of: float = T) -> HostTable:
    """The table as of `as_of` (pending entries kept)."""
    return replace(t, as_of=as_of)


def samples(load: float, minutes: float, step: float = 60.0, before: float | None = None) -> list[tuple[float, float]]:
    """Samples at `load` every `step` s over the last `minutes` up to T; one earlier sample at `before`."""
    n = int(minutes * 60 / step)
    out = [(T - minutes * 60 + k * step, load) for k in range(n + 1)]
    if before is not None:
        out.insert(0, (T - minutes * 60 - step, before))
    return out


#: A running 512 MB 1-vCPU VM of the cluster, idle unless told otherwise.
vmr = partial(vm_report, CLUSTER, mem_mb=512, vcpus=1)


# ============================================================================ even distribution
def cpu_cluster(**h1: Any) -> HostTable:
    base: dict[str, Any] = {"cpu_usage_pct": 90, "cpu_samples": samples(90, 5, before=50), "vm_count": 3}
    base.update(h1)
    return at(
        table(
            host("h1", **base),
            host("h2", cpu_usage_pct=10, vm_count=1),
            host("h3", cpu_usage_pct=70, vm_count=1),  # not below min(0.8 x 80, 80 - 10) = 64
        )
    )


CPU_VMS = [
    vmr("a", "h1", cpu_usage_pct=50, vcpus=2),
    vmr("b", "h1", cpu_usage_pct=10, vcpus=2),
    vmr("c", "h1", cpu_usage_pct=5, vcpus=1),
]


def test_even_cpu_moves_least_hungry_vm_of_over_host_to_underutilized_hosts() -> None:
    out = even_distribution_balance(cpu_cluster(), CPU_VMS, {"HighUtilization": "80"})
    assert out.migration is not None
    assert out.migration.vm_id == "c"  # 5 x 1 = 5 < b 10 x 2 = 20 < a 100
    assert out.migration.source_host == "h1"
    assert out.migration.candidates == ("h2",)
    assert out.migration.reason == "host h1 CPU 90% >= HighUtilization 80% for 5 min"
    assert out.power == ()


def test_even_cpu_needs_the_duration() -> None:
    # over for 1 minute only (the sample before was under): default duration is 2 minutes
    t = cpu_cluster(cpu_samples=samples(90, 1, before=50))
    assert even_distribution_balance(t, CPU_VMS, {}).migration is None
    assert even_distribution_balance(t, CPU_VMS, {"CpuOverCommitDurationMinutes": "1"}).migration is not None


def test_even_cpu_threshold_is_inclusive_and_spm_share_counts() -> None:
    # 78% + SPM share 1 x 10 / 4 = 2.5 -> 80.5 >= 80
    t = cpu_cluster(cpu_samples=samples(78, 5), is_spm=True)
    assert even_distribution_balance(t, CPU_VMS, {}).migration is not None
    t = cpu_cluster(cpu_samples=samples(80, 5))
    assert even_distribution_balance(t, CPU_VMS, {}).migration is not None
    t = cpu_cluster(cpu_samples=samples(79, 5))
    assert even_distribution_balance(t, CPU_VMS, {}).migration is None


def test_even_cpu_skips_vm_that_would_push_destination_over_high() -> None:
    # h2 at 10%: a VM of hunger 400 (4 vCPUs at 100%) adds 100% on 4 CPUs -> 110 > 80
    vms = [
        vmr("big", "h1", cpu_usage_pct=100, vcpus=4),
        vmr("small", "h1", cpu_usage_pct=20, vcpus=4),
    ]  # small: +20 -> 30
    out = even_distribution_balance(cpu_cluster(), vms, {})
    assert out.migration is not None
    assert out.migration.vm_id == "small"
    out = even_distribution_balance(cpu_cluster(), vms[:1], {})
    assert out.migration is None


def test_even_cpu_memory_must_fit_destination() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=90, cpu_samples=samples(90, 5), vm_count=1),
            host("h2", cpu_usage_pct=10, mem_committed_mb=3600),  # 496 MB left
        )
    )
    assert even_distribution_balance(t, [vmr("a", "h1", mem_mb=500)], {}).migration is None  # 564 MB needed
    assert even_distribution_balance(t, [vmr("a", "h1", mem_mb=400)], {}).migration is not None  # 464 < 496


def test_even_cpu_busiest_source_first() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=85, cpu_samples=samples(85, 5), vm_count=1),
            host("h2", cpu_usage_pct=95, cpu_samples=samples(95, 5), vm_count=1),
            host("h3", cpu_usage_pct=0),
        )
    )
    vms = [vmr("a", "h1"), vmr("b", "h2")]
    out = even_distribution_balance(t, vms, {})
    assert out.migration is not None
    assert out.migration.source_host == "h2"
    # h2's VM is not movable: fall back to the next source
    out = even_distribution_balance(t, vms[:1], {})
    assert out.migration is not None
    assert out.migration.source_host == "h1"


@pytest.mark.parametrize(
    "case",
    ["balanced", "no_vms", "one_host", "no_samples", "all_equal", "destination_down"],
)
def test_even_cpu_no_migration(case: str) -> None:
    t = cpu_cluster()
    vms: Sequence[VmReport] = CPU_VMS
    if case == "balanced":
        t = at(table(host("h1", cpu_usage_pct=50, cpu_samples=samples(50, 5), vm_count=3), host("h2")))
    elif case == "no_vms":
        vms = []
    elif case == "one_host":
        t = at(table(host("h1", cpu_usage_pct=90, cpu_samples=samples(90, 5), vm_count=3)))
    elif case == "no_samples":
        t = cpu_cluster(cpu_samples=[])
    elif case == "all_equal":
        t = at(table(*(host(f"h{i}", cpu_usage_pct=90, cpu_samples=samples(90, 5), vm_count=3) for i in (1, 2, 3))))
    elif case == "destination_down":
        t = at(
            table(
                host("h1", cpu_usage_pct=90, cpu_samples=samples(90, 5), vm_count=3),
                host("h2", cpu_usage_pct=0, status=HostStatus.DOWN),
                host("h3", cpu_usage_pct=0, enabled=False),
            )
        )
    assert even_distribution_balance(t, vms, {}).migration is None


def test_even_cpu_pending_counts_on_destinations() -> None:
    # h2 idle but 20 pending vCPUs x 10% / 4 CPUs = 50% >= 64? no: 50 < 64 still a destination;
    # 28 pending vCPUs -> 70% >= 64: not a destination
    base = [host("h1", cpu_usage_pct=90, cpu_samples=samples(90, 5), vm_count=1), host("h2")]
    t = at(table(*base, pending=[pend("h2", vcpus=20)]))
    assert even_distribution_balance(t, [vmr("a", "h1")], {}).migration is not None
    t = at(table(*base, pending=[pend("h2", vcpus=28)]))
    assert even_distribution_balance(t, [vmr("a", "h1")], {}).migration is None


def test_even_memory_variant() -> None:
    t = at(
        table(
            host("h1", vm_count=2, mem_committed_mb=3800),  # 296 MB free for scheduling
            host("h2", mem_committed_mb=1000),  # 3096
            host("h3", mem_committed_mb=2900),  # 1196
        )
    )
    vms = [vmr("a", "h1", cpu_usage_pct=20, mem_mb=1000), vmr("b", "h1", cpu_usage_pct=10, mem_mb=700)]
    props = {"MaxFreeMemoryForOverUtilized": "500", "MinFreeMemoryForUnderUtilized": "2000"}
    out = even_distribution_balance(t, vms, props)
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.source_host, out.migration.candidates) == ("b", "h1", ("h2",))
    assert out.migration.reason == "host h1 free scheduling memory 296 MB < MaxFreeMemoryForOverUtilized 500 MB"
    # not set: no memory balancing
    assert even_distribution_balance(t, vms, {}).migration is None
    # one VM only on the source: oVirt needs more than one
    t1 = at(table(host("h1", vm_count=1, mem_committed_mb=3800), host("h2")))
    assert even_distribution_balance(t1, vms, props).migration is None


# ============================================================================ power saving
def test_power_saving_evacuates_least_loaded_underutilized_host() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=5, cpu_samples=samples(5, 5), vm_count=1),
            host("h2", cpu_usage_pct=10, cpu_samples=samples(10, 5), vm_count=1),
            host("h3", cpu_usage_pct=50, cpu_samples=samples(50, 5), vm_count=4),
            host("h4", cpu_usage_pct=79, vm_count=4),  # +5% would exceed 80
        )
    )
    vms = [vmr("a", "h1", cpu_usage_pct=20, vcpus=1), vmr("b", "h2", cpu_usage_pct=10)]
    out = power_saving_balance(t, vms, {"LowUtilization": "20"})
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.source_host, out.migration.candidates) == ("a", "h1", ("h3",))
    assert out.migration.reason == "host h1 CPU 5% < LowUtilization 20% for 5 min: evacuating it"


def test_power_saving_packs_onto_busier_underutilized_host_when_no_healthy_host() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=5, cpu_samples=samples(5, 5), vm_count=1),
            host("h2", cpu_usage_pct=10, cpu_samples=samples(10, 5), vm_count=1),
            host("h3"),  # empty: never a packing target
        )
    )
    out = power_saving_balance(t, [vmr("a", "h1"), vmr("b", "h2")], {})
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.candidates) == ("a", ("h2",))


def test_power_saving_relieves_overutilized_first() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=5, cpu_samples=samples(5, 5), vm_count=1),
            host("h2", cpu_usage_pct=95, cpu_samples=samples(95, 5), vm_count=2),
            host("h3", cpu_usage_pct=50, vm_count=2),
        )
    )
    out = power_saving_balance(t, [vmr("a", "h1"), vmr("b", "h2")], {})
    assert out.migration is not None
    assert out.migration.source_host == "h2"
    assert out.migration.candidates == ("h1", "h3")  # any host not over-utilized that stays <= High


def test_power_saving_nothing_to_do() -> None:
    t = at(table(host("h1", cpu_usage_pct=50, cpu_samples=samples(50, 5), vm_count=2), host("h2", cpu_usage_pct=40)))
    out = power_saving_balance(t, [vmr("a", "h1")], {})
    assert out == type(out)()


def test_power_saving_min_free_memory_alone_evacuates_underused_host() -> None:
    # oVirt treats a missing MaxFreeMemoryForOverUtilized as 0: with only the under-utilization
    # threshold set, a host with more free scheduling memory than it is still emptied onto any
    # host with memory left.
    t = at(
        table(
            host("h1", vm_count=1, mem_committed_mb=1000),  # 3096 MB free for scheduling > 2000
            host("h2", vm_count=2, mem_committed_mb=2900),  # 1196
        )
    )
    vms = [vmr("a", "h1", mem_mb=512), vmr("b", "h2"), vmr("c", "h2")]
    out = power_saving_balance(t, vms, {"MinFreeMemoryForUnderUtilized": "2000"})
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.source_host, out.migration.candidates) == ("a", "h1", ("h2",))
    assert out.migration.reason == (
        "host h1 free scheduling memory 3096 MB > MinFreeMemoryForUnderUtilized 2000 MB: evacuating it"
    )
    # the destination must keep more than MaxFree (0) after the VM (512 + 64 MB): 500 - 576 does not
    tight = at(table(host("h1", vm_count=1, mem_committed_mb=1000), host("h2", vm_count=2, mem_committed_mb=3596)))
    assert power_saving_balance(tight, vms, {"MinFreeMemoryForUnderUtilized": "2000"}).migration is None
    # neither threshold: no memory balancing (an unset MinFree means no host has too much)
    assert power_saving_balance(t, vms, {}).migration is None


def test_memory_balancing_without_max_free_never_treats_a_host_as_short() -> None:
    # oVirt's max scheduling memory never goes below 0, so an unset MaxFree (0) makes no host a
    # memory source, even an overcommitted one running several VMs.
    t = at(
        table(
            host("h1", vm_count=2, mem_committed_mb=5000),  # -904 MB: overcommitted
            host("h2"),
        )
    )
    vms = [vmr("a", "h1"), vmr("b", "h1")]
    assert even_distribution_balance(t, vms, {"MinFreeMemoryForUnderUtilized": "100"}).migration is None
    assert power_saving_balance(t, vms, {}).migration is None
    out = even_distribution_balance(t, vms, {"MaxFreeMemoryForOverUtilized": "1"})
    assert out.migration is not None
    assert (out.migration.source_host, out.migration.candidates) == ("h1", ("h2",))


def test_power_advice_off_beyond_reserve_and_on_when_short() -> None:
    t = at(
        table(
            host("h1", cpu_usage_pct=50, vm_count=2),
            host("h2", is_spm=True),  # empty but SPM: not powered off
            host("h3"),
            host("h4"),
            host("h5", status=HostStatus.DOWN),
        )
    )
    on = {"EnableAutomaticHostPowerManagement": "true"}
    out = power_saving_balance(t, [], {**on, "HostsInReserve": "1"})
    assert [(p.host_id, p.action) for p in out.power] == [("h3", POWER_OFF)]
    assert out.power[0].reason == "3 empty Up hosts > HostsInReserve 1: host h3 runs no VM"
    assert power_saving_balance(t, [], {**on, "HostsInReserve": "3"}).power == ()
    out = power_saving_balance(t, [], {**on, "HostsInReserve": "4"})
    assert [(p.host_id, p.action) for p in out.power] == [("h5", POWER_ON)]
    # disabled (the default): no advice at all
    assert power_saving_balance(t, [], {"HostsInReserve": "0"}).power == ()


def test_power_advice_pending_vm_makes_host_non_empty() -> None:
    t = at(table(host("h1", vm_count=1), host("h2"), pending=[pend("h2", mem_mb=10)]))
    out = power_saving_balance(t, [], {"EnableAutomaticHostPowerManagement": "true"})
    assert out.power == ()


def test_power_advice_short_with_no_down_host() -> None:
    t = at(table(host("h1", vm_count=1), host("h2", vm_count=1)))
    out = power_saving_balance(t, [], {"EnableAutomaticHostPowerManagement": "true", "HostsInReserve": "2"})
    assert out.power == ()


# ============================================================================ even VM count
def counts_table(counts: Sequence[int], spm: int | None = None, pending: Sequence[int] = ()) -> HostTable:
    states = [host(f"VDS{i + 1}", vm_count=c, is_spm=(i == spm)) for i, c in enumerate(counts)]
    pend_entries = [pend(f"VDS{i + 1}") for i, n in enumerate(pending) for _ in range(n)]
    return at(table(*states, pending=pend_entries))


def vms_for(counts: Sequence[int]) -> list[VmReport]:
    """One VM per running slot; on VDS1 they are VM1, VM2, ... in increasing CPU usage."""
    out = []
    for i, c in enumerate(counts):
        for k in range(c):
            name = f"VM{k + 1}" if i == 0 else f"VDS{i + 1}-vm{k + 1}"
            out.append(vmr(name, f"VDS{i + 1}", cpu_usage_pct=float(k + 1)))
    return out


#: oVirt's even-VM-count worked example (two balancing iterations). Chosen configuration:
#: HighVmCount 10, MigrationThreshold 4, SpmVmGrace 0 (no SPM), VDS1..VDS5 running 12, 10, 8, 9,
#: 6 VMs. The "balancing window" is [top - MigrationThreshold, top]: 12 -> 8, then 11 -> 7
#: ("minimum is now 7"), then 10 -> 6.
EVEN_COUNT_EXAMPLE_PROPS = {"HighVmCount": "10", "MigrationThreshold": "4", "SpmVmGrace": "0"}
EVEN_COUNT_EXAMPLE_COUNTS = [12, 10, 8, 9, 6]


def test_ovirt_even_vm_count_worked_example() -> None:
    counts = list(EVEN_COUNT_EXAMPLE_COUNTS)
    vms = vms_for(counts)

    def step() -> tuple[str, str, tuple[str, ...]] | None:
        out = even_vm_count_balance(counts_table(counts), vms, EVEN_COUNT_EXAMPLE_PROPS)
        if out.migration is None:
            return None
        m = out.migration
        # simulate the migration: the first candidate, as oVirt's example does ("whatever comes first")
        target = m.candidates[0]
        src, dst = int(m.source_host[3:]) - 1, int(target[3:]) - 1
        counts[src] -= 1
        counts[dst] += 1
        vms[:] = [v for v in vms if v.vm_id != m.vm_id]
        return m.vm_id, m.source_host, m.candidates

    # 1. VM1 moves from VDS1 (12 slots > 10) to VDS3; VDS5 is also a target (12 - 6 >= 4)
    assert step() == ("VM1", "VDS1", ("VDS3", "VDS5"))
    assert counts == [11, 10, 9, 9, 6]  # top 11, window minimum 11 - 4 = 7
    # 2. VM2 moves to VDS5, the only host outside the window (11 - 6 >= 4; VDS3 now 9 > 7)
    assert step() == ("VM2", "VDS1", ("VDS5",))
    assert counts == [10, 10, 9, 9, 7]  # top 10, minimum 6: every host inside the window
    # 3. balanced
    assert step() is None
    assert (
        even_vm_count_balance(counts_table(counts), vms, {**EVEN_COUNT_EXAMPLE_PROPS, "HighVmCount": "9"}).migration
        is None
    )


def test_even_vm_count_reason_and_spm_grace() -> None:
    # VDS2 is SPM: 7 VMs + grace 5 = 12 slots: the worst host, though VDS1 runs more VMs
    t = counts_table([9, 7, 3], spm=1)
    vms = [vmr("x", "VDS1"), vmr("y", "VDS2", cpu_usage_pct=30), vmr("z", "VDS2", cpu_usage_pct=20)]
    out = even_vm_count_balance(t, vms, {"HighVmCount": "10", "MigrationThreshold": "5", "SpmVmGrace": "5"})
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.source_host, out.migration.candidates) == ("z", "VDS2", ("VDS3",))
    assert out.migration.reason == (
        "host VDS2 has 12 VM slots > HighVmCount 10; targets have at least MigrationThreshold 5 fewer (<= 7)"
    )
    assert occupied_slots(t, {"SpmVmGrace": "5"}).tolist() == [9.0, 12.0, 3.0]


def test_even_vm_count_pending_counts_as_slots() -> None:
    t = counts_table([10, 5], pending=[1, 0])  # 11 slots > 10
    assert even_vm_count_balance(t, [vmr("a", "VDS1")], {}).migration is not None
    t = counts_table([10, 5], pending=[0, 2])  # 10 slots: not over
    assert even_vm_count_balance(t, [vmr("a", "VDS1")], {}).migration is None
    t = counts_table([11, 5], pending=[0, 2])  # 11 - 7 = 4 < 5: no target
    assert even_vm_count_balance(t, [vmr("a", "VDS1")], {}).migration is None


def test_even_vm_count_edges() -> None:
    props = {"HighVmCount": "10", "MigrationThreshold": "5", "SpmVmGrace": "0"}
    # exactly HighVmCount: not over (oVirt: "more than HighVMSCount")
    assert even_vm_count_balance(counts_table([10, 0]), [vmr("a", "VDS1")], props).migration is None
    # one host: no target
    assert even_vm_count_balance(counts_table([20]), [vmr("a", "VDS1")], props).migration is None
    # all equal
    assert even_vm_count_balance(counts_table([12, 12, 12]), [vmr("a", "VDS1")], props).migration is None
    # the worst host has no movable VM: nothing (oVirt does not look at another host)
    t = counts_table([12, 11, 0])
    assert even_vm_count_balance(t, [vmr("b", "VDS2")], props).migration is None
    # ties: the first of the busiest
    out = even_vm_count_balance(t, [vmr("a", "VDS1")], props)
    assert out.migration is not None
    assert out.migration.source_host == "VDS1"
    out = even_vm_count_balance(counts_table([12, 12, 0]), [vmr("a", "VDS1"), vmr("b", "VDS2")], props)
    assert out.migration is not None
    assert out.migration.source_host == "VDS1"


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    spm=st.none() | st.integers(0, 7),
    high=st.integers(0, 20),
    threshold=st.integers(2, 12),
    grace=st.integers(0, 6),
    movable=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_even_vm_count_invariants(
    counts: list[int], spm: int | None, high: int, threshold: int, grace: int, movable: list[bool]
) -> None:
    t = counts_table(counts, spm=spm)
    vms = [v for v in vms_for(counts) if movable[int(str(v.host_id)[3:]) - 1]]
    props = {"HighVmCount": str(high), "MigrationThreshold": str(threshold), "SpmVmGrace": str(grace)}
    slots = dict(zip(t.ids, occupied_slots(t, props).tolist(), strict=True))
    m = even_vm_count_balance(t, vms, props).migration
    if m is None:
        # nothing over, no target, or the worst host has nothing movable
        worst = max(slots.values())
        first_worst = next(h for h in t.ids if slots[h] == worst)
        assert (
            worst <= high
            or all(worst - s < threshold for s in slots.values())
            or not any(v.host_id == first_worst for v in vms)
        )
        return
    assert slots[m.source_host] == max(slots.values()) > high
    assert m.candidates
    assert all(slots[m.source_host] - slots[c] >= threshold for c in m.candidates)
    assert {h for h in t.ids if slots[m.source_host] - slots[h] >= threshold} == set(m.candidates)
    picked = next(v for v in vms if v.vm_id == m.vm_id)
    assert picked.host_id == m.source_host
    assert picked.cpu_usage_pct * picked.vcpus == min(
        v.cpu_usage_pct * v.vcpus for v in vms if v.host_id == m.source_host
    )


# ============================================================================ HA reservation
#: The cluster's HA reservation switch, as vmsched passes it to the units (from PostgreSQL).
ON = {"HaReservation": "true"}


def ha_table(ha_counts: Sequence[int], down: Sequence[int] = ()) -> HostTable:
    states: list[HostState] = [
        host(f"h{i + 1}", ha_vm_count=c, vm_count=c, status=HostStatus.DOWN if i in down else HostStatus.UP)
        for i, c in enumerate(ha_counts)
    ]
    settings_ = ClusterReport(cluster_id=CLUSTER)
    return at(HostTable.from_states(states, settings_))


def ha_vms(ha_counts: Sequence[int]) -> list[VmReport]:
    return [
        vmr(f"h{i + 1}-ha{k}", f"h{i + 1}", cpu_usage_pct=float(10 - k), ha=True)
        for i, c in enumerate(ha_counts)
        for k in range(c)
    ]


def test_ha_balance_ovirt_over_utilization_threshold() -> None:
    # 10 HA VMs on 5 hosts: optimal 2; at 200% a host needs more than 4 (oVirt: "at least 5")
    counts = [4, 2, 2, 1, 1]
    assert ha_reservation_balance(ha_table(counts), ha_vms(counts), ON).migration is None
    counts = [5, 2, 1, 1, 1]  # 10 VMs, optimal 2, h1 has 5 > 4
    out = ha_reservation_balance(ha_table(counts), ha_vms(counts), ON)
    assert out.migration is not None
    assert out.migration.source_host == "h1"
    assert out.migration.vm_id == "h1-ha4"  # least CPU-hungry (cpu 6)
    assert out.migration.candidates == ("h3", "h4", "h5")  # below optimal 2
    assert out.migration.reason == "host h1 runs 5 HA VMs > optimal 2 x OverUtilization 200% = 4"


def test_ha_balance_over_utilization_property_and_edges() -> None:
    counts = [4, 2, 2, 1, 1]
    out = ha_reservation_balance(ha_table(counts), ha_vms(counts), {**ON, "OverUtilization": "150"})  # limit 3
    assert out.migration is not None
    assert out.migration.source_host == "h1"
    # HA reservation off, one Up host, no HA VMs, not movable, non-HA VMs only
    assert ha_reservation_balance(ha_table(counts), ha_vms(counts), {}).migration is None  # HA reservation off
    assert ha_reservation_balance(ha_table([5, 0], down=[1]), ha_vms([5]), ON).migration is None
    assert ha_reservation_balance(ha_table([0, 0, 0]), [], ON).migration is None
    assert ha_reservation_balance(ha_table([5, 2, 1, 1, 1]), [], ON).migration is None
    non_ha = [vmr("x", "h1")]
    assert ha_reservation_balance(ha_table([5, 2, 1, 1, 1]), non_ha, ON).migration is None
    # all equal
    assert ha_reservation_balance(ha_table([3, 3, 3]), ha_vms([3, 3, 3]), ON).migration is None


# ============================================================================ attachment
def test_units_carry_balance_and_properties() -> None:
    assert EVEN_CPU.balance is even_distribution_balance
    assert POWER_SAVING_CPU.balance is power_saving_balance
    assert EVEN_GUEST.balance is even_vm_count_balance
    assert HA_RESERVATION.balance is ha_reservation_balance
    assert validate_properties(POWER_SAVING_CPU, {})["HostsInReserve"] == "0"
    assert validate_properties(POWER_SAVING_CPU, {})["EnableAutomaticHostPowerManagement"] == "false"
    assert validate_properties(HA_RESERVATION, {})["OverUtilization"] == "200"
    assert "MaxFreeMemoryForOverUtilized" not in validate_properties(EVEN_CPU, {})
    assert validate_properties(EVEN_CPU, {"MinFreeMemoryForUnderUtilized": "1024"})["MinFreeMemoryForUnderUtilized"]

    with pytest.raises(InvalidProperty):
        validate_properties(HA_RESERVATION, {"OverUtilization": "99"})
    with pytest.raises(InvalidProperty):
        validate_properties(POWER_SAVING_CPU, {"EnableAutomaticHostPowerManagement": "yes"})
