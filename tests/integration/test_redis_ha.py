"""The scheduling path's Redis stores over Sentinel and over a 3-master Redis Cluster (private servers).

Redis Cluster refuses a script, a transaction or an MGET whose keys are in two slots, so these tests
fail if any store names keys of two slots together; over Sentinel they show the client finds the
master through the sentinels and follows it after a failover.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from tests.factories import first_generation, host_report, pending_entry, schedule_decision
from vmsched.contracts import ClusterReport
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import (
    ClusterLock,
    DecisionStore,
    FailedHosts,
    Keys,
    MigrationCooldowns,
    PendingStore,
    StateCache,
    StateWriter,
    UnitCatalogues,
    connect,
)
from vmsched_services.tools.demo import forget_clusters
from vmsched_services.tools.servers.redis import PrivateRedisCluster, SentinelGroup

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["sentinel", "cluster"])
async def ha_settings(
    request: pytest.FixtureRequest, settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Settings]:
    """The run's settings pointed at private servers: through three sentinels, or at a Redis Cluster."""
    directory: Path = tmp_path_factory.mktemp(f"redis-{request.param}")
    servers: SentinelGroup | PrivateRedisCluster = (
        SentinelGroup(directory) if request.param == "sentinel" else PrivateRedisCluster(directory)
    )
    async with servers:
        yield settings.model_copy(update=servers.settings_update())


@pytest.fixture
async def ha_redis(ha_settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = connect(ha_settings)
    yield client
    await client.aclose()


async def _all_keys(redis: aioredis.Redis, match: str) -> set[bytes]:
    return {k async for k in redis.scan_iter(match=match, count=1000)}


async def test_connect_builds_the_client_the_settings_name(ha_settings: Settings, ha_redis: aioredis.Redis) -> None:
    assert isinstance(ha_redis, RedisCluster) == ha_settings.redis_cluster
    assert await ha_redis.ping()


async def test_lock_fenced_pending_decisions_and_state_work_end_to_end(
    ha_settings: Settings, ha_redis: aioredis.Redis, unique: str
) -> None:
    cluster = f"ha-{unique}"
    writer, cache = (
        StateWriter(ha_redis, ha_settings, recover=first_generation(ha_redis, ha_settings)),
        StateCache(ha_redis, ha_settings),
    )
    await writer.apply_cluster(ClusterReport(cluster_id=cluster))
    await writer.apply_host(host_report(cluster, "h1", cpu_cores=8, physical_mem_mb=16384, mem_free_mb=16384))
    version, table = await cache.table(cluster)
    assert version == 2
    assert table.ids == ("h1",)
    assert cluster in await cache.clusters()

    locks, pending, decisions = (
        ClusterLock(ha_redis, ha_settings, recover=first_generation(ha_redis, ha_settings)),
        PendingStore(ha_redis, ha_settings),
        DecisionStore(ha_redis, ha_settings),
    )
    async with locks.hold(cluster) as old:
        stale = old.token
    async with locks.hold(cluster) as lease:
        assert lease.token == stale + 1
        with pytest.raises(FencedOut):
            await pending.record(cluster, [pending_entry("vm-stale", "h1", stale)], stale)
        await pending.record(cluster, [pending_entry("vm-1", "h1", lease.token)], lease.token)
        one, two = schedule_decision(cluster), schedule_decision(cluster)
        stored = await decisions.put_many([(one, "fp"), (two, "fp")], token=lease.token)
        assert [created for created, _ in stored] == [True, True]
        created, _ = await decisions.put(schedule_decision(cluster), fingerprint="fp", token=lease.token)
        assert created
        with pytest.raises(FencedOut):
            await decisions.put(schedule_decision(cluster), fingerprint="fp", token=stale)

    _, entries, state_version = await pending.snapshot_with_state(cluster)
    assert [e.vm_id for e in entries] == ["vm-1"]
    assert state_version == 2
    assert await pending.clear(cluster, "vm-1", "h1")
    records = await decisions.records(cluster, [one.request_id, two.request_id, uuid.uuid4()])
    assert [r.decision if r else None for r in records] == [one, two, None]
    assert await decisions.mark_published_many(cluster, [one.request_id, two.request_id]) == [True, True]
    assert len(await decisions.recent(cluster, 10)) == 3


async def test_reads_over_many_clusters_and_the_shared_keys_work(
    ha_settings: Settings, ha_redis: aioredis.Redis, unique: str
) -> None:
    clusters = [f"ha-{unique}-{i}" for i in range(6)]  # spread over the masters' slots
    locks, pending = (
        ClusterLock(ha_redis, ha_settings, recover=first_generation(ha_redis, ha_settings)),
        PendingStore(ha_redis, ha_settings),
    )
    for i, cid in enumerate(clusters):
        lease = await locks.acquire(cid)
        await pending.record(cid, [pending_entry(f"vm-{j}", "h1", lease.token) for j in range(i)], lease.token)
        await locks.release(lease)
    assert await pending.counts(clusters) == {cid: i for i, cid in enumerate(clusters)}

    cooldowns = MigrationCooldowns(ha_redis, ha_settings)
    await cooldowns.start(clusters[0], "vm-1", "d1")
    assert await cooldowns.resting(clusters[0], ["vm-1", "vm-2"]) == {"vm-1"}
    failed = FailedHosts(ha_redis, ha_settings)
    await failed.remember(clusters[0], "vm-1", "h9")
    assert await failed.of(clusters[0], "vm-1") == {"h9"}

    catalogues = UnitCatalogues(ha_redis, ha_settings, keys=Keys(f"{ha_settings.redis_prefix}:units-{unique}"))
    await catalogues.announce("weigher", "a", {"RAM": "builtin"})
    await catalogues.announce("weigher", "b", {"RAM": "builtin"})
    assert [a.instance for a in await catalogues.instances()] == ["a", "b"]
    await catalogues.withdraw("weigher", "a")
    assert [a.instance for a in await catalogues.instances()] == ["b"]


async def test_forgetting_a_cluster_leaves_none_of_its_keys(
    ha_settings: Settings, ha_redis: aioredis.Redis, unique: str
) -> None:
    cluster = f"ha-{unique}"
    await StateWriter(ha_redis, ha_settings, recover=first_generation(ha_redis, ha_settings)).apply_cluster(
        ClusterReport(cluster_id=cluster)
    )
    lease = await ClusterLock(ha_redis, ha_settings, recover=first_generation(ha_redis, ha_settings)).acquire(cluster)
    await PendingStore(ha_redis, ha_settings).record(cluster, [pending_entry("vm-1", "h1", lease.token)], lease.token)
    await MigrationCooldowns(ha_redis, ha_settings).start(cluster, "vm-1", "d1")
    match = f"{ha_settings.redis_prefix}:*{{{cluster}}}*"
    assert len(await _all_keys(ha_redis, match)) >= 6

    await forget_clusters(ha_settings, [cluster])
    assert await _all_keys(ha_redis, match) == set()
    assert cluster not in await StateCache(ha_redis, ha_settings).clusters()
