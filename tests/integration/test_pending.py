"""Pending-resource records against a real Redis: fencing, clear-once, expiry, change waits."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, pending_entry
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore

pytestmark = pytest.mark.integration


@pytest.fixture
def pending(redis_client: aioredis.Redis, settings: Settings) -> PendingStore:
    return PendingStore(redis_client, settings)


@pytest.fixture
def locks(redis_client: aioredis.Redis, settings: Settings) -> ClusterLock:
    return ClusterLock(redis_client, settings, recover=first_generation(redis_client, settings))


async def test_record_and_read(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    assert await pending.version(cluster) == 0
    assert await pending.read(cluster) == []
    async with locks.hold(cluster) as lease:
        entries = [pending_entry("vm-b", "h1", lease.token), pending_entry("vm-a", "h2", lease.token)]
        version = await pending.record(cluster, entries, lease.token)
    assert version == 1 == await pending.version(cluster)
    got = await pending.read(cluster)
    assert got == sorted(entries, key=lambda e: e.vm_id)


async def test_record_replaces_a_vms_record(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as first:
        await pending.record(cluster, [pending_entry("vm-1", "h1", first.token)], first.token)
    async with locks.hold(cluster) as second:
        await pending.record(cluster, [pending_entry("vm-1", "h2", second.token)], second.token)
    [only] = await pending.read(cluster)
    assert (only.host_id, only.fencing_token) == ("h2", second.token)


async def test_record_refused_without_the_latest_token(
    pending: PendingStore, locks: ClusterLock, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    with pytest.raises(FencedOut):  # no lock was ever taken: no token is current
        await pending.record(cluster, [pending_entry("vm-1", "h1", 1)], 1)
    async with locks.hold(cluster) as old:
        pass
    async with locks.hold(cluster) as new:
        with pytest.raises(FencedOut, match=str(new.token)):
            await pending.record(cluster, [pending_entry("vm-1", "h1", old.token)], old.token)
    assert await pending.version(cluster) == 0
    assert not await redis_client.exists(Keys(settings.redis_prefix).pending(cluster))


async def test_entries_must_carry_the_token(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        with pytest.raises(ValueError, match="carries token"):
            await pending.record(cluster, [pending_entry("vm-1", "h1", lease.token + 7)], lease.token)


async def test_key_level_expiry_is_a_safety_net(
    pending: PendingStore, locks: ClusterLock, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    key = Keys(settings.redis_prefix).pending(cluster)
    async with locks.hold(cluster) as lease:
        await pending.record(cluster, [pending_entry("vm-long", "h1", lease.token, ttl=600)], lease.token)
        long_ttl = await redis_client.pttl(key)
        assert long_ttl > 600_000
        # A shorter-lived entry never shortens the key's expiry below the longer one's.
        await pending.record(cluster, [pending_entry("vm-short", "h1", lease.token, ttl=5)], lease.token)
        assert await redis_client.pttl(key) > 600_000


async def test_clear_is_true_exactly_once(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        await pending.record(
            cluster, [pending_entry("vm-1", "h1", lease.token), pending_entry("vm-2", "h1", lease.token)], lease.token
        )
    before = await pending.version(cluster)
    results = await asyncio.gather(*(pending.clear(cluster, "vm-1") for _ in range(25)))
    assert results.count(True) == 1
    assert await pending.version(cluster) == before + 1
    assert [e.vm_id for e in await pending.read(cluster)] == ["vm-2"]
    assert await pending.clear(cluster, "vm-unknown") is False
    assert await pending.version(cluster) == before + 1


async def test_take_removes_many_records_in_one_change(
    pending: PendingStore, locks: ClusterLock, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    """The state tracker's settle of a batch: each VM's record as `get` read it, all removed, the
    version moved once; VMs without one are left out; an unreadable record goes as None."""
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        kept = pending_entry("vm-3", "h2", lease.token)
        entries = [pending_entry("vm-1", "h1", lease.token), pending_entry("vm-2", "h2", lease.token), kept]
        await pending.record(cluster, entries, lease.token)
    await redis_client.hset(Keys.from_settings(settings).pending(cluster), "vm-bad", b"{not json")
    before = await pending.version(cluster)
    taken = await pending.take(cluster, ["vm-2", "vm-unknown", "vm-1", "vm-bad", "vm-1"])
    assert taken == {"vm-2": entries[1], "vm-1": entries[0], "vm-bad": None}
    assert await pending.version(cluster) == before + 1
    assert await pending.read(cluster) == [kept]
    assert await pending.take(cluster, ["vm-1", "vm-unknown"]) == {}
    assert await pending.version(cluster) == before + 1  # nothing removed: no change
    assert await pending.take(cluster, []) == {}


async def test_clear_on_host_only_clears_that_host(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        await pending.record(cluster, [pending_entry("vm-1", "h1", lease.token)], lease.token)
    # Running on another host than the one it was placed on: not this record's confirmation.
    assert await pending.clear(cluster, "vm-1", host_id="h2") is False
    assert len(await pending.read(cluster)) == 1
    assert await pending.clear(cluster, "vm-1", host_id="h1") is True
    assert await pending.read(cluster) == []


async def test_expired_entries_are_dropped_on_read(
    pending: PendingStore, locks: ClusterLock, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        await pending.record(
            cluster,
            [pending_entry("vm-soon", "h1", lease.token, ttl=10), pending_entry("vm-late", "h1", lease.token, ttl=100)],
            lease.token,
        )
    before = await pending.version(cluster)
    key = Keys(settings.redis_prefix).pending(cluster)

    # Read "later" instead of sleeping: the first entry has expired by then.
    version, live = await pending.snapshot(cluster, now=time.time() + 50)
    assert [e.vm_id for e in live] == ["vm-late"]
    assert await redis_client.hkeys(key) == [b"vm-late"]  # dropped from Redis, not just filtered
    assert version == before + 1 == await pending.version(cluster)
    assert await pending.clear(cluster, "vm-soon") is False  # already gone: cleared once only

    assert await pending.read(cluster, now=time.time() + 500) == []
    assert await redis_client.hlen(key) == 0


async def test_unreadable_record_is_dropped(
    pending: PendingStore, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    await redis_client.hset(Keys(settings.redis_prefix).pending(cluster), "vm-x", b"{not json")
    assert await pending.read(cluster) == []
    assert await redis_client.hlen(Keys(settings.redis_prefix).pending(cluster)) == 0


async def test_wait_for_change(pending: PendingStore, locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        await pending.record(cluster, [pending_entry("vm-1", "h1", lease.token)], lease.token)
    since = await pending.version(cluster)

    assert await pending.wait_for_change(cluster, since, 0.05) is False
    assert await pending.wait_for_change(cluster, since - 1, 0.05) is True

    async def confirm_later() -> None:
        await asyncio.sleep(0.05)
        await pending.clear(cluster, "vm-1", host_id="h1")

    task = asyncio.create_task(confirm_later())
    assert await pending.wait_for_change(cluster, since, 5.0) is True
    await task
    assert await pending.version(cluster) == since + 1


async def test_snapshot_with_state_reads_the_state_version_with_the_records(
    pending: PendingStore, locks: ClusterLock, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    assert await pending.snapshot_with_state(cluster) == (0, [], None)  # no state ever written
    async with locks.hold(cluster) as lease:
        entries = [pending_entry("vm-a", "h1", lease.token)]
        await pending.record(cluster, entries, lease.token)
    await redis_client.set(Keys(settings.redis_prefix).state_version(cluster), 41)
    version, live, state_version = await pending.snapshot_with_state(cluster)
    assert (version, live) == await pending.snapshot(cluster)
    assert live == entries
    assert state_version == 41
