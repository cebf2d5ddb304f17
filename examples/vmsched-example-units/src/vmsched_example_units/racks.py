"""Racks: keep a VM in the racks it may run in, and spread VMs over racks.

A host's rack is one of its labels (HostReport.labels, "rack" unless the policy's RackLabel
property names another). A VM names the racks it may run in with the flavor extra spec
`rack:allowed`, comma-separated ("r1,r2"). The key has a namespace of its own ("rack:") so that
Nova's extra-spec filters (ComputeCapabilitiesFilter, AggregateInstanceExtraSpecsFilter), which
read unscoped keys as requirements on hosts, leave it alone.

Both functions follow the purity contract of vmsched.scheduling.units.base: they read their
arguments only, change none of them, and give the same answer for the same arguments.
"""

from __future__ import annotations

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.units import FilterVerdict, PolicyUnit, PropertySpec, Props

#: The flavor extra spec listing the racks a VM may run in.
ALLOWED_RACKS_SPEC = "rack:allowed"
#: How many racks a reason lists before it says "and N more".
MAX_RACKS_IN_REASON = 5

#: Which host label names a host's rack. The regex is checked for backtracking when the unit is
#: made and again when vmsched loads it: one character class, repeated, cannot backtrack.
RACK_LABEL = PropertySpec(r"^[A-Za-z0-9_.-]{1,64}$", "rack", "the host label that names a host's rack")


def allowed_racks(vm: VmSpec) -> frozenset[str]:
    """The racks the VM may run in; empty when it does not say (then any rack will do)."""
    listed = vm.extra_specs.get(ALLOWED_RACKS_SPEC, "")
    return frozenset(r.strip() for r in listed.split(",") if r.strip())


def _listed(racks: frozenset[str]) -> str:
    shown = sorted(racks)
    text = ", ".join(f"'{r}'" for r in shown[:MAX_RACKS_IN_REASON])
    rest = len(shown) - MAX_RACKS_IN_REASON
    return f"{text} and {rest} more" if rest > 0 else text


def rack_label_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Keep the hosts whose rack is one the VM may run in; a VM that names none may run anywhere.

    A host without the rack label is removed too when the VM names racks: nobody knows where it is.
    """
    wanted = allowed_racks(vm)
    if not wanted:
        return FilterVerdict.keep_all(hosts)
    label = props.get("RackLabel", "rack")
    racks = [labels.get(label) for labels in hosts.labels]
    keep = np.fromiter((r in wanted for r in racks), dtype=np.bool_, count=len(racks))
    listed = _listed(wanted)

    def reason(i: int) -> str:
        rack = racks[i]
        if rack is None:
            return f"no '{label}' label; the VM runs only in rack {listed}"
        return f"rack '{rack}' is not one of the VM's racks {listed}"

    return FilterVerdict.from_mask(hosts, keep, reason)


def rack_spread_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """The VMs running or pending in each host's rack, over the whole cluster: lower is better, so
    a new VM goes to the emptiest rack (a rack's power or switch failure then takes fewer VMs).

    A host without the rack label counts as a rack of its own.
    """
    label = props.get("RackLabel", "rack")
    cluster = hosts.cluster
    per_rack: dict[str, float] = {}
    for labels, vms in zip(cluster.labels, (cluster.vm_count + cluster.pending_vm_count).tolist(), strict=True):
        rack = labels.get(label)
        if rack is not None:
            per_rack[rack] = per_rack.get(rack, 0.0) + vms
    own = (hosts.vm_count + hosts.pending_vm_count).tolist()
    weights = [
        per_rack.get(rack, vms) if (rack := labels.get(label)) is not None else vms
        for labels, vms in zip(hosts.labels, own, strict=True)
    ]
    return np.asarray(weights, dtype=np.float64)


RACK_LABEL_FILTER = PolicyUnit(
    name="RackLabelFilter",
    description="Keeps the hosts in the racks the VM may run in (extra spec rack:allowed, comma-separated).",
    summary="not in the VM's racks",
    filter=rack_label_filter,
    properties={"RackLabel": RACK_LABEL},
)

RACK_SPREAD_WEIGHT = PolicyUnit(
    name="RackSpreadWeight",
    description="Prefers hosts in racks running fewer VMs, spreading VMs over racks.",
    weight=rack_spread_weight,
    properties={"RackLabel": RACK_LABEL},
)
