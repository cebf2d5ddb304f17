"""The HA reservation conversation: the HA monitor's alerts and recoveries, and the `ha-check` RPC."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import Field

from vmsched.contracts.base import MAX_INT, Bool, Float, Id, Int, Message, Text
from vmsched.contracts.scheduling import MAX_HOSTS


class HaAlert(Message):
    """Event `ha.alert.<cluster>`: the cluster failed oVirt's HA reservation check."""

    alert_id: UUID = Field(description="Names this alert.")
    cluster_id: Id = Field(description="The cluster; the routing key names the same cluster.")
    failing_hosts: list[Id] = Field(
        max_length=MAX_HOSTS, description="Hosts whose HA VMs could not restart elsewhere if the host failed."
    )
    message: Text = Field(
        description="oVirt's text: \"Cluster <name> failed the HA Reservation check, HA VMs on host(s): <h1, h2> will "
        'fail to migrate in case of a failover, consider adding resources or shutting down unused VMs."'
    )
    checked_at: datetime = Field(description="When the check ran: ISO 8601 date-time, UTC.")


class HaRecovered(Message):
    """Event `ha.recovered.<cluster>`: the cluster passes the HA reservation check again."""

    cluster_id: Id = Field(description="The cluster; the routing key names the same cluster.")
    previously_failing: list[Id] = Field(max_length=MAX_HOSTS, description="The hosts the last alert named.")
    message: Text = Field(description="What changed, for people.")
    checked_at: datetime = Field(description="When the check ran: ISO 8601 date-time, UTC.")


class HaCheckRequest(Message):
    """RPC `ha-check`: run the HA reservation check for a cluster now."""

    cluster_id: Id = Field(description="The cluster to check.")


class HaReport(Message):
    """The result of one HA reservation check (the reply to `ha-check`)."""

    cluster_id: Id = Field(description="The cluster checked.")
    enabled: Bool = Field(
        description="False when the cluster's policy does not enable HA reservation (nothing was checked)."
    )
    ok: Bool = Field(description="Every host's HA VMs could restart elsewhere.")
    failing_hosts: list[Id] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        description="Hosts whose HA VMs could not restart elsewhere if the host failed.",
    )
    hosts: Int = Field(0, ge=0, le=MAX_HOSTS, description="Up hosts checked (count).")
    ha_vms: Int = Field(0, ge=0, le=MAX_INT, description="Highly available VMs counted (count).")
    checked_at: datetime = Field(description="When the check ran: ISO 8601 date-time, UTC.")
    elapsed_ms: Float = Field(0.0, ge=0, description="How long the check took, milliseconds.")
