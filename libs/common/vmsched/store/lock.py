"""The per-cluster scheduling lock: a short lease renewed by its holder, a hold timeout, a fencing token.

One scheduling decision at a time per cluster. Two timeouts bound the lock: `acquire_timeout`, how
long a request waits for it, and `hold_timeout`, the most one holder may keep it.

The Redis key itself lives only for a short lease (`lock_lease_s`, about a second), and a watchdog
task of the live holder renews it (every third of a lease) while the body runs. A holder that dies
or freezes stops renewing, so its cluster is free again within about one lease instead of after the
whole hold timeout; a selector killed mid-decision no longer stalls its clusters for seconds. The
watchdog stops renewing once the hold timeout is reached (each renewal is capped to it), so a holder
stuck in a live loop still loses the lock then. A renewal that finds the lock gone (or cannot reach
Redis) marks the lease lost and stops; the body's fenced writes keep that safe.

A TTL lock alone is only an efficiency lock: a holder that stalls past its lease (a long GC pause,
SIGSTOP) and then resumes still believes it holds the lock. Each acquisition therefore gets a
fencing token, strictly increasing per cluster (INCR of the fence key, in the same script that
takes the lock), and writes that matter (pending resources, PendingStore.record) are refused when
their token is no longer the latest one.

redis-py's own Lock is not used: it keeps its token in a thread-local, which every asyncio task
of a thread shares, and it has no fencing token.

    async with locks.hold(cluster_id) as lease:
        ...  # lease.token goes with every pending-resource write
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from vmsched.errors import GenerationLost, LockTimeout, StateResyncing
from vmsched.logging import get_logger
from vmsched.settings import Settings
from vmsched.store._aio import cancel_requests, raise_if_cancelled
from vmsched.store.generations import CHECK_GENERATION, GENERATION_LOST, RESYNCING, Recover
from vmsched.store.keys import Keys
from vmsched.store.redis import text

log = get_logger(__name__)

#: First retry delay while the lock is taken; doubles up to the cap. Small, because a decision
#: holds the lock for milliseconds and the waiter should not add more than that to its latency.
BACKOFF_START_S = 0.001
BACKOFF_CAP_S = 0.020
#: Name prefix of the renewal task hold() runs beside its body (tests look for leftovers).
WATCHDOG_TASK_PREFIX = "lock-watchdog:"

# KEYS[1] lock, KEYS[2] fence, KEYS[3] generation marker, KEYS[4] resync flag; ARGV[1] owner
# (unique per acquisition attempt), ARGV[2] lease ms.
# Returns {1, token, replay guard 0/1} when acquired, {0, pttl} when someone else holds the lock,
# {GENERATION_LOST, 0} when Redis forgot the cluster's generation (see store.generations), and
# {RESYNCING, 0} while the cluster waits for the engine's full report.
# If the lock already carries this owner, the script ran before (redis-py retried the call after a
# connection error that lost the reply): return that token instead of waiting on ourselves.
# The token is a stamp of the cluster's generation: a fence left from an earlier generation (or
# none) starts again from the generation's base, so every token is newer than any issued before.
_ACQUIRE = (
    CHECK_GENERATION
    + f"""
local base = generation_base(KEYS[3])
if not base then
  return {{{GENERATION_LOST}, 0}}
end
local flag = redis.call('GET', KEYS[4])
local guard = 0
if flag then
  if string.match(flag, 'done$') then
    guard = 1
  else
    return {{{RESYNCING}, 0}}
  end
end
local cur = redis.call('GET', KEYS[1])
local prefix = ARGV[1] .. ':'
if not cur then
  local token = tonumber(redis.call('GET', KEYS[2]) or '0')
  if token < base then
    token = base
  end
  token = token + 1
  if token - base >= STAMP_SPAN then
    return {{{GENERATION_LOST}, 0}}
  end
  local value = string.format('%d', token)
  redis.call('SET', KEYS[2], value)
  redis.call('SET', KEYS[1], prefix .. value, 'PX', ARGV[2])
  return {{1, token, guard}}
end
if string.sub(cur, 1, #prefix) == prefix then
  return {{1, tonumber(string.sub(cur, #prefix + 1)), guard}}
end
return {{0, redis.call('PTTL', KEYS[1])}}
"""
)

# KEYS[1] lock; ARGV[1] exact value. Compare-and-delete: never removes a later holder's lock.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] lock; ARGV[1] owner of an abandoned attempt. Deletes the lock if that attempt took it.
_ABANDON = """
local prefix = ARGV[1] .. ':'
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #prefix) == prefix then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] lock; ARGV[1] exact value, ARGV[2] new time-to-live ms. Compare-and-extend: a renewal
# never resurrects a released lock nor extends a later holder's.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


@dataclass(eq=False)
class Lease:
    """One acquisition of a cluster's lock. A fresh object per acquisition, never reused."""

    cluster_id: str
    #: The fencing token: strictly increasing per cluster across all acquisitions.
    token: int
    owner: str
    #: The most this acquisition may keep the lock (the hold timeout), from `started_at`.
    hold_s: float
    #: How long the Redis key lives from `renewed_at` (one lease, less near the hold timeout).
    lease_s: float
    #: How long acquiring took (waiting for other holders included).
    waited_s: float
    #: time.monotonic() just before the acquiring command was sent: expiry is reckoned from there,
    #: so the local estimate can only err on the early side.
    started_at: float
    #: time.monotonic() just before the last successful renewal was sent (acquisition included).
    renewed_at: float = field(default=math.nan)
    released: bool = field(default=False)
    #: A renewal found the lock gone (or Redis unreachable): the lock is no longer ours.
    lost: bool = field(default=False)
    #: Redis forgot this cluster's decisions not long ago (a resync ended within the decision
    #: retention): a request id without a stored decision may have been decided before the loss.
    replay_guard: bool = field(default=False)

    def __post_init__(self) -> None:
        if math.isnan(self.renewed_at):
            self.renewed_at = self.started_at

    @property
    def value(self) -> str:
        """What the lock key holds while this lease owns it."""
        return f"{self.owner}:{self.token}"

    @property
    def hold_deadline(self) -> float:
        """time.monotonic() at which the hold timeout ends: no renewal reaches past it."""
        return self.started_at + self.hold_s

    @property
    def expires_at(self) -> float:
        """time.monotonic() at which the lock expires unless renewed."""
        return min(self.renewed_at + self.lease_s, self.hold_deadline)

    def remaining(self) -> float:
        """Seconds until the lock expires unless renewed, by the local clock (never negative)."""
        return max(0.0, self.expires_at - time.monotonic())

    def valid(self, margin_s: float = 0.0) -> bool:
        """Not released, not lost, and more than `margin_s` left (a local estimate only: the
        fencing token, not this, is what keeps a stale holder's writes out)."""
        return not self.released and not self.lost and self.remaining() > margin_s


class ClusterLock:
    """Per-cluster distributed lock over Redis: `async with locks.hold(cluster) as lease`."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        keys: Keys | None = None,
        owner: str | None = None,
        recover: Recover | None = None,
    ) -> None:
        self._redis = redis
        #: Called when the cluster's generation is found lost; without it, GenerationLost is raised.
        self._recover = recover
        self._keys = keys or Keys.from_settings(settings)
        self.acquire_timeout_s = settings.lock_acquire_timeout_s
        self.hold_timeout_s = settings.lock_hold_timeout_s
        self.lease_s = settings.lock_lease_s
        # The owner names the process in the lock value (for a human reading Redis); a nonce per
        # attempt is appended so two tasks of one process never look like the same owner.
        self._owner = owner or f"{socket.gethostname()}-{os.getpid()}"
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._extend = redis.register_script(_EXTEND)
        self._abandon_script = redis.register_script(_ABANDON)
        self._local: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def acquire(self, cluster_id: str, *, timeout_s: float | None = None, hold_s: float | None = None) -> Lease:
        """Wait up to `timeout_s` (default: the acquire timeout) for the lock; raise LockTimeout.

        The lock is taken for one lease (at most `hold_s`, default the hold timeout) and is not
        renewed: hold() renews it while its body runs; a bare acquire must call extend().
        """
        timeout = self.acquire_timeout_s if timeout_s is None else timeout_s
        hold = hold_s or self.hold_timeout_s
        owner = self._new_owner()
        begin = time.monotonic()
        deadline = begin + timeout
        delay = BACKOFF_START_S
        while True:
            lease, pttl_ms = await self._attempt(cluster_id, owner, hold, time.monotonic() - begin)
            if lease is not None:
                return lease
            now = time.monotonic()
            if now >= deadline:
                raise LockTimeout(
                    f"lock of cluster {cluster_id} not acquired within {timeout:.3f}s "
                    f"(waited {now - begin:.3f}s; it is held by another scheduler)",
                    location=f"cluster.{cluster_id}",
                )
            # Jitter keeps a crowd of waiters from retrying in lockstep. Never sleep past the
            # holder's expiry (at most one lease away) nor past our deadline (one more attempt
            # happens at the deadline).
            sleep = delay * random.uniform(0.5, 1.0)
            if pttl_ms > 0:
                sleep = min(sleep, pttl_ms / 1000.0)
            await asyncio.sleep(min(sleep, max(0.0, deadline - now)))
            delay = min(delay * 2, BACKOFF_CAP_S)

    async def release(self, lease: Lease) -> bool:
        """Delete the lock if it still carries this lease; False if it expired (and maybe moved
        on to another holder) in the meantime. Releasing twice is harmless."""
        if lease.released:
            return False
        lease.released = True
        deleted = await self._release(keys=[self._keys.lock(lease.cluster_id)], args=[lease.value])
        return bool(deleted)

    async def extend(self, lease: Lease, ttl_s: float | None = None) -> bool:
        """Renew the lock for `ttl_s` (default: one lease) from now, if it still holds it, but
        never past the lease's hold timeout. False (and nothing changed) if the lease was
        released, lost, its hold timeout reached, or the lock is no longer its own.

        The token stays the same: a renewal is not a new acquisition.
        """
        if lease.released or lease.lost:
            return False
        started = time.monotonic()
        ttl = min(ttl_s or self.lease_s, lease.hold_deadline - started)
        if ttl <= 0:
            return False
        ok = await self._extend(keys=[self._keys.lock(lease.cluster_id)], args=[lease.value, _ms(ttl)])
        if ok:
            lease.renewed_at, lease.lease_s = started, _local_ttl(ttl)
        return bool(ok)

    async def current_token(self, cluster_id: str) -> int:
        """The latest fencing token issued for the cluster (0 if none ever was)."""
        raw = await self._redis.get(self._keys.fence(cluster_id))
        return int(raw) if raw is not None else 0

    async def holder(self, cluster_id: str) -> str | None:
        """The lock's current value ("owner:token"), for diagnostics."""
        raw = await self._redis.get(self._keys.lock(cluster_id))
        return text(raw) if raw is not None else None

    @asynccontextmanager
    async def hold(
        self, cluster_id: str, *, timeout_s: float | None = None, hold_s: float | None = None
    ) -> AsyncIterator[Lease]:
        """Hold the cluster's lock for the body (renewed while it runs, up to the hold timeout);
        released on exit (if still ours).

        Holders in this process queue first on an in-memory FIFO lock, so only one of them polls
        Redis at a time and the hand-over between them is immediate and fair (polling with jittered
        backoff would let late arrivals overtake). The acquire timeout bounds both waits together.
        """
        timeout = self.acquire_timeout_s if timeout_s is None else timeout_s
        begin = time.monotonic()
        local = self._local[cluster_id]
        try:
            async with asyncio.timeout(timeout):
                await local.acquire()
        except TimeoutError:
            raise LockTimeout(
                f"lock of cluster {cluster_id} not acquired within {timeout:.3f}s "
                "(queued behind other requests of this process)",
                location=f"cluster.{cluster_id}",
            ) from None
        try:
            async with self._redis_lease(cluster_id, max(0.0, timeout - (time.monotonic() - begin)), hold_s) as lease:
                yield lease
        finally:
            local.release()

    @asynccontextmanager
    async def _redis_lease(self, cluster_id: str, timeout_s: float, hold_s: float | None) -> AsyncIterator[Lease]:
        lease = await self.acquire(cluster_id, timeout_s=timeout_s, hold_s=hold_s)
        watchdog = asyncio.create_task(self._watch(lease), name=f"{WATCHDOG_TASK_PREFIX}{cluster_id}")
        failed = False
        try:
            yield lease
        except BaseException:
            failed = True
            raise
        finally:
            # The watchdog must be gone before the release: a renewal racing the release cannot
            # bring the key back (renewal is compare-and-extend), but a watchdog left running
            # would keep renewing nothing and leak a task.
            await _stop(watchdog)
            try:
                still_ours = await self.release(lease)
                if not still_ours:
                    log.warning(
                        "lock expired before release",
                        cluster=cluster_id,
                        token=lease.token,
                        hold_s=lease.hold_s,
                        lost=lease.lost,
                    )
            except RedisError as exc:
                # The lock expires on its own within a lease; when the body already failed, its
                # exception is the one worth raising.
                if not failed:
                    raise
                log.warning("lock release failed", cluster=cluster_id, token=lease.token, error=str(exc))

    async def _watch(self, lease: Lease) -> None:
        """Renew the lease every third of a lease until the body ends or the hold timeout does.

        Stops on its own when the lease is released, lost or at its hold timeout, so even a
        cancellation that redis-py swallowed (see store/_aio.py) cannot keep it renewing; the
        cancel requests are checked after every Redis call too.
        """
        interval = lease.lease_s / 3
        cancels = cancel_requests()
        try:
            while True:
                await asyncio.sleep(max(0.0, lease.renewed_at + interval - time.monotonic()))
                if lease.released or lease.lost:
                    return
                if time.monotonic() >= lease.hold_deadline:
                    log.warning(
                        "lock held for the whole hold timeout; no longer renewed",
                        cluster=lease.cluster_id,
                        token=lease.token,
                        hold_s=lease.hold_s,
                    )
                    return
                renewed = await self.extend(lease)
                raise_if_cancelled(cancels)
                if not renewed and not lease.released and time.monotonic() < lease.hold_deadline:
                    lease.lost = True
                    log.warning("lock lost: renewal found it gone", cluster=lease.cluster_id, token=lease.token)
                    return
        except Exception as exc:
            # Whatever failed (Redis away, a bug), this lease can no longer vouch for the lock.
            lease.lost = True
            log.warning("lock lost: renewal failed", cluster=lease.cluster_id, token=lease.token, error=repr(exc))

    # ------------------------------------------------------------------ internals
    def _new_owner(self) -> str:
        return f"{self._owner}/{uuid.uuid4().hex[:16]}"

    async def _attempt(self, cluster_id: str, owner: str, hold_s: float, waited_s: float) -> tuple[Lease | None, int]:
        reply, started = await self._run_acquire(cluster_id, owner, hold_s)
        if int(reply[0]) == GENERATION_LOST and self._recover is not None:
            # A new generation (and, for a cluster Redis knew, a resync) and then one more try,
            # which finds the cluster resyncing or, if it was new, takes the lock.
            await self._recover(cluster_id)
            reply, started = await self._run_acquire(cluster_id, owner, hold_s)
        ok, value = int(reply[0]), int(reply[1])
        if ok == GENERATION_LOST:
            raise GenerationLost(
                f"Redis no longer holds cluster {cluster_id}'s generation (it restarted, failed over or "
                "lost its data): nothing it counted before can be trusted",
                location=f"cluster.{cluster_id}",
                cluster_id=cluster_id,
            )
        if ok == RESYNCING:
            raise StateResyncing(
                f"cluster {cluster_id} is not scheduled until the engine has reported it in full again "
                "(Redis lost its state); retry after the engine's full report",
                location=f"cluster.{cluster_id}",
            )
        if not ok:
            return None, value
        lease = Lease(
            cluster_id=cluster_id,
            token=value,
            owner=owner,
            hold_s=hold_s,
            lease_s=_local_ttl(min(self.lease_s, hold_s)),
            waited_s=waited_s + (time.monotonic() - started),
            started_at=started,
            replay_guard=bool(int(reply[2])),
        )
        return lease, 0

    async def _run_acquire(self, cluster_id: str, owner: str, hold_s: float) -> tuple[list[int], float]:
        """The acquire script's reply, and time.monotonic() just before it was sent."""
        started = time.monotonic()
        cancels = cancel_requests()
        try:
            reply = await self._acquire(
                keys=[
                    self._keys.lock(cluster_id),
                    self._keys.fence(cluster_id),
                    self._keys.generation(cluster_id),
                    self._keys.resync(cluster_id),
                ],
                args=[owner, _ms(min(self.lease_s, hold_s))],
            )
        except BaseException:
            # Cancelled (or failed) after the script may have taken the lock, with the reply lost:
            # nobody would release that lock before its hold time runs out.
            await asyncio.shield(self._abandon(cluster_id, owner))
            raise
        if cancel_requests() > cancels:
            # A cancellation redis-py swallowed (see store/_aio.py): honour it, lock or not.
            await self._abandon(cluster_id, owner)
            raise asyncio.CancelledError
        return list(reply), started

    async def _abandon(self, cluster_id: str, owner: str) -> None:
        try:
            await self._abandon_script(keys=[self._keys.lock(cluster_id)], args=[owner])
        except RedisError as exc:
            log.warning("abandoned lock attempt not cleaned up", cluster=cluster_id, error=str(exc))


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _local_ttl(seconds: float) -> float:
    """How long this process counts a lock it set for `seconds` as held. Redis was told whole
    milliseconds and counts them from its own millisecond clock, so the key can go up to a
    millisecond before `seconds` after the local start: one millisecond less keeps the local
    estimate from outliving the key, so valid() is false once another holder can have it."""
    return max(0, _ms(seconds) - 1) / 1000


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it has finished, even if the caller is cancelled meanwhile
    (the caller's cancellation is raised afterwards, not lost)."""
    task.cancel()
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
            task.cancel()
    if not task.cancelled() and task.exception() is not None:
        log.warning("lock watchdog failed", error=repr(task.exception()))
    if cancelled:
        raise asyncio.CancelledError


__all__ = ["BACKOFF_CAP_S", "BACKOFF_START_S", "WATCHDOG_TASK_PREFIX", "ClusterLock", "Lease"]
