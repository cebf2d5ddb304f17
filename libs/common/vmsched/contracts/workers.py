"""The selector's calls to the filter-worker and the weigher, and to the state tracker.

Requests carry the cluster's state *version*, not its hosts: every worker keeps a versioned copy of
each cluster's state (vmsched.store.StateCache) and catches up to the version asked for, so the host
list never crosses the bus on the hot path. `place` (the default) sends a group of schedule requests
and the cluster's pending entries, and gets placements back; `filter` and `weigh` (one VM at a
time, when weighing runs on the weighers) carry the candidate ids.
"""

from __future__ import annotations

from enum import StrEnum
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Message, Name, PropertyValue
from vmsched.contracts.scheduling import (
    MAX_HOSTS,
    ErrorInfo,
    Explanation,
    FilteredHost,
    PendingEntry,
    Placement,
    ScheduleRequest,
    ScoreTable,
    VmSpec,
)


class UnitCall(Message):
    """One policy unit as a policy uses it: its name, its factor (weights) and the policy's properties."""

    unit: Name
    factor: Float = Field(1.0, ge=-1_000_000, le=1_000_000)
    properties: dict[Name, PropertyValue] = Field(default_factory=dict, max_length=256)


class FilterRequest(Message):
    """RPC `filter`: run these filters, in order, over these candidates (one VM; the selector sends
    it when it places itself, VMSCHED_PLACE_IN_WORKER=false)."""

    request_id: UUID
    cluster_id: Id
    state_version: Int = Field(ge=0, le=MAX_INT)
    vm: VmSpec
    candidates: list[Id] = Field(max_length=MAX_HOSTS)
    filters: list[UnitCall] = Field(max_length=256)
    pending: list[PendingEntry] = Field(default_factory=list, max_length=100_000)
    #: The decision's instant (unix seconds): units judging time (heartbeats, load duration) use it.
    now: Float = 0.0


class FilterReply(Message):
    request_id: UUID
    survivors: list[Id] = Field(max_length=MAX_HOSTS)
    removed: list[FilteredHost] = Field(max_length=MAX_HOSTS)


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


class PlaceItem(Message):
    """One schedule request of a `place` group."""

    request: ScheduleRequest
    #: When no host fits but memory is pending on a candidate, answer `wait` instead of
    #: `unplaceable` (the selector then waits for pending to change and retries once).
    may_wait: Bool = False


class PlaceRequest(Message):
    """RPC `place`: place these schedule requests of one cluster, in order, each seeing the VMs the
    earlier ones placed as pending (as if they came one at a time): filter, weigh and select, all
    on the worker's copy of the cluster's state at `state_version` or later."""

    #: Names this group in logs; not a schedule request's id.
    request_id: UUID
    cluster_id: Id
    state_version: Int = Field(ge=0, le=MAX_INT)
    items: list[PlaceItem] = Field(min_length=1, max_length=1000)
    #: The policy's filter chain, in the order it runs.
    filters: list[UnitCall] = Field(max_length=256)
    weights: list[UnitCall] = Field(default_factory=list, max_length=256)
    selector: Name = "RankSelector"
    #: The cluster's pending resources when the group began (a request's own VMs among them are
    #: not counted against it).
    pending: list[PendingEntry] = Field(default_factory=list, max_length=100_000)
    #: The decisions' instant (unix seconds): units judging time (heartbeats, load duration) use it.
    now: Float = 0.0
    #: Seconds the pending records of the placed VMs will live (the worker counts them for the
    #: later requests of the group with this expiry).
    pending_ttl_s: Float = Field(120.0, gt=0)


class PlaceOutcome(StrEnum):
    #: Every VM of the request has a host (`placements`, in request order).
    PLACED = "placed"
    #: No host for some VM of the request; nothing of it is placed (`explanation` says why).
    UNPLACEABLE = "unplaceable"
    #: No host now, but memory is pending on a candidate: wait for pending to change, then retry.
    WAIT = "wait"
    #: The request could not be evaluated (`error`); the rest of the group went on.
    ERROR = "error"


class PlaceResult(Message):
    """What one request of a `place` group came to."""

    request_id: UUID
    outcome: PlaceOutcome
    placements: list[Placement] = Field(default_factory=list, max_length=1001)
    #: The first VM's explanation (a batch's summary says how many were placed); for `unplaceable`,
    #: the VM that did not fit. None for `wait` and `error`.
    explanation: Explanation | None = None
    error: ErrorInfo | None = None


class PlaceReply(Message):
    request_id: UUID
    #: The state version the group was placed at (the worker's copy, at least the one asked for).
    state_version: Int = Field(ge=0, le=MAX_INT)
    #: One per item, in the request's order.
    results: list[PlaceResult] = Field(max_length=1000)


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
