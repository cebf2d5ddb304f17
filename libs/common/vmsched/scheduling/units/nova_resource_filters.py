"""Nova's resource filters, mapped onto VM clusters: RamFilter, CoreFilter, DiskFilter,
NumInstancesFilter and IoOpsFilter, each with its Aggregate variant.

* Resource accounting is Nova's allocation view (the used amounts are counted in nova_attributes):
  RAM used against physical memory x ratio; vCPUs used against host CPUs (cores, or threads when
  the cluster counts threads) x ratio. Pending placements count everywhere vmsched has a pending
  column (RAM, vCPUs, instances; a pending start also counts as an I/O operation, like Nova's
  consume_from_request). There is no pending disk column, so DiskFilter sees the host's reported
  disk only (a HostTable change would be needed to count pending disk).
* An Aggregate variant takes its ratio or limit from the host's groups' metadata (the minimum over
  the groups, `group_minimum`), else from the unit's property; a reason says when a group set it.
* Nova's configuration options become the unit's custom properties (regexes invented here, each
  documented at its PropertySpec); a policy sets them like any oVirt property.
"""

from __future__ import annotations

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props, prop_float, prop_int
from vmsched.scheduling.units.helpers import fmt_num, vm_memory_need_mb
from vmsched.scheduling.units.nova_attributes import group_minimum, num_instances, num_io_ops, ram_used_mb, vcpus_used

# -------------------------------------------------------------------------------------- properties
#: "0." then digits with a nonzero among them is written 0\.0*[1-9][0-9]*: the same language as
#: 0\.[0-9]*[1-9][0-9]*, whose two loops over digits backtrack quadratically on "0.111...1x".
_POSITIVE_DECIMAL = r"^((0\.0*[1-9][0-9]*)|([1-9][0-9]*(\.[0-9]+)?))$"

#: Nova's ram_allocation_ratio (default 1.5): a positive decimal ("1", "1.5", "0.9").
RAM_RATIO = PropertySpec(_POSITIVE_DECIMAL, "1.5", "virtual to physical RAM allocation ratio (Nova)")
#: Nova's cpu_allocation_ratio (default 16.0): a positive decimal.
CPU_RATIO = PropertySpec(_POSITIVE_DECIMAL, "16.0", "virtual to physical CPU allocation ratio (Nova)")
#: Nova's disk_allocation_ratio (default 1.0): a positive decimal.
DISK_RATIO = PropertySpec(_POSITIVE_DECIMAL, "1.0", "virtual to physical disk allocation ratio (Nova)")
#: Nova's filter_scheduler.max_instances_per_host (default 50): a positive integer.
MAX_INSTANCES = PropertySpec(r"^([1-9][0-9]*)$", "50", "instances a host may run (Nova)")
#: Nova's filter_scheduler.max_io_ops_per_host (default 8): an integer >= 0 (0 lets no host pass).
MAX_IO_OPS = PropertySpec(r"^(0|[1-9][0-9]*)$", "8", "concurrent I/O-heavy operations per host (Nova)")


def _ratio_origin(from_groups: BoolArray, i: int, key: str) -> str:
    return f" ({key} of the host's groups)" if from_groups[i] else ""


# ------------------------------------------------------------------------------------------ RAM
def _ram(hosts: HostTable, vm: VmSpec, ratio: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova RamFilter: physical x ratio - used >= requested, and requested <= physical (an instance
    may overcommit against other instances, never against itself). Requested is the VM's memory
    plus overhead: the amount `used` (committed, pending) counts for a placed VM."""
    need = vm_memory_need_mb(vm)
    total = hosts.physical_mem_mb
    used = ram_used_mb(hosts)
    usable = total * ratio - used
    itself = total >= need
    keep = itself & (usable >= need)

    def reason(i: int) -> str:
        if not itself[i]:
            return f"total RAM {fmt_num(total[i])} MB < requested {fmt_num(need)} MB"
        return (
            f"total RAM {fmt_num(total[i])} MB x ratio {fmt_num(ratio[i])}"
            f"{_ratio_origin(from_groups, i, 'ram_allocation_ratio')} - used {fmt_num(used[i])} MB"
            f" = {fmt_num(usable[i])} MB < requested {fmt_num(need)} MB"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def ram_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    ratio = prop_float(props, "RamAllocationRatio", 1.5)
    return _ram(hosts, vm, np.full(len(hosts), ratio), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_ram_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    return _ram(hosts, vm, *group_minimum(hosts, "ram_allocation_ratio", prop_float(props, "RamAllocationRatio", 1.5)))


# ----------------------------------------------------------------------------------------- Core
def _core(hosts: HostTable, vm: VmSpec, ratio: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova CoreFilter: CPUs x ratio - used vCPUs >= requested, and requested <= CPUs. A host that
    reports no CPUs passes (Nova's "fail safe": CPU collection broken, nothing to check)."""
    cpus = hosts.effective_cpus
    used = vcpus_used(hosts)
    limit = cpus * ratio
    free = limit - used
    unknown = cpus <= 0
    itself = cpus >= vm.vcpus
    keep = unknown | (itself & (free >= vm.vcpus))
    unit = "threads" if hosts.settings.count_threads_as_cores else "cores"

    def reason(i: int) -> str:
        if not itself[i]:
            return f"{fmt_num(cpus[i])} {unit} < requested {vm.vcpus} vCPUs"
        return (
            f"{fmt_num(cpus[i])} {unit} x ratio {fmt_num(ratio[i])}"
            f"{_ratio_origin(from_groups, i, 'cpu_allocation_ratio')} - used {fmt_num(used[i])} vCPUs"
            f" = {fmt_num(free[i])} vCPUs < requested {vm.vcpus}"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def core_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    ratio = prop_float(props, "CpuAllocationRatio", 16.0)
    return _core(hosts, vm, np.full(len(hosts), ratio), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_core_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    return _core(
        hosts, vm, *group_minimum(hosts, "cpu_allocation_ratio", prop_float(props, "CpuAllocationRatio", 16.0))
    )


# ----------------------------------------------------------------------------------------- Disk
def _disk(hosts: HostTable, vm: VmSpec, ratio: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova DiskFilter: total disk x ratio - used >= requested, and requested <= total disk.
    Used = total - free as the host reports it (no pending disk column exists). A VM asking for no
    disk passes everywhere."""
    need = float(vm.disk_mb)
    total = hosts.disk_total_mb
    used = total - hosts.disk_free_mb
    usable = total * ratio - used
    if need <= 0:
        return FilterVerdict.keep_all(hosts)
    itself = total >= need
    keep = itself & (usable >= need)

    def reason(i: int) -> str:
        if not itself[i]:
            return f"total disk {fmt_num(total[i])} MB < requested {fmt_num(need)} MB"
        return (
            f"total disk {fmt_num(total[i])} MB x ratio {fmt_num(ratio[i])}"
            f"{_ratio_origin(from_groups, i, 'disk_allocation_ratio')} - used {fmt_num(used[i])} MB"
            f" = {fmt_num(usable[i])} MB < requested {fmt_num(need)} MB"
        )

    return FilterVerdict.from_mask(hosts, keep, reason)


def disk_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    ratio = prop_float(props, "DiskAllocationRatio", 1.0)
    return _disk(hosts, vm, np.full(len(hosts), ratio), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_disk_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    return _disk(
        hosts, vm, *group_minimum(hosts, "disk_allocation_ratio", prop_float(props, "DiskAllocationRatio", 1.0))
    )


# -------------------------------------------------------------------------------- NumInstances
def _below_limit(
    hosts: HostTable,
    count: FloatArray,
    base: FloatArray,
    noun: str,
    pending_noun: str,
    limit: FloatArray,
    from_groups: BoolArray,
    key: str,
) -> FilterVerdict:
    """Keep hosts whose `count` (`base` + pending) is below `limit` (per host: a group may set it)."""
    keep = count < limit

    def reason(i: int) -> str:
        pending = hosts.pending_vm_count[i]
        have = f"{fmt_num(base[i])} {noun}"
        if pending:
            have += f" + {fmt_num(pending)} {pending_noun} = {fmt_num(count[i])}"
        return f"{have} >= max {fmt_num(limit[i])}{_ratio_origin(from_groups, i, key)}"

    return FilterVerdict.from_mask(hosts, keep, reason)


def _num_instances(hosts: HostTable, limit: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova NumInstancesFilter: instances (running + pending) < max instances per host."""
    return _below_limit(
        hosts,
        num_instances(hosts),
        hosts.vm_count,
        "instances",
        "pending",
        limit,
        from_groups,
        "max_instances_per_host",
    )


def num_instances_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    limit = float(prop_int(props, "MaxInstancesPerHost", 50))
    return _num_instances(hosts, np.full(len(hosts), limit), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_num_instances_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    fallback = float(prop_int(props, "MaxInstancesPerHost", 50))
    return _num_instances(hosts, *group_minimum(hosts, "max_instances_per_host", fallback))


# --------------------------------------------------------------------------------------- IoOps
def _io_ops_verdict(hosts: HostTable, limit: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova IoOpsFilter: I/O-heavy operations (reported + pending starts) < max per host."""
    return _below_limit(
        hosts,
        num_io_ops(hosts),
        hosts.num_io_ops,
        "I/O ops",
        "pending starts",
        limit,
        from_groups,
        "max_io_ops_per_host",
    )


def io_ops_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    limit = float(prop_int(props, "MaxIoOpsPerHost", 8))
    return _io_ops_verdict(hosts, np.full(len(hosts), limit), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_io_ops_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    fallback = float(prop_int(props, "MaxIoOpsPerHost", 8))
    return _io_ops_verdict(hosts, *group_minimum(hosts, "max_io_ops_per_host", fallback))


# ---------------------------------------------------------------------------------------- units


RAM = PolicyUnit(
    name="RamFilter",
    description="Nova: keeps hosts with enough RAM under the RAM allocation ratio.",
    summary="insufficient RAM under allocation ratio",
    filter=ram_filter,
    properties={"RamAllocationRatio": RAM_RATIO},
)
AGGREGATE_RAM = PolicyUnit(
    name="AggregateRamFilter",
    description="Nova: RamFilter with the ratio from host-group metadata ram_allocation_ratio (minimum).",
    summary="insufficient RAM under allocation ratio",
    filter=aggregate_ram_filter,
    properties={"RamAllocationRatio": RAM_RATIO},
)
CORE = PolicyUnit(
    name="CoreFilter",
    description="Nova: keeps hosts with enough vCPUs under the CPU allocation ratio.",
    summary="insufficient vCPUs under allocation ratio",
    filter=core_filter,
    properties={"CpuAllocationRatio": CPU_RATIO},
)
AGGREGATE_CORE = PolicyUnit(
    name="AggregateCoreFilter",
    description="Nova: CoreFilter with the ratio from host-group metadata cpu_allocation_ratio (minimum).",
    summary="insufficient vCPUs under allocation ratio",
    filter=aggregate_core_filter,
    properties={"CpuAllocationRatio": CPU_RATIO},
)
DISK = PolicyUnit(
    name="DiskFilter",
    description="Nova: keeps hosts with enough disk under the disk allocation ratio.",
    summary="insufficient disk under allocation ratio",
    filter=disk_filter,
    properties={"DiskAllocationRatio": DISK_RATIO},
)
AGGREGATE_DISK = PolicyUnit(
    name="AggregateDiskFilter",
    description="Nova: DiskFilter with the ratio from host-group metadata disk_allocation_ratio (minimum).",
    summary="insufficient disk under allocation ratio",
    filter=aggregate_disk_filter,
    properties={"DiskAllocationRatio": DISK_RATIO},
)
NUM_INSTANCES = PolicyUnit(
    name="NumInstancesFilter",
    description="Nova: keeps hosts running fewer instances than MaxInstancesPerHost.",
    summary="too many instances",
    filter=num_instances_filter,
    properties={"MaxInstancesPerHost": MAX_INSTANCES},
)
AGGREGATE_NUM_INSTANCES = PolicyUnit(
    name="AggregateNumInstancesFilter",
    description="Nova: NumInstancesFilter with the limit from host-group metadata max_instances_per_host (minimum).",
    summary="too many instances",
    filter=aggregate_num_instances_filter,
    properties={"MaxInstancesPerHost": MAX_INSTANCES},
)
IO_OPS = PolicyUnit(
    name="IoOpsFilter",
    description="Nova: keeps hosts with fewer concurrent I/O-heavy operations than MaxIoOpsPerHost.",
    summary="too many I/O operations",
    filter=io_ops_filter,
    properties={"MaxIoOpsPerHost": MAX_IO_OPS},
)
AGGREGATE_IO_OPS = PolicyUnit(
    name="AggregateIoOpsFilter",
    description="Nova: IoOpsFilter with the limit from host-group metadata max_io_ops_per_host (minimum).",
    summary="too many I/O operations",
    filter=aggregate_io_ops_filter,
    properties={"MaxIoOpsPerHost": MAX_IO_OPS},
)

#: The resource filters, in catalogue order; nova_filters.NOVA_FILTER_UNITS includes them.
NOVA_RESOURCE_FILTER_UNITS: tuple[PolicyUnit, ...] = (
    RAM,
    AGGREGATE_RAM,
    CORE,
    AGGREGATE_CORE,
    DISK,
    AGGREGATE_DISK,
    NUM_INSTANCES,
    AGGREGATE_NUM_INSTANCES,
    IO_OPS,
    AGGREGATE_IO_OPS,
)

__all__ = [
    "CPU_RATIO",
    "DISK_RATIO",
    "MAX_INSTANCES",
    "MAX_IO_OPS",
    "NOVA_RESOURCE_FILTER_UNITS",
    "RAM_RATIO",
    "aggregate_core_filter",
    "aggregate_disk_filter",
    "aggregate_io_ops_filter",
    "aggregate_num_instances_filter",
    "aggregate_ram_filter",
    "core_filter",
    "disk_filter",
    "io_ops_filter",
    "num_instances_filter",
    "ram_filter",
]
