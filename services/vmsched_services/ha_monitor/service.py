"""ha-monitor: oVirt's HA reservation check per cluster, on a timer and on demand.

* RPC `ha-check` (HaCheckRequest -> HaReport): runs the check for one cluster now, whoever owns its
  lease; publishes nothing. A cluster with HA reservation off gets `enabled=False`; one with no
  state, unknown_cluster.
* A leased loop (vmsched.leased_loop, role "ha-monitor", as the balancer's): each cluster whose
  lease this process holds is checked every settings.ha_interval_s. Clusters whose PostgreSQL
  setting ha_reservation is off are skipped (and their remembered state dropped, so turning it on
  again starts from "ok").
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

import time
import uuid
from datetime import UTC, datetime

from vmsched import constants as c
from vmsched.contracts import HaAlert, HaCheckRequest, HaRecovered, HaReport
from vmsched.leased_loop import LeasedLoop
from vmsched.logging import get_logger
from vmsched.metrics import HA_ALERTS, HA_CHECKS, HA_RECOVERIES
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched.scheduling.ha import alert_message, check, recovery_message
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.store.memories import HaStatus
from vmsched.store.pending import PendingStore

log = get_logger("vmsched.ha_monitor")


class HaMonitor:
    def __init__(self, rt: Runtime, policies: PolicyCache | None = None) -> None:
        self.rt = rt
        self.policies = policies or PolicyCache(rt)
        self.settings = rt.settings
        self.status = HaStatus(rt.redis, rt.settings)
        self.pending = PendingStore(rt.redis, rt.settings)
        self.loop = LeasedLoop(rt, c.LEASE_HA_MONITOR, rt.settings.ha_interval_s, self.check_and_publish)
        self.leases = self.loop.leases

    async def enabled(self, cluster_id: str) -> bool:
        """HA reservation is on for the cluster (PostgreSQL's cluster_policy.ha_reservation, which
        reaches the cluster's policy as the HaReservation property), read through the policy cache
        like the selector and the balancer do."""
        policy = await self.policies.for_cluster(cluster_id)
        return policy.properties.get(HA_RESERVATION_PROPERTY) == "true"

    async def evaluate(self, cluster_id: str) -> HaReport:
        """Run the check now (no events); `enabled=False` without checking if HA reservation is off."""
        now = datetime.now(UTC)
        if not await self.enabled(cluster_id):
            HA_CHECKS.labels("disabled").inc()
            return HaReport(cluster_id=cluster_id, enabled=False, ok=True, checked_at=now)
        pending = await self.pending.read(cluster_id)
        state = await self.rt.state.snapshot(cluster_id)
        started = time.perf_counter()
        result = check(state.hosts, state.vms, pending, count_threads_as_cores=state.settings.count_threads_as_cores)
        HA_CHECKS.labels("ok" if result.ok else "failing").inc()
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
        # Asked for by name (an operator's `vmsched ha-check`): a cluster with no state is unknown
        # (UnknownCluster), HA reservation on or off; "off, nothing checked" would hide a wrong id.
        await self.rt.state.version(request.cluster_id)
        return await self.evaluate(request.cluster_id)

    async def check_and_publish(self, cluster_id: str) -> HaReport:
        """The periodic check of one owned cluster: evaluate, publish on a change, remember."""
        report = await self.evaluate(cluster_id)
        if not report.enabled:
            await self.status.set_failing(cluster_id, [])
            return report
        previous = await self.status.failing(cluster_id)
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
            HA_ALERTS.inc()
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
            HA_RECOVERIES.inc()
            log.info("HA reservation check passes again", cluster=cluster_id)
        if current != previous:
            await self.status.set_failing(cluster_id, current)
        return report


async def start(rt: Runtime) -> HaMonitor:
    monitor = HaMonitor(rt)
    await monitor.policies.subscribe()
    await rt.bus.serve(c.RPC_HA_CHECK, HaCheckRequest, monitor.on_check)
    rt.spawn(monitor.loop.run(), name="ha-monitor")
    return monitor
