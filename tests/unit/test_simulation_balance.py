"""Balancing in the simulation: the balancer's pass every interval, migrations after a delay, cool-downs."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.factories import WIDE_BUDGETS
from vmsched.contracts import VmReport, VmStatus
from vmsched.scheduling.balancing import balance_pass, migration_request, movable_vms
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.units import get_unit, validate_properties
from vmsched.simulation.engine import Simulation
from vmsched.simulation.report import Recorder, Sample
from vmsched.simulation.workload import HostSpec, VmArrival, Workload


def crowded(*, departs: dict[str, float] | None = None, **kw: object) -> Workload:
    """Four hosts; 24 busy VMs all pinned to h1 at the start (as if placed before balancing began)."""
    arrivals = [
        VmArrival(
            at_s=0.0,
            vm_id=f"v{i:02}",
            mem_mb=2048,
            vcpus=2,
            cpu_usage_pct=40.0 + i,
            pinned_hosts=["h1"],
        )
        for i in range(24)
    ]
    departures = [{"at_s": at, "vm_id": vm} for vm, at in (departs or {}).items()]
    return Workload.model_validate(
        {
            "hosts": [HostSpec(id="h", count=4, cpu_cores=16, mem_mb=65536)],
            "arrivals": arrivals,
            "departures": departures,
            "duration_s": 7200.0,
            "sample_interval_s": 60.0,
            **kw,
        }
    )


#: Disruption budgets wide enough that these tests see the units themselves (the budgets'
#: defaults allow a 4-host cluster one migration an hour; tests/unit/test_balance_spread.py
#: holds the simulator to them).


def simulate(workload: Workload, policy: str) -> tuple[Simulation, list[Sample]]:
    recorder = Recorder()
    chosen = BUILTIN_POLICIES[policy]
    chosen = chosen.model_copy(update={"properties": {**chosen.properties, **WIDE_BUDGETS}})
    sim = Simulation(workload, chosen, recorder)
    asyncio.run(sim.run())
    return sim, recorder.samples


@pytest.mark.parametrize("policy", ["evenly_distributed", "vm_evenly_distributed"])
def test_a_crowded_cluster_is_balanced_without_ping_pong(policy: str) -> None:
    sim, samples = simulate(crowded(), policy)
    first, last = samples[0], samples[-1]
    assert first.vm_count_spread == 24
    c = sim.counts
    assert c.migrations > 0
    assert c.migrations == c.migrations_started  # every migration decided completed
    assert c.ping_pongs == 0
    assert last.vm_count_spread < first.vm_count_spread
    assert last.cpu_spread < first.cpu_spread
    assert last.mem_spread < first.mem_spread
    assert sum(len(sim.vms_on(f"h{i}")) for i in range(1, 5)) == 24
    # A pass moves at most migrations_per_cycle VMs, and only once per interval.
    assert c.migrations_started <= c.balance_passes * sim.workload.migrations_per_cycle


def test_a_policy_without_a_balance_unit_never_migrates() -> None:
    sim, samples = simulate(crowded(), "none")
    assert sim.counts.balance_passes == 0
    assert sim.counts.migrations == sim.counts.migrations_started == 0
    assert samples[-1].vm_count_spread == 24
    assert len(sim.vms_on("h1")) == 24


def test_a_migration_completes_after_its_delay_and_is_pending_on_its_target_meanwhile() -> None:
    w = crowded(balance_interval_s=600.0, migration_delay_s=120.0, duration_s=780.0)
    sim = Simulation(w, BUILTIN_POLICIES["vm_evenly_distributed"])
    seen: dict[float, tuple[list[int], float]] = {}

    def sample() -> None:
        counts = [len(sim.vms_on(f"h{i}")) for i in range(1, 5)]
        seen[sim.clock] = (counts, float(sim.decision_table().pending_vm_count.sum()))

    sim.sampler = lambda snap: sample()
    asyncio.run(sim.run())
    # At 600 the pass decided one migration: the VM stays on h1, pending on its target, until 720.
    assert seen[600.0] == seen[660.0] == ([24, 0, 0, 0], 1.0)
    counts, pending = seen[720.0]
    assert (counts[0], sum(counts), pending) == (23, 24, 0.0)
    assert (sim.counts.migrations_started, sim.counts.migrations) == (1, 1)


def test_a_vm_gone_before_its_migration_completes_is_not_moved() -> None:
    w = crowded(balance_interval_s=600.0, migration_delay_s=120.0, duration_s=1000.0)
    probe = Simulation(w, BUILTIN_POLICIES["vm_evenly_distributed"])
    asyncio.run(probe.run())
    first_moved = next(vm for vm in (f"v{i:02}" for i in range(24)) if probe.where(vm) != "h1")
    sim = Simulation(
        crowded(departs={first_moved: 650.0}, balance_interval_s=600.0, migration_delay_s=120.0, duration_s=1000.0),
        BUILTIN_POLICIES["vm_evenly_distributed"],
    )
    asyncio.run(sim.run())
    assert sim.where(first_moved) is None
    assert sim.counts.migrations_started == 1
    assert sim.counts.migrations == 0
    assert sim.pending() == []


def vm(vm_id: str, host: str, **kw: object) -> VmReport:
    return VmReport.model_validate(
        {"cluster_id": "c", "vm_id": vm_id, "status": "running", "host_id": host, "mem_mb": 1024, "vcpus": 1, **kw}
    )


def test_movable_vms_leave_out_in_flight_resting_stopped_and_unmigratable_ones() -> None:
    vms = [
        vm("a", "h1"),
        vm("b", "h1"),
        vm("c", "h1"),
        vm("d", "h1", migratable=False),
        vm("e", "h1", status=VmStatus.DOWN),
        vm("f", "h1"),
    ]
    assert [v.vm_id for v in movable_vms(vms, {"b"}, {"c"})] == ["a", "f"]


def test_the_pass_is_the_units_pick_and_the_request_whitelists_its_candidates() -> None:
    """balance_pass gives what the unit gives on the movable VMs; the request is the selector's."""
    sim = Simulation(crowded(balance_interval_s=1e6), BUILTIN_POLICIES["vm_evenly_distributed"])
    asyncio.run(sim.run())  # placed, never balanced: all 24 on h1
    unit = get_unit("OptimalForEvenGuestDistribution")
    props = validate_properties(unit, BUILTIN_POLICIES["vm_evenly_distributed"].properties)
    table = sim.decision_table()
    movable = movable_vms(sim.vm_reports(), {"v00"}, {"v01"})
    assert unit.balance is not None
    direct = unit.balance(table, movable, props)
    pick = balance_pass(unit, props, table, movable)
    assert pick.migration is not None
    assert (pick.migration, pick.power) == (direct.migration, direct.power)
    assert pick.vm is not None
    assert pick.vm.vm_id == pick.migration.vm_id
    assert pick.vm.vm_id not in {"v00", "v01"}
    request = migration_request(uuid.UUID(int=1), "c", pick.vm, "h1", pick.migration.candidates, ["h9"])
    assert request.whitelist == [*pick.migration.candidates, "h1"]
    assert (request.vm.current_host, request.vm.tried_hosts) == ("h1", ["h9"])
