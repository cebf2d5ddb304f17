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

__all__ = ["HA_RESERVATION_PROPERTY"]
