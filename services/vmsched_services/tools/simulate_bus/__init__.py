"""`vmsched simulate --over-bus`: a workload replayed with its decisions made by the real services.

The replay is the simulation's own (vmsched.simulation.engine.Simulation: the same event loop, the
same simulated cluster); only its decision seam, `Simulation.decide`, is replaced. Before each
decision the simulated cluster is reported to the state tracker as an engine reports its own (a
ClusterReport once, a HostReport per host that changed, a VmReport per VM started, moved or gone),
the replay waits until the tracker has applied them (the cluster's state version in Redis) and has
cleared the pending record of every VM that settled, then sends the ScheduleRequest to the selector
through SchedulerClient and turns the ScheduleDecision into the engine's Outcome. Each VM the
selector places is reported running before the next decision, as the simulated engine starts it at
once: a decision sees nothing pending but the balancing migrations in flight, in both modes.

What stays in this process: the balancing pass (which VM moves, `balance_pass` on the simulated
clock), as in the plain simulation; the migration's target is the selector's decision, as when the
balancer service asks it. So each run's policy is stored as a copy without its balance unit, named
after the run's own cluster (`simulate-<12 hex>-<policy>`): no balancer service balances the
simulated cluster behind the replay's back. The cluster's state, pending records and decision
history, its policy link and the copy are removed at the end.

Time: the services judge time by the wall clock (the tracker stamps a CPU sample when it applies a
host report; a decision's instant is when it is made), the simulation by its own clock, which runs
hours in seconds. A decision that depends on how long something lasted can therefore differ:
CPUOverloaded removes a host over HighUtilization for CpuOverCommitDurationMinutes of simulated
time in process, while over the bus the same overload has lasted wall milliseconds. Pending records
expire by the wall clock too (VMSCHED_PENDING_TTL_S), which only a migration in flight for that long
in wall time would notice. Every run is therefore also replayed in process, and the report lists the
decisions that differ.
"""

from __future__ import annotations

from vmsched_services.tools.simulate_bus.command import SHOWN_DIFFERENCES, OverBus, main, render_over_bus, run_over_bus
from vmsched_services.tools.simulate_bus.compare import BusSummary, Difference, differences, summary_of
from vmsched_services.tools.simulate_bus.recording import Decided, RecordingSimulation
from vmsched_services.tools.simulate_bus.replaying import (
    CLUSTER_PREFIX,
    REMOVAL_TIMEOUT_S,
    forget,
    replay,
    stored_policy,
)
from vmsched_services.tools.simulate_bus.reporting import CATCH_UP_TIMEOUT_S, PENDING_S, POLL_S, BusSimulation
from vmsched_services.tools.simulate_bus.stack import Services, needed_services, running_services, services

__all__ = [
    "CATCH_UP_TIMEOUT_S",
    "CLUSTER_PREFIX",
    "PENDING_S",
    "POLL_S",
    "REMOVAL_TIMEOUT_S",
    "SHOWN_DIFFERENCES",
    "BusSimulation",
    "BusSummary",
    "Decided",
    "Difference",
    "OverBus",
    "RecordingSimulation",
    "Services",
    "differences",
    "forget",
    "main",
    "needed_services",
    "render_over_bus",
    "replay",
    "run_over_bus",
    "running_services",
    "services",
    "stored_policy",
    "summary_of",
]
