"""oVirt's placement-rule filter units: Network, PinToHost, Migration, Emulated-Machine, CPU-Level,
ClusterInMaintenance and MigrationDomain (NetworkPolicyUnit, PinToHostPolicyUnit,
MigrationPolicyUnit, EmulatedMachineFilterPolicyUnit, CpuLevelFilterPolicyUnit,
ClusterInMaintenanceFilterPolicyUnit, MigrationDomainPolicyUnit): where a VM may run, rather than
whether a host has room for it.

Where vmsched deliberately differs from the engine's code, the difference and its reason are noted
at the unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, HostTable
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, Props
from vmsched.scheduling.units.helpers import current_host_mask

#: How many host or network names a reason lists before it says "and N more".
MAX_NAMES_IN_REASON = 5


def _names(items: Iterable[str]) -> str:
    listed = list(items)
    shown = ", ".join(f"'{x}'" for x in listed[:MAX_NAMES_IN_REASON])
    rest = len(listed) - MAX_NAMES_IN_REASON
    return f"{shown} and {rest} more" if rest > 0 else shown


# --------------------------------------------------------------------------------------- Network
def network_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Every network the VM's interfaces use must be present on the host; the reason lists all missing.

    oVirt's NetworkPolicyUnit also checks the display network and non-required networks; vmsched's
    VmSpec only carries the networks the VM needs, so every listed network is required.
    """
    required = list(dict.fromkeys(vm.networks))  # de-duplicated, order kept for stable reasons
    if not required or len(hosts) == 0:
        return FilterVerdict.keep_all(hosts)
    # Judged once per distinct set of networks (a cluster has a few), then read per host: one pass
    # over the hosts, not two per network plus the stack and the reduction over them.
    factors = hosts.factors("networks")
    codes, offered = factors.codes, factors.values
    fits = np.fromiter((all(net in v for net in required) for v in offered), dtype=np.bool_, count=len(offered))
    keep: BoolArray = fits[codes]

    # A host's reason follows from its set of networks: made once per distinct set (a batch's
    # every VM removes the same few hundred hosts, and the summary reads their reasons).
    made: dict[int, str] = {}

    def reason(i: int) -> str:
        code = int(codes[i])
        said = made.get(code)
        if said is None:
            missing = [net for net in required if net not in offered[code]]
            noun = "network" if len(missing) == 1 else "networks"
            said = made[code] = f"missing {noun} {_names(missing)}"
        return said

    return FilterVerdict.from_mask(hosts, keep, reason, codes)


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

__all__ = [
    "CLUSTER_IN_MAINTENANCE",
    "CPU_LEVEL",
    "EMULATED_MACHINE",
    "MAX_NAMES_IN_REASON",
    "MIGRATION",
    "MIGRATION_DOMAIN",
    "NETWORK",
    "PIN_TO_HOST",
    "cluster_in_maintenance_filter",
    "cpu_level_filter",
    "emulated_machine_filter",
    "migration_domain_filter",
    "migration_filter",
    "network_filter",
    "pin_to_host_filter",
]
