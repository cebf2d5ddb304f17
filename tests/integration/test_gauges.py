"""What the state tracker's gauges read, on the real servers: queue depths on both buses, pending
counts and host counts in Redis, and one refresh of the gauges; readiness against a dead Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import aio_pika
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from tests.factories import first_generation, host_report, pending_entry
from vmsched import constants as c
from vmsched.bus import Bus, MemoryBus, connect
from vmsched.contracts import ClusterReport, HostReport, HostStatus, Message, StateRequest
from vmsched.health import Health, respond
from vmsched.metrics import cluster_label
from vmsched.runtime import Runtime
from vmsched.settings import Settings
from vmsched.store import ClusterLock, PendingStore, StateCache, StateWriter
from vmsched_services.state_tracker.gauges import HostGauges, Refresher

pytestmark = pytest.mark.integration


@pytest.fixture(params=["amqp", "memory"])
async def bus(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Bus]:
    b: Bus = connect(settings, "gauges") if request.param == "amqp" else MemoryBus(settings, service="gauges")
    await b.start()
    try:
        yield b
    finally:
        await b.close()


async def _delete_queues(settings: Settings, names: list[str]) -> None:
    """The test's own queues (the run's cleanup knows only the services' queues)."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        for name in names:
            ch = await conn.channel()
            with contextlib.suppress(Exception):
                await ch.queue_delete(settings.amqp_prefix + name)
    finally:
        await conn.close()


async def _nothing(_: Message) -> None:
    return None


async def _echo(req: StateRequest) -> Message:
    return req


def _host(cluster: str, host: str, status: HostStatus) -> HostReport:
    return host_report(cluster, host, status=status, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)


async def test_queue_depths_count_waiting_messages_and_miss_unknown_queues(
    bus: Bus, settings: Settings, unique: str
) -> None:
    events = f"test.gauges-{unique}"
    route = f"gauges-{unique}"
    requests = f"vmsched.{route}"  # the queue a route without an entry in RPC_QUEUES is served from
    try:
        sub = await bus.subscribe([f"gauges.{unique}"], [ClusterReport], _nothing, queue=events)
        await sub.cancel()  # the named queue stays, and fills
        await (await bus.serve(route, StateRequest, _echo)).cancel()
        for i in range(3):
            await bus.publish(f"gauges.{unique}", ClusterReport(cluster_id=f"c{i}"))
        missing = f"test.missing-{unique}"
        # The missing queue first: the broker's refusal must not cost the queues after it.
        depths = await bus.queue_depths([missing, events, requests, c.DEAD_LETTER_QUEUE])
        assert depths[missing] is None
        assert depths[events] == 3
        assert depths[requests] == 0
        assert isinstance(depths[c.DEAD_LETTER_QUEUE], int)
        assert bus.is_open()
    finally:
        if not isinstance(bus, MemoryBus):
            await _delete_queues(settings, [events, requests])
    await bus.close()
    assert not bus.is_open()


async def test_pending_counts_only_unexpired_records(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    pending = PendingStore(redis_client, settings)
    cluster, empty = f"pend-{unique}", f"none-{unique}"
    async with ClusterLock(redis_client, settings, recover=first_generation(redis_client, settings)).hold(
        cluster
    ) as lease:
        entries = [
            pending_entry("vm-1", "h1", lease.token),
            pending_entry("vm-2", "h2", lease.token),
            pending_entry("vm-3", "h1", lease.token, expires_at=time.time() - 1),
        ]
        await pending.record(cluster, entries, lease.token)
    assert await pending.counts([cluster, empty]) == {cluster: 2, empty: 0}
    assert await pending.counts([]) == {}
    # Read only: the expired record is still there for the next snapshot to drop.
    assert await pending.get(cluster, "vm-3") is not None


async def test_the_writer_counts_hosts_by_status_and_a_reload_agrees(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"hosts-{unique}"
    writer = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    assert writer.host_counts(cluster) is None
    for host, status in (("h1", HostStatus.UP), ("h2", HostStatus.UP), ("h3", HostStatus.MAINTENANCE)):
        await writer.apply_host(_host(cluster, host, status))
    await writer.apply_host(_host(cluster, "h2", HostStatus.NON_RESPONSIVE))
    expected = {HostStatus.UP: 1, HostStatus.MAINTENANCE: 1, HostStatus.DOWN: 0, HostStatus.NON_RESPONSIVE: 1}
    assert writer.host_counts(cluster) == expected
    assert cluster in writer.cluster_ids()
    reloaded = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await reloaded.load([cluster])
    assert reloaded.host_counts(cluster) == expected


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_one_refresh_sets_the_gauges(
    redis_client: aioredis.Redis, settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_label, "limit", 10**6)  # this cluster keeps its own label, however many came before
    cluster = f"refresh-{unique}"
    rt = Runtime(
        settings=settings, bus=MemoryBus(settings), redis=redis_client, state=StateCache(redis_client, settings)
    )
    writer = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await writer.apply_cluster(ClusterReport(cluster_id=cluster))
    for host, status in (("h1", HostStatus.UP), ("h2", HostStatus.DOWN), ("h3", HostStatus.UP)):
        await writer.apply_host(_host(cluster, host, status))
    HostGauges(writer).export(cluster)
    assert _sample("vmsched_hosts", cluster=cluster, status="up") == 2
    assert _sample("vmsched_hosts", cluster=cluster, status="down") == 1
    assert _sample("vmsched_hosts", cluster=cluster, status="maintenance") == 0

    async with ClusterLock(redis_client, settings, recover=first_generation(redis_client, settings)).hold(
        cluster
    ) as lease:
        await PendingStore(redis_client, settings).record(
            cluster, [pending_entry("vm-1", "h1", lease.token)], lease.token
        )
    await rt.bus.serve(c.RPC_STATE, StateRequest, _echo)
    await Refresher(rt, writer).refresh()
    assert _sample("vmsched_pending_records", cluster=cluster) == 1
    assert _sample("vmsched_queue_depth", queue=f"{settings.amqp_prefix}{c.RPC_QUEUES[c.RPC_STATE]}") == 0
    # A queue nobody declared is not exported (rather than as 0).
    assert _sample("vmsched_queue_depth", queue=f"{settings.amqp_prefix}{c.RPC_QUEUES[c.RPC_WEIGH]}") is None
    assert _sample("vmsched_dead_letter_queue_depth") == 0
    await rt.bus.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _readiness(cfg: Settings, *, uses_postgres: bool) -> tuple[int, dict[str, dict[str, object]]]:
    rt = await Runtime.open(cfg, service="health", bus=MemoryBus(cfg))
    rt.uses_postgres = uses_postgres
    try:
        health = Health(timeout_s=1.0)
        health.starting(asyncio.get_running_loop())
        health.ready(rt.readiness_checks())
        response = await asyncio.to_thread(respond, "/readyz", health)
    finally:
        await rt.close()
    checks: dict[str, dict[str, object]] = json.loads(response.body)["checks"]
    return response.status, checks


async def test_readiness_names_dead_servers_and_passes_live_ones(settings: Settings, database: str) -> None:
    status, checks = await _readiness(settings.model_copy(update={"postgres_url": database}), uses_postgres=True)
    assert status == 200
    assert {name: check["ok"] for name, check in checks.items()} == {"bus": True, "redis": True, "postgres": True}

    status, checks = await _readiness(settings, uses_postgres=False)
    assert (status, set(checks)) == (200, {"bus", "redis"})  # PostgreSQL only where it is read

    port = _closed_port()
    dead = settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{port}/0", "postgres_url": f"postgresql://127.0.0.1:{port}/x"}
    )
    status, checks = await _readiness(dead, uses_postgres=True)
    assert status == 503
    assert {name: check["ok"] for name, check in checks.items()} == {"bus": True, "redis": False, "postgres": False}
    assert "error" in checks["redis"]
    assert "error" in checks["postgres"]
