"""Maintenance as one plan, with the real services: a host reported in maintenance gets one
MaintenancePlan event, its VMs migrate off step by step, and a plan that cannot place every VM is
refused whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.factories import host_report, vm_report
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    ClusterReport,
    HostStatus,
    MaintenancePlan,
    Message,
    MigrationDecision,
)
from vmsched.db import migrate
from vmsched.settings import Settings

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

HOST = {"cpu_cores": 32, "physical_mem_mb": 16384, "mem_free_mb": 16384, "reserved_mem_mb": 0}


@pytest.fixture(scope="module")
async def draining(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    """The scheduling services plus one balancer, with short cycles and leases."""
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database, "balance_interval_s": 0.5, "lease_ttl_s": 0.6})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", "balancer", bus=buses):
        yield cfg


async def cluster_with(client: SchedulerClient, cluster: str, vms: dict[str, int]) -> None:
    """Hosts a, b and m (all up); `vms` (id -> MB) running on m."""
    await client.report_cluster(ClusterReport(cluster_id=cluster))
    for host in ("a", "b", "m"):
        await client.report_host(host_report(cluster, host, **HOST))
    for vm_id, mem in vms.items():
        await client.report_vm(vm_report(cluster, vm_id, "m", mem_mb=mem, vcpus=1))
    await client.wait_for_state(cluster, hosts=3)


async def test_a_host_in_maintenance_gets_one_plan_and_is_emptied_step_by_step(
    draining: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"mnt-{unique}"
    async with buses.client(draining) as client:
        plans: asyncio.Queue[MaintenancePlan] = asyncio.Queue()
        moves: asyncio.Queue[MigrationDecision] = asyncio.Queue()

        async def plan_seen(event: Message) -> None:
            if isinstance(event, MaintenancePlan):
                await plans.put(event)

        # The plan comes with the engine's other events (what `vmsched watch` and the api stream follow).
        await client.subscribe_events(cluster, plan_seen)
        await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], moves.put)
        await cluster_with(client, cluster, {f"v{i}": 1024 for i in range(3)})
        await client.report_host(host_report(cluster, "m", status=HostStatus.MAINTENANCE, **HOST))

        plan = await asyncio.wait_for(plans.get(), 15.0)
        assert plan.host_id == "m"
        assert plan.cluster_id == cluster
        assert not plan.refused
        assert plan.max_concurrent == 2
        assert [len(s) for s in plan.steps] == [2, 1]
        targets = {m.vm_id: m.target_host_id for s in plan.steps for m in s}
        assert sorted(targets) == ["v0", "v1", "v2"]
        assert set(targets.values()) <= {"a", "b"}

        for number, step in enumerate(plan.steps, 1):
            got = [await asyncio.wait_for(moves.get(), 15.0) for _ in step]
            assert {(m.vm_id, m.target_host) for m in got} == {(s.vm_id, s.target_host_id) for s in step}
            for m in got:
                assert m.source_host == "m"
                assert m.balance_unit == "Maintenance"
                assert f"plan {plan.plan_id}, step {number}/{len(plan.steps)}" in m.reason
            # The next step waits until this one's VMs are on their targets.
            await asyncio.sleep(3 * draining.balance_interval_s)
            assert moves.empty()
            for m in got:  # the engine carries the migrations out
                await client.report_vm(vm_report(cluster, m.vm_id, m.target_host, mem_mb=1024, vcpus=1))

        # Planned once: no second plan, no further migration once the host is empty.
        await asyncio.sleep(4 * draining.balance_interval_s)
        assert plans.empty()
        assert moves.empty()
        state = await client.state(cluster)
        counts = {h.report.host_id: h.vm_count for h in state.hosts}
        assert counts["m"] == 0
        assert counts["a"] + counts["b"] == 3


async def test_a_plan_that_cannot_place_every_vm_is_refused_whole(
    draining: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"mnt-no-{unique}"
    async with buses.client(draining) as client:
        plans: asyncio.Queue[MaintenancePlan] = asyncio.Queue()
        moves: asyncio.Queue[MigrationDecision] = asyncio.Queue()
        await client.bus.subscribe([c.maintenance_key(cluster)], [MaintenancePlan], plans.put)
        await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], moves.put)
        # Each of a and b takes one 12 GB VM: the third fits nowhere, so nothing moves.
        await cluster_with(client, cluster, {"big0": 12000, "big1": 12000, "big2": 12000})
        await client.report_host(host_report(cluster, "m", status=HostStatus.MAINTENANCE, **HOST))

        plan = await asyncio.wait_for(plans.get(), 15.0)
        assert plan.steps == []
        assert len(plan.refused) == 1
        assert plan.refused[0].vm_id.startswith("big")
        assert "Memory" in plan.refused[0].reason
        await asyncio.sleep(4 * draining.balance_interval_s)
        assert plans.empty()
        assert moves.empty()


async def test_a_drain_keeps_the_affinity_groups_the_engine_reports(
    draining: Settings, buses: Buses, unique: str
) -> None:
    """x and y must share a host, p and q must not: the plan says so from the VMs' reports, and
    every step is carried out (the first of x and y is not held to the host it is leaving)."""
    cluster = f"mnt-aff-{unique}"
    pair = AffinityGroup(group_id="pair", vms=["x", "y"], vm_rule=AffinityRule(positive=True, enforcing=True))
    apart = AffinityGroup(group_id="apart", vms=["p", "q"], vm_rule=AffinityRule(positive=False, enforcing=True))
    groups = {"x": [pair], "y": [pair], "p": [apart], "q": [apart]}
    async with buses.client(draining) as client:
        plans: asyncio.Queue[MaintenancePlan] = asyncio.Queue()
        moves: asyncio.Queue[MigrationDecision] = asyncio.Queue()
        await client.bus.subscribe([c.maintenance_key(cluster)], [MaintenancePlan], plans.put)
        await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], moves.put)
        await cluster_with(client, cluster, {})
        for vm_id, member_of in groups.items():
            await client.report_vm(vm_report(cluster, vm_id, "m", mem_mb=1024, vcpus=1, affinity_groups=member_of))
        await client.wait_for_state(cluster, hosts=3)
        await client.report_host(host_report(cluster, "m", status=HostStatus.MAINTENANCE, **HOST))

        plan = await asyncio.wait_for(plans.get(), 15.0)
        assert not plan.refused
        targets = {m.vm_id: m.target_host_id for s in plan.steps for m in s}
        assert sorted(targets) == ["p", "q", "x", "y"]
        assert targets["x"] == targets["y"]
        assert targets["p"] != targets["q"]
        for step in plan.steps:
            got = [await asyncio.wait_for(moves.get(), 15.0) for _ in step]
            assert {(m.vm_id, m.target_host) for m in got} == {(s.vm_id, s.target_host_id) for s in step}
            for m in got:
                await client.report_vm(
                    vm_report(cluster, m.vm_id, m.target_host, mem_mb=1024, vcpus=1, affinity_groups=groups[m.vm_id])
                )
        await asyncio.sleep(4 * draining.balance_interval_s)
        assert plans.empty()
        assert moves.empty()
