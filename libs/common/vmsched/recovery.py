"""What a service does when it finds that Redis forgot a cluster: a new generation, and a resync.

A store (the cluster lock, the state writer) that finds a cluster's generation marker missing or
written on another server run calls `Recovery` (their `recover` hook) and runs its script again:

1. the cluster's generation is advanced in PostgreSQL (vmsched.db.generations), durably, so every
   counter issued from now on is newer than any issued before the loss (vmsched.store.generations);
2. the marker is installed, with the resync flag when PostgreSQL knew the cluster (Redis forgot
   it: the engine must report it in full before it is scheduled again) and without it for a
   cluster seen for the first time (its first reports are all there is);
3. the engine is asked for the full report (contracts.ResyncRequested on the events exchange).

Several processes may find the same loss at once: each advances, the newest marker wins and the
others adopt it; the engine may get the request more than once, which costs it one full report.
While PostgreSQL is away no generation can be issued: the cluster is refused (retryable) rather
than scheduled on counters that may repeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vmsched import constants as c
from vmsched.bus import Bus
from vmsched.contracts import ResyncRequested
from vmsched.db import connect as connect_pg
from vmsched.db.generations import GenerationLedger
from vmsched.errors import DatabaseUnavailable, StateResyncing
from vmsched.logging import get_logger
from vmsched.reach import TlsFiles
from vmsched.settings import Settings
from vmsched.store.generations import MAX_GENERATION, GenerationMarkers

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = get_logger(__name__)

#: Opens (or returns) the PostgreSQL pool: Runtime.postgres.
PoolSource = Callable[[], Awaitable[object]]


class Recovery:
    """The `recover` hook of the stores of one process (one per Runtime)."""

    def __init__(self, markers: GenerationMarkers, pool: PoolSource, bus: Bus | None, *, found_by: str) -> None:
        self.markers = markers
        self._pool = pool
        self._bus = bus
        self._found_by = found_by
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def standalone(cls, redis: aioredis.Redis, settings: Settings, found_by: str) -> Recovery:
        """For a tool without a Runtime (the fault suite's lock holders, the bench's floors): opens
        its own PostgreSQL pool when first needed and asks the engine nothing (no bus)."""
        pool: list[object] = []

        async def source() -> object:
            if not pool:
                tls = TlsFiles.of(settings, "postgres")
                pool.append(await connect_pg(settings.postgres_url, min_size=0, max_size=1, tls=tls))
            return pool[0]

        return cls(GenerationMarkers(redis, settings), source, None, found_by=found_by)

    async def __call__(self, cluster_id: str) -> None:
        lock = self._locks.setdefault(cluster_id, asyncio.Lock())
        async with lock:
            # Another task of this process (or another process) may have recovered it meanwhile.
            if (await self.markers.read(cluster_id)).generation is not None:
                return
            try:
                ledger = GenerationLedger(await self._pool(), self.markers.prefix)
                advanced = await ledger.advance(cluster_id)
            except (DatabaseUnavailable, OSError) as exc:
                raise StateResyncing(
                    f"Redis no longer holds cluster {cluster_id}'s generation and PostgreSQL, which numbers "
                    f"generations, cannot be reached ({exc}); the cluster is scheduled again once it is back",
                    location=f"cluster.{cluster_id}",
                ) from exc
            if advanced.generation > MAX_GENERATION:
                raise StateResyncing(
                    f"cluster {cluster_id} has used up its {MAX_GENERATION} generations; remove it and report it anew",
                    location=f"cluster.{cluster_id}",
                )
            installed = await self.markers.install(cluster_id, advanced.generation, resync=advanced.known)
            if not advanced.known:
                log.info("cluster seen for the first time", cluster=cluster_id, generation=installed)
                return
            log.warning(
                "Redis forgot the cluster: new generation, waiting for the engine's full report",
                cluster=cluster_id,
                generation=installed,
                found_by=self._found_by,
            )
            await self.request_resync(cluster_id, installed)

    async def ask_again(self) -> int:
        """Ask again for the full report of every cluster still waiting for one (a request published
        while no engine listened would otherwise be lost). The clusters come from PostgreSQL: Redis
        forgot which clusters it had. Returns how many were asked."""
        asked = 0
        for cluster_id in await GenerationLedger(await self._pool(), self.markers.prefix).lost():
            generation = await self.markers.resync_generation(cluster_id)
            if generation is not None:
                await self.request_resync(cluster_id, generation)
                asked += 1
        return asked

    async def request_resync(self, cluster_id: str, generation: int) -> None:
        """Ask the engine for the cluster's full report (again)."""
        if self._bus is None:
            return
        event = ResyncRequested(
            cluster_id=cluster_id,
            generation=generation,
            reason=f"Redis no longer held the cluster's state (found by the {self._found_by})",
            requested_at=datetime.now(UTC),
        )
        await self._bus.publish(c.resync_requested_key(cluster_id), event)


__all__ = ["Recovery"]
