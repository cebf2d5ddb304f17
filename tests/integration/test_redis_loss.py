"""Redis forgetting what it held, with the services running: nothing issued before the loss is
accepted after it, the cluster waits for the engine's full report, and a request decided before
the loss is never placed again.

The loss is what a restart without persistence does to this module's keys: every key under its own
Redis prefix deleted while the services (their in-memory caches included) run on. A marker left in
place but written by another server run is the failover case (the run id no longer matches).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import pytest
import redis.asyncio as aioredis

from tests import factories
from tests.integration.conftest import Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, ResyncRequested, ScheduleDecision, ScheduleRequest
from vmsched.db import connect as connect_pg
from vmsched.db import migrate
from vmsched.db.generations import GenerationLedger
from vmsched.errors import FencedOut, GenerationLost
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock, PendingStore, StateCache
from vmsched.store.generations import STAMP_SPAN, GenerationMarkers, generation_of
from vmsched.store.keys import Keys
from vmsched.store.redis import connect as connect_redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.parametrize("bus_kind", ["memory"], indirect=True, scope="module"),
]

#: Room for three 1024+64 MB VMs per host (no reserved memory, overcommit 100 %).
make_cluster = partial(factories.make_cluster, cpu_cores=8, physical_mem_mb=4096, mem_free_mb=4096, reserved_mem_mb=0)


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = bus_settings.model_copy(
        update={
            "postgres_url": database,
            "redis_prefix": f"{bus_settings.redis_prefix}:loss-{uuid.uuid4().hex[:6]}",
            "resync_repeat_s": 0.5,
        }
    )
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", bus=buses):
        yield cfg


async def forget_everything(cfg: Settings) -> None:
    """What a Redis restart without persistence does to this module's keys."""
    redis = connect_redis(cfg)
    try:
        async for key in redis.scan_iter(match=f"{cfg.redis_prefix}:*", count=1000):
            await redis.delete(key)
    finally:
        await redis.aclose()


def request(cluster: str, vm_id: str, mem_mb: int = 1024) -> ScheduleRequest:
    return ScheduleRequest(
        request_id=uuid.uuid4(), cluster_id=cluster, vm=factories.vm_spec(vm_id, mem_mb=mem_mb, vcpus=1)
    )


async def place_and_run(client: SchedulerClient, req: ScheduleRequest) -> ScheduleDecision:
    """Schedule, and report the VM running where it was placed, as an engine does."""
    d = await client.send(req)
    assert d.status is DecisionStatus.PLACED, d
    assert d.host_id is not None
    await client.report_vm(
        factories.vm_report(req.cluster_id, req.vm.vm_id, host_id=d.host_id, mem_mb=req.vm.mem_mb, vcpus=1)
    )
    return d


class Asked:
    """The engine's side: vmsched's resync requests for one cluster, subscribed from creation on."""

    def __init__(self, client: SchedulerClient, cluster: str) -> None:
        self.queue: asyncio.Queue[ResyncRequested] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(client, cluster))

    async def _run(self, client: SchedulerClient, cluster: str) -> None:
        async for r in client.resync_requests(cluster):
            await self.queue.put(r)

    @classmethod
    async def start(cls, client: SchedulerClient, cluster: str) -> Asked:
        asked = cls(client, cluster)
        await asyncio.sleep(0.2)  # subscribed before anything is published
        return asked

    async def next(self, timeout: float = 10.0) -> ResyncRequested:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def report_in_full(
    client: SchedulerClient, cluster: str, hosts: list[str], vms: dict[str, str], generation: int
) -> None:
    """The engine's full report: cluster, every host, every VM holding resources, then the count."""
    await client.report_cluster(ClusterReport(cluster_id=cluster))
    for h in hosts:
        await client.report_host(
            factories.host_report(cluster, h, cpu_cores=8, physical_mem_mb=4096, mem_free_mb=4096, reserved_mem_mb=0)
        )
    for vm, host in vms.items():
        await client.report_vm(factories.vm_report(cluster, vm, host_id=host, mem_mb=1024, vcpus=1))
    await client.resync_complete(cluster, generation, hosts=len(hosts), vms=len(vms))


async def decided(client: SchedulerClient, req: ScheduleRequest, timeout: float = 15.0) -> ScheduleDecision:
    """The request's decision once the cluster is no longer resyncing (retried as an engine does)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        d = await client.send(req)
        if d.error is None or d.error.code != "state_resyncing" or loop.time() > end:
            return d
        await asyncio.sleep(0.1)


async def test_after_a_loss_the_cluster_waits_for_the_full_report_and_nothing_is_placed_twice(
    stack: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"loss-{unique}"
    async with buses.client(stack) as client:
        hosts = await make_cluster(client, cluster, 2)
        asked_for = await Asked.start(client, cluster)
        before = [request(cluster, f"vm{i}-{unique}") for i in range(3)]
        placed = {req.vm.vm_id: (await place_and_run(client, req)).host_id for req in before}
        tokens = [(await client.send(req)).fencing_token for req in before]
        version_before = (await client.state(cluster)).version

        await forget_everything(stack)
        # The first request after the loss finds it: a new generation, and the engine is asked.
        d = await client.send(request(cluster, f"new-{unique}"))
        assert d.status is DecisionStatus.ERROR
        assert d.error is not None
        assert d.error.code == "state_resyncing"
        asked = await asked_for.next()
        assert asked.generation == 1
        assert "starting" in asked.full_report
        assert "migrating" in asked.full_report
        # Still refused while the engine has not reported in full; asked again meanwhile.
        assert (await asked_for.next()).generation == 1
        d = await client.send(request(cluster, f"new2-{unique}"))
        assert d.error is not None
        assert d.error.code == "state_resyncing"

        await report_in_full(client, cluster, hosts, {vm: h for vm, h in placed.items() if h is not None}, 1)
        # A replay of a request decided before the loss: its VM runs, so it is not placed again.
        replay = await decided(client, before[0])
        assert replay.status is DecisionStatus.ERROR, replay
        assert replay.error is not None, replay
        assert replay.error.code == "decision_lost"
        assert str(placed[before[0].vm.vm_id]) in replay.error.message
        # Requests are decided again, on the whole picture: 3 VMs run on 2 hosts with room for 6,
        # so 3 more fit and the 4th does not.
        after = [await decided(client, request(cluster, f"after{i}-{unique}")) for i in range(4)]
        assert [d.status for d in after] == [DecisionStatus.PLACED] * 3 + [DecisionStatus.UNPLACEABLE]
        new_tokens = [d.fencing_token for d in after[:3]]
        assert min(new_tokens) > max(tokens)
        assert all(generation_of(t) == 1 for t in new_tokens)
        state = await client.state(cluster)
        assert state.version > version_before
        assert generation_of(state.version) == 1
        on_hosts = Counter([*placed.values(), *(d.host_id for d in after[:3])])
        assert sorted(on_hosts.values()) == [3, 3]
        await asked_for.close()


async def test_a_holder_from_before_the_loss_is_fenced_out_after_it(stack: Settings, unique: str) -> None:
    cluster = f"stale-{unique}"
    redis = connect_redis(stack)
    pool = await connect_pg(stack.postgres_url)
    try:
        recovery = Recovery(GenerationMarkers(redis, stack), _pool_of(pool), None, found_by="test")
        locks = ClusterLock(redis, stack, recover=recovery)
        stale = await locks.acquire(cluster)  # a first-seen cluster: generation 0, no resync
        assert generation_of(stale.token) == 0
        await forget_everything(stack)
        # The lock is free again (Redis forgot it); whoever comes next finds the loss.
        with pytest.raises(GenerationLost):
            await ClusterLock(redis, stack).acquire(cluster)
        await recovery(cluster)
        assert await GenerationMarkers(redis, stack).resync_generation(cluster) == 1
        # Even a token equal in counter to the old one cannot pass: the fence is of generation 1.
        await redis.set(Keys.from_settings(stack).fence(cluster), STAMP_SPAN + stale.token)
        entry = factories.pending_entry("vm-stale", "h1", stale.token)
        with pytest.raises(FencedOut):
            await PendingStore(redis, stack).record(cluster, [entry], stale.token)
        assert await PendingStore(redis, stack).read(cluster) == []
    finally:
        await pool.close()
        await redis.aclose()


async def test_a_marker_from_another_server_run_counts_as_a_loss(stack: Settings, unique: str) -> None:
    """A failover to a replica: the marker replicated, but it names the old primary's run."""
    cluster = f"failover-{unique}"
    redis = connect_redis(stack)
    pool = await connect_pg(stack.postgres_url)
    try:
        markers = GenerationMarkers(redis, stack)
        await GenerationLedger(pool, stack.redis_prefix).advance(cluster)  # known to PostgreSQL: generation 0
        await markers.install(cluster, 0, resync=False)
        assert (await markers.read(cluster)).generation == 0
        await redis.set(Keys.from_settings(stack).generation(cluster), "0 " + "ab" * 20)
        assert (await markers.read(cluster)).generation is None
        recovery = Recovery(markers, _pool_of(pool), None, found_by="test")
        await recovery(cluster)
        marker = await markers.read(cluster)
        assert (marker.generation, marker.resyncing) == (1, True)
    finally:
        await pool.close()
        await redis.aclose()


async def test_a_cached_table_of_an_earlier_generation_is_never_served(
    stack: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"cache-{unique}"
    async with buses.client(stack) as client:
        hosts = await make_cluster(client, cluster, 2)
        redis = connect_redis(stack)
        try:
            cache = StateCache(redis, stack)
            old_version, old_table = await cache.table(cluster)
            assert sorted(old_table.ids) == sorted(hosts)
            asked_for = await Asked.start(client, cluster)
            await forget_everything(stack)
            d = await client.send(request(cluster, "probe"))
            assert d.error is not None
            assert d.error.code == "state_resyncing"
            await report_in_full(client, cluster, hosts[:1], {}, (await asked_for.next()).generation)
            await asked_for.close()
            await _wait_whole(redis, stack, cluster)
            current = await cache.version(cluster)
            assert current > old_version  # every version of the new generation is newer
            version, table = await cache.table(cluster, min_version=current)
            assert generation_of(version) == 1
            assert list(table.ids) == hosts[:1]
        finally:
            await redis.aclose()


async def _wait_whole(redis: aioredis.Redis, cfg: Settings, cluster: str, timeout: float = 10.0) -> None:
    markers = GenerationMarkers(redis, cfg)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while (await markers.read(cluster)).resyncing:
        assert loop.time() < end, "the resync never completed"
        await asyncio.sleep(0.05)


def _pool_of(pool: object) -> Callable[[], Awaitable[object]]:
    async def source() -> object:
        return pool

    return source


async def test_the_engine_owes_nothing_for_a_cluster_seen_for_the_first_time(
    stack: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"fresh-{unique}"
    async with buses.client(stack) as client:
        await make_cluster(client, cluster, 1)
        d = await client.send(request(cluster, f"vm-{unique}"))
        assert d.status is DecisionStatus.PLACED
        assert generation_of(d.fencing_token) == 0
        assert (await client.state(cluster)).version < STAMP_SPAN
