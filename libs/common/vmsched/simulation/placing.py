"""Placing VMs: each arrival is placed by `place`, the one decision function the selector runs. A
placed VM is pending on its host (as the selector's pending record holds it) for `start_delay_s`,
then runs; with no delay it runs at once. VMs leave when they depart or their host fails; an HA VM
whose host failed is asked for again, as the engine restarts HA VMs."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from vmsched.contracts import ScheduleRequest
from vmsched.scheduling.placement import Placed, Unplaceable, pending_entry
from vmsched.simulation.events import Kind
from vmsched.simulation.records import Failure, Starting
from vmsched.simulation.state import CLUSTER_ID, ClusterState
from vmsched.simulation.workload import VmArrival


class Placing(ClusterState):
    """Arrivals, starts, departures, host failures and repairs, and HA VMs' restarts."""

    async def _arrive(self, arrival: VmArrival) -> None:
        self.counts.arrivals += 1
        if not await self._run(arrival):
            return
        self.counts.placed += 1
        if arrival.lifetime_s is not None:
            self._push(self.clock + arrival.lifetime_s, Kind.DEPART, arrival.vm_id)

    async def _restart(self, arrival: VmArrival) -> None:
        """An HA VM whose host failed is started again elsewhere, as the engine restarts HA VMs
        (what the HA-reservation check predicts will or will not work)."""
        if await self._run(arrival, restart=True):
            self.counts.ha_restarted += 1
        else:
            self.counts.ha_vms_lost += 1

    async def _run(self, arrival: VmArrival, *, restart: bool = False) -> bool:
        """Ask for a host for `arrival` and start it there (after the start delay); False when
        nothing took it (the failure is recorded)."""
        vm = self.vm_spec(arrival)
        self._requests += 1
        request = ScheduleRequest(request_id=uuid.UUID(int=self._requests), cluster_id=CLUSTER_ID, vm=vm)
        outcome = await self.decide(request, self.origin + self.clock)
        if isinstance(outcome, Placed):
            host_id = outcome.placements[0].host_id
            self.counts.placements[arrival.vm_id] = host_id
            self._base_load[arrival.vm_id] = arrival.cpu_usage_pct
            self._arrivals[arrival.vm_id] = arrival
            delay = self.workload.start_delay_s
            if delay > 0:
                pending = pending_entry(
                    vm,
                    host_id,
                    request_id=request.request_id,
                    fencing_token=0,
                    expires_at=self.origin + self.clock + delay + 3600.0,
                )
                self._starting[arrival.vm_id] = Starting(arrival, host_id, pending)
                self._push(self.clock + delay, Kind.STARTED, arrival.vm_id)
            else:
                self._start(arrival, host_id)
            return True
        summary = outcome.explanation.summary if isinstance(outcome, Unplaceable) else "waiting for pending"
        filters: Iterable[str] = ()
        if isinstance(outcome, Unplaceable):
            filters = sorted({f.filter for f in outcome.explanation.filtered})
            if outcome.explanation.candidates == 0:
                filters = ("no candidates",)
        if restart:
            summary = f"restarting HA VM {arrival.vm_id} after its host failed: {summary}"
        self.counts.failures.append(Failure(self.clock, arrival.vm_id, summary, tuple(filters), restart))
        return False

    def _started(self, vm_id: str) -> None:
        starting = self._starting.pop(vm_id, None)
        if starting is None:  # it left before it started
            return
        if starting.host_id in self._down or starting.host_id in self._off:
            self.counts.starts_lost += 1
            return
        self._start(starting.arrival, starting.host_id)

    def _depart(self, vm_id: str) -> None:
        if self._starting.pop(vm_id, None) is not None or self._remove(vm_id) is not None:
            self.counts.departures += 1  # else not placed, lost or gone already: nothing to do

    def _fail(self, host_id: str) -> None:
        if host_id in self._down:
            return
        self.counts.host_failures += 1
        self._down.add(host_id)
        for vm_id in [v for v, s in self._starting.items() if s.host_id == host_id]:
            del self._starting[vm_id]
            self.counts.starts_lost += 1
        for vm_id in sorted(self._vms[host_id]):
            report = self._remove(vm_id)
            assert report is not None
            self.counts.vms_lost += 1
            if report.ha:
                self._push(self.clock, Kind.RESTART, self._arrivals[vm_id])
        self._changed(host_id, load=True)

    def _repair(self, host_id: str) -> None:
        self._down.discard(host_id)
        self._changed(host_id)


__all__ = ["Placing"]
