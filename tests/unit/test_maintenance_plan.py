"""Maintenance as one plan (scheduling/maintenance.py): all or nothing, affinity, steps, accumulation.

Hosts come from tests.factories (4 cores, 4096 MB, no reserve, idle); the host in maintenance is
`m`, whose VMs are reported running on it.
"""

from __future__ import annotations

import asyncio
import uuid
from functools import partial

import pytest

from tests.factories import CLUSTER, host, table, vm_report
from vmsched.contracts import AffinityGroup, AffinityRule, HostState, HostStatus, VmReport, VmStatus
from vmsched.scheduling.balancing import migration_request
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.maintenance import MaintenancePlanning, plan_maintenance, vms_to_drain
from vmsched.scheduling.policy import BUILTIN_POLICIES

POLICY = BUILTIN_POLICIES["none"]
NOW = 1_700_000_000.0
vmr = partial(vm_report, CLUSTER, vcpus=1)


def cluster(*others: HostState, on_m: list[VmReport]) -> HostTable:
    """`m` in maintenance holding `on_m`, and the other hosts."""
    mem = sum(v.mem_mb + v.overhead_mb for v in on_m)
    m = host(
        "m",
        status=HostStatus.MAINTENANCE,
        vm_ids=[v.vm_id for v in on_m],
        vm_count=len(on_m),
        mem_committed_mb=mem,
        vcpus_committed=sum(v.vcpus for v in on_m),
    )
    return table(m, *others)


def plan(t: HostTable, vms: list[VmReport], **kw: object) -> MaintenancePlanning:
    return asyncio.run(plan_maintenance(t, POLICY, CLUSTER, "m", vms, now=NOW, **kw))  # type: ignore[arg-type]


def group(gid: str, vms: list[str], *, positive: bool) -> AffinityGroup:
    return AffinityGroup(group_id=gid, vms=vms, vm_rule=AffinityRule(positive=positive, enforcing=True))


def test_every_vm_gets_a_target_off_the_host() -> None:
    vms = [vmr(f"v{i}", "m", mem_mb=512) for i in range(3)]
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms)
    assert p.planned
    assert not p.refused
    moves = p.migrations
    assert sorted(m.vm_id for m in moves) == ["v0", "v1", "v2"]
    assert {m.target_host_id for m in moves} <= {"a", "b"}


def test_later_vms_see_earlier_placements() -> None:
    """Each host takes two 1600 MB VMs (+64 overhead each): four VMs fill both hosts, and a host
    is given no more than fits, which only holds if each VM saw the ones planned before it."""
    vms = [vmr(f"v{i}", "m", mem_mb=1600) for i in range(4)]
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms)
    assert p.planned
    targets = [m.target_host_id for m in p.migrations]
    assert sorted(targets) == ["a", "a", "b", "b"]


def test_all_or_nothing_names_every_vm_that_fits_nowhere() -> None:
    vms = [vmr(f"v{i}", "m", mem_mb=1600) for i in range(4)] + [vmr("big", "m", mem_mb=3500)]
    vms.append(vmr("pinned", "m", mem_mb=256, migratable=False))
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms)
    assert not p.planned
    assert p.steps == ()
    refused = {r.vm_id: r.reason for r in p.refused}
    # big goes first (largest), so two of the 1600 MB VMs are left with no room.
    assert "pinned" in refused
    assert refused["pinned"] == "not migratable"
    assert len(refused) == 3
    assert all("Memory" in why or "memory" in why for v, why in refused.items() if v != "pinned"), refused


def test_positive_group_moves_together_onto_one_host() -> None:
    g = group("g", ["x", "y", "z"], positive=True)
    vms = [vmr(v, "m", mem_mb=512, affinity_groups=[g]) for v in ("x", "y", "z")] + [vmr("w", "m", mem_mb=256)]
    p = plan(cluster(host("a"), host("b"), host("c"), on_m=vms), vms)
    assert p.planned
    where = {m.vm_id: m.target_host_id for m in p.migrations}
    assert where["x"] == where["y"] == where["z"]
    # The group's members come one after another in the plan.
    order = [m.vm_id for m in p.migrations]
    first = order.index("x")
    assert set(order[first : first + 3]) == {"x", "y", "z"}


def test_positive_group_joins_a_member_on_another_host() -> None:
    g = group("g", ["x", "y"], positive=True)
    vms = [vmr("x", "m", mem_mb=512, affinity_groups=[g])]
    others = [host("a"), host("b", vm_ids=["y"], vm_count=1, mem_committed_mb=576, vcpus_committed=1), host("c")]
    p = plan(cluster(*others, on_m=vms), vms)
    assert [(m.vm_id, m.target_host_id) for m in p.migrations] == [("x", "b")]


def test_negative_group_kept_apart() -> None:
    g = group("g", ["p", "q", "r"], positive=False)
    vms = [vmr(v, "m", mem_mb=256, affinity_groups=[g]) for v in ("p", "q", "r")]
    p = plan(cluster(host("a"), host("b"), host("c"), on_m=vms), vms)
    assert p.planned
    assert sorted(m.target_host_id for m in p.migrations) == ["a", "b", "c"]


def test_negative_group_refused_when_too_few_hosts() -> None:
    g = group("g", ["p", "q", "r"], positive=False)
    vms = [vmr(v, "m", mem_mb=256, affinity_groups=[g]) for v in ("p", "q", "r")]
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms)
    assert not p.planned
    assert len(p.refused) == 1
    assert "VmAffinityGroups" in p.refused[0].reason


@pytest.mark.parametrize(("n", "k"), [(5, 2), (4, 2), (3, 1), (6, 4)])
def test_steps_bounded_by_concurrency(n: int, k: int) -> None:
    vms = [vmr(f"v{i}", "m", mem_mb=256) for i in range(n)]
    p = plan(cluster(host("a"), host("b"), host("c"), on_m=vms), vms, max_concurrent=k)
    assert p.planned
    assert all(1 <= len(s) <= k for s in p.steps)
    assert len(p.steps) == -(-n // k)
    assert len(p.migrations) == n


def test_default_concurrency_is_two() -> None:
    vms = [vmr(f"v{i}", "m", mem_mb=256) for i in range(5)]
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms)
    assert [len(s) for s in p.steps] == [2, 2, 1]


@pytest.mark.parametrize(("budget", "sizes"), [("3", [3, 2]), ("1", [1] * 5), ("0", [1] * 5)])
def test_steps_follow_the_policys_concurrent_migrations_budget(budget: str, sizes: list[int]) -> None:
    """A drain never has more migrations in flight than balancing may (at least one, so it finishes)."""
    policy = POLICY.model_copy(update={"properties": {"ConcurrentMigrations": budget}})
    vms = [vmr(f"v{i}", "m", mem_mb=256) for i in range(5)]
    p = asyncio.run(plan_maintenance(cluster(host("a"), host("b"), on_m=vms), policy, CLUSTER, "m", vms, now=NOW))
    assert [len(s) for s in p.steps] == sizes
    assert p.max_concurrent == sizes[0]


def test_a_balancing_migration_carries_the_vms_affinity_groups() -> None:
    """The engine's report names the VM's groups; the migration request keeps to them as a placement does."""
    g = group("g", ["p", "q"], positive=False)
    request = migration_request(uuid.UUID(int=1), CLUSTER, vmr("p", "a", mem_mb=256, affinity_groups=[g]), "a", None)
    assert request.vm.affinity_groups == [g]
    assert request.vm.current_host == "a"


def test_hosts_a_vm_failed_on_are_not_tried() -> None:
    vms = [vmr("v", "m", mem_mb=256)]
    p = plan(cluster(host("a"), host("b"), on_m=vms), vms, tried={"v": ["a"]})
    assert [m.target_host_id for m in p.migrations] == ["b"]


def test_vms_to_drain_skips_other_hosts_down_and_in_flight() -> None:
    vms = [
        vmr("on", "m", mem_mb=256),
        vmr("moving", "m", mem_mb=256, status=VmStatus.MIGRATING),
        vmr("flight", "m", mem_mb=256),
        vmr("down", "m", mem_mb=256, status=VmStatus.DOWN),
        vmr("else", "a", mem_mb=256),
    ]
    assert [v.vm_id for v in vms_to_drain(vms, "m", {"flight"})] == ["on", "moving"]
