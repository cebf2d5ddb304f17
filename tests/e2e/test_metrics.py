"""A service process serves Prometheus metrics, liveness and readiness on VMSCHED_METRICS_PORT
(compose's health checks use /readyz)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vmsched import constants as c
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


def _fetch(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET path, error statuses included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), str(response.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, str(e.read().decode())


async def _started_readiness(port: int, timeout: float = 60.0) -> tuple[int, str]:
    """/readyz once the process has started its services (not "starting", nor unanswered)."""
    end = time.monotonic() + timeout
    while True:
        try:
            status, body = await asyncio.to_thread(_fetch, port, "/readyz")
            if json.loads(body).get("status") != "starting":
                return status, body
        except OSError:
            pass  # not listening yet
        if time.monotonic() > end:
            raise AssertionError(f"/readyz on port {port} still starting after {timeout:g} s")
        await asyncio.sleep(0.1)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(text: str, name: str, **labels: str) -> float | None:
    return _samples(text).get((name, frozenset(labels.items())))


async def _until(port: int, name: str, labels: dict[str, str], want: float, timeout: float = 10.0) -> str:
    """Scrape until the sample has the value wanted (a periodically refreshed gauge); the last scrape."""
    async with asyncio.timeout(timeout):
        while True:
            text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
            if _value(text, name, **labels) == want:
                return text
            await asyncio.sleep(0.1)


def _assert_tracker_gauges(text: str, cluster: str, prefix: str) -> None:
    assert _value(text, "vmsched_hosts", cluster=cluster, status="up") == 3.0
    assert _value(text, "vmsched_hosts", cluster=cluster, status="maintenance") == 1.0
    assert _value(text, "vmsched_hosts", cluster=cluster, status="down") == 0.0
    for queue in (*c.RPC_QUEUES.values(), c.STATE_EVENTS_QUEUE):
        if queue == c.RPC_QUEUES[c.RPC_HA_CHECK] or ".policy-admin." in queue:
            continue  # no HA monitor or policy-admin ran: their queues may not exist, and are then not exported
        assert _value(text, "vmsched_queue_depth", queue=f"{prefix}{queue}") is not None, queue
    assert _value(text, "vmsched_dead_letter_queue_depth") is not None


async def test_selector_and_state_tracker_export_decisions_gauges_and_readiness(
    service_settings: Settings, tmp_path: Path, unique: str
) -> None:
    port, tracker_port = _free_port(), _free_port()
    others = Supervisor(service_settings, tmp_path / "others")
    tracker = Supervisor(
        service_settings,
        tmp_path / "tracker",
        extra_env={"VMSCHED_METRICS_PORT": str(tracker_port), "VMSCHED_METRICS_REFRESH_S": "0.2"},
    )
    selector = Supervisor(service_settings, tmp_path / "selector", extra_env={"VMSCHED_METRICS_PORT": str(port)})
    cluster = f"metrics-{unique}"
    try:
        await tracker.start("state-tracker")
        for name in ("filter-worker", "weigher"):
            await others.start(name)
        await selector.start("selector")
        async with SchedulerClient(service_settings) as client:
            await client.report_cluster(ClusterReport(cluster_id=cluster))
            for i, host_status in enumerate((HostStatus.UP, HostStatus.UP, HostStatus.UP, HostStatus.MAINTENANCE)):
                await client.report_host(
                    HostReport(
                        cluster_id=cluster,
                        host_id=f"{cluster}-h{i}",
                        status=host_status,
                        cpu_cores=8,
                        physical_mem_mb=8192,
                        mem_free_mb=8192,
                    )
                )
            await client.wait_for_state(cluster, hosts=4)
            d = await client.schedule(cluster, VmSpec(vm_id=f"vm-{unique}", mem_mb=512, vcpus=1))
            assert d.status is DecisionStatus.PLACED
        text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        ready = await asyncio.to_thread(_fetch, port, "/readyz")
        live = await asyncio.to_thread(_fetch, port, "/healthz")
        missing = await asyncio.to_thread(_fetch, port, "/")
        # The VM was placed, never reported running: its pending record is counted until it expires.
        tracked = await _until(tracker_port, "vmsched_pending_records", {"cluster": cluster}, 1.0)
        tracker_ready = await asyncio.to_thread(_fetch, tracker_port, "/readyz")
    finally:
        selector.stop_all()
        others.stop_all()
        tracker.stop_all()
    assert _value(text, "vmsched_decisions_total", cluster=cluster, status="placed") == 1.0
    assert _value(text, "vmsched_decision_seconds_count", cluster=cluster) == 1.0
    assert "vmsched_lock_wait_seconds_count 1.0" in text
    # The selector placed the small group itself (VMSCHED_PLACE_IN_SELECTOR, on by default): no
    # call to a worker at all.
    assert 'vmsched_place_groups_total{where="selector"} 1.0' in text
    assert 'vmsched_place_groups_total{where="worker"}' not in text
    assert 'vmsched_rpc_seconds_count{route="place"}' not in text
    assert 'vmsched_rpc_seconds_count{route="filter"}' not in text
    assert 'vmsched_rpc_seconds_count{route="weigh"}' not in text
    assert 'vmsched_messages_total{outcome="ok",queue="' in text
    assert 'vmsched_build_info{python="' in text

    ready_status, body = ready
    assert ready_status == 200, body
    checks: dict[str, Any] = json.loads(body)["checks"]
    assert {name: check["ok"] for name, check in checks.items()} == {"bus": True, "redis": True, "postgres": True}
    assert live[0] == 200
    assert missing[0] == 404

    _assert_tracker_gauges(tracked, cluster, service_settings.amqp_prefix)
    ready_status, body = tracker_ready
    assert ready_status == 200, body
    assert set(json.loads(body)["checks"]) == {"bus", "redis"}  # the state tracker never reads PostgreSQL


async def test_a_service_whose_redis_is_down_is_live_but_not_ready_and_does_not_consume(
    service_settings: Settings, tmp_path: Path
) -> None:
    """The filter-worker starts without touching Redis (it reads state on its first request), so it
    runs with its Redis URL at a closed port; the state tracker, which loads state at start, would exit.
    Not ready, it takes no request: its queue has no consumer of it."""
    port, dead = _free_port(), _free_port()
    worker = Supervisor(
        service_settings,
        tmp_path / "worker",
        extra_env={"VMSCHED_METRICS_PORT": str(port), "VMSCHED_REDIS_URL": f"redis://127.0.0.1:{dead}/0"},
    )
    try:
        before = await worker.consumers("filter-worker")
        await worker.start("filter-worker", consuming=False)
        ready = await _started_readiness(port)
        live = await asyncio.to_thread(_fetch, port, "/healthz")
        assert await worker.consumers("filter-worker") == before
    finally:
        worker.stop_all()
    status, body = ready
    assert status == 503, body
    answer = json.loads(body)
    assert answer["status"] == "not ready"
    assert answer["checks"]["bus"]["ok"] is True
    assert answer["checks"]["redis"]["ok"] is False
    assert answer["checks"]["redis"]["error"]
    assert "postgres" not in answer["checks"]
    assert live[0] == 200
