"""`vmsched policy import-nova`: a policy from nova.conf's [filter_scheduler] (and the [DEFAULT] /
[metrics] options its units read), as Nova would run it.

* Filters: enabled_filters in order (Nova's default list when unset; an `all_filters` entry is every
  Nova filter). Weighers: weight_classes (default `nova.scheduler.weights.all_weighers`), each with
  its multiplier; a zero multiplier leaves the weigher out, as it does nothing in Nova either.
* A Nova filter or weigher vmsched has no unit for is left out with a warning naming it when it
  comes from a default or an all_* entry (the user did not ask for it); written by name, it is a
  problem (a hard constraint dropped silently would place VMs where Nova would not).
* Factors are Nova's multipliers as they are (a factor is a decimal: 1.5 stays 1.5). One past
  vmsched's bound (contracts.base.MAX_FACTOR, 1,000,000: Nova's largest defaults fit) is clipped to
  it with a warning; one with more digits than a double holds is rounded, with a warning too.
* Options the units read (allocation ratios, per-host maxima, metrics) become the policy's
  properties when written in the file and some unit of the policy reads them; otherwise warned.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from pydantic import ValidationError

from vmsched.contracts import PolicyDocument
from vmsched.contracts.base import MAX_FACTOR, canonical_number
from vmsched.errors import InvalidRequest
from vmsched.scheduling.policy_docs import problems
from vmsched.scheduling.units.base import PolicyUnit
from vmsched_services.tools.inputs import NOVA_CONF_CAP, read_bounded

SECTION = "filter_scheduler"
#: Nova's selector: sum of multiplier x min-max normalized weight.
SELECTOR = "MinMaxSelector"
#: contracts.policies.WeightEntry's bound on a factor's magnitude.
FACTOR_BOUND = MAX_FACTOR

#: Nova's enabled_filters default (nova/conf/scheduler.py).
NOVA_DEFAULT_FILTERS = (
    "ComputeFilter",
    "ComputeCapabilitiesFilter",
    "ImagePropertiesFilter",
    "ServerGroupAntiAffinityFilter",
    "ServerGroupAffinityFilter",
)
#: Nova filter class -> vmsched unit (None: vmsched has none). Also the list `all_filters` expands to.
NOVA_FILTERS: Mapping[str, str | None] = {
    "AllHostsFilter": "AllHostsFilter",
    "ComputeFilter": "ComputeFilter",
    "ComputeCapabilitiesFilter": "ComputeCapabilitiesFilter",
    "ImagePropertiesFilter": "ImagePropertiesFilter",
    "ServerGroupAntiAffinityFilter": "ServerGroupAntiAffinity",
    "ServerGroupAffinityFilter": "ServerGroupAffinity",
    "SameHostFilter": "SameHost",
    "DifferentHostFilter": "DifferentHost",
    "AvailabilityZoneFilter": "AvailabilityZoneFilter",
    "AggregateInstanceExtraSpecsFilter": "AggregateInstanceExtraSpecsFilter",
    "AggregateMultiTenancyIsolation": "AggregateMultiTenancyIsolation",
    "AggregateIoOpsFilter": "AggregateIoOpsFilter",
    "AggregateNumInstancesFilter": "AggregateNumInstancesFilter",
    "IoOpsFilter": "IoOpsFilter",
    "NumInstancesFilter": "NumInstancesFilter",
    "JsonFilter": "JsonFilter",
    "MetricsFilter": "MetricsFilter",
    "RetryFilter": "RetryFilter",
    "RamFilter": "RamFilter",
    "AggregateRamFilter": "AggregateRamFilter",
    "CoreFilter": "CoreFilter",
    "AggregateCoreFilter": "AggregateCoreFilter",
    "DiskFilter": "DiskFilter",
    "AggregateDiskFilter": "AggregateDiskFilter",
    "AggregateImagePropertiesIsolation": None,
    "AggregateTypeAffinityFilter": None,
    "IsolatedHostsFilter": None,
    "NUMATopologyFilter": None,
    "PciPassthroughFilter": None,
    "SimpleCIDRAffinityFilter": None,
}


@dataclass(frozen=True)
class Weigher:
    """A Nova weigher: its vmsched unit (None: none), where its multiplier is, Nova's default, and
    the sign from multiplier to factor (-1 where vmsched's unit counts lower-is-better and Nova's
    raw weight is the plain count, see scheduling/units/nova_weights.py)."""

    unit: str | None
    section: str
    option: str
    default: str
    sign: int = 1


#: Nova weigher class -> Weigher; also the list `all_weighers` expands to (nova/scheduler/weights).
NOVA_WEIGHERS: Mapping[str, Weigher] = {
    "RAMWeigher": Weigher("RAMWeigher", SECTION, "ram_weight_multiplier", "1.0"),
    "CPUWeigher": Weigher("CPUWeigher", SECTION, "cpu_weight_multiplier", "1.0"),
    "DiskWeigher": Weigher("DiskWeigher", SECTION, "disk_weight_multiplier", "1.0"),
    "IoOpsWeigher": Weigher("IoOpsWeigher", SECTION, "io_ops_weight_multiplier", "-1.0", -1),
    "NumInstancesWeigher": Weigher("NumInstancesWeigher", SECTION, "num_instances_weight_multiplier", "0.0", -1),
    "BuildFailureWeigher": Weigher("BuildFailureWeigher", SECTION, "build_failure_weight_multiplier", "1000000.0"),
    "ServerGroupSoftAffinityWeigher": Weigher(
        "ServerGroupSoftAffinity", SECTION, "soft_affinity_weight_multiplier", "1.0"
    ),
    "ServerGroupSoftAntiAffinityWeigher": Weigher(
        "ServerGroupSoftAntiAffinity", SECTION, "soft_anti_affinity_weight_multiplier", "1.0"
    ),
    "MetricsWeigher": Weigher("MetricsWeigher", "metrics", "weight_multiplier", "1.0"),
    "PCIWeigher": Weigher(None, SECTION, "pci_weight_multiplier", "1.0"),
    "CrossCellWeigher": Weigher(None, SECTION, "cross_cell_move_weight_multiplier", "1000000.0"),
    "HypervisorVersionWeigher": Weigher(None, SECTION, "hypervisor_version_weight_multiplier", "1.0"),
    "ImagePropertiesWeigher": Weigher(None, SECTION, "image_props_weight_multiplier", "0.0"),
}

#: (section, option) -> the vmsched property reading it. Imported only when written in the file.
NOVA_PROPERTIES: Mapping[tuple[str, str], str] = {
    ("DEFAULT", "cpu_allocation_ratio"): "CpuAllocationRatio",
    ("DEFAULT", "ram_allocation_ratio"): "RamAllocationRatio",
    ("DEFAULT", "disk_allocation_ratio"): "DiskAllocationRatio",
    ("DEFAULT", "service_down_time"): "ServiceDownTime",
    ("DEFAULT", "default_availability_zone"): "DefaultAvailabilityZone",
    (SECTION, "max_io_ops_per_host"): "MaxIoOpsPerHost",
    (SECTION, "max_instances_per_host"): "MaxInstancesPerHost",
    ("metrics", "weight_setting"): "WeightSetting",
    ("metrics", "required"): "MetricsRequired",
    ("metrics", "weight_of_unavailable"): "WeightOfUnavailable",
}
#: Allocation ratios of 0.0 are Nova's "unset" (the scheduler's default then applies).
_ZERO_MEANS_UNSET = {"cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio"}


@dataclass
class NovaImport:
    """The imported policy, what was left out or changed (warnings) and what is wrong (problems:
    non-empty means the import is refused)."""

    document: PolicyDocument
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _classes(raw: str) -> list[str]:
    """Class names from a comma or newline separated list of (dotted) names."""
    return [c.strip().rsplit(".", 1)[-1] for c in raw.replace("\n", ",").split(",") if c.strip()]


def _written(parser: configparser.ConfigParser, section: str, option: str) -> str | None:
    """The option's value as written in `section` (or in [DEFAULT], which Nova's older releases
    read these from), None when unwritten."""
    if section != "DEFAULT" and parser.has_section(section) and parser.has_option(section, option):
        return parser.get(section, option)
    return parser.defaults().get(option)


def _filters(parser: configparser.ConfigParser, out: NovaImport) -> list[str]:
    raw = _written(parser, SECTION, "enabled_filters")
    names = _classes(raw) if raw is not None else list(NOVA_DEFAULT_FILTERS)
    explicit = {n for n in names if n != "all_filters"} if raw is not None else set()
    if "all_filters" in names:
        names = [n for n in names if n != "all_filters"] + [n for n in NOVA_FILTERS if n not in names]
    available = _written(parser, SECTION, "available_filters")
    if available is not None and _classes(available) != ["all_filters"]:
        out.warnings.append(f"available_filters = {available.strip()}: only Nova's own filters are imported")
    units: list[str] = []
    for name in names:
        unit = NOVA_FILTERS.get(name, name)  # any other name passes as is: validation names it if unknown
        if unit is not None:
            units.append(unit)
        elif name in explicit:
            out.problems.append(
                f"enabled_filters: vmsched has no unit for Nova's {name}; remove it to import the policy without it"
            )
        else:
            out.warnings.append(f"skipped Nova filter {name} (a default, not written): vmsched has no unit for it")
    return list(dict.fromkeys(units))


def _multiplier(parser: configparser.ConfigParser, weigher: Weigher, out: NovaImport) -> Decimal | None:
    text = _written(parser, weigher.section, weigher.option) or weigher.default
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        out.problems.append(f"[{weigher.section}] {weigher.option} = {text!r} is not a number")
        return None
    if not value.is_finite():
        out.problems.append(f"[{weigher.section}] {weigher.option} = {text!r} is not a finite number")
        return None
    return value * weigher.sign


def _weights(parser: configparser.ConfigParser, out: NovaImport) -> list[tuple[str, str, Decimal]]:
    raw = _written(parser, SECTION, "weight_classes")
    names = _classes(raw) if raw is not None else ["all_weighers"]
    explicit = {n for n in names if n != "all_weighers"}
    if "all_weighers" in names:
        names = [n for n in names if n != "all_weighers"] + [n for n in NOVA_WEIGHERS if n not in names]
    chosen: list[tuple[str, str, Decimal]] = []  # (unit, option, signed multiplier)
    for name in names:
        weigher = NOVA_WEIGHERS.get(name)
        if weigher is None:
            out.problems.append(f"weight_classes: {name} is not a Nova weigher vmsched knows; remove it to import")
            continue
        value = _multiplier(parser, weigher, out)
        if value is None or value == 0:
            continue  # a zero multiplier does nothing in Nova either
        if weigher.unit is None:
            if name in explicit:
                out.problems.append(
                    f"weight_classes: vmsched has no unit for Nova's {name}; remove it to import without it"
                )
            else:
                out.warnings.append(f"skipped Nova weigher {name} (a default, not written): vmsched has no unit for it")
            continue
        chosen.append((weigher.unit, weigher.option, value))
    return chosen


def _shown(value: Decimal) -> str:
    """A multiplier as people write it (50000000, not 5E+7), in exponent form only when huge or tiny."""
    return f"{value:f}" if value == 0 or abs(value.adjusted()) < 20 else str(value)


def _factors(chosen: list[tuple[str, str, Decimal]], out: NovaImport) -> list[dict[str, object]]:
    """The multipliers as factors, unscaled; clipped to the bound or rounded to a double only when
    they must be, with a warning saying so (see the module docstring)."""
    weights: list[dict[str, object]] = []
    for unit, option, value in chosen:
        if abs(value) > FACTOR_BOUND:
            clipped = Decimal(FACTOR_BOUND).copy_sign(value)
            others = sum((abs(v) for u, _, v in chosen if u != unit and abs(v) <= FACTOR_BOUND), Decimal(0))
            out.warnings.append(
                f"{option}: factor {_shown(value)} is past vmsched's bound on a factor ({FACTOR_BOUND}), "
                f"clipped to {clipped:f} (the other weighers' factors sum to {_shown(others.normalize())})"
            )
            value = clipped
        factor = float(value)
        if factor == 0:
            out.warnings.append(f"{option}: factor {value} is too small for a double, left out")
            continue
        if Decimal(repr(factor)) != value:
            out.warnings.append(
                f"{option}: factor {_shown(value)} has more digits than a double holds, rounded to {factor!r}"
            )
        weights.append({"unit": unit, "factor": canonical_number(factor)})
    return weights


def _properties(
    parser: configparser.ConfigParser, units: list[str], registry: Mapping[str, PolicyUnit], out: NovaImport
) -> dict[str, str]:
    read = {p for u in units if u in registry for p in registry[u].properties}
    properties: dict[str, str] = {}
    for (section, option), prop in NOVA_PROPERTIES.items():
        value = _written(parser, section, option)
        if value is None:
            continue
        value = value.strip()
        if option in _ZERO_MEANS_UNSET:
            try:
                unset = Decimal(value) == 0
            except InvalidOperation:
                unset = False
            if unset:
                out.warnings.append(f"{option} = {value} is Nova's 'unset': not imported, {prop}'s default applies")
                continue
        if prop not in read:
            readers = sorted(u.name for u in registry.values() if prop in u.properties)
            out.warnings.append(
                f"{option} = {value} not imported: no unit of this policy reads {prop} "
                f"(read by {', '.join(readers) or 'no unit'})"
            )
            continue
        properties[prop] = value.lower() if value.lower() in ("true", "false") else value
    return properties


def import_nova(path: str, name: str, registry: Mapping[str, PolicyUnit]) -> NovaImport:
    """The policy nova.conf at `path` describes, checked against `registry` (`problems` non-empty:
    the import must be refused). A file that cannot be read as nova.conf is an InvalidRequest."""
    text = read_bounded(path, NOVA_CONF_CAP, "nova.conf", "nova.conf files")
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text, source=path)
    except configparser.Error as exc:
        raise InvalidRequest(f"{path}: cannot read it as nova.conf ({exc})") from None
    out = NovaImport(document=PolicyDocument.model_construct(name=name))  # replaced below
    if not parser.has_section(SECTION):
        out.warnings.append(f"no [{SECTION}] section: Nova's defaults are imported")
    filters = _filters(parser, out)
    weights = _factors(_weights(parser, out), out)
    units = filters + [str(w["unit"]) for w in weights]
    raw = {
        "name": name,
        "description": f"imported from {Path(path).name}",
        "filters": [{"unit": f} for f in filters],
        "weights": weights,
        "selector": SELECTOR,
        "properties": _properties(parser, units, registry, out),
    }
    try:
        out.document = PolicyDocument.model_validate(raw)
    except ValidationError as exc:
        out.problems += [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:20]]
        return out
    out.problems += problems(out.document, registry)
    return out


__all__ = ["NOVA_DEFAULT_FILTERS", "NOVA_FILTERS", "NOVA_PROPERTIES", "NOVA_WEIGHERS", "NovaImport", "import_nova"]
