"""Destructive administration and its audit trail: the RPCs policy-admin serves besides policies.

Removing a cluster or hosts and requeueing dead letters are asked of the policy-admin service, which
checks that the sender (the AMQP user_id the broker vouches for) is an administrator, records the
action in the audit log (PostgreSQL), and only then does it: publishes the removal event for the
state tracker, or sends the dead letters again. `audit.read` lists that log, newest first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from vmsched.contracts.base import MAX_INT, Id, Int, Key, Message, Text, json_bounds
from vmsched.contracts.policies import Actor

#: Hosts one `hosts.remove` request may name: a request is one state version; more go in several.
MAX_REMOVED_HOSTS = 10_000
#: Dead letters one `dead-letters.requeue` request may name (without ids: every one).
MAX_REQUEUE_IDS = 10_000
#: Audit rows one `audit.read` answer holds at most.
MAX_AUDIT_ROWS = 10_000
#: What an audit row's action is: words such as `policy.updated`.
AuditAction = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.-]*$")]
#: What an audit row records besides who, what and when: bounded JSON.
AuditDetails = Annotated[
    dict[Key, Any], Field(max_length=64), AfterValidator(json_bounds(max_depth=4, max_nodes=5000, max_string=2000))
]
#: The reason given with a skipped requeue.
Why = Annotated[str, StringConstraints(max_length=2000)]


class RemoveCluster(Message):
    """RPC `clusters.remove`: take a cluster out of vmsched (administrators only). policy-admin
    records it in the audit log and publishes ClusterRemoved; the state tracker deletes the
    cluster's state and pending resources. Its policy link in PostgreSQL stays."""

    cluster_id: Id = Field(description="The cluster to remove.")
    reason: Text = Field("", description="Why, for people (kept in the audit log and with the event).")


class RemoveHosts(Message):
    """RPC `hosts.remove`: take hosts out of a cluster for good (administrators only). policy-admin
    records it in the audit log and publishes HostRemoved; a host that reports again is back."""

    cluster_id: Id = Field(description="The hosts' cluster.")
    host_ids: list[Id] = Field(
        min_length=1, max_length=MAX_REMOVED_HOSTS, description="The hosts to remove (ids; unknown ones are ignored)."
    )
    reason: Text = Field("", description="Why, for people (kept in the audit log and with the event).")


class Removal(Message):
    """The reply to `clusters.remove` and `hosts.remove`: the event was published (the state tracker
    applies it in order with the reports; `state` shows when it has)."""

    cluster_id: Id = Field(description="The cluster.")
    host_ids: list[Id] = Field(
        default_factory=list, max_length=MAX_REMOVED_HOSTS, description="The hosts removed; empty: the whole cluster."
    )
    removed_at: datetime = Field(description="When it was published: ISO 8601 date-time with a UTC offset.")
    audit_id: Int = Field(ge=1, le=MAX_INT, description="The id of its audit log row.")


class RequeueDeadLetters(Message):
    """RPC `dead-letters.requeue`: publish dead letters again where they were first published, and
    take them out of the dead-letter queue (administrators only). Only those whose destination is
    known and whose body is whole are sent; the others stay, with why."""

    ids: list[Id] | None = Field(
        None, min_length=1, max_length=MAX_REQUEUE_IDS, description="The dead letters' ids; null: every one."
    )


class RequeueReport(Message):
    """The reply to `dead-letters.requeue`."""

    requeued: list[Id] = Field(max_length=1_000_000, description="The ids sent again (and gone from the queue).")
    skipped: dict[Id, Why] = Field(
        default_factory=dict, max_length=1_000_000, description="Ids left in the queue -> why they were not sent."
    )
    not_found: list[Id] = Field(
        default_factory=list, max_length=MAX_REQUEUE_IDS, description="Ids asked for that the queue does not hold."
    )


class AuditQuery(Message):
    """RPC `audit.read`: the newest audit log rows, optionally only one actor's or one action's."""

    limit: Int = Field(50, ge=1, le=MAX_AUDIT_ROWS, description="How many rows at most (count).")
    actor: Actor | None = Field(None, description="Only this AMQP user's actions; null: everyone's.")
    action: AuditAction | None = Field(None, description="Only this action (e.g. policy.updated); null: every one.")
    since: datetime | None = Field(
        None, description="Only rows at or after this: ISO 8601 date-time with a UTC offset; null: any time."
    )


class AuditEntry(Message):
    """One audit log row: who did what to what, when."""

    id: Int = Field(ge=1, le=MAX_INT, description="The row's id; ids grow with time.")
    at: datetime = Field(description="When: ISO 8601 date-time with a UTC offset.")
    actor: Actor = Field(description="The AMQP user that asked for it, as the broker vouched for it.")
    action: AuditAction = Field(
        description="What was done: policy.created, cluster.removed, dead-letters.requeued, ..."
    )
    target: Key = Field(description="What it was done to: a policy's name, a cluster's id, the dead-letter queue.")
    details: AuditDetails = Field(
        default_factory=dict, description="What else was recorded (versions, ids, counts, reason)."
    )


class AuditListing(Message):
    """The reply to `audit.read`: newest first."""

    entries: list[AuditEntry] = Field(max_length=MAX_AUDIT_ROWS, description="The rows, newest first.")


__all__ = [
    "MAX_REMOVED_HOSTS",
    "MAX_REQUEUE_IDS",
    "AuditAction",
    "AuditDetails",
    "AuditEntry",
    "AuditListing",
    "AuditQuery",
    "Removal",
    "RemoveCluster",
    "RemoveHosts",
    "RequeueDeadLetters",
    "RequeueReport",
]
