"""OpenStack Nova filters, mapped onto VM clusters: the catalogue of every Nova filter unit, and the
filters that decide where a VM may go by what the host is rather than by what it has left.

Nova's names and rules (nova/scheduler/filters/*.py), read against vmsched's HostTable:

* The host is Nova's HostState, and host groups are Nova's aggregates: nova_attributes holds that
  view (host attributes, group metadata comma-split and pooled, availability zones).
* The resource filters (Ram, Core, Disk, NumInstances, IoOps and their Aggregate variants) live in
  nova_resource_filters; `NOVA_FILTER_UNITS` here lists them among the others, in catalogue order.
* Nova's configuration options become the unit's custom properties (regexes invented here, each
  documented at its PropertySpec); a policy sets them like any oVirt property.
* The extra-spec operators and the JsonFilter query language are in extra_specs; architecture,
  hypervisor type and version rules of ImagePropertiesFilter in nova_versions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.errors import InvalidQuery
from vmsched.scheduling.hosts import BoolArray, HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props, prop_int
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
from vmsched.scheduling.units.helpers import fmt_num
from vmsched.scheduling.units.nova_attributes import HOST_ATTRIBUTES, group_values, host_attribute, host_zones
from vmsched.scheduling.units.nova_resource_filters import NOVA_RESOURCE_FILTER_UNITS
from vmsched.scheduling.units.nova_versions import canonical_arch, canonical_hv_type, version_satisfies, version_tuple

#: How many items (tenants, zones, hosts) a reason lists before "and N more".
_MAX_LISTED = 5


def _listed(items: Iterable[str]) -> str:
    values = list(items)
    shown = ", ".join(f"'{x}'" for x in values[:_MAX_LISTED])
    rest = len(values) - _MAX_LISTED
    return f"{shown} and {rest} more" if rest > 0 else shown


def _mask(hosts: HostTable, keep: Callable[[int], bool]) -> BoolArray:
    return np.fromiter((keep(i) for i in range(len(hosts))), dtype=np.bool_, count=len(hosts))


def _clipped(value: object, limit: int = 200) -> str:
    """A host value or a query for a reason, clipped: a capability or a query may be KBs of JSON, and
    a reason is bounded (FilteredHost.reason), so an unclipped one would fail the whole filter reply."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -------------------------------------------------------------------------------------- properties
_METRIC_SETTING = r"^(\s*[^=,\s]+\s*=\s*-?[0-9]+(\.[0-9]+)?\s*(,\s*[^=,\s]+\s*=\s*-?[0-9]+(\.[0-9]+)?\s*)*)?$"

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
                failures[i] = f"extra spec {key!r} = {requirement!r} not met by host value {_clipped(value)}"
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
    keep = ~hosts.mask_of(tried)
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
    text = _clipped(query)
    return FilterVerdict.from_mask(hosts, keep, lambda i: f"query {text} is false for this host")


# ------------------------------------------------------------------------------ ImageProperties
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


ALL_HOSTS = PolicyUnit(
    name="AllHostsFilter",
    description="Nova: keeps every host (does no filtering).",
    summary="",
    filter=all_hosts_filter,
)
COMPUTE = PolicyUnit(
    name="ComputeFilter",
    description="Nova: keeps hosts whose compute service is enabled and whose heartbeat is fresh.",
    summary="compute service disabled or down",
    filter=compute_filter,
    properties={"ServiceDownTime": SERVICE_DOWN_TIME},
)
COMPUTE_CAPABILITIES = PolicyUnit(
    name="ComputeCapabilitiesFilter",
    description="Nova: keeps hosts whose attributes and capabilities satisfy the VM's extra specs.",
    summary="extra specs not satisfied by host capabilities",
    filter=compute_capabilities_filter,
)
AGGREGATE_INSTANCE_EXTRA_SPECS = PolicyUnit(
    name="AggregateInstanceExtraSpecsFilter",
    description="Nova: keeps hosts whose host-group metadata satisfies the VM's (aggregate-scoped) extra specs.",
    summary="extra specs not satisfied by host group metadata",
    filter=aggregate_instance_extra_specs_filter,
)
AGGREGATE_MULTI_TENANCY = PolicyUnit(
    name="AggregateMultiTenancyIsolation",
    description="Nova: hosts in host groups with filter_tenant_id metadata take only those tenants' VMs.",
    summary="host isolated to other tenants",
    filter=aggregate_multi_tenancy_isolation,
)
METRICS = PolicyUnit(
    name="MetricsFilter",
    description="Nova: keeps hosts that report every metric named in WeightSetting.",
    summary="missing weighed metrics",
    filter=metrics_filter,
    properties={"WeightSetting": WEIGHT_SETTING},
)
AVAILABILITY_ZONE = PolicyUnit(
    name="AvailabilityZoneFilter",
    description="Nova: keeps hosts in the VM's availability zone (label or host-group metadata).",
    summary="other availability zone",
    filter=availability_zone_filter,
    properties={"DefaultAvailabilityZone": DEFAULT_ZONE},
)
RETRY = PolicyUnit(
    name="RetryFilter",
    description="Nova: removes hosts already tried for this VM.",
    summary="already tried",
    filter=retry_filter,
)
JSON = PolicyUnit(
    name="JsonFilter",
    description="Nova: keeps hosts for which the VM's JSON query holds.",
    summary="JSON query not satisfied",
    filter=json_filter,
)
IMAGE_PROPERTIES = PolicyUnit(
    name="ImagePropertiesFilter",
    description="Nova: keeps hosts matching the image's architecture, hypervisor type and version.",
    summary="image properties not supported",
    filter=image_properties_filter,
)

NOVA_FILTER_UNITS: tuple[PolicyUnit, ...] = (
    ALL_HOSTS,
    COMPUTE,
    COMPUTE_CAPABILITIES,
    AGGREGATE_INSTANCE_EXTRA_SPECS,
    *NOVA_RESOURCE_FILTER_UNITS,
    AGGREGATE_MULTI_TENANCY,
    METRICS,
    AVAILABILITY_ZONE,
    RETRY,
    JSON,
    IMAGE_PROPERTIES,
)

__all__ = [
    "DEFAULT_ZONE",
    "NOVA_FILTER_UNITS",
    "SERVICE_DOWN_TIME",
    "WEIGHT_SETTING",
    "aggregate_instance_extra_specs_filter",
    "aggregate_multi_tenancy_isolation",
    "all_hosts_filter",
    "availability_zone_filter",
    "compute_capabilities_filter",
    "compute_filter",
    "image_properties_filter",
    "json_filter",
    "metric_names",
    "metrics_filter",
    "retry_filter",
]
