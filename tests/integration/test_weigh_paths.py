"""Where requests are placed: in a filter-worker, a group per `place` call (the default; no weigher
needed), or in the selector, calling filter-workers and weighers per VM
(VMSCHED_PLACE_IN_WORKER=false). Both decide, with or without the score table."""

from __future__ import annotations

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched.contracts import DecisionStatus
from vmsched.db import migrate
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched.settings import Settings

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]


async def _decide_twice(cfg: Settings, buses: Buses, cluster: str) -> None:
    async with buses.client(cfg) as client:
        hosts = await factories.make_cluster(client, cluster, 4, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        quiet = await client.schedule(cluster, factories.vm_spec(f"{cluster}-a", mem_mb=1024, vcpus=1))
        assert quiet.status is DecisionStatus.PLACED
        assert quiet.host_id in hosts
        assert len(quiet.alternates) == 3
        assert quiet.explanation.scores is None
        told = await client.schedule(
            cluster, factories.vm_spec(f"{cluster}-b", mem_mb=1024, vcpus=1), explain_scores=True
        )
        assert told.status is DecisionStatus.PLACED
        assert told.explanation.scores is not None
        assert sorted(told.explanation.scores.hosts) == sorted(hosts)
        assert [u.unit for u in told.explanation.scores.units] == [w.unit for w in DEFAULT_POLICY.weights]


async def test_the_filter_worker_places_so_no_weigher_is_needed(
    bus_settings: Settings, buses: Buses, database: str, unique: str
) -> None:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database, "place_in_worker": True})
    async with services(cfg, "state-tracker", "filter-worker", "selector", bus=buses):  # no weigher
        await _decide_twice(cfg, buses, f"rank-fw-{unique}")


async def test_the_weigher_ranks_when_the_selector_places(
    bus_settings: Settings, buses: Buses, database: str, unique: str
) -> None:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database, "place_in_worker": False})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", bus=buses):
        await _decide_twice(cfg, buses, f"rank-w-{unique}")
