"""oVirt balance units: which VM to migrate off which host, and to which candidate hosts.

Every function here is a `BalanceFn`: pure, no I/O, no clock (time is `hosts.as_of`). The table
holds all the cluster's hosts with pending resources folded in; `vms` are only the VMs the balancer
may move (migratable, not cooling down, not in flight). A unit returns at most one migration per
call (oVirt stops after the first successful migration per cycle): the balancer schedules it through
the normal pipeline with `candidates` as the whitelist.

Only Up hosts are sources or destinations; a destination must also be enabled (a disabled host
takes no VM) and is never the source. Ties keep table order, so results are deterministic where
oVirt picks at random (EvenDistribution's source host, HaReservation's host and VM).

The units live by family: balance_even (even distribution), balance_power (power saving and its
power advice), balance_vm_count (even VM count) and balance_ha (HA reservation), over the load
model and source selection of balance_load (which describes the load model: effective load,
over-utilized hosts, CPU hunger) and the migration search of balance_search. Every public name is
importable from here too.
"""

from __future__ import annotations

from vmsched.scheduling.units.balance_even import even_distribution_balance
from vmsched.scheduling.units.balance_ha import ha_reservation_balance
from vmsched.scheduling.units.balance_load import UTILIZATION_THRESHOLD_PCT, cpu_hunger, effective_load, sustained_for
from vmsched.scheduling.units.balance_power import POWER_OFF, POWER_ON, power_saving_balance
from vmsched.scheduling.units.balance_vm_count import even_vm_count_balance, occupied_slots

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
