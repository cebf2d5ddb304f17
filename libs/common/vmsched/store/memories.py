"""What the balancer, the state tracker and the HA monitor remember between cycles, per VM or cluster.

* FailedHosts: hosts where a VM's start or migration failed lately (the state tracker notes them,
  the balancer keeps them out of the VM's next migrations), for settings.failed_host_memory_s.
* MigrationCooldowns: a migrated VM rests for settings.migration_cooldown_s (no ping-pong).
* HaStatus: the hosts whose HA VMs could not restart elsewhere at a cluster's last HA check, so a
  restarted or new HA monitor does not alert again for the same set.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis.asyncio as aioredis

from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import text


class FailedHosts:
    """{prefix}:tried:{cluster}:{vm} -> set of hosts, expiring failed_host_memory_s after the last."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._ttl_ms = max(1, int(settings.failed_host_memory_s * 1000))

    async def remember(self, cluster_id: str, vm_id: str, host_id: str) -> None:
        key = self._keys.tried(cluster_id, vm_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(key, host_id)
            pipe.pexpire(key, self._ttl_ms)
            await pipe.execute()

    async def remember_all(self, cluster_id: str, tried: Sequence[tuple[str, str]]) -> None:
        """`remember` for several (vm_id, host_id) pairs, in one round trip."""
        if not tried:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for vm_id, host_id in tried:
                key = self._keys.tried(cluster_id, vm_id)
                pipe.sadd(key, host_id)
                pipe.pexpire(key, self._ttl_ms)
            await pipe.execute()

    async def of(self, cluster_id: str, vm_id: str) -> set[str]:
        return {text(h) for h in await self._redis.smembers(self._keys.tried(cluster_id, vm_id))}


class MigrationCooldowns:
    """{prefix}:cooldown:{cluster}:{vm} -> the migration's decision id, for migration_cooldown_s."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._ttl_ms = int(settings.migration_cooldown_s * 1000)

    async def start(self, cluster_id: str, vm_id: str, decision_id: str) -> None:
        """The VM was just migrated: it rests (a cool-down of 0 disables resting)."""
        if self._ttl_ms > 0:
            await self._redis.set(self._keys.cooldown(cluster_id, vm_id), decision_id, px=self._ttl_ms)

    async def resting(self, cluster_id: str, vm_ids: Sequence[str]) -> set[str]:
        """Which of `vm_ids` are still resting after a migration."""
        if not vm_ids:
            return set()
        found = await self._redis.mget([self._keys.cooldown(cluster_id, v) for v in vm_ids])
        return {v for v, mark in zip(vm_ids, found, strict=True) if mark is not None}


class HaStatus:
    """{prefix}:ha-state:{cluster} -> JSON list of the failing hosts; absent when the check passed."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)

    async def failing(self, cluster_id: str) -> list[str]:
        raw = await self._redis.get(self._keys.ha_state(cluster_id))
        return [str(h) for h in json.loads(raw)] if raw else []

    async def set_failing(self, cluster_id: str, hosts: Sequence[str]) -> None:
        """Remember the failing set; an empty one (the check passes) is forgotten."""
        if hosts:
            await self._redis.set(self._keys.ha_state(cluster_id), json.dumps(list(hosts)))
        else:
            await self._redis.delete(self._keys.ha_state(cluster_id))


__all__ = ["FailedHosts", "HaStatus", "MigrationCooldowns"]
