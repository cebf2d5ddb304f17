"""VMSCHED_PLACE_IN_SELECTOR: the selector places a small group itself, on the same code a
filter-worker runs (the same decisions, no worker needed); a group too big for its loop still goes
to a filter-worker."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, one_group_against_one_at_a_time, services
from vmsched.contracts import DecisionStatus
from vmsched.db import migrate
from vmsched.lifecycle import placing
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
    async with buses.client(stack) as client:
        cluster = f"here-{unique}"
        decisions, one_at_a_time = await one_group_against_one_at_a_time(client, stack, cluster, unique, GROUP)
    assert all(d.status is DecisionStatus.PLACED for d in decisions), [d.explanation.summary for d in decisions]
    assert len({d.fencing_token for d in decisions}) == 1, "one group"
    assert Counter(d.host_id for d in decisions) == one_at_a_time


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
