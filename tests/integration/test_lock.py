"""The per-cluster lock against a real Redis: exclusion, fencing tokens, both timeouts."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, pending_entry
from vmsched.errors import FencedOut, LockTimeout
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore

pytestmark = pytest.mark.integration


@pytest.fixture
def lock_settings(settings: Settings) -> Settings:
    # Timeouts far above what a busy machine needs: the tests that are about a timeout pass their own.
    return settings.model_copy(update={"lock_acquire_timeout_s": 10.0, "lock_hold_timeout_s": 10.0})


@pytest.fixture
def locks(redis_client: aioredis.Redis, lock_settings: Settings) -> ClusterLock:
    return ClusterLock(redis_client, lock_settings, recover=first_generation(redis_client, lock_settings))


async def test_mutual_exclusion_and_increasing_tokens(locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    inside = 0
    overlaps = 0
    tokens_in_entry_order: list[int] = []

    async def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(5):
            async with locks.hold(cluster) as lease:
                inside += 1
                if inside > 1:
                    overlaps += 1
                tokens_in_entry_order.append(lease.token)
                # Yield inside the critical section so other tasks really run meanwhile.
                await asyncio.sleep(random.uniform(0, 0.002))
                inside -= 1

    await asyncio.gather(*(worker() for _ in range(40)))

    assert overlaps == 0
    assert len(tokens_in_entry_order) == 200
    assert all(a < b for a, b in itertools.pairwise(tokens_in_entry_order))
    assert await locks.holder(cluster) is None
    assert await locks.current_token(cluster) == tokens_in_entry_order[-1]


async def test_each_acquisition_is_a_fresh_lease(locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as first:
        assert first.valid()
        assert 0 < first.remaining() <= locks.hold_timeout_s
        assert await locks.holder(cluster) == first.value
    assert not first.valid()
    async with locks.hold(cluster) as second:
        assert second is not first
        assert second.token == first.token + 1
        assert second.owner != first.owner
    assert await locks.release(second) is False  # releasing twice is harmless


async def test_acquire_timeout_raises_lock_timeout(locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        with pytest.raises(LockTimeout) as info:
            await locks.acquire(cluster, timeout_s=0.1)
        assert cluster in str(info.value)
        assert "0.100s" in str(info.value)
        # The failed waiter did not disturb the holder.
        assert await locks.holder(cluster) == lease.value


async def test_holders_in_one_process_get_the_lock_in_arrival_order(locks: ClusterLock, unique: str) -> None:
    cluster = f"fifo-{unique}"
    order: list[int] = []
    async with locks.hold(cluster):

        async def waiter(n: int) -> None:
            async with locks.hold(cluster):
                order.append(n)

        tasks = []
        for n in range(8):
            tasks.append(asyncio.create_task(waiter(n)))
            await asyncio.sleep(0)  # each reaches the queue before the next is created
    await asyncio.gather(*tasks)
    assert order == list(range(8))


async def test_waiting_in_the_process_queue_is_bounded_by_the_acquire_timeout(locks: ClusterLock, unique: str) -> None:
    cluster = f"queued-{unique}"
    async with locks.hold(cluster):
        begin = time.monotonic()
        with pytest.raises(LockTimeout, match="queued behind other requests"):
            async with locks.hold(cluster, timeout_s=0.2):
                pass
        # The regression this rules out waits until the holder leaves, which this one never does.
        assert time.monotonic() - begin < 5.0
    async with locks.hold(cluster, timeout_s=1.0):  # the timed-out waiter left the queue cleanly
        pass


async def test_other_clusters_are_independent(locks: ClusterLock, unique: str) -> None:
    async with locks.hold(f"a-{unique}"):
        lease = await locks.acquire(f"b-{unique}", timeout_s=2.0)  # a's 10 s hold would time it out
        assert await locks.release(lease)


async def test_hold_timeout_expiry_lets_another_acquire(locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    stalled = await locks.acquire(cluster, hold_s=0.2)
    # Not released: the next acquirer gets the lock once the hold time has passed.
    fresh = await locks.acquire(cluster, timeout_s=10.0)
    assert fresh.token > stalled.token
    assert not stalled.valid()
    # The stalled holder's late release must not delete the new holder's lock.
    assert await locks.release(stalled) is False
    assert await locks.holder(cluster) == fresh.value
    assert await locks.extend(stalled) is False
    assert await locks.extend(fresh, 1.0) is True
    assert await locks.release(fresh) is True


async def test_stalled_holder_write_is_fenced_out(
    locks: ClusterLock, redis_client: aioredis.Redis, lock_settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    pending = PendingStore(redis_client, lock_settings)
    stalled = await locks.acquire(cluster, hold_s=0.2)
    await asyncio.sleep(0.3)  # the holder stalls past its hold time ...
    async with locks.hold(cluster) as fresh:  # ... and another scheduler takes the lock
        before = await pending.version(cluster)
        with pytest.raises(FencedOut):
            await pending.record(cluster, [pending_entry("vm-stale", "h1", stalled.token)], stalled.token)
        assert await pending.read(cluster) == []
        assert await pending.version(cluster) == before
        assert not await redis_client.exists(Keys(lock_settings.redis_prefix).pending(cluster))

        await pending.record(cluster, [pending_entry("vm-fresh", "h1", fresh.token)], fresh.token)
        assert [e.vm_id for e in await pending.read(cluster)] == ["vm-fresh"]


async def test_acquire_script_is_idempotent_for_one_attempt(locks: ClusterLock, unique: str) -> None:
    """redis-py retries a command whose reply a dropped connection lost: running the acquire
    script twice for the same attempt must return the same lease, not wait on itself."""
    cluster = f"c-{unique}"
    lease = await locks.acquire(cluster)
    again, _ = await locks._attempt(cluster, lease.owner, 1.0, 0.0)
    assert again is not None
    assert again.token == lease.token
    assert await locks.current_token(cluster) == lease.token
    assert await locks.release(lease)


async def test_body_exception_propagates_and_releases(locks: ClusterLock, unique: str) -> None:
    cluster = f"c-{unique}"
    with pytest.raises(RuntimeError, match="boom"):
        async with locks.hold(cluster):
            raise RuntimeError("boom")
    assert await locks.holder(cluster) is None


async def test_cancelled_waiter_stops_waiting(
    redis_client: aioredis.Redis, lock_settings: Settings, unique: str
) -> None:
    """A cancel that lands while a waiter's Redis call is in flight must not be lost (Python 3.11's
    asyncio.wait_for, which redis-py sends through, can swallow it): the waiter stops at once
    instead of waiting on and taking the lock once the holder's time runs out."""
    # The holder keeps the lock for the whole loop however slow the machine (150 rounds can outlast a
    # 3 s hold timeout on a busy one, and a waiter would then rightly take it); a waiter whose cancel
    # was lost waits for its 30 s acquire timeout, so it is never done, let alone cancelled, within 10 s.
    locks = ClusterLock(
        redis_client,
        lock_settings.model_copy(update={"lock_hold_timeout_s": 120.0}),
        recover=first_generation(redis_client, lock_settings),
    )
    cluster = f"c-{unique}"
    async with locks.hold(cluster) as lease:
        for _ in range(150):
            waiter = asyncio.create_task(locks.acquire(cluster, timeout_s=30.0))
            await asyncio.sleep(random.uniform(0, 0.01))
            waiter.cancel()
            done, _ = await asyncio.wait({waiter}, timeout=10.0)
            assert waiter in done, "cancellation was lost: the waiter kept waiting"
            assert waiter.cancelled()
        assert await locks.holder(cluster) == lease.value
    assert await locks.holder(cluster) is None


async def test_cancelled_acquirer_never_leaves_the_lock_held(locks: ClusterLock, unique: str) -> None:
    """Cancelled between sending the acquire script and reading its reply, an acquirer must not
    leave behind a lock nobody will release."""
    for i in range(150):
        cluster = f"c-{unique}-{i}"
        acquirer = asyncio.create_task(locks.acquire(cluster))
        await asyncio.sleep(random.uniform(0, 0.0015))
        acquirer.cancel()
        await asyncio.wait({acquirer}, timeout=10.0)
        assert acquirer.done()
        if not acquirer.cancelled():
            await locks.release(acquirer.result())
        assert await locks.holder(cluster) is None
