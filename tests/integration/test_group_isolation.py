"""One request's failure inside a group is that request's error decision; the other requests of the
group are still decided and committed. Both ways of placing: a `place` call whose result for one
request is an error (as when a unit refuses that request), and a failing per-VM filter call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, held_lock, services
from vmsched import constants as c
from vmsched.contracts import (
    DecisionStatus,
    ErrorInfo,
    FilterReply,
    FilterRequest,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
)
from vmsched.db import migrate
from vmsched.errors import InvalidRequest
from vmsched.settings import Settings
from vmsched_services.filter_worker.service import FilterWorker

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]


@pytest.fixture(scope="module", params=[True, False], ids=["place", "per-vm"])
async def stack(
    request: pytest.FixtureRequest, bus_settings: Settings, buses: Buses, database: str
) -> AsyncIterator[Settings]:
    """The tracker and a selector; the worker is a real FilterWorker that refuses VMs named *-bad."""
    await migrate(database)
    # The groups go to the test's worker (the selector places none itself).
    update = {"postgres_url": database, "place_in_worker": request.param, "place_in_selector": False}
    cfg = bus_settings.model_copy(update=update)
    async with services(cfg, "state-tracker", "weigher", "selector", bus=buses):
        rt = await buses.runtime(cfg, "picky-filter-worker")
        worker = FilterWorker(rt)

        async def picky_place(req: PlaceRequest) -> PlaceReply:
            reply = await worker.place(req)
            refused = ErrorInfo(code="invalid_request", message="refused by the test's filter worker")
            results = [
                PlaceResult(request_id=r.request_id, outcome=PlaceOutcome.ERROR, error=refused)
                if item.request.vm.vm_id.endswith("-bad")
                else r
                for item, r in zip(req.items, reply.results, strict=True)
            ]
            return reply.model_copy(update={"results": results})

        async def picky(req: FilterRequest) -> FilterReply:
            if req.vm.vm_id.endswith("-bad"):
                raise InvalidRequest(f"{req.vm.vm_id} refused by the test's filter worker", location="vm")
            return await worker.handle(req)

        await rt.bus.serve(c.RPC_PLACE, PlaceRequest, picky_place)
        await rt.bus.serve(c.RPC_FILTER, FilterRequest, picky)
        yield cfg
        await rt.close()


async def test_a_failing_request_does_not_fail_its_group(stack: Settings, buses: Buses, unique: str) -> None:
    cluster = f"iso-{unique}"
    async with buses.client(stack) as client:
        await factories.make_cluster(client, cluster, 3, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        names = [f"{unique}-a", f"{unique}-bad", f"{unique}-c"]
        async with held_lock(stack, cluster):
            sent = [
                asyncio.create_task(client.schedule(cluster, factories.vm_spec(n, mem_mb=512, vcpus=1))) for n in names
            ]
            await asyncio.sleep(1.0)
        a, bad, c_ = await asyncio.gather(*sent)
    assert a.status is DecisionStatus.PLACED, a.error
    assert c_.status is DecisionStatus.PLACED
    assert a.fencing_token == c_.fencing_token  # one group
    assert bad.status is DecisionStatus.ERROR
    assert bad.error is not None
    assert bad.error.code == "invalid_request"
    assert "refused by the test's filter worker" in bad.error.message
