"""The state the simulation keeps: the cluster as the state tracker keeps it (each host's report
plus the aggregates of its VMs, `aggregate_host`), as a HostTable updated row by row, with where
every VM runs, what is pending, and the clock.

A load curve scales every VM's CPU load by the hour of the simulated day: at each hour the VMs'
reports change, as the engine's reports would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    ClusterReport,
    HostReport,
    HostState,
    HostStatus,
    PendingEntry,
    PlannedMigration,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.scheduling.balancing import balance_unit_of
from vmsched.scheduling.budgets import BudgetLimits, MigrationLedger
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.host_aggregates import aggregate_host
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.placement import Outcome
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import validate_properties
from vmsched.scheduling.units.base import VmsByHost
from vmsched.simulation.deciding import decide, effective_policy
from vmsched.simulation.events import EventQueue, Kind
from vmsched.simulation.packing_bound import LOAD_STEP
from vmsched.simulation.records import Counts, Flight, Sampler, Starting
from vmsched.simulation.workload import HostSpec, VmArrival, Workload

CLUSTER_ID = "sim"


def host_report(spec: HostSpec, host_id: str) -> HostReport:
    """A host as it reports itself with nothing running."""
    return HostReport(
        cluster_id=CLUSTER_ID,
        host_id=host_id,
        status=HostStatus.UP,
        cpu_sockets=1,
        cpu_cores=spec.cpu_cores,
        cpu_threads=spec.cpu_threads,
        physical_mem_mb=spec.mem_mb,
        mem_free_mb=max(0, spec.mem_mb - spec.reserved_mem_mb),
        reserved_mem_mb=spec.reserved_mem_mb,
        networks=list(spec.networks),
        labels=dict(spec.labels),
        is_spm=spec.is_spm,
    )


class ClusterState:
    """The simulated cluster of one workload under one policy, and the views of it that decisions
    read; the simulation's events change it (`Simulation` runs them)."""

    def __init__(self, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> None:
        self.workload = workload
        self.policy = policy = effective_policy(workload, policy)
        self.sampler = sampler
        self.settings = ClusterReport(
            cluster_id=CLUSTER_ID,
            memory_overcommit_pct=workload.cluster.memory_overcommit_pct,
            count_threads_as_cores=workload.cluster.count_threads_as_cores,
        )
        self.origin = workload.start.timestamp()
        self.clock = 0.0
        self.counts = Counts()
        self._base: dict[str, HostReport] = {}
        for spec, ids in workload.named_hosts():
            for host_id in ids:
                self._base[host_id] = host_report(spec, host_id)
        self._cpus = {
            h: float(r.cpu_threads if self.settings.count_threads_as_cores and r.cpu_threads else r.cpu_cores)
            for h, r in self._base.items()
        }
        self._vms: dict[str, dict[str, VmReport]] = {h: {} for h in self._base}
        self._where: dict[str, str] = {}
        self._down: set[str] = set()
        #: Hosts powered off by power actions, and those of them booting (powered on, not up yet).
        self._off: set[str] = set()
        self._booting: set[str] = set()
        self._maintenance: Counter[str] = Counter()
        #: Each VM's CPU load as asked for, before the load curve's factor.
        self._base_load: dict[str, float] = {}
        self._factor = self._load_factor(0.0)
        self._starting: dict[str, Starting] = {}
        #: The arrival of every VM placed (an HA VM is asked for again when its host fails).
        self._arrivals: dict[str, VmArrival] = {}
        #: The hosts failing the last HA check (None before the first).
        self._ha_failing: list[str] | None = None
        #: When each host's CPU load last changed, and to what (its one CPU sample).
        self._load_since: dict[str, tuple[float, float]] = {}
        #: Hosts whose VMs want more CPU than the host has: host -> wanted % (over 100), before the
        #: cap a host's reported load has (the report's unmet demand).
        self._overload: dict[str, float] = {}
        self._demand: Counter[tuple[float, float, float]] = Counter()
        self._dirty: set[str] = set()
        #: Of the hosts changed since the last table, those whose VMs' CPU load is all that changed
        #: (the hour's load curve): their state is the last one with the new load.
        self._load_only: set[str] = set()
        self._states = {h: self.host_state(h) for h in self._base}
        self.table = HostTable.from_states(self._states.values(), self.settings)
        self._groups = self._affinity_groups()
        self._queue = EventQueue()
        self._requests = 0
        self._unit = balance_unit_of(policy)
        if self._unit is not None and self._unit.balance is None:
            self._unit = None
        self._props = validate_properties(self._unit, policy.properties) if self._unit is not None else {}
        self._in_flight: dict[str, Flight] = {}
        #: Host in maintenance -> its drain plan's steps and how many of them were started.
        self._drain_plans: dict[str, tuple[list[list[PlannedMigration]], int]] = {}
        #: VM -> simulated second its cool-down ends.
        self._rest_until: dict[str, float] = {}
        #: VM -> (host, simulated second of the decision that moved it off) for each host it left.
        self._left: dict[str, dict[str, float]] = {}
        #: The disruption budgets the balancer obeys (vmsched.scheduling.budgets), and its record.
        self._budget = BudgetLimits.from_props(policy.properties, len(self._base))
        self._ledger = MigrationLedger(self._budget.return_cooldown_s)
        #: Wall seconds spent in the sampler (the report's own work, not the simulation's).
        self.sampling_s = 0.0

    def host_status(self, host_id: str) -> HostStatus:
        if host_id in self._down or host_id in self._off:
            return HostStatus.DOWN
        if self._maintenance[host_id] > 0:
            return HostStatus.MAINTENANCE
        return HostStatus.UP

    def host_state(self, host_id: str) -> HostState:
        """The host as the state tracker would hold it: its report (with the usage its VMs make:
        each uses all of its memory, and its CPU load of its vCPUs) plus their aggregates, with one
        CPU sample taken when the host's load last changed (so an overload lasts from then)."""
        vms = self._vms[host_id].values()
        base = self._base[host_id]
        load = min(100.0, sum(v.cpu_usage_pct * v.vcpus for v in vms) / self._cpus[host_id])
        since = self._load_since.get(host_id)
        samples = [(self.origin + since[0], since[1])] if since is not None else []
        # The aggregates first, on the bare report: the memory they commit is the report's free
        # memory (one pass over the VMs' costs, not two); then the report as the host sends it.
        state = aggregate_host(base, vms, cpu_samples=samples)
        report = base.model_copy(
            update={
                "status": self.host_status(host_id),
                "mem_free_mb": max(0, base.physical_mem_mb - base.reserved_mem_mb - state.mem_committed_mb),
                "cpu_usage_pct": round(load, 3),
            }
        )
        return state.model_copy(update={"report": report})

    def host_states(self) -> list[HostState]:
        return [self.host_state(h) for h in self._base]

    def vms_on(self, host_id: str) -> frozenset[str]:
        return frozenset(self._vms[host_id])

    def where(self, vm_id: str) -> str | None:
        return self._where.get(vm_id)

    def current_table(self) -> HostTable:
        """The table with every change so far applied."""
        if self._dirty:
            load_only = self._load_only
            changed = {h: self._reloaded(h) if h in load_only else self.host_state(h) for h in sorted(self._dirty)}
            self._states.update(changed)
            self.table = self.table.updated(changed)
            self._dirty.clear()
            load_only.clear()
        return self.table

    def _reloaded(self, host_id: str) -> HostState:
        """`host_state` of a host whose VMs' CPU load is all that changed since its last state: that
        state with the new load and CPU sample (its aggregates, status and memory are the same)."""
        old = self._states[host_id]
        vms = self._vms[host_id].values()
        load = min(100.0, sum(v.cpu_usage_pct * v.vcpus for v in vms) / self._cpus[host_id])
        since = self._load_since.get(host_id)
        samples = [(self.origin + since[0], since[1])] if since is not None else []
        report = old.report.model_copy(update={"cpu_usage_pct": round(load, 3)})
        return old.model_copy(update={"report": report, "cpu_samples": samples})

    def _load_factor(self, clock: float) -> float:
        curve = self.workload.load_curve
        if not curve:
            return 1.0
        hour = int(((self.origin + clock) // 3600) % 24)
        return curve[hour]

    def _load_of(self, vm_id: str) -> float:
        return round(min(100.0, self._base_load[vm_id] * self._factor), 3)

    def _changed(self, host_id: str, *, load: bool = False, load_only: bool = False) -> None:
        """Mark `host_id` changed (its state is made again for the next table); with `load`, its
        VMs' CPU load changed; with `load_only`, nothing else did (its VMs stay, with new loads)."""
        if load_only and host_id not in self._dirty:
            self._load_only.add(host_id)
        elif not load_only:
            self._load_only.discard(host_id)
        if load or load_only:
            vms = self._vms[host_id].values()
            wanted = sum(v.cpu_usage_pct * v.vcpus for v in vms) / self._cpus[host_id]
            if wanted > 100.0:
                self._overload[host_id] = wanted
            else:
                self._overload.pop(host_id, None)
            pct = min(100.0, wanted)
            self._load_since[host_id] = (self.clock, round(pct, 3))
        self._dirty.add(host_id)

    def _affinity_groups(self) -> dict[str, AffinityGroup]:
        members: dict[str, list[str]] = {g.id: [] for g in self.workload.affinity_groups}
        for a in self.workload.arrivals:
            for g in a.affinity_groups:
                members[g].append(a.vm_id)
        return {
            g.id: AffinityGroup(
                group_id=g.id,
                vms=members[g.id],
                vm_rule=AffinityRule(positive=g.positive, enforcing=g.enforcing),
            )
            for g in self.workload.affinity_groups
        }

    def vm_spec(self, arrival: VmArrival) -> VmSpec:
        return VmSpec(
            vm_id=arrival.vm_id,
            mem_mb=arrival.mem_mb,
            vcpus=arrival.vcpus,
            ha=arrival.ha,
            cpu_usage_pct=round(min(100.0, arrival.cpu_usage_pct * self._factor), 3),
            networks=list(arrival.networks),
            affinity_groups=[self._groups[g] for g in arrival.affinity_groups],
            pinned_hosts=list(arrival.pinned_hosts),
        )

    def _push(self, at_s: float, kind: Kind, payload: Any) -> None:
        self._queue.push(at_s, kind, payload)

    async def decide(self, request: ScheduleRequest, now: float) -> Outcome:
        """The decision for one request on the cluster as it is, with what is pending (VMs
        starting, migrations in flight); a seam for tests and for deciding elsewhere."""
        return await decide(self.current_table(), self.policy, request, now, self.pending())

    def decision_table(self) -> HostTable:
        """The table a decision sees: every change so far, with in-flight migrations pending on
        their targets, evaluated now (as the balancer and filter-worker fold pending in)."""
        return self.current_table().with_pending(self.pending(), now=self.origin + self.clock)

    def pending(self) -> list[PendingEntry]:
        """The pending records: VMs starting (on their hosts), migrations in flight (on their targets)."""
        return [s.pending for s in self._starting.values()] + [f.pending for f in self._in_flight.values()]

    def vm_reports(self) -> Sequence[VmReport]:
        """Every running VM, host by host in the workload's order: a view (read it before the next
        event) that a balance unit reads a source host's VMs of without walking all."""
        return VmsByHost(self._vms)

    def _start(self, arrival: VmArrival, host_id: str) -> None:
        report = VmReport(
            cluster_id=CLUSTER_ID,
            vm_id=arrival.vm_id,
            status=VmStatus.RUNNING,
            host_id=host_id,
            mem_mb=arrival.mem_mb,
            # A simulated VM uses all of its memory (the HA check counts memory used).
            mem_usage_pct=100.0,
            vcpus=arrival.vcpus,
            cpu_usage_pct=self._load_of(arrival.vm_id),
            ha=arrival.ha,
            networks=list(arrival.networks),
            # Its groups, as the engine reports them: a balancing or drain migration keeps to them.
            affinity_groups=[self._groups[g] for g in arrival.affinity_groups],
        )
        self._vms[host_id][arrival.vm_id] = report
        self._where[arrival.vm_id] = host_id
        self._demand[_size(report)] += 1
        self._changed(host_id, load=True)

    def _remove(self, vm_id: str) -> VmReport | None:
        self._in_flight.pop(vm_id, None)  # a migration of a VM that is gone has nothing to move
        host_id = self._where.pop(vm_id, None)
        if host_id is None:
            return None
        report = self._vms[host_id].pop(vm_id)
        size = _size(report)
        self._demand[size] -= 1
        if not self._demand[size]:
            del self._demand[size]
        self._changed(host_id, load=True)
        return report

    def _load_change(self) -> None:
        """The hour turned: every VM's CPU load follows the load curve's factor for it."""
        factor = self._load_factor(self.clock)
        if factor == self._factor:
            return
        self._factor = factor
        self.counts.load_changes += 1
        for host, vms in self._vms.items():
            if not vms:
                continue
            for vm_id, report in vms.items():
                size = _size(report)
                self._demand[size] -= 1
                if not self._demand[size]:
                    del self._demand[size]
                scaled = report.model_copy(update={"cpu_usage_pct": self._load_of(vm_id)})
                vms[vm_id] = scaled
                self._demand[_size(scaled)] += 1
            self._changed(host, load_only=True)


def _size(vm: VmReport) -> tuple[float, float, float]:
    """What the VM takes, as the packing bound counts it: its CPU load in quarters of a CPU, so
    the VMs of a flavour fall into a few sizes (the bound packs equal sizes at once)."""
    cost = vm_cost(vm)
    return float(cost.mem_mb), float(cost.vcpus), LOAD_STEP * round(vm.cpu_usage_pct * vm.vcpus / LOAD_STEP)


__all__ = ["CLUSTER_ID", "LOAD_STEP", "ClusterState", "host_report"]
