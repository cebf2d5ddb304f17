"""The administrator's side of vmsched: policies, removals, dead letters and the audit log over the
bus, through the policy-admin service.

async with PolicyClient(Settings()) as admin:
    report = await admin.apply(PolicySet(policies=[...], clusters=[...]), dry_run=True)
    for change in report.changes:
        print(change.action, change.name, change.diff)

Refusals arrive as vmsched.errors.RemoteError with the service's code (`invalid_policy` lists every
problem of the request, `policy_locked`, `policy_in_use`, `policy_not_found`, ...). Every write
needs an administrator: a client whose AMQP user is not named in VMSCHED_ADMIN_USERS is refused
with `not_authorized`. Removing clusters and hosts is also on SchedulerClient.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from vmsched import constants as c
from vmsched.client import BusClient
from vmsched.contracts import (
    ApplyPolicies,
    ApplyReport,
    AuditListing,
    AuditQuery,
    ClonePolicy,
    DetachCluster,
    PolicyHistory,
    PolicyListing,
    PolicyQuery,
    PolicyRef,
    PolicySet,
    RequeueDeadLetters,
    RequeueReport,
    RollbackPolicy,
    StoredPolicy,
    UnitListing,
    UnitQuery,
)


class PolicyClient(BusClient):
    label = "policy-client"

    async def read(self, names: list[str] | None = None) -> PolicyListing:
        """The stored policies (all, or these) and the clusters attached to them."""
        return await self.bus.call(c.RPC_POLICY_READ, PolicyQuery(names=names), PolicyListing)

    async def apply(self, desired: PolicySet, *, dry_run: bool = False) -> ApplyReport:
        """Make the stored policies and attachments match `desired`; with `dry_run`, only say how."""
        return await self.bus.call(c.RPC_POLICY_APPLY, ApplyPolicies(desired=desired, dry_run=dry_run), ApplyReport)

    async def clone(self, source: str, name: str, *, description: str | None = None) -> StoredPolicy:
        request = ClonePolicy(source=source, name=name, description=description)
        return await self.bus.call(c.RPC_POLICY_CLONE, request, StoredPolicy)

    async def delete(self, name: str) -> ApplyReport:
        return await self.bus.call(c.RPC_POLICY_DELETE, PolicyRef(name=name), ApplyReport)

    async def detach(self, cluster_id: str) -> ApplyReport:
        return await self.bus.call(c.RPC_POLICY_DETACH, DetachCluster(cluster_id=cluster_id), ApplyReport)

    async def history(self, name: str) -> PolicyHistory:
        return await self.bus.call(c.RPC_POLICY_HISTORY, PolicyRef(name=name), PolicyHistory)

    async def rollback(self, name: str, version: int | None = None) -> ApplyReport:
        request = RollbackPolicy(name=name, version=version)
        return await self.bus.call(c.RPC_POLICY_ROLLBACK, request, ApplyReport)

    async def units(self) -> UnitListing:
        return await self.bus.call(c.RPC_UNITS_LIST, UnitQuery(), UnitListing)

    async def requeue_dead_letters(self, ids: Sequence[str] | None = None) -> RequeueReport:
        """Send dead letters (these ids; None: every one) again where they were first published."""
        request = RequeueDeadLetters(ids=list(ids) if ids is not None else None)
        return await self.bus.call(c.RPC_DEAD_LETTERS_REQUEUE, request, RequeueReport)

    async def audit(
        self, *, limit: int = 50, actor: str | None = None, action: str | None = None, since: datetime | None = None
    ) -> AuditListing:
        """The newest audit log rows (of `actor`, of `action`, since `since`), newest first."""
        query = AuditQuery(limit=limit, actor=actor, action=action, since=since)
        return await self.bus.call(c.RPC_AUDIT, query, AuditListing)


__all__ = ["PolicyClient"]
