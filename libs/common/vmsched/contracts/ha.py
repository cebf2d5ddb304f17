"""The HA reservation conversation: the HA monitor's alerts and recoveries, and the `ha-check` RPC."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Message, Text
from vmsched.contracts.scheduling import MAX_HOSTS


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
