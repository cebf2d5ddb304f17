"""filter-worker: places groups of schedule requests (RPC `place`) and runs filter chains (RPC `filter`).

Thin by design: decode, bring the cluster's cached state up to the request's version, call the pure
logic (vmsched.scheduling.placement.place_group: filter, weigh and select each request of the group
in order, returning the pending records of the ones placed, which the selector records as they are;
or pipeline.run_filters for one VM), encode. Run as many as the load needs: they share the queues.
"""

from __future__ import annotations

from vmsched import constants as c
from vmsched.contracts import FilterReply, FilterRequest, PlaceReply, PlaceRequest
from vmsched.runtime import Runtime
from vmsched.scheduling.pipeline import run_filters
from vmsched.scheduling.placement import place_group


class FilterWorker:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def place(self, req: PlaceRequest) -> PlaceReply:
        version, table = await self.rt.state.table(req.cluster_id, min_version=req.state_version)
        results = await place_group(table, req)
        return PlaceReply(request_id=req.request_id, state_version=version, results=results)

    async def handle(self, req: FilterRequest) -> FilterReply:
        # A candidate missing here would silently drop out of the answer: StaleState instead.
        _, table = await self.rt.state.table_with(req.cluster_id, req.state_version, req.candidates)
        hosts = table.view(req.candidates, req.pending, now=req.now)
        outcome = run_filters(hosts, req.vm, req.filters)
        survivors = list(outcome.survivors.ids)
        return FilterReply(request_id=req.request_id, survivors=survivors, removed=outcome.removed)


async def start(rt: Runtime) -> None:
    worker = FilterWorker(rt)
    await rt.bus.serve(c.RPC_FILTER, FilterRequest, worker.handle)
    # Last: its consumer is what shows the worker is up (vmsched_services.tools.procs.READY_ROUTE).
    await rt.bus.serve(c.RPC_PLACE, PlaceRequest, worker.place)
