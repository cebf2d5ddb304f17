"""oVirt's power saving balance unit (PowerSavingBalancePolicyUnit): pack VMs onto fewer hosts, and
the advice to power hosts on or off.

The load model and the thresholds' meaning are balance_load's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.properties import HOSTS_IN_RESERVE_PROPERTY, POWER_MANAGEMENT_PROPERTY
from vmsched.scheduling.units.balance_load import (
    DEFAULT_DURATION_MIN,
    DEFAULT_HIGH,
    DEFAULT_LOW,
    cpu_reason,
    destination_mask,
    effective_load,
    mem_limit,
    memory_reason,
    memory_sources,
    minutes,
    order_by,
    over_utilized,
    sustained_for,
)
from vmsched.scheduling.units.balance_search import Fit, MovableVms, find_migration
from vmsched.scheduling.units.base import BalanceOutcome, Migration, PowerChange, Props, prop_bool, prop_int
from vmsched.scheduling.units.helpers import fmt_num, max_scheduling_memory_mb

POWER_ON: Final = "power_on"
POWER_OFF: Final = "power_off"


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
    high = float(prop_int(props, "HighUtilization", DEFAULT_HIGH))
    low = float(prop_int(props, "LowUtilization", DEFAULT_LOW))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", DEFAULT_DURATION_MIN)
    # oVirt treats a missing MaxFree as 0 and a missing MinFree as "no limit": with only
    # MinFreeMemoryForUnderUtilized set, under-used hosts are still emptied.
    max_free = mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = mem_limit(props, "MinFreeMemoryForUnderUtilized", math.inf)
    load = effective_load(hosts)
    fit = Fit(hosts, high, max_free, load)
    dest_ok = destination_mask(hosts)
    by_host = MovableVms(vms)

    over, over_for = over_utilized(hosts, high, duration_s)
    migration = find_migration(
        hosts,
        by_host,
        order_by(over, load, descending=True),
        dest_ok & ~over,
        fit,
        cpu_reason(hosts, high, over_for),
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
            f" for {minutes(float(under_for[i]))}: evacuating it"
        )

    # Prefer hosts in the healthy band; fall back to packing onto busier under-utilized hosts.
    healthy = fit.among(dest_ok & ~over & ~under & occupied & (load >= low))
    for s in order_by(under, load, descending=False):
        for dest in (healthy, fit.among(dest_ok & ~over & occupied & (load >= load[s]))):
            found = find_migration(hosts, by_host, [s], dest, fit, under_reason)
            if found is not None:
                return found

    sched = max_scheduling_memory_mb(hosts)
    tight_sources = memory_sources(hosts, max_free, 2)
    sources = tight_sources + order_by(hosts.up & (sched > min_free) & (hosts.vm_count >= 1), sched, True)
    tight = memory_reason(hosts, max_free)

    def mem_reason(i: int) -> str:
        if i in tight_sources:
            return tight(i)
        return (
            f"host {hosts.ids[i]} free scheduling memory {fmt_num(round(float(sched[i])))} MB"
            f" > MinFreeMemoryForUnderUtilized {fmt_num(min_free)} MB: evacuating it"
        )

    return find_migration(hosts, by_host, sources, dest_ok & (sched > max_free), fit, mem_reason)


def _power_advice(hosts: HostTable, props: Props, migration: Migration | None) -> tuple[PowerChange, ...]:
    if not prop_bool(props, POWER_MANAGEMENT_PROPERTY, False):
        return ()
    reserve = prop_int(props, HOSTS_IN_RESERVE_PROPERTY, 0)
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


__all__ = ["POWER_OFF", "POWER_ON", "power_saving_balance"]
