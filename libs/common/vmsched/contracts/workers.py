"""The selector's calls to the filter-worker and the weigher, and to the state tracker.

Requests carry the cluster's state *version*, not its hosts: every worker keeps a versioned copy of
each cluster's state (vmsched.store.StateCache) and catches up to the version asked for, so the host
list never crosses the bus on the hot path. Only the candidate ids and the few pending entries do.
"""

from __future__ import annotations

from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Message, Name, PropertyValue
from vmsched.contracts.scheduling import MAX_HOSTS, FilteredHost, PendingEntry, ScoreTable, VmSpec


class UnitCall(Message):
    """One policy unit as a policy uses it: its name, its factor (weights) and the policy's properties."""

    unit: Name
    factor: Float = Field(1.0, ge=-1_000_000, le=1_000_000)
    properties: dict[Name, PropertyValue] = Field(default_factory=dict, max_length=256)


class FilterRequest(Message):
    """RPC `filter`: run these filters, in order, over these candidates."""

    request_id: UUID
    cluster_id: Id
    state_version: Int = Field(ge=0, le=MAX_INT)
    vm: VmSpec
    candidates: list[Id] = Field(max_length=MAX_HOSTS)
    filters: list[UnitCall] = Field(max_length=256)
    pending: list[PendingEntry] = Field(default_factory=list, max_length=100_000)
    #: The decision's instant (unix seconds): units judging time (heartbeats, load duration) use it.
    now: Float = 0.0
    #: Also weigh and rank the survivors here when two or more survive, saving the selector a
    #: second call (the weigher's RPC): `weights`, `selector` and `top` as in WeighRequest.
    weigh: Bool = False
    weights: list[UnitCall] = Field(default_factory=list, max_length=256)
    selector: Name = "RankSelector"
    top: Int | None = Field(None, ge=1, le=MAX_HOSTS)


class FilterReply(Message):
    request_id: UUID
    survivors: list[Id] = Field(max_length=MAX_HOSTS)
    removed: list[FilteredHost] = Field(max_length=MAX_HOSTS)
    #: The survivors ranked, when the request asked to weigh and two or more survived.
    scores: ScoreTable | None = None


class WeighRequest(Message):
    """RPC `weigh`: weigh the hosts with every unit and rank them with the policy's selector."""

    request_id: UUID
    cluster_id: Id
    state_version: Int = Field(ge=0, le=MAX_INT)
    vm: VmSpec
    hosts: list[Id] = Field(max_length=MAX_HOSTS)
    weights: list[UnitCall] = Field(max_length=256)
    #: The policy's selector (how raw weights become points and a ranking).
    selector: Name = "RankSelector"
    #: Answer only the best `top` hosts, without the per-unit table; None answers every host with
    #: the table (the schedule request asked for scores). The selector needs the best host and its
    #: alternates, so the reply stays a few ids however large the cluster.
    top: Int | None = Field(None, ge=1, le=MAX_HOSTS)
    pending: list[PendingEntry] = Field(default_factory=list, max_length=100_000)
    #: The decision's instant (unix seconds): units judging time (heartbeats, load duration) use it.
    now: Float = 0.0


class WeighReply(Message):
    request_id: UUID
    #: The hosts best first (all of them, or the best `top`), with the per-unit table when asked.
    scores: ScoreTable


class StateRequest(Message):
    """RPC `state`: the cluster's current snapshot."""

    cluster_id: Id


class ErrorReply(Message):
    """The body of any RPC reply that failed; the reply also carries header x-vmsched-error."""

    code: Name
    message: str = Field(max_length=8000)
    #: Where in the request the problem is (a JSON path such as "vm.mem_mb"), when known.
    location: str | None = Field(None, max_length=500)


class PolicyChanged(Message):
    """Event `policy.changed`: a policy or a cluster's policy link changed; caches drop their copy."""

    policy_id: UUID | None = None
    cluster_id: Id | None = None
