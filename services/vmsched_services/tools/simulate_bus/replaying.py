"""One replay over the bus, on a cluster of its own: its policy stored as a copy without the
balance unit (the balancing pass runs in this process), attached to the cluster, and everything
removed at the end."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence

from vmsched.contracts import ClusterAttachment, PolicyDocument, PolicySet
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.policy_docs import document_of, policy_units
from vmsched.scheduling.units import REGISTRY
from vmsched.simulation.engine import Sampler
from vmsched.simulation.workload import Workload
from vmsched_services.tools.demo import forget_clusters
from vmsched_services.tools.simulate_bus.reporting import BusSimulation
from vmsched_services.tools.simulate_bus.stack import Services

#: Every replay's cluster id starts with this (then 12 hex digits): `vmsched clusters list` tells them.
CLUSTER_PREFIX = "simulate-"
#: How long the end of a replay waits for the tracker to apply the cluster's removal.
REMOVAL_TIMEOUT_S = 10.0


def stored_policy(policy: Policy, name: str) -> PolicyDocument:
    """The policy as a replay stores it for its cluster, under `name`: without its balance unit (the
    pass runs in this process), with only the properties its filters and weights read (policy-admin
    refuses a property no unit of the policy reads; the others were the balance unit's)."""
    placing = policy.model_copy(update={"balance": None, "name": name})
    read = {p for unit in policy_units(placing, REGISTRY) for p in unit.properties}
    doc = document_of(placing)
    return doc.model_copy(update={"properties": {k: v for k, v in doc.properties.items() if k in read}})


async def replay(svc: Services, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> BusSimulation:
    """Replay `workload` under `policy` over the bus, on a cluster of its own, removed at the end."""
    cluster_id = f"{CLUSTER_PREFIX}{uuid.uuid4().hex[:12]}"
    sim = BusSimulation(
        workload, policy, sampler, client=svc.client, pending=svc.pending, state=svc.state, cluster_id=cluster_id
    )
    name = f"{cluster_id}-{policy.name}"[:128]
    attach = ClusterAttachment(cluster_id=cluster_id, policy=name)
    await svc.admin.apply(PolicySet(policies=[stored_policy(sim.policy, name)], clusters=[attach]))
    try:
        await sim.run()
    except BaseException:
        with contextlib.suppress(Exception):  # the first failure is the one to tell
            await forget(svc, cluster_id, name, sim.request_ids)
        raise
    await forget(svc, cluster_id, name, sim.request_ids)
    return sim


async def forget(svc: Services, cluster_id: str, policy_name: str, request_ids: Sequence[uuid.UUID] = ()) -> None:
    """Remove a replay's cluster (state and pending records, through the state tracker, then every
    key left: decision history, memories), its stored decisions and its policy copy."""
    await svc.client.remove_cluster(cluster_id, reason="vmsched simulate --over-bus: the replay is over")
    loop = asyncio.get_running_loop()
    end = loop.time() + REMOVAL_TIMEOUT_S
    while loop.time() < end:
        _, _, version = await svc.pending.snapshot_with_state(cluster_id)
        if version is None:  # the tracker has applied the removal
            break
        await asyncio.sleep(0.01)
    await svc.admin.detach(cluster_id)
    await svc.admin.delete(policy_name)
    await forget_clusters(svc.settings, [cluster_id])
    for request_id in request_ids:
        await svc.decisions.delete(cluster_id, request_id)


__all__ = ["CLUSTER_PREFIX", "REMOVAL_TIMEOUT_S", "forget", "replay", "stored_policy"]
