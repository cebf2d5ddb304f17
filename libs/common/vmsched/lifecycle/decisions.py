"""The ScheduleDecision of each way a request's handling ends (pure, no I/O): placed, unplaceable,
expired (its deadline passed), error (a failure that belongs to the request)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from vmsched.contracts import DecisionStatus, ErrorInfo, Explanation, Placement, ScheduleDecision, ScheduleRequest
from vmsched.scheduling.policy import Policy


def expired(req: ScheduleRequest) -> bool:
    """Whether the request's deadline has passed (then it is not placed)."""
    return req.deadline is not None and datetime.now(UTC) >= req.deadline


def decision(
    req: ScheduleRequest,
    started: float,
    status: DecisionStatus,
    explanation: Explanation,
    *,
    policy: str | None,
    ran: Policy | None = None,
    version: int = 0,
    host: str | None = None,
    alternates: list[str] | None = None,
    placements: list[Placement] | None = None,
    token: int = 0,
    retried: bool = False,
    error: ErrorInfo | None = None,
) -> ScheduleDecision:
    """The decision on `req`, made `started` (time.perf_counter) ago; `ran`: the policy its units ran
    (its version and properties go with the decision)."""
    return ScheduleDecision(
        request_id=req.request_id,
        cluster_id=req.cluster_id,
        vm_id=req.vm.vm_id,
        status=status,
        host_id=host,
        alternates=alternates or [],
        placements=placements or [],
        policy=policy,
        policy_version=ran.version if ran is not None else None,
        policy_properties=dict(ran.properties) if ran is not None else {},
        state_version=version,
        fencing_token=token,
        explanation=explanation,
        error=error,
        retried=retried,
        decided_at=datetime.now(UTC),
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def placed(
    req: ScheduleRequest,
    started: float,
    placements: list[Placement],
    explanation: Explanation,
    *,
    policy: Policy,
    version: int,
    token: int,
    retried: bool,
) -> ScheduleDecision:
    """Every VM placed; the first VM's host and alternates are the decision's."""
    head = placements[0]
    return decision(
        req,
        started,
        DecisionStatus.PLACED,
        explanation,
        host=head.host_id,
        alternates=head.alternates,
        placements=placements,
        token=token,
        policy=policy.name,
        ran=policy,
        version=version,
        retried=retried,
    )


def unplaceable(
    req: ScheduleRequest, started: float, explanation: Explanation, *, policy: Policy, version: int, retried: bool
) -> ScheduleDecision:
    """Some VM fits nowhere; nothing of the request is placed."""
    return decision(
        req,
        started,
        DecisionStatus.UNPLACEABLE,
        explanation,
        policy=policy.name,
        ran=policy,
        version=version,
        retried=retried,
    )


#: Why a request expired while it was being placed (the batch's worker stopped at a deadline).
EXPIRED_WHILE_PLACING = "its deadline, or its place call's, passed while it was being placed"


def expired_decision(
    req: ScheduleRequest, started: float, policy: str, why: str = "the request's deadline passed"
) -> ScheduleDecision:
    return decision(
        req,
        started,
        DecisionStatus.EXPIRED,
        Explanation(summary=f"not placed: {why}", candidates=0),
        policy=policy,
    )


def error_decision(
    req: ScheduleRequest, started: float, code: str, message: str, *, policy: str | None
) -> ScheduleDecision:
    """A failure that belongs to the request (unknown cluster, unknown unit, invalid property, lock
    timeout): a decision with status `error`, never a crash or a hang."""
    return decision(
        req,
        started,
        DecisionStatus.ERROR,
        Explanation(summary=f"not scheduled: {message}"[:2000], candidates=0),
        policy=policy,
        error=ErrorInfo(code=code, message=message[:2000]),
    )


__all__ = [
    "EXPIRED_WHILE_PLACING",
    "decision",
    "error_decision",
    "expired",
    "expired_decision",
    "placed",
    "unplaceable",
]
