"""The cluster lock as a short lease renewed by its live holder: a dead or frozen holder frees its
cluster within about one lease; a live one keeps it up to the hold timeout, and no further.

The dead and frozen holders are real OS processes (a small script taking the lock through the
library), killed with SIGKILL or frozen with SIGSTOP, against the real Redis.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, pending_entry
from vmsched.errors import FencedOut, LockTimeout
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore
from vmsched.store.lock import WATCHDOG_TASK_PREFIX
from vmsched_services.tools.procs import settings_env

pytestmark = pytest.mark.integration

#: The child: takes the cluster's lock with hold(), says so, waits for a line on stdin, then tries
#: a fenced pending write with its token and prints how that went.
HOLDER = """
import asyncio, sys, time, uuid
from vmsched.contracts import PendingEntry
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, PendingStore, connect
from tests.factories import first_generation

async def main() -> None:
    settings = Settings()
    redis = connect(settings)
    cluster = sys.argv[1]
    async with ClusterLock(redis, settings, recover=first_generation(redis, settings)).hold(cluster) as lease:
        print(f"CHILD held {lease.token}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        entry = PendingEntry(vm_id="vm-child", host_id="h1", mem_mb=1, vcpus=1, request_id=uuid.uuid4(),
                             fencing_token=lease.token, expires_at=time.time() + 60)
        try:
            await PendingStore(redis, settings).record(cluster, [entry], lease.token)
            print("CHILD written", flush=True)
        except FencedOut:
            print(f"CHILD fenced valid={lease.valid()}", flush=True)
    await redis.aclose()

asyncio.run(main())
"""


@pytest.fixture
def lease_settings(settings: Settings) -> Settings:
    # Lease 1 s (the default); a hold timeout (the old lock's time-to-live) of 30 s, so a takeover
    # within about a lease and one that waited for the hold timeout lie 29 s apart: the tests bound
    # takeovers by TAKEOVER_BOUND_S, far above a lease on a busy machine, far below the hold timeout.
    return settings.model_copy(
        update={"lock_acquire_timeout_s": 20.0, "lock_hold_timeout_s": 30.0, "lock_lease_s": 1.0}
    )


#: What a takeover of a dead or frozen holder's lock may take (a lease is 1 s; only a holder kept to the
#: 30 s hold timeout, the regression these tests exist for, comes near it).
TAKEOVER_BOUND_S = 10.0


@pytest.fixture
def holder_process(lease_settings: Settings, unique: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    cluster = f"proc-{unique}"
    env = settings_env(lease_settings)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, cluster],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield proc, cluster
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


async def _line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The child's next line for the test (its log lines, also on stdout, are skipped)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), deadline - time.monotonic())
        except TimeoutError:
            line = ""
        if not line:
            proc.kill()
            assert proc.stderr is not None
            pytest.fail(f"the holder process said nothing; stderr: {proc.stderr.read()[-3000:]}")
        if line.startswith("CHILD "):
            return line.removeprefix("CHILD ").strip()


async def _token_of(proc: subprocess.Popen[str]) -> int:
    said = await _line(proc)
    assert said.startswith("held "), said
    return int(said.split()[1])


async def test_a_killed_holders_lock_frees_within_a_lease(
    holder_process: tuple[subprocess.Popen[str], str], redis_client: aioredis.Redis, lease_settings: Settings
) -> None:
    proc, cluster = holder_process
    dead_token = await _token_of(proc)
    locks = ClusterLock(redis_client, lease_settings, recover=first_generation(redis_client, lease_settings))
    await asyncio.sleep(1.5)  # the child's watchdog renews past its first lease meanwhile
    assert await locks.holder(cluster) is not None, "the live child lost its lock"
    proc.kill()
    await asyncio.to_thread(proc.wait, 10)
    killed = time.monotonic()
    async with locks.hold(cluster) as lease:
        freed_after = time.monotonic() - killed
        assert lease.token > dead_token
    print(f"killed holder's lock taken over after {freed_after:.3f}s (lease 1 s, hold timeout 30 s)")
    assert freed_after < TAKEOVER_BOUND_S, f"the dead holder's lock took {freed_after:.3f}s to free"


async def test_a_frozen_holder_loses_the_lock_and_its_write_is_fenced_out_when_it_resumes(
    holder_process: tuple[subprocess.Popen[str], str], redis_client: aioredis.Redis, lease_settings: Settings
) -> None:
    proc, cluster = holder_process
    frozen_token = await _token_of(proc)
    locks = ClusterLock(redis_client, lease_settings, recover=first_generation(redis_client, lease_settings))
    pending = PendingStore(redis_client, lease_settings)
    os.kill(proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        async with locks.hold(cluster) as lease:
            took_over = time.monotonic() - stopped
            assert lease.token > frozen_token
            os.kill(proc.pid, signal.SIGCONT)
            assert proc.stdin is not None
            proc.stdin.write("write now\n")
            proc.stdin.flush()
            assert await _line(proc) == "fenced valid=False"
            # The resumed child neither renewed nor removed the new holder's lock.
            assert await locks.holder(cluster) == lease.value
            await pending.record(cluster, [pending_entry("vm-new", "h1", lease.token)], lease.token)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    print(f"frozen holder's lock taken over after {took_over:.3f}s")
    assert took_over < TAKEOVER_BOUND_S
    assert [e.vm_id for e in await pending.read(cluster)] == ["vm-new"]
    assert await asyncio.to_thread(proc.wait, 10) == 0


async def test_a_live_holder_keeps_the_lock_for_several_leases(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    # A lease of 1 s: a busy machine delaying the watchdog by a fraction of a lease loses nothing.
    cfg = settings.model_copy(update={"lock_hold_timeout_s": 30.0, "lock_lease_s": 1.0})
    locks = ClusterLock(redis_client, cfg, recover=first_generation(redis_client, cfg))
    pending = PendingStore(redis_client, cfg)
    cluster = f"live-{unique}"
    async with locks.hold(cluster) as lease:
        with pytest.raises(LockTimeout):
            await locks.acquire(cluster, timeout_s=4.0)  # four leases
        assert lease.valid()
        assert await locks.holder(cluster) == lease.value
        assert 0 < await redis_client.pttl(Keys(cfg.redis_prefix).lock(cluster)) <= 1000
        await pending.record(cluster, [pending_entry("vm-live", "h1", lease.token)], lease.token)
    assert await locks.holder(cluster) is None
    assert [e.vm_id for e in await pending.read(cluster)] == ["vm-live"]


async def test_the_hold_timeout_still_bounds_a_live_holder(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cfg = settings.model_copy(update={"lock_hold_timeout_s": 3.0, "lock_lease_s": 1.0})
    locks = ClusterLock(redis_client, cfg, recover=first_generation(redis_client, cfg))
    pending = PendingStore(redis_client, cfg)
    cluster = f"bounded-{unique}"
    async with locks.hold(cluster) as stuck:
        begin = time.monotonic()
        # The stuck body is still running; the acquire timeout is what bounds the wait from above.
        other = await locks.acquire(cluster, timeout_s=20.0)
        taken_after = time.monotonic() - begin
        assert other.token > stuck.token
        assert not stuck.valid()
        with pytest.raises(FencedOut):
            await pending.record(cluster, [pending_entry("vm-stuck", "h1", stuck.token)], stuck.token)
        assert await locks.release(other)
    assert taken_after >= 2.8, f"the live holder's lock was taken after {taken_after:.3f}s, before its hold timeout"


async def test_the_watchdog_ends_with_the_body_on_exceptions_and_cancellation(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    # A lease this short keeps the watchdog renewing all the time, so cancellations land in its
    # Redis calls too.
    cfg = settings.model_copy(update={"lock_hold_timeout_s": 5.0, "lock_lease_s": 0.03})
    locks = ClusterLock(redis_client, cfg, recover=first_generation(redis_client, cfg))

    def watchdogs() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t.get_name().startswith(WATCHDOG_TASK_PREFIX)]

    cluster = f"wd-{unique}"

    async def failing_body() -> None:
        async with locks.hold(cluster):
            await asyncio.sleep(0.05)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await failing_body()
    assert watchdogs() == []
    assert await locks.holder(cluster) is None

    for i in range(60):
        entered = asyncio.Event()

        async def body(c: str, entered: asyncio.Event) -> None:
            async with locks.hold(c):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(body(f"{cluster}-{i}", entered))
        await entered.wait()
        await asyncio.sleep(random.uniform(0, 0.03))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=8.0)  # the body would sleep 10 s
        assert task in done
        assert task.cancelled()
        assert watchdogs() == []
        assert await locks.holder(f"{cluster}-{i}") is None


async def test_a_renewal_that_finds_the_lock_gone_marks_the_lease_lost(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cfg = settings.model_copy(update={"lock_hold_timeout_s": 5.0, "lock_lease_s": 0.3})
    locks = ClusterLock(redis_client, cfg, recover=first_generation(redis_client, cfg))
    cluster = f"gone-{unique}"
    async with locks.hold(cluster) as lease:
        await redis_client.delete(Keys(cfg.redis_prefix).lock(cluster))  # e.g. a Redis failover lost it
        taken = await locks.acquire(cluster, timeout_s=1.0)
        assert await locks.extend(taken, 3.0)  # a bare acquire is not renewed: keep it for the test
        # The watchdog's next renewal (within a third of a lease on an idle machine) finds it gone.
        for _ in range(100):
            if lease.lost:
                break
            await asyncio.sleep(0.05)
        assert lease.lost
        assert not lease.valid()
        assert await locks.holder(cluster) == taken.value  # the lost holder did not touch the new lock
        await locks.release(taken)
