"""The decision path without the bus: the selector's placement function on one HostTable."""

from __future__ import annotations

import random
import time
import uuid

from vmsched.contracts import ClusterReport, HostState, PendingEntry, ScheduleRequest, VmSpec
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import LocalSteps, Placed, pending_entry, place, top_hosts
from vmsched.scheduling.policy import DEFAULT_POLICY, Policy
from vmsched_services.tools.bench.data import host_reports, vm_spec
from vmsched_services.tools.bench.timing import latency_stats


async def bench_in_process(
    n_hosts: int, decisions: int, seed: int, policy: Policy = DEFAULT_POLICY
) -> dict[str, float]:
    """The selector's decision path without the bus: the same placement function (scheduling.place)
    with local filter and weigh steps, over one cluster's HostTable."""
    rng = random.Random(seed)
    reports = host_reports(rng, "inproc", n_hosts)
    table = HostTable.from_states([HostState(report=r) for r in reports], ClusterReport(cluster_id="inproc"))
    vms = [vm_spec(rng, i) for i in range(decisions)]

    def pending_for(vm: VmSpec, host_id: str) -> PendingEntry:
        return pending_entry(vm, host_id, request_id=uuid.uuid4(), fencing_token=1, expires_at=time.time() + 60)

    async def run() -> tuple[list[float], int]:
        lat: list[float] = []
        placed = 0
        for vm in vms:
            t0 = time.perf_counter()
            req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="inproc", vm=vm)
            # As the selector asks the workers by default: rank in the filter step, best 1 + alternates only.
            steps = LocalSteps.of(table, policy, now=time.time(), weigh_in_filter=True, top=top_hosts(req))
            outcome = await place(
                req,
                policy.filter_names(),
                candidate_hosts(table, req.whitelist, req.blacklist).ids,
                [],
                filter_fn=steps.filter,
                weigh_fn=steps.weigh,
                pending_for=pending_for,
                may_wait=False,
            )
            placed += isinstance(outcome, Placed)
            lat.append(time.perf_counter() - t0)
        return lat, placed

    began = time.perf_counter()
    lat, placed = await run()
    if placed < len(vms):
        raise RuntimeError(f"policy {policy.name}: only {placed}/{len(vms)} bench VMs fit; the bench data is wrong")
    return latency_stats(lat, time.perf_counter() - began)


__all__ = ["bench_in_process"]
