"""What a host's reports add up to: its report plus the totals of the VMs that count on it.

The state tracker derives every stored HostState this way, and the simulator its hosts, so both
count a VM on a host by the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vmsched.contracts import HostReport, HostState, VmReport, VmStatus
from vmsched.scheduling.cost import vm_cost

#: VM states that use resources on their host. A migrating VM counts on the host it is reported
#: on (VmReport has one host); the engine reports the destination once the migration ends.
COUNTED_STATUSES: frozenset[VmStatus] = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})


def counts_on_host(vm: VmReport) -> bool:
    """Whether the VM uses resources on a host (a counted status, and a host to count it on)."""
    return vm.status in COUNTED_STATUSES and vm.host_id is not None


def aggregate_host(
    report: HostReport,
    vms: Iterable[VmReport],
    cpu_samples: Sequence[tuple[float, float]] = (),
    build_failures: int = 0,
) -> HostState:
    """A host's report plus the aggregates of the VMs that count on it (oVirt's mem_commited etc.)
    and what the tracker remembers of it (load history, failed starts)."""
    vm_count = mem = vcpus = pinned = ha = 0
    vms = list(vms)
    for vm in vms:
        vm_count += 1
        cost = vm_cost(vm)
        mem += cost.mem_mb
        vcpus += cost.vcpus
        pinned += cost.cpus_pinned
        if vm.ha:
            ha += 1
    return HostState(
        report=report,
        vm_count=vm_count,
        mem_committed_mb=mem,
        vcpus_committed=vcpus,
        cpus_pinned=pinned,
        ha_vm_count=ha,
        vm_ids=sorted(vm.vm_id for vm in vms),
        cpu_samples=list(cpu_samples),
        build_failures=build_failures,
    )


__all__ = ["COUNTED_STATUSES", "aggregate_host", "counts_on_host"]
