"""Balancing, migrations and maintenance drains.

When the policy has a balance unit, a balancing pass runs every `balance_interval_s`: the pass the
balancer service runs (`balance_pass`, on the VMs not in flight nor resting), whose pick is given
a target by `place` with the migration request the service sends the selector. The VM is then in
flight (pending on its target, not picked again) until it moves `migration_delay_s` later, and
rests for `migration_cooldown_s` from the decision, as the service's cool-down does. The pass's
power advice is carried out (`PowerActions`). Every pass obeys the policy's disruption budgets
(vmsched.scheduling.budgets) over a ledger of the run's balancing migrations, as the service does
over Redis; a pass that starts nothing is counted by why (`Counts.idle`).

A host going into maintenance is drained by one plan, as the balancer service drains it
(scheduling.maintenance): every VM's target at once, affinity-aware, all or nothing, in steps of at
most two migrations, each step started when the previous one's VMs have moved (its targets
confirmed by `place`, the plan's target as the only candidate). A refused plan moves nothing and
is made again every balancing interval while the host is in maintenance.
"""

from __future__ import annotations

import uuid

from vmsched.contracts import PendingEntry, PlannedMigration, ScheduleRequest
from vmsched.scheduling.balancing import balance_pass, migration_request, movable_vms
from vmsched.scheduling.budgets import Budget, MoveRecord
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.maintenance import drain_step_request, plan_maintenance, vms_to_drain
from vmsched.scheduling.placement import Placed
from vmsched.simulation.events import Kind
from vmsched.simulation.power import PowerActions
from vmsched.simulation.records import Flight
from vmsched.simulation.state import CLUSTER_ID


class Migrations(PowerActions):
    """Balancing passes (with their power advice), maintenance drains, and the migrations they start."""

    def resting(self) -> set[str]:
        for vm_id in [v for v, until in self._rest_until.items() if until <= self.clock]:
            del self._rest_until[vm_id]
        return set(self._rest_until)

    def budget(self) -> Budget:
        """The disruption budgets now: the ledger of recent migrations, the balancing ones in flight."""
        self._ledger.prune(self.clock)
        flying = sum(1 for f in self._in_flight.values() if not f.drain)
        return Budget(self._budget, self._ledger, self.clock, flying)

    async def _balance(self) -> None:
        """One balancing pass, as the balancer service runs it for one cluster."""
        unit = self._unit
        assert unit is not None
        self.counts.balance_passes += 1
        for attempt in range(self.workload.migrations_per_cycle):
            table = self.decision_table()
            movable = movable_vms(self.vm_reports(), set(self._in_flight), self.resting())
            pick = balance_pass(unit, self._props, table, movable, self.budget())
            if attempt == 0:
                self.counts.power_advice += len(pick.power)
                for change in pick.power:
                    self._power(change)
            if pick.migration is None or pick.vm is None:
                if attempt == 0:
                    self.counts.idle[pick.idle_kind.value] += 1
                return
            source = pick.migration.source_host
            self._requests += 1
            request = migration_request(
                uuid.UUID(int=self._requests), CLUSTER_ID, pick.vm, source, pick.migration.candidates
            )
            now = self.origin + self.clock
            outcome = await self.decide(request, now)
            if not isinstance(outcome, Placed):
                self.counts.migrations_unplaced += 1
                return
            target = outcome.placements[0].host_id
            self._migrate(request, source, target)

    async def _drain(self, host: str) -> None:
        """Drain a host in maintenance by one plan (scheduling.maintenance, as the balancer service
        plans it): every VM's target at once, all or nothing, then step by step, each step's
        migrations started when the previous step's have moved. A refused plan (some VM fits
        nowhere) moves nothing and is made again a balancing interval later, as is one whose next
        step's target no longer takes its VM."""
        if self._maintenance[host] <= 0 or host in self._down:
            self._drain_plans.pop(host, None)
            return
        plan = self._drain_plans.get(host)
        if plan is None:
            steps = await self._plan_drain(host)
            if steps is None:
                return
            plan = self._drain_plans[host] = (steps, 0)
        steps, started = plan
        if started and any(m.vm_id in self._in_flight for m in steps[started - 1]):
            self._push(self.clock + self.workload.migration_delay_s, Kind.DRAIN, host)  # still moving
            return
        if started == len(steps):  # the last step moved: done
            del self._drain_plans[host]
            return
        for move in steps[started]:
            report = self._vms[host].get(move.vm_id)
            if report is None or move.vm_id in self._in_flight:
                continue  # gone meanwhile
            self._requests += 1
            request = drain_step_request(
                uuid.UUID(int=self._requests), CLUSTER_ID, report, host, move.target_host_id, self._vms[host].keys()
            )
            outcome = await self.decide(request, self.origin + self.clock)
            if not isinstance(outcome, Placed):  # the cluster changed since the plan: plan again
                self.counts.drain_unplaced += 1
                del self._drain_plans[host]
                self._push(self.clock + self.workload.balance_interval_s, Kind.DRAIN, host)
                return
            self._migrate(request, host, outcome.placements[0].host_id, drain=True)
        self._drain_plans[host] = (steps, started + 1)
        self._push(self.clock + self.workload.migration_delay_s, Kind.DRAIN, host)

    async def _plan_drain(self, host: str) -> list[list[PlannedMigration]] | None:
        """The host's plan as steps, remembered; None when nothing is left to move or it is refused."""
        vms = vms_to_drain(list(self._vms[host].values()), host, set(self._in_flight))
        if not vms:
            return None
        planning = await plan_maintenance(
            self.current_table(),
            self.policy,
            CLUSTER_ID,
            host,
            vms,
            self.pending(),
            now=self.origin + self.clock,
        )
        self.counts.drain_plans += 1
        if not planning.planned:
            self.counts.drain_unplaced += len(planning.refused)
            self._push(self.clock + self.workload.balance_interval_s, Kind.DRAIN, host)
            return None
        return [list(step) for step in planning.steps]

    def _maintenance_start(self, host_id: str) -> None:
        self._maintenance[host_id] += 1
        self._changed(host_id)
        self._push(self.clock, Kind.DRAIN, host_id)

    def _maintenance_end(self, host_id: str) -> None:
        self._maintenance[host_id] -= 1
        if self._maintenance[host_id] <= 0:
            self._drain_plans.pop(host_id, None)
        self._changed(host_id)

    def _migrate(self, request: ScheduleRequest, source: str, target: str, *, drain: bool = False) -> None:
        vm = request.vm
        cost = vm_cost(vm)
        delay = self.workload.migration_delay_s
        if not drain:  # draining is the operator's move, not the balancer's: no cool-down, no return
            left = self._left.get(vm.vm_id, {})
            if target in left:
                self.counts.returns += 1
                cooldown = max(self.workload.migration_cooldown_s, self._budget.return_cooldown_s)
                if self.clock - left[target] < cooldown:
                    self.counts.ping_pongs += 1
            self._rest_until[vm.vm_id] = self.clock + self.workload.migration_cooldown_s
            self._ledger.record(MoveRecord(self.clock, vm.vm_id, source, target))
            self.counts.migrations_started += 1
        self._in_flight[vm.vm_id] = Flight(
            drain=drain,
            source=source,
            target=target,
            decided_s=self.clock,
            pending=PendingEntry(
                vm_id=vm.vm_id,
                host_id=target,
                mem_mb=cost.mem_mb,
                vcpus=cost.vcpus,
                cpus_pinned=cost.cpus_pinned,
                request_id=request.request_id,
                fencing_token=0,
                # Outlives the migration: the pending record goes when the VM has moved.
                expires_at=self.origin + self.clock + delay + 3600.0,
            ),
        )
        self._push(self.clock + delay, Kind.MIGRATION_DONE, vm.vm_id)

    def _migration_done(self, vm_id: str) -> None:
        flight = self._in_flight.pop(vm_id, None)
        if flight is None:  # the VM went away meanwhile
            return
        if self._where.get(vm_id) != flight.source or flight.target in self._down:
            self.counts.migrations_aborted += 1
            return
        report = self._vms[flight.source].pop(vm_id)
        self._vms[flight.target][vm_id] = report.model_copy(update={"host_id": flight.target})
        self._where[vm_id] = flight.target
        if flight.drain:
            self.counts.drain_migrations += 1
        else:
            self._left.setdefault(vm_id, {})[flight.source] = flight.decided_s
            self.counts.migrations += 1
        self._changed(flight.source, load=True)
        self._changed(flight.target, load=True)


__all__ = ["Migrations"]
