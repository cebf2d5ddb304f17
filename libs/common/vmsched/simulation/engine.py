"""The simulation's event loop: a workload replayed on a simulated clock against one policy.

The cluster's state is kept as the state tracker keeps it (`ClusterState`, vmsched.simulation.state);
each arrival is placed by `place`, the one decision function the selector runs, with the policy's
local filter and weigh steps (vmsched.simulation.deciding, vmsched.simulation.placing). Balancing
passes, their power advice and maintenance drains (vmsched.simulation.migrations and .power) and
the HA-reservation checks (vmsched.simulation.ha_checks) are events on the same clock; so are the
hours of a load curve and the samples the report reads.

Events of one instant apply in the order of `Kind`, then in the order they were queued.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from vmsched.scheduling.policy import Policy
from vmsched.simulation.deciding import decide, effective_policy
from vmsched.simulation.events import Kind
from vmsched.simulation.ha_checks import HaChecks
from vmsched.simulation.migrations import Migrations
from vmsched.simulation.placing import Placing
from vmsched.simulation.records import Counts, Failure, Flight, Sampler, Snapshot, Starting, Timing
from vmsched.simulation.state import CLUSTER_ID, LOAD_STEP, host_report
from vmsched.simulation.workload import Workload


class Simulation(Placing, Migrations, HaChecks):
    """One workload under one policy. `run` replays it; `counts` and the sampler get the results."""

    def _schedule_workload(self) -> float:
        w = self.workload
        end = w.end_s()
        for a in w.arrivals:
            self._push(a.at_s, Kind.ARRIVE, a)
        for d in w.departures:
            self._push(d.at_s, Kind.DEPART, d.vm_id)
        for f in w.failures:
            self._push(f.at_s, Kind.FAIL, f.host_id)
            if f.repair_s is not None:
                self._push(f.at_s + f.repair_s, Kind.REPAIR, f.host_id)
        for m in w.maintenance:
            self._push(m.start_s, Kind.MAINTENANCE_START, m.host_id)
            self._push(m.end_s, Kind.MAINTENANCE_END, m.host_id)
        if self._unit is not None:
            self._queue.every(w.balance_interval_s, w.balance_interval_s, end, Kind.BALANCE)
        if w.cluster.ha_reservation:
            self._queue.every(w.ha_interval_s, w.ha_interval_s, end, Kind.HA_CHECK)
        if w.load_curve:  # at every hour boundary of the simulated clock
            self._queue.every(3600.0 - self.origin % 3600.0, 3600.0, end, Kind.LOAD)
        self._queue.every(0.0, w.sample_interval_s, end, Kind.SAMPLE)
        if end % w.sample_interval_s:
            self._push(end, Kind.SAMPLE, None)
        return end

    async def run(self) -> Counts:
        end = self._schedule_workload()
        handlers = self._handlers()
        while (event := self._queue.pop_until(end)) is not None:
            at_s, kind, payload = event
            self.clock = at_s
            await handlers[kind](payload)
        return self.counts

    def _handlers(self) -> dict[Kind, Callable[[Any], Awaitable[None]]]:
        def sync(fn: Callable[[Any], None]) -> Callable[[Any], Awaitable[None]]:
            async def call(payload: Any) -> None:
                fn(payload)

            return call

        return {
            Kind.REPAIR: sync(self._repair),
            Kind.FAIL: sync(self._fail),
            Kind.POWERED_ON: sync(self._powered_on),
            Kind.MAINTENANCE_START: sync(self._maintenance_start),
            Kind.MAINTENANCE_END: sync(self._maintenance_end),
            Kind.DEPART: sync(self._depart),
            Kind.MIGRATION_DONE: sync(self._migration_done),
            Kind.STARTED: sync(self._started),
            Kind.LOAD: sync(lambda _: self._load_change()),
            Kind.DRAIN: self._drain,
            Kind.RESTART: self._restart,
            Kind.ARRIVE: self._arrive,
            Kind.BALANCE: lambda _: self._balance(),
            Kind.HA_CHECK: sync(lambda _: self._ha_check()),
            Kind.SAMPLE: sync(lambda _: self._sample()),
        }

    def _sample(self) -> None:
        if self.sampler is None:
            return
        table = self.current_table()
        alive = tuple(h for h in table.ids if h not in self._down) if self._down else tuple(table.ids)
        began = time.perf_counter()
        self.sampler(
            Snapshot(self.clock, table, Counter(self._demand), alive, frozenset(self._off), dict(self._overload))
        )
        self.sampling_s += time.perf_counter() - began


#: The collector's thresholds while a simulation runs (generation 0 after this many allocations).
GC_THRESHOLD = (50_000, 20, 100)


async def simulate(workload: Workload, policy: Policy, sampler: Sampler | None = None) -> tuple[Counts, Timing]:
    """Replay `workload` under `policy`; the counts, and how long it took (wall) and spanned (simulated)."""
    # Each event makes thousands of short-lived objects (reports, states, arrays' wrappers) and
    # hardly a cycle: at the default thresholds the collector ran 4,300 times in a day at 10,000
    # hosts, 18 s of a 115 s run; after every 50,000 allocations it runs 35 times, 2 s. Set before
    # the cluster is built too: 10,000 hosts' reports and states are as many allocations again.
    threshold = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        sim = Simulation(workload, policy, sampler)
        # The workload, the hosts' reports and the first table live as long as the run: kept out
        # of the collector's passes, which would walk them again and again (a tenth of a
        # 10,000-host run).
        gc.freeze()
        began = time.perf_counter()
        try:
            counts = await sim.run()
        finally:
            gc.unfreeze()
    finally:
        gc.set_threshold(*threshold)
    return counts, Timing(time.perf_counter() - began, sim.sampling_s, sim.clock)


__all__ = [
    "CLUSTER_ID",
    "LOAD_STEP",
    "Counts",
    "Failure",
    "Flight",
    "Kind",
    "Sampler",
    "Simulation",
    "Snapshot",
    "Starting",
    "Timing",
    "decide",
    "effective_policy",
    "host_report",
    "simulate",
]
