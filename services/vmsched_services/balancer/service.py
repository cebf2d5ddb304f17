"""balancer: periodic load balancing (oVirt's balance units), migrations scheduled through the selector.

Every `balance_interval_s`, for each cluster whose lease this process holds and whose policy names a
balance unit: read pending, then state (vmsched.store.cluster_reads), give the unit the VMs it
may move, and schedule the VM it picks as a migration through the normal selector path (its
candidates are the whitelist; the Migration filter removes the source). A placed migration is
published as a MigrationDecision; power saving's advice as PowerActions, never executed here. At
most `migrations_per_cycle` per cluster per cycle.

No ping-pong: a migrated VM rests for `migration_cooldown_s`; a VM with a pending record (a start
or migration the state tracker has not seen complete) is in flight and not picked; non-migratable
VMs never are. Several balancers may run: each cluster is balanced by the one holding its lease.

Disruption budgets (vmsched.scheduling.budgets, the simulator's too): migrations per host and per
cluster per hour, concurrent migrations, no return to a host a VM left within the return cool-down,
over the record of this cluster's migrations in Redis (vmsched.store.budgets.MigrationBudget). A
cycle that starts nothing logs why ("balancer idle": no imbalance, imbalance not held long enough,
gain below margin, budget exhausted).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime

from vmsched import constants as c
from vmsched.contracts import (
    DecisionStatus,
    MigrationDecision,
    PowerAction,
    PowerActionKind,
    ScheduleDecision,
    VmReport,
)
from vmsched.leased_loop import LeasedLoop
from vmsched.logging import get_logger
from vmsched.metrics import BALANCE_MIGRATIONS, BALANCE_PASSES, BALANCE_POWER_ACTIONS
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched.scheduling.balancing import (
    balance_pass,
    migration_candidates,
    migration_decision,
    migration_request,
    movable_vms,
)
from vmsched.scheduling.budgets import Budget, BudgetLimits, MoveRecord
from vmsched.scheduling.units import get_unit, validate_properties
from vmsched.scheduling.units.base import Migration, PowerChange
from vmsched.store import PendingStore
from vmsched.store.budgets import MigrationBudget
from vmsched.store.cluster_reads import ClusterReader
from vmsched.store.memories import FailedHosts, MigrationCooldowns
from vmsched_services.balancer.maintenance import Drains

log = get_logger("vmsched.balancer")


class Balancer:
    def __init__(self, rt: Runtime, policies: PolicyCache | None = None) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.policies = policies or PolicyCache(rt)
        self.pending = PendingStore(rt.redis, rt.settings)
        #: Pending first, then the state; the hosts' table is the Runtime's StateCache's, kept between attempts.
        self.reads = ClusterReader(rt.redis, rt.settings, rt.state, self.pending)
        self.failed_hosts = FailedHosts(rt.redis, rt.settings)
        self.cooldowns = MigrationCooldowns(rt.redis, rt.settings)
        #: Hosts in maintenance, drained by one plan each (balancer/maintenance.py).
        self.drains = Drains(rt, self.reads, self.failed_hosts)
        self.budgets = MigrationBudget(rt.redis, rt.settings)
        self.loop = LeasedLoop(rt, c.LEASE_BALANCER, rt.settings.balance_interval_s, self.cycle)
        self.leases = self.loop.leases

    async def cycle(self, cluster: str) -> list[MigrationDecision]:
        """One pass over a cluster: the balance unit's, then the maintenance drains (whatever the
        policy's balance unit, or none, says); the migrations it published."""
        published = await self.balance(cluster)
        policy = await self.policies.for_cluster(cluster)
        return published + await self.drains.drain(cluster, policy)

    async def balance(self, cluster: str) -> list[MigrationDecision]:
        """One balancing cycle of one cluster; the migrations it published."""
        BALANCE_PASSES.inc()
        policy = await self.policies.for_cluster(cluster)
        if policy.balance is None:
            return []
        unit = get_unit(policy.balance)
        if unit.balance is None:
            log.warning("policy names a balance unit that cannot balance", cluster=cluster, unit=unit.name)
            return []
        props = validate_properties(unit, policy.properties)
        published: list[MigrationDecision] = []
        for attempt in range(self.settings.migrations_per_cycle):
            view = await self.reads.read(cluster)
            movable = await self._movable(cluster, view.vms, view.in_flight)
            budget = await self._budget(cluster, policy.properties, len(view.table), view.in_flight)
            pick = balance_pass(unit, props, view.table, movable, budget)
            if attempt == 0:
                await self._advise_power(cluster, unit.name, policy.name, pick.power)
            if pick.migration is None or pick.vm is None:
                if attempt == 0:
                    why = pick.idle_kind.value
                    log.info("balancer idle", cluster=cluster, unit=unit.name, why=why, reason=pick.idle)
                break
            migration = await self._migrate(cluster, unit.name, policy.name, pick.migration, pick.vm)
            if migration is None:
                break
            await self.budgets.record(
                cluster,
                MoveRecord(time.time(), migration.vm_id, migration.source_host, migration.target_host),
                migration.decision_id.hex,
                budget.limits.return_cooldown_s,
            )
            published.append(migration)
        return published

    async def _budget(
        self, cluster: str, properties: Mapping[str, str], hosts: int, in_flight: Collection[str]
    ) -> Budget:
        """The disruption budgets now: the policy's limits over the recorded migrations, those whose
        VM is still pending (not seen moved by the state tracker) in flight."""
        limits = BudgetLimits.from_props(properties, hosts)
        now = time.time()
        ledger = await self.budgets.ledger(cluster, now, limits.return_cooldown_s)
        flying = {m.vm_id for m in ledger.moves() if now - m.at_s < 3600.0 and m.vm_id in in_flight}
        return Budget(limits, ledger, now, len(flying))

    async def _advise_power(self, cluster: str, unit: str, policy: str, changes: Sequence[PowerChange]) -> None:
        for change in changes:
            await self.rt.bus.publish(
                c.power_key(cluster),
                PowerAction(
                    action_id=uuid.uuid4(),
                    cluster_id=cluster,
                    host_id=change.host_id,
                    action=PowerActionKind(change.action),
                    balance_unit=unit,
                    reason=change.reason,
                    policy=policy,
                    decided_at=datetime.now(UTC),
                ),
            )
            BALANCE_POWER_ACTIONS.labels(change.action).inc()

    async def _migrate(
        self, cluster: str, unit: str, policy: str, pick: Migration, vm: VmReport
    ) -> MigrationDecision | None:
        """Ask the selector for a target for the unit's pick; publish the migration if one is found."""
        # Hosts where this VM's start or migration failed lately are not tried again.
        tried = await self.failed_hosts.of(cluster, vm.vm_id)
        candidates = tuple(h for h in pick.candidates if h not in tried)
        if not candidates:
            log.info("every candidate failed this VM before", cluster=cluster, vm=vm.vm_id)
            return None
        decision = await self._schedule(cluster, vm, pick.source_host, candidates, sorted(tried))
        if decision.status is not DecisionStatus.PLACED or decision.host_id is None:
            summary = decision.explanation.summary
            log.info("no migration target", cluster=cluster, vm=vm.vm_id, reason=pick.reason, summary=summary)
            return None
        migration = migration_decision(
            decision, pick.source_host, decision.host_id, balance_unit=unit, reason=pick.reason, policy=policy
        )
        await self.cooldowns.start(cluster, vm.vm_id, migration.decision_id.hex)
        await self.rt.bus.publish(c.migration_key(cluster), migration)
        BALANCE_MIGRATIONS.inc()
        log.info(
            "migration decided",
            cluster=cluster,
            vm=vm.vm_id,
            source=pick.source_host,
            target=decision.host_id,
            reason=pick.reason,
        )
        return migration

    async def _movable(self, cluster: str, vms: list[VmReport], in_flight: Collection[str]) -> Sequence[VmReport]:
        """Running, migratable VMs that are neither in flight nor resting after a migration."""
        candidates = migration_candidates(vms, in_flight)
        if not candidates:
            return []
        resting = await self.cooldowns.resting(cluster, [v.vm_id for v in candidates])
        return movable_vms(candidates, (), resting)

    async def _schedule(
        self, cluster: str, vm: VmReport, source: str, candidates: tuple[str, ...], tried: list[str]
    ) -> ScheduleDecision:
        request = migration_request(uuid.uuid4(), cluster, vm, source, candidates, tried)
        return await self.rt.bus.call(c.RPC_SCHEDULE, request, ScheduleDecision)


async def start(rt: Runtime) -> Balancer:
    balancer = Balancer(rt)
    await balancer.policies.subscribe()
    rt.spawn(balancer.loop.run(), name="balancer")
    return balancer
