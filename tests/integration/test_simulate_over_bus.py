"""`vmsched simulate --over-bus`: a small workload replayed in process and through the real services
(state tracker, filter-worker, selector, policy-admin, started in this process as the command starts
them) gives the same decisions, migrations included; what the replay stored is gone afterwards; and
a decision that depends on elapsed time is reported as differing, not hidden."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator

import pytest

from vmsched.contracts import RequestKind
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.settings import Settings
from vmsched.simulation.workload import (
    AffinityGroupSpec,
    HostFailure,
    HostSpec,
    MaintenanceWindow,
    VmArrival,
    VmDeparture,
    Workload,
)
from vmsched_services.tools.simulate_bus import (
    CLUSTER_PREFIX,
    RecordingSimulation,
    Services,
    replay,
    services,
    summary_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def svc(settings: Settings, database: str) -> AsyncIterator[Services]:
    """The services as `vmsched simulate --over-bus` gets them: none runs under this run's prefixes,
    so every one it needs is started in this process (the database migrated first)."""
    async with services(settings.model_copy(update={"postgres_url": database})) as s:
        yield s


def mixed_cluster(seed: int = 3) -> Workload:
    """Ten hosts of three sizes, 42 arrivals (some leave after a while, three are asked to leave, two
    fit no host, one needs a network only the big hosts have while one is in maintenance and the other
    is full of its own VMs), a mid host that fails (its HA VMs restarted elsewhere) and comes back, a
    big host in maintenance (drained by migrations). VMs take 30 s to start: each is pending on its
    host meanwhile, in the engine and in the selector alike.
    CPU loads stay low: no host comes near HighUtilization, so no decision depends on how long a
    load lasted (which the services judge by the wall clock)."""
    rng = random.Random(seed)
    arrivals = []
    for i in range(40):
        arrivals.append(
            VmArrival(
                at_s=i * 420.0 + rng.uniform(0, 200),
                vm_id=f"vm{i:02d}",
                mem_mb=rng.choice([2048, 4096, 8192, 8192, 16384, 32768]),
                vcpus=rng.choice([1, 2, 2, 4, 8]),
                cpu_usage_pct=round(rng.uniform(2, 10), 1),
                ha=rng.random() < 0.3,
                networks=["vmnet"] + (["storage"] if i % 9 == 4 else []),
                affinity_groups=["apart"] if i in (5, 6, 7) else [],
                lifetime_s=rng.choice([None, None, 3600.0, 7200.0, 10800.0]),
            )
        )
    arrivals.append(VmArrival(at_s=1500.0, vm_id="huge", mem_mb=400_000, vcpus=4))  # fits no host
    arrivals.append(VmArrival(at_s=9000.0, vm_id="wide", mem_mb=2048, vcpus=64))  # more vCPUs than any host
    return Workload(
        name="mixed",
        hosts=[
            HostSpec(id="big", count=2, cpu_cores=32, mem_mb=262144, networks=["vmnet", "storage"]),
            HostSpec(id="mid", count=4, cpu_cores=16, cpu_threads=32, mem_mb=65536, networks=["vmnet"]),
            HostSpec(id="small", count=4, cpu_cores=8, mem_mb=32768, networks=["vmnet"]),
        ],
        affinity_groups=[AffinityGroupSpec(id="apart", positive=False, enforcing=True)],
        arrivals=arrivals,
        departures=[VmDeparture(at_s=12000.0, vm_id=v) for v in ("vm01", "vm02", "vm10")],
        failures=[HostFailure(at_s=7200.0, host_id="mid2", repair_s=3600.0)],
        maintenance=[MaintenanceWindow(host_id="big1", start_s=3600.0, end_s=10800.0)],
        duration_s=6 * 3600.0,
        sample_interval_s=600.0,
        start_delay_s=30.0,
    )


@pytest.mark.parametrize("policy", ["none", "power_saving", "vm_evenly_distributed"])
async def test_over_the_bus_the_decisions_are_those_made_in_process(svc: Services, policy: str) -> None:
    workload = mixed_cluster()
    local = RecordingSimulation(workload, BUILTIN_POLICIES[policy])
    await local.run()
    bus = await replay(svc, workload, BUILTIN_POLICIES[policy])

    # Every VM on the same host, the same VMs unplaced, every migration to the same target, in order.
    assert bus.placements == local.placements
    assert bus.decisions == local.decisions
    assert dataclasses.asdict(bus.counts) == dataclasses.asdict(local.counts)
    unplaced = {vm for vm, host in bus.placements.items() if host is None}
    assert {"huge", "wide"} <= unplaced
    assert len(bus.placements) - len(unplaced) >= 30
    assert bus.counts.host_failures == 1
    migrations = [d for d in bus.decisions if d.kind is RequestKind.MIGRATE]
    if policy == "power_saving":
        assert migrations  # balancing passes ran, their targets came from the selector
        assert bus.counts.migrations > 0
    assert bus.counts.drain_migrations > 0  # big1's VMs moved off when it went into maintenance
    if policy == "none":
        assert bus.counts.migrations == 0  # no balance unit: every migration target was a drain's
        assert len(migrations) == bus.counts.drain_migrations + bus.counts.drain_unplaced
        assert bus.counts.vms_lost > 0  # spread out, the failed host had VMs (power saving packs elsewhere)
    summary = summary_of(policy, local, bus)
    assert summary.identical
    assert summary.decisions == len(local.decisions)
    assert summary.bus_ms_mean > summary.in_process_ms_mean > 0

    # Nothing of the replay is left: its cluster (state, pending records), its policy copy and link.
    _, pending, version = await svc.pending.snapshot_with_state(bus.cluster_id)
    assert (pending, version) == ([], None)
    assert await svc.decisions.get(bus.cluster_id, bus.request_ids[0]) is None
    listing = await svc.admin.read()
    assert not [p for p in listing.policies if p.document.name.startswith(CLUSTER_PREFIX)]
    assert not [c for c in listing.clusters if c.cluster_id.startswith(CLUSTER_PREFIX)]


async def test_a_decision_that_depends_on_elapsed_time_is_reported_as_differing(svc: Services) -> None:
    """A host loaded over HighUtilization for ten simulated minutes is removed by CPUOverloaded in
    process; over the bus the load has lasted wall milliseconds, and the host takes the VM."""
    workload = Workload(
        name="hot",
        hosts=[
            HostSpec(id="hot", count=1, cpu_cores=16, mem_mb=65536, networks=["vmnet"]),
            HostSpec(id="cold", count=1, cpu_cores=16, mem_mb=65536),
        ],
        arrivals=[
            VmArrival(at_s=0.0, vm_id="burner", mem_mb=4096, vcpus=16, cpu_usage_pct=100.0, pinned_hosts=["hot"]),
            VmArrival(at_s=600.0, vm_id="probe", mem_mb=2048, vcpus=2, networks=["vmnet"]),
        ],
        duration_s=1200.0,
    )
    none = BUILTIN_POLICIES["none"]
    local = RecordingSimulation(workload, none)
    await local.run()
    bus = await replay(svc, workload, none)
    assert local.placements == {"burner": "hot", "probe": None}
    assert bus.placements == {"burner": "hot", "probe": "hot"}
    summary = summary_of("none", local, bus)
    assert not summary.identical
    [diff] = summary.differences
    assert diff.text() == "arrival of probe at 600 s: hot over the bus, not placed in process"
