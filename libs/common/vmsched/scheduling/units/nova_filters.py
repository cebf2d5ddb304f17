"""OpenStack Nova filters, mapped onto VM clusters.

Nova's names and rules (nova/scheduler/filters/*.py), read against vmsched's HostTable:

* Nova aggregates are vmsched host groups: a host names its groups (`host_groups`), the groups'
  metadata is cluster data (`ClusterReport.host_groups`, read through `HostTable.group_metadata`).
  A metadata value is a string; where Nova splits it on commas (aggregate_metadata_get_by_host:
  extra specs, availability zones, tenants) so does vmsched, and values of several groups are
  pooled. Per-group numeric overrides (allocation ratios, maxima) take the minimum over the host's
  groups (Nova's validate_num_values); a value that does not parse is skipped, and with no usable
  value the unit's property is used (Nova falls back to its config option the same way).
* Nova's configuration options become the unit's custom properties (regexes invented here, each
  documented at its PropertySpec); a policy sets them like any oVirt property.
* Resource accounting is Nova's allocation view: RAM used = reserved + committed by the host's VMs
  + pending, against physical memory x ratio; vCPUs used = committed + pending against host CPUs
  (cores, or threads when the cluster counts threads) x ratio. Pending placements count everywhere
  vmsched has a pending column (RAM, vCPUs, instances; a pending start also counts as an I/O
  operation, like Nova's consume_from_request). There is no pending disk column, so DiskFilter sees
  the host's reported disk only (a HostTable change would be needed to count pending disk).
* `host_attribute(hosts, i, name)` is the host as Nova's HostState: what unscoped extra-spec keys
  (ComputeCapabilitiesFilter) and ``$attr`` references (JsonFilter) name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.errors import InvalidQuery
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props, prop_float, prop_int
from vmsched.scheduling.units.extra_specs import (
    AGGREGATE_SCOPE,
    CAPABILITIES_SCOPE,
    check_query,
    evaluate_query,
    lookup,
    match,
    spec_path,
    spec_string,
)
from vmsched.scheduling.units.helpers import fmt_num, vm_memory_need_mb

#: How many items (tenants, zones, hosts) a reason lists before "and N more".
_MAX_LISTED = 5


def _listed(items: Iterable[str]) -> str:
    values = list(items)
    shown = ", ".join(f"'{x}'" for x in values[:_MAX_LISTED])
    rest = len(values) - _MAX_LISTED
    return f"{shown} and {rest} more" if rest > 0 else shown


def _mask(hosts: HostTable, keep: Callable[[int], bool]) -> BoolArray:
    return np.fromiter((keep(i) for i in range(len(hosts))), dtype=np.bool_, count=len(hosts))


# ------------------------------------------------------------------------------ host attributes
def _ram_used(hosts: HostTable) -> FloatArray:
    return hosts.reserved_mem_mb + hosts.mem_committed_mb + hosts.pending_mem_mb


def _vcpus_used(hosts: HostTable) -> FloatArray:
    return hosts.vcpus_committed + hosts.pending_vcpus


def _instances(hosts: HostTable) -> FloatArray:
    return hosts.vm_count + hosts.pending_vm_count


def _io_ops(hosts: HostTable) -> FloatArray:
    return hosts.num_io_ops + hosts.pending_vm_count


def _ram_used_at(t: HostTable, i: int) -> float:
    return float(t.reserved_mem_mb[i] + t.mem_committed_mb[i] + t.pending_mem_mb[i])


def _cpus_at(t: HostTable, i: int) -> float:
    """HostTable.effective_cpus for one host, without building the whole column."""
    if t.settings.count_threads_as_cores and t.cpu_threads[i] > 0:
        return float(t.cpu_threads[i])
    return float(t.cpu_cores[i])


_Getter = Callable[[HostTable, int], Any]


def _service_at(t: HostTable, i: int) -> dict[str, Any]:
    """Nova HostState.service, the host's compute service record, for what vmsched knows of it:
    ``disabled`` is the inverse of the host's enabled flag (Nova's commonest query is
    ``["not", "$service.disabled"]``), ``host`` its id."""
    return {"disabled": not bool(t.enabled[i]), "host": t.ids[i]}


#: Nova HostState attribute names -> the value on a vmsched host. Every HostTable column is also an
#: attribute under its own name (below), so both vocabularies work. Nova's scheduler guide names
#: $free_ram_mb, $free_disk_mb, $hypervisor_hostname, $total_usable_ram_mb, $vcpus_total and
#: $vcpus_used; its own queries also use $service.disabled.
_NOVA_ATTRIBUTES: dict[str, _Getter] = {
    "service": _service_at,
    "failed_builds": lambda t, i: float(t.build_failures[i]),
    # Nova's cpu_info is JSON text; vmsched hosts report it among their capabilities.
    "cpu_info": lambda t, i: t.capabilities[i].get("cpu_info"),
    "host": lambda t, i: t.ids[i],
    "nodename": lambda t, i: t.ids[i],
    "hypervisor_hostname": lambda t, i: t.ids[i],
    "total_usable_ram_mb": lambda t, i: float(t.physical_mem_mb[i]),
    "memory_mb_used": lambda t, i: _ram_used_at(t, i),
    "free_ram_mb": lambda t, i: float(t.physical_mem_mb[i]) - _ram_used_at(t, i),
    "total_usable_disk_gb": lambda t, i: float(t.disk_total_mb[i]) / 1024.0,
    "disk_mb_used": lambda t, i: float(t.disk_total_mb[i] - t.disk_free_mb[i]),
    "free_disk_mb": lambda t, i: float(t.disk_free_mb[i]),
    "vcpus_total": lambda t, i: _cpus_at(t, i),
    "vcpus_used": lambda t, i: float(t.vcpus_committed[i] + t.pending_vcpus[i]),
    "num_instances": lambda t, i: float(t.vm_count[i] + t.pending_vm_count[i]),
    "num_io_ops": lambda t, i: float(t.num_io_ops[i] + t.pending_vm_count[i]),
    "cpu_arch": lambda t, i: t.arch[i],
    "availability_zone": lambda t, i: t.labels[i].get("availability_zone"),
}
_COLUMN_ATTRIBUTES = (
    "cpu_sockets",
    "cpu_cores",
    "cpu_threads",
    "cpu_usage_pct",
    "physical_mem_mb",
    "mem_free_mb",
    "swap_total_mb",
    "swap_free_mb",
    "reserved_mem_mb",
    "disk_total_mb",
    "disk_free_mb",
    "hypervisor_version",
    "vm_count",
    "mem_committed_mb",
    "vcpus_committed",
    "cpus_pinned",
    "ha_vm_count",
    "build_failures",
    "pending_mem_mb",
    "pending_vcpus",
    "pending_vm_count",
    "up",
    "is_spm",
    "enabled",
    "networks",
    "arch",
    "hypervisor_type",
    "cpu_models",
    "emulated_machines",
    "labels",
    "host_groups",
    "capabilities",
    "metrics",
)


def _column_getter(name: str) -> _Getter:
    def get(t: HostTable, i: int) -> Any:
        value = getattr(t, name)[i]
        return value.item() if isinstance(value, np.generic) else value

    return get


HOST_ATTRIBUTES: Mapping[str, _Getter] = {
    **{name: _column_getter(name) for name in _COLUMN_ATTRIBUTES},
    **_NOVA_ATTRIBUTES,
}


def host_attribute(hosts: HostTable, i: int, name: str) -> Any:
    """Host i's attribute `name` (Nova HostState or vmsched column name), None if there is none."""
    getter = HOST_ATTRIBUTES.get(name)
    if getter is None:
        return None
    value = getter(hosts, i)
    return None if isinstance(value, float) and math.isnan(value) else value


# ------------------------------------------------------------------------------- group metadata
def group_values(hosts: HostTable, i: int, key: str) -> set[str]:
    """Values of metadata `key` over host i's groups, comma-split and stripped (Nova's
    aggregate_metadata_get_by_host)."""
    out: set[str] = set()
    if not hosts.settings.host_groups:
        return out
    for meta in hosts.group_metadata(i):
        raw = meta.get(key)
        if raw is not None:
            out.update(part.strip() for part in raw.split(","))
    return out


def group_minimum(hosts: HostTable, key: str, fallback: float) -> tuple[FloatArray, BoolArray]:
    """Per host: the minimum numeric value of metadata `key` over its groups, or `fallback`.

    Returns (values, from_groups): from_groups is True where a group supplied the value. Values that
    do not parse as numbers are skipped (Nova logs them and falls back to its option).
    """
    n = len(hosts)
    values = np.full(n, fallback, dtype=np.float64)
    from_groups = np.zeros(n, dtype=np.bool_)
    if not hosts.settings.host_groups:
        return values, from_groups
    for i in range(n):
        found: list[float] = []
        for meta in hosts.group_metadata(i):
            raw = meta.get(key)
            if raw is None:
                continue
            try:
                number = float(raw)
            except ValueError:
                continue
            if math.isfinite(number):
                found.append(number)
        if found:
            values[i] = min(found)
            from_groups[i] = True
    return values, from_groups


def _ratio_origin(from_groups: BoolArray, i: int, key: str) -> str:
    return f" ({key} of the host's groups)" if from_groups[i] else ""


# -------------------------------------------------------------------------------------- properties
#: "0." then digits with a nonzero among them is written 0\.0*[1-9][0-9]*: the same language as
#: 0\.[0-9]*[1-9][0-9]*, whose two loops over digits backtrack quadratically on "0.111...1x".
_POSITIVE_DECIMAL = r"^((0\.0*[1-9][0-9]*)|([1-9][0-9]*(\.[0-9]+)?))$"
_METRIC_SETTING = r"^(\s*[^=,\s]+\s*=\s*-?[0-9]+(\.[0-9]+)?\s*(,\s*[^=,\s]+\s*=\s*-?[0-9]+(\.[0-9]+)?\s*)*)?$"

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
#: Nova's service_down_time (default 60 s): a positive integer number of seconds.
SERVICE_DOWN_TIME = PropertySpec(r"^([1-9][0-9]*)$", "60", "seconds without a heartbeat before a host is down")
#: Nova's metrics.weight_setting: "name=ratio" pairs separated by commas, possibly empty (the
#: default: no metric required). The Metrics weigher reads the same property.
WEIGHT_SETTING = PropertySpec(_METRIC_SETTING, "", "metrics weighed, as name=ratio,... (Nova)")
#: Nova's default_availability_zone (default "nova"): the zone of a host no zone is given for.
DEFAULT_ZONE = PropertySpec(r"^[A-Za-z0-9_.:\-]+$", "nova", "zone of hosts without an availability zone")


# -------------------------------------------------------------------------------------- AllHosts
def all_hosts_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova AllHostsFilter: keeps every host."""
    return FilterVerdict.keep_all(hosts)


# --------------------------------------------------------------------------------------- Compute
def compute_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova ComputeFilter: the host's compute service is enabled and up (fresh heartbeat).

    Up means |as_of - reported_at| <= ServiceDownTime (Nova's DB servicegroup driver takes the
    absolute age, so a heartbeat from the far future is not fresh either). A host that never
    reported a heartbeat is down. When the decision has no instant (as_of is NaN), ages cannot be
    judged: hosts with a heartbeat pass that part of the check, hosts without one are still down.
    """
    down_after = prop_int(props, "ServiceDownTime", 60)
    age = hosts.as_of - hosts.reported_at
    has_beat = ~np.isnan(hosts.reported_at)
    if math.isnan(hosts.as_of):
        fresh = has_beat
    else:
        with np.errstate(invalid="ignore"):
            fresh = has_beat & (np.abs(age) <= down_after)
    keep = hosts.enabled & fresh

    def reason(i: int) -> str:
        if not hosts.enabled[i]:
            return "compute service disabled"
        if not has_beat[i]:
            return "no heartbeat ever reported"
        if age[i] < 0:
            return f"heartbeat {fmt_num(-age[i])} s in the future > service down time {down_after} s"
        return f"last heartbeat {fmt_num(age[i])} s ago > service down time {down_after} s"

    return FilterVerdict.from_mask(hosts, keep, reason)


# --------------------------------------------------------------------------- ComputeCapabilities
def _capability_requirements(vm: VmSpec) -> list[tuple[str, bool, list[str], str]]:
    """(key, scoped, path, requirement) of the extra specs ComputeCapabilitiesFilter checks.

    Unscoped keys count only when they name a host attribute (Nova: hasattr(host_state, key));
    other namespaces are ignored.
    """
    out: list[tuple[str, bool, list[str], str]] = []
    for key, requirement in vm.extra_specs.items():
        parsed = spec_path(key, CAPABILITIES_SCOPE)
        if parsed is None:
            continue
        scoped, path = parsed
        if not scoped and path[0] not in HOST_ATTRIBUTES:
            continue
        out.append((key, scoped, path, requirement))
    return out


def _capability(hosts: HostTable, i: int, scoped: bool, path: list[str]) -> Any:
    """``capabilities:a:b``: a.b in the host's capabilities, else in its attributes (Nova starts the
    walk at HostState). Unscoped: the attribute itself."""
    if scoped:
        found = lookup(hosts.capabilities[i], path)
        if found is not None:
            return found
    head = host_attribute(hosts, i, path[0])
    return lookup(head, path[1:]) if len(path) > 1 else head


def _shown(value: str, limit: int = 200) -> str:
    """A host value for a reason, clipped: a capability may be KBs of JSON, and a reason is bounded
    (FilteredHost.reason), so an unclipped one would fail the whole filter reply."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compute_capabilities_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova ComputeCapabilitiesFilter: every applicable extra spec matches the host's value.

    A scoped key the host does not report removes the host (Nova: capability None -> False).
    """
    required = _capability_requirements(vm)
    if not required or len(hosts) == 0:
        return FilterVerdict.keep_all(hosts)
    failures: dict[int, str] = {}
    for i in range(len(hosts)):
        for key, scoped, path, requirement in required:
            value = spec_string(_capability(hosts, i, scoped, path))
            if value is None:
                failures[i] = f"extra spec {key!r} = {requirement!r}: the host does not report it"
                break
            if not match(value, requirement):
                failures[i] = f"extra spec {key!r} = {requirement!r} not met by host value {_shown(value)}"
                break
    keep = _mask(hosts, lambda i: i not in failures)
    return FilterVerdict.from_mask(hosts, keep, failures.__getitem__)


# --------------------------------------------------------------------- AggregateInstanceExtraSpecs
def aggregate_instance_extra_specs_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova AggregateInstanceExtraSpecsFilter: unscoped or ``aggregate_instance_extra_specs:``
    scoped extra specs must be matched by the metadata of one of the host's groups.

    The key must be in the metadata of the host's groups (else the host is removed, as in Nova,
    which is why unscoped flavor keys meant for other filters should be scoped); the comma-split
    values of all its groups are alternatives: one matching is enough.
    """
    required: list[tuple[str, str, str]] = []
    for key, requirement in vm.extra_specs.items():
        if ":" in key:
            scope, _, rest = key.partition(":")
            if scope != AGGREGATE_SCOPE or not rest:
                continue
            required.append((key, rest, requirement))
        else:
            required.append((key, key, requirement))
    if not required or len(hosts) == 0:
        return FilterVerdict.keep_all(hosts)
    failures: dict[int, str] = {}
    for i in range(len(hosts)):
        for key, meta_key, requirement in required:
            values = group_values(hosts, i, meta_key)
            if not values:
                failures[i] = f"extra spec {key!r}: no host group of the host has metadata {meta_key!r}"
                break
            if not any(match(v, requirement) for v in values):
                failures[i] = (
                    f"extra spec {key!r} = {requirement!r} not met by group metadata {_listed(sorted(values))}"
                )
                break
    keep = _mask(hosts, lambda i: i not in failures)
    return FilterVerdict.from_mask(hosts, keep, failures.__getitem__)


# ------------------------------------------------------------------------------------------ RAM
def _ram(hosts: HostTable, vm: VmSpec, ratio: FloatArray, from_groups: BoolArray) -> FilterVerdict:
    """Nova RamFilter: physical x ratio - used >= requested, and requested <= physical (an instance
    may overcommit against other instances, never against itself). Requested is the VM's memory
    plus overhead: the amount `used` (committed, pending) counts for a placed VM."""
    need = vm_memory_need_mb(vm)
    total = hosts.physical_mem_mb
    used = _ram_used(hosts)
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
    used = _vcpus_used(hosts)
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
        hosts, _instances(hosts), hosts.vm_count, "instances", "pending", limit, from_groups, "max_instances_per_host"
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
        hosts, _io_ops(hosts), hosts.num_io_ops, "I/O ops", "pending starts", limit, from_groups, "max_io_ops_per_host"
    )


def io_ops_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    limit = float(prop_int(props, "MaxIoOpsPerHost", 8))
    return _io_ops_verdict(hosts, np.full(len(hosts), limit), np.zeros(len(hosts), dtype=np.bool_))


def aggregate_io_ops_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    fallback = float(prop_int(props, "MaxIoOpsPerHost", 8))
    return _io_ops_verdict(hosts, *group_minimum(hosts, "max_io_ops_per_host", fallback))


# ----------------------------------------------------------------------- AggregateMultiTenancy
def aggregate_multi_tenancy_isolation(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova AggregateMultiTenancyIsolation: a host in a group with ``filter_tenant_id*`` metadata
    (comma lists; Nova also reads filter_tenant_id_2, ...) takes only those tenants' VMs. A VM with
    no tenant cannot go there. Hosts in no such group take every tenant."""
    if not hosts.settings.host_groups:
        return FilterVerdict.keep_all(hosts)
    allowed: list[set[str]] = []
    for i in range(len(hosts)):
        tenants: set[str] = set()
        for meta in hosts.group_metadata(i):
            for key, raw in meta.items():
                if key.startswith("filter_tenant_id"):
                    tenants.update(t.strip() for t in raw.split(",") if t.strip())
        allowed.append(tenants)
    keep = _mask(hosts, lambda i: not allowed[i] or vm.tenant_id in allowed[i])
    who = "no tenant" if vm.tenant_id is None else f"tenant {vm.tenant_id!r}"
    return FilterVerdict.from_mask(
        hosts, keep, lambda i: f"host isolated to tenants {_listed(sorted(allowed[i]))}, not {who}"
    )


# -------------------------------------------------------------------------------------- Metrics
def metric_names(setting: str) -> list[str]:
    """Metric names of a WeightSetting ("cpu.percent=1.0, mem.free=-1" -> cpu.percent, mem.free);
    entries without "=" or without a name are skipped (Nova's parse_options logs and skips them)."""
    names: list[str] = []
    for part in setting.split(","):
        name, sep, _ = part.partition("=")
        if sep and name.strip():
            names.append(name.strip())
    return list(dict.fromkeys(names))


def metrics_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova MetricsFilter: the host reports every metric the WeightSetting weighs (so the Metrics
    weigher never meets a hole). An empty setting requires nothing."""
    names = metric_names(props.get("WeightSetting") or "")
    if not names:
        return FilterVerdict.keep_all(hosts)
    missing = [[m for m in names if m not in hosts.metrics[i]] for i in range(len(hosts))]
    keep = _mask(hosts, lambda i: not missing[i])
    return FilterVerdict.from_mask(
        hosts, keep, lambda i: f"metric{'s' if len(missing[i]) > 1 else ''} {_listed(missing[i])} not reported"
    )


# ---------------------------------------------------------------------------- AvailabilityZone
def host_zones(hosts: HostTable, i: int) -> set[str]:
    """Host i's zones: its availability_zone label and its groups' availability_zone metadata
    (comma-split). Empty when neither says."""
    zones = group_values(hosts, i, "availability_zone")
    label = hosts.labels[i].get("availability_zone")
    if label:
        zones.update(z.strip() for z in label.split(","))
    zones.discard("")
    return zones


def availability_zone_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova AvailabilityZoneFilter: the host is in one of the requested zones (the request may list
    several, comma-separated). A host without a zone is in DefaultAvailabilityZone ("nova")."""
    wanted = {z.strip() for z in (vm.availability_zone or "").split(",")} - {""}
    if not wanted:
        return FilterVerdict.keep_all(hosts)
    default = props.get("DefaultAvailabilityZone") or "nova"
    zones = [host_zones(hosts, i) or {default} for i in range(len(hosts))]
    keep = _mask(hosts, lambda i: not wanted.isdisjoint(zones[i]))
    asked = _listed(sorted(wanted))
    return FilterVerdict.from_mask(
        hosts, keep, lambda i: f"host in zone {_listed(sorted(zones[i]))}, requested {asked}"
    )


# ---------------------------------------------------------------------------------------- Retry
def retry_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova RetryFilter: hosts already tried for this VM (a failed start) are not tried again."""
    if not vm.tried_hosts:
        return FilterVerdict.keep_all(hosts)
    tried = frozenset(vm.tried_hosts)
    keep = np.fromiter((h not in tried for h in hosts.ids), dtype=np.bool_, count=len(hosts))
    return FilterVerdict.from_mask(hosts, keep, lambda i: "already tried for this VM (a previous start failed)")


# ------------------------------------------------------------------------------------- JsonFilter
def json_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova JsonFilter: the VM's query (extra_specs module: the grammar, with real negation) holds
    for the host; ``$name`` is a host attribute (Nova HostState or vmsched column names).
    A malformed query removes every host, naming the fault (Nova raises out of the filter)."""
    query = vm.query
    if not query or len(hosts) == 0:
        return FilterVerdict.keep_all(hosts)
    try:
        check_query(query)
    except InvalidQuery as exc:
        bad = f"invalid JsonFilter query: {exc}"
        return FilterVerdict.from_mask(hosts, np.zeros(len(hosts), dtype=np.bool_), lambda i: bad)
    keep = _mask(hosts, lambda i: bool(evaluate_query(query, lambda name: host_attribute(hosts, i, name))))
    text = _short_query(query)
    return FilterVerdict.from_mask(hosts, keep, lambda i: f"query {text} is false for this host")


def _short_query(query: list[Any], limit: int = 200) -> str:
    text = repr(query)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------ ImageProperties
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "i386": "i686", "i486": "i686", "i586": "i686"}
_ARCH_ALIASES |= {"x86_32": "i686", "x86_32p": "i686", "arm64": "aarch64"}
_HV_ALIASES = {"xapi": "xen"}


def canonical_arch(name: str) -> str:
    """Nova's arch.canonicalize: lower case, amd64 -> x86_64, i386..i586 -> i686 (+ arm64 -> aarch64)."""
    lowered = name.strip().lower()
    return _ARCH_ALIASES.get(lowered, lowered)


def canonical_hv_type(name: str) -> str:
    """Nova's hv_type.canonicalize: lower case, xapi -> xen."""
    lowered = name.strip().lower()
    return _HV_ALIASES.get(lowered, lowered)


def version_tuple(version: int) -> tuple[int, int, int]:
    """Nova's convert_version_to_str, as a tuple: 1005003 -> (1, 5, 3)."""
    return version // 1_000_000, version // 1_000 % 1_000, version % 1_000


_VERSION_CLAUSE = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*([0-9]+(?:\.[0-9]+){0,2})\s*$")
_VERSION_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def version_satisfies(version: tuple[int, ...], requirement: str) -> bool | None:
    """Does `version` meet every comma-separated clause (">=6.0, <7.0")? None if unparseable.

    Versions compare as integer tuples padded with zeros ("6" == "6.0.0"), like distutils'
    VersionPredicate that Nova uses.
    """
    clauses = [c for c in requirement.split(",") if c.strip()]
    if not clauses:
        return None
    ok = True
    for clause in clauses:
        parsed = _VERSION_CLAUSE.match(clause)
        if parsed is None:
            return None
        wanted = tuple(int(p) for p in parsed.group(2).split("."))
        wanted = wanted + (0,) * (3 - len(wanted))
        ok = ok and _VERSION_OPS[parsed.group(1)](version, wanted)
    return ok


def _image_prop(vm: VmSpec, *names: str) -> str | None:
    for name in names:
        value = vm.image_properties.get(name)
        if value:
            return value
    return None


def image_properties_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova ImagePropertiesFilter: the image's architecture (hw_architecture, or the legacy
    architecture) and hypervisor type (img_hv_type, or hypervisor_type) must be the host's, after
    Nova's canonicalization; img_hv_requested_version (or hypervisor_version_requires, e.g.
    ">=6.0, <7.0") must be met by the host's hypervisor version (int 6001000 = 6.1.0). Properties
    the image does not set pass; a host reporting version 0 (unknown) passes the version check, as
    in Nova. Unlike Nova, which matches (arch, hv type, vm mode) against the host's list of
    supported instances, vmsched hosts report one arch and one hypervisor type, and no VM modes
    (hw_vm_mode is not checked)."""
    arch = _image_prop(vm, "hw_architecture", "architecture")
    hv_type = _image_prop(vm, "img_hv_type", "hypervisor_type")
    wanted_version = _image_prop(vm, "img_hv_requested_version", "hypervisor_version_requires")
    if arch is None and hv_type is None and wanted_version is None:
        return FilterVerdict.keep_all(hosts)
    failures: dict[int, str] = {}
    for i in range(len(hosts)):
        if arch is not None and canonical_arch(hosts.arch[i]) != canonical_arch(arch):
            failures[i] = f"architecture {hosts.arch[i]!r}, image needs {arch!r}"
        elif hv_type is not None and canonical_hv_type(hosts.hypervisor_type[i]) != canonical_hv_type(hv_type):
            failures[i] = f"hypervisor type {hosts.hypervisor_type[i]!r}, image needs {hv_type!r}"
        elif wanted_version is not None and hosts.hypervisor_version[i] > 0:
            have = version_tuple(int(hosts.hypervisor_version[i]))
            verdict = version_satisfies(have, wanted_version)
            if verdict is None:
                failures[i] = f"image's hypervisor version requirement {wanted_version!r} does not parse"
            elif not verdict:
                shown = ".".join(map(str, have))
                failures[i] = f"hypervisor version {shown}, image needs {wanted_version!r}"
    keep = _mask(hosts, lambda i: i not in failures)
    return FilterVerdict.from_mask(hosts, keep, failures.__getitem__)


# ---------------------------------------------------------------------------------------- units
def _filter(name: str, description: str, summary: str, fn: Any, **properties: PropertySpec) -> PolicyUnit:
    return PolicyUnit(name=name, description=description, summary=summary, filter=fn, properties=properties)


ALL_HOSTS = _filter("AllHostsFilter", "Nova: keeps every host (does no filtering).", "", all_hosts_filter)
COMPUTE = _filter(
    "ComputeFilter",
    "Nova: keeps hosts whose compute service is enabled and whose heartbeat is fresh.",
    "compute service disabled or down",
    compute_filter,
    ServiceDownTime=SERVICE_DOWN_TIME,
)
COMPUTE_CAPABILITIES = _filter(
    "ComputeCapabilitiesFilter",
    "Nova: keeps hosts whose attributes and capabilities satisfy the VM's extra specs.",
    "extra specs not satisfied by host capabilities",
    compute_capabilities_filter,
)
AGGREGATE_INSTANCE_EXTRA_SPECS = _filter(
    "AggregateInstanceExtraSpecsFilter",
    "Nova: keeps hosts whose host-group metadata satisfies the VM's (aggregate-scoped) extra specs.",
    "extra specs not satisfied by host group metadata",
    aggregate_instance_extra_specs_filter,
)
RAM = _filter(
    "RamFilter",
    "Nova: keeps hosts with enough RAM under the RAM allocation ratio.",
    "insufficient RAM under allocation ratio",
    ram_filter,
    RamAllocationRatio=RAM_RATIO,
)
AGGREGATE_RAM = _filter(
    "AggregateRamFilter",
    "Nova: RamFilter with the ratio from host-group metadata ram_allocation_ratio (minimum).",
    "insufficient RAM under allocation ratio",
    aggregate_ram_filter,
    RamAllocationRatio=RAM_RATIO,
)
CORE = _filter(
    "CoreFilter",
    "Nova: keeps hosts with enough vCPUs under the CPU allocation ratio.",
    "insufficient vCPUs under allocation ratio",
    core_filter,
    CpuAllocationRatio=CPU_RATIO,
)
AGGREGATE_CORE = _filter(
    "AggregateCoreFilter",
    "Nova: CoreFilter with the ratio from host-group metadata cpu_allocation_ratio (minimum).",
    "insufficient vCPUs under allocation ratio",
    aggregate_core_filter,
    CpuAllocationRatio=CPU_RATIO,
)
DISK = _filter(
    "DiskFilter",
    "Nova: keeps hosts with enough disk under the disk allocation ratio.",
    "insufficient disk under allocation ratio",
    disk_filter,
    DiskAllocationRatio=DISK_RATIO,
)
AGGREGATE_DISK = _filter(
    "AggregateDiskFilter",
    "Nova: DiskFilter with the ratio from host-group metadata disk_allocation_ratio (minimum).",
    "insufficient disk under allocation ratio",
    aggregate_disk_filter,
    DiskAllocationRatio=DISK_RATIO,
)
NUM_INSTANCES = _filter(
    "NumInstancesFilter",
    "Nova: keeps hosts running fewer instances than MaxInstancesPerHost.",
    "too many instances",
    num_instances_filter,
    MaxInstancesPerHost=MAX_INSTANCES,
)
AGGREGATE_NUM_INSTANCES = _filter(
    "AggregateNumInstancesFilter",
    "Nova: NumInstancesFilter with the limit from host-group metadata max_instances_per_host (minimum).",
    "too many instances",
    aggregate_num_instances_filter,
    MaxInstancesPerHost=MAX_INSTANCES,
)
IO_OPS = _filter(
    "IoOpsFilter",
    "Nova: keeps hosts with fewer concurrent I/O-heavy operations than MaxIoOpsPerHost.",
    "too many I/O operations",
    io_ops_filter,
    MaxIoOpsPerHost=MAX_IO_OPS,
)
AGGREGATE_IO_OPS = _filter(
    "AggregateIoOpsFilter",
    "Nova: IoOpsFilter with the limit from host-group metadata max_io_ops_per_host (minimum).",
    "too many I/O operations",
    aggregate_io_ops_filter,
    MaxIoOpsPerHost=MAX_IO_OPS,
)
AGGREGATE_MULTI_TENANCY = _filter(
    "AggregateMultiTenancyIsolation",
    "Nova: hosts in host groups with filter_tenant_id metadata take only those tenants' VMs.",
    "host isolated to other tenants",
    aggregate_multi_tenancy_isolation,
)
METRICS = _filter(
    "MetricsFilter",
    "Nova: keeps hosts that report every metric named in WeightSetting.",
    "missing weighed metrics",
    metrics_filter,
    WeightSetting=WEIGHT_SETTING,
)
AVAILABILITY_ZONE = _filter(
    "AvailabilityZoneFilter",
    "Nova: keeps hosts in the VM's availability zone (label or host-group metadata).",
    "other availability zone",
    availability_zone_filter,
    DefaultAvailabilityZone=DEFAULT_ZONE,
)
RETRY = _filter(
    "RetryFilter",
    "Nova: removes hosts already tried for this VM.",
    "already tried",
    retry_filter,
)
JSON = _filter(
    "JsonFilter",
    "Nova: keeps hosts for which the VM's JSON query holds.",
    "JSON query not satisfied",
    json_filter,
)
IMAGE_PROPERTIES = _filter(
    "ImagePropertiesFilter",
    "Nova: keeps hosts matching the image's architecture, hypervisor type and version.",
    "image properties not supported",
    image_properties_filter,
)

NOVA_FILTER_UNITS: tuple[PolicyUnit, ...] = (
    ALL_HOSTS,
    COMPUTE,
    COMPUTE_CAPABILITIES,
    AGGREGATE_INSTANCE_EXTRA_SPECS,
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
    AGGREGATE_MULTI_TENANCY,
    METRICS,
    AVAILABILITY_ZONE,
    RETRY,
    JSON,
    IMAGE_PROPERTIES,
)

__all__ = [
    "HOST_ATTRIBUTES",
    "NOVA_FILTER_UNITS",
    "aggregate_core_filter",
    "aggregate_disk_filter",
    "aggregate_instance_extra_specs_filter",
    "aggregate_io_ops_filter",
    "aggregate_multi_tenancy_isolation",
    "aggregate_num_instances_filter",
    "aggregate_ram_filter",
    "all_hosts_filter",
    "availability_zone_filter",
    "canonical_arch",
    "canonical_hv_type",
    "compute_capabilities_filter",
    "compute_filter",
    "core_filter",
    "disk_filter",
    "group_minimum",
    "group_values",
    "host_attribute",
    "host_zones",
    "image_properties_filter",
    "io_ops_filter",
    "json_filter",
    "metric_names",
    "metrics_filter",
    "num_instances_filter",
    "ram_filter",
    "retry_filter",
    "version_satisfies",
    "version_tuple",
]
