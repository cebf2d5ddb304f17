"""selector: serves schedule requests end to end (RPC `schedule`), and what-ifs (RPC `whatif`:
the same placement without the lock, pending records, store or event; selector.whatif).

Thin by design: decode, hand the request to the request lifecycle (vmsched.lifecycle: replay,
group commit under the cluster lock, placement in the filter-workers, the fenced commit, events),
encode. Its metrics (metrics.SelectorMetrics) hear the lifecycle's stage timings and decisions.
Run as many as the load needs: they share the queue, and the cluster lock with its fencing token
keeps their decisions apart.
"""

from __future__ import annotations

import structlog

from vmsched import constants as c
from vmsched.contracts import ScheduleDecision, ScheduleRequest, WhatIfRequest
from vmsched.lifecycle import Lifecycle
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched_services.selector.metrics import SelectorMetrics
from vmsched_services.selector.whatif import WhatIfs


class Selector:
    def __init__(self, rt: Runtime, policies: PolicyCache | None = None) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.policies = policies or PolicyCache(rt)
        self.metrics = SelectorMetrics()
        self.lifecycle = Lifecycle.open(
            rt.bus,
            rt.redis,
            rt.settings,
            state=rt.state,
            policies=self.policies,
            timer=self.metrics,
            recover=rt.recovery,
        )
        self.what_ifs = WhatIfs(rt, self.policies)

    async def handle(self, req: ScheduleRequest) -> ScheduleDecision:
        # Every line logged while deciding names the request and its cluster.
        structlog.contextvars.bind_contextvars(request_id=str(req.request_id), cluster=req.cluster_id)
        try:
            return await self.lifecycle.decide(req)
        finally:
            structlog.contextvars.unbind_contextvars("request_id", "cluster")


async def start(rt: Runtime) -> Selector:
    selector = Selector(rt)
    await selector.policies.subscribe()
    await rt.bus.serve(c.RPC_WHATIF, WhatIfRequest, selector.what_ifs.handle)
    # Last: its consumer is what shows the selector is up (vmsched_services.tools.procs.READY_ROUTE).
    await rt.bus.serve(c.RPC_SCHEDULE, ScheduleRequest, selector.handle)
    return selector
