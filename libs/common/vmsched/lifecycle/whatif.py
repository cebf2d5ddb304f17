"""What-if: the decision `schedule` would make now, without making it.

The same path as a placed request (lifecycle.groups with VMSCHED_PLACE_IN_WORKER, the default):
pending and the state version in one read, the state at that version, then
vmsched.scheduling.placement.place_group (the filter-worker's function: the filter chain, the
weights, the selector) over them, here in the selector's process. What it leaves out is what
makes a decision one: no cluster lock (so no fencing token), no pending record, nothing stored,
no event. It asks for every removed host and the whole score table (explain_hosts,
explain_scores) and turns them into one verdict per host of the cluster. It never waits for
pending resources to change: where `schedule` would wait and retry, it says unplaceable, now.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from uuid import uuid4

from vmsched.contracts import (
    DecisionStatus,
    Explanation,
    HostVerdict,
    PlaceItem,
    PlaceOutcome,
    PlaceRequest,
    PlaceResult,
    PolicyOrigin,
    ScheduleRequest,
    WeightScore,
    WhatIfReply,
    WhatIfRequest,
)
from vmsched.errors import SchedulingError
from vmsched.scheduling.placement import place_group
from vmsched.scheduling.policy import Policy
from vmsched.settings import Settings
from vmsched.store import PendingStore, StateCache

#: Why a host that is not Up was not a candidate (the filters start from the Up hosts).
NOT_UP = "not a candidate: the host is not Up (down, in maintenance, not responding or disabled)"


class WhatIf:
    def __init__(self, settings: Settings, *, pending: PendingStore, state: StateCache) -> None:
        self.settings = settings
        self.pending = pending
        self.state = state

    async def run(self, req: WhatIfRequest, policy: Policy, origin: PolicyOrigin) -> WhatIfReply:
        """Where `req.vm` would go under `policy` (already resolved and validated), and why."""
        started = time.perf_counter()
        cluster = req.cluster_id
        # As the lifecycle reads them: pending and the state version at one instant, then the state
        # at that version (pending first: a VM is never counted nowhere).
        _, pending, version = await self.pending.snapshot_with_state(cluster)
        if version is None:
            # No state: the cache says so as it does for `schedule` (UnknownCluster).
            await self.state.version(cluster)
            raise AssertionError("unreachable: a cluster without a state version is unknown")
        version, table = await self.state.table(cluster, min_version=version)
        request = ScheduleRequest(
            request_id=uuid4(), cluster_id=cluster, vm=req.vm, kind=req.kind, explain_scores=True, explain_hosts=True
        )
        group = PlaceRequest(
            request_id=uuid4(),
            cluster_id=cluster,
            state_version=version,
            items=[PlaceItem(request=request, may_wait=False)],
            filters=policy.filter_calls(),
            weights=policy.weight_calls(),
            selector=policy.selector,
            pending=pending,
            now=time.time(),
            pending_ttl_s=self.settings.pending_ttl_s,
            fencing_token=0,
        )
        (result,) = await place_group(table, group)
        explanation = _explained(result)
        head = result.placements[0] if result.outcome is PlaceOutcome.PLACED and result.placements else None
        return WhatIfReply(
            cluster_id=cluster,
            vm_id=req.vm.vm_id,
            status=DecisionStatus.PLACED if head is not None else DecisionStatus.UNPLACEABLE,
            host_id=head.host_id if head is not None else None,
            alternates=head.alternates if head is not None else [],
            policy=policy.name,
            policy_origin=origin,
            policy_version=None if origin is PolicyOrigin.INLINE else policy.version,
            policy_properties=dict(policy.properties),
            state_version=version,
            pending=len(pending),
            explanation=explanation,
            hosts=verdicts(table.ids, table.up.tolist(), explanation),
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )


def _explained(result: PlaceResult) -> Explanation:
    """The result's explanation; a request its policy could not evaluate raises what the worker
    would have answered, under the same code."""
    if result.explanation is not None and result.outcome in (PlaceOutcome.PLACED, PlaceOutcome.UNPLACEABLE):
        return result.explanation
    error = result.error
    exc = SchedulingError(error.message if error is not None else f"no placement ({result.outcome})")
    # The code the worker's refusal carried (unknown_policy_unit, invalid_property, ...): what the
    # caller can act on, as `schedule` keeps it in its error decision.
    exc.code = error.code if error is not None else "internal"
    raise exc


def verdicts(ids: Sequence[str], up: Sequence[bool], explanation: Explanation) -> list[HostVerdict]:
    """One verdict per host of the cluster, by id: removed (with its filter and reason), not a
    candidate (not Up), or passed, with its rank and every weight unit's score when ranked."""
    removed = {f.host_id: f for f in explanation.filtered}
    scores = explanation.scores
    ranked: dict[str, int] = {}
    if scores is not None:
        ranked = {host: i for i, host in enumerate(scores.hosts)}
    out: list[HostVerdict] = []
    for host, is_up in sorted(zip(ids, up, strict=True)):
        gone = removed.get(host)
        if gone is not None:
            out.append(HostVerdict(host_id=host, passed=False, filter=gone.filter, reason=gone.reason))
        elif not is_up:
            out.append(HostVerdict(host_id=host, passed=False, reason=NOT_UP))
        elif scores is not None and host in ranked:
            i = ranked[host]
            weights = [
                WeightScore(unit=u.unit, factor=u.factor, raw=u.raw[i], points=u.points[i]) for u in scores.units
            ]
            out.append(HostVerdict(host_id=host, passed=True, rank=i + 1, total=scores.totals[i], weights=weights))
        else:
            # The one host that passed (nothing to rank it against: no scores), or a host that was
            # neither removed nor ranked because the candidates were cut (a whitelist, a blacklist).
            out.append(HostVerdict(host_id=host, passed=True, rank=1))
    return out


__all__ = ["NOT_UP", "WhatIf", "verdicts"]
