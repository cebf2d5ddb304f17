"""oVirt filter units (hard constraints): Memory, CPU, Network, PinToHost, Migration, Swap,
CPUOverloaded, CPUTopology, HugePages, Emulated-Machine, CPU-Level, ClusterInMaintenance and
MigrationDomain.

Each filter is a few array expressions over the HostTable; a reason string (with numbers) is built
only for the hosts it removes. The formulas follow oVirt's engine (MemoryPolicyUnit + SlaValidator,
CPUPolicyUnit, NetworkPolicyUnit, PinToHostPolicyUnit, MigrationPolicyUnit, SwapFilterPolicyUnit,
CpuOverloadPolicyUnit, CpuTopologyPolicyUnit, HugePagesFilterPolicyUnit,
EmulatedMachineFilterPolicyUnit, CpuLevelFilterPolicyUnit, ClusterInMaintenanceFilterPolicyUnit,
MigrationDomainPolicyUnit); where vmsched deliberately differs from the engine's code, the
difference and its reason are noted at the unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props, prop_int
from vmsched.scheduling.units.helpers import (
    CPU_OVERCOMMIT_DURATION,
    HIGH_UTILIZATION,
    SPM_VCPU_CONSUMPTION,
    VCPU_CONSUMPTION_PCT,
    current_host_mask,
    fmt_num,
    max_scheduling_memory_mb,
    or_current_host,
    spm_load_share,
    vm_memory_need_mb,
)

#: How many host or network names a reason lists before it says "and N more".
MAX_NAMES_IN_REASON = 5

# ------------------------------------------------------------------------- custom properties
MAX_ALLOWED_SWAP_USAGE = PropertySpec(
    r"^1?[0-9]?[0-9]$", "0", "swap in use beyond free memory (% of physical memory) a host may have"
)


def _names(items: Iterable[str]) -> str:
    listed = list(items)
    shown = ", ".join(f"'{x}'" for x in listed[:MAX_NAMES_IN_REASON])
    rest = len(listed) - MAX_NAMES_IN_REASON
    return f"{shown} and {rest} more" if rest > 0 else shown


def memory_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Physical check, then overcommit check (oVirt's order; the first failure is the reason).

    A VM's *memory need* is its memory plus overhead. A VM backed by static huge pages takes its
    memory from the host's free huge pages of its page size, which are outside the host's free
    memory; as in oVirt, only the pages those free pages (after the pending ones, counted as in the
    HugePages filter) do not cover, rounded up to whole pages, plus the overhead are its need here:
    the kernel would have to allocate the missing pages from ordinary memory.

    Physical: need <= free - pending (+ free swap when the VM may use swap and is not backed by
    huge pages: QEMU's up-front allocation check counts swap, huge pages cannot be swapped).
    Overcommit: need <= max scheduling memory. As in oVirt, both checks are skipped on the host the
    VM already runs on (its memory is already there); the Migration filter removes that host anyway.
    """
    need, uncovered_mb = _memory_need(hosts, vm)
    swap_counts = vm.use_swap and not vm.hugepages
    swap: float | FloatArray = hosts.swap_free_mb if swap_counts else 0.0
    physical = hosts.mem_free_mb - hosts.pending_mem_mb + swap
    max_sched = max_scheduling_memory_mb(hosts)
    phys_ok = need <= physical
    keep = or_current_host(phys_ok & (need <= max_sched), hosts, vm)

    def required(i: int) -> str:
        text = f"required {fmt_num(_at(need, i))} MB"
        if uncovered_mb is not None:
            text += (
                f" ({fmt_num(uncovered_mb[i])} MB not covered by free {vm.hugepage_size_kb} KiB huge pages"
                f" + overhead {vm.overhead_mb} MB)"
            )
        return text

    def reason(i: int) -> str:
        if not phys_ok[i]:
            pending, free_swap = hosts.pending_mem_mb[i], _at(swap, i)
            if pending == 0 and free_swap == 0:
                return f"free memory {fmt_num(physical[i])} MB < {required(i)}"
            parts = f"free memory {fmt_num(hosts.mem_free_mb[i])} MB"
            if pending:
                parts += f" - pending {fmt_num(pending)} MB"
            if free_swap:
                parts += f" + free swap {fmt_num(free_swap)} MB"
            return f"{parts} = {fmt_num(physical[i])} MB < {required(i)}"
        return (
            f"max scheduling memory {fmt_num(max_sched[i])} MB < {required(i)} "
            f"(overcommit {hosts.settings.memory_overcommit_pct}% of {fmt_num(hosts.physical_mem_mb[i])} MB"
            f" - committed {fmt_num(hosts.mem_committed_mb[i])} MB"
            f" - reserved {fmt_num(hosts.reserved_mem_mb[i])} MB"
            f" - pending {fmt_num(hosts.pending_mem_mb[i])} MB)"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def _memory_need(hosts: HostTable, vm: VmSpec) -> tuple[float | FloatArray, FloatArray | None]:
    """The VM's memory need on each host (one number without huge pages), and with huge pages the
    MB its free huge pages do not cover."""
    if not vm.hugepages:
        return vm_memory_need_mb(vm), None
    size = vm.hugepage_size_kb
    _, free_pages, pending_pages = _free_hugepages(hosts, size)
    covered = np.maximum(free_pages - pending_pages, 0.0)
    uncovered_mb = np.ceil(np.maximum(hugepages_needed(vm.mem_mb, size) - covered, 0.0) * size / 1024.0)
    return uncovered_mb + float(vm.overhead_mb), uncovered_mb


def _at(value: float | FloatArray, i: int) -> float:
    return float(value[i]) if isinstance(value, np.ndarray) else value


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


# --------------------------------------------------------------------------------------- Network
def network_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Every network the VM's interfaces use must be present on the host; the reason lists all missing.

    oVirt's NetworkPolicyUnit also checks the display network and non-required networks; vmsched's
    VmSpec only carries the networks the VM needs, so every listed network is required.
    """
    required = list(dict.fromkeys(vm.networks))  # de-duplicated, order kept for stable reasons
    if not required or len(hosts) == 0:
        return FilterVerdict.keep_all(hosts)
    present = np.stack([hosts.has_network(net) for net in required])  # (networks, hosts)
    keep: BoolArray = np.all(present, axis=0)

    def reason(i: int) -> str:
        missing = [net for j, net in enumerate(required) if not present[j, i]]
        noun = "network" if len(missing) == 1 else "networks"
        return f"missing {noun} {_names(missing)}"

    return FilterVerdict.from_mask(hosts, keep, reason)


# ------------------------------------------------------------------------------------- PinToHost
def pin_to_host_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A VM pinned to hosts may run only there; an empty pin list means any host.

    oVirt pins only when the VM's migration support is "pinned to host"; VmSpec.pinned_hosts being
    non-empty is that state.
    """
    if not vm.pinned_hosts:
        return FilterVerdict.keep_all(hosts)
    pinned = frozenset(vm.pinned_hosts)
    keep = hosts.mask_of(pinned)
    where = _names(sorted(pinned))
    return FilterVerdict.from_mask(hosts, keep, lambda i: f"the VM is pinned to other hosts ({where})")


# ------------------------------------------------------------------------------------- Migration
def migration_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """On a migration, the source host is not a destination.

    Newer oVirt keeps the source host in this filter ("for balancing purposes") and drops it later;
    vmsched removes it here, which keeps the explanation in one place.
    """
    keep = ~current_host_mask(hosts, vm)
    return FilterVerdict.from_mask(hosts, keep, lambda i: "the VM already runs on this host")


def _utc(ts: float) -> str:
    """A unix time for a reason: ISO 8601 in UTC, to the second."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _minutes(seconds: float) -> str:
    return f"{fmt_num(round(seconds / 60.0, 1))} min"


# ------------------------------------------------------------------------------------------ Swap
def swap_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A host is swapping when the swap it uses beyond its free memory, as a share of its physical
    memory, exceeds MaximumAllowedSwapUsage: (swap total - swap free - mem free) x 100 / physical
    (integer division, as oVirt's longs) > allowed.

    As in oVirt, a host without the information (no swap, no free memory or no physical memory
    reported) passes. oVirt's engine-wide EnableSwapCheck switch is "include the unit in the policy".
    """
    allowed = prop_int(props, "MaximumAllowedSwapUsage", 0)
    has_swap = hosts.derived("swap_known", ("swap_total_mb", "physical_mem_mb"), _swap_known)
    if not has_swap.any():  # no host reports swap (and memory): none is known to swap
        return FilterVerdict.keep_all(hosts)
    known = has_swap & (hosts.mem_free_mb > 0)
    beyond = hosts.swap_total_mb - hosts.swap_free_mb - hosts.mem_free_mb
    used_pct = np.trunc(beyond * 100.0 / np.where(known, hosts.physical_mem_mb, 1.0))
    keep = ~known | (used_pct <= allowed)

    def reason(i: int) -> str:
        return (
            f"swapping: (swap {fmt_num(hosts.swap_total_mb[i])} MB - free swap {fmt_num(hosts.swap_free_mb[i])} MB"
            f" - free memory {fmt_num(hosts.mem_free_mb[i])} MB) x 100 / physical"
            f" {fmt_num(hosts.physical_mem_mb[i])} MB = {fmt_num(used_pct[i])}% > allowed {allowed}%"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def _swap_known(hosts: HostTable) -> BoolArray:
    out: BoolArray = (hosts.swap_total_mb > 0) & (hosts.physical_mem_mb > 0)
    return out


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
    known = (hosts.cpu_cores > 0) & (hosts.cpu_sockets > 0)
    need = vm.cpu_threads_per_core
    if vm.exclusive_cpus:
        threads_per_core = np.where(
            known & (hosts.cpu_threads > 0), np.floor_divide(hosts.cpu_threads, np.maximum(hosts.cpu_cores, 1)), 1.0
        )
        keep = known & (threads_per_core >= need)
    else:
        threads_per_core = np.ones(len(hosts))
        keep = known

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


# ------------------------------------------------------------------------------------- HugePages
def hugepages_needed(mem_mb: float | FloatArray, size_kb: int) -> FloatArray:
    """Huge pages of `size_kb` that `mem_mb` of guest memory takes: ceil(mem_mb x 1024 / size_kb)."""
    return np.ceil(np.asarray(mem_mb, dtype=np.float64) * 1024.0 / size_kb)


def _free_hugepages(hosts: HostTable, size_kb: int) -> tuple[BoolArray, FloatArray, FloatArray]:
    """Per host: whether it reports pages of `size_kb`, how many are free, and how many the
    pending records may take (their whole memory as pages of that size; see hugepages_filter)."""
    n = len(hosts)
    has_size = np.fromiter((size_kb in pages for pages in hosts.hugepages_free), dtype=np.bool_, count=n)
    free = np.fromiter((pages.get(size_kb, 0) for pages in hosts.hugepages_free), dtype=np.float64, count=n)
    return has_size, free, hugepages_needed(hosts.pending_mem_mb, size_kb)


def hugepages_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """A VM backed by static huge pages needs ceil(memory x 1024 / page size) free pages of its page
    size on the host, after the pending ones; a host without pages of that size is removed. As in
    oVirt, a VM without huge pages passes everywhere and the host the VM already runs on passes.

    Pending huge pages: vmsched's pending records carry memory, not pages by size. The filter counts
    a host's whole pending memory as pages of the VM's size (ceil(pending MB x 1024 / size)). That
    can over-count (pending VMs without huge pages, or with another size) but never under-counts,
    so two concurrent decisions cannot promise the same pages; an over-count lasts only while the
    pending records live, and the retry-on-pending-change step (oVirt's: no host but
    pending resources -> wait for them to change and try again) covers it. Exact accounting would
    need a pending huge-pages-by-size column.
    """
    if not vm.hugepages:
        return FilterVerdict.keep_all(hosts)
    size = vm.hugepage_size_kb
    need = float(hugepages_needed(vm.mem_mb, size))
    has_size, free, pending = _free_hugepages(hosts, size)
    available = free - pending
    keep = or_current_host(has_size & (available >= need), hosts, vm)

    def reason(i: int) -> str:
        if not has_size[i]:
            sizes = sorted(hosts.hugepages_free[i])
            offered = ", ".join(f"{s} KiB" for s in sizes) if sizes else "none"
            return f"no {size} KiB huge pages on the host (sizes reported: {offered}); required {fmt_num(need)}"
        if pending[i]:
            return (
                f"free {size} KiB huge pages {fmt_num(free[i])} - pending {fmt_num(pending[i])}"
                f" (for {fmt_num(hosts.pending_mem_mb[i])} MB) = {fmt_num(available[i])} < required {fmt_num(need)}"
            )
        return f"free {size} KiB huge pages {fmt_num(free[i])} < required {fmt_num(need)}"

    return FilterVerdict.from_mask(hosts, keep, reason)


# ----------------------------------------------------------------------- Emulated-Machine, CPU-Level
def _membership(hosts: HostTable, wanted: str | None, column: str, need: str, lacks: str) -> FilterVerdict:
    """Keep the hosts whose set in `column` holds `wanted`; a VM that wants nothing passes everywhere.

    Reasons: "<need> '<wanted>' required; the host reports no <plural>" when the host offers none,
    else "<need> '<wanted>' <lacks> (...)" naming what it has.
    """
    if not wanted:
        return FilterVerdict.keep_all(hosts)
    keep = hosts.offering(column, wanted)
    offered: Sequence[frozenset[str]] = getattr(hosts, column)

    def reason(i: int) -> str:
        have = offered[i]
        if not have:
            return f"{need} '{wanted}' required; the host reports no {need}s"
        return f"{need} '{wanted}' {lacks} {_names(sorted(have))})"

    return FilterVerdict.from_mask(hosts, keep, reason)


def emulated_machine_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """The host's emulator must support the VM's machine type; a VM without one (the cluster
    default) passes everywhere. As in oVirt, a host that reports no machine types is removed."""
    return _membership(
        hosts, vm.emulated_machine, "emulated_machines", "emulated machine", "not supported (the host supports"
    )


def cpu_level_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """The host must offer the VM's CPU model; a VM without one (the cluster's CPU) passes everywhere.

    oVirt compares CPU levels (a host whose best CPU is at or above the VM's, same vendor, passes);
    vmsched's hosts report the list of CPU models they can offer, which already encodes "at or
    above", so the check is membership. A host that reports no models is removed (oVirt: a host
    whose CPU cannot be named is not added).
    """
    return _membership(hosts, vm.cpu_model, "cpu_models", "CPU model", "not offered (the host offers")


# -------------------------------------------------------------------------- ClusterInMaintenance
def cluster_in_maintenance_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """While the cluster is in maintenance, only highly available VMs may start and running VMs may
    migrate: every host is removed for any other VM.

    As in oVirt the unit is unconditional: a cluster is "in maintenance" by running the
    cluster_maintenance policy, whose first filter it is. One switch, the cluster's policy.
    """
    if vm.ha or vm.current_host is not None:
        return FilterVerdict.keep_all(hosts)
    keep = np.zeros(len(hosts), dtype=np.bool_)
    return FilterVerdict.from_mask(
        hosts, keep, lambda i: "the cluster is in maintenance: only HA VMs may start (this VM is not HA)"
    )


# ------------------------------------------------------------------------------- MigrationDomain
def migration_domain_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Only Up hosts of the VM's cluster are destinations (oVirt's early MigrationDomainPolicyUnit).

    In vmsched every HostTable is one cluster, so the cluster half always holds; a whitelist naming
    foreign hosts cannot bring them in either, since the candidates step drops ids the table does
    not know. The unit stays for policies ported from oVirt, and still removes a host that is not
    Up (candidates normally drop those first; a table built without that step, e.g. in a balance
    simulation, keeps them). oVirt applied it to every scheduling, not only migrations; so does
    vmsched.
    """
    keep = hosts.up.copy()
    return FilterVerdict.from_mask(hosts, keep, lambda i: "the host is not Up")


MEMORY = PolicyUnit(
    name="Memory",
    description="Filters out hosts without enough free physical or overcommit memory for the VM.",
    summary="insufficient free memory",
    filter=memory_filter,
    filter_by_row=True,
)
CPU = PolicyUnit(
    name="CPU",
    description="Filters out hosts with fewer available CPUs than the VM's vCPUs.",
    summary="not enough CPUs",
    filter=cpu_filter,
    filter_by_row=True,
)
NETWORK = PolicyUnit(
    name="Network",
    description="Filters out hosts that lack a network the VM needs.",
    summary="missing network",
    filter=network_filter,
    filter_by_row=True,
)
PIN_TO_HOST = PolicyUnit(
    name="PinToHost",
    description="Filters out all hosts the VM is not pinned to.",
    summary="VM pinned to other hosts",
    filter=pin_to_host_filter,
    filter_by_row=True,
)
MIGRATION = PolicyUnit(
    name="Migration",
    description="Prevents migrating a VM to the host it already runs on.",
    summary="source host of the migration",
    filter=migration_filter,
    filter_by_row=True,
)

SWAP = PolicyUnit(
    name="Swap",
    description="Filters out hosts that are swapping more than MaximumAllowedSwapUsage.",
    summary="host swapping",
    filter=swap_filter,
    filter_by_row=True,
    properties={"MaximumAllowedSwapUsage": MAX_ALLOWED_SWAP_USAGE},
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
HUGEPAGES = PolicyUnit(
    name="HugePages",
    description="Filters out hosts without enough free huge pages of the VM's page size (pending included).",
    summary="not enough free huge pages",
    filter=hugepages_filter,
    filter_by_row=True,
)
EMULATED_MACHINE = PolicyUnit(
    name="Emulated-Machine",
    description="Runs VMs only on hosts whose emulator supports the VM's machine type.",
    summary="unsupported emulated machine",
    filter=emulated_machine_filter,
    filter_by_row=True,
)
CPU_LEVEL = PolicyUnit(
    name="CPU-Level",
    description="Runs VMs only on hosts that offer the VM's CPU model.",
    summary="CPU model not offered",
    filter=cpu_level_filter,
    filter_by_row=True,
)
CLUSTER_IN_MAINTENANCE = PolicyUnit(
    name="ClusterInMaintenance",
    description="While the cluster is in maintenance, lets only HA VMs start (running VMs may migrate).",
    summary="cluster in maintenance",
    filter=cluster_in_maintenance_filter,
    filter_by_row=True,
)
MIGRATION_DOMAIN = PolicyUnit(
    name="MigrationDomain",
    description="Keeps only Up hosts of the VM's cluster as destinations.",
    summary="outside the migration domain",
    filter=migration_domain_filter,
    filter_by_row=True,
)

FILTER_UNITS: tuple[PolicyUnit, ...] = (
    MEMORY,
    CPU,
    NETWORK,
    PIN_TO_HOST,
    MIGRATION,
    SWAP,
    CPU_OVERLOADED,
    CPU_TOPOLOGY,
    HUGEPAGES,
    EMULATED_MACHINE,
    CPU_LEVEL,
    CLUSTER_IN_MAINTENANCE,
    MIGRATION_DOMAIN,
)

__all__ = [
    "CLUSTER_IN_MAINTENANCE",
    "CPU",
    "CPU_LEVEL",
    "CPU_OVERCOMMIT_DURATION",
    "CPU_OVERLOADED",
    "CPU_TOPOLOGY",
    "EMULATED_MACHINE",
    "FILTER_UNITS",
    "HIGH_UTILIZATION",
    "HUGEPAGES",
    "MAX_ALLOWED_SWAP_USAGE",
    "MEMORY",
    "MIGRATION",
    "MIGRATION_DOMAIN",
    "NETWORK",
    "PIN_TO_HOST",
    "SPM_VCPU_CONSUMPTION",
    "SWAP",
    "VCPU_CONSUMPTION_PCT",
    "cluster_in_maintenance_filter",
    "cpu_filter",
    "cpu_level_filter",
    "cpu_overloaded_filter",
    "cpu_topology_filter",
    "current_host_mask",
    "emulated_machine_filter",
    "fmt_num",
    "hugepages_filter",
    "hugepages_needed",
    "max_scheduling_memory_mb",
    "memory_filter",
    "migration_domain_filter",
    "migration_filter",
    "network_filter",
    "pin_to_host_filter",
    "spm_load_share",
    "swap_filter",
    "vm_memory_need_mb",
]
