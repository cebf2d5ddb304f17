"""The audit log (table audit_log, migrations/0006_audit.sql): who did which administrative write or
destructive action, to what, when.

Policy writes add their rows with `write_audit` on the connection of the transaction that stores
the change, so a change and its row are stored together or not at all (PolicyRepository takes them
as `audit`). Actions outside PostgreSQL (a removal published on the bus, dead letters requeued) add
theirs with `AuditLog.add`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import asyncpg

from vmsched.db.pool import Connection

#: The actions the log records (audit_log.action).
POLICY_CREATED: Final = "policy.created"
POLICY_UPDATED: Final = "policy.updated"
POLICY_CLONED: Final = "policy.cloned"
POLICY_DELETED: Final = "policy.deleted"
POLICY_ROLLED_BACK: Final = "policy.rolled-back"
CLUSTER_ATTACHED: Final = "cluster.attached"
CLUSTER_DETACHED: Final = "cluster.detached"
CLUSTER_REMOVED: Final = "cluster.removed"
HOSTS_REMOVED: Final = "hosts.removed"
DEAD_LETTERS_REQUEUED: Final = "dead-letters.requeued"
ACTIONS: Final = (
    POLICY_CREATED,
    POLICY_UPDATED,
    POLICY_CLONED,
    POLICY_DELETED,
    POLICY_ROLLED_BACK,
    CLUSTER_ATTACHED,
    CLUSTER_DETACHED,
    CLUSTER_REMOVED,
    HOSTS_REMOVED,
    DEAD_LETTERS_REQUEUED,
)


@dataclass(frozen=True)
class AuditRecord:
    """One row to add: who (the AMQP user), what (one of ACTIONS), to what, and any details (JSON)."""

    actor: str
    action: str
    target: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRow:
    """A stored row."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str
    details: Mapping[str, Any]


async def write_audit(conn: Connection, records: Sequence[AuditRecord]) -> list[int]:
    """Add `records` on `conn` (inside the caller's transaction, if any); their ids, in order."""
    ids: list[int] = []
    for r in records:
        ids.append(
            await conn.fetchval(
                "INSERT INTO audit_log (actor, action, target, details) VALUES ($1, $2, $3, $4) RETURNING id",
                r.actor,
                r.action,
                r.target,
                dict(r.details),
            )
        )
    return ids


class AuditLog:
    """The audit log on an asyncpg pool made by `vmsched.db.connect`."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def add(self, *records: AuditRecord) -> list[int]:
        """Store `records` in one transaction; their ids."""
        async with self._pool.acquire() as conn, conn.transaction():
            return await write_audit(conn, records)

    async def read(
        self, limit: int = 50, *, actor: str | None = None, action: str | None = None, since: datetime | None = None
    ) -> list[AuditRow]:
        """The newest `limit` rows (of `actor`, of `action`, at or after `since`, when given), newest first."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                """SELECT id, at, actor, action, target, details FROM audit_log
                   WHERE ($1::text IS NULL OR actor = $1) AND ($2::text IS NULL OR action = $2)
                     AND ($3::timestamptz IS NULL OR at >= $3)
                   ORDER BY at DESC, id DESC LIMIT $4""",
                actor,
                action,
                since,
                limit,
            )
        return [
            AuditRow(
                id=r["id"], at=r["at"], actor=r["actor"], action=r["action"], target=r["target"], details=r["details"]
            )
            for r in rows
        ]


__all__ = [
    "ACTIONS",
    "CLUSTER_ATTACHED",
    "CLUSTER_DETACHED",
    "CLUSTER_REMOVED",
    "DEAD_LETTERS_REQUEUED",
    "HOSTS_REMOVED",
    "POLICY_CLONED",
    "POLICY_CREATED",
    "POLICY_DELETED",
    "POLICY_ROLLED_BACK",
    "POLICY_UPDATED",
    "AuditLog",
    "AuditRecord",
    "AuditRow",
    "write_audit",
]
