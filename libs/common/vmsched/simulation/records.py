"""What a simulation records: its counts and failures, the snapshots it samples, its migrations in
flight and VMs starting, and how long it ran."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vmsched.contracts import PendingEntry
from vmsched.scheduling.hosts import HostTable
from vmsched.simulation.workload import VmArrival


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
    #: Balancing passes that started no migration, by why (vmsched.scheduling.units.base.IdleKind).
    idle: Counter[str] = field(default_factory=Counter)
    #: Power saving's advice (power a host on or off), and what of it was carried out.
    power_advice: int = 0
    power_offs: int = 0
    power_ons: int = 0
    #: Migrations that drained hosts going into maintenance, and drain attempts with no target.
    drain_migrations: int = 0
    drain_unplaced: int = 0
    #: Maintenance plans made (scheduling.maintenance; refused ones too).
    drain_plans: int = 0
    #: HA-reservation checks run, failed, alerts raised (a pass turned failure) and recoveries;
    #: the most hosts one check named.
    ha_checks: int = 0
    ha_checks_failed: int = 0
    ha_alerts: int = 0
    ha_recoveries: int = 0
    ha_failing_hosts_max: int = 0
    #: When each HA alert was raised (simulated s), for the plots' markers.
    ha_alert_times: list[float] = field(default_factory=list)
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
    #: Hosts whose VMs want more CPU than they have: host -> CPU % wanted (over 100; the table's
    #: load is capped at 100), for the unmet demand.
    overload: Mapping[str, float] = field(default_factory=dict)


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


@dataclass(frozen=True)
class Timing:
    #: Wall seconds of the whole run, and of it in the sampler (measuring, not simulating).
    wall_s: float
    sampling_s: float
    #: Simulated seconds.
    sim_s: float


__all__ = ["Counts", "Failure", "Flight", "Sampler", "Snapshot", "Starting", "Timing"]
