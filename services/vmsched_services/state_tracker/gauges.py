"""The gauges the state tracker exports: hosts by status, pending records, queue depths, dead letters.

* Hosts by cluster and status: the writer keeps its hosts counted by status as it applies reports,
  so after each report the tracker sets the cluster's four values (no walk over the hosts).
* Pending records per cluster, the depth of every service queue and of the dead-letter queue: read
  every VMSCHED_METRICS_REFRESH_S (only when metrics are served) by a loop on the Runtime. One
  process does it because these are global figures; the tracker because it knows every cluster.
  If several trackers run, each exports the same values: aggregate them with max, not sum.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from vmsched import constants as c
from vmsched.logging import get_logger
from vmsched.metrics import DEAD_LETTER_DEPTH, HOSTS, PENDING, QUEUE_DEPTH, ClusterGauge
from vmsched.runtime import Runtime
from vmsched.store import PendingStore, StateWriter

log = get_logger("vmsched.state_tracker.gauges")

#: Every queue the services consume from a shared name (RPC queues, the state events queue).
SERVICE_QUEUES = (*c.RPC_QUEUES.values(), c.STATE_EVENTS_QUEUE)


class HostGauges:
    """vmsched_hosts{cluster, status}, from the writer's counts."""

    def __init__(self, writer: StateWriter) -> None:
        self.writer = writer
        self._gauge = ClusterGauge(HOSTS)

    def export(self, cluster_id: str) -> None:
        counts = self.writer.host_counts(cluster_id)
        if counts is None:  # not held (a failed apply dropped it): the next apply brings it back
            return
        for status, n in counts.items():
            self._gauge.set(cluster_id, n, status.value)

    def export_all(self) -> None:
        for cluster_id in self.writer.cluster_ids():
            self.export(cluster_id)


class Refresher:
    """Reads the pending records and the queue depths into their gauges."""

    def __init__(self, rt: Runtime, writer: StateWriter) -> None:
        self.rt = rt
        self.writer = writer
        self.pending = PendingStore(rt.redis, rt.settings)
        self._pending_gauge = ClusterGauge(PENDING)
        self._failing: set[str] = set()
        self._queues_exported: set[str] = set()

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.rt.settings.metrics_refresh_s)

    async def refresh(self) -> None:
        """Both reads; one failing (Redis or the broker away) leaves the other's gauges current."""
        await self._guarded("queues", self.refresh_queues())
        await self._guarded("pending", self.refresh_pending())

    async def refresh_queues(self) -> None:
        depths = await self.rt.bus.queue_depths([*SERVICE_QUEUES, c.DEAD_LETTER_QUEUE])
        dead = depths.pop(c.DEAD_LETTER_QUEUE)
        if dead is not None:
            DEAD_LETTER_DEPTH.set(dead)
        for queue, depth in depths.items():
            label = f"{self.rt.settings.amqp_prefix}{queue}"
            if depth is not None:
                QUEUE_DEPTH.labels(label).set(depth)
                self._queues_exported.add(label)
            elif label in self._queues_exported:  # deleted: its last value would be a lie
                QUEUE_DEPTH.remove(label)
                self._queues_exported.discard(label)

    async def refresh_pending(self) -> None:
        counts = await self.pending.counts(self.writer.cluster_ids())
        for cluster_id, n in counts.items():
            self._pending_gauge.set(cluster_id, n)

    async def _guarded(self, what: str, refresh: Coroutine[Any, Any, None]) -> None:
        try:
            await refresh
        except Exception as exc:
            # Once per outage at WARNING: a refresh every few seconds would flood the log.
            (log.debug if what in self._failing else log.warning)("gauge refresh failed", gauges=what, error=repr(exc))
            self._failing.add(what)
        else:
            self._failing.discard(what)
