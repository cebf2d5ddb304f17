"""Power: the balance unit's power advice carried out (with `power_actions`; a host powered off is
down, one powered on comes up `power_on_delay_s` later), and the power model the report's energy
uses: each host draws its idle watts plus (maximum - idle) x its CPU utilisation, nothing when off
or failed. A host's watts come from the workload (`idle_watts`, `max_watts`) or, when it gives
none, from its size (`default_watts`)."""

from __future__ import annotations

from collections.abc import Mapping

from vmsched.contracts import HostStatus
from vmsched.scheduling.units.balance import POWER_OFF, POWER_ON
from vmsched.scheduling.units.base import PowerChange
from vmsched.simulation.events import Kind
from vmsched.simulation.state import ClusterState
from vmsched.simulation.workload import HostSpec, Workload

#: The default power model: a two-socket server idles at about 80 W plus 2.2 W a core and draws
#: about 100 W plus 10 W a core at full load (32 cores: 150 / 420 W; 64 cores: 221 / 740 W).
IDLE_BASE_W, IDLE_PER_CORE_W = 80.0, 2.2
MAX_BASE_W, MAX_PER_CORE_W = 100.0, 10.0


def default_watts(cpu_cores: int) -> tuple[float, float]:
    """(idle, maximum) watts of a host of `cpu_cores` cores when the workload gives none."""
    return IDLE_BASE_W + IDLE_PER_CORE_W * cpu_cores, MAX_BASE_W + MAX_PER_CORE_W * cpu_cores


def host_watts(spec: HostSpec) -> tuple[float, float]:
    """(idle, maximum) watts of the hosts of `spec`: the workload's, else by size; the maximum
    never below idle."""
    idle, peak = default_watts(spec.cpu_cores)
    idle = spec.idle_watts if spec.idle_watts is not None else idle
    peak = spec.max_watts if spec.max_watts is not None else peak
    return idle, max(idle, peak)


def power_model(workload: Workload) -> dict[str, tuple[float, float]]:
    """Every host's (idle, maximum) watts."""
    return {h: host_watts(spec) for spec in workload.hosts for h in spec.ids()}


def watts(idle: float, peak: float, cpu_pct: float) -> float:
    """A host's draw at `cpu_pct` % CPU (capped at 100: a host cannot work harder than all its CPUs)."""
    return idle + (peak - idle) * min(100.0, max(0.0, cpu_pct)) / 100.0


PowerModel = Mapping[str, tuple[float, float]]


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


__all__ = ["PowerActions", "PowerModel", "default_watts", "host_watts", "power_model", "watts"]
