"""Reads for an engine, an integrator or the HTTP API, which hold no Redis or PostgreSQL connection
of their own: the clusters with state (`clusters.list`), the stored decisions (`decisions.recent`,
`decisions.get`), served by the state tracker; and what-if placements (`whatif`), served by the
selector: the schedule path over the state and pending resources as they are, under the cluster's
policy, a stored one or one not stored, without taking the lock, recording pending resources,
storing or publishing anything.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self
from uuid import UUID

from pydantic import Field, model_validator

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Key, Message, Name, PropertyValue, Text
from vmsched.contracts.policies import MAX_PROPERTIES, PolicyDocument, PolicyName
from vmsched.contracts.scheduling import (
    MAX_HOSTS,
    DecisionStatus,
    Explanation,
    RequestKind,
    ScheduleDecision,
    VmSpec,
)

#: The most decisions one `decisions.recent` reply carries.
MAX_DECISIONS = 1000
#: The most clusters one `clusters.list` reply carries.
MAX_CLUSTERS = 100_000


# ------------------------------------------------------------------------------------ clusters
class ClusterQuery(Message):
    """RPC `clusters.list`: every cluster the state tracker holds state for."""


class ClusterSummary(Message):
    """One cluster with state, in counts."""

    cluster_id: Id = Field(description="The cluster.")
    hosts: Int = Field(ge=0, le=MAX_HOSTS, description="Hosts reported (count, whatever their status).")
    vms: Int = Field(ge=0, le=MAX_INT, description="VMs reported holding resources on a host (count).")
    state_version: Int = Field(ge=0, le=MAX_INT, description="The cluster's state version.")
    policy: PolicyName | None = Field(
        None, description="The policy the cluster runs; null: not known (PostgreSQL did not answer in time)."
    )


class ClusterListing(Message):
    """The reply to `clusters.list`."""

    clusters: list[ClusterSummary] = Field(max_length=MAX_CLUSTERS, description="The clusters, by id.")


# ------------------------------------------------------------------------------------ decisions
class DecisionQuery(Message):
    """RPC `decisions.recent`: a cluster's latest stored decisions."""

    cluster_id: Id = Field(description="The cluster.")
    limit: Int = Field(50, ge=1, le=MAX_DECISIONS, description="At most this many decisions (count).")


class DecisionListing(Message):
    """The reply to `decisions.recent`: newest first. Decisions that are not stored (errors,
    expired requests) are not among them, and stored ones are kept for VMSCHED_DECISION_TTL_S."""

    cluster_id: Id = Field(description="The cluster.")
    decisions: list[ScheduleDecision] = Field(max_length=MAX_DECISIONS, description="Newest first.")


class DecisionRef(Message):
    """RPC `decisions.get`: one stored decision by its request id (error decision_not_found if none)."""

    cluster_id: Id = Field(description="The cluster.")
    request_id: UUID = Field(description="The schedule request the decision answered.")


# ------------------------------------------------------------------------------------ what-if
class PolicyOrigin(StrEnum):
    """Which policy a what-if ran: the cluster's own (with its overrides), a stored one by name, or
    one given in the request."""

    CLUSTER = "cluster"
    STORED = "stored"
    INLINE = "inline"


class WhatIfRequest(Message):
    """RPC `whatif`: where `vm` would be placed now, and why, host by host. Nothing is locked,
    recorded, stored or published."""

    cluster_id: Id = Field(description="The cluster.")
    vm: VmSpec = Field(description="The VM to place.")
    kind: RequestKind = Field(RequestKind.RUN, description="Run a new VM, or migrate a running one.")
    policy: PolicyName | None = Field(
        None,
        description="A stored policy's name (the cluster's HA reservation switch still applies, its property "
        "overrides do not); null: the cluster's own policy with its overrides.",
    )
    policy_inline: PolicyDocument | None = Field(
        None, description="A policy not stored, as in a policy file; validated the same way. Excludes `policy`."
    )
    properties: dict[Key, PropertyValue] = Field(
        default_factory=dict,
        max_length=MAX_PROPERTIES,
        description="Property overrides merged over the policy's (each must be read by one of its units).",
    )

    @model_validator(mode="after")
    def _one_policy(self) -> Self:
        if self.policy is not None and self.policy_inline is not None:
            raise ValueError("give policy (a stored policy's name) or policy_inline (a policy document), not both")
        return self


class WeightScore(Message):
    """One weight unit's score of one host."""

    unit: Name = Field(description="The weight unit.")
    factor: Float = Field(description="The policy's factor for the unit (unitless multiplier).")
    raw: Float = Field(description="The unit's raw weight, in the unit's own scale.")
    points: Float = Field(description="What the selector made of the raw weight.")


class HostVerdict(Message):
    """One host of the cluster as the what-if saw it."""

    host_id: Id = Field(description="The host.")
    passed: Bool = Field(description="It passed every filter.")
    filter: Name | None = Field(None, description="The filter that removed it; null: passed, or no candidate.")
    reason: Text | None = Field(None, description="Why it was removed or was no candidate; null when it passed.")
    rank: Int | None = Field(None, ge=1, le=MAX_HOSTS, description="Its place among the hosts that passed (1: chosen).")
    total: Float | None = Field(None, description="Its total points (ranked among two or more hosts only).")
    weights: list[WeightScore] = Field(
        default_factory=list, max_length=256, description="Each weight unit's score (ranked among two or more only)."
    )


class WhatIfReply(Message):
    """The reply to `whatif`: a decision as `schedule` would make it now, with the whole host table."""

    cluster_id: Id = Field(description="The cluster.")
    vm_id: Id = Field(description="The VM.")
    status: DecisionStatus = Field(description="placed or unplaceable.")
    host_id: Id | None = Field(None, description="Where the VM would go, when placed.")
    alternates: list[Id] = Field(default_factory=list, max_length=50, description="Next-best hosts, best first.")
    policy: PolicyName = Field(description="The policy that ran.")
    policy_origin: PolicyOrigin = Field(description="Where the policy came from.")
    policy_version: Int | None = Field(None, ge=1, le=MAX_INT, description="Its stored version; null: inline.")
    policy_properties: dict[Key, PropertyValue] = Field(
        default_factory=dict, max_length=MAX_PROPERTIES, description="The properties its units ran with."
    )
    state_version: Int = Field(ge=0, le=MAX_INT, description="The cluster state version it was made at.")
    pending: Int = Field(0, ge=0, le=MAX_INT, description="Pending records counted (VMs placed, not yet reported).")
    explanation: Explanation = Field(description="As a decision's, with every removed host and the score table.")
    hosts: list[HostVerdict] = Field(max_length=MAX_HOSTS, description="Every host of the cluster, by id.")
    elapsed_ms: Float = Field(0.0, ge=0, description="How long it took, milliseconds.")


__all__ = [
    "MAX_DECISIONS",
    "ClusterListing",
    "ClusterQuery",
    "ClusterSummary",
    "DecisionListing",
    "DecisionQuery",
    "DecisionRef",
    "HostVerdict",
    "PolicyOrigin",
    "WeightScore",
    "WhatIfReply",
    "WhatIfRequest",
]
