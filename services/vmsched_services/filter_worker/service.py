"""filter-worker: runs a policy's filter chain over candidate hosts (RPC `filter`).

Thin by design: decode, bring the cluster's cached state up to the request's version, call
vmsched.scheduling.run_filters (and, when the request asks, rank the survivors as the weigher would,
saving the selector a second call), encode. Run as many as the load needs: they share one queue.
"""

from __future__ import annotations

from vmsched import constants as c
from vmsched.contracts import FilterReply, FilterRequest
from vmsched.runtime import Runtime
from vmsched.scheduling.pipeline import screen


class FilterWorker:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def handle(self, req: FilterRequest) -> FilterReply:
        # A candidate missing here would silently drop out of the answer: StaleState instead.
        _, table = await self.rt.state.table_with(req.cluster_id, req.state_version, req.candidates)
        hosts = table.view(req.candidates, req.pending, now=req.now)
        weights = req.weights if req.weigh else None
        outcome, scores = screen(hosts, req.vm, req.filters, weights, req.selector, top=req.top)
        survivors = list(outcome.survivors.ids)
        return FilterReply(request_id=req.request_id, survivors=survivors, removed=outcome.removed, scores=scores)


async def start(rt: Runtime) -> None:
    worker = FilterWorker(rt)
    await rt.bus.serve(c.RPC_FILTER, FilterRequest, worker.handle)
