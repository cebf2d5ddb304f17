"""What the balancer and the HA monitor publish: migrations, power actions, HA alerts and recoveries."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Message, Name, Text
from vmsched.contracts.scheduling import MAX_HOSTS


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


class HaAlert(Message):
    """Event `ha.alert.<cluster>`: the cluster failed oVirt's HA reservation check."""

    alert_id: UUID
    cluster_id: Id
    failing_hosts: list[Id] = Field(max_length=MAX_HOSTS)
    #: "Cluster <name> failed the HA Reservation check, HA VMs on host(s): <h1, h2> will fail to
    #: migrate in case of a failover, consider adding resources or shutting down unused VMs."
    message: Text
    checked_at: datetime


class HaRecovered(Message):
    """Event `ha.recovered.<cluster>`: the cluster passes the HA reservation check again."""

    cluster_id: Id
    previously_failing: list[Id] = Field(max_length=MAX_HOSTS)
    message: Text
    checked_at: datetime


class HaCheckRequest(Message):
    """RPC `ha-check`: run the HA reservation check for a cluster now."""

    cluster_id: Id


class HaReport(Message):
    """The result of one HA reservation check (the reply to `ha-check`)."""

    cluster_id: Id
    #: False when the cluster does not have HA reservation enabled (nothing was checked).
    enabled: Bool
    ok: Bool
    failing_hosts: list[Id] = Field(default_factory=list, max_length=MAX_HOSTS)
    hosts: Int = Field(0, ge=0, le=MAX_HOSTS)
    ha_vms: Int = Field(0, ge=0, le=MAX_INT)
    checked_at: datetime
    elapsed_ms: Float = Field(0.0, ge=0)
