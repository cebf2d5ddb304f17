"""The balancer's maintenance drains: a host reported in maintenance is planned once, the plan
published as one MaintenancePlan event, then carried out step by step.

Each pass over a cluster (before the balance unit's): the hosts the engine reports in `maintenance`
that still hold VMs are planned (vmsched.scheduling.maintenance: all or nothing, affinity-aware by
the groups the VMs' reports carry, steps of at most the policy's ConcurrentMigrations budget), each
plan remembered in Redis (MaintenancePlans) so it is made once. A planned host's current step is
scheduled through the selector like the balancer's own migrations (the plan's target as the only
candidate), each placed migration published as a MigrationDecision whose reason names the plan; the
next step starts on a later pass, when the engine reports the previous step's VMs on their targets
(or gone). When a step's migration is not placed, or the engine reports one failed (the VM back on
the host, nothing pending), the plan is dropped and the host planned again on the next pass with
what is left on it. A refused plan stands for REFUSED_RETRY_S, then the host is planned again. A
plan whose host is no longer in maintenance is dropped.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime

from vmsched import constants as c
from vmsched.contracts import (
    DecisionStatus,
    HostState,
    HostStatus,
    MaintenancePlan,
    MigrationDecision,
    ScheduleDecision,
    VmReport,
    VmStatus,
)
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.scheduling.balancing import migration_decision
from vmsched.scheduling.maintenance import drain_step_request, plan_maintenance, vms_to_drain
from vmsched.scheduling.policy import Policy
from vmsched.store.cluster_reads import ClusterReader, ClusterView
from vmsched.store.keys import Keys
from vmsched.store.maintenance_plans import REFUSED_RETRY_S, MaintenancePlans, PlanProgress
from vmsched.store.memories import FailedHosts
from vmsched.store.state_records import parse_stored

log = get_logger("vmsched.balancer")

#: The `balance_unit` of a MigrationDecision that carries out a maintenance plan.
MAINTENANCE_UNIT = "Maintenance"


class Drains:
    def __init__(self, rt: Runtime, reads: ClusterReader, failed_hosts: FailedHosts) -> None:
        self.rt = rt
        self.reads = reads
        self.failed_hosts = failed_hosts
        self.plans = MaintenancePlans(rt.redis, rt.settings)
        self.keys = Keys.from_settings(rt.settings)

    async def drain(self, cluster: str, policy: Policy) -> list[MigrationDecision]:
        """One pass over the cluster's hosts in maintenance; the migrations it published."""
        plans = await self.plans.all(cluster)
        view = await self.reads.read(cluster)
        holding = {v.host_id for v in view.vms if v.host_id is not None}
        up = dict(zip(view.table.ids, view.table.up.tolist(), strict=True))
        # Only a host that is not up can be in maintenance: its status is read for those alone.
        suspects = sorted(h for h in holding | set(plans) if not up.get(h, False))
        maintenance = {h for h in suspects if await self._status(cluster, h) is HostStatus.MAINTENANCE}
        for host in set(plans) - maintenance:
            log.info("host no longer in maintenance: its plan is dropped", cluster=cluster, host=host)
            await self.plans.forget(cluster, host)
        published: list[MigrationDecision] = []
        now = time.time()
        for host in sorted(maintenance):
            progress = plans.get(host)
            if progress is None or (progress.retry_at is not None and progress.retry_at <= now):
                progress = await self._plan(cluster, policy, host, view)
                if progress is None:
                    continue
            if progress.plan.refused:
                continue
            published += await self._advance(cluster, policy, progress, view)
        return published

    async def _status(self, cluster: str, host: str) -> HostStatus | None:
        raw = await self.rt.redis.hget(self.keys.state_hosts(cluster), host)
        return None if raw is None else parse_stored(HostState, raw).report.status

    async def _plan(self, cluster: str, policy: Policy, host: str, view: ClusterView) -> PlanProgress | None:
        """Plan the host's drain and publish the plan (None: nothing left on it to move)."""
        vms = vms_to_drain(view.vms, host, view.in_flight)
        if not vms:
            return None
        tried = {v.vm_id: sorted(await self.failed_hosts.of(cluster, v.vm_id)) for v in vms}
        planning = await plan_maintenance(view.table, policy, cluster, host, vms, view.pending, tried=tried)
        plan = MaintenancePlan(
            plan_id=uuid.uuid4(),
            cluster_id=cluster,
            host_id=host,
            steps=[list(step) for step in planning.steps],
            refused=list(planning.refused),
            max_concurrent=planning.max_concurrent,
            policy=policy.name,
            decided_at=datetime.now(UTC),
        )
        retry_at = time.time() + REFUSED_RETRY_S if plan.refused else None
        progress = PlanProgress(plan, retry_at=retry_at)
        await self.plans.put(progress)
        await self.rt.bus.publish(c.maintenance_key(cluster), plan)
        if plan.refused:
            log.warning(
                "maintenance plan refused: VMs fit nowhere",
                cluster=cluster,
                host=host,
                refused=[f"{r.vm_id}: {r.reason}" for r in plan.refused][:20],
            )
        else:
            log.info("maintenance planned", cluster=cluster, host=host, vms=len(vms), steps=len(plan.steps))
        return progress

    async def _advance(
        self, cluster: str, policy: Policy, progress: PlanProgress, view: ClusterView
    ) -> list[MigrationDecision]:
        """Start the current step, or move on when its VMs are on their targets."""
        plan = progress.plan
        where = {v.vm_id: v for v in view.vms}
        while progress.step < len(plan.steps):
            moves = plan.steps[progress.step]
            if not progress.started:
                return await self._start(cluster, policy, progress, where)
            waiting = False
            for move in moves:
                vm = where.get(move.vm_id)
                if vm is None or vm.host_id == move.target_host_id or vm.host_id != plan.host_id:
                    continue  # moved (or gone): done
                if vm.vm_id not in view.in_flight and vm.status is not VmStatus.MIGRATING:
                    log.info("maintenance migration failed: planning again", cluster=cluster, vm=vm.vm_id)
                    await self.plans.forget(cluster, plan.host_id)
                    return []
                waiting = True
            if waiting:
                return []
            progress = replace(progress, step=progress.step + 1, started=False)
        log.info("maintenance plan carried out", cluster=cluster, host=plan.host_id, plan=plan.plan_id.hex)
        await self.plans.forget(cluster, plan.host_id)
        return []

    async def _start(
        self, cluster: str, policy: Policy, progress: PlanProgress, where: dict[str, VmReport]
    ) -> list[MigrationDecision]:
        """Schedule the step's migrations through the selector, each to its planned target."""
        plan = progress.plan
        published: list[MigrationDecision] = []
        where_step = f"maintenance of {plan.host_id}: plan {plan.plan_id}, step {progress.step + 1}/{len(plan.steps)}"
        leaving = {v.vm_id for v in where.values() if v.host_id == plan.host_id}
        for move in plan.steps[progress.step]:
            vm = where.get(move.vm_id)
            if vm is None or vm.host_id != plan.host_id:
                continue  # gone or already off the host
            request = drain_step_request(uuid.uuid4(), cluster, vm, plan.host_id, move.target_host_id, leaving)
            decision = await self.rt.bus.call(c.RPC_SCHEDULE, request, ScheduleDecision)
            if decision.status is not DecisionStatus.PLACED or decision.host_id is None:
                log.info(
                    "maintenance target refused by the selector: planning again",
                    cluster=cluster,
                    vm=vm.vm_id,
                    target=move.target_host_id,
                    summary=decision.explanation.summary,
                )
                await self.plans.forget(cluster, plan.host_id)
                return published
            migration = migration_decision(
                decision,
                plan.host_id,
                decision.host_id,
                balance_unit=MAINTENANCE_UNIT,
                reason=where_step,
                policy=policy.name,
            )
            await self.rt.bus.publish(c.migration_key(cluster), migration)
            published.append(migration)
        await self.plans.put(replace(progress, started=True))
        return published


__all__ = ["MAINTENANCE_UNIT", "Drains"]
