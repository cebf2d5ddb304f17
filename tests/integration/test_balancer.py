"""The balancer (VM-count imbalance, migrations, leases) on real Redis and PostgreSQL, on RabbitMQ and in memory."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from tests.factories import WIDE_BUDGETS, first_generation, host_report, pending_entry, vm_report
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched import constants as c
from vmsched.bus import MemoryBus
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, MigrationDecision, VmReport
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched.scheduling.balancing import BalancePick, balance_pass
from vmsched.scheduling.budgets import Budget
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy
from vmsched.scheduling.units.base import Migration, PolicyUnit, Props
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore, StateCache, StateWriter
from vmsched.store.cluster_reads import MATCH_TRIES
from vmsched.store.redis import connect
from vmsched_services.balancer import service as balancer_service
from vmsched_services.balancer.service import Balancer

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

#: vm_evenly_distributed: HighVmCount 10, MigrationThreshold 5, SpmVmGrace 5 (no SPM host here).
POLICY = "vm_evenly_distributed"
#: Disruption budgets wide enough for the tests of what the unit does (the defaults allow a 3-host
#: cluster one migration an hour: test_the_balancer_obeys_the_disruption_budgets).


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


async def crowded_cluster(
    client: SchedulerClient,
    cfg: Settings,
    cluster: str,
    counts: dict[str, int],
    properties: dict[str, str] | None = None,
) -> None:
    """Hosts with `counts` running VMs each, under the VM-count policy (wide budgets unless told)."""
    pool = await connect_pg(cfg.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(
            cluster, POLICY, WIDE_BUDGETS if properties is None else properties
        )
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


async def test_the_balancer_obeys_the_disruption_budgets(
    balancing: Settings, buses: Buses, unique: str, redis_client: aioredis.Redis
) -> None:
    """Default budgets on 3 hosts: one migration an hour (per cluster and per host), recorded in Redis."""
    cluster = f"bud-{unique}"
    async with buses.client(balancing) as client:
        got: asyncio.Queue[MigrationDecision] = asyncio.Queue()
        await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], got.put)
        await crowded_cluster(client, balancing, cluster, {"a": 13, "b": 2, "c": 2}, properties={})
        first = await next_migration(got, 15.0)
        assert first.source_host == "a"
        await client.report_vm(vm_report(cluster, first.vm_id, first.target_host, mem_mb=1024, vcpus=1))
        # Without budgets two more would follow within seconds (the test below): none comes.
        with pytest.raises(TimeoutError):
            await next_migration(got, 5 * balancing.balance_interval_s)
        record = await redis_client.zrange(Keys.from_settings(balancing).migration_budget(cluster), 0, -1)
        assert len(record) == 1
        assert first.vm_id in str(record[0])


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


# ---------------------------------------------------------------------------------------- what an attempt reads
class FixedPolicy(PolicyCache):
    """The VM-count balance unit's policy for every cluster, without PostgreSQL."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.policy = BUILTIN_POLICIES[POLICY]

    async def for_cluster(self, cluster_id: str) -> Policy:
        return self.policy


@dataclass
class Attempts:
    """What balance_pass was given on each attempt at one of `clusters`; each such attempt picks `a-vm0`
    off host a. balance_pass is patched where the balancer module reads it, so the module's running
    balancer (the amqp run's, balancing other tests' clusters) comes through here too: its passes go
    to the real balance_pass and are not recorded."""

    clusters: set[str] = field(default_factory=set)
    tables: list[HostTable] = field(default_factory=list)
    movable: list[list[str]] = field(default_factory=list)

    def balance_pass(
        self,
        unit: PolicyUnit,
        props: Props,
        table: HostTable,
        movable: Sequence[VmReport],
        budget: Budget | None = None,
    ) -> BalancePick:
        if not any(v.cluster_id in self.clusters for v in movable):
            return balance_pass(unit, props, table, movable, budget)
        self.tables.append(table)
        self.movable.append([v.vm_id for v in movable])
        vm = next((v for v in movable if v.vm_id == "a-vm0"), None)
        if vm is None:
            return BalancePick(None, None, ())
        return BalancePick(vm, Migration(vm.vm_id, "a", ("b",), "test"), ())


@dataclass
class Reading:
    settings: Settings
    rt: Runtime
    balancer: Balancer
    writer: StateWriter
    attempts: Attempts


@pytest.fixture
async def reading(bus_settings: Settings, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch) -> Reading:
    """A balancer on real Redis under keys of its own (the module's balancer never sees its clusters),
    whose balance_pass is watched and which never asks the selector (no target is found)."""
    cfg = bus_settings.model_copy(
        update={"redis_prefix": f"{bus_settings.redis_prefix}:reads", "migrations_per_cycle": 2}
    )
    rt = Runtime(settings=cfg, bus=MemoryBus(cfg), redis=redis_client, state=StateCache(redis_client, cfg))
    attempts = Attempts()
    monkeypatch.setattr(balancer_service, "balance_pass", attempts.balance_pass)
    balancer = Balancer(rt, FixedPolicy(rt))

    async def no_target(*_: object) -> None:
        return None

    monkeypatch.setattr(balancer, "_migrate", no_target)
    return Reading(
        cfg, rt, balancer, StateWriter(redis_client, cfg, recover=first_generation(redis_client, cfg)), attempts
    )


async def two_hosts(reading: Reading, cluster: str) -> None:
    """Hosts a (with VMs a-vm0..2) and b (empty); the attempts at this cluster are recorded."""
    reading.attempts.clusters.add(cluster)
    writer = reading.writer
    await writer.apply_cluster(ClusterReport(cluster_id=cluster))
    for host in ("a", "b"):
        await writer.apply_host(
            host_report(cluster, host, cpu_cores=32, physical_mem_mb=262144, mem_free_mb=200000, reserved_mem_mb=0)
        )
    for i in range(3):
        await writer.apply_vm(vm_report(cluster, f"a-vm{i}", "a", mem_mb=1024, vcpus=1, cpu_usage_pct=10.0))


def after_the_first_read(
    monkeypatch: pytest.MonkeyPatch, balancer: Balancer, rt: Runtime, action: Callable[[], Awaitable[None]]
) -> list[str]:
    """Run `action` once, right after the first read of pending records or state, whichever comes
    first; returns the names of the reads, in order."""
    reads: list[str] = []

    def watch(owner: object, name: str) -> None:
        original = getattr(owner, name)

        async def read(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            reads.append(name)
            if len(reads) == 1:
                await action()
            return result

        monkeypatch.setattr(owner, name, read)

    for name in ("read", "snapshot", "snapshot_with_state"):
        watch(balancer.pending, name)
    for name in ("snapshot", "table", "table_with"):
        watch(rt.state, name)
    return reads


async def test_a_migration_completing_between_the_reads_is_still_counted_and_in_flight(
    reading: Reading, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a-vm0 migrates a -> b (pending on b). The state tracker writes it running on b, then clears its
    record, just after the balancer's first read. Pending read first, the VM is pending on b then
    counted on b by the state read after: never on no host, and not picked to move again."""
    cluster = f"order-{unique}"
    await two_hosts(reading, cluster)
    async with ClusterLock(
        reading.rt.redis, reading.settings, recover=first_generation(reading.rt.redis, reading.settings)
    ).hold(cluster) as lease:
        entry = pending_entry("a-vm0", "b", lease.token, mem_mb=1024, vcpus=1)
        await PendingStore(reading.rt.redis, reading.settings).record(cluster, [entry], lease.token)

    async def migration_completes() -> None:
        await reading.writer.apply_vm(vm_report(cluster, "a-vm0", "b", mem_mb=1024, vcpus=1, cpu_usage_pct=10.0))
        assert await PendingStore(reading.rt.redis, reading.settings).clear(cluster, "a-vm0", "b")

    reads = after_the_first_read(monkeypatch, reading.balancer, reading.rt, migration_completes)
    await reading.balancer.balance(cluster)
    assert reads
    table = reading.attempts.tables[0]
    b = table.index["b"]
    assert "a-vm0" in table.vm_ids[b] | table.pending_vm_ids[b]
    assert table.vm_count[b] + table.pending_vm_count[b] >= 1
    assert "a-vm0" not in reading.attempts.movable[0]


async def test_the_hosts_table_is_kept_between_attempts_and_patched_by_state_version(
    reading: Reading, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts in one cycle: at the same state version the second one rebuilds nothing; after a
    host report (a newer version) the table is patched from the change stream, not built again."""
    cluster = f"reuse-{unique}"
    await two_hosts(reading, cluster)
    built: list[int] = []
    from_states = HostTable.from_states.__func__  # type: ignore[attr-defined]

    def counted(cls: type[HostTable], *args: Any, **kwargs: Any) -> HostTable:
        built.append(1)
        table: HostTable = from_states(cls, *args, **kwargs)
        return table

    monkeypatch.setattr(HostTable, "from_states", classmethod(counted))
    changes: list[Callable[[], Awaitable[object]]] = []

    async def migrate_(*_: object) -> MigrationDecision:
        for change in changes:
            await change()
        return MigrationDecision(
            decision_id=uuid.uuid4(),
            cluster_id=cluster,
            vm_id="a-vm0",
            source_host="a",
            target_host="b",
            balance_unit="OptimalForEvenGuestDistribution",
            reason="test",
            policy=POLICY,
            request_id=uuid.uuid4(),
            decided_at=datetime.now(UTC),
        )

    monkeypatch.setattr(reading.balancer, "_migrate", migrate_)
    stats = reading.rt.state.stats

    assert len(await reading.balancer.balance(cluster)) == 2
    first, second = reading.attempts.tables
    assert len(built) == 1  # the first attempt's load; the second found the same version
    assert (stats.full_loads, stats.incremental_loads) == (1, 0)
    assert second.mem_free_mb[second.index["b"]] == 200000

    changes.append(
        lambda: reading.writer.apply_host(
            host_report(cluster, "b", cpu_cores=32, physical_mem_mb=262144, mem_free_mb=150000, reserved_mem_mb=0)
        )
    )
    assert len(await reading.balancer.balance(cluster)) == 2
    third, fourth = reading.attempts.tables[2:]
    assert len(built) == 1  # patched, not built again
    assert stats.full_loads == 1
    assert stats.incremental_loads == 1  # the second attempt's: the first one's migration reported b anew
    assert third.mem_free_mb[third.index["b"]] == 200000
    assert fourth.mem_free_mb[fourth.index["b"]] == 150000
    assert first.ids == fourth.ids


async def test_hosts_and_vms_come_from_one_version_while_the_state_keeps_moving(
    reading: Reading, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report lands, and the shared cache catches up with it, between every read of the VMs and of
    the hosts: after a few tries the attempt reads both in one snapshot, so a VM is never on one host
    in the table and on another in its report."""
    cluster = f"moving-{unique}"
    await two_hosts(reading, cluster)
    reads = reading.balancer.reads
    read_vms = reads._vms
    moves = 0

    async def vms_then_a_report(cluster_id: str) -> tuple[int, list[VmReport]]:
        nonlocal moves
        got = await read_vms(cluster_id)
        moves += 1
        await reading.writer.apply_vm(vm_report(cluster, "a-vm1", "a", mem_mb=1024, vcpus=1, cpu_usage_pct=moves))
        await reading.rt.state.table(cluster_id)  # another service of the process brings the cache up to date
        return got

    monkeypatch.setattr(reads, "_vms", vms_then_a_report)
    view = await reads.read(cluster)
    assert moves == MATCH_TRIES
    assert view.version == await reading.rt.state.version(cluster)
    assert next(v for v in view.vms if v.vm_id == "a-vm1").cpu_usage_pct == MATCH_TRIES
