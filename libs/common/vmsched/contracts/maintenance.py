"""What the balancer publishes when a host goes into maintenance: one plan for all of its VMs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Id, Int, Message, Name, Text

#: Bounds of a plan (a host holds at most this many VMs in practice; a plan is one message).
MAX_PLAN_VMS = 5000


class PlannedMigration(Message):
    """One VM of a maintenance plan and the host it is to migrate to."""

    vm_id: Id = Field(description="The VM to migrate off the host in maintenance.")
    target_host_id: Id = Field(description="The host the plan gives it.")


class RefusedVm(Message):
    """A VM of the host in maintenance that fits nowhere, and why."""

    vm_id: Id = Field(description="The VM no host takes.")
    reason: Text = Field(description="Why no host takes it (the placement's summary, or 'not migratable').")


class MaintenancePlan(Message):
    """Event `maintenance.<cluster>`: where every VM of a host in maintenance goes, decided at once.

    Planned all or nothing: either `steps` holds every VM's target and `refused` is empty, or
    `refused` names the VMs no host takes (with why) and `steps` is empty: nothing is migrated, and
    the host cannot be emptied until the cluster changes. The steps are carried out in order, at
    most `max_concurrent` migrations each: a step's MigrationDecisions are published when the
    previous step's VMs are reported on their targets."""

    plan_id: UUID = Field(description="Names this plan; each of its MigrationDecisions says `maintenance plan <id>`.")
    cluster_id: Id = Field(description="The cluster; the routing key names the same cluster.")
    host_id: Id = Field(description="The host going into maintenance.")
    steps: list[Annotated[list[PlannedMigration], Field(min_length=1, max_length=MAX_PLAN_VMS)]] = Field(
        default_factory=list,
        max_length=MAX_PLAN_VMS,
        description="The migrations in the order they are carried out, step by step (empty when refused).",
    )
    refused: list[RefusedVm] = Field(
        default_factory=list,
        max_length=MAX_PLAN_VMS,
        description="The VMs that fit nowhere, with why (empty when planned): the plan is refused as a whole.",
    )
    max_concurrent: Int = Field(ge=1, le=MAX_INT, description="At most this many migrations per step (count).")
    policy: Name = Field(description="The cluster policy whose filters and weights chose the targets.")
    decided_at: datetime = Field(description="When it was planned: ISO 8601 date-time, UTC.")
