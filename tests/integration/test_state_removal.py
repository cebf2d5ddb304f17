"""Removing hosts and clusters on a real Redis: the writer's one new version per removal, the
workers' caches dropping what was removed when they catch up, and a removed cluster that comes
back never reusing a version a cache may still hold."""

from __future__ import annotations

import json
from functools import partial
from typing import cast

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, host_report, vm_report
from vmsched.contracts import HostStatus
from vmsched.errors import UnknownCluster
from vmsched.settings import Settings
from vmsched.store import Keys, StateCache, StateWriter

pytestmark = pytest.mark.integration

host = partial(host_report, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000)
vm = partial(vm_report, mem_mb=1000, overhead_mb=24, vcpus=2)


@pytest.fixture
def writer(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> StateWriter:
    return StateWriter(redis_client, settings, keys=keys, recover=first_generation(redis_client, settings, keys=keys))


@pytest.fixture
def cache(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> StateCache:
    return StateCache(redis_client, settings, keys=keys, stale_wait_s=0.2)


async def test_removed_hosts_go_in_one_version_and_caches_drop_them_incrementally(
    writer: StateWriter, cache: StateCache, redis_client: aioredis.Redis, keys: Keys, settings: Settings
) -> None:
    c = "c1"
    for h in ("h1", "h2", "h3"):
        await writer.apply_host(host(c, h))
    await writer.apply_vm(vm(c, "vm-1", "h2"))
    await writer.apply_vm(vm(c, "vm-2", "h3"))
    version, table = await cache.table(c)
    assert (version, table.ids) == (5, ("h1", "h2", "h3"))

    assert await writer.remove_hosts(c, ["h2", "not-there"]) == 6
    counts = writer.host_counts(c)
    assert counts is not None
    assert counts[HostStatus.UP] == 2  # the hosts gauge follows
    assert sorted(await redis_client.hkeys(keys.state_hosts(c))) == [b"h1", b"h3"]
    assert await redis_client.hkeys(keys.state_vms(c)) == [b"vm-2"]  # vm-1 was counted on h2
    [(entry_id, fields)] = cast(
        list[tuple[bytes, dict[bytes, bytes]]], await redis_client.xrevrange(keys.state_changes(c), count=1)
    )
    assert entry_id == b"6-0"
    assert (json.loads(fields[b"hosts"]), fields[b"kind"]) == (["h2"], b"host-removed")

    version, table = await cache.table(c)
    assert (version, table.ids) == (6, ("h1", "h3"))
    assert cache.stats.full_loads == 1  # caught up from the change stream
    assert cache.stats.incremental_loads == 1
    snapshot = await cache.snapshot(c)
    assert [v.vm_id for v in snapshot.vms] == ["vm-2"]
    assert writer.snapshot(c) == snapshot

    # Nothing to remove: no version, no change entry.
    assert await writer.remove_hosts(c, ["h2"]) == 6
    assert await redis_client.xlen(keys.state_changes(c)) == 6

    # A restarted tracker loads the cluster without the host; the host reporting again is back.
    restarted = StateWriter(
        redis_client, settings, keys=keys, recover=first_generation(redis_client, settings, keys=keys)
    )
    assert await restarted.load([c]) == [c]
    assert restarted.snapshot(c) == snapshot
    assert await restarted.apply_host(host(c, "h2")) == 7
    _, table = await cache.table(c)
    assert table.ids == ("h1", "h2", "h3")
    assert cache.stats.full_loads == 1


async def test_a_removed_cluster_is_unknown_and_its_versions_go_on_when_it_comes_back(
    writer: StateWriter,
    cache: StateCache,
    redis_client: aioredis.Redis,
    keys: Keys,
    settings: Settings,
) -> None:
    c = "c1"
    for h in ("h1", "h2"):
        await writer.apply_host(host(c, h))
    await writer.apply_vm(vm(c, "vm-1", "h1"))
    assert (await cache.table(c))[0] == 3
    idle = StateCache(redis_client, settings, keys=keys)  # a worker that will not ask meanwhile
    assert (await idle.table(c))[1].ids == ("h1", "h2")

    assert await writer.remove_cluster(c) == 3
    for key in (keys.state_version(c), keys.state_hosts(c), keys.state_vms(c), keys.state_changes(c)):
        assert not await redis_client.exists(key)
    assert c not in await cache.clusters()
    with pytest.raises(UnknownCluster):
        await cache.table(c)
    with pytest.raises(UnknownCluster):
        await cache.table(c, min_version=1)
    assert await writer.remove_cluster(c) == 0  # twice is harmless
    assert await writer.remove_hosts(c, ["h1"]) == 4  # nothing there: nothing written
    assert not await redis_client.exists(keys.state_version(c))

    # Reported again with other hosts: its versions go on past the old ones, so the idle worker's
    # copy (version 3) cannot pass for the new state, whichever way it is asked.
    assert await writer.apply_host(host(c, "h9")) == 5
    version, table = await idle.table(c, min_version=5)
    assert (version, table.ids) == (5, ("h9",))
    assert c in await cache.clusters()
    restarted = StateWriter(
        redis_client, settings, keys=keys, recover=first_generation(redis_client, settings, keys=keys)
    )
    await restarted.load([c])
    assert restarted.version(c) == 5
    assert [h.report.host_id for h in (await cache.snapshot(c)).hosts] == ["h9"]


async def test_removing_hosts_of_an_unknown_cluster_writes_nothing(
    writer: StateWriter, redis_client: aioredis.Redis, keys: Keys
) -> None:
    assert await writer.remove_hosts("nowhere", ["h1"]) == 0
    assert await redis_client.exists(keys.state_version("nowhere"), keys.state_changes("nowhere")) == 0
    assert writer.snapshot("nowhere") is None
