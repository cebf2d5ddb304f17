"""A group's reads in one round trip on a real Redis: what the pending snapshot, the stored records
and the state cache's catch-up return side by side, for one command; the cache then needs nothing
more from Redis; a server without the scripts loaded is read the usual way (which loads them), and
a catch-up that another caller overtook is dropped, not applied over the newer copy."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, host_report, pending_entry, schedule_decision, vm_report
from vmsched.settings import Settings
from vmsched.store import DecisionStore, Keys, PendingStore, StateCache, StateWriter
from vmsched.store.group_reads import GroupReads

pytestmark = pytest.mark.integration

TOKEN = 7


def _own(settings: Settings) -> Settings:
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}:gr-{uuid.uuid4().hex[:8]}"})


async def _cluster(redis: aioredis.Redis, cfg: Settings, cluster: str) -> StateWriter:
    """Three hosts, a VM on one, a pending record, and one decision stored."""
    writer = StateWriter(redis, cfg, recover=first_generation(redis, cfg))
    for h in ("h0", "h1", "h2"):
        await writer.apply_host(host_report(cluster, h, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000))
    await writer.apply_vm(vm_report(cluster, "vm-0", "h0", mem_mb=512, vcpus=1))
    await redis.set(Keys.from_settings(cfg).fence(cluster), TOKEN)
    await PendingStore(redis, cfg).record(cluster, [pending_entry("vm-p", "h1", TOKEN, expires_at=2e9)], TOKEN)
    return writer


async def test_one_round_trip_reads_what_the_reads_side_by_side_read(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings
) -> None:
    redis, sent = counted
    cfg, cluster = _own(settings), f"c-{uuid.uuid4().hex[:6]}"
    writer = await _cluster(redis, cfg, cluster)
    decisions, pending, cache = DecisionStore(redis, cfg), PendingStore(redis, cfg), StateCache(redis, cfg)
    decided, fresh = uuid.uuid4(), uuid.uuid4()
    await decisions.put(schedule_decision(cluster, decided, "h2"), fingerprint="fp", token=TOKEN)
    await cache.table(cluster)  # cached at this version
    await writer.apply_vm(vm_report(cluster, "vm-1", "h2", mem_mb=1024, vcpus=2))  # the cache falls behind
    reads = GroupReads(redis, pending, decisions, cache)
    await reads.read(cluster, [decided])  # scripts loaded on this server

    await writer.apply_vm(vm_report(cluster, "vm-2", "h1", mem_mb=256, vcpus=1))
    sent.clear()
    got = await reads.read(cluster, [decided, fresh])
    assert sent == ["MULTI"], sent  # the transaction goes as one write
    version, table = await cache.table(cluster, min_version=got.state_version or 0)
    assert sent == ["MULTI"], sent  # caught up already: nothing more to read

    assert (got.pending_version, got.pending, got.state_version) == await pending.snapshot_with_state(cluster)
    assert got.records == await decisions.records(cluster, [decided, fresh])
    assert got.records[1] is None
    assert version == got.state_version == writer.version(cluster)
    fresh_version, fresh_table = await StateCache(redis, cfg).table(cluster)  # a full load
    assert version == fresh_version
    assert table.ids == fresh_table.ids
    for name in ("mem_free_mb", "vm_count", "cpu_cores"):
        assert getattr(table, name).tolist() == getattr(fresh_table, name).tolist(), name


async def test_a_server_without_the_scripts_is_read_the_usual_way_then_in_one_round_trip_again(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings
) -> None:
    redis, sent = counted
    cfg, cluster = _own(settings), f"c-{uuid.uuid4().hex[:6]}"
    await _cluster(redis, cfg, cluster)
    decisions, pending, cache = DecisionStore(redis, cfg), PendingStore(redis, cfg), StateCache(redis, cfg)
    rid = uuid.uuid4()
    await decisions.put(schedule_decision(cluster, rid, "h0"), fingerprint="fp", token=TOKEN)
    await cache.table(cluster)
    reads = GroupReads(redis, pending, decisions, cache)
    await redis.script_flush()
    sent.clear()
    got = await reads.read(cluster, [rid])
    assert sent == ["MULTI", "SCRIPT", "SCRIPT", "MULTI"], sent
    assert got.records == await decisions.records(cluster, [rid])
    assert (got.pending_version, got.pending, got.state_version) == await pending.snapshot_with_state(cluster)
    sent.clear()
    await reads.read(cluster, [rid])
    assert sent == ["MULTI"], sent
    await redis.script_flush()
    sent.clear()
    await reads.read(cluster, [rid])
    assert sent == ["MULTI", "SCRIPT", "SCRIPT", "MULTI"], sent  # loaded, then read again


async def test_a_catch_up_overtaken_by_another_caller_is_dropped(
    redis_client: aioredis.Redis, settings: Settings
) -> None:
    cfg, cluster = _own(settings), f"c-{uuid.uuid4().hex[:6]}"
    writer = await _cluster(redis_client, cfg, cluster)
    cache = StateCache(redis_client, cfg)
    await cache.table(cluster)
    await writer.apply_vm(vm_report(cluster, "vm-1", "h2", mem_mb=1024, vcpus=2))
    async with redis_client.pipeline(transaction=True) as pipe:
        since = cache.catch_up_into(pipe, cluster)
        [stale] = await pipe.execute()
    assert since is not None
    await writer.apply_vm(vm_report(cluster, "vm-2", "h1", mem_mb=256, vcpus=1))
    newer, _ = await cache.table(cluster, min_version=writer.version(cluster))  # another caller catches up
    cache.catch_up_from(cluster, since, stale)
    assert (await cache.table(cluster, min_version=1))[0] == newer == writer.version(cluster)
