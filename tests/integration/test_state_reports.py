"""The state tracker's intake as an engine meets it, on RabbitMQ and in memory: a report whose routing
key and body name different clusters is refused (dead-lettered, saying both), a newer engine's
report with fields this version does not know is applied without them, and on RabbitMQ a report
without the `type` property is dead-lettered as asyncapi.json says. Many reports in one
StateReports (as ReportBatcher sends them) are applied as the same reports one by one, pending
records cleared; a misfiled one is refused whole."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import pytest

from tests.factories import vm_report
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched import constants as c
from vmsched.bus.amqp import AmqpBus
from vmsched.bus.codec import CONTENT_TYPE, encode
from vmsched.client import ReportBatcher, SchedulerClient
from vmsched.contracts import HostReport, PendingEntry, StateReports, VmStatus
from vmsched.db import migrate
from vmsched.settings import Settings
from vmsched.store import Keys, PendingStore
from vmsched.store.redis import connect

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

#: (routing key, reason, body) of one dead letter.
DeadLetterRow = tuple[str, str, bytes]


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    # The state tracker numbers generations in PostgreSQL: the module runs on its own too.
    await migrate(database)
    async with services(bus_settings, "state-tracker", bus=buses):
        yield bus_settings


async def _dead_letters(buses: Buses, cfg: Settings) -> list[DeadLetterRow]:
    if buses.broker is not None:
        return [(d.routing_key, d.reason, d.body) for d in buses.broker.dead_letters]
    async with AmqpBus(cfg, "test-ops") as ops:
        assert isinstance(ops, AmqpBus)
        return [(d.routing_key, d.reason, d.body) for d in await ops.dead_letters(limit=10_000)]


async def _dead_letter(buses: Buses, cfg: Settings, body: bytes, timeout: float = 10.0) -> DeadLetterRow:
    async with asyncio.timeout(timeout):
        while True:
            for row in await _dead_letters(buses, cfg):
                if row[2] == body:
                    return row
            await asyncio.sleep(0.1)


async def _host_ids(client: SchedulerClient, cluster: str) -> list[str]:
    return [h.report.host_id for h in (await client.state(cluster)).hosts]


def _host(cluster: str, host_id: str, **extra: object) -> HostReport:
    fields = {"cluster_id": cluster, "host_id": host_id, "status": "up", "cpu_cores": 8}
    return HostReport.model_validate({**fields, "physical_mem_mb": 8192, "mem_free_mb": 8192, **extra})


async def test_a_report_whose_routing_key_names_another_cluster_is_refused(
    stack: Settings, buses: Buses, client: SchedulerClient, unique: str
) -> None:
    body_cluster, key_cluster = f"body-{unique}", f"key-{unique}"
    misfiled = _host(body_cluster, "h-misfiled")
    await client.bus.publish(c.host_report_key(key_cluster), misfiled)

    key, reason, _ = await _dead_letter(buses, stack, encode(misfiled))
    assert f"'{key_cluster}'" in reason
    assert f"'{body_cluster}'" in reason
    assert key in {c.host_report_key(key_cluster), stack.amqp_prefix + c.STATE_EVENTS_QUEUE}

    # The tracker goes on, and the refused report is in neither cluster.
    await client.report_host(_host(body_cluster, "h-filed"))
    await client.report_host(_host(key_cluster, "h-filed"))
    await client.wait_for_state(body_cluster, hosts=1, timeout=10)
    await client.wait_for_state(key_cluster, hosts=1, timeout=10)
    assert await _host_ids(client, body_cluster) == ["h-filed"]
    assert await _host_ids(client, key_cluster) == ["h-filed"]


async def test_a_newer_engines_report_is_applied_without_the_fields_it_adds(
    stack: Settings, client: SchedulerClient, unique: str
) -> None:
    cluster = f"newer-{unique}"
    added = f"gpu_count_{unique}"
    report = _host(cluster, "h1", **{added: 4, "numa": {"nodes": 2}})
    assert added in json.loads(encode(report))  # it goes on the wire as a newer engine would send it
    await client.report_host(report)
    state = await client.wait_for_state(cluster, hosts=1, timeout=10)
    stored = state.hosts[0].report
    assert stored.model_copy(update={"reported_at": None}) == _host(cluster, "h1")
    assert stored.__pydantic_extra__ == {}


async def test_a_report_without_reported_at_counts_as_taken_when_the_tracker_takes_it(
    stack: Settings, client: SchedulerClient, unique: str
) -> None:
    """The contract: an absent reported_at means when the state tracker takes the report. Stored
    absent, it read as "no heartbeat ever" and ComputeFilter removed every host of such an engine."""
    cluster = f"untimed-{unique}"
    before = datetime.now(UTC)
    await client.report_host(_host(cluster, "h1"))
    state = await client.wait_for_state(cluster, hosts=1, timeout=10)
    stamped = state.hosts[0].report.reported_at
    assert stamped is not None
    assert before <= stamped <= datetime.now(UTC)
    given = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    await client.report_host(_host(cluster, "h2", reported_at=given.isoformat()))
    state = await client.wait_for_state(cluster, hosts=2, timeout=10)
    assert {h.report.host_id: h.report.reported_at for h in state.hosts}["h2"] == given


async def test_a_report_without_the_type_property_is_dead_lettered(
    stack: Settings, buses: Buses, client: SchedulerClient, unique: str
) -> None:
    """The state tracker's queue takes three kinds of report and picks the model by `type`."""
    if buses.broker is not None:
        pytest.skip("MemoryBus always sets the type property; a raw publish needs RabbitMQ")
    report = _host(f"untyped-{unique}", "h1")
    conn = await aio_pika.connect(stack.amqp_url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        events = await ch.get_exchange(f"{stack.amqp_prefix}{c.EVENTS_EXCHANGE}", ensure=False)
        await events.publish(
            aio_pika.Message(encode(report), content_type=CONTENT_TYPE),
            routing_key=c.host_report_key(report.cluster_id),
        )
    _, reason, _ = await _dead_letter(buses, stack, encode(report))
    assert "no type property" in reason
    assert "HostReport" in reason


async def test_many_reports_in_one_message_are_applied_as_the_same_reports_one_by_one(
    stack: Settings, client: SchedulerClient, unique: str
) -> None:
    """Hosts and VMs in one StateReports: every host and VM is in the state, and the VM reported
    running on the host it was placed on has its pending record cleared (as a lone VmReport does)."""
    cluster = f"many-{unique}"
    redis = connect(stack)
    try:
        await redis.set(Keys.from_settings(stack).fence(cluster), 1)
        placed = PendingEntry(
            vm_id="vm-0", host_id="h0", mem_mb=512, vcpus=1, request_id=uuid.uuid4(), fencing_token=1, expires_at=1e10
        )
        await PendingStore(redis, stack).record(cluster, [placed], 1)
        hosts = [_host(cluster, f"h{i}") for i in range(3)]
        vms = [vm_report(cluster, f"vm-{i}", f"h{i % 3}", mem_mb=512, vcpus=1) for i in range(5)]
        await client.report_states(StateReports(cluster_id=cluster, hosts=hosts, vms=vms))
        state = await client.wait_for_state(cluster, hosts=3, timeout=10)
        assert sorted(h.report.host_id for h in state.hosts) == ["h0", "h1", "h2"]
        assert sorted(v.vm_id for v in state.vms) == [f"vm-{i}" for i in range(5)]
        assert await PendingStore(redis, stack).read(cluster) == []
    finally:
        await redis.aclose()


async def test_reports_handed_in_together_go_as_one_message_and_in_their_order(
    stack: Settings, client: SchedulerClient, unique: str
) -> None:
    """ReportBatcher: a VM reported up, then down, then up elsewhere, among other reports handed in
    at once, ends as the last report says."""
    cluster = f"batched-{unique}"
    batcher = ReportBatcher(client)
    await asyncio.gather(*(batcher.report(_host(cluster, f"h{i}")) for i in range(3)))
    await client.wait_for_state(cluster, hosts=3, timeout=10)
    steps = [
        vm_report(cluster, "vm-x", "h0", mem_mb=512, vcpus=1),
        vm_report(cluster, "vm-x", None, VmStatus.DOWN, mem_mb=512, vcpus=1),
        *(vm_report(cluster, f"vm-{i}", "h1", mem_mb=256, vcpus=1) for i in range(20)),
        vm_report(cluster, "vm-x", "h2", mem_mb=1024, vcpus=2),
    ]
    await asyncio.gather(*(batcher.report(r) for r in steps))
    await batcher.wait_sent()
    for _ in range(200):
        state = await client.state(cluster)
        if len(state.vms) >= 21:
            break
        await asyncio.sleep(0.05)
    [x] = [v for v in state.vms if v.vm_id == "vm-x"]
    assert (x.host_id, x.mem_mb, x.vcpus, x.status) == ("h2", 1024, 2, VmStatus.RUNNING)


async def test_a_state_reports_message_filed_under_another_cluster_is_refused_whole(
    stack: Settings, buses: Buses, client: SchedulerClient, unique: str
) -> None:
    body_cluster, key_cluster = f"sbody-{unique}", f"skey-{unique}"
    misfiled = StateReports(cluster_id=body_cluster, hosts=[_host(body_cluster, "h1"), _host(body_cluster, "h2")])
    await client.bus.publish(c.state_reports_key(key_cluster), misfiled)
    _, reason, _ = await _dead_letter(buses, stack, encode(misfiled))
    assert f"'{key_cluster}'" in reason
    assert f"'{body_cluster}'" in reason
    await client.report_states(StateReports(cluster_id=body_cluster, hosts=[_host(body_cluster, "h3")]))
    await client.wait_for_state(body_cluster, hosts=1, timeout=10)
    assert await _host_ids(client, body_cluster) == ["h3"]
