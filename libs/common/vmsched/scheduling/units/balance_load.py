"""The load model the oVirt balance units share, and how they pick source and destination hosts.

Load model (oVirt CpuAndMemoryBalancingPolicyUnit / FindVmAndDestinations)
---------------------------------------------------------------------------
* A host's *effective load* (% of the whole host) is its CPU usage plus the SPM role's share
  (oVirt calcSpmCpuConsumption) plus VcpuConsumptionPercentage per pending vCPU spread over its CPUs.
* A host is *over-utilized* when its samples (plus the SPM share) have been >= HighUtilization since
  the first sample of the trailing run that is, for at least CpuOverCommitDurationMinutes up to
  `as_of` (oVirt cpuOverCommitTimestamp), and it runs VMs. A host without samples is never over.
* A VM's *CPU hunger* is its load in % of one CPU: cpu_usage_pct x vcpus. On a destination it adds
  hunger / the destination's CPUs (oVirt getPredictedVmCpu); the VM fits when load + that <= High and
  the destination's max scheduling memory minus the VM's need (memory + overhead) stays above
  MaxFreeMemoryForOverUtilized (0 when unset).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units.base import Props
from vmsched.scheduling.units.helpers import VCPU_CONSUMPTION_PCT, fmt_num, max_scheduling_memory_mb, spm_load_share

#: oVirt UtilizationThresholdInPercent: even distribution's destinations are below
#: min(this % of HighUtilization, HighUtilization - VcpuConsumptionPercentage).
UTILIZATION_THRESHOLD_PCT: Final = 80.0

#: The HighUtilization, LowUtilization and CpuOverCommitDurationMinutes a policy leaves unset.
DEFAULT_HIGH: Final = 80
DEFAULT_LOW: Final = 20
DEFAULT_DURATION_MIN: Final = 2


def effective_load(hosts: HostTable) -> FloatArray:
    """Current load in % of the whole host: usage + SPM share + pending vCPUs' assumed load."""
    cpus = hosts.effective_cpus
    safe = np.where(cpus > 0, cpus, 1.0)
    return hosts.cpu_usage_pct + spm_load_share(hosts, cpus) + VCPU_CONSUMPTION_PCT * hosts.pending_vcpus / safe


def sustained_for(hosts: HostTable, above: float | None = None, below: float | None = None) -> FloatArray:
    """Seconds each host's effective samples (sample + SPM share) have been >= `above` (or < `below`)
    without interruption, up to `as_of` (up to the last sample when as_of is NaN). NaN when the last
    sample is not in that state or the host has no samples."""
    shares = spm_load_share(hosts, hosts.effective_cpus)
    out = np.full(len(hosts), math.nan)
    last = hosts.cpu_last_sample_pct + shares  # NaN without samples: in no state
    with np.errstate(invalid="ignore"):
        now_in = np.zeros(len(hosts), dtype=np.bool_)
        if above is not None:
            now_in |= last >= above
        if below is not None:
            now_in |= last < below
    # A host with one sample has been in the state since that sample: no walk.
    hits = np.flatnonzero(now_in)
    single = hosts.cpu_sample_count.take(hits) == 1
    one = hits[single]
    at = hosts.cpu_last_sample_at.take(one)
    out[one] = (hosts.as_of if math.isfinite(hosts.as_of) else at) - at
    share = shares.tolist()

    def state(load: float) -> bool:
        return (above is not None and load >= above) or (below is not None and load < below)

    for i in hits[~single].tolist():
        samples = hosts.cpu_samples[i]
        loads, times = samples.loads, samples.times
        j = len(loads) - 1
        while j > 0 and state(loads[j - 1] + share[i]):
            j -= 1
        end = hosts.as_of if math.isfinite(hosts.as_of) else times[-1]
        out[i] = end - times[j]
    return out


def minutes(seconds: float) -> str:
    return f"{fmt_num(round(seconds / 60.0, 1))} min"


def cpu_hunger(vm: VmReport) -> float:
    """The VM's CPU load in % of one CPU (4 busy vCPUs = 400)."""
    return vm.cpu_usage_pct * vm.vcpus


def by_hunger(vms: Sequence[VmReport]) -> list[VmReport]:
    return sorted(vms, key=lambda v: (cpu_hunger(v), v.vm_id))


def destination_mask(hosts: HostTable) -> BoolArray:
    return hosts.up & hosts.enabled


def order_by(indices: BoolArray, key: FloatArray, descending: bool) -> list[int]:
    """Positions where `indices` holds, sorted by key (stable: ties keep table order)."""
    pos = np.flatnonzero(indices)
    k = -key[pos] if descending else key[pos]
    return [int(p) for p in pos[np.argsort(k, kind="stable")]]


def mem_limit(props: Props, name: str, unset: float) -> float:
    """A memory threshold in MB; `unset` when the property is missing or empty."""
    value = props.get(name)
    return unset if value in (None, "") else float(value)


def over_utilized(hosts: HostTable, high: float, duration_s: float) -> tuple[BoolArray, FloatArray]:
    over_for = sustained_for(hosts, above=high)
    with np.errstate(invalid="ignore"):
        over = hosts.up & (hosts.vm_count > 0) & (over_for >= duration_s)
    return over, over_for


def cpu_reason(hosts: HostTable, high: float, over_for: FloatArray) -> Callable[[int], str]:
    def reason(i: int) -> str:
        samples = hosts.cpu_samples[i]
        last = samples[-1][1] + float(spm_load_share(hosts, hosts.effective_cpus)[i])
        return (
            f"host {hosts.ids[i]} CPU {fmt_num(round(last, 1))}% >= HighUtilization {fmt_num(high)}%"
            f" for {minutes(float(over_for[i]))}"
        )

    return reason


def memory_sources(hosts: HostTable, max_free: float, min_vms: int) -> list[int]:
    """Up hosts with less max scheduling memory than `max_free` and more than `min_vms` - 1 VMs,
    the tightest first (oVirt getHostsWithLessFreeMemory: more than one VM).

    oVirt's max scheduling memory is never below 0, so with MaxFreeMemoryForOverUtilized unset
    (0) no host is short of memory, even an overcommitted one; the clamp keeps that."""
    sched = max_scheduling_memory_mb(hosts)
    short = np.maximum(sched, 0.0) < max_free
    return order_by(hosts.up & short & (hosts.vm_count >= min_vms), sched, descending=False)


def memory_reason(hosts: HostTable, max_free: float) -> Callable[[int], str]:
    sched = max_scheduling_memory_mb(hosts)

    def reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} free scheduling memory {fmt_num(round(float(sched[i])))} MB"
            f" < MaxFreeMemoryForOverUtilized {fmt_num(max_free)} MB"
        )

    return reason


__all__ = [
    "DEFAULT_DURATION_MIN",
    "DEFAULT_HIGH",
    "DEFAULT_LOW",
    "UTILIZATION_THRESHOLD_PCT",
    "by_hunger",
    "cpu_hunger",
    "cpu_reason",
    "destination_mask",
    "effective_load",
    "mem_limit",
    "memory_reason",
    "memory_sources",
    "minutes",
    "order_by",
    "over_utilized",
    "sustained_for",
]
