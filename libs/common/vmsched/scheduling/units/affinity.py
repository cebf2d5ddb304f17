"""Affinity: oVirt VM-to-VM and VM-to-host affinity groups (hard filters, soft weights), Nova
server-group (soft) (anti-)affinity, and the Same/DifferentHost hints.

Where a VM is
-------------
A VM counts as on a host when it runs there (`HostTable.vm_ids`) or is placed there and pending
(`HostTable.pending_vm_ids`, which includes the earlier VMs of the same multi-VM request, virtually
placed), exactly as oVirt adds PendingVM records to its map of running VMs. The VM being placed never
counts as a member of its own groups (oVirt: "Skip current VM"), nor as one of its own hint VMs.

Where members are comes from the cluster's index of where each VM runs (`HostTable.holding`,
`members_on`), not from a pass over every host per group; a VM with no groups or hints costs one
`if`.

oVirt's affinity units as vmsched implements them
-------------------------------------------------
VmAffinityGroups, filter (VmAffinityFilterPolicyUnit), over the VM's *enforcing* VM-to-VM groups:

* positive group: the host must have another member of the group on it. When no other member is on
  any host of the table, the group constrains nothing (oVirt: "No hosts associated with positive
  affinity, all hosts are applicable"). When members are on several hosts (an invalid state oVirt
  only logs), any of those hosts is accepted, as in oVirt.
* negative group: the host must have no other member on it.
* Deviation: oVirt pools the members of *all* positive groups into one set and accepts any host that
  runs one of them, so with g1 on h1 and g2 on h2 it accepts h1 and h2, breaking one hard group
  either way. vmsched checks every group on its own (all must hold), so that case keeps no host and
  the reasons name both groups. With a single positive group the two agree.

VmAffinityGroups, weight (VmAffinityWeightPolicyUnit, oVirt 4.4+), over the *non-enforcing* groups:

* a host breaks a soft positive group when it has no other member of it (also when no member is on
  any host: then every host breaks it equally), and a soft negative group when it has one;
* hosts are ordered by the priorities of the groups they break, each host's list sorted from the
  highest priority down and compared lexicographically (a shorter list that is a prefix of a longer
  one is better): the highest broken priority is minimized first, then the next one, and so on, so
  breaking any number of priority-1 groups beats breaking one priority-2 group, and among equal
  priorities fewer broken groups is better. Ties go to the host with more members of the VM's
  positive groups (hard and soft, as in oVirt) on it;
* raw weight = 1 + the host's competition rank in that order ("1224": hosts that tie share the
  lower rank), which is oVirt's `DEFAULT_SCORE + rank`. Lower is better; best host = 1; all hosts
  equal (or no soft groups) = 1 everywhere.
* Deviations: oVirt's first tie-break is the number of *non-migratable* positive-group VMs on the
  host; vmsched does not know which VMs are migratable and skips it. oVirt also puts enforcing groups
  in the broken-priority lists; after the filter they are broken on all survivors alike or on none,
  so vmsched leaves them out of the lists (they still count in the member tie-break).

VmToHostsAffinityGroups, filter (VmToHostAffinityFilterPolicyUnit), over enforcing VM-to-host groups:
positive: the host must be one of the group's hosts; negative: it must not be. Deviation: a positive
group that lists no host constrains nothing here (oVirt would remove every host).

VmToHostsAffinityGroups, weight (VmToHostAffinityWeightPolicyUnit): the same ordering as above over
the non-enforcing VM-to-host groups (a host breaks a soft positive group when it is not among the
group's hosts, a soft negative one when it is), raw weight = 1 + competition rank, no tie-break.

Nova
----
* ServerGroupAffinity / ServerGroupAntiAffinity filters (`_GroupAffinityFilter`): a Nova server group
  is an AffinityGroup with an enforcing `vm_rule` (affinity = positive, anti-affinity = negative);
  these units are the positive-only and negative-only halves of the VmAffinityGroups filter (same
  semantics as Nova: with no member on any host, every host passes). Nova's anti-affinity
  `max_server_per_host` rule is not modelled (always 1).
* ServerGroupSoftAffinity / ServerGroupSoftAntiAffinity weighers (`_SoftAffinityWeigherBase`):
  raw weight = number of other members of the VM's non-enforcing positive (resp. negative) VM groups
  on the host, summed over the groups (Nova has a single group per request; several groups add up),
  negated for anti-affinity. Higher is better; normalization (min-max) is the selector's job.
* SameHost / DifferentHost filters: the `same_host` / `different_host` hints are VM ids; SameHost keeps
  the hosts that have any of them, DifferentHost removes them. An empty hint keeps every host. As in
  Nova, a same_host hint whose VMs are on no host removes every host.

The HostTable a filter sees holds only the hosts still in play; `HostTable.locate` looks at the
whole cluster, so a hard positive group whose other members all sit on hosts removed earlier (another
filter, not Up, blacklisted) removes every host instead of constraining nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vmsched.contracts import AffinityGroup, VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, IndexArray, constant
from vmsched.scheduling.units.base import Direction, FilterVerdict, PolicyUnit, Props

#: How many VM or host names a reason lists before it says "and N more".
MAX_NAMES_IN_REASON = 5
#: oVirt's DEFAULT_SCORE: the raw weight of the best host(s) of an affinity weight unit.
DEFAULT_SCORE = 1.0


def _names(items: Iterable[str]) -> str:
    listed = sorted(items)
    shown = ", ".join(listed[:MAX_NAMES_IN_REASON])
    rest = len(listed) - MAX_NAMES_IN_REASON
    return f"{shown} and {rest} more" if rest > 0 else shown


# ------------------------------------------------------------------------------- membership
def _others(vm_ids: Iterable[str], vm: VmSpec) -> frozenset[str]:
    """The VM ids of a group or hint, without the VM being placed."""
    return frozenset(vm_ids) - {vm.vm_id}


def presence(hosts: HostTable, members: frozenset[str]) -> BoolArray:
    """True at hosts where one of `members` runs or is pending."""
    return hosts.holding(members)


def _on_host(hosts: HostTable, i: int, members: frozenset[str], noun: str = "member") -> str:
    """'host runs member vm7 and has members vm8, vm9 pending' for host i (a reason fragment)."""
    running = members & hosts.vm_ids[i]
    pending = (members & hosts.pending_vm_ids[i]) - running
    parts = []
    if running:
        parts.append(f"runs {noun}{'' if len(running) == 1 else 's'} {_names(running)}")
    if pending:
        parts.append(f"has {noun}{'' if len(pending) == 1 else 's'} {_names(pending)} pending")
    return "host " + " and ".join(parts)


def _host_names(hosts: HostTable, mask: BoolArray) -> str:
    return _names(hosts.ids[i] for i in np.flatnonzero(mask).tolist())


@dataclass(frozen=True)
class _VmGroup:
    group_id: str
    members: frozenset[str]
    positive: bool
    priority: float


def _vm_groups(vm: VmSpec, *, enforcing: bool) -> list[_VmGroup]:
    """The VM's VM-to-VM groups of the given hardness that have a member other than the VM."""
    out = []
    for g in vm.affinity_groups:
        if g.vm_rule is None or g.vm_rule.enforcing is not enforcing:
            continue
        members = _others(g.vms, vm)
        if members:
            out.append(_VmGroup(g.group_id, members, g.vm_rule.positive, g.priority))
    return out


def _host_groups(vm: VmSpec, *, enforcing: bool) -> list[AffinityGroup]:
    return [g for g in vm.affinity_groups if g.host_rule is not None and g.host_rule.enforcing is enforcing]


def _in_group_hosts(hosts: HostTable, group_hosts: frozenset[str]) -> BoolArray:
    return hosts.mask_of(group_hosts)


# ------------------------------------------------------------------------------- hard VM to VM
Violation = Callable[[int], str]


def _always(text: str) -> Violation:
    return lambda i: text


def _members_found(hosts: HostTable, head: str, members: frozenset[str]) -> Violation:
    return lambda i: f"{head}: {_on_host(hosts, i, members)}"


def _combine(hosts: HostTable, checks: Sequence[tuple[BoolArray, Violation]]) -> FilterVerdict:
    """Keep the hosts every check keeps; a removed host's reason lists every check it fails."""
    if not checks:
        return FilterVerdict.keep_all(hosts)
    keep = np.logical_and.reduce([ok for ok, _ in checks])

    def reason(i: int) -> str:
        return "; ".join(why(i) for ok, why in checks if not ok[i])

    return FilterVerdict.from_mask(hosts, keep, reason)


def _vm_group_checks(
    hosts: HostTable, vm: VmSpec, label: Callable[[_VmGroup], str], *, positive: bool | None
) -> list[tuple[BoolArray, Violation]]:
    """One (keep-mask, reason) per hard VM-to-VM group of the wanted sign (None: both)."""
    checks: list[tuple[BoolArray, Violation]] = []
    for g in _vm_groups(vm, enforcing=True):
        if positive is not None and g.positive is not positive:
            continue
        present = presence(hosts, g.members)
        if g.positive:
            if not present.any():
                elsewhere = hosts.locate(g.members)
                if not elsewhere:
                    continue  # no other member is placed anywhere in the cluster: every host is fine (oVirt)
                # The members run only on hosts no longer in play (removed earlier, not Up, blacklisted):
                # joining them is impossible here, so no host passes.
                text = (
                    f"{label(g)}: host has no member; members are on {_names(set(elsewhere.values()))}, "
                    "which are not candidates"
                )
                checks.append((present, _always(text)))
                continue
            where = _host_names(hosts, present)
            text = f"{label(g)}: host has no member; members are on {where}"
            checks.append((present, _always(text)))
        else:
            checks.append((~present, _members_found(hosts, label(g), g.members)))
    return checks


def _ovirt_label(g: _VmGroup) -> str:
    return f"affinity group {g.group_id} ({'positive' if g.positive else 'negative'}, hard)"


def _nova_label(g: _VmGroup) -> str:
    return f"server group {g.group_id} ({'affinity' if g.positive else 'anti-affinity'})"


def vm_affinity_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """oVirt VmAffinityGroups (hard): every enforcing VM-to-VM group of the VM must hold on the host."""
    return _combine(hosts, _vm_group_checks(hosts, vm, _ovirt_label, positive=None))


def server_group_affinity_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova ServerGroupAffinityFilter: the host must have a member of each hard affinity group."""
    return _combine(hosts, _vm_group_checks(hosts, vm, _nova_label, positive=True))


def server_group_anti_affinity_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova ServerGroupAntiAffinityFilter: the host must have no member of any hard anti-affinity group."""
    return _combine(hosts, _vm_group_checks(hosts, vm, _nova_label, positive=False))


# ------------------------------------------------------------------------------- hard VM to host
def vm_to_host_affinity_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """oVirt VmToHostsAffinityGroups (hard): in every positive group's hosts, in no negative group's."""
    checks: list[tuple[BoolArray, Violation]] = []
    for g in _host_groups(vm, enforcing=True):
        assert g.host_rule is not None
        group_hosts = frozenset(g.hosts)
        inside = _in_group_hosts(hosts, group_hosts)
        if g.host_rule.positive:
            if not group_hosts:
                continue  # a positive group listing no host constrains nothing
            text = (
                f"affinity group {g.group_id} (VM to host, positive, hard): "
                f"host is not one of the group's hosts {_names(group_hosts)}"
            )
            checks.append((inside, _always(text)))
        else:
            text = f"affinity group {g.group_id} (VM to host, negative, hard): host is one of the group's hosts"
            checks.append((~inside, _always(text)))
    return _combine(hosts, checks)


# ------------------------------------------------------------------------------- soft (oVirt)
def rank_by_broken_priorities(
    broken: Sequence[Sequence[float]], tie_break: Sequence[float] | None = None
) -> FloatArray:
    """oVirt's affinity weight: 1 + the competition rank of each host in the lexicographic order of
    its broken groups' priorities (sorted highest first; a prefix sorts before its extensions),
    ties broken by `tie_break` (higher is better)."""
    n = len(broken)
    tb = tie_break if tie_break is not None else [0.0] * n
    keys = [(tuple(sorted(p, reverse=True)), -tb[i]) for i, p in enumerate(broken)]
    ordered = sorted(keys)
    return np.fromiter((DEFAULT_SCORE + bisect.bisect_left(ordered, k) for k in keys), dtype=np.float64, count=n)


#: Most groups `_rank_broken` tells apart by the bits of one integer per host.
_MAX_GROUPS_PACKED = 40


def _dense(values: npt.NDArray[np.integer[Any]]) -> tuple[IndexArray, IndexArray, IndexArray]:
    """np.unique(values, return_inverse=True, return_counts=True), by counting when the values are
    small non-negative integers (hosts' signatures: a few bits), instead of sorting 10,000."""
    if len(values) and int(values.min()) >= 0 and int(values.max()) <= 4 * len(values) + 1024:
        counts = np.bincount(values)
        distinct = np.flatnonzero(counts)
        code = np.zeros(len(counts), dtype=np.intp)
        code[distinct] = np.arange(len(distinct))
        return distinct, code.take(values), counts.take(distinct)
    found, inverse, how_many = np.unique(values, return_inverse=True, return_counts=True)
    return found, inverse.reshape(-1), how_many


def _rank_broken(n: int, broken: Sequence[tuple[BoolArray, float]], tie_break: FloatArray | None = None) -> FloatArray:
    """`rank_by_broken_priorities` of n hosts, where each (mask, priority) of `broken` is a group
    and the hosts that break it: hosts that break the same groups with the same tie-break share a
    key, so keys are built and ordered once per distinct one, not once per host."""
    if n == 0:
        return np.zeros(0)
    tb = tie_break if tie_break is not None else np.zeros(n)
    if len(broken) > _MAX_GROUPS_PACKED:
        lists: list[list[float]] = [[] for _ in range(n)]
        for mask, priority in broken:
            for i in np.flatnonzero(mask).tolist():
                lists[i].append(priority)
        return rank_by_broken_priorities(lists, tb.tolist())
    if bool(np.all(tb >= 0)) and float(tb.max()) <= n and bool(np.all(np.floor(tb) == tb)):
        tb_distinct, tb_codes, _ = _dense(tb.astype(np.intp))
        tb_values = tb_distinct.astype(np.float64)
    else:
        tb_values, tb_codes = np.unique(tb, return_inverse=True)
    bits = np.zeros(n, dtype=np.int64)
    for g, (mask, _) in enumerate(broken):
        bits |= mask.astype(np.int64) << g
    distinct, inverse, counts = _dense(bits * len(tb_values) + tb_codes.reshape(-1))
    keys: list[tuple[tuple[float, ...], float]] = []
    for code in distinct.tolist():
        which, t = divmod(code, len(tb_values))
        priorities = [p for g, (_, p) in enumerate(broken) if which >> g & 1]
        keys.append((tuple(sorted(priorities, reverse=True)), -float(tb_values[t])))
    # 1 + how many hosts have a smaller key (hosts with equal keys share it).
    below = np.zeros(len(keys))
    seen, previous, shared = 0, None, 0
    for d in sorted(range(len(keys)), key=keys.__getitem__):
        if keys[d] != previous:
            previous, shared = keys[d], seen
        below[d] = shared
        seen += int(counts[d])
    out: FloatArray = DEFAULT_SCORE + below.take(inverse)
    return out


def vm_affinity_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """oVirt VmAffinityGroups (soft): 1 + rank by the priorities of the soft VM-to-VM groups the host
    breaks, then by the number of positive-group members on it (more is better)."""
    n = len(hosts)
    soft = _vm_groups(vm, enforcing=False)
    positive_members = frozenset[str]().union(
        *(g.members for g in (*soft, *_vm_groups(vm, enforcing=True)) if g.positive)
    )
    if not soft and not positive_members:
        return constant(n, DEFAULT_SCORE)
    broken: list[tuple[BoolArray, float]] = []
    for g in soft:
        present = presence(hosts, g.members)
        broken.append((~present if g.positive else present, g.priority))
    count = hosts.members_on(positive_members) if positive_members else None
    return _rank_broken(n, broken, count)


def vm_to_host_affinity_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """oVirt VmToHostsAffinityGroups (soft): 1 + rank by the priorities of the soft VM-to-host groups
    the host breaks."""
    n = len(hosts)
    soft = _host_groups(vm, enforcing=False)
    if not soft:
        return constant(n, DEFAULT_SCORE)
    broken: list[tuple[BoolArray, float]] = []
    for g in soft:
        assert g.host_rule is not None
        inside = _in_group_hosts(hosts, frozenset(g.hosts))
        broken.append((~inside if g.host_rule.positive else inside, g.priority))
    return _rank_broken(n, broken)


# ------------------------------------------------------------------------------- soft (Nova)
def _soft_member_count(hosts: HostTable, vm: VmSpec, *, positive: bool) -> FloatArray:
    """Other members of the VM's soft VM-to-VM groups of one sign on each host, summed over groups."""
    out = np.zeros(len(hosts), dtype=np.float64)
    for g in _vm_groups(vm, enforcing=False):
        if g.positive is positive:
            out += hosts.members_on(g.members)
    return out


def soft_affinity_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """Nova ServerGroupSoftAffinityWeigher: members of the VM's soft affinity groups on the host."""
    return _soft_member_count(hosts, vm, positive=True)


def soft_anti_affinity_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """Nova ServerGroupSoftAntiAffinityWeigher: minus the members of its soft anti-affinity groups."""
    return -_soft_member_count(hosts, vm, positive=False)


# ------------------------------------------------------------------------------- hints (Nova)
def same_host_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova SameHostFilter: keep the hosts with one of the `same_host` VMs; no hint keeps all."""
    wanted = _others(vm.same_host, vm)
    if not wanted:
        return FilterVerdict.keep_all(hosts)
    keep = presence(hosts, wanted)
    text = f"host has none of the same_host VMs {_names(wanted)}"
    return FilterVerdict.from_mask(hosts, keep, lambda i: text)


def different_host_filter(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    """Nova DifferentHostFilter: remove the hosts with one of the `different_host` VMs."""
    avoided = _others(vm.different_host, vm)
    if not avoided:
        return FilterVerdict.keep_all(hosts)
    keep = ~presence(hosts, avoided)
    return FilterVerdict.from_mask(hosts, keep, lambda i: _on_host(hosts, i, avoided, "different_host VM"))


# ------------------------------------------------------------------------------- the units
VM_AFFINITY = PolicyUnit(
    name="VmAffinityGroups",
    description=(
        "Hard VM affinity groups filter: VMs of a positive group share a host, VMs of a negative group never do; "
        "soft groups weigh: hosts breaking fewer and lower-priority soft groups are preferred."
    ),
    summary="VM affinity group",
    filter=vm_affinity_filter,
    weight=vm_affinity_weight,
)
VM_TO_HOST_AFFINITY = PolicyUnit(
    name="VmToHostsAffinityGroups",
    description=(
        "Hard VM to host affinity groups filter: the VM runs on the group's hosts (positive) or off them "
        "(negative); soft groups weigh: hosts breaking fewer and lower-priority soft groups are preferred."
    ),
    summary="VM to host affinity group",
    filter=vm_to_host_affinity_filter,
    filter_by_row=True,
    weight=vm_to_host_affinity_weight,
)
SERVER_GROUP_AFFINITY = PolicyUnit(
    name="ServerGroupAffinity",
    description="Nova: places the VM on a host that runs the other members of its hard affinity server groups.",
    summary="server group affinity",
    filter=server_group_affinity_filter,
)
SERVER_GROUP_ANTI_AFFINITY = PolicyUnit(
    name="ServerGroupAntiAffinity",
    description="Nova: keeps the VM off hosts that run members of its hard anti-affinity server groups.",
    summary="server group anti-affinity",
    filter=server_group_anti_affinity_filter,
)
SOFT_AFFINITY = PolicyUnit(
    name="ServerGroupSoftAffinity",
    description="Nova: prefers hosts running more members of the VM's soft affinity groups.",
    summary="soft affinity",
    weight=soft_affinity_weight,
    direction=Direction.HIGHER_IS_BETTER,
)
SOFT_ANTI_AFFINITY = PolicyUnit(
    name="ServerGroupSoftAntiAffinity",
    description="Nova: prefers hosts running fewer members of the VM's soft anti-affinity groups.",
    summary="soft anti-affinity",
    weight=soft_anti_affinity_weight,
    direction=Direction.HIGHER_IS_BETTER,
)
SAME_HOST = PolicyUnit(
    name="SameHost",
    description="Nova: places the VM on a host running one of the VMs of its same_host hint.",
    summary="none of the same_host VMs",
    filter=same_host_filter,
)
DIFFERENT_HOST = PolicyUnit(
    name="DifferentHost",
    description="Nova: keeps the VM off hosts running a VM of its different_host hint.",
    summary="runs a different_host VM",
    filter=different_host_filter,
)

AFFINITY_UNITS: tuple[PolicyUnit, ...] = (
    VM_AFFINITY,
    VM_TO_HOST_AFFINITY,
    SERVER_GROUP_AFFINITY,
    SERVER_GROUP_ANTI_AFFINITY,
    SOFT_AFFINITY,
    SOFT_ANTI_AFFINITY,
    SAME_HOST,
    DIFFERENT_HOST,
)

__all__ = [
    "AFFINITY_UNITS",
    "DEFAULT_SCORE",
    "DIFFERENT_HOST",
    "SAME_HOST",
    "SERVER_GROUP_AFFINITY",
    "SERVER_GROUP_ANTI_AFFINITY",
    "SOFT_AFFINITY",
    "SOFT_ANTI_AFFINITY",
    "VM_AFFINITY",
    "VM_TO_HOST_AFFINITY",
    "different_host_filter",
    "presence",
    "rank_by_broken_priorities",
    "same_host_filter",
    "server_group_affinity_filter",
    "server_group_anti_affinity_filter",
    "soft_affinity_weight",
    "soft_anti_affinity_weight",
    "vm_affinity_filter",
    "vm_affinity_weight",
    "vm_to_host_affinity_filter",
    "vm_to_host_affinity_weight",
]
