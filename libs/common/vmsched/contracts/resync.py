"""After Redis forgot a cluster: the request for a full report, and the engine's word that it sent one.

Redis can lose what it holds (a restart without persistence, a failover to a replica that missed
writes). vmsched then starts a new generation for the cluster (its counters start above every one
issued before) and does not schedule it until the engine has reported it in full again, because
part of the picture would over-commit hosts: VMs placed before the loss would count nowhere.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from vmsched.contracts.base import MAX_INT, EngineEvent, Id, Int, Message, Text

#: What a full report must hold, said in every ResyncRequested.
FULL_REPORT = (
    "Publish, for this cluster: its ClusterReport; a HostReport of every host (any status); a VmReport of "
    "every VM that holds resources on a host: running, paused, starting (powering up), and migrating (with "
    "host_id its destination) — VMs still starting or migrating included, so their resources stay held; then "
    "one ResyncComplete naming this generation and how many hosts and VMs were reported."
)


class ResyncRequested(Message):
    """vmsched asks the engine for a full report of a cluster (routing key
    `state.resync-requested.<cluster>` on the events exchange). Until the full report is in, requests
    for the cluster are answered `state_resyncing` (retryable), and neither the balancer nor the HA
    monitor acts on it. Sent when the loss is found, and again while the cluster waits."""

    cluster_id: Id = Field(description="The cluster to report in full.")
    generation: Int = Field(ge=1, le=MAX_INT, description="The cluster's new generation: ResyncComplete names it.")
    reason: Text = Field(description="Why, for people: what was found (e.g. Redis no longer holds the cluster).")
    requested_at: datetime = Field(description="When vmsched asked (ISO 8601 with UTC offset).")
    full_report: Text = Field(FULL_REPORT, description="What a full report must hold.")


class ResyncComplete(EngineEvent):
    """The engine's full report of a cluster is published (routing key `state.resync-complete.<cluster>`,
    sent after the reports it counts). The cluster is scheduled again once the state holds at least
    that many hosts and VMs, even if some of the reports arrive after this message."""

    cluster_id: Id = Field(description="The cluster reported in full; the routing key must name the same cluster.")
    generation: Int = Field(ge=1, le=MAX_INT, description="The generation of the ResyncRequested this answers.")
    hosts: Int = Field(ge=0, le=MAX_INT, description="HostReports published in the full report (count).")
    vms: Int = Field(
        ge=0,
        le=MAX_INT,
        description="VmReports published in the full report for VMs that hold resources on a host (count).",
    )


__all__ = ["FULL_REPORT", "ResyncComplete", "ResyncRequested"]
