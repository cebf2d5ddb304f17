"""The simulation's event loop: a workload replayed on a simulated clock against one policy.

The cluster's state is kept as the state tracker keeps it (each host's report plus the
aggregates of its VMs, `aggregate_host`), as a HostTable updated row by row; each arrival is
placed by `place`, the one decision function the selector runs, with the policy's local filter
and weigh steps. A placed VM is pending on its host (as the selector's pending record holds it)
for `start_delay_s`, then runs; with no delay it runs at once.

When the policy has a balance unit, a balancing pass runs every `balance_interval_s`: the pass the
balancer service runs (`balance_pass`, on the VMs not in flight nor resting), whose pick is given
a target by `place` with the migration request the service sends the selector. The VM is then in
flight (pending on its target, not picked again) until it moves `migration_delay_s` later, and
rests for `migration_cooldown_s` from the decision, as the service's cool-down does. The pass's
power advice is carried out (`power_actions`): a host powered off is down, one powered on comes up
`power_on_delay_s` later.

A host going into maintenance is drained: each of its VMs is given a target by `place` (a
migration request with no whitelist, so the Migration filter drops the host itself) and moves
after the migration delay; VMs no host takes are tried again every balancing interval.

With `ha_reservation`, the HA monitor's check (`ha.check`) runs every `ha_interval_s` on the same
view, counting failed checks, alerts (a pass turning into a failure) and recoveries.

A load curve scales every VM's CPU load by the hour of the simulated day: at each hour the VMs'
reports change, as the engine's reports would.
"""

from __future__ import annotations

import gc
import heapq
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    ClusterReport,
    HostReport,
    HostState,
    HostStatus,
    PendingEntry,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.scheduling import ha
from vmsched.scheduling.balancing import balance_pass, balance_unit_of, migration_request, movable_vms
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import LocalSteps, Outcome, Placed, Unplaceable, pending_entry, place, top_hosts
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import validate_properties
from vmsched.scheduling.units.balance import POWER_OFF, POWER_ON
from vmsched.scheduling.units.base import PowerChange, VmsByHost
from vmsched.simulation.workload import HostSpec, VmArrival, Workload
from vmsched.store.state_records import aggregate_host

CLUSTER_ID = "sim"
#: The policy property that tells the units the cluster keeps HA reservation (as an attached
#: cluster's policy carries it).
HA_RESERVATION_PROPERTY = "HaReservation"
#: The packing bound's unit of CPU load, % of one CPU.
LOAD_STEP = 25.0


class Kind(IntEnum):
    """Event kinds; at one instant they apply in this order (a host repaired at t takes VMs
    arriving at t; a sample sees everything that happened at its instant)."""

    REPAIR = 0
    FAIL = 1
    POWERED_ON = 2
    MAINTENANCE_START = 3
    MAINTENANCE_END = 4
    DEPART = 5
    MIGRATION_DONE = 6
    STARTED = 7
    LOAD = 8
    DRAIN = 9
    RESTART = 10
    ARRIVE = 11
    BALANCE = 12
    HA_CHECK = 13
    SAMPLE = 14


@dataclass(frozen=True)
class Failure:
    """An arrival (or an HA VM's restart) that was not placed, with why."""

    at_s: float
    vm_id: str
    summary: str
    #: Filters that removed hosts in the failed decision ("no candidates" when no host was up).
    filters: tuple[str, ...]
    #: The restart of an HA VM whose host failed.
    restart: bool = False


@dataclass
class Counts:
    arrivals: int = 0
    placed: int = 0
    departures: int = 0
    host_failures: int = 0
    #: VMs that were on a host when it failed; of the HA ones, those restarted elsewhere and those
    #: no host took.
    vms_lost: int = 0
    ha_restarted: int = 0
    ha_vms_lost: int = 0
    #: VMs whose host went down while they were starting on it.
    starts_lost: int = 0
    failures: list[Failure] = field(default_factory=list)
    balance_passes: int = 0
    #: Migrations decided (a target found), completed, and dropped before completing (the VM left
    #: its source or the target went down meanwhile).
    migrations_started: int = 0
    migrations: int = 0
    migrations_aborted: int = 0
    #: Picks for which `place` found no target.
    migrations_unplaced: int = 0
    #: Migrations back to a host the VM left within its cool-down (counted from the decision that
    #: moved it off, as the service's cool-down is): the cool-down should make these 0.
    ping_pongs: int = 0
    #: Migrations back to a host the VM had left, at any time.
    returns: int = 0
    #: Power saving's advice (power a host on or off), and what of it was carried out.
    power_advice: int = 0
    power_offs: int = 0
    power_ons: int = 0
    #: Migrations that drained hosts going into maintenance, and drain attempts with no target.
    drain_migrations: int = 0
    drain_unplaced: int = 0
    #: HA-reservation checks run, failed, alerts raised (a pass turned failure) and recoveries;
    #: the most hosts one check named.
    ha_checks: int = 0
    ha_checks_failed: int = 0
    ha_alerts: int = 0
    ha_recoveries: int = 0
    ha_failing_hosts_max: int = 0
    #: Hour-of-day load changes applied.
    load_changes: int = 0
    #: vm -> host of every placement made (the arrival's decision), for comparing runs.
    placements: dict[str, str] = field(default_factory=dict)

    @property
    def vm_events(self) -> int:
        return self.arrivals + self.departures


@dataclass(frozen=True)
class Snapshot:
    """The cluster at a sample instant, for the report."""

    at_s: float
    table: HostTable
    #: Live VMs' (memory need MB, vCPUs, CPU load in % of one CPU) -> how many.
    demand: Counter[tuple[float, float, float]]
    #: Hosts that have not failed (up, in maintenance, or powered off: packing may use them).
    alive: tuple[str, ...]
    #: Hosts powered off (or still booting) by power actions.
    off: frozenset[str] = frozenset()


#: Called at every sample instant.
Sampler = Callable[[Snapshot], None]


@dataclass(frozen=True)
class Flight:
    """A migration decided and not yet completed."""

    source: str
    target: str
    decided_s: float
    pending: PendingEntry
    #: Draining a host for maintenance (not the balance unit's pick).
    drain: bool = False


@dataclass(frozen=True)
class Starting:
    """A VM placed and not yet running: pending on its host."""

    arrival: VmArrival
    host_id: str
    pending: PendingEntry


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


async def decide(
    table: HostTable,
    policy: Policy,
    request: ScheduleRequest,
    now: float,
    pending: Sequence[PendingEntry] = (),
) -> Outcome:
    """What the selector decides for `request` on `table` under `policy` at unix time `now` with
    `pending` held on their hosts: `place` with the policy's local steps, as the filter-worker runs
    them. The steps fold `pending` into `table` themselves (whatever pending the table carries is
    replaced), so it is passed here, not folded in first."""
    steps = LocalSteps.of(table, policy, now=now, weigh_in_filter=True, top=top_hosts(request))

    def pending_for(vm: VmSpec, host_id: str) -> PendingEntry:
        return pending_entry(vm, host_id, request_id=request.request_id, fencing_token=0, expires_at=now + 60.0)

    return await place(
        request,
        policy.filter_names(),
        candidate_hosts(table, request.whitelist, request.blacklist).ids,
        list(pending),
        filter_fn=steps.filter,
        weigh_fn=steps.weigh,
        pending_for=pending_for,
        may_wait=False,
    )


def effective_policy(workload: Workload, policy: Policy) -> Policy:
    """`policy` as the workload runs it: the workload's defaults under its properties, the
    workload's properties over them, and HaReservation when the cluster keeps HA reservation (as
    an attached cluster's policy carries it)."""
    overrides = dict(workload.policy_properties)
    if workload.cluster.ha_reservation:
        overrides[HA_RESERVATION_PROPERTY] = "true"
    if not overrides and not workload.policy_defaults:
        return policy
    properties = {**workload.policy_defaults, **policy.properties, **overrides}
    return policy.model_copy(update={"properties": properties})


class Simulation:
    """One workload under one policy. `run` replays it; `counts` and the sampler get the results."""

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
        for spec in workload.hosts:
            for host_id in spec.ids():
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
        self._demand: Counter[tuple[float, float, float]] = Counter()
        self._dirty: set[str] = set()
        self._states = {h: self.host_state(h) for h in self._base}
        self.table = HostTable.from_states(self._states.values(), self.settings)
        self._groups = self._affinity_groups()
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._requests = 0
        self._unit = balance_unit_of(policy)
        if self._unit is not None and self._unit.balance is None:
            self._unit = None
        self._props = validate_properties(self._unit, policy.properties) if self._unit is not None else {}
        self._in_flight: dict[str, Flight] = {}
        #: VM -> simulated second its cool-down ends.
        self._rest_until: dict[str, float] = {}
        #: VM -> (host, simulated second of the decision that moved it off) for each host it left.
        self._left: dict[str, dict[str, float]] = {}
        #: Wall seconds spent in the sampler (the report's own work, not the simulation's).
        self.sampling_s = 0.0

    # ---------------------------------------------------------------------------- state
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
        committed = sum(vm_cost(v).mem_mb for v in vms)
        load = min(100.0, sum(v.cpu_usage_pct * v.vcpus for v in vms) / self._cpus[host_id])
        report = base.model_copy(
            update={
                "status": self.host_status(host_id),
                "mem_free_mb": max(0, base.physical_mem_mb - base.reserved_mem_mb - committed),
                "cpu_usage_pct": round(load, 3),
            }
        )
        since = self._load_since.get(host_id)
        samples = [(self.origin + since[0], since[1])] if since is not None else []
        return aggregate_host(report, vms, cpu_samples=samples)

    def host_states(self) -> list[HostState]:
        return [self.host_state(h) for h in self._base]

    def vms_on(self, host_id: str) -> frozenset[str]:
        return frozenset(self._vms[host_id])

    def where(self, vm_id: str) -> str | None:
        return self._where.get(vm_id)

    def current_table(self) -> HostTable:
        """The table with every change so far applied."""
        if self._dirty:
            changed = {h: self.host_state(h) for h in sorted(self._dirty)}
            self._states.update(changed)
            self.table = self.table.updated(changed)
            self._dirty.clear()
        return self.table

    def _load_factor(self, clock: float) -> float:
        curve = self.workload.load_curve
        if not curve:
            return 1.0
        hour = int(((self.origin + clock) // 3600) % 24)
        return curve[hour]

    def _load_of(self, vm_id: str) -> float:
        return round(min(100.0, self._base_load[vm_id] * self._factor), 3)

    def _changed(self, host_id: str, *, load: bool = False) -> None:
        if load:
            vms = self._vms[host_id].values()
            pct = min(100.0, sum(v.cpu_usage_pct * v.vcpus for v in vms) / self._cpus[host_id])
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

    # ---------------------------------------------------------------------------- events
    def _push(self, at_s: float, kind: Kind, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_s, int(kind), self._seq, payload))

    def _every(self, first: float, interval: float, end: float, kind: Kind) -> None:
        t = first
        while t <= end:
            self._push(t, kind, None)
            t += interval

    def _schedule_workload(self) -> float:
        w = self.workload
        end = w.end_s()
        for a in w.arrivals:
            self._push(a.at_s, Kind.ARRIVE, a)
        for d in w.departures:
            self._push(d.at_s, Kind.DEPART, d.vm_id)
        for f in w.failures:
            self._push(f.at_s, Kind.FAIL, f.host_id)
            if f.repair_s is not None:
                self._push(f.at_s + f.repair_s, Kind.REPAIR, f.host_id)
        for m in w.maintenance:
            self._push(m.start_s, Kind.MAINTENANCE_START, m.host_id)
            self._push(m.end_s, Kind.MAINTENANCE_END, m.host_id)
        if self._unit is not None:
            self._every(w.balance_interval_s, w.balance_interval_s, end, Kind.BALANCE)
        if w.cluster.ha_reservation:
            self._every(w.ha_interval_s, w.ha_interval_s, end, Kind.HA_CHECK)
        if w.load_curve:  # at every hour boundary of the simulated clock
            self._every(3600.0 - self.origin % 3600.0, 3600.0, end, Kind.LOAD)
        self._every(0.0, w.sample_interval_s, end, Kind.SAMPLE)
        if end % w.sample_interval_s:
            self._push(end, Kind.SAMPLE, None)
        return end

    async def run(self) -> Counts:
        end = self._schedule_workload()
        handlers = self._handlers()
        while self._events and self._events[0][0] <= end:
            at_s, kind, _, payload = heapq.heappop(self._events)
            self.clock = at_s
            await handlers[Kind(kind)](payload)
        return self.counts

    def _handlers(self) -> dict[Kind, Callable[[Any], Awaitable[None]]]:
        def sync(fn: Callable[[Any], None]) -> Callable[[Any], Awaitable[None]]:
            async def call(payload: Any) -> None:
                fn(payload)

            return call

        return {
            Kind.REPAIR: sync(self._repair),
            Kind.FAIL: sync(self._fail),
            Kind.POWERED_ON: sync(self._powered_on),
            Kind.MAINTENANCE_START: sync(self._maintenance_start),
            Kind.MAINTENANCE_END: sync(self._maintenance_end),
            Kind.DEPART: sync(self._depart),
            Kind.MIGRATION_DONE: sync(self._migration_done),
            Kind.STARTED: sync(self._started),
            Kind.LOAD: sync(lambda _: self._load_change()),
            Kind.DRAIN: self._drain,
            Kind.RESTART: self._restart,
            Kind.ARRIVE: self._arrive,
            Kind.BALANCE: lambda _: self._balance(),
            Kind.HA_CHECK: sync(lambda _: self._ha_check()),
            Kind.SAMPLE: sync(lambda _: self._sample()),
        }

    def _repair(self, host_id: str) -> None:
        self._down.discard(host_id)
        self._changed(host_id)

    def _powered_on(self, host_id: str) -> None:
        self._booting.discard(host_id)
        self._off.discard(host_id)
        self._changed(host_id)

    def _maintenance_start(self, host_id: str) -> None:
        self._maintenance[host_id] += 1
        self._changed(host_id)
        self._push(self.clock, Kind.DRAIN, host_id)

    def _maintenance_end(self, host_id: str) -> None:
        self._maintenance[host_id] -= 1
        self._changed(host_id)

    def _sample(self) -> None:
        if self.sampler is None:
            return
        table = self.current_table()
        alive = tuple(h for h in table.ids if h not in self._down) if self._down else tuple(table.ids)
        began = time.perf_counter()
        self.sampler(Snapshot(self.clock, table, Counter(self._demand), alive, frozenset(self._off)))
        self.sampling_s += time.perf_counter() - began

    async def decide(self, request: ScheduleRequest, now: float) -> Outcome:
        """The decision for one request on the cluster as it is, with what is pending (VMs
        starting, migrations in flight); a seam for tests and for deciding elsewhere."""
        return await decide(self.current_table(), self.policy, request, now, self.pending())

    async def _arrive(self, arrival: VmArrival) -> None:
        self.counts.arrivals += 1
        if not await self._run(arrival):
            return
        self.counts.placed += 1
        if arrival.lifetime_s is not None:
            self._push(self.clock + arrival.lifetime_s, Kind.DEPART, arrival.vm_id)

    async def _restart(self, arrival: VmArrival) -> None:
        """An HA VM whose host failed is started again elsewhere, as the engine restarts HA VMs
        (what the HA-reservation check predicts will or will not work)."""
        if await self._run(arrival, restart=True):
            self.counts.ha_restarted += 1
        else:
            self.counts.ha_vms_lost += 1

    async def _run(self, arrival: VmArrival, *, restart: bool = False) -> bool:
        """Ask for a host for `arrival` and start it there (after the start delay); False when
        nothing took it (the failure is recorded)."""
        vm = self.vm_spec(arrival)
        self._requests += 1
        request = ScheduleRequest(request_id=uuid.UUID(int=self._requests), cluster_id=CLUSTER_ID, vm=vm)
        outcome = await self.decide(request, self.origin + self.clock)
        if isinstance(outcome, Placed):
            host_id = outcome.placements[0].host_id
            self.counts.placements[arrival.vm_id] = host_id
            self._base_load[arrival.vm_id] = arrival.cpu_usage_pct
            self._arrivals[arrival.vm_id] = arrival
            delay = self.workload.start_delay_s
            if delay > 0:
                pending = pending_entry(
                    vm,
                    host_id,
                    request_id=request.request_id,
                    fencing_token=0,
                    expires_at=self.origin + self.clock + delay + 3600.0,
                )
                self._starting[arrival.vm_id] = Starting(arrival, host_id, pending)
                self._push(self.clock + delay, Kind.STARTED, arrival.vm_id)
            else:
                self._start(arrival, host_id)
            return True
        summary = outcome.explanation.summary if isinstance(outcome, Unplaceable) else "waiting for pending"
        filters: Iterable[str] = ()
        if isinstance(outcome, Unplaceable):
            filters = sorted({f.filter for f in outcome.explanation.filtered})
            if outcome.explanation.candidates == 0:
                filters = ("no candidates",)
        if restart:
            summary = f"restarting HA VM {arrival.vm_id} after its host failed: {summary}"
        self.counts.failures.append(Failure(self.clock, arrival.vm_id, summary, tuple(filters), restart))
        return False

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
        )
        self._vms[host_id][arrival.vm_id] = report
        self._where[arrival.vm_id] = host_id
        self._demand[_size(report)] += 1
        self._changed(host_id, load=True)

    def _started(self, vm_id: str) -> None:
        starting = self._starting.pop(vm_id, None)
        if starting is None:  # it left before it started
            return
        if starting.host_id in self._down or starting.host_id in self._off:
            self.counts.starts_lost += 1
            return
        self._start(starting.arrival, starting.host_id)

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

    def _depart(self, vm_id: str) -> None:
        if self._starting.pop(vm_id, None) is not None or self._remove(vm_id) is not None:
            self.counts.departures += 1  # else not placed, lost or gone already: nothing to do

    def _fail(self, host_id: str) -> None:
        if host_id in self._down:
            return
        self.counts.host_failures += 1
        self._down.add(host_id)
        for vm_id in [v for v, s in self._starting.items() if s.host_id == host_id]:
            del self._starting[vm_id]
            self.counts.starts_lost += 1
        for vm_id in sorted(self._vms[host_id]):
            report = self._remove(vm_id)
            assert report is not None
            self.counts.vms_lost += 1
            if report.ha:
                self._push(self.clock, Kind.RESTART, self._arrivals[vm_id])
        self._changed(host_id, load=True)

    # ---------------------------------------------------------------------------- balancing
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

    def resting(self) -> set[str]:
        for vm_id in [v for v, until in self._rest_until.items() if until <= self.clock]:
            del self._rest_until[vm_id]
        return set(self._rest_until)

    async def _balance(self) -> None:
        """One balancing pass, as the balancer service runs it for one cluster."""
        unit = self._unit
        assert unit is not None
        self.counts.balance_passes += 1
        for attempt in range(self.workload.migrations_per_cycle):
            table = self.decision_table()
            movable = movable_vms(self.vm_reports(), set(self._in_flight), self.resting())
            pick = balance_pass(unit, self._props, table, movable)
            if attempt == 0:
                self.counts.power_advice += len(pick.power)
                for change in pick.power:
                    self._power(change)
            if pick.migration is None or pick.vm is None:
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

    def _power(self, change: PowerChange) -> None:
        """Carry out one piece of power advice (with `power_actions`): off only for an empty Up
        host, on only for a host powered off (a failed host is not the balancer's to boot)."""
        if not self.workload.power_actions:
            return
        host = change.host_id
        if change.action == POWER_OFF:
            if self.host_status(host) is HostStatus.UP and not self._vms[host] and not self._pending_on(host):
                self._off.add(host)
                self.counts.power_offs += 1
                self._changed(host)
        elif change.action == POWER_ON and host in self._off and host not in self._booting:
            self._booting.add(host)
            self.counts.power_ons += 1
            self._push(self.clock + self.workload.power_on_delay_s, Kind.POWERED_ON, host)

    def _pending_on(self, host: str) -> bool:
        return any(p.host_id == host for p in self.pending())

    async def _drain(self, host: str) -> None:
        """Migrate the VMs off a host in maintenance (each to where `place` says); what stays is
        tried again a balancing interval later, while the host is still in maintenance."""
        if self._maintenance[host] <= 0 or host in self._down:
            return
        left = 0
        for vm_id in sorted(self._vms[host]):
            if vm_id in self._in_flight:
                continue
            report = self._vms[host][vm_id]
            self._requests += 1
            request = migration_request(uuid.UUID(int=self._requests), CLUSTER_ID, report, host, None)
            outcome = await self.decide(request, self.origin + self.clock)
            if not isinstance(outcome, Placed):
                self.counts.drain_unplaced += 1
                left += 1
                continue
            self._migrate(request, host, outcome.placements[0].host_id, drain=True)
        if left:
            self._push(self.clock + self.workload.balance_interval_s, Kind.DRAIN, host)

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
                self._demand[_size(report)] -= 1
                if not self._demand[_size(report)]:
                    del self._demand[_size(report)]
                scaled = report.model_copy(update={"cpu_usage_pct": self._load_of(vm_id)})
                vms[vm_id] = scaled
                self._demand[_size(scaled)] += 1
            self._changed(host, load=True)

    def _ha_check(self) -> None:
        """The HA monitor's check on the cluster as it is now (pending included)."""
        self.current_table()
        states = [self._states[h] for h in self._base]
        result = ha.check(
            states,
            self.vm_reports(),
            self.pending(),
            count_threads_as_cores=self.settings.count_threads_as_cores,
        )
        c = self.counts
        c.ha_checks += 1
        if result.failing_hosts:
            c.ha_checks_failed += 1
            c.ha_failing_hosts_max = max(c.ha_failing_hosts_max, len(result.failing_hosts))
            if not self._ha_failing:
                c.ha_alerts += 1
        elif self._ha_failing:
            c.ha_recoveries += 1
        self._ha_failing = result.failing_hosts

    def ha_failing(self) -> list[str] | None:
        """The hosts the last HA check named (None before the first check)."""
        return self._ha_failing

    def _migrate(self, request: ScheduleRequest, source: str, target: str, *, drain: bool = False) -> None:
        vm = request.vm
        cost = vm_cost(vm)
        delay = self.workload.migration_delay_s
        if not drain:  # draining is the operator's move, not the balancer's: no cool-down, no return
            left = self._left.get(vm.vm_id, {})
            if target in left:
                self.counts.returns += 1
                if self.clock - left[target] < self.workload.migration_cooldown_s:
                    self.counts.ping_pongs += 1
            self._rest_until[vm.vm_id] = self.clock + self.workload.migration_cooldown_s
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


def _size(vm: VmReport) -> tuple[float, float, float]:
    """What the VM takes, as the packing bound counts it: its CPU load in quarters of a CPU, so
    the VMs of a flavour fall into a few sizes (the bound packs equal sizes at once)."""
    cost = vm_cost(vm)
    return float(cost.mem_mb), float(cost.vcpus), LOAD_STEP * round(vm.cpu_usage_pct * vm.vcpus / LOAD_STEP)


@dataclass(frozen=True)
class Timing:
    #: Wall seconds of the whole run, and of it in the sampler (measuring, not simulating).
    wall_s: float
    sampling_s: float
    #: Simulated seconds.
    sim_s: float


async def simulate(workload: Workload, policy: Policy, sampler: Sampler | None = None) -> tuple[Counts, Timing]:
    """Replay `workload` under `policy`; the counts, and how long it took (wall) and spanned (simulated)."""
    sim = Simulation(workload, policy, sampler)
    # The workload, the hosts' reports and the first table live as long as the run: kept out of
    # the collector's passes, which would walk them again and again (a tenth of a 10,000-host run).
    gc.freeze()
    began = time.perf_counter()
    try:
        counts = await sim.run()
    finally:
        gc.unfreeze()
    return counts, Timing(time.perf_counter() - began, sim.sampling_s, sim.clock)


__all__ = [
    "CLUSTER_ID",
    "Counts",
    "Failure",
    "Flight",
    "Kind",
    "Sampler",
    "Simulation",
    "Snapshot",
    "Starting",
    "Timing",
    "decide",
    "effective_policy",
    "host_report",
    "simulate",
]
