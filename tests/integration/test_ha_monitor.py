"""The ha-monitor on the real RabbitMQ, Redis and PostgreSQL, with the state tracker, in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.factories import host_report, vm_report
from tests.integration.conftest import services
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterReport,
    HaAlert,
    HaCheckRequest,
    HaRecovered,
    HaReport,
)
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.scheduling.ha import alert_message
from vmsched.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def stack(settings: Settings, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = settings.model_copy(update={"postgres_url": database, "ha_interval_s": 0.5, "lease_ttl_s": 2.0})
    async with services(cfg, "state-tracker", "ha-monitor"):
        yield cfg


async def set_ha(client: SchedulerClient, cfg: Settings, cluster: str, on: bool) -> None:
    """Switch HA reservation as an operator does: in PostgreSQL, then tell the services' caches."""
    pool = await connect_pg(cfg.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(cluster, None, ha_reservation=on)
    finally:
        await pool.close()
    await client.policy_changed(cluster_id=cluster)


#: 8-core 64 GB hosts (the model's reserved memory), and HA VMs using all of their memory and 10% CPU.
host = partial(host_report, cpu_cores=8, physical_mem_mb=65536)
ha_vm = partial(vm_report, mem_mb=4096, vcpus=2, mem_usage_pct=100.0, cpu_usage_pct=10.0, ha=True)


async def check(client: SchedulerClient, cluster: str) -> HaReport:
    return await client.bus.call(c.RPC_HA_CHECK, HaCheckRequest(cluster_id=cluster), HaReport)


def _count(name: str, **labels: str) -> float:
    """A counter of this process (the services run in it), 0 before its first increment."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_alert_on_unsafe_cluster_then_recovery(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"ha-{unique}"
    alerts, recoveries = _count("vmsched_ha_alerts_total"), _count("vmsched_ha_recoveries_total")
    failing = _count("vmsched_ha_checks_total", result="failing")
    await set_ha(client, stack, cluster, True)
    events: asyncio.Queue[Any] = asyncio.Queue()
    sub = await client.bus.subscribe(
        [c.ha_alert_key(cluster), c.ha_recovered_key(cluster)], [HaAlert, HaRecovered], events.put
    )
    try:
        # h1 runs two 4 GB HA VMs; h2 has room for one: h1 fails. h2's VM fits on h1.
        await client.report_cluster(ClusterReport(cluster_id=cluster))
        await client.report_host(host(cluster, "h1", mem_free_mb=32768))
        await client.report_host(host(cluster, "h2", mem_free_mb=6000))
        for vm_id, on in (("v1", "h1"), ("v2", "h1"), ("v3", "h2")):
            await client.report_vm(ha_vm(cluster, vm_id, on))
        alert = await asyncio.wait_for(events.get(), 15)
        while isinstance(alert, HaAlert) and alert.failing_hosts != ["h1"]:
            alert = await asyncio.wait_for(events.get(), 15)  # an alert from a partly reported cluster
        assert isinstance(alert, HaAlert)
        assert alert.cluster_id == cluster
        assert alert.message == alert_message(cluster, ["h1"])
        assert "HA VMs on host(s): h1 will fail to migrate" in alert.message

        report = await check(client, cluster)
        assert report.enabled
        assert not report.ok
        assert report.failing_hosts == alert.failing_hosts
        assert (report.hosts, report.ha_vms) == (2, 3)

        # No repeated alert for the same failing set: the next events are only the recovery.
        await asyncio.sleep(1.5)
        assert events.empty()

        # A second big host makes the cluster safe.
        await client.report_host(host(cluster, "h3", mem_free_mb=32768))
        recovered = await asyncio.wait_for(events.get(), 15)
        assert isinstance(recovered, HaRecovered)
        assert recovered.previously_failing == ["h1"]
        report = await check(client, cluster)
        assert report.enabled
        assert report.ok
        assert report.failing_hosts == []
        assert _count("vmsched_ha_alerts_total") >= alerts + 1
        # Process-wide counters: the monitor also checks other tests' clusters of the run's prefix.
        assert _count("vmsched_ha_recoveries_total") >= recoveries + 1
        assert _count("vmsched_ha_checks_total", result="failing") > failing
    finally:
        await sub.cancel()


async def test_cluster_with_ha_reservation_off(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"ha-off-{unique}"
    events: asyncio.Queue[Any] = asyncio.Queue()
    sub = await client.bus.subscribe([c.ha_alert_key(cluster)], [HaAlert], events.put)
    try:
        await client.report_cluster(ClusterReport(cluster_id=cluster))
        await client.report_host(host(cluster, "h1", mem_free_mb=32768))
        await client.report_vm(ha_vm(cluster, "v1", "h1"))
        await client.wait_for_state(cluster, hosts=1)
        report = await check(client, cluster)
        assert not report.enabled
        assert report.failing_hosts == []
        await asyncio.sleep(1.5)  # several loop turns: the lone host would fail, but nothing is checked
        assert events.empty()
        # Turned on, the lone Up host with an HA VM fails (as in oVirt: no other host to restart on).
        await set_ha(client, stack, cluster, True)
        # policy.changed reaches the monitor's cache through its own queue, shortly after.
        async with asyncio.timeout(5):
            while not (report := await check(client, cluster)).enabled:  # noqa: ASYNC110 - a remote state, no local event
                await asyncio.sleep(0.05)
        assert report.failing_hosts == ["h1"]
        alert = await asyncio.wait_for(events.get(), 15)
        assert alert.failing_hosts == ["h1"]
    finally:
        await sub.cancel()
