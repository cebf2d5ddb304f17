"""The durable queues' type (VMSCHED_QUEUE_TYPE) on the real broker: quorum queues by default,
classic ones on request, an existing queue of the other type used as it is, and dead-lettering
from a quorum queue (the broker's own, at least once) reaching the dead-letter queue and sent
again from there."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import aio_pika
import pytest
import structlog

from tests.integration.conftest import declared_with
from vmsched import constants as c
from vmsched.bus.amqp import AmqpBus, dead_letter_queue_arguments, work_queue_arguments
from vmsched.bus.amqp import connection as amqp_connection
from vmsched.bus.codec import CONTENT_TYPE, encode
from vmsched.contracts import ClusterReport, ClusterState, Message, StateRequest
from vmsched.settings import Settings
from vmsched_services.tools.procs import delete_broker_objects
from vmsched_services.tools.servers.base import free_port

pytestmark = [pytest.mark.integration]

#: The queue of the route "t-route" (a route of no service is served from vmsched.<route>).
ROUTE_QUEUE = "vmsched.t-route"


async def answer(request: StateRequest) -> ClusterState:
    return ClusterState(
        cluster_id=request.cluster_id,
        version=0,
        settings=ClusterReport(cluster_id=request.cluster_id),
        hosts=[],
        vms=[],
    )


def classic_arguments(settings: Settings) -> dict[str, Any]:
    return {"x-dead-letter-exchange": f"{settings.amqp_prefix}{c.DEAD_LETTER_EXCHANGE}"}


@pytest.fixture
async def scoped(settings: Settings) -> AsyncIterator[Settings]:
    """The run's settings under a prefix of this test's own (its queues and exchanges deleted after)."""
    own = settings.model_copy(update={"amqp_prefix": f"{settings.amqp_prefix}qq-{uuid.uuid4().hex[:6]}."})
    yield own
    await delete_broker_objects(own)
    conn = await aio_pika.connect(own.amqp_url)
    async with conn:
        for queue in (f"{own.amqp_prefix}{ROUTE_QUEUE}", f"{own.amqp_prefix}t-events"):
            ch = await conn.channel()
            with contextlib.suppress(Exception):
                await ch.queue_delete(queue)


@contextlib.asynccontextmanager
async def started(settings: Settings, service: str = "test") -> AsyncIterator[AmqpBus]:
    bus = AmqpBus(settings, service)
    await bus.start()
    try:
        yield bus
    finally:
        await bus.close()


async def nothing(_: Message) -> None:
    return None


async def test_work_event_and_dead_letter_queues_are_quorum_queues_by_default(scoped: Settings) -> None:
    assert scoped.queue_type == "quorum"
    async with started(scoped) as bus:
        await bus.serve("t-route", StateRequest, answer)
        await bus.subscribe(["t.#"], [ClusterReport], nothing, queue="t-events")
        quorum = work_queue_arguments(scoped, bus.name(c.DEAD_LETTER_EXCHANGE))
        assert quorum["x-queue-type"] == "quorum"
        assert quorum["x-dead-letter-strategy"] == "at-least-once"
        assert quorum["x-overflow"] == "reject-publish"
        for queue in (bus.rpc_queue("t-route"), bus.name("t-events")):
            assert await declared_with(scoped, queue, quorum), queue
            assert not await declared_with(scoped, queue, classic_arguments(scoped)), queue
        dlq = bus.name(c.DEAD_LETTER_QUEUE)
        assert await declared_with(scoped, dlq, dead_letter_queue_arguments(scoped))
        assert dead_letter_queue_arguments(scoped)["x-queue-type"] == "quorum"
        assert bus.dead_letter_queue_bounded


async def test_classic_setting_declares_classic_queues_as_before(scoped: Settings) -> None:
    classic = scoped.model_copy(update={"queue_type": "classic"})
    async with started(classic) as bus:
        await bus.serve("t-route", StateRequest, answer)
        queue = bus.rpc_queue("t-route")
        assert work_queue_arguments(classic, bus.name(c.DEAD_LETTER_EXCHANGE)) == classic_arguments(classic)
        assert await declared_with(classic, queue, classic_arguments(classic))
        assert not await declared_with(classic, queue, work_queue_arguments(scoped, bus.name(c.DEAD_LETTER_EXCHANGE)))
        assert "x-queue-type" not in dead_letter_queue_arguments(classic)


async def test_a_queue_of_the_other_type_is_used_as_it_is_with_a_warning(
    scoped: Settings, fresh_log: Callable[[ModuleType], None]
) -> None:
    """A deployment upgraded with its classic queues in place: the services serve from them and
    say how to convert them, instead of failing on PRECONDITION_FAILED."""
    queue = f"{scoped.amqp_prefix}{ROUTE_QUEUE}"
    conn = await aio_pika.connect(scoped.amqp_url)
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=True, arguments=classic_arguments(scoped))
    with structlog.testing.capture_logs() as logged:
        fresh_log(amqp_connection)
        async with started(scoped, "state-tracker") as server, started(scoped, "client") as client:
            await server.serve("t-route", StateRequest, answer)
            reply = await client.call("t-route", StateRequest(cluster_id="c1"), ClusterState)
    assert reply.cluster_id == "c1"
    assert await declared_with(scoped, queue, classic_arguments(scoped))  # still classic
    warned = [e for e in logged if e["event"].startswith("the queue exists with other arguments")]
    assert warned
    assert warned[0]["log_level"] == "warning"
    assert "inequivalent arg" in warned[0]["broker_said"]
    assert f"rabbitmqctl delete_queue {queue}" in warned[0]["to_convert"]


async def test_a_request_expired_in_a_quorum_queue_reaches_the_dead_letter_queue_and_is_sent_again(
    scoped: Settings,
) -> None:
    """The broker's own dead-lettering (at least once) from a quorum work queue: the expired request is
    in the dead-letter queue, and requeueing puts it back on its queue."""
    async with started(scoped) as bus:
        sub = await bus.serve("t-route", StateRequest, answer)
        await sub.cancel()  # the queue stays, nobody consumes it
        queue = bus.rpc_queue("t-route")
        body = encode(StateRequest(cluster_id=f"expired-{uuid.uuid4().hex[:6]}"))
        ch = await bus.connection.channel(publisher_confirms=True)
        exchange = await ch.get_exchange(bus.name(c.RPC_EXCHANGE), ensure=False)
        await exchange.publish(
            aio_pika.Message(body, content_type=CONTENT_TYPE, expiration=0.05), routing_key="t-route", mandatory=True
        )
        found = None
        deadline = time.monotonic() + 10
        while found is None and time.monotonic() < deadline:
            found = next((d for d in await bus.dead_letters() if d.body == body), None)
            await asyncio.sleep(0.1)
        assert found is not None, "the expired request never reached the dead-letter queue"
        assert found.reason == "expired by the broker"
        assert found.queue == queue
        assert await bus.queue_depths([ROUTE_QUEUE]) == {ROUTE_QUEUE: 0}
        result = await bus.requeue_dead_letters([found.id])
        assert result.requeued == [found.id]
        assert await bus.queue_depths([ROUTE_QUEUE]) == {ROUTE_QUEUE: 1}
        assert all(d.body != body for d in await bus.dead_letters())


async def test_a_bus_whose_first_node_is_down_connects_to_the_next_one(scoped: Settings) -> None:
    down = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    two_nodes = scoped.model_copy(update={"amqp_url": down, "amqp_failover_urls": scoped.amqp_url})
    async with started(two_nodes, "state-tracker") as server, started(two_nodes, "client") as client:
        await server.serve("t-route", StateRequest, answer)
        assert (await client.call("t-route", StateRequest(cluster_id="c2"), ClusterState)).cluster_id == "c2"
        assert server.link.node_url == scoped.amqp_url
