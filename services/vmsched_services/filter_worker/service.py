"""filter-worker: places groups of schedule requests (RPC `place`) and runs filter chains (RPC `filter`).

Thin by design: decode, bring the cluster's cached state up to the request's version, call the pure
logic (vmsched.scheduling.placement.place_group: filter, weigh and select each request of the group
in order, returning the pending records of the ones placed, which the selector records as they are;
or pipeline.run_filters for one VM), encode. Each RPC is also served on this worker's catalogue
route, and a request naming a unit it lacks is refused naming it (vmsched_services.worker_units).
A group still being placed when its caller is about to stop waiting (the message's x-deadline-ms)
stops: the rest is `expired`. Run as many as the load needs: they share the queues.
"""

from __future__ import annotations

import time

from vmsched import constants as c
from vmsched.bus.dispatch import MESSAGE_DEADLINE
from vmsched.contracts import FilterReply, FilterRequest, PlaceReply, PlaceRequest
from vmsched.runtime import Runtime
from vmsched.scheduling.pipeline import run_filters
from vmsched.scheduling.placement import place_group
from vmsched.tracing import span
from vmsched_services.worker_units import serve_routed

#: How much of the time a `place` call has left when it arrives is kept for the reply to travel
#: back (at most REPLY_MARGIN_MAX_S): placing stops that much before the caller's deadline, so the
#: requests placed by then are answered and committed, the rest `expired`.
REPLY_MARGIN = 0.1
REPLY_MARGIN_MAX_S = 0.5


def stop_at(deadline: float | None, now: float) -> float | None:
    """When to stop placing for a call whose caller waits until `deadline` (unix seconds)."""
    if deadline is None:
        return None
    return deadline - min(REPLY_MARGIN_MAX_S, max(0.0, deadline - now) * REPLY_MARGIN)


class FilterWorker:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def place(self, req: PlaceRequest) -> PlaceReply:
        # A child of the selector's group span, through the message's traceparent header.
        attributes = {"vmsched.cluster": req.cluster_id, "vmsched.group_size": len(req.items)}
        with span("vmsched.place", attributes):
            version, table = await self.rt.state.table(req.cluster_id, min_version=req.state_version)
            results = await place_group(table, req, deadline=stop_at(MESSAGE_DEADLINE.get(), time.time()))
            return PlaceReply(request_id=req.request_id, state_version=version, results=results)

    async def handle(self, req: FilterRequest) -> FilterReply:
        # A candidate missing here would silently drop out of the answer: StaleState instead.
        _, table = await self.rt.state.table_with(req.cluster_id, req.state_version, req.candidates)
        hosts = table.view(req.candidates, req.pending, now=req.now)
        outcome = run_filters(hosts, req.vm, req.filters)
        survivors = list(outcome.survivors.ids)
        return FilterReply(request_id=req.request_id, survivors=survivors, removed=outcome.removed)


def place_units(req: PlaceRequest) -> list[str]:
    return [u.unit for u in req.filters] + [u.unit for u in req.weights]


def filter_units(req: FilterRequest) -> list[str]:
    return [u.unit for u in req.filters]


async def start(rt: Runtime) -> None:
    worker = FilterWorker(rt)
    # Each on the plain route and on this worker's catalogue route (vmsched_services.worker_units).
    await serve_routed(rt, c.RPC_FILTER, FilterRequest, worker.handle, filter_units)
    # Last: its consumer is what shows the worker is up (vmsched_services.tools.procs.READY_ROUTE).
    await serve_routed(rt, c.RPC_PLACE, PlaceRequest, worker.place, place_units)
