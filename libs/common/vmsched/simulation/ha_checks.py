"""The HA-reservation checks: with `ha_reservation`, the HA monitor's check (`ha.check`) runs every
`ha_interval_s` on the simulated cluster, counting failed checks, alerts (a pass turning into a
failure) and recoveries."""

from __future__ import annotations

from vmsched.scheduling import ha
from vmsched.simulation.state import ClusterState


class HaChecks(ClusterState):
    """The HA monitor's check, run on the simulated cluster."""

    def _ha_check(self) -> None:
        """The HA monitor's check on the cluster as it is now (pending included)."""
        self.current_table()
        states = [self._states[h] for h in self._base]
        result = ha.check(
            states,
            self.vm_reports(),
            self.pending(),
            count_threads_as_cores=self.settings.count_threads_as_cores,
        )
        c = self.counts
        c.ha_checks += 1
        if result.failing_hosts:
            c.ha_checks_failed += 1
            c.ha_failing_hosts_max = max(c.ha_failing_hosts_max, len(result.failing_hosts))
            if not self._ha_failing:
                c.ha_alerts += 1
                c.ha_alert_times.append(self.clock)
        elif self._ha_failing:
            c.ha_recoveries += 1
        self._ha_failing = result.failing_hosts

    def ha_failing(self) -> list[str] | None:
        """The hosts the last HA check named (None before the first check)."""
        return self._ha_failing


__all__ = ["HaChecks"]
