"""The reads for callers without Redis or PostgreSQL (the HTTP API, an engine), on real servers with
the services in this process: `clusters.list`, `decisions.recent` and `decisions.get` (state
tracker), and `whatif` (selector): the decision `schedule` would make, host by host, leaving no
pending record, stored decision or event behind."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from functools import partial

import pytest
from pydantic import ValidationError

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    DecisionStatus,
    FilterEntry,
    HostStatus,
    PolicyDocument,
    PolicyOrigin,
    ScheduleDecision,
    VmSpec,
    WhatIfReply,
)
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.errors import RemoteError
from vmsched.lifecycle.whatif import NOT_UP
from vmsched.settings import Settings
from vmsched.store import DecisionStore, PendingStore
from vmsched.store.redis import connect

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

HOST_MEM = 8192

make_cluster = partial(
    factories.make_cluster, cpu_cores=8, physical_mem_mb=HOST_MEM, mem_free_mb=HOST_MEM, reserved_mem_mb=0
)


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", bus=buses):
        yield cfg


def vm(i: int | str = 0, mem_mb: int = 1024) -> VmSpec:
    return factories.vm_spec(f"vm-{i}", mem_mb=mem_mb, vcpus=1)


@contextlib.asynccontextmanager
async def decisions_seen(client: SchedulerClient, cluster: str) -> AsyncIterator[list[ScheduleDecision]]:
    """Every decision event of `cluster` while the block runs (the subscription is made first)."""
    seen: list[ScheduleDecision] = []

    async def follow() -> None:
        async for d in client.decisions(cluster):
            seen.append(d)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.3)  # the subscription's queue is bound before anything is published
    try:
        yield seen
    finally:
        await asyncio.sleep(0.5)  # an event published by the block has time to arrive
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await task


async def test_clusters_list_counts_each_cluster_with_its_policy(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    a, b = f"ls-a-{unique}", f"ls-b-{unique}"
    await make_cluster(client, a, 2)
    hosts_b = await make_cluster(client, b, 3)
    await client.report_vm(factories.vm_report(b, "vm-1", hosts_b[0], mem_mb=1024, vcpus=1))
    pool = await connect_pg(stack.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(b, "power_saving")
        default = (await PolicyRepository(pool).get_default()).name
    finally:
        await pool.close()
    for _ in range(100):  # the VM report is applied in order after the hosts'
        listing = {s.cluster_id: s for s in (await client.clusters()).clusters}
        if listing[b].vms == 1:
            break
        await asyncio.sleep(0.05)
    assert (listing[a].hosts, listing[a].vms) == (2, 0)
    assert (listing[b].hosts, listing[b].vms) == (3, 1)
    # At least one version per commit; reports that waited together share one (state_tracker.batches).
    assert listing[a].state_version >= 1
    assert listing[b].state_version >= 1
    assert listing[b].policy == "power_saving"
    assert listing[a].policy == default


async def test_recent_decisions_and_one_decision(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"dec-{unique}"
    await make_cluster(client, cluster, 2)
    first = await client.schedule(cluster, vm(1))
    second = await client.schedule(cluster, vm(2))
    listing = await client.recent_decisions(cluster, limit=10)
    assert [d.request_id for d in listing.decisions] == [second.request_id, first.request_id]
    assert (await client.recent_decisions(cluster, limit=1)).decisions == [second]
    got = await client.decision(cluster, str(first.request_id))
    assert got == first
    with pytest.raises(RemoteError) as refused:
        await client.decision(cluster, uuid.uuid4())
    assert refused.value.remote_code == "decision_not_found"
    assert (await client.recent_decisions(f"none-{unique}")).decisions == []
    with pytest.raises(ValidationError):
        await client.recent_decisions(cluster, limit=1001)


async def test_whatif_is_schedule_without_its_traces(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"wi-{unique}"
    # Different free memory so the weights tell the hosts apart; a small host the Memory filter
    # removes; a host that is down.
    hosts = await make_cluster(client, cluster, 3, vary=lambda i: {"mem_free_mb": HOST_MEM - 2048 * i})
    await client.report_host(
        factories.host_report(cluster, "small", cpu_cores=8, physical_mem_mb=512, mem_free_mb=512, reserved_mem_mb=0)
    )
    await client.report_host(
        factories.host_report(
            cluster, "down", status=HostStatus.DOWN, cpu_cores=8, physical_mem_mb=HOST_MEM, mem_free_mb=HOST_MEM
        )
    )
    await client.wait_for_state(cluster, hosts=5)
    redis = connect(stack)
    try:
        async with decisions_seen(client, cluster) as seen:
            reply = await client.what_if(cluster, vm(1))
            assert await PendingStore(redis, stack).read(cluster) == []
            assert await DecisionStore(redis, stack).recent(cluster) == []
            # Where `schedule` puts it, on the same state; then the what-if counts its pending record.
            decision = await client.schedule(cluster, vm(1))
        # The one decision event is the schedule's: the subscription works, the what-if published none.
        assert [d.request_id for d in seen] == [decision.request_id]
        assert decision.host_id == reply.host_id
        assert decision.state_version == reply.state_version

        assert reply.status is DecisionStatus.PLACED
        assert reply.policy_origin is PolicyOrigin.CLUSTER
        verdicts = {v.host_id: v for v in reply.hosts}
        assert sorted(verdicts) == sorted([*hosts, "small", "down"])
        assert (verdicts["down"].passed, verdicts["down"].reason) == (False, NOT_UP)
        assert (verdicts["small"].passed, verdicts["small"].filter) == (False, "Memory")
        assert verdicts["small"].reason
        ranked = sorted((v for v in reply.hosts if v.passed), key=lambda v: v.rank or 0)
        assert ranked[0].host_id == reply.host_id
        assert [v.rank for v in ranked] == [1, 2, 3]
        units = [w.unit for w in ranked[0].weights]
        assert reply.explanation.scores is not None
        assert units
        assert units == [u.unit for u in reply.explanation.scores.units]
        assert all(len(v.weights) == len(units) for v in ranked)
        again = await client.what_if(cluster, vm(2))
        assert again.pending == 1
        [record] = await PendingStore(redis, stack).read(cluster)
        # The state the tracker answers lists it (the console's cluster page shows it), until the VM
        # is reported running.
        state = await client.state(cluster)
        assert [(p.vm_id, p.host_id, p.request_id) for p in state.pending] == [
            ("vm-1", decision.host_id, decision.request_id)
        ]
        assert state.pending == [record]
        assert decision.host_id is not None
        await client.report_vm(factories.vm_report(cluster, "vm-1", decision.host_id, mem_mb=1024, vcpus=1))
        for _ in range(100):
            if not (state := await client.state(cluster)).pending:
                break
            await asyncio.sleep(0.05)
        assert state.pending == []
    finally:
        await redis.aclose()


async def test_whatif_under_another_policy(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"wip-{unique}"
    await client.report_host(
        factories.host_report(cluster, "small", cpu_cores=8, physical_mem_mb=512, mem_free_mb=512, reserved_mem_mb=0)
    )
    await client.wait_for_state(cluster, hosts=1)
    own = await client.what_if(cluster, vm(1))
    assert own.status is DecisionStatus.UNPLACEABLE
    assert own.hosts[0].filter == "Memory"
    # An inline policy without the Memory filter lets the small host through.
    lax = PolicyDocument(name="no memory check", filters=[FilterEntry(unit="CPU")])
    inline = await client.what_if(cluster, vm(1), policy_inline=lax)
    assert (inline.status, inline.host_id, inline.policy) == (DecisionStatus.PLACED, "small", "no memory check")
    assert (inline.policy_origin, inline.policy_version) == (PolicyOrigin.INLINE, None)
    # A stored policy by name, with a property override.
    stored = await client.what_if(cluster, vm(1), policy="power_saving", properties={"LowUtilization": "30"})
    assert (stored.policy, stored.policy_origin) == ("power_saving", PolicyOrigin.STORED)
    assert stored.policy_version is not None
    assert stored.policy_properties["LowUtilization"] == "30"


async def test_whatif_refusals_are_typed(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"wir-{unique}"
    await make_cluster(client, cluster, 1)
    typo = {"name": "t", "filters": [{"unit": "Memroy"}]}
    cases: list[tuple[Awaitable[WhatIfReply], str]] = [
        (client.what_if(f"nowhere-{unique}", vm(1)), "unknown_cluster"),
        (client.what_if(cluster, vm(1), policy=f"no-such-{unique}"), "policy_not_found"),
        (client.what_if(cluster, vm(1), policy_inline=typo), "invalid_policy"),
        (client.what_if(cluster, vm(1), properties={"NoSuchProperty": "1"}), "invalid_policy"),
    ]
    for call, code in cases:
        with pytest.raises(RemoteError) as refused:
            await call
        assert refused.value.remote_code == code
        if call is cases[2][0]:
            assert "did you mean 'Memory'" in str(refused.value)
    with pytest.raises(ValidationError):
        await client.what_if(cluster, vm(1), policy="none", policy_inline=PolicyDocument(name="x"))
