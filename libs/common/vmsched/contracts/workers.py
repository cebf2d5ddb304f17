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

from pydantic import Field, field_validator

from vmsched.contracts.base import MAX_INT, Bool, Factor, Float, Id, Int, Message, Name, PropertyValue, check_factor
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

#: How every request's `now` reads.
NOW = "The decision's instant, unix seconds: units judging time (heartbeats, load duration) use it."


class UnitCall(Message):
    """One policy unit as a policy uses it: its name, its factor (weights) and the policy's properties."""

    unit: Name = Field(description="The policy unit's name.")
    factor: Factor = Field(1, description="The unit's factor in the policy (weights; unitless multiplier, a decimal).")

    _factor_checked = field_validator("factor", mode="before")(check_factor)
    properties: dict[Name, PropertyValue] = Field(
        default_factory=dict,
        max_length=256,
        description="The policy's property values for the unit, as strings, each checked against the unit's regex.",
    )


class FilterRequest(Message):
    """RPC `filter`: run these filters, in order, over these candidates (one VM; the selector sends
    it when it places itself, VMSCHED_PLACE_IN_WORKER=false)."""

    request_id: UUID = Field(description="The schedule request this is part of.")
    cluster_id: Id = Field(description="The cluster.")
    state_version: Int = Field(
        ge=0, le=MAX_INT, description="The cluster state version to filter at (the worker catches up to it)."
    )
    vm: VmSpec = Field(description="The VM being placed.")
    candidates: list[Id] = Field(max_length=MAX_HOSTS, description="The hosts to filter (ids).")
    filters: list[UnitCall] = Field(max_length=256, description="The filter chain, in the order it runs.")
    pending: list[PendingEntry] = Field(
        default_factory=list, max_length=100_000, description="The cluster's pending resources."
    )
    now: Float = Field(0.0, description=NOW)


class FilterReply(Message):
    """The reply to `filter`."""

    request_id: UUID = Field(description="The request answered.")
    survivors: list[Id] = Field(max_length=MAX_HOSTS, description="The hosts every filter kept, in candidate order.")
    removed: list[FilteredHost] = Field(max_length=MAX_HOSTS, description="The hosts removed, each with why.")


class WeighRequest(Message):
    """RPC `weigh`: weigh the hosts with every unit and rank them with the policy's selector."""

    request_id: UUID = Field(description="The schedule request this is part of.")
    cluster_id: Id = Field(description="The cluster.")
    state_version: Int = Field(
        ge=0, le=MAX_INT, description="The cluster state version to weigh at (the worker catches up to it)."
    )
    vm: VmSpec = Field(description="The VM being placed.")
    hosts: list[Id] = Field(max_length=MAX_HOSTS, description="The hosts to weigh (the filters' survivors).")
    weights: list[UnitCall] = Field(max_length=256, description="The policy's weight units, with factors.")
    selector: Name = Field("RankSelector", description="The policy's selector (how raw weights become points).")
    top: Int | None = Field(
        None,
        ge=1,
        le=MAX_HOSTS,
        description="Answer only the best `top` hosts, without the per-unit table; null answers every host with "
        "the table (the schedule request asked for scores).",
    )
    pending: list[PendingEntry] = Field(
        default_factory=list, max_length=100_000, description="The cluster's pending resources."
    )
    now: Float = Field(0.0, description=NOW)


class WeighReply(Message):
    """The reply to `weigh`."""

    request_id: UUID = Field(description="The request answered.")
    scores: ScoreTable = Field(
        description="The hosts best first (all of them, or the best `top`), with the per-unit table when asked."
    )


class PlaceItem(Message):
    """One schedule request of a `place` group."""

    request: ScheduleRequest = Field(description="The schedule request.")
    may_wait: Bool = Field(
        False,
        description="When no host fits but memory is pending on a candidate, answer `wait` instead of "
        "`unplaceable` (the selector then waits for pending to change and retries once).",
    )


class PlaceRequest(Message):
    """RPC `place`: place these schedule requests of one cluster, in order, each seeing the VMs the
    earlier ones placed as pending (as if they came one at a time): filter, weigh and select, all
    on the worker's copy of the cluster's state at `state_version` or later."""

    request_id: UUID = Field(description="Names this group in logs; not a schedule request's id.")
    cluster_id: Id = Field(description="The cluster of every request in the group.")
    state_version: Int = Field(
        ge=0, le=MAX_INT, description="The cluster state version to place at, at least (the worker catches up)."
    )
    items: list[PlaceItem] = Field(min_length=1, max_length=1000, description="The requests, in decision order.")
    filters: list[UnitCall] = Field(max_length=256, description="The policy's filter chain, in the order it runs.")
    weights: list[UnitCall] = Field(
        default_factory=list, max_length=256, description="The policy's weight units, with factors."
    )
    selector: Name = Field("RankSelector", description="The policy's selector.")
    pending: list[PendingEntry] = Field(
        default_factory=list,
        max_length=100_000,
        description="The cluster's pending resources when the group began (a request's own VMs among them are not "
        "counted against it).",
    )
    now: Float = Field(0.0, description=NOW)
    pending_ttl_s: Float = Field(
        120.0,
        gt=0,
        description="How long the pending records of the placed VMs will live, seconds (the worker counts them for "
        "the later requests of the group with this expiry).",
    )
    fencing_token: Int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="The cluster lock acquisition the group is placed under: the pending records returned carry it.",
    )


class PlaceOutcome(StrEnum):
    """`placed`: every VM has a host; `unplaceable`: no host for some VM, nothing placed; `wait`: no
    host now but memory is pending on a candidate; `expired`: its deadline (or the call's) passed
    before it was placed, nothing placed; `error`: the request could not be evaluated."""

    #: Every VM of the request has a host (`placements`, in request order).
    PLACED = "placed"
    #: No host for some VM of the request; nothing of it is placed (`explanation` says why).
    UNPLACEABLE = "unplaceable"
    #: No host now, but memory is pending on a candidate: wait for pending to change, then retry.
    WAIT = "wait"
    #: Its deadline, or the `place` call's, passed before every VM had a host; nothing of it is placed.
    EXPIRED = "expired"
    #: The request could not be evaluated (`error`); the rest of the group went on.
    ERROR = "error"


class PlaceResult(Message):
    """What one request of a `place` group came to."""

    request_id: UUID = Field(description="The schedule request.")
    outcome: PlaceOutcome = Field(description="What came of it.")
    placements: list[Placement] = Field(
        default_factory=list, max_length=1001, description="One per VM, in request order, when `placed`."
    )
    explanation: Explanation | None = Field(
        None,
        description="The first VM's explanation (a batch's summary says how many were placed); for `unplaceable`, "
        "the VM that did not fit. Null for `wait`, `expired` and `error`.",
    )
    pending: list[PendingEntry] = Field(
        default_factory=list,
        max_length=1001,
        description="When `placed`: what each placed VM holds on its host, in request order, with the group's "
        "fencing token and expiry (the selector records exactly these).",
    )
    error: ErrorInfo | None = Field(None, description="Why, when `error`.")


class PlaceReply(Message):
    """The reply to `place`."""

    request_id: UUID = Field(description="The group answered.")
    state_version: Int = Field(
        ge=0,
        le=MAX_INT,
        description="The state version the group was placed at (the worker's copy, at least the one asked for).",
    )
    results: list[PlaceResult] = Field(max_length=1000, description="One per item, in the request's order.")


class StateRequest(Message):
    """RPC `state`: the cluster's current snapshot."""

    cluster_id: Id = Field(description="The cluster.")


class ErrorReply(Message):
    """The body of any RPC reply that failed; the reply also carries header x-vmsched-error."""

    code: Name = Field(description="A stable error code (asyncapi.json x-vmsched-error-codes lists them).")
    message: str = Field(max_length=8000, description="What went wrong, for people.")
    location: str | None = Field(
        None,
        max_length=500,
        description='Where in the request the problem is (a JSON path such as "vm.mem_mb"), when known.',
    )


class PolicyChanged(Message):
    """Event `policy.changed`: a policy or a cluster's policy link changed; caches drop their copy."""

    policy_id: UUID | None = Field(None, description="The policy that changed; null: any.")
    cluster_id: Id | None = Field(None, description="The cluster whose policy link changed; null: any.")
