"""A live cluster as a workload: its hosts, its VMs and the policy it runs (`simulate --from-cluster`).

The state tracker's snapshot (ClusterState) gives the hosts as reported (cores, threads, memory,
reserved memory, networks, labels, SPM) and every VM's last report; policy-admin's listing gives the
policy the cluster is attached to (or the default one) with the cluster's own property overrides.
Every VM that is on a host (starting, running, migrating) arrives at time 0 in the order of its
host and id, unpinned: the simulation shows where the policy would put today's demand, and how it
balances it from there, not the layout the cluster has. A host in maintenance stays in maintenance
for the whole run; a host down or not responding is a host failed at time 0, never repaired. The
VM-to-VM affinity groups the VMs' reports carry come along (a workload has no VM-to-host rules, so a
group's host rule is left out).
"""

from __future__ import annotations

from vmsched.contracts.policies import PolicyDocument, PolicyListing
from vmsched.contracts.state import ClusterState, HostStatus, VmStatus
from vmsched.errors import InvalidRequest
from vmsched.simulation.workload import (
    AffinityGroupSpec,
    ClusterSettings,
    HostFailure,
    HostSpec,
    MaintenanceWindow,
    VmArrival,
    Workload,
)

#: VM states that hold a host's resources (those a simulation starts with).
_ON_A_HOST = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})


def cluster_policy(cluster_id: str, listing: PolicyListing) -> PolicyDocument | None:
    """The policy `cluster_id` runs (its attachment's, with the cluster's overrides; else the
    default policy), or None when policy-admin has neither."""
    attached = next((a for a in listing.clusters if a.cluster_id == cluster_id), None)
    stored = next(
        (p for p in listing.policies if (p.document.name == attached.policy if attached else p.default)), None
    )
    if stored is None:
        return None
    overrides = attached.properties if attached else {}
    return stored.document.model_copy(update={"properties": {**stored.document.properties, **overrides}})


def cluster_workload(state: ClusterState, policy: PolicyDocument | None, *, duration_s: float = 86_400.0) -> Workload:
    """The workload of a cluster's snapshot and policy, simulated for `duration_s`."""
    if not state.hosts:
        raise InvalidRequest(f"cluster {state.cluster_id}: the state tracker has no hosts for it")
    hosts = [
        HostSpec(
            id=h.report.host_id,
            cpu_cores=max(1, h.report.cpu_cores),
            cpu_threads=h.report.cpu_threads,
            mem_mb=max(1, h.report.physical_mem_mb),
            reserved_mem_mb=h.report.reserved_mem_mb,
            networks=list(h.report.networks),
            labels=dict(h.report.labels),
            is_spm=h.report.is_spm,
        )
        for h in sorted(state.hosts, key=lambda h: h.report.host_id)
    ]
    status = {h.report.host_id: h.report.status for h in state.hosts}
    vms = sorted((v for v in state.vms if v.status in _ON_A_HOST and v.host_id), key=lambda v: (v.host_id, v.vm_id))
    arrivals = [
        VmArrival(
            at_s=0.0,
            vm_id=v.vm_id,
            mem_mb=v.mem_mb,
            vcpus=v.vcpus,
            ha=v.ha,
            cpu_usage_pct=v.cpu_usage_pct,
            networks=list(v.networks),
            affinity_groups=[g.group_id for g in v.affinity_groups if g.vm_rule is not None],
        )
        for v in vms
    ]
    groups = {
        g.group_id: AffinityGroupSpec(id=g.group_id, positive=g.vm_rule.positive, enforcing=g.vm_rule.enforcing)
        for v in vms
        for g in v.affinity_groups
        if g.vm_rule is not None
    }
    return Workload(
        name=f"cluster-{state.cluster_id}",
        description=f"cluster {state.cluster_id} at state version {state.version}: {len(hosts)} hosts, "
        f"{len(arrivals)} VMs" + (f", policy {policy.name}" if policy else ""),
        duration_s=duration_s,
        cluster=ClusterSettings(
            memory_overcommit_pct=state.settings.memory_overcommit_pct,
            count_threads_as_cores=state.settings.count_threads_as_cores,
        ),
        policies=[policy] if policy else [],
        hosts=hosts,
        affinity_groups=[groups[k] for k in sorted(groups)],
        arrivals=arrivals,
        failures=[
            HostFailure(at_s=0.0, host_id=h)
            for h, s in sorted(status.items())
            if s in (HostStatus.DOWN, HostStatus.NON_RESPONSIVE)
        ],
        maintenance=[
            MaintenanceWindow(host_id=h, start_s=0.0, end_s=duration_s)
            for h, s in sorted(status.items())
            if s == HostStatus.MAINTENANCE
        ],
    )


__all__ = ["cluster_policy", "cluster_workload"]
