"""One periodic loop over the clusters a process leases, shared by the balancer and the HA monitor.

Several replicas of a role may run; each cluster is worked by the one holding its Redis lease
(vmsched.store.lease). Every turn the loop claims (or renews) each known cluster's lease and runs
the role's work on the clusters it owns that are due, once per `interval_s`. Turns come at least
every third of the lease's time to live, so a lease held stays held; when its owner dies the lease
lapses and another replica takes the cluster on its next turn. A cluster whose work fails is logged
and tried again next interval; the loop itself never stops on an error. When the loop is cancelled
(Runtime.close) it releases its leases, so another replica takes the clusters at once.

A cluster Redis forgot, or one waiting for the engine's full report after that (vmsched.recovery),
is paused: balancing or checking HA on part of the picture would act on VMs that count nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.store.generations import GenerationMarkers
from vmsched.store.lease import Leases

log = get_logger("vmsched.leased_loop")

ClusterWork = Callable[[str], Awaitable[object]]


class LeasedLoop:
    def __init__(self, rt: Runtime, role: str, interval_s: float, work: ClusterWork) -> None:
        self.rt = rt
        self.role = role
        self.interval_s = interval_s
        self.work = work
        self.leases = Leases(rt.redis, rt.settings, role, ttl_s=rt.settings.lease_ttl_s)
        self.markers = GenerationMarkers(rt.redis, rt.settings)
        #: Monotonic time of the last run of `work` per cluster owned here.
        self._last_run: dict[str, float] = {}
        #: Clusters paused because their state is not whole (logged once per pause).
        self.paused: set[str] = set()

    @property
    def period_s(self) -> float:
        """Time between turns: the interval, or less, to renew leases in time."""
        return min(self.interval_s, self.rt.settings.lease_ttl_s / 3)

    async def turn(self) -> None:
        """Claim every cluster's lease; run the work on the owned clusters that are due."""
        for cluster_id in await self.rt.state.clusters():
            try:
                if not await self.leases.claim(cluster_id):
                    self._last_run.pop(cluster_id, None)
                    continue
                now = time.monotonic()
                last = self._last_run.get(cluster_id)
                if last is not None and now - last < self.interval_s:
                    continue
                self._last_run[cluster_id] = now
                if not await self._whole(cluster_id):
                    continue
                await self.work(cluster_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic work failed", role=self.role, cluster=cluster_id)

    async def _whole(self, cluster_id: str) -> bool:
        """Whether the cluster's state in Redis can be acted on: its generation known, no resync due."""
        marker = await self.markers.read(cluster_id)
        whole = marker.generation is not None and not marker.resyncing
        if not whole and cluster_id not in self.paused:
            self.paused.add(cluster_id)
            log.warning("paused: the cluster's state is being resynchronised", role=self.role, cluster=cluster_id)
        elif whole and cluster_id in self.paused:
            self.paused.discard(cluster_id)
            log.info("resumed: the cluster's state is whole again", role=self.role, cluster=cluster_id)
        return whole

    async def run(self) -> None:
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.turn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("periodic turn failed", role=self.role)
                await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))
        finally:
            with contextlib.suppress(Exception):
                await self.leases.release_all()


__all__ = ["ClusterWork", "LeasedLoop"]
