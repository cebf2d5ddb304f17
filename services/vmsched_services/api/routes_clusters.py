"""Clusters: their state (the state tracker), HA check (an HA monitor), the policy they run
(policy-admin), and placing a VM over HTTP (the selector), for integrators that do not speak AMQP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from vmsched.bus import acting_for
from vmsched.contracts import ApplyReport, ClusterState, HaReport, PolicySet, ScheduleDecision
from vmsched.contracts.base import Id
from vmsched.errors import InvalidRequest
from vmsched_services.api.deps import Admin, ClientsDep, Operator, Viewer
from vmsched_services.api.models import AttachIn, AttachOut, ScheduleIn
from vmsched_services.tools.policy_commands import merged_attachment

router = APIRouter(tags=["clusters"])
ClusterParam = Annotated[Id, Path(description="The cluster's id.")]


@router.get(
    "/clusters/{cluster_id}", response_model=ClusterState, summary="A cluster's hosts, VMs and pending resources"
)
async def cluster_state(cluster_id: ClusterParam, _: Viewer, cl: ClientsDep) -> ClusterState:
    return await cl.scheduler.state(cluster_id)


@router.get("/clusters/{cluster_id}/ha", response_model=HaReport, summary="Run the HA reservation check now")
async def cluster_ha(cluster_id: ClusterParam, _: Viewer, cl: ClientsDep) -> HaReport:
    return await cl.scheduler.ha_check(cluster_id)


@router.put(
    "/clusters/{cluster_id}/policy",
    response_model=AttachOut,
    summary="Make the cluster run a policy (admin); overrides and HA reservation merge like `vmsched policy attach`",
)
async def attach(cluster_id: ClusterParam, body: AttachIn, who: Admin, cl: ClientsDep) -> AttachOut:
    current = next((a for a in (await cl.policies.read()).clusters if a.cluster_id == cluster_id), None)
    try:
        attachment, notes = merged_attachment(
            current,
            cluster_id,
            body.policy,
            set_=dict(body.properties or {}),
            unset=list(body.unset),
            ha_reservation=body.ha_reservation,
        )
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message.replace("--unset ", "unset: "), location="body.unset") from None
    with acting_for(who.name):
        report = await cl.policies.apply(PolicySet(clusters=[attachment]), dry_run=body.dry_run)
    return AttachOut(report=report, notes=notes)


@router.delete(
    "/clusters/{cluster_id}/policy", response_model=ApplyReport, summary="The cluster goes back to the default (admin)"
)
async def detach(cluster_id: ClusterParam, who: Admin, cl: ClientsDep) -> ApplyReport:
    with acting_for(who.name):
        return await cl.policies.detach(cluster_id)


@router.post(
    "/clusters/{cluster_id}/schedule",
    response_model=ScheduleDecision,
    summary="Place a VM (operator): the decision, as the engine's AMQP request gets it",
)
async def schedule(
    who: Operator,
    cl: ClientsDep,
    cluster_id: ClusterParam,
    body: ScheduleIn,
    timeout: Annotated[float | None, Query(gt=0, le=120, description="Seconds to wait for the decision.")] = None,
) -> ScheduleDecision:
    with acting_for(who.name):
        return await cl.scheduler.schedule(
            cluster_id,
            body.vm,
            whitelist=body.whitelist,
            blacklist=body.blacklist,
            max_alternates=body.max_alternates,
            priority=body.priority,
            explain_scores=body.explain_scores,
            explain_hosts=body.explain_hosts,
            timeout=timeout,
        )


__all__ = ["router"]
