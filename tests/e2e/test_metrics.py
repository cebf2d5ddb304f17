"""A service process serves Prometheus metrics on VMSCHED_METRICS_PORT (compose's health checks use it)."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import pytest

from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, HostReport, HostStatus, VmSpec
from vmsched.settings import Settings
from vmsched_services.tools.procs import Supervisor

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def test_selector_exports_decisions_lock_wait_and_rpc_latency(
    service_settings: Settings, tmp_path: Path, unique: str
) -> None:
    port = _free_port()
    others = Supervisor(service_settings, tmp_path / "others")
    selector = Supervisor(service_settings, tmp_path / "selector", extra_env={"VMSCHED_METRICS_PORT": str(port)})
    try:
        for name in ("state-tracker", "filter-worker", "weigher"):
            await others.start(name)
        await selector.start("selector")
        cluster = f"metrics-{unique}"
        async with SchedulerClient(service_settings) as client:
            await client.report_cluster(ClusterReport(cluster_id=cluster))
            for i in range(3):
                await client.report_host(
                    HostReport(
                        cluster_id=cluster,
                        host_id=f"{cluster}-h{i}",
                        status=HostStatus.UP,
                        cpu_cores=8,
                        physical_mem_mb=8192,
                        mem_free_mb=8192,
                    )
                )
            await client.wait_for_state(cluster, hosts=3)
            d = await client.schedule(cluster, VmSpec(vm_id=f"vm-{unique}", mem_mb=512, vcpus=1))
            assert d.status is DecisionStatus.PLACED
        text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    finally:
        selector.stop_all()
        others.stop_all()
    assert 'vmsched_decisions_total{status="placed"} 1.0' in text
    assert "vmsched_lock_wait_seconds_count 1.0" in text
    assert 'vmsched_rpc_seconds_count{route="place"} 1.0' in text
    # The filter-worker placed the request (VMSCHED_PLACE_IN_WORKER, on by default): one call.
    assert 'vmsched_rpc_seconds_count{route="filter"}' not in text
    assert 'vmsched_rpc_seconds_count{route="weigh"}' not in text
    assert 'vmsched_messages_total{outcome="ok",queue="' in text
