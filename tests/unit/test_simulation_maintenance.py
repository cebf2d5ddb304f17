"""The simulator drains a host in maintenance by one plan (scheduling.maintenance), as the balancer
service does: planned once, affinity kept, all or nothing, at most two migrations a step."""

from __future__ import annotations

import asyncio

from vmsched.contracts import ScheduleRequest
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Simulation
from vmsched.simulation.workload import AffinityGroupSpec, HostSpec, MaintenanceWindow, VmArrival, Workload

NONE = BUILTIN_POLICIES["none"]


class Recorded(Simulation):
    """Notes when each migration starts, and where to."""

    started: list[tuple[float, str, str]]

    def _migrate(self, request: ScheduleRequest, source: str, target: str, *, drain: bool = False) -> None:
        self.__dict__.setdefault("started", []).append((self.clock, request.vm.vm_id, target))
        super()._migrate(request, source, target, drain=drain)


def vm(at: float, name: str, mem_gb: int, host: str, groups: tuple[str, ...] = ()) -> VmArrival:
    return VmArrival.model_validate(
        {
            "at_s": at,
            "vm_id": name,
            "mem_mb": mem_gb * 1024,
            "vcpus": 2,
            "pinned_hosts": [host],  # to start there; a migration may move it
            "affinity_groups": list(groups),
        }
    )


def workload(hosts: int, arrivals: list[VmArrival], groups: list[AffinityGroupSpec], start: float) -> Workload:
    return Workload.model_validate(
        {
            "hosts": [HostSpec(id="h", count=hosts, cpu_cores=16, mem_mb=16 * 1024)],
            "arrivals": arrivals,
            "affinity_groups": groups,
            "maintenance": [MaintenanceWindow(host_id="h2", start_s=start, end_s=3000)],
            "duration_s": 3600.0,
        }
    )


def test_a_maintenance_window_drains_by_one_plan_in_steps_keeping_affinity() -> None:
    groups = [
        AffinityGroupSpec(id="pair", positive=True, enforcing=True),
        AffinityGroupSpec(id="apart", positive=False, enforcing=True),
    ]
    arrivals = [
        vm(0, "g1", 2, "h2", ("pair",)),
        vm(1, "g2", 2, "h2", ("pair",)),
        vm(2, "a", 1, "h2", ("apart",)),
        vm(3, "b", 1, "h1", ("apart",)),
        vm(4, "c", 1, "h3", ("apart",)),
        vm(5, "d", 1, "h2"),
        vm(6, "e", 1, "h2"),
    ]
    sim = Recorded(workload(4, arrivals, groups, 100), NONE)
    asyncio.run(sim.run())
    assert sim.vms_on("h2") == frozenset()
    assert (sim.counts.drain_plans, sim.counts.drain_migrations, sim.counts.drain_unplaced) == (1, 5, 0)
    assert sim.where("g1") == sim.where("g2")  # the positive group moved together
    assert not sim.counts.failures
    assert sim.where("a") == "h4"  # the negative group kept apart: b is on h1, c on h3
    # Steps of at most two, each started when the previous one's VMs moved (the migration delay).
    delay = sim.workload.migration_delay_s
    times = sorted({t for t, _, _ in sim.started})
    assert times == [100.0, 100.0 + delay, 100.0 + 2 * delay]
    assert all(sum(1 for t, _, _ in sim.started if t == at) <= 2 for at in times)
    # The group's members are consecutive in the plan: the pair starts in one step.
    assert {t for t, v, _ in sim.started if v in ("g1", "g2")} == {100.0}


def test_a_drain_that_cannot_move_every_vm_moves_none() -> None:
    # h1 holds 8 GB: x (6 GB) alone would fit there, x and y together do not, and h2 is the only other host.
    arrivals = [vm(0, "big", 8, "h1"), vm(1, "x", 6, "h2"), vm(2, "y", 6, "h2")]
    sim = Recorded(workload(2, arrivals, [], 100), NONE)
    asyncio.run(sim.run())
    assert not sim.__dict__.get("started")  # all or nothing: x stayed too
    assert sim.vms_on("h2") == frozenset({"x", "y"})
    assert sim.counts.drain_migrations == 0
    # Planned again every balancing interval while the host is in maintenance, each time refused.
    assert sim.counts.drain_plans > 1
    assert sim.counts.drain_unplaced >= sim.counts.drain_plans
