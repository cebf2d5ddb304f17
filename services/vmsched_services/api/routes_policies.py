"""Scheduling policies and their units, in oVirt's shape, through policy-admin (PolicyClient).

A policy is validated exactly as `vmsched policy apply` validates a file: the document's own checks
(pydantic, the same models), then policy-admin's dry run, which names every problem. Writes go out
with the token's name (`acting_for`), so policy-admin's audit log says "vmsched-api for NAME".
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from vmsched.bus import acting_for
from vmsched.contracts import ApplyReport, AuditListing, ChangeAction, PolicyHistory, PolicySet
from vmsched.contracts.admin import MAX_AUDIT_ROWS, AuditAction
from vmsched.contracts.policies import Actor, PolicyName
from vmsched.errors import InvalidRequest, RemoteError
from vmsched_services.api.deps import Admin, ClientsDep, Viewer
from vmsched_services.api.error_map import policy_problems
from vmsched_services.api.models import (
    CloneIn,
    PolicyIn,
    PolicyOut,
    Problem,
    RollbackIn,
    UnitOut,
    ValidationOut,
    units_of,
)

router = APIRouter(tags=["policies"])
NameParam = Annotated[PolicyName, Path(description="The policy's name.")]


def _document_name(name: str, body: PolicyIn) -> str:
    if body.name is not None and body.name != name:
        raise InvalidRequest(
            f"the body names the policy {body.name!r}, the path {name!r}: a policy is renamed by cloning it",
            location="body.name",
        )
    return name


@router.get("/schedulingpolicyunits", response_model=list[UnitOut], summary="The units policies can name")
async def units(_: Viewer, cl: ClientsDep) -> list[UnitOut]:
    return units_of(await cl.policies.units())


@router.get("/schedulingpolicies", response_model=list[PolicyOut], summary="Every stored policy")
async def policies(_: Viewer, cl: ClientsDep) -> list[PolicyOut]:
    return [PolicyOut.of(p) for p in (await cl.policies.read()).policies]


@router.get("/schedulingpolicies/{name}", response_model=PolicyOut, summary="One policy")
async def policy(name: NameParam, _: Viewer, cl: ClientsDep) -> PolicyOut:
    return PolicyOut.of((await cl.policies.read([name])).policies[0])


@router.post(
    "/schedulingpolicies/{name}/validate",
    response_model=ValidationOut,
    summary="Validate a policy as `vmsched policy apply --dry-run` does; nothing is stored",
)
async def validate(name: NameParam, body: PolicyIn, _: Viewer, cl: ClientsDep) -> ValidationOut:
    doc = body.document(_document_name(name, body))
    try:
        report = await cl.policies.apply(PolicySet(policies=[doc]), dry_run=True)
    except RemoteError as exc:
        if exc.remote_code != "invalid_policy":
            raise
        problems = [Problem(**p) for p in policy_problems(exc.message)] or [Problem(location="", message=exc.message)]
        return ValidationOut(valid=False, errors=problems, diff=[])
    lines = [line for ch in report.changes if ch.action is not ChangeAction.UNCHANGED for line in ch.diff]
    return ValidationOut(valid=True, errors=[], diff=lines)


@router.put(
    "/schedulingpolicies/{name}",
    response_model=ApplyReport,
    summary="Create or change a policy (admin); with dry_run, only say what would change",
)
async def put_policy(
    who: Admin,
    cl: ClientsDep,
    name: NameParam,
    body: PolicyIn,
    dry_run: Annotated[bool, Query(description="Validate and report, store nothing.")] = False,
) -> ApplyReport:
    doc = body.document(_document_name(name, body))
    with acting_for(who.name):
        return await cl.policies.apply(PolicySet(policies=[doc]), dry_run=dry_run)


@router.post(
    "/schedulingpolicies/{name}/clone",
    response_model=PolicyOut,
    status_code=status.HTTP_201_CREATED,
    summary="Copy a policy (built-ins too) under a new name (admin)",
)
async def clone(name: NameParam, body: CloneIn, who: Admin, cl: ClientsDep) -> PolicyOut:
    with acting_for(who.name):
        return PolicyOut.of(await cl.policies.clone(name, body.name, description=body.description))


@router.delete("/schedulingpolicies/{name}", response_model=ApplyReport, summary="Delete a policy no cluster runs")
async def delete(name: NameParam, who: Admin, cl: ClientsDep) -> ApplyReport:
    with acting_for(who.name):
        return await cl.policies.delete(name)


@router.get("/schedulingpolicies/{name}/history", response_model=PolicyHistory, summary="A policy's stored versions")
async def history(name: NameParam, _: Viewer, cl: ClientsDep) -> PolicyHistory:
    return await cl.policies.history(name)


@router.post(
    "/schedulingpolicies/{name}/rollback",
    response_model=ApplyReport,
    summary="Store an earlier version again, as a new version (admin)",
)
async def rollback(name: NameParam, body: RollbackIn, who: Admin, cl: ClientsDep) -> ApplyReport:
    with acting_for(who.name):
        return await cl.policies.rollback(name, body.version)


@router.get("/audit", response_model=AuditListing, summary="The audit log, newest first (admin)", tags=["audit"])
async def audit(
    _: Admin,
    cl: ClientsDep,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_ROWS)] = 50,
    actor: Annotated[Actor | None, Query(description="Only this actor's rows.")] = None,
    action: Annotated[AuditAction | None, Query(description="Only this action (policy.updated, ...).")] = None,
    since: Annotated[datetime | None, Query(description="Only rows at or after this (with a UTC offset).")] = None,
) -> AuditListing:
    if since is not None and since.tzinfo is None:
        raise InvalidRequest("since needs a UTC offset (e.g. 2025-01-01T00:00:00Z)", location="query.since")
    return await cl.policies.audit(limit=limit, actor=actor, action=action, since=since)


__all__ = ["router"]
