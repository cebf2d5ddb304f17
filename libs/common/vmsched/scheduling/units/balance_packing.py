"""The `tight_packing` policy's balance (OptimalForPacking's, vmsched's own): power saving's
migrations (relieve hosts over HighUtilization, evacuate hosts under LowUtilization onto busier
ones), then a consolidation that empties the host a first-fit-decreasing packing would not need,
with size-aware power advice: the smallest empty host is powered off first, the largest host that
is not Up powered on first, so the hosts kept on are the ones the weight would open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.properties import HOSTS_IN_RESERVE_PROPERTY, POWER_MANAGEMENT_PROPERTY
from vmsched.scheduling.units.balance_load import destination_mask, effective_load, order_by
from vmsched.scheduling.units.balance_power import POWER_OFF, POWER_ON, power_saving_balance
from vmsched.scheduling.units.balance_search import Fit, MovableVms, find_migration
from vmsched.scheduling.units.base import BalanceOutcome, Migration, PowerChange, Props, prop_bool, prop_int
from vmsched.scheduling.units.helpers import fmt_num, max_scheduling_memory_mb

#: CPU points under HighUtilization a consolidation leaves on the hosts it fills.
CONSOLIDATION_MARGIN: Final = 5.0


def packing_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """Power saving's migration, else a consolidation; power advice by host size (see the module doc)."""
    migration = power_saving_balance(hosts, vms, props).migration
    if migration is None:
        migration = _consolidation(hosts, vms, props)
    return BalanceOutcome(migration, _power_advice_by_size(hosts, props, migration))


def _consolidation(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> Migration | None:
    """Empty the host in use that holds least (CPU and memory, as shares of the largest host's)
    when the other hosts in use have room for all it holds within HighUtilization less
    CONSOLIDATION_MARGIN: one of its VMs to one of them. Power saving evacuates a host only below
    LowUtilization, so when the load curve falls in the evening hosts stay half full; this frees
    the one a first-fit-decreasing packing would not need. The margin keeps a host just filled
    from going over HighUtilization (and being relieved) at the next rise of the load."""
    cpus = hosts.effective_cpus
    used = destination_mask(hosts) & ((hosts.vm_count + hosts.pending_vm_count) > 0) & (cpus > 0)
    if int(np.count_nonzero(used)) < 2:
        return None
    target = float(prop_int(props, "HighUtilization", 80)) - CONSOLIDATION_MARGIN
    load = effective_load(hosts)
    sched = np.maximum(max_scheduling_memory_mb(hosts), 0.0)
    cpu_use = load * cpus
    mem_use = hosts.mem_committed_mb + hosts.pending_mem_mb
    held = cpu_use / max(float(cpu_use.max()), 1e-9) + mem_use / max(float(mem_use.max()), 1e-9)
    s = order_by(used, held, descending=False)[0]
    others = used.copy()
    others[s] = False
    cpu_room = float((np.maximum(target - load, 0.0) * cpus)[others].sum())
    if cpu_room < cpu_use[s] or float(sched[others].sum()) < mem_use[s]:
        return None

    def reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} (CPU {fmt_num(round(float(load[i]), 1))}%, {fmt_num(round(float(mem_use[i])))} MB)"
            f" fits on the other {int(np.count_nonzero(others))} hosts in use within {fmt_num(target)}%: emptying it"
        )

    return find_migration(hosts, MovableVms(vms), [s], others, Fit(hosts, target, 0.0, load), reason)


def _power_advice_by_size(hosts: HostTable, props: Props, migration: Migration | None) -> tuple[PowerChange, ...]:
    """power_saving's advice (at most one change; HostsInReserve empty Up hosts kept), taking the
    smallest empty host off first and the largest host that is not Up on first (table order among
    equals)."""
    if not prop_bool(props, POWER_MANAGEMENT_PROPERTY, False):
        return ()
    reserve = prop_int(props, HOSTS_IN_RESERVE_PROPERTY, 0)
    empty_mask = hosts.up & (hosts.vm_count == 0) & (hosts.pending_vm_count == 0)
    empty_mask &= np.fromiter((not ids for ids in hosts.vm_ids), dtype=np.bool_, count=len(hosts))
    empty = np.flatnonzero(empty_mask)
    size = hosts.effective_cpus + hosts.physical_mem_mb / 1024.0
    if len(empty) > reserve:
        only = migration.candidates[0] if migration is not None and len(migration.candidates) == 1 else None
        for i in (int(j) for j in empty[np.argsort(size[empty], kind="stable")]):
            if not hosts.is_spm[i] and hosts.ids[i] != only:
                why = (
                    f"{len(empty)} empty Up hosts > HostsInReserve {reserve}: host {hosts.ids[i]} runs no VM"
                    " (the smallest empty host)"
                )
                return (PowerChange(hosts.ids[i], POWER_OFF, why),)
        return ()
    if len(empty) < reserve:
        down = np.flatnonzero(~hosts.up)
        if len(down):
            i = int(down[np.argsort(-size[down], kind="stable")][0])
            why = (
                f"{len(empty)} empty Up hosts < HostsInReserve {reserve}: host {hosts.ids[i]} is not Up"
                " (the largest such host)"
            )
            return (PowerChange(hosts.ids[i], POWER_ON, why),)
    return ()


__all__ = ["CONSOLIDATION_MARGIN", "packing_balance"]
