"""Nova's view of a vmsched host: its HostState attributes, its host groups' (aggregates') metadata
and the used amounts Nova's filters count, read off a HostTable.

* Nova aggregates are vmsched host groups: a host names its groups (`host_groups`), the groups'
  metadata is cluster data (`ClusterReport.host_groups`, read through `HostTable.group_metadata`).
  A metadata value is a string; where Nova splits it on commas (aggregate_metadata_get_by_host:
  extra specs, availability zones, tenants) so does vmsched, and values of several groups are
  pooled. Per-group numeric overrides (allocation ratios, maxima) take the minimum over the host's
  groups (Nova's validate_num_values); a value that does not parse is skipped, and with no usable
  value the unit's property is used (Nova falls back to its config option the same way).
* Used amounts are Nova's allocation view: RAM used = reserved + committed by the host's VMs +
  pending; vCPUs used = committed + pending; instances = running + pending; I/O operations =
  reported + one per pending start (Nova's consume_from_request). The column functions
  (`ram_used_mb`, ...) and the per-host attributes (``memory_mb_used``, ...) count the same way.
* `host_attribute(hosts, i, name)` is the host as Nova's HostState: what unscoped extra-spec keys
  (ComputeCapabilitiesFilter) and ``$attr`` references (JsonFilter) name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable


# ---------------------------------------------------------------------------------- used amounts
def ram_used_mb(hosts: HostTable) -> FloatArray:
    """RAM used per host: reserved + committed by its VMs + pending (Nova's memory_mb_used)."""
    return hosts.reserved_mem_mb + hosts.mem_committed_mb + hosts.pending_mem_mb


def vcpus_used(hosts: HostTable) -> FloatArray:
    """vCPUs used per host: committed + pending (Nova's vcpus_used)."""
    return hosts.vcpus_committed + hosts.pending_vcpus


def num_instances(hosts: HostTable) -> FloatArray:
    """Instances per host: running + pending VMs (Nova's num_instances)."""
    return hosts.vm_count + hosts.pending_vm_count


def num_io_ops(hosts: HostTable) -> FloatArray:
    """I/O-heavy operations per host: reported + one per pending start (Nova's num_io_ops)."""
    return hosts.num_io_ops + hosts.pending_vm_count


# ------------------------------------------------------------------------------ host attributes
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


def host_zones(hosts: HostTable, i: int) -> set[str]:
    """Host i's zones: its availability_zone label and its groups' availability_zone metadata
    (comma-split). Empty when neither says."""
    zones = group_values(hosts, i, "availability_zone")
    label = hosts.labels[i].get("availability_zone")
    if label:
        zones.update(z.strip() for z in label.split(","))
    zones.discard("")
    return zones


__all__ = [
    "HOST_ATTRIBUTES",
    "group_minimum",
    "group_values",
    "host_attribute",
    "host_zones",
    "num_instances",
    "num_io_ops",
    "ram_used_mb",
    "vcpus_used",
]
