"""The workers' RPCs as the lifecycle calls them: `place` (a filter-worker places a run of requests
under one policy), and, per VM, `filter` (a filter-worker) and `weigh` (a weigher)."""

from __future__ import annotations

import time
from uuid import uuid4

from vmsched import constants as c
from vmsched.bus import Bus
from vmsched.contracts import (
    FilterReply,
    FilterRequest,
    PendingEntry,
    PlaceItem,
    PlaceReply,
    PlaceRequest,
    ScheduleRequest,
    ScoreTable,
    VmSpec,
    WeighReply,
    WeighRequest,
)
from vmsched.errors import InvalidRequest
from vmsched.lifecycle.turns import Turn
from vmsched.scheduling.pipeline import unweighed
from vmsched.scheduling.placement import top_hosts
from vmsched.scheduling.policy import Policy


def place_request(
    cluster: str,
    run: list[Turn],
    *,
    version: int,
    pending: list[PendingEntry],
    token: int,
    may_wait: bool,
    pending_ttl_s: float,
) -> PlaceRequest:
    """The `place` call for `run` (requests of one policy, in decision order), placed ones to be
    recorded under `token`. `may_wait`: whether waiting for pending is allowed at all (each
    request's own `may_wait` also counts)."""
    policy = run[0].policy
    return PlaceRequest(
        request_id=uuid4(),
        cluster_id=cluster,
        state_version=version,
        items=[PlaceItem(request=t.req, may_wait=t.may_wait and may_wait) for t in run],
        filters=policy.filter_calls(),
        weights=policy.weight_calls(),
        selector=policy.selector,
        pending=pending,
        now=time.time(),
        pending_ttl_s=pending_ttl_s,
        fencing_token=token,
    )


async def place_call(bus: Bus, request: PlaceRequest, route: str = c.RPC_PLACE) -> PlaceReply:
    """`request` sent to a filter-worker: a result per request, in order, placed ones with their
    pending records. `route`: `place` or one of its catalogue routes (vmsched.lifecycle.routes)."""
    reply = await bus.call(route, request, PlaceReply)
    if [r.request_id for r in reply.results] != [item.request.request_id for item in request.items]:
        raise InvalidRequest("a filter-worker answered a place call with results for other requests")
    return reply


async def filter_call(
    bus: Bus,
    req: ScheduleRequest,
    vm: VmSpec,
    policy: Policy,
    version: int,
    candidates: list[str],
    pending: list[PendingEntry],
    route: str = c.RPC_FILTER,
) -> FilterReply:
    return await bus.call(
        route,
        FilterRequest(
            request_id=req.request_id,
            cluster_id=req.cluster_id,
            state_version=version,
            vm=vm,
            candidates=candidates,
            filters=policy.filter_calls(),
            pending=pending,
            now=time.time(),
        ),
        FilterReply,
    )


async def weigh_call(
    bus: Bus,
    req: ScheduleRequest,
    vm: VmSpec,
    policy: Policy,
    version: int,
    hosts: list[str],
    pending: list[PendingEntry],
    route: str = c.RPC_WEIGH,
) -> ScoreTable:
    """The hosts ranked best first (without a weigher when the policy has no weights)."""
    calls = policy.weight_calls()
    if not calls:
        return unweighed(hosts, policy.selector, top=top_hosts(req))
    reply = await bus.call(
        route,
        WeighRequest(
            request_id=req.request_id,
            cluster_id=req.cluster_id,
            state_version=version,
            vm=vm,
            hosts=hosts,
            weights=calls,
            selector=policy.selector,
            top=top_hosts(req),
            pending=pending,
            now=time.time(),
        ),
        WeighReply,
    )
    return reply.scores


__all__ = ["filter_call", "place_call", "weigh_call"]
