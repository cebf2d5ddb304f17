"""oVirt's CPU filter units: CPU, CPUOverloaded and CPUTopology (CPUPolicyUnit,
CpuOverloadPolicyUnit, CpuTopologyPolicyUnit).

Each filter is a few array expressions over the HostTable; a reason string (with numbers) is built
only for the hosts it removes. Where vmsched deliberately differs from the engine's code, the
difference and its reason are noted at the unit.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, constant
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, Props, prop_int
from vmsched.scheduling.units.helpers import CPU_OVERCOMMIT_DURATION, HIGH_UTILIZATION, fmt_num, spm_load_share


# ------------------------------------------------------------------------------------------- CPU
def cpu_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A VM cannot have more vCPUs than the host has CPUs left after exclusive pinning.

    Host CPUs are cores, or threads when the cluster counts threads as cores; CPUs pinned exclusively
    by running and pending VMs are not available to anyone else. oVirt keeps a host whose core count
    is unknown; vmsched removes it, since nothing about it can be checked.
    """
    cpus = hosts.effective_cpus
    pinned = hosts.cpus_pinned + hosts.pending_cpus_pinned
    available = cpus - pinned
    known = hosts.derived("cores_known", ("cpu_cores",), _cores_known)
    keep = known & (available >= vm.vcpus)
    unit = "threads" if hosts.settings.count_threads_as_cores else "cores"

    def reason(i: int) -> str:
        if not known[i]:
            return "unknown CPU topology (the host reported 0 cores)"
        if pinned[i]:
            return (
                f"{fmt_num(cpus[i])} {unit} - {fmt_num(pinned[i])} exclusively pinned = "
                f"{fmt_num(available[i])} CPUs < {vm.vcpus} vCPUs"
            )
        return f"{fmt_num(cpus[i])} {unit} < {vm.vcpus} vCPUs"

    return FilterVerdict.from_mask(hosts, keep, reason)


def _cores_known(hosts: HostTable) -> BoolArray:
    out: BoolArray = hosts.cpu_cores > 0
    return out


def _utc(ts: float) -> str:
    """A unix time for a reason: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _minutes(seconds: float) -> str:
    return f"{fmt_num(round(seconds / 60.0, 1))} min"


# --------------------------------------------------------------------------------- CPUOverloaded
def cpu_overloaded_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Removes a host whose effective CPU load (the sample plus the SPM role's share) has been above
    HighUtilization in every sample for at least CpuOverCommitDurationMinutes.

    The state tracker keeps each host's recent load samples (unix time, %); the host counts as over
    since the first sample of the trailing run of samples above the threshold (oVirt's
    cpuOverCommitTimestamp, set by host monitoring when it first sees the host over), and the run
    must end with the last sample. The duration runs up to the decision's instant `hosts.as_of`;
    when as_of is NaN (no request set it) it runs up to the last sample, so only what the samples
    show counts. A host without samples has no known overload and passes. A host whose core count
    is unknown is removed, as in oVirt (its load per core means nothing).

    Deviation: oVirt compares the current load with an "all cores above HighUtilization" threshold,
    round((100 x cores - (100 - High)) / cores) (95% on a 4-core host at High 80); vmsched uses
    the plain rule load > HighUtilization, which is what the property means to the user setting it.

    Cost: one array comparison of the newest samples, then a short loop per host over now that walks
    its samples back to the first one under the threshold.
    """
    high = float(prop_int(props, "HighUtilization", 80))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", 2)
    cpus = hosts.effective_cpus
    known = hosts.derived("cores_known", ("cpu_cores",), _cores_known)
    spm = spm_load_share(hosts, cpus)
    threshold = high - spm  # a sample over this makes sample + SPM share > High
    n = len(hosts)
    with np.errstate(invalid="ignore"):
        over_now = np.flatnonzero(hosts.cpu_last_sample_pct > threshold)  # NaN (no samples): not over
    if not len(over_now):  # no host is over now: only an unknown topology removes one
        unknown = "unknown CPU topology (the host reported 0 cores)"
        return FilterVerdict.from_mask(hosts, known.copy(), lambda i: unknown)
    since = np.full(n, math.nan)
    last_t = np.full(n, math.nan)
    last_load = np.zeros(n)
    # A host with one sample has been over since that sample: no walk (a simulated host has one).
    single = hosts.cpu_sample_count.take(over_now) == 1
    one = over_now[single]
    since[one] = last_t[one] = hosts.cpu_last_sample_at.take(one)
    last_load[one] = hosts.cpu_last_sample_pct.take(one)
    for i in over_now[~single].tolist():
        samples = hosts.cpu_samples[i]
        loads = samples.loads
        thr = float(threshold[i])
        j = len(loads) - 1
        while j > 0 and loads[j - 1] > thr:
            j -= 1
        since[i] = samples.times[j]
        last_t[i], last_load[i] = samples[-1]
    end = hosts.as_of if math.isfinite(hosts.as_of) else last_t
    with np.errstate(invalid="ignore"):
        over_for = end - since
        overloaded = over_for >= duration_s  # False where NaN: not over, or no samples
    keep = known & ~overloaded

    def reason(i: int) -> str:
        if not known[i]:
            return "unknown CPU topology (the host reported 0 cores)"
        load = f"{fmt_num(last_load[i])}%"
        if spm[i]:
            load = f"{fmt_num(last_load[i] + spm[i])}% ({load} + SPM {fmt_num(spm[i])}%)"
        return (
            f"CPU load {load} > HighUtilization {fmt_num(high)}% since {_utc(since[i])}: "
            f"{_minutes(over_for[i])} >= {_minutes(duration_s)}"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


# ----------------------------------------------------------------------------------- CPUTopology
def cpu_topology_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """The host's topology must be known, and a VM with dedicated (exclusively pinned) vCPUs needs
    at least its threads per core on the host: all vThreads of one vCore are pinned to one physical
    core, so they need that many hardware threads there.

    This is oVirt's CPUTopology (CpuTopologyPolicyUnit): it removes hosts with unknown sockets,
    cores or threads, and checks threads per core = threads // cores (Java integer division) only
    for the Dedicated pinning policy; a host that reports 0 threads (unknown) counts as 1 thread
    per core, which any VM asking for 1 accepts. A VM without dedicated CPUs gets a virtual topology
    that QEMU lays out on any host, so nothing else is checked (the CPU filter counts vCPUs
    against host CPUs). oVirt's "resize and pin NUMA" rule (more than one core per socket, sockets
    = NUMA nodes) has no VmSpec counterpart.
    """
    # Kept with the table while its topology columns are the same (they rarely change).
    known = hosts.derived("topology_known", ("cpu_cores", "cpu_sockets"), _topology_known)
    need = vm.cpu_threads_per_core
    threads_per_core: FloatArray
    if vm.exclusive_cpus:
        threads_per_core = np.where(
            known & (hosts.cpu_threads > 0), np.floor_divide(hosts.cpu_threads, np.maximum(hosts.cpu_cores, 1)), 1.0
        )
        keep = known & (threads_per_core >= need)
    else:
        threads_per_core = constant(len(hosts), 1.0)  # read by the reasons only: stored once
        keep = known.copy()  # the verdict's own (the kept one is shared by the table's versions)

    def reason(i: int) -> str:
        if not known[i]:
            sockets, cores = fmt_num(hosts.cpu_sockets[i]), fmt_num(hosts.cpu_cores[i])
            return f"unknown CPU topology (reported sockets {sockets}, cores {cores})"
        threads = hosts.cpu_threads[i]
        detail = (
            f"{fmt_num(threads)} threads / {fmt_num(hosts.cpu_cores[i])} cores"
            if threads > 0
            else "no thread count reported"
        )
        return f"dedicated CPUs need {need} threads per core, the host has {fmt_num(threads_per_core[i])} ({detail})"

    return FilterVerdict.from_mask(hosts, keep, reason)


def _topology_known(hosts: HostTable) -> BoolArray:
    out: BoolArray = (hosts.cpu_cores > 0) & (hosts.cpu_sockets > 0)
    return out


CPU = PolicyUnit(
    name="CPU",
    description="Filters out hosts with fewer available CPUs than the VM's vCPUs.",
    summary="not enough CPUs",
    filter=cpu_filter,
    filter_by_row=True,
)
CPU_OVERLOADED = PolicyUnit(
    name="CPUOverloaded",
    description="Filters out hosts whose CPU load has stayed above HighUtilization for CpuOverCommitDurationMinutes.",
    summary="CPU overloaded",
    filter=cpu_overloaded_filter,
    filter_by_row=True,
    properties={"HighUtilization": HIGH_UTILIZATION, "CpuOverCommitDurationMinutes": CPU_OVERCOMMIT_DURATION},
)
CPU_TOPOLOGY = PolicyUnit(
    name="CPUTopology",
    description="Runs VMs only on hosts with a known CPU topology that can hold the VM's dedicated vCPU layout.",
    summary="unsuitable CPU topology",
    filter=cpu_topology_filter,
    filter_by_row=True,
)

__all__ = [
    "CPU",
    "CPU_OVERLOADED",
    "CPU_TOPOLOGY",
    "cpu_filter",
    "cpu_overloaded_filter",
    "cpu_topology_filter",
]
