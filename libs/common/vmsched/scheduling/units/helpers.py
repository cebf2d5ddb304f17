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
    pos = current_host_position(hosts, vm)
    if pos is not None:
        mask[pos] = True
    return mask


def current_host_position(hosts: HostTable, vm: VmSpec) -> int | None:
    """The row of the host the VM runs on now (a migration's source), when it is in the table."""
    return None if vm.current_host is None else hosts.position(vm.current_host)


def except_current_host(hosts: HostTable, vm: VmSpec, value: float) -> float | FloatArray:
    """`value` at every host, 0 at the host the VM runs on now: the number itself when the VM runs
    on none of these hosts (a new VM), which every elementwise use reads the same."""
    pos = current_host_position(hosts, vm)
    if pos is None:
        return value
    out = np.full(len(hosts), value)
    out[pos] = 0.0
    return out


def or_current_host(keep: BoolArray, hosts: HostTable, vm: VmSpec) -> BoolArray:
    """`keep`, with the host the VM runs on now kept too."""
    pos = current_host_position(hosts, vm)
    if pos is None:
        return keep
    out = keep.copy()
    out[pos] = True
    return out


def vm_memory_need_mb(vm: VmSpec) -> float:
    """What placing the VM costs a host in memory: guest memory plus its overhead (oVirt)."""
    return float(vm_cost(vm).mem_mb)


def max_scheduling_memory_mb(hosts: HostTable) -> FloatArray:
    """oVirt's max scheduling memory, unclamped:
    overcommit% x physical / 100 - committed - reserved - pending.

    oVirt clamps it at 0 (VDS.calculateFreeSchedulingMemoryCache); the filter does not need to (a VM
    always needs > 0 MB) and keeps the sign so its reason adds up. Weights clamp.
    """
    # The filter and the weights of a decision ask for it on the same columns: made once.
    columns = ("physical_mem_mb", "mem_committed_mb", "reserved_mem_mb", "pending_mem_mb")
    return hosts.derived("max_scheduling_memory_mb", columns, _max_scheduling_memory_mb)


def _max_scheduling_memory_mb(hosts: HostTable) -> FloatArray:
    overcommitted = hosts.derived("overcommitted_mem_mb", ("physical_mem_mb",), _overcommitted_mem_mb)
    out: FloatArray = overcommitted - hosts.mem_committed_mb - hosts.reserved_mem_mb - hosts.pending_mem_mb
    return out


def _overcommitted_mem_mb(hosts: HostTable) -> FloatArray:
    pct = float(hosts.settings.memory_overcommit_pct)
    out: FloatArray = pct * hosts.physical_mem_mb / 100.0
    return out


def spm_load_share(hosts: HostTable, cpus: FloatArray) -> FloatArray:
    """oVirt calcSpmCpuConsumption: the SPM role's load in % of the whole host (0 elsewhere)."""
    if cpus is hosts.effective_cpus:  # the usual case: the same on every decision, kept
        return hosts.derived("spm_load_share", ("is_spm", "cpu_threads", "cpu_cores"), _spm_load_share)
    return _spm_share(hosts, cpus)


def _spm_load_share(hosts: HostTable) -> FloatArray:
    return _spm_share(hosts, hosts.effective_cpus)


def _spm_share(hosts: HostTable, cpus: FloatArray) -> FloatArray:
    share = SPM_VCPU_CONSUMPTION * VCPU_CONSUMPTION_PCT / np.where(cpus > 0, cpus, 1.0)
    out: FloatArray = np.where(hosts.is_spm, share, 0.0)
    return out


def spm_vcpus(hosts: HostTable) -> FloatArray:
    """The vCPUs' worth of load the SPM role costs each host (SpmVCpuConsumption on the SPM, 0 elsewhere)."""
    return hosts.derived("spm_vcpus", ("is_spm",), _spm_vcpus)


def _spm_vcpus(hosts: HostTable) -> FloatArray:
    out: FloatArray = np.where(hosts.is_spm, SPM_VCPU_CONSUMPTION, 0.0)
    return out


def known_cpus(hosts: HostTable) -> tuple[BoolArray, FloatArray]:
    """Which hosts have a known topology, and their CPU count (1 where unknown, to divide safely)."""
    columns = ("cpu_threads", "cpu_cores")
    return hosts.derived("cpus_known", columns, _cpus_known), hosts.derived("cpus_or_one", columns, _cpus_or_one)


def _cpus_known(hosts: HostTable) -> BoolArray:
    cpus = hosts.effective_cpus
    out: BoolArray = (hosts.cpu_cores > 0) & (cpus > 0)
    return out


def _cpus_or_one(hosts: HostTable) -> FloatArray:
    out: FloatArray = np.where(_cpus_known(hosts), hosts.effective_cpus, 1.0)
    return out
