"""Power actions: the balance unit's power advice carried out (with `power_actions`). A host powered
off is down; one powered on comes up `power_on_delay_s` later."""

from __future__ import annotations

from vmsched.contracts import HostStatus
from vmsched.scheduling.units.balance import POWER_OFF, POWER_ON
from vmsched.scheduling.units.base import PowerChange
from vmsched.simulation.events import Kind
from vmsched.simulation.state import ClusterState


class PowerActions(ClusterState):
    """Hosts powered off and on as the balancing pass advises."""

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

    def _powered_on(self, host_id: str) -> None:
        self._booting.discard(host_id)
        self._off.discard(host_id)
        self._changed(host_id)


__all__ = ["PowerActions"]
