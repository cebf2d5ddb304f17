"""oVirt's even VM count balance unit (OptimalForEvenGuestDistribution): spread the number of VMs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.properties import HIGH_VM_COUNT_PROPERTY, MIGRATION_THRESHOLD_PROPERTY
from vmsched.scheduling.units.balance_load import by_hunger, destination_mask
from vmsched.scheduling.units.balance_search import MovableVms
from vmsched.scheduling.units.base import BalanceOutcome, Migration, Props, prop_int
from vmsched.scheduling.units.helpers import fmt_num


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
    high = prop_int(props, HIGH_VM_COUNT_PROPERTY, 10)
    threshold = prop_int(props, MIGRATION_THRESHOLD_PROPERTY, 5)
    slots = occupied_slots(hosts, props)
    up = np.flatnonzero(hosts.up)
    if len(up) == 0:
        return BalanceOutcome()
    worst = int(up[int(np.argmax(slots[up]))])  # argmax: the first of the maxima, as oVirt's strict ">"
    worst_slots = float(slots[worst])
    if worst_slots <= high:
        return BalanceOutcome()
    targets = destination_mask(hosts) & (worst_slots - slots >= threshold)
    movable = by_hunger(MovableVms(vms).on(hosts.ids[worst]))
    if not targets.any() or not movable:
        return BalanceOutcome()
    reason = (
        f"host {hosts.ids[worst]} has {fmt_num(worst_slots)} VM slots > HighVmCount {high};"
        f" targets have at least MigrationThreshold {threshold} fewer (<= {fmt_num(worst_slots - threshold)})"
    )
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[worst], candidates, reason))


__all__ = ["even_vm_count_balance", "occupied_slots"]
