"""oVirt's HA reservation balance unit (HaReservationBalancePolicyUnit): spread the highly
available VMs so that a host's failure leaves room to restart them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.scheduling.units.balance_load import by_hunger, destination_mask, order_by
from vmsched.scheduling.units.balance_search import MovableVms
from vmsched.scheduling.units.base import BalanceOutcome, Migration, Props, prop_bool, prop_int
from vmsched.scheduling.units.helpers import fmt_num


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
    targets = destination_mask(hosts) & (counts < optimal)
    if not targets.any():
        return BalanceOutcome()
    candidates = tuple(hosts.ids[int(i)] for i in np.flatnonzero(targets))
    by_host = MovableVms(vms)
    for s in order_by(up & (counts > limit), counts, descending=True):
        movable = by_hunger([v for v in by_host.on(hosts.ids[s]) if v.ha])
        if movable:
            reason = (
                f"host {hosts.ids[s]} runs {fmt_num(counts[s])} HA VMs > optimal {optimal}"
                f" x OverUtilization {over_pct}% = {fmt_num(limit)}"
            )
            return BalanceOutcome(Migration(movable[0].vm_id, hosts.ids[s], candidates, reason))
    return BalanceOutcome()


__all__ = ["ha_reservation_balance"]
