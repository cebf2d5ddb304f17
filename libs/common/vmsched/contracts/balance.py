"""What the balancer publishes: migration decisions and power-action advice."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import Id, Message, Name, Text


class MigrationDecision(Message):
    """Event `migration.<cluster>`: move this VM; the engine carries it out and reports the outcome."""

    decision_id: UUID
    cluster_id: Id
    vm_id: Id
    source_host: Id
    target_host: Id
    #: Next-best targets, best first, for when the migration to target_host fails.
    alternates: list[Id] = Field(default_factory=list, max_length=50)
    #: The balance unit that picked the VM, and why, in numbers.
    balance_unit: Name
    reason: Text
    policy: Name
    #: The schedule request that chose the target (its decision is in `vmsched explain`).
    request_id: UUID
    decided_at: datetime


class PowerActionKind(StrEnum):
    POWER_ON = "power_on"
    POWER_OFF = "power_off"


class PowerAction(Message):
    """Event `power.<cluster>`: power a host on or off (power saving). vmsched never executes it."""

    action_id: UUID
    cluster_id: Id
    host_id: Id
    action: PowerActionKind
    balance_unit: Name
    reason: Text
    policy: Name
    decided_at: datetime
