"""One balancing pass without I/O: which VM to move, where it may go, and the power advice.

The balancer service reads the cluster (state, pending, cool-downs, hosts a VM failed on) and then
calls these; the simulation calls them on its own view of the cluster, so both pick the same VM
from the same inputs and ask `place` the same migration request.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from vmsched.contracts import (
    MigrationDecision,
    RequestKind,
    ScheduleDecision,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.scheduling.budgets import Budget
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import get_unit
from vmsched.scheduling.units.base import BalanceOutcome, IdleKind, Migration, PolicyUnit, PowerChange, Props, VmsByHost

#: Picks a pass tries when the budgets strike every candidate of the unit's pick (that VM is then
#: left out and the unit asked again).
BUDGET_RETRIES = 3


@dataclass(frozen=True)
class BalancePick:
    """What a pass decided: the migration to attempt (the unit's pick and the picked VM's report),
    or none; and power saving's advice."""

    vm: VmReport | None
    migration: Migration | None
    power: tuple[PowerChange, ...]
    #: Without a migration: why not (logged by the balancer, counted by the simulator).
    idle_kind: IdleKind = IdleKind.NO_IMBALANCE
    idle: str = ""


def balance_unit_of(policy: Policy) -> PolicyUnit | None:
    """The policy's balance unit, or None when it names none (an unknown name raises, as get_unit does)."""
    return None if policy.balance is None else get_unit(policy.balance)


def _candidate(in_flight: Collection[str]) -> Callable[[VmReport], bool]:
    def ok(v: VmReport) -> bool:
        return v.status is VmStatus.RUNNING and v.migratable and v.host_id is not None and v.vm_id not in in_flight

    return ok


def migration_candidates(vms: Sequence[VmReport], in_flight: Collection[str]) -> Sequence[VmReport]:
    """Running, migratable VMs on a host that are not in flight (before cool-downs are checked)."""
    ok = _candidate(in_flight)
    if isinstance(vms, VmsByHost):
        return vms.kept(ok)
    return [v for v in vms if ok(v)]


def movable_vms(vms: Sequence[VmReport], in_flight: Collection[str], resting: Collection[str]) -> Sequence[VmReport]:
    """The VMs a balance unit may move: candidates that are not resting after a migration (host by
    host when given host by host)."""
    candidates = migration_candidates(vms, in_flight)
    if isinstance(candidates, VmsByHost):
        return candidates.kept(lambda v: v.vm_id not in resting)
    return [v for v in candidates if v.vm_id not in resting]


def _without(movable: Sequence[VmReport], out: Collection[str]) -> Sequence[VmReport]:
    if isinstance(movable, VmsByHost):
        return movable.kept(lambda v: v.vm_id not in out and v.host_id not in out)
    return [v for v in movable if v.vm_id not in out and v.host_id not in out]


def balance_pass(
    unit: PolicyUnit,
    props: Props,
    table: HostTable,
    movable: Sequence[VmReport],
    budget: Budget | None = None,
) -> BalancePick:
    """Run `unit` on `table` (pending folded in) with the VMs it may move (`movable_vms`), within
    `budget` (vmsched.scheduling.budgets) when given: VMs of hosts out of budget are not offered,
    and the pick's candidates lose the hosts out of budget and those the VM left lately."""
    if unit.balance is None:
        return BalancePick(None, None, ())
    if budget is None:
        return _pick(unit.balance(table, movable, props), movable)
    exhausted = budget.exhausted()
    full = budget.full_hosts(table.ids)
    offered = _without(movable, full) if exhausted is None else []
    power: tuple[PowerChange, ...] | None = None
    struck: set[str] = set()
    for _ in range(BUDGET_RETRIES):
        outcome = unit.balance(table, offered, props)
        power = outcome.power if power is None else power
        if exhausted is not None:
            return BalancePick(None, None, power, IdleKind.BUDGET_EXHAUSTED, exhausted)
        if outcome.migration is None:
            idle = outcome.idle
            if full or struck:
                idle += f" ({len(full)} hosts out of budget, {len(struck)} picks struck by the budgets)"
            return BalancePick(None, None, power, outcome.idle_kind, idle.strip())
        m = outcome.migration
        admitted = budget.admit(m.vm_id, m.source_host, m.candidates)
        if admitted:
            pick = _pick(outcome, offered)
            return BalancePick(pick.vm, Migration(m.vm_id, m.source_host, admitted, m.reason), power)
        struck.add(m.vm_id)
        offered = _without(offered, struck)
    why = f"every target of {len(struck)} picks is out of budget or a host the VM left within ReturnCooldownMinutes"
    return BalancePick(None, None, power or (), IdleKind.BUDGET_EXHAUSTED, why)


def _pick(outcome: BalanceOutcome, movable: Sequence[VmReport]) -> BalancePick:
    if outcome.migration is None:
        return BalancePick(None, None, outcome.power, outcome.idle_kind, outcome.idle)
    pick = outcome.migration
    among = movable.on(pick.source_host) if isinstance(movable, VmsByHost) else movable
    vm = next(v for v in among if v.vm_id == pick.vm_id)
    return BalancePick(vm, pick, outcome.power)


def migration_request(
    request_id: uuid.UUID,
    cluster: str,
    vm: VmReport,
    source: str,
    candidates: Sequence[str] | None,
    tried: Sequence[str] = (),
) -> ScheduleRequest:
    """The schedule request that finds the target of a migration: among `candidates` (a balance
    unit's pick), or any host but the source (None: draining a host for maintenance)."""
    return ScheduleRequest(
        request_id=request_id,
        cluster_id=cluster,
        kind=RequestKind.MIGRATE,
        vm=VmSpec(
            vm_id=vm.vm_id,
            mem_mb=vm.mem_mb,
            overhead_mb=vm.overhead_mb,
            vcpus=vm.vcpus,
            exclusive_cpus=vm.exclusive_cpus,
            cpu_usage_pct=vm.cpu_usage_pct,
            networks=vm.networks,
            ha=vm.ha,
            affinity_groups=vm.affinity_groups,
            current_host=source,
            tried_hosts=list(tried),
        ),
        # The source stays in the whitelist so the Migration filter says why it is not chosen.
        whitelist=[*candidates, source] if candidates is not None else None,
        explain_scores=False,
    )


def migration_decision(
    decision: ScheduleDecision, source: str, target: str, *, balance_unit: str, reason: str, policy: str
) -> MigrationDecision:
    """What the balancer publishes once the selector placed a migration request (`decision`, placed
    on `target`) of a VM off `source`: the balance unit's pick, or a maintenance plan's step."""
    return MigrationDecision(
        decision_id=uuid.uuid4(),
        cluster_id=decision.cluster_id,
        vm_id=decision.vm_id,
        source_host=source,
        target_host=target,
        alternates=decision.alternates,
        balance_unit=balance_unit,
        reason=reason,
        policy=policy,
        request_id=decision.request_id,
        decided_at=datetime.now(UTC),
    )


__all__ = [
    "BUDGET_RETRIES",
    "BalancePick",
    "VmsByHost",
    "balance_pass",
    "balance_unit_of",
    "migration_candidates",
    "migration_decision",
    "migration_request",
    "movable_vms",
]
