"""The balancer (VM-count imbalance, migrations, leases) on real Redis and PostgreSQL, on RabbitMQ and in memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from tests.factories import host_report, vm_report
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, MigrationDecision
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.settings import Settings
from vmsched.store import Keys
from vmsched.store.redis import connect
from vmsched_services.balancer.service import Balancer

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

#: vm_evenly_distributed: HighVmCount 10, MigrationThreshold 5, SpmVmGrace 5 (no SPM host here).
POLICY = "vm_evenly_distributed"


@pytest.fixture(scope="module")
async def balancing(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    """The scheduling services plus one balancer, with short cycles and leases."""
    await migrate(database)
    cfg = bus_settings.model_copy(
        update={
            "postgres_url": database,
            "balance_interval_s": 1.0,
            "lease_ttl_s": 0.6,
            "migration_cooldown_s": 30.0,
        }
    )
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", "balancer", bus=buses):
        yield cfg


async def crowded_cluster(client: SchedulerClient, cfg: Settings, cluster: str, counts: dict[str, int]) -> None:
    """Hosts with `counts` running VMs each, under the VM-count policy."""
    pool = await connect_pg(cfg.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(cluster, POLICY)
    finally:
        await pool.close()
    await client.policy_changed(cluster_id=cluster)
    await client.report_cluster(ClusterReport(cluster_id=cluster))
    for host in counts:
        await client.report_host(
            host_report(cluster, host, cpu_cores=32, physical_mem_mb=262144, mem_free_mb=200000, reserved_mem_mb=0)
        )
    for host, n in counts.items():
        for i in range(n):
            await client.report_vm(
                vm_report(cluster, f"{host}-vm{i}", host, mem_mb=1024, vcpus=1, cpu_usage_pct=float(10 + i))
            )
    await client.wait_for_state(cluster, hosts=len(counts))


async def next_migration(queue: asyncio.Queue[MigrationDecision], timeout: float) -> MigrationDecision:
    return await asyncio.wait_for(queue.get(), timeout)


async def test_an_overcrowded_host_is_relieved_until_the_cluster_is_balanced(
    balancing: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"bal-{unique}"
    passes = REGISTRY.get_sample_value("vmsched_balance_passes_total") or 0.0
    migrations = REGISTRY.get_sample_value("vmsched_balance_migrations_total") or 0.0
    async with buses.client(balancing) as client:
        got: asyncio.Queue[MigrationDecision] = asyncio.Queue()
        await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], got.put)
        await crowded_cluster(client, balancing, cluster, {"a": 13, "b": 2, "c": 2})
        moved = 0
        while True:
            try:
                # Up to the three expected, wait as long as a busy machine may need; after them, four
                # quiet intervals say the cluster is balanced.
                m = await next_migration(got, 15.0 if moved < 3 else 4 * balancing.balance_interval_s)
            except TimeoutError:
                break  # no more migrations: balanced
            assert m.source_host == "a"
            assert m.target_host in {"b", "c"}
            assert m.balance_unit == "OptimalForEvenGuestDistribution"
            assert m.policy == POLICY
            assert m.reason
            # the least CPU-hungry VM of the worst host goes first
            assert m.vm_id == f"a-vm{moved}"
            moved += 1
            # the engine carries the migration out: the VM now runs on the target
            await client.report_vm(vm_report(cluster, m.vm_id, m.target_host, mem_mb=1024, vcpus=1, cpu_usage_pct=10.0))
            assert moved < 10, "the balancer does not stop"
        # 13 VMs on a: 13-2 >= 5 and 13 > 10 -> move; 12 -> move; 11 -> move; 10 is not above HighVmCount
        assert moved == 3
        # The balancer runs in this process: its counters are this registry's. It balances every
        # cluster of the run's prefix (other tests leave crowded ones), so at least ours are counted.
        assert (REGISTRY.get_sample_value("vmsched_balance_migrations_total") or 0.0) >= migrations + 3
        assert (REGISTRY.get_sample_value("vmsched_balance_passes_total") or 0.0) >= passes + 4
        state = await client.state(cluster)
        counts = {h.report.host_id: h.vm_count for h in state.hosts}
        assert counts["a"] == 10


async def test_a_dead_lease_holder_hands_the_cluster_over_within_an_interval(
    balancing: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"lease-{unique}"
    # Another balancer owns the cluster (it renews its lease but balances nothing), then dies.
    doomed_rt = await buses.runtime(balancing, "doomed-balancer")
    doomed = Balancer(doomed_rt)
    assert await doomed.leases.claim(cluster)

    async def renew() -> None:
        while True:
            assert await doomed.leases.claim(cluster)
            await asyncio.sleep(balancing.lease_ttl_s / 4)

    renewing = asyncio.create_task(renew())
    try:
        async with buses.client(balancing) as client:
            got: asyncio.Queue[MigrationDecision] = asyncio.Queue()
            await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], got.put)
            await crowded_cluster(client, balancing, cluster, {"x": 12, "y": 1})
            await asyncio.sleep(2 * balancing.balance_interval_s)
            assert got.empty(), "the fixture's balancer must not balance a cluster it does not own"
            renewing.cancel()  # the owner dies: no renewal, no release
            died_at = asyncio.get_running_loop().time()
            m = await next_migration(got, 10)
            handed_over = asyncio.get_running_loop().time() - died_at
            assert m.source_host == "x"
            # A lease and an interval on an idle machine; 5 s of slack for a busy one (an owner whose
            # lease outlived it would never hand over: next_migration's 10 s would run out first).
            assert handed_over <= balancing.lease_ttl_s + balancing.balance_interval_s + 5.0
            assert await doomed.leases.holder(cluster) != doomed.leases.owner
    finally:
        renewing.cancel()
        await doomed_rt.close()


async def test_a_host_where_the_vm_failed_before_is_not_a_target(
    balancing: Settings, buses: Buses, unique: str
) -> None:
    """The state tracker remembered that this VM failed on b: the balancer sends it to c instead."""

    cluster = f"avoid-{unique}"
    redis = connect(balancing)
    try:
        await redis.sadd(Keys.from_settings(balancing).tried(cluster, "a-vm0"), "b")
        async with buses.client(balancing) as client:
            got: asyncio.Queue[MigrationDecision] = asyncio.Queue()
            await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], got.put)
            await crowded_cluster(client, balancing, cluster, {"a": 13, "b": 0, "c": 2})
            m = await next_migration(got, 10)
        assert m.vm_id == "a-vm0"
        assert m.target_host == "c"  # b has fewer VMs, but a-vm0 failed there before
    finally:
        await redis.aclose()
