"""What the balancer publishes: migration decisions and power-action advice."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import Id, Message, Name, Text


class MigrationDecision(Message):
    """Event `migration.<cluster>`: move this VM; the engine carries it out and reports the outcome."""

    decision_id: UUID = Field(description="Names this migration decision.")
    cluster_id: Id = Field(description="The cluster; the routing key names the same cluster.")
    vm_id: Id = Field(description="The VM to migrate.")
    source_host: Id = Field(description="The host it runs on now.")
    target_host: Id = Field(description="The host to migrate it to.")
    alternates: list[Id] = Field(
        default_factory=list,
        max_length=50,
        description="Next-best targets, best first, for when the migration to target_host fails.",
    )
    balance_unit: Name = Field(description="The balance unit that picked the VM.")
    reason: Text = Field(description="Why, with numbers.")
    policy: Name = Field(description="The cluster policy the balance unit belongs to.")
    request_id: UUID = Field(
        description="The schedule request that chose the target (its decision is in `vmsched explain`)."
    )
    decided_at: datetime = Field(description="When it was decided: ISO 8601 date-time, UTC.")


class PowerActionKind(StrEnum):
    """`power_on` or `power_off` a host."""

    POWER_ON = "power_on"
    POWER_OFF = "power_off"


class PowerAction(Message):
    """Event `power.<cluster>`: power a host on or off (power saving). vmsched never executes it."""

    action_id: UUID = Field(description="Names this advice.")
    cluster_id: Id = Field(description="The cluster; the routing key names the same cluster.")
    host_id: Id = Field(description="The host to power on or off.")
    action: PowerActionKind = Field(description="On or off.")
    balance_unit: Name = Field(description="The balance unit that advised it.")
    reason: Text = Field(description="Why, with numbers.")
    policy: Name = Field(description="The cluster policy the balance unit belongs to.")
    decided_at: datetime = Field(description="When it was decided: ISO 8601 date-time, UTC.")
