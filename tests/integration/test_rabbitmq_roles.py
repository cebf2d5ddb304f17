"""The RabbitMQ roles of `vmsched security`, on a private RabbitMQ node that imported the definitions.

Every service runs as its own user, declaring nothing (VMSCHED_AMQP_DECLARE=false), and the engine
as vmsched-engine reading vmsched.engine.events: a VM is placed and its decision reaches the engine.
Then each refusal the roles exist for is tried for real and the broker refuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiormq
import pytest

from tests.factories import host_report
from tests.integration.conftest import services
from vmsched import constants as c
from vmsched.bus import connect
from vmsched.client import SchedulerClient
from vmsched.contracts import PolicyListing, PolicyQuery, ScheduleDecision, StateReports, VmSpec
from vmsched.db import migrate
from vmsched.errors import NotAuthorized
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.tools.security import rabbit_defs
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, ROLES, SERVICE_ROLES, user_name
from vmsched_services.tools.servers.rabbit import RabbitNode

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PASSWORDS = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in ROLES}


@pytest.fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> AsyncIterator[RabbitNode]:
    """A private node holding the definitions of every role (the services' settings' prefix)."""
    directory = tmp_path_factory.mktemp("rabbit-roles")
    rabbit = RabbitNode(directory / "node", f"vmsched-roles-{uuid.uuid4().hex[:6]}@localhost", uuid.uuid4().hex)
    await rabbit.start()
    try:
        defs = directory / "definitions.json"
        defs.write_text(json.dumps(rabbit_defs.definitions(settings, PASSWORDS)))
        await rabbit.ctl("import_definitions", str(defs))
        yield rabbit
    finally:
        await rabbit.stop()


def as_role(settings: Settings, node: RabbitNode, role: str, **update: object) -> Settings:
    url = f"amqp://{user_name(role)}:{PASSWORDS[role]}@127.0.0.1:{node.port}/"
    extra: dict[str, object] = {"amqp_url": url, "amqp_declare": False, "admin_users": user_name(ADMIN)}
    if role == ENGINE:
        extra["amqp_events_queue"] = c.ENGINE_EVENTS_QUEUE
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}:roles", **extra, **update})


@pytest.fixture(scope="module")
async def stack(settings: Settings, database: str, node: RabbitNode) -> AsyncIterator[Settings]:
    """Every service kind in this process, each as its own RabbitMQ user."""
    await migrate(database)
    async with contextlib.AsyncExitStack() as running:
        for role in SERVICE_ROLES:
            await running.enter_async_context(services(as_role(settings, node, role), role))
        yield as_role(settings, node, ENGINE)


async def test_each_role_does_its_job_declaring_nothing(stack: Settings, settings: Settings, node: RabbitNode) -> None:
    cluster = f"roles-{uuid.uuid4().hex[:6]}"
    async with SchedulerClient(stack) as engine:
        decisions: asyncio.Queue[ScheduleDecision] = asyncio.Queue()

        async def follow() -> None:
            async for d in engine.decisions(cluster):
                await decisions.put(d)

        following = asyncio.create_task(follow())
        try:
            await engine.report_host(host_report(cluster, "h0", cpu_cores=16, physical_mem_mb=65536, mem_free_mb=60000))
            # Many reports as one message: on the engine's topic permissions too.
            more = [
                host_report(cluster, f"h{i}", cpu_cores=16, physical_mem_mb=65536, mem_free_mb=60000) for i in (1, 2)
            ]
            await engine.report_states(StateReports(cluster_id=cluster, hosts=more))
            await engine.wait_for_state(cluster, hosts=3)
            decision = await engine.schedule(cluster, VmSpec(vm_id="vm-1", mem_mb=1024, vcpus=1))
            assert decision.host_id in {"h0", "h1", "h2"}
            seen = await asyncio.wait_for(decisions.get(), 10)
            assert seen.request_id == decision.request_id
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
    async with connect(as_role(settings, node, ADMIN), "admin") as bus:
        listing = await PolicyClient(bus=bus).read()
        assert listing.policies


async def test_the_api_reads_over_the_bus_and_streams_events(
    stack: Settings, settings: Settings, node: RabbitNode
) -> None:
    """The HTTP API's user: the engine's reads, the administrators' calls, its own event queues; no
    event of its own, no internal route."""
    cluster = f"api-{uuid.uuid4().hex[:6]}"
    async with SchedulerClient(stack) as engine, connect(as_role(settings, node, API), API) as bus:
        api = SchedulerClient(bus=bus)
        events: asyncio.Queue[object] = asyncio.Queue()

        async def follow() -> None:
            async for event in api.events(cluster):
                await events.put(event)

        following = asyncio.create_task(follow())
        try:
            await engine.report_host(host_report(cluster, "h0", cpu_cores=16, physical_mem_mb=65536, mem_free_mb=60000))
            await engine.wait_for_state(cluster, hosts=1)
            assert (await api.what_if(cluster, VmSpec(vm_id="vm-1", mem_mb=1024, vcpus=1))).host_id == "h0"
            decision = await engine.schedule(cluster, VmSpec(vm_id="vm-1", mem_mb=1024, vcpus=1))
            seen = await asyncio.wait_for(events.get(), 10)
            assert isinstance(seen, ScheduleDecision)
            assert seen.request_id == decision.request_id
            assert cluster in {s.cluster_id for s in (await api.clusters()).clusters}
            assert (await api.recent_decisions(cluster)).decisions == [decision]
            assert await api.decision(cluster, decision.request_id) == decision
            assert (await PolicyClient(bus=bus).read()).policies
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        with pytest.raises(NotAuthorized, match=r"decision\.c1"):
            await bus.publish(c.decision_key("c1"), PolicyQuery())
        with pytest.raises(NotAuthorized, match=r"vmsched\.internal"):
            await bus.call(c.RPC_PLACE, PolicyQuery(), PolicyListing)


async def test_engine_cannot_publish_a_decision(stack: Settings) -> None:
    async with connect(stack, "engine") as bus:
        with pytest.raises(NotAuthorized, match=r"decision\.c1"):
            await bus.publish(c.decision_key("c1"), PolicyQuery())


async def test_engine_cannot_remove_hosts_itself(stack: Settings) -> None:
    async with connect(stack, "engine") as bus:
        with pytest.raises(NotAuthorized, match=r"state\.host-removed"):
            await bus.publish(c.host_removed_key("c1"), PolicyQuery())


async def test_engine_cannot_reach_policy_administration(stack: Settings) -> None:
    async with connect(stack, "engine") as bus:
        with pytest.raises(NotAuthorized, match=r"vmsched\.admin"):
            await bus.call(c.RPC_POLICY_READ, PolicyQuery(), PolicyListing)


async def test_engine_cannot_call_the_services_internal_routes(stack: Settings) -> None:
    async with connect(stack, "engine") as bus:
        with pytest.raises(NotAuthorized, match=r"vmsched\.internal"):
            await bus.call(c.RPC_PLACE, PolicyQuery(), PolicyListing)


async def test_engine_cannot_read_dead_letters(stack: Settings) -> None:
    async with connect(stack, "engine") as bus:
        with pytest.raises(NotAuthorized, match=r"dead-letter"):
            await bus.dead_letters()


async def test_a_service_cannot_publish_another_services_events(
    stack: Settings, settings: Settings, node: RabbitNode
) -> None:
    async with connect(as_role(settings, node, "selector"), "selector") as bus:
        with pytest.raises(NotAuthorized, match=r"migration\.c1"):
            await bus.publish(c.migration_key("c1"), PolicyQuery())


async def test_a_service_cannot_administer(stack: Settings, settings: Settings, node: RabbitNode) -> None:
    async with connect(as_role(settings, node, "filter-worker"), "filter-worker") as bus:
        with pytest.raises(NotAuthorized, match=r"vmsched\.admin"):
            await bus.call(c.RPC_POLICY_READ, PolicyQuery(), PolicyListing)


async def _raw(node: RabbitNode, role: str) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(f"amqp://{user_name(role)}:{PASSWORDS[role]}@127.0.0.1:{node.port}/")


async def test_engine_declares_nothing(stack: Settings, node: RabbitNode) -> None:
    conn = await _raw(node, ENGINE)
    async with conn:
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await ch.declare_queue("engine-made", durable=True)


async def test_nobody_can_send_as_another_user(stack: Settings, node: RabbitNode) -> None:
    """The user_id property is what authorization trusts: the broker refuses one naming another user."""
    conn = await _raw(node, ENGINE)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        exchange = await ch.get_exchange(f"{stack.amqp_prefix}{c.RPC_EXCHANGE}", ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="user_id"):
            await exchange.publish(aio_pika.Message(b"{}", user_id=user_name(ADMIN)), routing_key=c.RPC_SCHEDULE)


def test_definitions_hold_no_clear_password(tmp_path: Path, settings: Settings) -> None:
    text = json.dumps(rabbit_defs.definitions(settings, PASSWORDS))
    assert not [p for p in PASSWORDS.values() if p in text]
