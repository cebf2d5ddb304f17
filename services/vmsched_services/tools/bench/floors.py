"""The floors under every decision: one bus round trip to an empty handler, and one Redis lock."""

from __future__ import annotations

import contextlib

import aio_pika

from vmsched.bus import connect as connect_bus
from vmsched.contracts import ClusterReport, ClusterState, StateRequest
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.bench.timing import timed


async def delete_queue(settings: Settings, name: str) -> None:
    """Delete the (prefixed) queue `name`: the echo's queue outlives its consumer otherwise."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        with contextlib.suppress(Exception):
            await ch.queue_delete(settings.amqp_prefix + name)
    finally:
        await conn.close()


async def bench_hop(settings: Settings, calls: int) -> dict[str, float]:
    """One RPC round trip to an empty handler in another bus connection: the cost of a hop."""

    server, client = connect_bus(settings, "bench-echo"), connect_bus(settings, "bench-client")
    await server.start()
    await client.start()

    async def echo(req: StateRequest) -> ClusterState:
        return ClusterState(
            cluster_id=req.cluster_id, version=0, settings=ClusterReport(cluster_id="e"), hosts=[], vms=[]
        )

    await server.serve("bench-echo", StateRequest, echo)
    req = StateRequest(cluster_id="e")

    async def one(_: int) -> None:
        await client.call("bench-echo", req, ClusterState)

    try:
        await timed(20, 1, one)  # warm up
        return await timed(calls, 1, one)
    finally:
        await client.close()
        await server.close()
        await delete_queue(settings, "vmsched.bench-echo")


async def bench_lock(settings: Settings, rounds: int) -> dict[str, float]:
    """Take and release a cluster's lock in Redis, uncontended: the floor under every decision."""
    redis = connect_redis(settings)
    locks = ClusterLock(redis, settings, recover=Recovery.standalone(redis, settings, "bench"))

    async def one(_: int) -> None:
        async with locks.hold("bench-lock"):
            pass

    try:
        await timed(20, 1, one)  # warm up
        return await timed(rounds, 1, one)
    finally:
        await redis.aclose()


__all__ = ["bench_hop", "bench_lock"]
