"""What several policy units share: oVirt's CPU-load constants and the properties that carry them,
a VM's memory need, oVirt's max scheduling memory, the SPM role's CPU share, number formatting for
reasons. Kept here so no unit module imports another unit module for its helpers.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units.base import PropertySpec

#: oVirt VcpuConsumptionPercentage: the CPU load (in % of one CPU) assumed per vCPU of a VM that
#: has no measured load yet (a new VM, a pending one).
VCPU_CONSUMPTION_PCT: Final = 10.0
#: oVirt SpmVCpuConsumption: the SPM role costs the host this many vCPUs' worth of load.
SPM_VCPU_CONSUMPTION: Final = 1.0

HIGH_UTILIZATION = PropertySpec(r"^([5-9][0-9])$", "80", "CPU load (%) above which a host counts as over-utilized")
CPU_OVERCOMMIT_DURATION = PropertySpec(
    r"^([1-9][0-9]*)$", "2", "minutes a host must stay over/under a threshold before it counts"
)


def fmt_num(value: float) -> str:
    """A number for a reason: whole when integral (the usual case: MB, CPUs), else one decimal."""
    v = float(value)
    return str(int(v)) if v.is_integer() else f"{v:.1f}"


def current_host_mask(hosts: HostTable, vm: VmSpec) -> BoolArray:
    """True at the host the VM runs on now (a migration's source), False everywhere else."""
    mask = np.zeros(len(hosts), dtype=np.bool_)
    if vm.current_host is not None:
        pos = hosts.position(vm.current_host)
        if pos is not None:
            mask[pos] = True
    return mask


def vm_memory_need_mb(vm: VmSpec) -> float:
    """What placing the VM costs a host in memory: guest memory plus its overhead (oVirt)."""
    return float(vm_cost(vm).mem_mb)


def max_scheduling_memory_mb(hosts: HostTable) -> FloatArray:
    """oVirt's max scheduling memory, unclamped:
    overcommit% x physical / 100 - committed - reserved - pending.

    oVirt clamps it at 0 (VDS.calculateFreeSchedulingMemoryCache); the filter does not need to (a VM
    always needs > 0 MB) and keeps the sign so its reason adds up. Weights clamp.
    """
    pct = float(hosts.settings.memory_overcommit_pct)
    return pct * hosts.physical_mem_mb / 100.0 - hosts.mem_committed_mb - hosts.reserved_mem_mb - hosts.pending_mem_mb


def spm_load_share(hosts: HostTable, cpus: FloatArray) -> FloatArray:
    """oVirt calcSpmCpuConsumption: the SPM role's load in % of the whole host (0 elsewhere)."""
    share = SPM_VCPU_CONSUMPTION * VCPU_CONSUMPTION_PCT / np.where(cpus > 0, cpus, 1.0)
    return np.where(hosts.is_spm, share, 0.0)
