"""tight_packing's balance (balance_packing): a relief that brings an over-utilized host back in one
move where it can, and a consolidation that only begins a host it can empty, the one that takes
fewest migrations."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, table, vm_report
from vmsched.contracts import HostState, VmReport
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units.balance_packing import (
    CONSOLIDATION_MOST_VMS,
    packing_balance,
)
from vmsched.scheduling.units.balance_power import power_saving_balance
from vmsched.scheduling.units.base import validate_properties
from vmsched.scheduling.units.weights_packing import PACKING

T = 1_700_000_000.0
GB = 1024
PROPS = validate_properties(PACKING, {"HighUtilization": "80", "LowUtilization": "20"})
#: A running 512 MB VM of the cluster.
vmr = partial(vm_report, CLUSTER, mem_mb=512)


def over_for_5_min(load: float) -> list[tuple[float, float]]:
    """CPU samples at `load` every minute over the last 5 minutes up to T."""
    return [(T - 300 + 60 * k, load) for k in range(6)]


def at(*hosts: HostState) -> HostTable:
    return replace(table(*hosts), as_of=T)


# ------------------------------------------------------------------------------------ relief
def relief_cluster(load: float) -> HostTable:
    # 4 CPUs each: h1's excess over 80 % is (load - 80) x 4 in % of one CPU, a VM's hunger's unit.
    return at(
        host("h1", cpu_usage_pct=load, cpu_samples=over_for_5_min(load), vm_count=4),
        host("h2", cpu_usage_pct=10, vm_count=1),
    )


RELIEF_VMS = [
    vmr("c", "h1", cpu_usage_pct=5, vcpus=1),  # hunger 5
    vmr("b", "h1", cpu_usage_pct=10, vcpus=2),  # 20
    vmr("a", "h1", cpu_usage_pct=25, vcpus=2),  # 50
    vmr("d", "h1", cpu_usage_pct=100, vcpus=2),  # 200: fits h2 too (10 + 50 = 60 %), but more than enough
]


def test_relief_moves_the_least_hungry_vm_that_alone_brings_the_host_back_under_high() -> None:
    # 90 %: 40 over. oVirt's power saving moves c (5), then b, ...: four migrations for one.
    out = packing_balance(relief_cluster(90), RELIEF_VMS, PROPS)
    assert out.migration is not None
    assert (out.migration.vm_id, out.migration.source_host, out.migration.candidates) == ("a", "h1", ("h2",))
    assert out.migration.reason == "host h1 CPU 90% >= HighUtilization 80% for 5 min"
    oldest = power_saving_balance(relief_cluster(90), RELIEF_VMS, PROPS).migration
    assert oldest is not None
    assert oldest.vm_id == "c"


def test_relief_takes_the_hungriest_vm_that_fits_when_none_is_enough() -> None:
    # 99.5 %: 78 over; only d (200) is enough but it does not fit h2 at 60 % (60 + 50 > 80)
    t = at(
        host("h1", cpu_usage_pct=99.5, cpu_samples=over_for_5_min(99.5), vm_count=4),
        host("h2", cpu_usage_pct=60, vm_count=1),
    )
    out = packing_balance(t, RELIEF_VMS, PROPS)
    assert out.migration is not None
    assert out.migration.vm_id == "a"


# ----------------------------------------------------------------------------- consolidation
def used_host(host_id: str, load: float, vms: int, **kw: Any) -> HostState:
    """8 CPUs, 64 GB, `vms` VMs of 512 MB, no samples (never over nor under a threshold)."""
    fields: dict[str, Any] = {
        "cpu_cores": 8,
        "physical_mem_mb": 64 * GB,
        "mem_free_mb": 64 * GB - 512 * vms,
        "mem_committed_mb": 512 * vms,
        "cpu_usage_pct": load,
        "vm_count": vms,
        "vcpus_committed": 2 * vms,
    }
    fields.update(kw)
    return host(host_id, **fields)


def hungry(host_id: str, n: int, total: float, prefix: str) -> list[VmReport]:
    """`n` 2-vCPU VMs on the host sharing `total` hunger (% of one CPU) evenly."""
    return [vmr(f"{prefix}{k}", host_id, cpu_usage_pct=total / n / 2, vcpus=2) for k in range(n)]


def test_consolidation_skips_a_host_whose_vms_do_not_all_fit_one_by_one() -> None:
    # Room within 80 %: hA and hB 240 each, hC 320 (in % of one CPU). hA's one VM of 400 fits the
    # room of hB and hC together but neither alone: hB (3 VMs of 133) is emptied instead.
    t = at(used_host("hA", 50, 1), used_host("hB", 50, 3), used_host("hC", 40, 5))
    vms = [vmr("big", "hA", cpu_usage_pct=100, vcpus=4), *hungry("hB", 3, 400, "b"), *hungry("hC", 5, 320, "c")]
    out = packing_balance(t, vms, PROPS)
    assert out.migration is not None
    assert out.migration.source_host == "hB"
    assert set(out.migration.candidates) == {"hA", "hC"}
    assert "host hB (3 VMs, CPU 50%" in out.migration.reason
    assert "within 80%: emptying it" in out.migration.reason


def test_consolidation_empties_the_host_with_fewest_vms_up_to_high_utilization() -> None:
    # hB holds more than hA (CPU and memory) but runs 2 VMs to hA's 6: fewer migrations free it.
    # Its VMs (200 each, 25 points on 8 CPUs) fit each other host within 80 %.
    big = {"mem_committed_mb": 8 * GB, "mem_free_mb": 56 * GB}
    t = at(used_host("hA", 30, 6), used_host("hB", 50, 2, **big), used_host("hC", 55, 5), used_host("hD", 52, 5))
    vms = [*hungry("hA", 6, 240, "a"), *hungry("hB", 2, 400, "b"), *hungry("hC", 5, 440, "c")]
    vms += hungry("hD", 5, 416, "d")
    out = packing_balance(t, vms, PROPS)
    assert out.migration is not None
    assert out.migration.source_host == "hB"
    assert set(out.migration.candidates) == {"hA", "hC", "hD"}


def test_consolidation_begins_no_host_of_more_than_its_vm_bound() -> None:
    many = CONSOLIDATION_MOST_VMS + 1
    t = at(used_host("hA", 10, many), used_host("hB", 30, many))
    vms = [*hungry("hA", many, 80, "a"), *hungry("hB", many, 240, "b")]
    assert packing_balance(t, vms, PROPS).migration is None
    fewer = at(used_host("hA", 10, CONSOLIDATION_MOST_VMS), used_host("hB", 30, many))
    vms = [*hungry("hA", CONSOLIDATION_MOST_VMS, 80, "a"), *hungry("hB", many, 240, "b")]
    out = packing_balance(fewer, vms, PROPS)
    assert out.migration is not None
    assert out.migration.source_host == "hA"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 8), st.integers(5, 100), st.booleans()),
        min_size=2,
        max_size=6,
    )
)
def test_every_target_stays_within_high_utilization_and_no_large_host_is_begun(
    rows: list[tuple[int, int, int, bool]],
) -> None:
    # Hosts of 8 CPUs with `n` VMs of `vcpus` vCPUs at `pct` % each (the host's load is theirs),
    # some over HighUtilization for 5 minutes.
    hosts, vms = [], []
    for i, (n, vcpus, pct, sustained) in enumerate(rows):
        load = min(100.0, n * vcpus * pct / 8)
        samples = over_for_5_min(load) if sustained else []
        hosts.append(used_host(f"h{i}", load, n, cpu_samples=samples, vcpus_committed=n * vcpus))
        vms += [vmr(f"h{i}-{k}", f"h{i}", cpu_usage_pct=pct, vcpus=vcpus) for k in range(n)]
    t = at(*hosts)
    out = packing_balance(t, vms, PROPS)
    if out.migration is None:
        return
    m = out.migration
    moved = next(v for v in vms if v.vm_id == m.vm_id)
    assert m.source_host == moved.host_id
    assert m.source_host not in m.candidates
    for c in m.candidates:
        j = t.ids.index(c)
        assert t.cpu_usage_pct[j] + moved.cpu_usage_pct * moved.vcpus / 8 <= 80.0 + 1e-9
    if m.reason.endswith("emptying it"):
        assert t.vm_count[t.ids.index(m.source_host)] <= CONSOLIDATION_MOST_VMS
