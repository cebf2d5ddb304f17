"""VMSCHED_PLACE_IN_SELECTOR: the selector places a small group itself, on the same code a
filter-worker runs (the same decisions, no worker needed); a group too big for its loop still goes
to a filter-worker."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, held_lock, services
from vmsched.contracts import DecisionStatus
from vmsched.db import migrate
from vmsched.lifecycle import placing
from vmsched.scheduling.hosts import HostTable
from vmsched.settings import Settings

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

GROUP = 8


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    """A selector that places in itself and the state tracker: no filter-worker at all."""
    await migrate(database)
    cfg = bus_settings.model_copy(
        update={"postgres_url": database, "group_max": GROUP, "priority_aging_s": 60.0, "place_in_selector": True}
    )
    async with services(cfg, "state-tracker", "selector", bus=buses):
        yield cfg


async def test_a_group_placed_in_the_selector_decides_as_one_at_a_time(
    stack: Settings, buses: Buses, unique: str
) -> None:
    cluster = f"here-{unique}"
    async with buses.client(stack) as client:
        await factories.make_cluster(
            client,
            cluster,
            5,
            cpu_cores=8,
            physical_mem_mb=16_384,
            vary=lambda i: {"mem_free_mb": 6_000 + 2_000 * i, "cpu_usage_pct": 10.0 * i},
        )
        state = await client.state(cluster)
        table = HostTable.from_states(state.hosts, state.settings)
        vms = [factories.vm_spec(f"{unique}-{i}", mem_mb=2048, vcpus=1) for i in range(GROUP)]
        async with held_lock(stack, cluster):
            sent = [asyncio.create_task(client.schedule(cluster, vm, timeout=30)) for vm in vms]
            await asyncio.sleep(1.0)
        decisions = await asyncio.gather(*sent)
    assert all(d.status is DecisionStatus.PLACED for d in decisions), [d.explanation.summary for d in decisions]
    assert len({d.fencing_token for d in decisions}) == 1, "one group"
    assert Counter(d.host_id for d in decisions) == await factories.placed_one_at_a_time(table, vms)


async def test_a_group_too_big_for_the_selector_goes_to_a_filter_worker(
    stack: Settings, buses: Buses, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = f"there-{unique}"
    monkeypatch.setattr(placing, "LOCAL_PLACE_MAX_WORK", 0)  # every group is too big
    async with buses.client(stack) as client:
        await factories.make_cluster(client, cluster, 3, cpu_cores=8, physical_mem_mb=16_384, mem_free_mb=16_000)
        refused = await client.schedule(cluster, factories.vm_spec(f"{unique}-a", mem_mb=1024, vcpus=1), timeout=30)
        assert refused.status is DecisionStatus.ERROR  # no filter-worker runs yet
        async with services(stack, "filter-worker", bus=buses):
            placed = await client.schedule(cluster, factories.vm_spec(f"{unique}-b", mem_mb=1024, vcpus=1), timeout=30)
    assert placed.status is DecisionStatus.PLACED
