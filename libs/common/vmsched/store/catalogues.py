"""Which policy units each running service instance has: announced in Redis, expiring with the instance.

Units come from packages installed next to vmsched (plugins), so two instances of one service can
differ: a filter-worker on a machine without a plugin cannot run its filter. Every instance writes
its catalogue (unit name -> origin, and its `catalogue_hash`) under a key of its own with a time to
live and renews it while it runs (`announce_units`, started by the runner); `instances()` lists
them, `available_units()` tells, per service, the units every live instance has. The selector sends
a policy's calls only to workers having all its units (vmsched.lifecycle.routes: workers alike share
the queues of their catalogue hash), and policy administration refuses a policy no running instance
could run, warning about the instances that lack some unit (vmsched_services.policy_admin.availability).

Keys (vmsched.store.keys): `{prefix}:units:{service}:{instance}` holds the instance's announcement
(JSON), PX = the catalogue TTL; `{prefix}:units-index` is a sorted set of those keys scored by when
they expire, in the Redis server's clock, so a reader finds the instances without SCAN over the whole
keyspace (decisions alone are millions of keys) and drops dead ones by score. A member and its key
are written by one script with one clock reading, so a live instance is never dropped: a member
outlives its key by nothing, and a key found missing belongs to an instance that stopped renewing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from vmsched import constants as c
from vmsched.logging import get_logger
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import text

log = get_logger("vmsched.store.catalogues")

# KEYS: instance key, index. ARGV: announcement (JSON), TTL (ms). Safe to run twice.
_ANNOUNCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
"""
# KEYS: index. The keys of live announcements, after dropping expired ones.
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


def catalogue_hash(units: Mapping[str, str]) -> str:
    """A short stable name of a unit catalogue (unit name -> origin): equal for two instances with
    the same units from the same packages, whatever order they were loaded in. Workers alike share
    the queues of the catalogue routes (constants.CATALOGUE_ROUTES) named after it."""
    text = "\n".join(f"{name}={origin}" for name, origin in sorted(units.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[: c.CATALOGUE_HASH_LENGTH]


def units_of(registry: Mapping[str, PolicyUnit]) -> dict[str, str]:
    """A registry's catalogue as an instance announces it: unit name -> origin."""
    return {u.name: u.origin for u in registry.values()}


@dataclass(frozen=True)
class Announcement:
    """One live service instance's units."""

    service: str
    instance: str
    #: unit name -> origin ("builtin" or "<distribution> <version>")
    units: Mapping[str, str]
    #: Unix time the instance last announced (its own clock).
    announced_at: float

    @property
    def catalogue(self) -> str:
        """The hash of its units (catalogue_hash): the catalogue routes it consumes."""
        return catalogue_hash(self.units)


def instance_id() -> str:
    """This process's id among a service's instances: host, pid and a random part (pids repeat)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class UnitCatalogues:
    """The unit catalogues of the running service instances (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self.ttl_s = settings.unit_catalogue_ttl_s
        self._announce = redis.register_script(_ANNOUNCE)
        self._live = redis.register_script(_LIVE)

    async def announce(self, service: str, instance: str, units: Mapping[str, str]) -> None:
        """Say (again) that `instance` of `service` runs with `units` (name -> origin), for the TTL."""
        body = json.dumps(
            {
                "service": service,
                "instance": instance,
                "units": dict(units),
                # For a reader in another language: the catalogue routes' suffix, as catalogue_hash makes it.
                "catalogue": catalogue_hash(units),
                "announced_at": time.time(),
            },
            separators=(",", ":"),
        )
        key = self._keys.unit_catalogue(service, instance)
        await self._announce(keys=[key, self._keys.unit_catalogue_index()], args=[body, max(1, int(self.ttl_s * 1000))])

    async def withdraw(self, service: str, instance: str) -> None:
        """The instance stops: its units no longer count (without waiting for the TTL)."""
        key = self._keys.unit_catalogue(service, instance)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.zrem(self._keys.unit_catalogue_index(), key)
            await pipe.execute()

    async def instances(self) -> list[Announcement]:
        """Every live instance's announcement, by service and instance."""
        keys = [text(k) for k in await self._live(keys=[self._keys.unit_catalogue_index()])]
        if not keys:
            return []
        found: list[Announcement] = []
        for raw in await self._redis.mget(keys):
            if raw is None:  # expired between the two reads: that instance is gone
                continue
            doc = json.loads(raw)
            found.append(
                Announcement(
                    service=str(doc["service"]),
                    instance=str(doc["instance"]),
                    units={str(k): str(v) for k, v in doc["units"].items()},
                    announced_at=float(doc["announced_at"]),
                )
            )
        return sorted(found, key=lambda a: (a.service, a.instance))

    async def available_units(self) -> dict[str, frozenset[str]]:
        """Per service (filter-worker, weigher, ...), the units every live instance of it has.

        A service with no live instance is absent: nothing of it runs, so nothing of it is lacking.
        """
        by_service: dict[str, frozenset[str]] = {}
        for a in await self.instances():
            names = frozenset(a.units)
            by_service[a.service] = by_service[a.service] & names if a.service in by_service else names
        return by_service


async def announce_units(
    catalogues: UnitCatalogues, services: Sequence[str], units: Mapping[str, str], *, instance: str | None = None
) -> None:
    """Announce `units` for each of `services` in this process every third of the TTL until
    cancelled, then withdraw them. A failed renewal (Redis away) is logged and tried again on the next
    turn; the instance drops out of `available_units` only if that lasts a whole TTL."""
    me = instance or instance_id()
    try:
        while True:
            for service in services:
                try:
                    await catalogues.announce(service, me, units)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("unit catalogue not announced", service=service, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(catalogues.ttl_s / 3)
    finally:
        with contextlib.suppress(Exception):
            for service in services:
                await catalogues.withdraw(service, me)


__all__ = ["Announcement", "UnitCatalogues", "announce_units", "catalogue_hash", "instance_id", "units_of"]
