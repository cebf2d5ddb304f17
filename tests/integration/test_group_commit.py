"""Group commit: requests waiting for one cluster are decided back to back under one lock
acquisition, each seeing the earlier ones as pending, so the group decides what the same requests
decided one at a time would."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from tests import factories
from tests.integration.conftest import (
    ON_BOTH_BUSES,
    Buses,
    held_lock,
    is_quorum_queue,
    one_group_against_one_at_a_time,
    services,
)
from vmsched import constants as c
from vmsched.contracts import DecisionStatus
from vmsched.db import migrate
from vmsched.settings import Settings

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

#: The module's selector takes up to GROUP requests per lock acquisition.
GROUP = 8


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    """One selector (so one group holds every waiting request), a filter-worker that places each
    group (test_place_in_selector.py has the selector place them) and the tracker. Aging is slowed
    to a minute so the waits of these tests do not reorder them (the unit tests of
    lifecycle.queueing pin aging)."""
    await migrate(database)
    update = {"postgres_url": database, "group_max": GROUP, "priority_aging_s": 60.0, "place_in_selector": False}
    cfg = bus_settings.model_copy(update=update)
    async with services(cfg, "state-tracker", "filter-worker", "selector", bus=buses):
        yield cfg


async def test_waiting_requests_are_decided_as_one_group_as_if_one_at_a_time(
    stack: Settings, buses: Buses, unique: str
) -> None:
    async with buses.client(stack) as client:
        decisions, one_at_a_time = await one_group_against_one_at_a_time(
            client, stack, f"group-{unique}", unique, GROUP
        )
    assert all(d.status is DecisionStatus.PLACED for d in decisions), [d.explanation.summary for d in decisions]
    assert len({d.fencing_token for d in decisions}) == 1, "one lock acquisition for the whole group"
    assert len({d.state_version for d in decisions}) == 1
    assert Counter(d.host_id for d in decisions) == one_at_a_time


async def test_waiting_requests_are_taken_by_priority_and_deadline_not_arrival(
    stack: Settings, buses: Buses, unique: str
) -> None:
    """More requests wait than a group takes: the urgent one and the one whose deadline is near are
    in the first group although they came last; nobody misses its deadline. (The order applies to
    the requests a selector has received: all of these are within its prefetch window.) On RabbitMQ
    the work queues are quorum queues, which have no message priorities: the order is the selector's."""
    if buses.kind == "amqp":
        assert await is_quorum_queue(stack, f"{stack.amqp_prefix}{c.RPC_QUEUES[c.RPC_SCHEDULE]}")
    cluster = f"prio-{unique}"
    async with buses.client(stack) as client:
        await factories.make_cluster(client, cluster, 8, cpu_cores=64, physical_mem_mb=262_144, mem_free_mb=262_144)
        async with held_lock(stack, cluster):
            vms = [factories.vm_spec(f"{unique}-{i}", mem_mb=1024, vcpus=1) for i in range(3 * GROUP)]
            plain = [asyncio.create_task(client.schedule(cluster, vm)) for vm in vms]
            await asyncio.sleep(1.0)  # the plain ones reach the selector first
            urgent = asyncio.create_task(
                client.schedule(cluster, factories.vm_spec(f"{unique}-urgent", mem_mb=1024, vcpus=1), priority=10)
            )
            soon = asyncio.create_task(
                client.schedule(
                    cluster,
                    factories.vm_spec(f"{unique}-soon", mem_mb=1024, vcpus=1),
                    deadline=datetime.now(UTC) + timedelta(seconds=20),
                )
            )
            await asyncio.sleep(1.5)  # generous: under load delivery is slower
        first, second, rest = await urgent, await soon, await asyncio.gather(*plain)
    assert first.status is DecisionStatus.PLACED
    assert second.status is DecisionStatus.PLACED
    assert all(d.status is DecisionStatus.PLACED for d in rest)
    first_group = min(d.fencing_token for d in rest)
    assert first.fencing_token == first_group
    assert second.fencing_token == first_group
    assert sum(d.fencing_token == first_group for d in rest) == GROUP - 2  # with the two above


async def test_a_request_waiting_past_its_deadline_is_answered_expired_at_once(
    stack: Settings, buses: Buses, unique: str
) -> None:
    """While the cluster's lock is held elsewhere (a long group, a burst), a queued request whose
    deadline passes hears `expired` then, not when its turn comes; the others wait and are placed."""
    cluster = f"due-{unique}"
    async with buses.client(stack) as client:
        await factories.make_cluster(client, cluster, 4, cpu_cores=64, physical_mem_mb=262_144, mem_free_mb=262_144)
        async with held_lock(stack, cluster):
            patient = asyncio.create_task(
                client.schedule(cluster, factories.vm_spec(f"{unique}-patient", mem_mb=1024, vcpus=1))
            )
            due = datetime.now(UTC) + timedelta(seconds=1.5)
            hurried = await asyncio.wait_for(
                client.schedule(cluster, factories.vm_spec(f"{unique}-hurried", mem_mb=1024, vcpus=1), deadline=due),
                timeout=8.0,  # the lock is held for all of it: only the deadline can have answered
            )
            assert not patient.done()
        placed = await patient
    assert hurried.status is DecisionStatus.EXPIRED
    assert hurried.host_id is None
    assert placed.status is DecisionStatus.PLACED
