"""Redis or PostgreSQL stopped under running services (private instances: the shared servers are
never stopped).

* Redis away: the services stop consuming (their consumers leave the queues, so RabbitMQ keeps the
  requests for an instance that can work on them), consume again once it is back, and nothing is
  answered `internal`.
* PostgreSQL away: decisions go on with the policies read last (past their TTL), a cluster whose
  policy was never read gets `policy_store_unavailable`, policy administration answers that
  PostgreSQL is away, and the staleness gauge counts; all of it ends once PostgreSQL is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from prometheus_client import REGISTRY

from tests import factories
from tests.integration.conftest import services
from vmsched import constants as c
from vmsched.bus import connect
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterAttachment, DecisionStatus, PolicySet, ScheduleDecision, StateRequest
from vmsched.db import migrate
from vmsched.errors import RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.tools.servers.postgres import PrivatePostgres
from vmsched_services.tools.servers.redis import PrivateRedis

HOSTS: dict[str, Any] = {"cpu_cores": 8, "physical_mem_mb": 16384, "mem_free_mb": 16384, "reserved_mem_mb": 0}
#: Bound on waiting for a service to notice a server went or came back (its checks run every 0.2 s).
NOTICE_S = 10.0


async def consumers(settings: Settings, queue: str) -> int:
    """Consumers on `queue` now, as the broker counts them."""
    conn = await aio_pika.connect(settings.amqp_url)
    async with conn:
        ch = await conn.channel()
        declared = await ch.declare_queue(queue, passive=True)
        return int(declared.declaration_result.consumer_count or 0)


async def until_async(what: str, count: Callable[[], Awaitable[int]], want: int, timeout: float = 5.0) -> None:
    """Wait until `count()` is `want` (AssertionError naming `what` after `timeout`)."""
    deadline = time.monotonic() + timeout
    while (got := await count()) != want:
        assert time.monotonic() < deadline, f"{what}: still {got} after {timeout} s"
        await asyncio.sleep(0.05)


async def until(what: str, ok: Callable[[], object], timeout: float = NOTICE_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = ok()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.1)


def schedule_queue(settings: Settings) -> str:
    return f"{settings.amqp_prefix}{c.RPC_QUEUES[c.RPC_SCHEDULE]}"


# ---------------------------------------------------------------------------------------- Redis away
@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


async def test_services_stop_consuming_while_redis_is_away_and_nothing_is_answered_internal(
    settings: Settings, database: str, private_redis: PrivateRedis, unique: str, delete_after: list[Settings]
) -> None:
    cfg = settings.model_copy(
        update={
            "redis_url": private_redis.url,
            "redis_prefix": f"away-{unique}",
            "amqp_prefix": f"{settings.amqp_prefix}away-{unique}.",
            "postgres_url": database,
            "readiness_interval_s": 0.2,
            "health_timeout_s": 0.5,
        }
    )
    delete_after.append(cfg)
    await migrate(database)
    queue = schedule_queue(cfg)
    cluster = f"away-{unique}"
    async with (
        services(cfg, "state-tracker", "filter-worker", "weigher", "selector"),
        connect(cfg, "client") as bus,
    ):
        client = SchedulerClient(cfg, bus=bus)
        await factories.make_cluster(client, cluster, 3, **HOSTS)
        first = await client.schedule(cluster, factories.vm_spec(f"{unique}-0", mem_mb=256, vcpus=1))
        assert first.status is DecisionStatus.PLACED
        assert await consumers(cfg, queue) == 1

        await private_redis.stop()
        await until("the selector cancels its consumer", lambda: _no_consumer(cfg, queue))
        # Sent while no instance can work: they wait in the queue instead of failing.
        waiting = [
            asyncio.create_task(
                client.schedule(cluster, factories.vm_spec(f"{unique}-w{i}", mem_mb=256, vcpus=1), timeout=60)
            )
            for i in range(4)
        ]
        await asyncio.sleep(1.0)
        assert not any(t.done() for t in waiting)

        await private_redis.start()  # empty: it keeps nothing on disk
        await until("the selector consumes again", lambda: _has_consumer(cfg, queue))
        await factories.make_cluster(client, cluster, 3, **HOSTS)  # the engine reports its state again
        answers = await asyncio.gather(*waiting, return_exceptions=True)

    for answer in answers:
        assert not isinstance(answer, BaseException), answer
        assert answer.error is None or answer.error.code != "internal", answer.error
    assert sum(isinstance(a, ScheduleDecision) for a in answers) == len(waiting)


async def _no_consumer(cfg: Settings, queue: str) -> bool:
    return await consumers(cfg, queue) == 0


async def _has_consumer(cfg: Settings, queue: str) -> bool:
    return await consumers(cfg, queue) == 1


# ---------------------------------------------------------------------------------------- PostgreSQL away
@pytest.fixture
async def private_postgres(tmp_path: Path) -> AsyncIterator[PrivatePostgres]:
    server = PrivatePostgres(tmp_path / "postgres")
    await server.start()
    try:
        yield server
    finally:
        await server.kill()
        server.remove()


def staleness() -> float:
    return REGISTRY.get_sample_value("vmsched_policy_staleness_seconds") or 0.0


async def test_decisions_go_on_from_cached_policies_while_postgres_is_away(
    settings: Settings, private_postgres: PrivatePostgres, unique: str, delete_after: list[Settings]
) -> None:
    await migrate(private_postgres.dsn)
    cfg = settings.model_copy(
        update={
            "postgres_url": private_postgres.dsn,
            "amqp_prefix": f"{settings.amqp_prefix}pgaway-{unique}.",
            "policy_cache_ttl_s": 0.5,
            "policy_read_timeout_s": 1.0,
            "readiness_interval_s": 0.2,
            "rpc_timeout_s": 15.0,
        }
    )
    delete_after.append(cfg)
    seen, never = f"seen-{unique}", f"never-{unique}"
    async with (
        services(cfg, "state-tracker", "filter-worker", "weigher", "selector", "policy-admin"),
        connect(cfg, "client") as bus,
    ):
        client, admin = SchedulerClient(cfg, bus=bus), PolicyClient(cfg, bus=bus)
        await admin.clone("none", f"mine-{unique}")
        await admin.apply(PolicySet(clusters=[ClusterAttachment(cluster_id=seen, policy=f"mine-{unique}")]))
        for cluster in (seen, never):
            await factories.make_cluster(client, cluster, 3, **HOSTS)
        before = await client.schedule(seen, factories.vm_spec(f"{unique}-0", mem_mb=128, vcpus=1))
        assert (before.status, before.policy) == (DecisionStatus.PLACED, f"mine-{unique}")
        assert staleness() == 0.0

        await private_postgres.stop()
        for i in range(1, 6):  # past the cache's TTL several times over
            await asyncio.sleep(0.3)
            d = await client.schedule(seen, factories.vm_spec(f"{unique}-{i}", mem_mb=128, vcpus=1))
            assert (d.status, d.policy) == (DecisionStatus.PLACED, f"mine-{unique}"), d.error
        assert staleness() > 0.5

        refused = await client.schedule(never, factories.vm_spec(f"{unique}-n", mem_mb=128, vcpus=1))
        assert refused.status is DecisionStatus.ERROR
        assert refused.error is not None
        assert refused.error.code == "policy_store_unavailable"

        with pytest.raises(RemoteError) as info:
            await admin.apply(PolicySet(clusters=[ClusterAttachment(cluster_id=never, policy=f"mine-{unique}")]))
        assert info.value.remote_code == "policy_store_unavailable"
        assert "PostgreSQL" in info.value.message

        await private_postgres.start()
        await asyncio.sleep(cfg.readiness_interval_s * 2)  # the cache tries again this often while away
        after = await client.schedule(never, factories.vm_spec(f"{unique}-a", mem_mb=128, vcpus=1))
        assert after.status is DecisionStatus.PLACED, after.error
        assert staleness() == 0.0
        # The apply that met the outage stored nothing; sent again, it does.
        await admin.apply(PolicySet(clusters=[ClusterAttachment(cluster_id=never, policy=f"mine-{unique}")]))


# ---------------------------------------------------------------------------------------- pausing on RabbitMQ
async def test_a_paused_consumer_finishes_what_it_holds_and_another_instance_takes_the_rest(
    settings: Settings, unique: str, delete_after: list[Settings]
) -> None:
    cfg = settings.model_copy(update={"amqp_prefix": f"{settings.amqp_prefix}pause-{unique}."})
    delete_after.append(cfg)
    route = f"pause-{unique}"
    answered: list[str] = []
    holding = asyncio.Event()

    def handler(name: str, hold_s: float) -> Callable[[StateRequest], Awaitable[StateRequest]]:
        async def handle(req: StateRequest) -> StateRequest:  # an echo is reply enough here
            holding.set()
            await asyncio.sleep(hold_s)
            answered.append(name)
            return req

        return handle

    async with connect(cfg, "a") as a, connect(cfg, "b") as b, connect(cfg, "client") as client:
        queue = a.rpc_queue(route)  # type: ignore[attr-defined]  # an AmqpBus
        await a.serve(route, StateRequest, handler("a", 1.0))
        held = asyncio.create_task(client.call(route, StateRequest(cluster_id="held"), StateRequest, timeout=10))
        await asyncio.wait_for(holding.wait(), 5)
        await a.pause_consuming()
        # Gone from the broker's count at once on a classic queue; a quorum queue may count a
        # cancelled consumer until the leader has applied the cancel.
        await until_async("the paused consumer is cancelled", lambda: consumers(cfg, queue), 0)
        await b.serve(route, StateRequest, handler("b", 0.0))
        for i in range(4):
            await client.call(route, StateRequest(cluster_id=f"c{i}"), StateRequest, timeout=10)
        assert (await held).cluster_id == "held"  # answered by the paused one: it kept what it held
        assert answered.count("a") == 1
        assert answered.count("b") == 4
        assert await a.resume_consuming()
        assert await consumers(cfg, queue) == 2
