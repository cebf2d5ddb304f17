"""Maintenance as one plan: every VM of a host going into maintenance given its target at once.

Draining VM by VM (each VM asked its own migration request as it comes) could move half of a host
and then find the rest fits nowhere, split a positive affinity group over two hosts because its
first member moved before the others were asked, or start every migration at once. The plan runs
every VM through the same placement path as a migration request (`place_group`: the requests in
order, each seeing the earlier ones' targets as pending, so later VMs see earlier ones), and is:

* all or nothing: when a VM fits nowhere the plan is refused, naming every such VM and why (the
  others' targets are still computed, so one refusal lists every VM that does not fit);
* affinity-aware: the VMs of the host that share a positive enforcing group are planned one after
  another, so the first one's target is where the others must go (the affinity filter sees it
  pending there); members of a negative group are kept apart the same way. The host's own row is
  left out of the planning table: its VMs are leaving, and a group whose members all sit on the
  host would otherwise find them "on a host that is not a candidate" and refuse every host;
* bounded: the migrations are ordered into steps of at most the policy's ConcurrentMigrations
  budget (vmsched.scheduling.budgets), a group's members in consecutive steps, carried out one step
  after another. A drain is the operator's request, so it is not counted against the hourly budgets
  (it must finish whatever balancing did this hour), but it never has more migrations in flight than
  balancing may.

Each VM's affinity groups are the ones its report carries (`VmReport.affinity_groups`, as the engine
knows them), the same groups a balancing migration's request carries.

Pure library code: the balancer service plans with its view of the cluster and the simulator
plans with its own, so both plan the same way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from vmsched.contracts import (
    PendingEntry,
    PlaceItem,
    PlaceOutcome,
    PlaceRequest,
    PlaceResult,
    ScheduleRequest,
    VmReport,
    VmStatus,
)
from vmsched.contracts.maintenance import PlannedMigration, RefusedVm
from vmsched.scheduling.balancing import migration_request
from vmsched.scheduling.budgets import BUDGET_PROPERTIES, BudgetLimits
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.placement import place_group
from vmsched.scheduling.policy import Policy

#: Migrations per step when the policy sets no ConcurrentMigrations (oVirt migrates 2 VMs at a time by default).
DEFAULT_MAX_CONCURRENT = int(BUDGET_PROPERTIES["ConcurrentMigrations"].default or 2)


@dataclass(frozen=True)
class MaintenancePlanning:
    """A planned drain: `steps` when every VM has a target, or `refused` (and no steps)."""

    host_id: str
    steps: tuple[tuple[PlannedMigration, ...], ...]
    refused: tuple[RefusedVm, ...]
    max_concurrent: int

    @property
    def planned(self) -> bool:
        return not self.refused

    @property
    def migrations(self) -> list[PlannedMigration]:
        return [m for step in self.steps for m in step]


def vms_to_drain(
    vms: Sequence[VmReport], host_id: str, in_flight: frozenset[str] | set[str] = frozenset()
) -> list[VmReport]:
    """The VMs a drain of `host_id` must move: on it, running (or migrating: reported there), and
    not already on their way elsewhere (`in_flight`: VMs with a pending record)."""
    live = (VmStatus.RUNNING, VmStatus.MIGRATING)
    return [v for v in vms if v.host_id == host_id and v.status in live and v.vm_id not in in_flight]


def step_size(policy: Policy, hosts: int) -> int:
    """Migrations per step of a drain under `policy`: its ConcurrentMigrations budget, at least one."""
    return max(1, BudgetLimits.from_props(policy.properties, hosts).concurrent)


def _order(vms: Sequence[VmReport]) -> list[VmReport]:
    """The VMs in planning order: those tied by a positive enforcing group together (one unit),
    units by memory, largest first (large VMs are the hard ones to fit), then by id."""
    by_id = {v.vm_id: v for v in vms}
    parent = {v: v for v in by_id}

    def root(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for vm_id, vm in by_id.items():
        for g in vm.affinity_groups:
            if g.vm_rule is None or not (g.vm_rule.enforcing and g.vm_rule.positive):
                continue
            for other in g.vms:
                if other in by_id:
                    parent[root(other)] = root(vm_id)
    units: dict[str, list[VmReport]] = {}
    for vm_id in sorted(by_id):
        units.setdefault(root(vm_id), []).append(by_id[vm_id])
    ordered = sorted(units.values(), key=lambda u: (-sum(v.mem_mb + v.overhead_mb for v in u), u[0].vm_id))
    return [v for unit in ordered for v in unit]


async def plan_maintenance(
    table: HostTable,
    policy: Policy,
    cluster_id: str,
    host_id: str,
    vms: Sequence[VmReport],
    pending: Sequence[PendingEntry] = (),
    *,
    tried: Mapping[str, Sequence[str]] | None = None,
    max_concurrent: int | None = None,
    now: float | None = None,
) -> MaintenancePlanning:
    """Plan the drain of `host_id`: a target for each of `vms` (`vms_to_drain`) on `table` (the
    cluster's hosts; the pending it carries is replaced by `pending`) under `policy`.

    `tried` gives the hosts each VM failed on lately (not tried again); `max_concurrent` the step
    size (None: the policy's ConcurrentMigrations budget, `step_size`).
    """
    if max_concurrent is None:
        max_concurrent = step_size(policy, len(table))
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
    tried = tried or {}
    refused = [RefusedVm(vm_id=v.vm_id, reason="not migratable") for v in vms if not v.migratable]
    movable = _order([v for v in vms if v.migratable])
    if not movable:
        return MaintenancePlanning(host_id, (), tuple(refused), max_concurrent)
    # The host's row is left out: its VMs are leaving it (see the module's docstring).
    planning_table = table.updated({}, removed=[host_id]) if table.position(host_id) is not None else table
    items = []
    for n, vm in enumerate(movable):
        request = migration_request(uuid.UUID(int=n + 1), cluster_id, vm, host_id, None, tried.get(vm.vm_id, ()))
        # The hosts it failed on lately are blacklisted, as the balancer leaves them out of its candidates.
        blacklist = [host_id, *(h for h in tried.get(vm.vm_id, ()) if h != host_id)]
        request = request.model_copy(update={"blacklist": blacklist})
        items.append(PlaceItem(request=request))
    group = PlaceRequest(
        request_id=uuid.uuid4(),
        cluster_id=cluster_id,
        state_version=0,
        items=items,
        filters=policy.filter_calls(),
        weights=policy.weight_calls(),
        selector=policy.selector,
        pending=[e for e in pending if e.host_id != host_id],
        now=time.time() if now is None else now,
    )
    results = await place_group(planning_table, group)
    moves: list[PlannedMigration] = []
    for vm, result in zip(movable, results, strict=True):
        target = _target(result)
        if target is None:
            refused.append(RefusedVm(vm_id=vm.vm_id, reason=_why(result)))
        else:
            moves.append(PlannedMigration(vm_id=vm.vm_id, target_host_id=target))
    if refused:  # all or nothing
        return MaintenancePlanning(host_id, (), tuple(refused), max_concurrent)
    steps = tuple(tuple(moves[i : i + max_concurrent]) for i in range(0, len(moves), max_concurrent))
    return MaintenancePlanning(host_id, steps, (), max_concurrent)


def drain_step_request(
    request_id: uuid.UUID, cluster_id: str, vm: VmReport, host_id: str, target: str, leaving: Collection[str]
) -> ScheduleRequest:
    """The migration request of one step of `host_id`'s plan: `vm` to its planned `target`.

    Its affinity groups leave out the VMs still on the drained host (`leaving`): they follow in
    later steps, to the targets the plan gave them with this one's in view, so a positive group's
    first member is not held to the host it is leaving (the plan left that host out for the same
    reason)."""
    request = migration_request(request_id, cluster_id, vm, host_id, (target,))
    gone = {v for v in leaving if v != vm.vm_id}
    if not gone or not vm.affinity_groups:
        return request
    groups = [g.model_copy(update={"vms": [v for v in g.vms if v not in gone]}) for g in vm.affinity_groups]
    return request.model_copy(update={"vm": request.vm.model_copy(update={"affinity_groups": groups})})


def _target(result: PlaceResult) -> str | None:
    if result.outcome is not PlaceOutcome.PLACED or not result.placements:
        return None
    return result.placements[0].host_id


def _why(result: PlaceResult) -> str:
    if result.error is not None:
        return f"{result.error.code}: {result.error.message}"[:2000]
    if result.explanation is not None:
        return result.explanation.summary[:2000]
    return f"no target ({result.outcome.value})"


__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "MaintenancePlanning",
    "drain_step_request",
    "plan_maintenance",
    "step_size",
    "vms_to_drain",
]
