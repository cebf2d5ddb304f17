"""Policy administration: policies as documents, and the RPCs of the policy-admin service.

A `PolicyDocument` is a policy as an administrator writes it (and as `vmsched policy export` writes
it to YAML): its filters in order (each may be pinned first or last), its weight units with
factors, its balance unit, selector and properties. A `PolicySet` is a file's worth: policies and
which cluster runs which. The policy-admin service is the only writer of policies: every change is
validated whole, stored as a new version, and announced with `policy.changed`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from vmsched.contracts.base import (
    MAX_FACTOR,
    MAX_INT,
    MAX_TEXT,
    Bool,
    Factor,
    Id,
    Int,
    Key,
    Message,
    Name,
    PropertyValue,
    Text,
    check_factor,
)

#: A policy's name: what administrators and files refer to it by.
PolicyName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._:@-]*$")]
#: A unit as a document names it. Looser than a unit name on purpose: a misspelled unit gets a
#: "did you mean" from validation instead of a pattern error.
UnitRef = Annotated[str, StringConstraints(min_length=1, max_length=255)]
#: Who did something: an AMQP user name as RabbitMQ allows it (any text), as the broker vouched for it.
Actor = Annotated[str, StringConstraints(min_length=1, max_length=255)]

MAX_UNITS = 256
MAX_PROPERTIES = 256


class FilterPosition(StrEnum):
    """Where a filter runs: pinned first, pinned last, or in list order in between (oVirt's
    filter_sequence)."""

    FIRST = "first"
    ANY = "any"
    LAST = "last"


class FilterEntry(Message):
    """One filter of a policy's chain."""

    unit: UnitRef = Field(description="A filter unit's name (`vmsched units list`).")
    position: FilterPosition = Field(
        FilterPosition.ANY, description="first / last pin the filter; any runs it in list order."
    )


class WeightEntry(Message):
    """One weight unit of a policy, with its factor."""

    unit: UnitRef = Field(description="A weight unit's name (`vmsched units list`).")
    factor: Factor = Field(
        1,
        description=f"Multiplier of the unit's points: a decimal (1.5) from -{MAX_FACTOR} to {MAX_FACTOR}, "
        "written as an integer when whole; negative turns spreading into stacking (Nova).",
    )

    _factor_checked = field_validator("factor", mode="before")(check_factor)


class PolicyDocument(Message):
    """A policy as written by an administrator."""

    name: PolicyName = Field(description="Unique name; built-in policies keep theirs and are locked.")
    description: Text = Field("", description="Free text shown by `vmsched policy list`.")
    filters: list[FilterEntry] = Field(
        default_factory=list, max_length=MAX_UNITS, description="Hard constraints, run in this order."
    )
    weights: list[WeightEntry] = Field(
        default_factory=list, max_length=MAX_UNITS, description="Soft preferences and their factors."
    )
    balance: UnitRef | None = Field(None, description="The balance unit the balancer runs, or none.")
    selector: Name = Field("RankSelector", description="How weights become a ranking (RankSelector, ...).")
    properties: dict[Key, PropertyValue] = Field(
        default_factory=dict,
        max_length=MAX_PROPERTIES,
        description="Unit properties shared by every unit of the policy, as strings (oVirt's custom properties).",
    )


class StoredPolicy(Message):
    """A policy as stored: its document and what the store adds."""

    document: PolicyDocument = Field(description="The policy as its administrator wrote it.")
    id: Id = Field(description="The policy's id (a UUID).")
    version: Int = Field(ge=1, le=MAX_INT, description="Increases by one with every stored change.")
    locked: Bool = Field(description="A built-in: it cannot be edited or deleted, only cloned.")
    default: Bool = Field(description="The policy clusters without their own choice run.")
    clusters: list[Id] = Field(default_factory=list, max_length=100_000, description="Clusters attached to it.")


class ClusterAttachment(Message):
    """Which policy a cluster runs, with the cluster's own property overrides."""

    cluster_id: Id = Field(description="The cluster.")
    policy: PolicyName = Field(description="The policy's name.")
    properties: dict[Key, PropertyValue] = Field(
        default_factory=dict,
        max_length=MAX_PROPERTIES,
        description="Overrides of the policy's properties for this cluster only.",
    )
    ha_reservation: Bool = Field(False, description="Keep room to restart the HA VMs of any one failed host.")


class PolicySet(Message):
    """Policies and cluster attachments: what `vmsched policy apply -f` reads and `export` writes."""

    policies: list[PolicyDocument] = Field(default_factory=list, max_length=1000, description="The policies.")
    clusters: list[ClusterAttachment] = Field(
        default_factory=list, max_length=100_000, description="Which policy each cluster runs."
    )


# ------------------------------------------------------------------------------------ RPCs
class PolicyQuery(Message):
    """RPC `policy.read`: the stored policies (all, or these names) and the cluster attachments."""

    names: list[PolicyName] | None = Field(None, max_length=1000, description="Only these policies; None: all.")


class PolicyListing(Message):
    """The reply to `policy.read`."""

    policies: list[StoredPolicy] = Field(max_length=1000, description="The stored policies asked for.")
    clusters: list[ClusterAttachment] = Field(
        max_length=100_000, description="The attachments of the clusters that run one of them."
    )


class ApplyPolicies(Message):
    """RPC `policy.apply`: make the stored policies and attachments match `desired` (create what is
    new, change what differs, leave the rest). All or nothing: one invalid entry refuses the whole
    set, listing every problem."""

    desired: PolicySet = Field(description="The policies and attachments wanted.")
    dry_run: Bool = Field(False, description="Validate and report the changes without storing them.")


class ChangeAction(StrEnum):
    """What a change did: create, update or delete a policy (or leave it unchanged); attach or
    detach a cluster."""

    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    ATTACH = "attach"
    DETACH = "detach"
    DELETE = "delete"


class Change(Message):
    """One policy or cluster attachment the request changed (or would, in a dry run)."""

    kind: Name = Field(description="policy or cluster")
    name: Key = Field(description="The policy's name or the cluster's id.")
    action: ChangeAction = Field(description="What was done (or would be, in a dry run).")
    #: "+ filter Memory (first)", "~ weight OptimalForEvenCpuDistribution factor 1 -> 2", ...
    diff: list[Annotated[str, StringConstraints(max_length=MAX_TEXT)]] = Field(
        default_factory=list, max_length=10_000, description="What changed, one line per difference."
    )
    version: Int | None = Field(None, ge=1, le=MAX_INT, description="The policy's version after the change.")


class ApplyReport(Message):
    """The reply to `policy.apply`, `policy.delete`, `policy.detach` and `policy.rollback`."""

    dry_run: Bool = Field(description="Nothing was stored: the changes are what would have been made.")
    changes: list[Change] = Field(max_length=200_000, description="Every policy and attachment the request touched.")
    warnings: list[Text] = Field(
        default_factory=list,
        max_length=10_000,
        description=(
            "What was accepted but deserves a look, e.g. running workers lacking a unit of a policy (its "
            "calls go to the workers that have every unit)."
        ),
    )


class ClonePolicy(Message):
    """RPC `policy.clone`: an editable copy of a policy (built-ins included) under a new name."""

    source: PolicyName = Field(description="The policy to copy.")
    name: PolicyName = Field(description="The copy's name (not taken yet).")
    description: Text | None = Field(None, description="The copy's description; null keeps the source's.")


class PolicyRef(Message):
    """RPC `policy.delete` and `policy.history`: one policy by name."""

    name: PolicyName = Field(description="The policy's name.")


class DetachCluster(Message):
    """RPC `policy.detach`: the cluster goes back to the default policy (its overrides dropped)."""

    cluster_id: Id = Field(description="The cluster.")


class RollbackPolicy(Message):
    """RPC `policy.rollback`: store an earlier version's document again, as a new version."""

    name: PolicyName = Field(description="The policy's name.")
    version: Int | None = Field(
        None, ge=1, le=MAX_INT, description="The version to go back to; None: the one before the current."
    )


class PolicyVersion(Message):
    """One stored version of a policy."""

    version: Int = Field(ge=1, le=MAX_INT, description="The version number (the first is 1).")
    stored_at: datetime = Field(description="When it was stored: ISO 8601 date-time with a UTC offset.")
    document: PolicyDocument = Field(description="The policy as it was in this version.")
    author: Actor | None = Field(
        None,
        description="The AMQP user that stored it; null: not recorded (a built-in, or stored before authors were).",
    )


class PolicyHistory(Message):
    """The reply to `policy.history`."""

    name: PolicyName = Field(description="The policy's name.")
    versions: list[PolicyVersion] = Field(max_length=100_000, description="Newest first.")


class UnitQuery(Message):
    """RPC `units.list`: the units policies can name."""


class UnitProperty(Message):
    """A property a unit reads from its policy."""

    name: Key = Field(description="The property's name.")
    regex: Annotated[str, StringConstraints(max_length=MAX_TEXT)] = Field(
        description="A value must match this regular expression."
    )
    default: PropertyValue | None = Field(None, description="The value when the policy sets none; null: none.")
    description: Text = Field("", description="What the property does, and its unit.")


class UnitInfo(Message):
    """A policy unit policies can name."""

    name: Name = Field(description="The unit's name.")
    origin: Text = Field(
        "builtin", description='Where it comes from: "builtin", or the plugin\'s "<distribution> <version>".'
    )
    description: Text = Field("", description="What the unit does.")
    filter: Bool = Field(description="It can run as a filter.")
    weight: Bool = Field(description="It can run as a weight.")
    balance: Bool = Field(description="It can run as the balance unit.")
    properties: list[UnitProperty] = Field(
        default_factory=list, max_length=MAX_PROPERTIES, description="The properties it reads."
    )


class RunningInstance(Message):
    """One running service instance's unit catalogue, as it announced it."""

    service: Name = Field(description="Its service kind (filter-worker, weigher, balancer, ...).")
    instance: Annotated[str, StringConstraints(min_length=1, max_length=255)] = Field(
        description="Its id among the service's instances (host, process id, a random part)."
    )
    catalogue: Annotated[str, StringConstraints(max_length=64, pattern=r"^[0-9a-f]{1,64}$")] = Field(
        description="The hash of its units and their origins: workers alike share the queues named after it."
    )
    units: Int = Field(ge=0, le=100_000, description="How many units it has.")
    plugins: dict[Name, Text] = Field(
        default_factory=dict, max_length=10_000, description="Its units from plugins -> their origin."
    )
    lacks: list[Name] = Field(
        default_factory=list,
        max_length=10_000,
        description="Units another live instance of its service has and it lacks (policies using them skip it).",
    )


class UnitListing(Message):
    """The reply to `units.list`: the units of the policy-admin's registry, what each kind of running
    service has, and each running instance's catalogue."""

    units: list[UnitInfo] = Field(max_length=10_000, description="Every unit, by name.")
    running: dict[Name, Annotated[list[Name], Field(max_length=10_000)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Service kind (filter-worker, weigher, balancer, ...) -> the units every live instance has.",
    )
    instances: list[RunningInstance] = Field(
        default_factory=list, max_length=10_000, description="Every live service instance, by service and id."
    )


__all__ = [
    "Actor",
    "ApplyPolicies",
    "ApplyReport",
    "Change",
    "ChangeAction",
    "ClonePolicy",
    "ClusterAttachment",
    "DetachCluster",
    "FilterEntry",
    "FilterPosition",
    "PolicyDocument",
    "PolicyHistory",
    "PolicyListing",
    "PolicyName",
    "PolicyQuery",
    "PolicyRef",
    "PolicySet",
    "PolicyVersion",
    "RollbackPolicy",
    "RunningInstance",
    "StoredPolicy",
    "UnitInfo",
    "UnitListing",
    "UnitProperty",
    "UnitQuery",
    "WeightEntry",
]
