"""Clusters' list, their decisions with explanations (the state tracker's DecisionStore), and
what-if (the selector's decision path, with nothing locked, recorded or published)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from vmsched.contracts import ClusterSummary, ScheduleDecision, WhatIfReply
from vmsched.contracts.base import Id
from vmsched.errors import InvalidRequest
from vmsched_services.api.deps import ClientsDep, Operator, Viewer
from vmsched_services.api.models import WhatIfIn

router = APIRouter(tags=["clusters"])
ClusterParam = Annotated[Id, Path(description="The cluster's id.")]
#: The most decisions one listing holds (decisions.recent's own bound).
MAX_LISTED = 1000


@router.get("/clusters", response_model=list[ClusterSummary], summary="Every cluster with state")
async def clusters(_: Viewer, cl: ClientsDep) -> list[ClusterSummary]:
    return list((await cl.scheduler.clusters()).clusters)


@router.get(
    "/clusters/{cluster_id}/decisions",
    response_model=list[ScheduleDecision],
    summary="The cluster's latest decisions, newest first",
)
async def decisions(
    cluster_id: ClusterParam,
    _: Viewer,
    cl: ClientsDep,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED, description="How many at most.")] = 50,
) -> list[ScheduleDecision]:
    return list((await cl.scheduler.recent_decisions(cluster_id, limit)).decisions)


@router.get(
    "/clusters/{cluster_id}/decisions/{request_id}",
    response_model=ScheduleDecision,
    summary="One decision, with its explanation",
)
async def decision(
    cluster_id: ClusterParam,
    request_id: Annotated[str, Path(max_length=64, description="The request's id (a UUID).")],
    _: Viewer,
    cl: ClientsDep,
) -> ScheduleDecision:
    try:
        return await cl.scheduler.decision(cluster_id, request_id)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, location="path.request_id") from None


@router.post(
    "/clusters/{cluster_id}/whatif",
    response_model=WhatIfReply,
    summary="Where a VM would be placed now, and why, host by host (operator); nothing is stored",
)
async def what_if(cluster_id: ClusterParam, body: WhatIfIn, _: Operator, cl: ClientsDep) -> WhatIfReply:
    inline = body.policy_inline.document(body.policy_inline.name or "what-if") if body.policy_inline else None
    return await cl.scheduler.what_if(
        cluster_id, body.vm, policy=body.policy, policy_inline=inline, properties=dict(body.properties)
    )


__all__ = ["router"]
