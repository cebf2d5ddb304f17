"""ha-monitor: oVirt's HA reservation check per cluster, on a timer and on demand.

* RPC `ha-check` (HaCheckRequest -> HaReport): runs the check for one cluster now, whoever owns its
  lease; publishes nothing. A cluster with HA reservation off gets `enabled=False`.
* A loop over the clusters in the state store. Every turn it claims (or renews) each cluster's
  lease (role "ha-monitor", settings.lease_ttl_s); turns come at least every lease_ttl_s / 3, so a
  lease held stays held, and a cluster owned here is checked every settings.ha_interval_s.
  Clusters whose PostgreSQL setting ha_reservation is off are skipped (and their remembered state
  dropped, so turning it on again starts from "ok").
* The check reads pending records, then the state snapshot (the selector's order, so a VM that
  starts meanwhile is counted once, not nowhere), and runs vmsched.scheduling.ha.check.
* Events: HaAlert (`ha.alert.<cluster>`) on ok -> failing and whenever the failing set changes;
  HaRecovered (`ha.recovered.<cluster>`) on failing -> ok. The last failing set is kept in Redis
  (`ha-state:<cluster>`), written after the event is published: a restarted or new owner does
  not alert again for the same set (at worst once more, if it died between the two).
* Stopping: the loop runs as a Runtime task (rt.spawn); Runtime.close() cancels it, and the loop
  releases its leases on the way out so another replica takes the clusters at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import UTC, datetime

from vmsched import constants as c
from vmsched.contracts import HaAlert, HaCheckRequest, HaRecovered, HaReport
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.scheduling.ha import alert_message, check, recovery_message
from vmsched.store.keys import Keys
from vmsched.store.lease import Leases
from vmsched.store.pending import PendingStore

log = get_logger("vmsched.ha_monitor")

ROLE = "ha-monitor"


class HaMonitor:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.keys = Keys.from_settings(rt.settings)
        self.pending = PendingStore(rt.redis, rt.settings)
        self.leases = Leases(rt.redis, rt.settings, ROLE, ttl_s=rt.settings.lease_ttl_s)
        #: Monotonic time of the last periodic check per cluster owned here.
        self._checked_at: dict[str, float] = {}

    @property
    def period_s(self) -> float:
        """Time between loop turns: the check interval, or less, to renew leases in time."""
        return min(self.settings.ha_interval_s, self.settings.lease_ttl_s / 3)

    async def enabled(self, cluster_id: str) -> bool:
        from vmsched.db import PolicyRepository

        settings = await PolicyRepository(await self.rt.postgres()).get_cluster_settings(cluster_id)
        return settings.ha_reservation

    async def evaluate(self, cluster_id: str) -> HaReport:
        """Run the check now (no events); `enabled=False` without checking if HA reservation is off."""
        now = datetime.now(UTC)
        if not await self.enabled(cluster_id):
            return HaReport(cluster_id=cluster_id, enabled=False, ok=True, checked_at=now)
        pending = await self.pending.read(cluster_id)
        state = await self.rt.state.snapshot(cluster_id)
        started = time.perf_counter()
        result = check(state.hosts, state.vms, pending, count_threads_as_cores=state.settings.count_threads_as_cores)
        return HaReport(
            cluster_id=cluster_id,
            enabled=True,
            ok=result.ok,
            failing_hosts=result.failing_hosts,
            hosts=result.hosts,
            ha_vms=result.ha_vms,
            checked_at=now,
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )

    async def on_check(self, request: HaCheckRequest) -> HaReport:
        return await self.evaluate(request.cluster_id)

    async def check_and_publish(self, cluster_id: str) -> HaReport:
        """The periodic check of one owned cluster: evaluate, publish on a change, remember."""
        report = await self.evaluate(cluster_id)
        key = self.keys.ha_state(cluster_id)
        if not report.enabled:
            await self.rt.redis.delete(key)
            return report
        raw = await self.rt.redis.get(key)
        previous: list[str] = json.loads(raw) if raw else []
        current = report.failing_hosts
        if current and current != previous:
            await self.rt.bus.publish(
                c.ha_alert_key(cluster_id),
                HaAlert(
                    alert_id=uuid.uuid4(),
                    cluster_id=cluster_id,
                    failing_hosts=current,
                    message=alert_message(cluster_id, current),
                    checked_at=report.checked_at,
                ),
            )
            log.warning("HA reservation check failed", cluster=cluster_id, failing=current)
        elif not current and previous:
            await self.rt.bus.publish(
                c.ha_recovered_key(cluster_id),
                HaRecovered(
                    cluster_id=cluster_id,
                    previously_failing=previous,
                    message=recovery_message(cluster_id),
                    checked_at=report.checked_at,
                ),
            )
            log.info("HA reservation check passes again", cluster=cluster_id)
        if current != previous:
            if current:
                await self.rt.redis.set(key, json.dumps(current))
            else:
                await self.rt.redis.delete(key)
        return report

    async def turn(self) -> None:
        """One loop turn: claim every cluster's lease, check the owned ones that are due."""
        now = time.monotonic()
        for cluster_id in await self.rt.state.clusters():
            try:
                if not await self.leases.claim(cluster_id):
                    self._checked_at.pop(cluster_id, None)
                    continue
                last = self._checked_at.get(cluster_id)
                if last is not None and now - last < self.settings.ha_interval_s:
                    continue
                self._checked_at[cluster_id] = now
                await self.check_and_publish(cluster_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("HA check failed", cluster=cluster_id)

    async def run(self) -> None:
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.turn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("HA monitor turn failed")
                await asyncio.sleep(max(0.0, self.period_s - (time.monotonic() - started)))
        finally:
            with contextlib.suppress(Exception):
                await self.leases.release_all()


async def start(rt: Runtime) -> HaMonitor:
    monitor = HaMonitor(rt)
    await rt.bus.serve(c.RPC_HA_CHECK, HaCheckRequest, monitor.on_check)
    rt.spawn(monitor.run(), name="ha-monitor")
    return monitor
