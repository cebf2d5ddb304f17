"""weigher: runs a policy's weight units over the filter survivors (RPC `weigh`).

Weighs the hosts with every unit, then ranks them with the policy's selector (normalizing the raw
weights into points), so the selector receives the best hosts rather than every unit's raw weights
for every host. The per-unit table crosses the bus only when the schedule request asks for it.
"""

from __future__ import annotations

from vmsched import constants as c
from vmsched.contracts import WeighReply, WeighRequest
from vmsched.runtime import Runtime
from vmsched.scheduling.pipeline import rank
from vmsched_services.worker_units import serve_routed


class Weigher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def handle(self, req: WeighRequest) -> WeighReply:
        # StaleState (an error decision, not a crash) if this worker cannot reach the state the
        # selector saw: its version, with every host the request names.
        _, table = await self.rt.state.table_with(req.cluster_id, req.state_version, req.hosts)
        hosts = table.view(req.hosts, req.pending, now=req.now)
        scores = rank(hosts, req.vm, req.weights, req.selector, top=req.top)
        return WeighReply(request_id=req.request_id, scores=scores)


def weigh_units(req: WeighRequest) -> list[str]:
    return [u.unit for u in req.weights]


async def start(rt: Runtime) -> None:
    weigher = Weigher(rt)
    # On the plain route and on this weigher's catalogue route (vmsched_services.worker_units).
    await serve_routed(rt, c.RPC_WEIGH, WeighRequest, weigher.handle, weigh_units)
