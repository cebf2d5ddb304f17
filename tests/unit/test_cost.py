"""One definition of what a VM costs its host, whether it is placed (VmSpec) or running (VmReport)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vmsched.contracts import VmReport, VmSpec, VmStatus
from vmsched.scheduling.cost import VmCost, vm_cost


def test_memory_includes_the_overhead_and_shared_cpus_pin_nothing() -> None:
    assert vm_cost(VmSpec(vm_id="v", mem_mb=2048, overhead_mb=100, vcpus=4)) == VmCost(2148, 4, 0)


def test_dedicated_cpus_pin_one_physical_cpu_per_vcpu() -> None:
    vm = VmSpec(vm_id="v", mem_mb=1024, overhead_mb=0, vcpus=6, exclusive_cpus=True)
    assert vm_cost(vm) == VmCost(1024, 6, 6)


@given(
    mem=st.integers(1, 1 << 20),
    overhead=st.integers(0, 1 << 12),
    vcpus=st.integers(1, 256),
    exclusive=st.booleans(),
)
def test_a_placed_vm_and_the_same_vm_running_cost_the_same(
    mem: int, overhead: int, vcpus: int, exclusive: bool
) -> None:
    # The selector's pending record (from the VmSpec) must equal what the state tracker adds up once
    # the VM runs (from the VmReport), or a VM would briefly count twice or not at all.
    spec = VmSpec(vm_id="v", mem_mb=mem, overhead_mb=overhead, vcpus=vcpus, exclusive_cpus=exclusive)
    report = VmReport(
        cluster_id="c",
        vm_id="v",
        status=VmStatus.RUNNING,
        host_id="h",
        mem_mb=mem,
        overhead_mb=overhead,
        vcpus=vcpus,
        exclusive_cpus=exclusive,
    )
    assert vm_cost(spec) == vm_cost(report)
