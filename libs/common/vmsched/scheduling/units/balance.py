"""oVirt balance units: which VM to migrate off which host, and to which candidate hosts.

Every function here is a `BalanceFn`: pure, no I/O, no clock (time is `hosts.as_of`). The table
holds all the cluster's hosts with pending resources folded in; `vms` are only the VMs the balancer
may move (migratable, not cooling down, not in flight). A unit returns at most one migration per
call (oVirt stops after the first successful migration per cycle): the balancer schedules it through
the normal pipeline with `candidates` as the whitelist.

Only Up hosts are sources or destinations; a destination must also be enabled (a disabled host
takes no VM) and is never the source. Ties keep table order, so results are deterministic where
oVirt picks at random (EvenDistribution's source host, HaReservation's host and VM).

Load model (oVirt CpuAndMemoryBalancingPolicyUnit / FindVmAndDestinations)
---------------------------------------------------------------------------
* A host's *effective load* (% of the whole host) is its CPU usage plus the SPM role's share
  (oVirt calcSpmCpuConsumption) plus VcpuConsumptionPercentage per pending vCPU spread over its CPUs.
* A host is *over-utilized* when its samples (plus the SPM share) have been >= HighUtilization since
  the first sample of the trailing run that is, for at least CpuOverCommitDurationMinutes up to
  `as_of` (oVirt cpuOverCommitTimestamp), and it runs VMs. A host without samples is never over.
* A VM's *CPU hunger* is its load in % of one CPU: cpu_usage_pct x vcpus. On a destination it adds
  hunger / the destination's CPUs (oVirt getPredictedVmCpu); the VM fits when load + that <= High and
  the destination's max scheduling memory minus the VM's need (memory + overhead) stays above
  MaxFreeMemoryForOverUtilized (0 when unset).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, IndexArray
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.scheduling.units.base import (
    BalanceOutcome,
    Migration,
    PowerChange,
    Props,
    VmsByHost,
    prop_bool,
    prop_int,
)
from vmsched.scheduling.units.helpers import VCPU_CONSUMPTION_PCT, fmt_num, max_scheduling_memory_mb, spm_load_share

#: oVirt UtilizationThresholdInPercent: even distribution's destinations are below
#: min(this % of HighUtilization, HighUtilization - VcpuConsumptionPercentage).
UTILIZATION_THRESHOLD_PCT: Final = 80.0
POWER_ON: Final = "power_on"
POWER_OFF: Final = "power_off"

_DEFAULT_HIGH = 80
_DEFAULT_LOW = 20
_DEFAULT_DURATION_MIN = 2


# ------------------------------------------------------------------------- shared helpers
def effective_load(hosts: HostTable) -> FloatArray:
    """Current load in % of the whole host: usage + SPM share + pending vCPUs' assumed load."""
    cpus = hosts.effective_cpus
    safe = np.where(cpus > 0, cpus, 1.0)
    return hosts.cpu_usage_pct + spm_load_share(hosts, cpus) + VCPU_CONSUMPTION_PCT * hosts.pending_vcpus / safe


def sustained_for(hosts: HostTable, above: float | None = None, below: float | None = None) -> FloatArray:
    """Seconds each host's effective samples (sample + SPM share) have been >= `above` (or < `below`)
    without interruption, up to `as_of` (up to the last sample when as_of is NaN). NaN when the last
    sample is not in that state or the host has no samples."""
    shares = spm_load_share(hosts, hosts.effective_cpus)
    out = np.full(len(hosts), math.nan)
    last = hosts.cpu_last_sample_pct + shares  # NaN without samples: in no state
    with np.errstate(invalid="ignore"):
        now_in = np.zeros(len(hosts), dtype=np.bool_)
        if above is not None:
            now_in |= last >= above
        if below is not None:
            now_in |= last < below
    # A host with one sample has been in the state since that sample: no walk.
    hits = np.flatnonzero(now_in)
    single = hosts.cpu_sample_count.take(hits) == 1
    one = hits[single]
    at = hosts.cpu_last_sample_at.take(one)
    out[one] = (hosts.as_of if math.isfinite(hosts.as_of) else at) - at
    share = shares.tolist()

    def state(load: float) -> bool:
        return (above is not None and load >= above) or (below is not None and load < below)

    for i in hits[~single].tolist():
        samples = hosts.cpu_samples[i]
        loads, times = samples.loads, samples.times
        j = len(loads) - 1
        while j > 0 and state(loads[j - 1] + share[i]):
            j -= 1
        end = hosts.as_of if math.isfinite(hosts.as_of) else times[-1]
        out[i] = end - times[j]
    return out


def _minutes(seconds: float) -> str:
    return f"{fmt_num(round(seconds / 60.0, 1))} min"


def cpu_hunger(vm: VmReport) -> float:
    """The VM's CPU load in % of one CPU (4 busy vCPUs = 400)."""
    return vm.cpu_usage_pct * vm.vcpus


def _by_hunger(vms: Sequence[VmReport]) -> list[VmReport]:
    return sorted(vms, key=lambda v: (cpu_hunger(v), v.vm_id))


class _VmsByHost:
    """The movable VMs of each host, in the order given.

    The first lookup scans the list: most passes look at one source host. A second lookup means the
    pass walks sources, possibly every host: the VMs are then grouped by host once, with each host's
    least CPU hunger and least guest memory, so a host none of whose VMs can fit is skipped without
    touching them (reading 200,000 VM objects host by host, in no memory order, costs more than the
    rest of the pass)."""

    __slots__ = ("_by_host", "_ends", "_looked_up", "_min_guest", "_min_hunger", "_order", "_slot", "_vms")

    def __init__(self, vms: Sequence[VmReport]) -> None:
        self._vms = vms
        self._looked_up = False
        self._slot: dict[str | None, int] | None = None
        #: The VMs as given host by host, when they are: then a lookup reads that host's only.
        self._by_host = vms if isinstance(vms, VmsByHost) else None

    def _group(self) -> dict[str | None, int]:
        slot: dict[str | None, int] = {}
        n = len(self._vms)
        host = np.fromiter((slot.setdefault(v.host_id, len(slot)) for v in self._vms), dtype=np.intp, count=n)
        hunger = np.fromiter((cpu_hunger(v) for v in self._vms), dtype=np.float64, count=n)
        guest = np.fromiter((v.mem_mb for v in self._vms), dtype=np.float64, count=n)
        self._order = np.argsort(host, kind="stable")  # stable: each host's VMs keep their order
        starts = np.searchsorted(host[self._order], np.arange(len(slot)))
        self._ends = [*starts[1:].tolist(), n]
        self._min_hunger = np.minimum.reduceat(hunger[self._order], starts) if n else np.zeros(0)
        self._min_guest = np.minimum.reduceat(guest[self._order], starts) if n else np.zeros(0)
        self._slot = slot
        return slot

    def on(self, host_id: str, dest: _Destinations | None = None) -> list[VmReport]:
        """The host's VMs; with `dest`, none when every one of them certainly fits none of `dest`."""
        if self._by_host is not None:
            found = self._by_host.on(host_id)
            if dest is not None and found:
                least = min(cpu_hunger(v) for v in found), min(float(v.mem_mb) for v in found)
                if not dest.may_fit(*least):
                    return []
            return found
        if self._slot is None and not self._looked_up:
            self._looked_up = True
            return [v for v in self._vms if v.host_id == host_id]
        slot = self._slot if self._slot is not None else self._group()
        k = slot.get(host_id)
        if k is None:
            return []
        if dest is not None and not dest.may_fit(float(self._min_hunger[k]), float(self._min_guest[k])):
            return []
        start = self._ends[k - 1] if k else 0
        return [self._vms[i] for i in self._order[start : self._ends[k]].tolist()]


def _destination_mask(hosts: HostTable) -> BoolArray:
    return hosts.up & hosts.enabled


class _Fit:
    """What a destination must leave: load <= high after the VM, scheduling memory > min_free_mb
    after it; with the table's columns it compares, computed once per pass."""

    def __init__(self, hosts: HostTable, high: float, min_free_mb: float, load: FloatArray) -> None:
        self.high, self.min_free_mb, self.load = high, min_free_mb, load
        self.cpus = hosts.effective_cpus
        self.known = self.cpus > 0
        self.sched = max_scheduling_memory_mb(hosts)

    def among(self, mask: BoolArray) -> _Destinations:
        return _Destinations(self, np.flatnonzero(mask & self.known))


class _Destinations:
    """The hosts a source's VM may go to (a destination mask, hosts with a known CPU count only: a VM
    never fits one without), with what `_Fit` compares at those hosts.

    `fits` is exact: load + hunger / CPUs <= high and scheduling memory - need > min free, on each
    host, as NumPy computes it on the whole table. Before it, two bounds rule out in O(1) a VM that
    fits no host: rounding is monotone, so no host's load + hunger / CPUs is below
    min(load) + hunger / max(CPUs), and none's memory - need above max(memory) - guest memory (a
    host's least hunger and least guest memory bound all its VMs the same way). A bound that is NaN
    rules nothing out."""

    def __init__(self, fit: _Fit, positions: IndexArray) -> None:
        self.high, self.min_free_mb = fit.high, fit.min_free_mb
        self.positions = positions
        self.load, self.cpus, self.sched = fit.load[positions], fit.cpus[positions], fit.sched[positions]
        empty = len(positions) == 0
        self.min_load = math.inf if empty else float(self.load.min())
        self.max_cpus = 1.0 if empty else float(self.cpus.max())
        self.max_sched = -math.inf if empty else float(self.sched.max())

    def may_fit(self, hunger: float, guest_mb: float) -> bool:
        """False when a VM this hungry, with this much guest memory or more, certainly fits none of
        these hosts (its need, vm_cost's memory, is the guest memory plus overhead)."""
        return not (self.min_load + hunger / self.max_cpus > self.high or self.max_sched - guest_mb <= self.min_free_mb)

    def fits(self, hunger: float, need_mb: float, source: int) -> list[int]:
        """Positions (table order) of the hosts other than `source` the VM fits."""
        ok = (self.load + hunger / self.cpus <= self.high) & (self.sched - need_mb > self.min_free_mb)
        return [p for p in self.positions[ok].tolist() if p != source]


def _find(
    hosts: HostTable,
    vms: _VmsByHost,
    sources: Sequence[int],
    destinations: BoolArray | _Destinations,
    fit: _Fit,
    reason: Callable[[int], str],
) -> Migration | None:
    """The first source (in the given order) with a movable VM that fits a destination; that
    source's least CPU-hungry such VM, with every destination it fits as the candidates."""
    if not sources:
        return None
    dest = destinations if isinstance(destinations, _Destinations) else fit.among(destinations)
    if len(dest.positions) == 0:
        return None
    for s in sources:
        # Only a VM that may fit somewhere needs sorting and the exact test.
        hopeful = [v for v in vms.on(hosts.ids[s], dest) if dest.may_fit(cpu_hunger(v), float(v.mem_mb))]
        for vm in _by_hunger(hopeful):
            fits = dest.fits(cpu_hunger(vm), float(vm_cost(vm).mem_mb), s)
            if fits:
                return Migration(vm.vm_id, hosts.ids[s], tuple(hosts.ids[i] for i in fits), reason(s))
    return None


def _order(indices: BoolArray, key: FloatArray, descending: bool) -> list[int]:
    """Positions where `indices` holds, sorted by key (stable: ties keep table order)."""
    pos = np.flatnonzero(indices)
    k = -key[pos] if descending else key[pos]
    return [int(p) for p in pos[np.argsort(k, kind="stable")]]


def _mem_limit(props: Props, name: str, unset: float) -> float:
    """A memory threshold in MB; `unset` when the property is missing or empty."""
    value = props.get(name)
    return unset if value in (None, "") else float(value)


def _over_utilized(hosts: HostTable, high: float, duration_s: float) -> tuple[BoolArray, FloatArray]:
    over_for = sustained_for(hosts, above=high)
    with np.errstate(invalid="ignore"):
        over = hosts.up & (hosts.vm_count > 0) & (over_for >= duration_s)
    return over, over_for


def _cpu_reason(hosts: HostTable, high: float, over_for: FloatArray) -> Callable[[int], str]:
    def reason(i: int) -> str:
        samples = hosts.cpu_samples[i]
        last = samples[-1][1] + float(spm_load_share(hosts, hosts.effective_cpus)[i])
        return (
            f"host {hosts.ids[i]} CPU {fmt_num(round(last, 1))}% >= HighUtilization {fmt_num(high)}%"
            f" for {_minutes(float(over_for[i]))}"
        )

    return reason


def _memory_sources(hosts: HostTable, max_free: float, min_vms: int) -> list[int]:
    """Up hosts with less max scheduling memory than `max_free` and more than `min_vms` - 1 VMs,
    the tightest first (oVirt getHostsWithLessFreeMemory: more than one VM).

    oVirt's max scheduling memory is never below 0, so with MaxFreeMemoryForOverUtilized unset
    (0) no host is short of memory, even an overcommitted one; the clamp keeps that."""
    sched = max_scheduling_memory_mb(hosts)
    short = np.maximum(sched, 0.0) < max_free
    return _order(hosts.up & short & (hosts.vm_count >= min_vms), sched, descending=False)


def _memory_reason(hosts: HostTable, max_free: float) -> Callable[[int], str]:
    sched = max_scheduling_memory_mb(hosts)

    def reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} free scheduling memory {fmt_num(round(float(sched[i])))} MB"
            f" < MaxFreeMemoryForOverUtilized {fmt_num(max_free)} MB"
        )

    return reason


# ------------------------------------------------------------------------- even distribution
def even_distribution_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """oVirt EvenDistributionBalancePolicyUnit (CPU first, then memory).

    CPU: sources are over-utilized hosts (see the module doc), busiest (effective load) first;
    destinations are hosts whose effective load is below min(80% x High, High - 10). The VM is the
    first source's least CPU-hungry movable VM that fits a destination without pushing it over High;
    the candidates are the destinations it fits.

    Memory: sources have less max scheduling memory than MaxFreeMemoryForOverUtilized and run more
    than one VM (tightest first); destinations have more than MinFreeMemoryForUnderUtilized. Tried
    when the CPU pass finds no migration. As in oVirt, each threshold is 0 when unset, so without
    MaxFreeMemoryForOverUtilized no host is a memory source.
    """
    if int(np.count_nonzero(hosts.up)) < 2:
        return BalanceOutcome()
    high = float(prop_int(props, "HighUtilization", _DEFAULT_HIGH))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", _DEFAULT_DURATION_MIN)
    max_free = _mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = _mem_limit(props, "MinFreeMemoryForUnderUtilized", 0.0)
    load = effective_load(hosts)
    fit = _Fit(hosts, high, max_free, load)
    dest_ok = _destination_mask(hosts)
    by_host = _VmsByHost(vms)

    over, over_for = _over_utilized(hosts, high, duration_s)
    low = min(UTILIZATION_THRESHOLD_PCT * high / 100.0, high - VCPU_CONSUMPTION_PCT)
    migration = _find(
        hosts,
        by_host,
        _order(over, load, descending=True),
        dest_ok & (load < low),
        fit,
        _cpu_reason(hosts, high, over_for),
    )
    if migration is None:
        sched = max_scheduling_memory_mb(hosts)
        migration = _find(
            hosts,
            by_host,
            _memory_sources(hosts, max_free, 2),
            dest_ok & (sched > min_free),
            fit,
            _memory_reason(hosts, max_free),
        )
    return BalanceOutcome(migration)


# ------------------------------------------------------------------------- power saving
def power_saving_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """oVirt PowerSavingBalancePolicyUnit.

    Migration, first that applies:
    1. relieve an over-utilized host (as even distribution, busiest first) onto any host that is not
       over-utilized and stays <= High;
    2. evacuate an under-utilized host: one whose samples have been < LowUtilization for at least
       CpuOverCommitDurationMinutes and that runs VMs, the least loaded first. Its least CPU-hungry
       VM that fits goes to hosts that run VMs, are neither over- nor under-utilized (load >= Low)
       and stay <= High; when none fits, to other hosts that run VMs, are not over-utilized and are
       at least as loaded as the source (so VMs are packed, never spread onto empty hosts);
    3. memory: hosts with less max scheduling memory than MaxFreeMemoryForOverUtilized (more than
       one VM), then hosts with more than MinFreeMemoryForUnderUtilized (at least one VM), onto
       hosts with more than MaxFreeMemoryForOverUtilized. As in oVirt, an unset
       MaxFreeMemoryForOverUtilized is 0 (no host is short of memory; any host with memory left is
       a destination) and an unset MinFreeMemoryForUnderUtilized is infinite (no host is evacuated
       for having too much), so either threshold alone drives its half.

    Power advice (EnableAutomaticHostPowerManagement=true), at most one per cycle as in oVirt's
    evaluatePowerManagementSituation. An *empty* host is Up with no VM running or pending:
    * more empty hosts than HostsInReserve: power_off the first empty host (table order) that is not
      the SPM and is not the only candidate of this cycle's migration;
    * fewer empty hosts than HostsInReserve: power_on the first host that is not Up.
    vmsched has no "maintenance, PM-controlled" host state, so oVirt's intermediate
    Up -> Maintenance -> Down steps are one power_off, and Maintenance -> Up / Down -> Up one power_on.
    """
    migration = _power_saving_migration(hosts, vms, props)
    return BalanceOutcome(migration, _power_advice(hosts, props, migration))


def _power_saving_migration(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> Migration | None:
    if int(np.count_nonzero(hosts.up)) < 2:
        return None
    high = float(prop_int(props, "HighUtilization", _DEFAULT_HIGH))
    low = float(prop_int(props, "LowUtilization", _DEFAULT_LOW))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", _DEFAULT_DURATION_MIN)
    # oVirt treats a missing MaxFree as 0 and a missing MinFree as "no limit": with only
    # MinFreeMemoryForUnderUtilized set, under-used hosts are still emptied.
    max_free = _mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = _mem_limit(props, "MinFreeMemoryForUnderUtilized", math.inf)
    load = effective_load(hosts)
    fit = _Fit(hosts, high, max_free, load)
    dest_ok = _destination_mask(hosts)
    by_host = _VmsByHost(vms)

    over, over_for = _over_utilized(hosts, high, duration_s)
    migration = _find(
        hosts,
        by_host,
        _order(over, load, descending=True),
        dest_ok & ~over,
        fit,
        _cpu_reason(hosts, high, over_for),
    )
    if migration is not None:
        return migration

    under_for = sustained_for(hosts, below=low)
    with np.errstate(invalid="ignore"):
        under = hosts.up & (hosts.vm_count > 0) & (under_for >= duration_s)
    occupied = (hosts.vm_count + hosts.pending_vm_count) > 0

    def under_reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} CPU {fmt_num(round(float(load[i]), 1))}% < LowUtilization {fmt_num(low)}%"
            f" for {_minutes(float(under_for[i]))}: evacuating it"
        )

    # Prefer hosts in the healthy band; fall back to packing onto busier under-utilized hosts.
    healthy = fit.among(dest_ok & ~over & ~under & occupied & (load >= low))
    for s in _order(under, load, descending=False):
        for dest in (healthy, fit.among(dest_ok & ~over & occupied & (load >= load[s]))):
            found = _find(hosts, by_host, [s], dest, fit, under_reason)
            if found is not None:
                return found

    sched = max_scheduling_memory_mb(hosts)
    tight_sources = _memory_sources(hosts, max_free, 2)
    sources = tight_sources + _order(hosts.up & (sched > min_free) & (hosts.vm_count >= 1), sched, True)
    tight = _memory_reason(hosts, max_free)

    def mem_reason(i: int) -> str:
        if i in tight_sources:
            return tight(i)
        return (
            f"host {hosts.ids[i]} free scheduling memory {fmt_num(round(float(sched[i])))} MB"
            f" > MinFreeMemoryForUnderUtilized {fmt_num(min_free)} MB: evacuating it"
        )

    return _find(hosts, by_host, sources, dest_ok & (sched > max_free), fit, mem_reason)


def _power_advice(hosts: HostTable, props: Props, migration: Migration | None) -> tuple[PowerChange, ...]:
    if not prop_bool(props, "EnableAutomaticHostPowerManagement", False):
        return ()
    reserve = prop_int(props, "HostsInReserve", 0)
    empty_mask = hosts.up & (hosts.vm_count == 0) & (hosts.pending_vm_count == 0)
    empty_mask &= np.fromiter((not ids for ids in hosts.vm_ids), dtype=np.bool_, count=len(hosts))
    empty = [int(i) for i in np.flatnonzero(empty_mask)]
    if len(empty) > reserve:
        # Never power off the only host a migration chosen this cycle could go to.
        only = migration.candidates[0] if migration is not None and len(migration.candidates) == 1 else None
        for i in empty:
            if not hosts.is_spm[i] and hosts.ids[i] != only:
                why = f"{len(empty)} empty Up hosts > HostsInReserve {reserve}: host {hosts.ids[i]} runs no VM"
                return (PowerChange(hosts.ids[i], POWER_OFF, why),)
        return ()
    if len(empty) < reserve:
        down = np.flatnonzero(~hosts.up)
        if len(down):
            i = int(down[0])
            why = f"{len(empty)} empty Up hosts < HostsInReserve {reserve}: host {hosts.ids[i]} is not Up"
            return (PowerChange(hosts.ids[i], POWER_ON, why),)
    return ()


# ------------------------------------------------------------------------- even VM count
def occupied_slots(hosts: HostTable, props: Props) -> FloatArray:
    """oVirt's even-VM-count getOccupiedVMSlots: running VMs (+ pending ones) + SpmVmGrace on the SPM host."""
    grace = prop_int(props, "SpmVmGrace", 5)
    return hosts.vm_count + hosts.pending_vm_count + np.where(hosts.is_spm, float(grace), 0.0)


def even_vm_count_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """oVirt's even-VM-count balancing rule (OptimalForEvenGuestDistribution), exactly: the worst
    host is the first Up host with the most occupied slots, if it has more than HighVmCount; the
    targets are the Up (enabled) hosts with at least MigrationThreshold fewer slots; the VM is the
    worst host's least CPU-hungry movable VM. No migration when there is no worst host, no target,
    or the worst host has no movable VM (oVirt does not fall back to another host)."""
    high = prop_int(props, "HighVmCount", 10)
    threshold = prop_int(props, "MigrationThreshold", 5)
    slots = occupied_slots(hosts, props)
    up = np.flatnonzero(hosts.up)
    if len(up) == 0:
        return BalanceOutcome()
    worst = int(up[int(np.argmax(slots[up]))])  # argmax: the first of the maxima, as oVirt's strict ">"
    worst_slots = float(slots[worst])
    if worst_slots <= high:
        return BalanceOutcome()
    targets = _destination_mask(hosts) & (worst_slots - slots >= threshold)
    movable = _by_hunger(_VmsByHost(vms).on(hosts.ids[worst]))
    if not targets.any() or not movable:
        return BalanceOutcome()
    reason = (
        f"host {hosts.ids[worst]} has {fmt_num(worst_slots)} VM slots > HighVmCount {high};"
        f" targets have at least MigrationThreshold {threshold} fewer (<= {fmt_num(worst_slots - threshold)})"
    )
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[worst], candidates, reason))


# ------------------------------------------------------------------------- HA reservation
def ha_reservation_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """oVirt HaReservationBalancePolicyUnit, with the threshold of oVirt's HA reservation design: for clusters with HA
    reservation on and at least two Up hosts, optimal = ceil(HA VMs on Up hosts / Up hosts); a host
    is over-utilized when its HA VM count > optimal x OverUtilization / 100 (oVirt's example: optimal 2
    at 200% moves nothing until a host has 5). The most loaded such host (first on ties) that has a
    movable HA VM gives up its least CPU-hungry one to the Up hosts below optimal.

    oVirt picks the host and the VM at random and compares the targets' count with the
    OverUtilization percentage itself; vmsched is deterministic and uses "below optimal", as the
    design intends."""
    up = hosts.up
    n_up = int(np.count_nonzero(up))
    if not prop_bool(props, HA_RESERVATION_PROPERTY, False) or n_up < 2:
        return BalanceOutcome()
    over_pct = prop_int(props, "OverUtilization", 200)
    counts = np.maximum(hosts.ha_vm_count, 0.0)
    total = float(counts[up].sum())
    optimal = math.ceil(total / n_up)
    limit = optimal * over_pct / 100.0
    targets = _destination_mask(hosts) & (counts < optimal)
    if not targets.any():
        return BalanceOutcome()
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    by_host = _VmsByHost(vms)
    for s in _order(up & (counts > limit), counts, descending=True):
        movable = _by_hunger([v for v in by_host.on(hosts.ids[s]) if v.ha])
        if movable:
            reason = (
                f"host {hosts.ids[s]} runs {fmt_num(counts[s])} HA VMs > optimal {optimal}"
                f" x OverUtilization {over_pct}% = {fmt_num(limit)}"
            )
            return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[s], candidates, reason))
    return BalanceOutcome()


__all__ = [
    "POWER_OFF",
    "POWER_ON",
    "UTILIZATION_THRESHOLD_PCT",
    "cpu_hunger",
    "effective_load",
    "even_distribution_balance",
    "even_vm_count_balance",
    "ha_reservation_balance",
    "occupied_slots",
    "power_saving_balance",
    "sustained_for",
]
