"""The leased periodic loop the balancer and the HA monitor share, on the real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation
from vmsched.bus import MemoryBus
from vmsched.contracts import ClusterReport
from vmsched.leased_loop import LeasedLoop
from vmsched.runtime import Runtime
from vmsched.settings import Settings
from vmsched.store import StateCache, StateWriter

pytestmark = pytest.mark.integration


def runtime(settings: Settings, redis_client: aioredis.Redis) -> Runtime:
    fast = settings.model_copy(update={"lease_ttl_s": 0.6})
    return Runtime(settings=fast, bus=MemoryBus(fast), redis=redis_client, state=StateCache(redis_client, fast))


async def test_one_replica_works_each_cluster_failures_are_retried_and_a_stopped_loop_hands_over(
    settings: Settings, redis_client: aioredis.Redis, unique: str
) -> None:
    cluster = f"loop-{unique}"
    await StateWriter(redis_client, settings, recover=first_generation(redis_client, settings)).apply_cluster(
        ClusterReport(cluster_id=cluster)
    )
    runs: dict[str, list[str]] = {"a": [], "b": []}

    def work(name: str, *, fail: bool = False) -> Callable[[str], Awaitable[None]]:
        async def run(cluster_id: str) -> None:
            if cluster_id == cluster:
                runs[name].append(cluster_id)
                if fail:
                    raise RuntimeError("this cluster's work failed")

        return run

    role = f"test-role-{unique}"
    a = LeasedLoop(runtime(settings, redis_client), role, 0.2, work("a", fail=True))
    b = LeasedLoop(runtime(settings, redis_client), role, 0.2, work("b"))
    task_a = asyncio.create_task(a.run())
    await asyncio.sleep(0.1)  # a claims the lease first
    task_b = asyncio.create_task(b.run())
    await asyncio.sleep(1.0)
    # Only the owner works the cluster, once per interval, and its failures do not stop the loop.
    assert len(runs["a"]) >= 3
    assert runs["b"] == []
    task_a.cancel()
    await asyncio.gather(task_a, return_exceptions=True)
    # The stopped loop released its lease: the other replica takes the cluster on its next turn.
    await asyncio.sleep(0.5)
    assert runs["b"] != []
    assert await b.leases.holder(cluster) == b.leases.owner
    task_b.cancel()
    await asyncio.gather(task_b, return_exceptions=True)
    assert await b.leases.holder(cluster) is None
