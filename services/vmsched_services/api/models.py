"""The HTTP API's own shapes (what the bus messages do not already say): policies in oVirt's shape,
validation results, the error form, and the small request bodies. Every response is a pydantic model,
so the OpenAPI document says exactly what comes back."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vmsched.contracts import (
    ApplyReport,
    FilterEntry,
    FilterPosition,
    PolicyDocument,
    StoredPolicy,
    UnitInfo,
    UnitListing,
    VmSpec,
    WeightEntry,
)
from vmsched.contracts.base import Bool, Id, Int, Key, Name, PropertyValue, Text
from vmsched.contracts.policies import MAX_PROPERTIES, MAX_UNITS, PolicyName, UnitRef
from vmsched.errors import InvalidRequest


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------ errors
class Problem(Model):
    location: str = Field(description="Where: a JSON path (body.filters.0.unit), or `policy NAME` / `cluster ID`.")
    message: str = Field(description="What is wrong there, and what to do.")


class ErrorDetail(Model):
    code: str = Field(description="A stable code (vmsched.errors; contracts/asyncapi.json lists them).")
    message: str = Field(description="What went wrong, for people.")
    hint: str | None = Field(None, description="What to do about it.")
    location: str | None = Field(None, description="The field at fault, if one is.")
    errors: list[Problem] | None = Field(None, description="Every problem, when there are several.")
    request_id: str | None = Field(None, description="The id the api's log names this request by.")


class ErrorResponse(Model):
    error: ErrorDetail


# ------------------------------------------------------------------------------ identity
class Whoami(Model):
    name: str = Field(description="The token's name (the audit log's \"on behalf of\").")
    role: str = Field(description="viewer, operator or admin.")


class Health(Model):
    status: str = Field(description='"ok": the process answers (it says nothing of the services behind the bus).')


# ------------------------------------------------------------------------------ policies (oVirt's shape)
class BalanceEntry(Model):
    unit: UnitRef = Field(description="The balance unit.")


class PolicyOut(Model):
    """A scheduling policy as oVirt's REST API shows one."""

    name: PolicyName
    description: str
    id: str = Field(description="The policy's id (a UUID).")
    version: int = Field(description="Increases by one with every stored change.")
    locked: bool = Field(description="Built in: it cannot be edited or deleted, only cloned.")
    default: bool = Field(description="The policy clusters without their own choice run.")
    filters: list[FilterEntry]
    weights: list[WeightEntry]
    balances: list[BalanceEntry] = Field(description="At most one.")
    selector: str
    properties: dict[str, str]
    clusters: list[str] = Field(description="The clusters attached to it.")

    @classmethod
    def of(cls, stored: StoredPolicy) -> PolicyOut:
        doc = stored.document
        return cls(
            name=doc.name,
            description=doc.description,
            id=stored.id,
            version=stored.version,
            locked=stored.locked,
            default=stored.default,
            filters=list(doc.filters),
            weights=list(doc.weights),
            balances=[BalanceEntry(unit=doc.balance)] if doc.balance else [],
            selector=doc.selector,
            properties=dict(doc.properties),
            clusters=list(stored.clusters),
        )


class PolicyIn(BaseModel):
    """A policy to validate or store, in the shape GET returns (its read-only fields, if sent back,
    are ignored). A filter may be written as its unit's name alone, as in a policy file."""

    model_config = ConfigDict(extra="ignore")

    name: PolicyName | None = Field(None, description="The policy's name; if given, the path's.")
    description: Text = ""
    filters: list[FilterEntry | UnitRef] = Field(default_factory=list, max_length=MAX_UNITS)
    weights: list[WeightEntry] = Field(default_factory=list, max_length=MAX_UNITS)
    balances: list[BalanceEntry] = Field(default_factory=list, max_length=1, description="At most one.")
    balance: UnitRef | None = Field(None, description="The balance unit as a policy file names it (or `balances`).")
    selector: Name = "RankSelector"
    properties: dict[Key, PropertyValue] = Field(default_factory=dict, max_length=MAX_PROPERTIES)

    def document(self, name: str) -> PolicyDocument:
        """The policy as `vmsched policy apply` reads it from a file."""
        filters = [FilterEntry(unit=f, position=FilterPosition.ANY) if isinstance(f, str) else f for f in self.filters]
        balance = self.balances[0].unit if self.balances else self.balance
        if self.balances and self.balance is not None and self.balance != balance:
            raise InvalidRequest("`balance` and `balances` name different units: give one", location="body.balance")
        return PolicyDocument(
            name=name,
            description=self.description,
            filters=filters,
            weights=list(self.weights),
            balance=balance,
            selector=self.selector,
            properties=dict(self.properties),
        )


class ValidationOut(Model):
    valid: bool = Field(description="Whether `PUT` would store it.")
    errors: list[Problem] = Field(description="Every problem (empty when valid).")
    diff: list[str] = Field(description="What storing it would change, one line per difference.")


class CloneIn(Model):
    name: PolicyName = Field(description="The copy's name (not taken yet).")
    description: Text | None = Field(None, description="The copy's description; null keeps the source's.")


class RollbackIn(Model):
    version: Int | None = Field(None, ge=1, description="The version to store again; null: the one before.")


class UnitOut(Model):
    """A policy unit in oVirt's shape (schedulingpolicyunits)."""

    name: str
    type: str = Field(description="filter, weight, balance or selector (a unit that is several appears once per type).")
    description: str
    builtin: bool = Field(description="Shipped with vmsched (locked), not from a plugin.")
    origin: str
    properties: list[dict[str, Any]] = Field(description="name, regex, default, description of each property.")
    missing_in: list[str] = Field(description="Kinds of running service that lack it (policies naming it are refused).")


def units_of(listing: UnitListing) -> list[UnitOut]:
    """One entry per unit and type, as oVirt lists them."""
    out: list[UnitOut] = []

    def missing(unit: UnitInfo, kinds: tuple[str, ...]) -> list[str]:
        return sorted(k for k, names in listing.running.items() if k in kinds and unit.name not in names)

    for unit in listing.units:
        props = [p.model_dump(exclude={"schema_version"}) for p in unit.properties]
        for kind, on, services in (
            ("filter", unit.filter, ("filter-worker",)),
            ("weight", unit.weight, ("weigher", "filter-worker")),
            ("balance", unit.balance, ("balancer",)),
        ):
            if on:
                out.append(
                    UnitOut(
                        name=unit.name,
                        type=kind,
                        description=unit.description,
                        builtin=unit.origin == "builtin",
                        origin=unit.origin,
                        properties=props,
                        missing_in=missing(unit, services),
                    )
                )
    return out


# ------------------------------------------------------------------------------ clusters
class AttachIn(Model):
    policy: PolicyName = Field(description="The policy the cluster runs.")
    properties: dict[Key, PropertyValue] | None = Field(
        None,
        description="Overrides to set (merged with the cluster's current ones, like `vmsched policy attach --set`).",
    )
    unset: list[Key] = Field(default_factory=list, max_length=MAX_PROPERTIES, description="Overrides to remove.")
    ha_reservation: Bool | None = Field(None, description="On or off; null: as the cluster has it now.")
    dry_run: Bool = Field(False, description="Validate and show the change, store nothing.")


class AttachOut(Model):
    report: ApplyReport = Field(description="What changed (or would, in a dry run).")
    notes: list[str] = Field(description="What the change turns off or drops (an HA reservation, an override).")


class WhatIfIn(Model):
    """Where a VM would go now, and why, under the cluster's policy or another (nothing is stored)."""

    vm: VmSpec = Field(description="The VM to place.")
    policy: PolicyName | None = Field(None, description="A stored policy's name; null: the cluster's own.")
    policy_inline: PolicyIn | None = Field(None, description="A policy not stored (as PUT takes it), to try.")
    properties: dict[Key, PropertyValue] = Field(
        default_factory=dict, max_length=MAX_PROPERTIES, description="Overrides of the policy's properties."
    )


class ScheduleIn(Model):
    """A VM to place, and the request's options (vmsched.contracts.ScheduleRequest)."""

    vm: VmSpec = Field(description="The VM to place.")
    whitelist: list[Id] | None = Field(None, max_length=10_000, description="Only these hosts; null: every up host.")
    blacklist: list[Id] = Field(default_factory=list, max_length=10_000, description="Never these hosts.")
    max_alternates: Int = Field(3, ge=0, le=50)
    priority: Int = Field(0, ge=-1000, le=1000)
    explain_scores: Bool = False
    explain_hosts: Bool = False


__all__ = [
    "AttachIn",
    "AttachOut",
    "BalanceEntry",
    "CloneIn",
    "ErrorResponse",
    "Health",
    "PolicyIn",
    "PolicyOut",
    "Problem",
    "RollbackIn",
    "ScheduleIn",
    "UnitOut",
    "ValidationOut",
    "WhatIfIn",
    "Whoami",
    "units_of",
]
