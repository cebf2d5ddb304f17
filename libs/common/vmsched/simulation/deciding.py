"""How the simulation decides: the policy as a workload runs it, and the selector's decision for
one request (`place` with the policy's local filter and weigh steps, as the filter-worker runs
them)."""

from __future__ import annotations

from collections.abc import Sequence

from vmsched.contracts import PendingEntry, ScheduleRequest, VmSpec
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import LocalSteps, Outcome, pending_entry, place, top_hosts
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.simulation.workload import Workload


async def decide(
    table: HostTable,
    policy: Policy,
    request: ScheduleRequest,
    now: float,
    pending: Sequence[PendingEntry] = (),
) -> Outcome:
    """What the selector decides for `request` on `table` under `policy` at unix time `now` with
    `pending` held on their hosts: `place` with the policy's local steps, as the filter-worker runs
    them. The steps fold `pending` into `table` themselves (whatever pending the table carries is
    replaced), so it is passed here, not folded in first."""
    steps = LocalSteps.of(table, policy, now=now, weigh_in_filter=True, top=top_hosts(request))

    def pending_for(vm: VmSpec, host_id: str) -> PendingEntry:
        return pending_entry(vm, host_id, request_id=request.request_id, fencing_token=0, expires_at=now + 60.0)

    return await place(
        request,
        policy.filter_names(),
        candidate_hosts(table, request.whitelist, request.blacklist).ids,
        list(pending),
        filter_fn=steps.filter,
        weigh_fn=steps.weigh,
        pending_for=pending_for,
        may_wait=False,
    )


def effective_policy(workload: Workload, policy: Policy) -> Policy:
    """`policy` as the workload runs it: the workload's defaults under its properties, the
    workload's properties over them, and HaReservation when the cluster keeps HA reservation (as
    an attached cluster's policy carries it)."""
    overrides = dict(workload.policy_properties)
    if workload.cluster.ha_reservation:
        overrides[HA_RESERVATION_PROPERTY] = "true"
    if not overrides and not workload.policy_defaults:
        return policy
    properties = {**workload.policy_defaults, **policy.properties, **overrides}
    return policy.model_copy(update={"properties": properties})


__all__ = ["decide", "effective_policy"]
