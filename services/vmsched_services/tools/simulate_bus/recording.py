"""The decisions of a replay, recorded in order with the wall time each took: in process, the
engine's own (`RecordingSimulation`); over the bus, its subclass's (`BusSimulation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from vmsched.contracts import RequestKind, ScheduleRequest
from vmsched.scheduling.placement import Outcome, Placed
from vmsched.scheduling.policy import Policy
from vmsched.simulation.engine import Counts, Sampler, Simulation, Timing
from vmsched.simulation.workload import Workload


@dataclass(frozen=True)
class Decided:
    """One decision of a replay: when (simulated seconds), for what, and the host chosen (None: not placed)."""

    at_s: float
    kind: RequestKind
    vm_id: str
    host_id: str | None

    def text(self) -> str:
        what = "migration of" if self.kind is RequestKind.MIGRATE else "arrival of"
        return f"{what} {self.vm_id} at {self.at_s:g} s"


class RecordingSimulation(Simulation):
    """A Simulation that keeps its decisions in order (arrivals and balancing migrations) and the
    wall time each took. In process: the engine's own decisions."""

    def __init__(self, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> None:
        super().__init__(workload, policy, sampler)
        self.decisions: list[Decided] = []
        self.decide_s: list[float] = []
        #: Wall seconds of the whole run (set by `run`).
        self.wall_s = 0.0

    async def run(self) -> Counts:
        began = time.perf_counter()
        try:
            await self.prepare()
            return await super().run()
        finally:
            self.wall_s = time.perf_counter() - began

    async def prepare(self) -> None:
        """Before the first event (nothing to do in process)."""

    async def decide(self, request: ScheduleRequest, now: float) -> Outcome:
        began = time.perf_counter()
        outcome = await self.decision(request, now)
        self.decide_s.append(time.perf_counter() - began)
        host = outcome.placements[0].host_id if isinstance(outcome, Placed) else None
        self.decisions.append(Decided(self.clock, request.kind, request.vm.vm_id, host))
        return outcome

    async def decision(self, request: ScheduleRequest, now: float) -> Outcome:
        """How a decision is made: here, in process (`place` with the policy's local steps)."""
        return await super().decide(request, now)

    @property
    def placements(self) -> dict[str, str | None]:
        """Each VM -> the host its last start was placed on (None: not placed): an arrival, or an
        HA VM's restart after its host failed."""
        return {d.vm_id: d.host_id for d in self.decisions if d.kind is RequestKind.RUN}

    def timing(self) -> Timing:
        return Timing(self.wall_s, self.sampling_s, self.clock)


__all__ = ["Decided", "RecordingSimulation"]
