"""Affinity units: oVirt VM-to-VM and VM-to-host groups (hard filter + soft weight), Nova server
groups (hard filters, soft weighers) and the Same/DifferentHost hints. Hand-computed cases and
invariants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, kept, pend, reasons, table, vm
from vmsched.contracts import AffinityGroup, AffinityRule, PendingEntry, VmSpec
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units import get_unit
from vmsched.scheduling.units.affinity import (
    AFFINITY_UNITS,
    different_host_filter,
    rank_by_broken_priorities,
    same_host_filter,
    server_group_affinity_filter,
    server_group_anti_affinity_filter,
    soft_affinity_weight,
    soft_anti_affinity_weight,
    vm_affinity_filter,
    vm_affinity_weight,
    vm_to_host_affinity_filter,
    vm_to_host_affinity_weight,
)
from vmsched.scheduling.units.base import Direction, PolicyUnit
from vmsched.scheduling.units.registry import REGISTRY

# ------------------------------------------------------------------------------------ helpers


def pend_vm(host_id: str, vm_id: str) -> PendingEntry:
    """A pending record placing `vm_id` on `host_id`."""
    return pend(host_id).model_copy(update={"vm_id": vm_id})


def vmg(gid: str, vms: list[str], *, positive: bool, enforcing: bool = True, priority: float = 1.0) -> AffinityGroup:
    """A VM-to-VM affinity group."""
    return AffinityGroup(
        group_id=gid, vms=vms, vm_rule=AffinityRule(positive=positive, enforcing=enforcing), priority=priority
    )


def hostg(
    gid: str, hosts: list[str], *, positive: bool, enforcing: bool = True, priority: float = 1.0
) -> AffinityGroup:
    """A VM-to-host affinity group."""
    return AffinityGroup(
        group_id=gid,
        vms=["vm1"],
        hosts=hosts,
        host_rule=AffinityRule(positive=positive, enforcing=enforcing),
        priority=priority,
    )


def with_groups(*groups: AffinityGroup, **kw: Any) -> VmSpec:
    return vm(affinity_groups=list(groups), **kw)


def cluster(placement: dict[str, list[str]], pending: dict[str, list[str]] | None = None) -> HostTable:
    """Hosts with the given running VMs, plus pending VMs per host."""
    entries = [pend_vm(h, v) for h, vms in (pending or {}).items() for v in vms]
    return table(*(host(h, vm_ids=vms) for h, vms in placement.items()), pending=entries)


# ------------------------------------------------------------------------------------ the units
def test_units_are_declared_and_registered() -> None:
    names = {u.name for u in AFFINITY_UNITS}
    assert names == {
        "VmAffinityGroups",
        "VmToHostsAffinityGroups",
        "ServerGroupAffinity",
        "ServerGroupAntiAffinity",
        "ServerGroupSoftAffinity",
        "ServerGroupSoftAntiAffinity",
        "SameHost",
        "DifferentHost",
    }
    for unit in AFFINITY_UNITS:
        assert REGISTRY[unit.name] is unit
        assert unit.description
        assert unit.summary
    assert REGISTRY["VmAffinityGroups"].kinds == ("filter", "weight")
    assert REGISTRY["VmToHostsAffinityGroups"].kinds == ("filter", "weight")
    for name in ("ServerGroupAffinity", "ServerGroupAntiAffinity", "SameHost", "DifferentHost"):
        assert REGISTRY[name].kinds == ("filter",)
    for name in ("ServerGroupSoftAffinity", "ServerGroupSoftAntiAffinity"):
        assert REGISTRY[name].kinds == ("weight",)
        assert REGISTRY[name].direction is Direction.HIGHER_IS_BETTER
    assert REGISTRY["VmAffinityGroups"].direction is Direction.LOWER_IS_BETTER
    assert REGISTRY["VmToHostsAffinityGroups"].direction is Direction.LOWER_IS_BETTER


EVERYTHING = with_groups(
    vmg("p", ["vm1", "a"], positive=True),
    vmg("n", ["vm1", "b"], positive=False),
    vmg("sp", ["vm1", "c"], positive=True, enforcing=False),
    vmg("sn", ["vm1", "d"], positive=False, enforcing=False),
    hostg("hp", ["h1"], positive=True),
    hostg("hn", ["h2"], positive=False),
    hostg("shp", ["h1"], positive=True, enforcing=False),
    same_host=["a"],
    different_host=["b"],
)


@pytest.mark.parametrize("unit", AFFINITY_UNITS, ids=lambda u: u.name)
def test_zero_hosts(unit: PolicyUnit) -> None:
    hosts = table()
    if unit.filter is not None:
        verdict = unit.filter(hosts, EVERYTHING, {})
        assert verdict.keep.shape == (0,)
        assert list(verdict.reasons) == []
    if unit.weight is not None:
        assert unit.weight(hosts, EVERYTHING, {}).shape == (0,)


@pytest.mark.parametrize("unit", AFFINITY_UNITS, ids=lambda u: u.name)
def test_no_groups_no_hints_is_neutral(unit: PolicyUnit) -> None:
    hosts = cluster({"h1": ["a", "b"], "h2": [], "h3": ["c"]})
    if unit.filter is not None:
        verdict = unit.filter(hosts, vm(), {})
        assert kept(hosts, verdict) == ["h1", "h2", "h3"]
    if unit.weight is not None:
        w = unit.weight(hosts, vm(), {})
        assert len(set(w.tolist())) == 1


@pytest.mark.parametrize("unit", AFFINITY_UNITS, ids=lambda u: u.name)
def test_one_host(unit: PolicyUnit) -> None:
    hosts = cluster({"h1": ["a", "b", "c", "d"]})
    if unit.filter is not None:
        verdict = unit.filter(hosts, EVERYTHING, {})
        assert verdict.keep.shape == (1,)
        assert len(verdict.reasons) == int(not verdict.keep[0])
    if unit.weight is not None:
        assert unit.weight(hosts, EVERYTHING, {}).shape == (1,)


# ------------------------------------------------------------------------------------ VM to VM (hard)
def test_hard_positive_goes_to_the_members_host() -> None:
    hosts = cluster({"h1": ["x"], "h2": ["a"], "h3": []})
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1", "a", "b"], positive=True)), {})
    assert kept(hosts, verdict) == ["h2"]
    assert reasons(hosts, verdict) == {
        "h1": "affinity group g1 (positive, hard): host has no member; members are on h2",
        "h3": "affinity group g1 (positive, hard): host has no member; members are on h2",
    }


def test_hard_positive_with_no_member_placed_keeps_all() -> None:
    hosts = cluster({"h1": ["x"], "h2": []})
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1", "a"], positive=True)), {})
    assert kept(hosts, verdict) == ["h1", "h2"]


def test_group_with_only_this_vm_keeps_all() -> None:
    # The VM itself runs on h1 (a migration): it never counts as a member of its own group.
    hosts = cluster({"h1": ["vm1"], "h2": []})
    for positive in (True, False):
        verdict = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1"], positive=positive)), {})
        assert kept(hosts, verdict) == ["h1", "h2"]


def test_hard_positive_members_on_several_hosts_accepts_any_of_them() -> None:
    # oVirt's "invalid affinity situation": it accepts every host running a member.
    hosts = cluster({"h1": ["a"], "h2": ["b"], "h3": []})
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1", "a", "b"], positive=True)), {})
    assert kept(hosts, verdict) == ["h1", "h2"]
    assert reasons(hosts, verdict)["h3"].endswith("members are on h1, h2")


def test_hard_negative_removes_hosts_with_a_member() -> None:
    hosts = cluster({"h1": ["vm7", "x"], "h2": ["x"], "h3": ["vm8", "vm9"]})
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1", "vm7", "vm8", "vm9"], positive=False)), {})
    assert kept(hosts, verdict) == ["h2"]
    assert reasons(hosts, verdict) == {
        "h1": "affinity group g1 (negative, hard): host runs member vm7",
        "h3": "affinity group g1 (negative, hard): host runs members vm8, vm9",
    }


def test_pending_members_count_as_present() -> None:
    hosts = cluster({"h1": [], "h2": [], "h3": ["b"]}, pending={"h2": ["a"], "h3": ["c"]})
    pos = vm_affinity_filter(hosts, with_groups(vmg("g1", ["vm1", "a"], positive=True)), {})
    assert kept(hosts, pos) == ["h2"]
    neg = vm_affinity_filter(hosts, with_groups(vmg("g2", ["vm1", "a", "b", "c"], positive=False)), {})
    assert kept(hosts, neg) == ["h1"]
    assert reasons(hosts, neg) == {
        "h2": "affinity group g2 (negative, hard): host has member a pending",
        "h3": "affinity group g2 (negative, hard): host runs member b and has member c pending",
    }


def test_multiple_hard_groups_combine_and_reasons_list_each() -> None:
    hosts = cluster({"h1": ["a", "b"], "h2": ["a"], "h3": ["b"], "h4": []})
    spec = with_groups(
        vmg("g1", ["vm1", "a"], positive=True),
        vmg("g2", ["vm1", "b"], positive=False),
    )
    verdict = vm_affinity_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["h2"]
    assert reasons(hosts, verdict) == {
        "h1": "affinity group g2 (negative, hard): host runs member b",
        "h3": "affinity group g1 (positive, hard): host has no member; members are on h1, h2; "
        "affinity group g2 (negative, hard): host runs member b",
        "h4": "affinity group g1 (positive, hard): host has no member; members are on h1, h2",
    }


def test_two_positive_groups_on_different_hosts_keep_nothing() -> None:
    # oVirt pools positive members and would accept h1 and h2; vmsched holds every hard group.
    hosts = cluster({"h1": ["a"], "h2": ["b"]})
    spec = with_groups(vmg("g1", ["vm1", "a"], positive=True), vmg("g2", ["vm1", "b"], positive=True))
    verdict = vm_affinity_filter(hosts, spec, {})
    assert kept(hosts, verdict) == []
    assert "g2" in reasons(hosts, verdict)["h1"]
    assert "g1" in reasons(hosts, verdict)["h2"]


def test_soft_groups_and_host_groups_do_not_filter() -> None:
    hosts = cluster({"h1": ["a"], "h2": []})
    spec = with_groups(
        vmg("s", ["vm1", "a"], positive=False, enforcing=False),
        hostg("hg", ["h2"], positive=True),
    )
    assert kept(hosts, vm_affinity_filter(hosts, spec, {})) == ["h1", "h2"]


def test_reason_lists_at_most_five_names() -> None:
    members = [f"m{i}" for i in range(7)]
    hosts = cluster({"h1": members, "h2": []})
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g", ["vm1", *members], positive=False)), {})
    assert reasons(hosts, verdict)["h1"].endswith("runs members m0, m1, m2, m3, m4 and 2 more")


# ------------------------------------------------------------------------------------ Nova server groups (hard)
def test_server_group_affinity_only_looks_at_positive_groups() -> None:
    hosts = cluster({"h1": ["a", "b"], "h2": []})
    spec = with_groups(vmg("sg", ["vm1", "a"], positive=True), vmg("anti", ["vm1", "b"], positive=False))
    verdict = server_group_affinity_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict) == {"h2": "server group sg (affinity): host has no member; members are on h1"}


def test_server_group_anti_affinity_only_looks_at_negative_groups() -> None:
    hosts = cluster({"h1": ["a"], "h2": ["b"]})
    spec = with_groups(vmg("sg", ["vm1", "a"], positive=True), vmg("anti", ["vm1", "b"], positive=False))
    verdict = server_group_anti_affinity_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict) == {"h2": "server group anti (anti-affinity): host runs member b"}


def test_server_groups_agree_with_the_ovirt_filter() -> None:
    hosts = cluster({"h1": ["a"], "h2": ["b"], "h3": ["a", "c"], "h4": []}, pending={"h4": ["c"]})
    spec = with_groups(vmg("sg", ["vm1", "a"], positive=True), vmg("anti", ["vm1", "c"], positive=False))
    both = server_group_affinity_filter(hosts, spec, {}).keep & server_group_anti_affinity_filter(hosts, spec, {}).keep
    assert both.tolist() == vm_affinity_filter(hosts, spec, {}).keep.tolist() == [True, False, False, False]


# ------------------------------------------------------------------------------------ VM to host (hard)
def test_vm_to_host_positive_and_negative() -> None:
    hosts = cluster({"h1": [], "h2": [], "h3": []})
    pos = vm_to_host_affinity_filter(hosts, with_groups(hostg("g1", ["h1", "h2"], positive=True)), {})
    assert kept(hosts, pos) == ["h1", "h2"]
    assert reasons(hosts, pos) == {
        "h3": "affinity group g1 (VM to host, positive, hard): host is not one of the group's hosts h1, h2"
    }
    neg = vm_to_host_affinity_filter(hosts, with_groups(hostg("g2", ["h1", "hx"], positive=False)), {})
    assert kept(hosts, neg) == ["h2", "h3"]
    assert reasons(hosts, neg) == {
        "h1": "affinity group g2 (VM to host, negative, hard): host is one of the group's hosts"
    }


def test_vm_to_host_groups_combine() -> None:
    hosts = cluster({"h1": [], "h2": [], "h3": []})
    spec = with_groups(
        hostg("g1", ["h1", "h2"], positive=True),
        hostg("g2", ["h2", "h3"], positive=True),
        hostg("g3", ["h3"], positive=False),
        hostg("soft", ["h1"], positive=False, enforcing=False),
    )
    verdict = vm_to_host_affinity_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["h2"]
    assert reasons(hosts, verdict)["h3"] == (
        "affinity group g1 (VM to host, positive, hard): host is not one of the group's hosts h1, h2; "
        "affinity group g3 (VM to host, negative, hard): host is one of the group's hosts"
    )


def test_vm_to_host_positive_group_without_hosts_constrains_nothing() -> None:
    hosts = cluster({"h1": [], "h2": []})
    verdict = vm_to_host_affinity_filter(hosts, with_groups(hostg("g1", [], positive=True)), {})
    assert kept(hosts, verdict) == ["h1", "h2"]


def test_vm_to_host_ignores_vm_rules() -> None:
    hosts = cluster({"h1": ["a"], "h2": []})
    spec = with_groups(vmg("g1", ["vm1", "a"], positive=False))
    assert kept(hosts, vm_to_host_affinity_filter(hosts, spec, {})) == ["h1", "h2"]


# ------------------------------------------------------------------------------------ oVirt soft weights
def test_rank_by_broken_priorities_is_ovirts_lexicographic_competition_rank() -> None:
    # oVirt's own example: breaking 1, 1, 1 beats breaking one priority-2 group.
    w = rank_by_broken_priorities([[1, 1, 1], [2], [], [1, 1], [1, 1], [1, 2]])
    # order: [] < [1,1] = [1,1] < [1,1,1] < [2] < [2,1]; competition ranks 0, 1, 1, 3, 4, 5
    assert w.tolist() == [4.0, 5.0, 1.0, 2.0, 2.0, 6.0]


def test_rank_by_broken_priorities_tie_break_prefers_more() -> None:
    w = rank_by_broken_priorities([[1], [1], [], [2]], tie_break=[0, 3, 0, 9])
    assert w.tolist() == [3.0, 2.0, 1.0, 4.0]


def test_soft_vm_weight_counts_broken_groups() -> None:
    hosts = cluster({"h1": ["a"], "h2": ["b"], "h3": ["a", "b"], "h4": []})
    spec = with_groups(
        vmg("pos", ["vm1", "a"], positive=True, enforcing=False),
        vmg("neg", ["vm1", "b"], positive=False, enforcing=False),
    )
    # broken: h1 [], h2 [pos, neg], h3 [neg], h4 [pos]; h3 and h4 tie on priorities [1], and h3 has
    # a positive member (tie-break): h1=1, h3=2, h4=3, h2=4.
    assert vm_affinity_weight(hosts, spec, {}).tolist() == [1.0, 4.0, 2.0, 3.0]


def test_soft_vm_weight_priority_beats_count() -> None:
    hosts = cluster({"h1": ["x", "y"], "h2": ["z"], "h3": []})
    spec = with_groups(
        vmg("low1", ["vm1", "x"], positive=False, enforcing=False, priority=1),
        vmg("low2", ["vm1", "y"], positive=False, enforcing=False, priority=1),
        vmg("high", ["vm1", "z"], positive=False, enforcing=False, priority=5),
    )
    # h1 breaks [1, 1], h2 breaks [5]: breaking two low-priority groups is better.
    assert vm_affinity_weight(hosts, spec, {}).tolist() == [2.0, 3.0, 1.0]


def test_soft_vm_weight_pending_members_count_and_all_equal() -> None:
    hosts = cluster({"h1": [], "h2": []}, pending={"h2": ["a"]})
    spec = with_groups(vmg("pos", ["vm1", "a"], positive=True, enforcing=False))
    assert vm_affinity_weight(hosts, spec, {}).tolist() == [2.0, 1.0]
    # No member anywhere: every host breaks the group alike.
    spec = with_groups(vmg("pos", ["vm1", "zz"], positive=True, enforcing=False))
    assert vm_affinity_weight(hosts, spec, {}).tolist() == [1.0, 1.0]


def test_soft_vm_weight_hard_positive_members_break_ties() -> None:
    # Hard groups are the filter's; the weight only uses their members to break ties (oVirt).
    hosts = cluster({"h1": ["a"], "h2": ["a", "b"]})
    spec = with_groups(vmg("hard", ["vm1", "a", "b"], positive=True))
    assert vm_affinity_weight(hosts, spec, {}).tolist() == [2.0, 1.0]


def test_soft_vm_to_host_weight() -> None:
    hosts = cluster({"h1": [], "h2": [], "h3": []})
    spec = with_groups(
        hostg("pos", ["h1", "h2"], positive=True, enforcing=False, priority=2),
        hostg("neg", ["h2"], positive=False, enforcing=False, priority=1),
        hostg("hard", ["h3"], positive=True),
    )
    # broken: h1 [], h2 [1], h3 [2] (the hard group is the filter's business).
    assert vm_to_host_affinity_weight(hosts, spec, {}).tolist() == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------ Nova soft weighers
def test_soft_affinity_weigher_counts_members() -> None:
    hosts = cluster({"h1": ["a", "b", "vm1"], "h2": ["c"], "h3": []}, pending={"h3": ["b"]})
    spec = with_groups(
        vmg("g1", ["vm1", "a", "b"], positive=True, enforcing=False),
        vmg("g2", ["vm1", "a", "c"], positive=True, enforcing=False),
        vmg("hard", ["vm1", "c"], positive=True),
        vmg("anti", ["vm1", "b"], positive=False, enforcing=False),
    )
    # h1: g1 {a, b} + g2 {a} = 3 (vm1 itself never counts); h2: g2 {c} = 1; h3: g1 {b pending} = 1.
    assert soft_affinity_weight(hosts, spec, {}).tolist() == [3.0, 1.0, 1.0]
    # Only "anti" is a soft negative group: b runs on h1 and is pending on h3.
    assert soft_anti_affinity_weight(hosts, spec, {}).tolist() == [-1.0, 0.0, -1.0]


def test_soft_weighers_without_groups_are_zero() -> None:
    hosts = cluster({"h1": ["a"], "h2": []})
    assert soft_affinity_weight(hosts, vm(), {}).tolist() == [0.0, 0.0]
    assert soft_anti_affinity_weight(hosts, vm(), {}).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------------------ Same/DifferentHost
def test_same_host() -> None:
    hosts = cluster({"h1": ["a"], "h2": [], "h3": ["x"]}, pending={"h2": ["b"]})
    verdict = same_host_filter(hosts, vm(same_host=["a", "b"]), {})
    assert kept(hosts, verdict) == ["h1", "h2"]
    assert reasons(hosts, verdict) == {"h3": "host has none of the same_host VMs a, b"}


def test_same_host_vms_nowhere_removes_all_and_self_is_ignored() -> None:
    hosts = cluster({"h1": ["vm1"], "h2": []})
    assert kept(hosts, same_host_filter(hosts, vm(same_host=["gone"]), {})) == []
    assert kept(hosts, same_host_filter(hosts, vm(same_host=["vm1"]), {})) == ["h1", "h2"]


def test_different_host() -> None:
    hosts = cluster({"h1": ["a", "b"], "h2": ["x"], "h3": []}, pending={"h3": ["c"]})
    verdict = different_host_filter(hosts, vm(different_host=["a", "b", "c"]), {})
    assert kept(hosts, verdict) == ["h2"]
    assert reasons(hosts, verdict) == {
        "h1": "host runs different_host VMs a, b",
        "h3": "host has different_host VM c pending",
    }
    assert kept(hosts, different_host_filter(hosts, vm(different_host=["vm1"]), {})) == ["h1", "h2", "h3"]


# ------------------------------------------------------------------------------------ invariants
VM_IDS = [f"v{i}" for i in range(8)]
placements = st.lists(st.lists(st.sampled_from(VM_IDS), max_size=4), min_size=0, max_size=6)
member_lists = st.lists(st.sampled_from(VM_IDS), max_size=5)


def _hosts_from(running: list[list[str]], pending: list[list[str]]) -> HostTable:
    entries = [pend_vm(f"h{i}", v) for i, vms in enumerate(pending) if i < len(running) for v in vms]
    return table(*(host(f"h{i}", vm_ids=vms) for i, vms in enumerate(running)), pending=entries)


@settings(max_examples=150, deadline=None)
@given(running=placements, pending=placements, members=member_lists, me=st.sampled_from(VM_IDS))
def test_hard_negative_never_keeps_a_host_with_a_member(
    running: list[list[str]], pending: list[list[str]], members: list[str], me: str
) -> None:
    hosts = _hosts_from(running, pending)
    spec = with_groups(vmg("g", members, positive=False), vm_id=me)
    verdict = vm_affinity_filter(hosts, spec, {})
    others = set(members) - {me}
    for i in range(len(hosts)):
        assert bool(verdict.keep[i]) == others.isdisjoint(hosts.vms_on(i))
    assert len(verdict.reasons) == int((~verdict.keep).sum())


@settings(max_examples=150, deadline=None)
@given(running=placements, pending=placements, members=member_lists, me=st.sampled_from(VM_IDS))
def test_hard_positive_keeps_exactly_the_member_hosts_or_all(
    running: list[list[str]], pending: list[list[str]], members: list[str], me: str
) -> None:
    hosts = _hosts_from(running, pending)
    verdict = vm_affinity_filter(hosts, with_groups(vmg("g", members, positive=True), vm_id=me), {})
    others = set(members) - {me}
    with_member = [not others.isdisjoint(hosts.vms_on(i)) for i in range(len(hosts))]
    expected = with_member if any(with_member) else [True] * len(hosts)
    assert verdict.keep.tolist() == expected


@settings(max_examples=150, deadline=None)
@given(
    running=placements,
    pending=placements,
    groups=st.lists(st.tuples(member_lists, st.booleans(), st.booleans(), st.integers(0, 3)), max_size=4),
)
def test_adding_the_vm_itself_to_its_groups_changes_nothing(
    running: list[list[str]], pending: list[list[str]], groups: list[tuple[list[str], bool, bool, int]]
) -> None:
    # vm1 also runs on some host (a migration), which must not matter either.
    running = [*running, ["vm1"]]
    hosts = _hosts_from(running, pending)
    without = with_groups(
        *(vmg(f"g{k}", m, positive=p, enforcing=e, priority=pr) for k, (m, p, e, pr) in enumerate(groups))
    )
    with_self = with_groups(
        *(vmg(f"g{k}", [*m, "vm1"], positive=p, enforcing=e, priority=pr) for k, (m, p, e, pr) in enumerate(groups))
    )
    for unit in AFFINITY_UNITS:
        if unit.filter is not None:
            a, b = unit.filter(hosts, without, {}), unit.filter(hosts, with_self, {})
            assert a.keep.tolist() == b.keep.tolist()
            assert list(a.reasons) == list(b.reasons)
        if unit.weight is not None:
            assert unit.weight(hosts, without, {}).tolist() == unit.weight(hosts, with_self, {}).tolist()


@settings(max_examples=150, deadline=None)
@given(
    broken=st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=8),
    extra=st.integers(0, 3),
)
def test_breaking_one_more_soft_group_never_helps(broken: list[list[int]], extra: int) -> None:
    # A host that breaks a superset of another host's groups never ranks better; the best host gets 1.
    w = rank_by_broken_priorities([*broken, [*broken[0], extra]])
    assert w[-1] > w[0]
    assert w.min() == 1.0
    # Adding the same broken group to every host keeps the order.
    w2 = rank_by_broken_priorities([[*b, extra] for b in broken])
    assert w2.tolist() == rank_by_broken_priorities(broken).tolist()


def test_hard_positive_group_with_members_only_on_removed_hosts_keeps_no_host() -> None:
    """The members run on a host no longer in play: joining them is impossible, so nothing passes."""

    full = table(host("h1", vm_ids=["other"]), host("h2"), host("h3"))
    in_play = full.subset(["h2", "h3"])  # h1 was removed by an earlier filter
    group = AffinityGroup(group_id="g", vms=["vm1", "other"], vm_rule=AffinityRule(positive=True, enforcing=True))
    unit = get_unit("VmAffinityGroups")
    assert unit.filter is not None
    verdict = unit.filter(in_play, vm(affinity_groups=[group]), {})
    assert not verdict.keep.any()
    assert "members are on h1, which are not candidates" in verdict.reasons[0]
    assert in_play.locate(["other", "nowhere"]) == {"other": "h1"}
