"""policy-admin's destructive administration and the audit log: RPCs `clusters.remove`,
`hosts.remove`, `dead-letters.requeue` (administrators only) and `audit.read`.

Each action is done inside the transaction that adds its audit_log row: the transaction begins
first (so a PostgreSQL that is away refuses the action before anything happens), then the action
(the removal event published, the dead letters sent again), then the row is inserted with what was
done and committed. A failed action adds no row; only a PostgreSQL lost between the action and the
commit leaves an action without its row, and that is logged with everything the row would have held.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from vmsched import constants as c
from vmsched.contracts import (
    AuditEntry,
    AuditListing,
    AuditQuery,
    ClusterRemoved,
    HostRemoved,
    Message,
    Removal,
    RemoveCluster,
    RemoveHosts,
    RequeueDeadLetters,
    RequeueReport,
)
from vmsched.db import audit
from vmsched.db.audit import AuditRecord, write_audit
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched_services.authz import REMOVING_CLUSTERS, REMOVING_HOSTS, REQUEUEING, require_admin

log = get_logger("vmsched.policy_admin")

#: Ids (hosts, dead letters) an audit row lists at most; their count is kept whole.
AUDIT_IDS = 1000
#: Characters of a skipped dead letter's reason kept in the reply and the audit row.
WHY_MAX = 500


class Recording:
    """An audit row being written: its details, which the action may add to, and its id once inserted."""

    def __init__(self, row_id: int, details: dict[str, Any]) -> None:
        self.id = row_id
        self.details = details


class Operations:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @contextlib.asynccontextmanager
    async def _recording(self, record: AuditRecord) -> AsyncIterator[Recording]:
        """The action of the block with its audit row: both, or (the block failed) neither. The row
        is only inserted (the log is append-only): with what the block added to its details, once
        the action is done, in a transaction begun before it, so a PostgreSQL that is away refuses
        the action before anything happens."""
        pool = await self.rt.postgres()
        async with pool.acquire() as conn, conn.transaction():
            rec = Recording(0, dict(record.details))
            yield rec
            try:
                done = AuditRecord(record.actor, record.action, record.target, rec.details)
                [rec.id] = await write_audit(conn, [done])
            except Exception:
                # The action is done and cannot be taken back: the log line is its only record.
                log.error("done but not audited", actor=record.actor, action=record.action, details=rec.details)
                raise

    # ------------------------------------------------------------------------------ removals
    async def remove_cluster(self, req: RemoveCluster) -> Removal:
        actor = require_admin(self.rt.settings, REMOVING_CLUSTERS)
        at = datetime.now(UTC)
        record = AuditRecord(actor, audit.CLUSTER_REMOVED, req.cluster_id, {"reason": req.reason})
        async with self._recording(record) as rec:
            event = ClusterRemoved(cluster_id=req.cluster_id, reason=req.reason, removed_at=at)
            await self.rt.bus.publish(c.cluster_removed_key(req.cluster_id), event)
        log.info("cluster removal published", actor=actor, cluster=req.cluster_id, reason=req.reason)
        return Removal(cluster_id=req.cluster_id, removed_at=at, audit_id=rec.id)

    async def remove_hosts(self, req: RemoveHosts) -> Removal:
        actor = require_admin(self.rt.settings, REMOVING_HOSTS)
        at = datetime.now(UTC)
        hosts = list(dict.fromkeys(req.host_ids))
        details = {"host_ids": hosts[:AUDIT_IDS], "count": len(hosts), "reason": req.reason}
        async with self._recording(AuditRecord(actor, audit.HOSTS_REMOVED, req.cluster_id, details)) as rec:
            event = HostRemoved(cluster_id=req.cluster_id, host_ids=hosts, reason=req.reason, removed_at=at)
            await self.rt.bus.publish(c.host_removed_key(req.cluster_id), event)
        log.info("host removal published", actor=actor, cluster=req.cluster_id, hosts=hosts[:AUDIT_IDS])
        return Removal(cluster_id=req.cluster_id, host_ids=hosts, removed_at=at, audit_id=rec.id)

    # ------------------------------------------------------------------------------ dead letters
    async def requeue(self, req: RequeueDeadLetters) -> RequeueReport:
        actor = require_admin(self.rt.settings, REQUEUEING)
        asked: Any = "all" if req.ids is None else req.ids[:AUDIT_IDS]
        record = AuditRecord(actor, audit.DEAD_LETTERS_REQUEUED, c.DEAD_LETTER_QUEUE, {"asked": asked})
        async with self._recording(record) as rec:
            done = await self.rt.bus.requeue_dead_letters(req.ids)
            skipped = {ident: why[:WHY_MAX] for ident, why in done.skipped.items()}
            not_found = [i for i in dict.fromkeys(req.ids or []) if i not in done.requeued and i not in skipped]
            rec.details.update(
                requeued=done.requeued[:AUDIT_IDS],
                requeued_count=len(done.requeued),
                skipped=dict(list(skipped.items())[:AUDIT_IDS]),
                skipped_count=len(skipped),
                not_found=not_found[:AUDIT_IDS],
            )
        log.info("dead letters requeued", actor=actor, requeued=len(done.requeued), skipped=len(skipped))
        return RequeueReport(requeued=done.requeued, skipped=skipped, not_found=not_found)

    # ------------------------------------------------------------------------------ the log
    async def read(self, query: AuditQuery) -> AuditListing:
        rows = await audit.AuditLog(await self.rt.postgres()).read(
            query.limit, actor=query.actor, action=query.action, since=query.since
        )
        return AuditListing(
            entries=[
                AuditEntry(id=r.id, at=r.at, actor=r.actor, action=r.action, target=r.target, details=dict(r.details))
                for r in rows
            ]
        )


Handler = Callable[[Any], Awaitable[Message]]


def routes(rt: Runtime) -> list[tuple[str, type[Message], Handler]]:
    """(route, request model, handler) of each RPC served here; the caller names their PostgreSQL failures."""
    ops = Operations(rt)
    return [
        (c.RPC_CLUSTERS_REMOVE, RemoveCluster, ops.remove_cluster),
        (c.RPC_HOSTS_REMOVE, RemoveHosts, ops.remove_hosts),
        (c.RPC_DEAD_LETTERS_REQUEUE, RequeueDeadLetters, ops.requeue),
        (c.RPC_AUDIT, AuditQuery, ops.read),
    ]


__all__ = ["Operations", "routes"]
