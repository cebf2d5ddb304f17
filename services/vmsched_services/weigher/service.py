"""weigher: runs a policy's weight units over the filter survivors (RPC `weigh`).

Returns every unit's raw weight for every host; the selector normalizes and picks.
"""

from __future__ import annotations

from vmsched import constants as c
from vmsched.contracts import UnitWeights, WeighReply, WeighRequest
from vmsched.runtime import Runtime
from vmsched.scheduling.pipeline import run_weights


class Weigher:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def handle(self, req: WeighRequest) -> WeighReply:
        # StaleState (an error decision, not a crash) if this worker cannot reach the state the
        # selector saw: its version, with every host the request names.
        _, table = await self.rt.state.table_with(req.cluster_id, req.state_version, req.hosts)
        hosts = table.view(req.hosts, req.pending, now=req.now)
        raws = run_weights(hosts, req.vm, req.weights)
        return WeighReply(
            request_id=req.request_id,
            weights=[
                UnitWeights(unit=call.unit, raw=raw.tolist()) for call, raw in zip(req.weights, raws, strict=True)
            ],
        )


async def start(rt: Runtime) -> None:
    weigher = Weigher(rt)
    await rt.bus.serve(c.RPC_WEIGH, WeighRequest, weigher.handle)
