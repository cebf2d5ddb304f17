"""Policy property names that something besides their own unit reads or sets.

A unit declares its properties in its PropertySpec map; a name that also travels outside the unit
(set from the database, read by a service, set by the simulator or the benchmark) is spelled here once,
so a renamed property cannot leave one reader behind.
"""

from __future__ import annotations

from typing import Final

#: The cluster's HA reservation switch (cluster_policy.ha_reservation) as the policy's units see it:
#: "true" or "false". The HA reservation weight and balance read it, the HA monitor obeys it, and the
#: policy repository and the simulator set it.
HA_RESERVATION_PROPERTY: Final = "HaReservation"

#: oVirt's even-VM-count rule: a host with more than HighVmCount VMs, and MigrationThreshold more than
#: the emptiest host, gives one up. Its balance unit reads them; the simulator judges the rule by them.
HIGH_VM_COUNT_PROPERTY: Final = "HighVmCount"
MIGRATION_THRESHOLD_PROPERTY: Final = "MigrationThreshold"

#: Power saving's advice switch and the Up hosts it keeps in reserve: the balance unit reads them, the
#: simulator's generated workloads and the benchmark set them.
POWER_MANAGEMENT_PROPERTY: Final = "EnableAutomaticHostPowerManagement"
HOSTS_IN_RESERVE_PROPERTY: Final = "HostsInReserve"

__all__ = [
    "HA_RESERVATION_PROPERTY",
    "HIGH_VM_COUNT_PROPERTY",
    "HOSTS_IN_RESERVE_PROPERTY",
    "MIGRATION_THRESHOLD_PROPERTY",
    "POWER_MANAGEMENT_PROPERTY",
]
