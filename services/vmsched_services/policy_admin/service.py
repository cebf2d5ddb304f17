"""policy-admin: the only writer of policies (RPCs `policy.*` and `units.list`).

Every change is validated whole before anything is stored (vmsched.scheduling.policy_docs: unknown
units with a suggestion, properties no unit reads, values a unit refuses, in words), stored as a new
version of the policy, and announced with `policy.changed`, so every selector and balancer drops its
cached copy. Built-in policies stay locked: they can be cloned, not edited.

Every write (apply without dry run, clone, delete, detach, rollback) is an administrator's
(vmsched_services.authz: the sender the broker vouches for is named in VMSCHED_ADMIN_USERS): the new
versions name their author, and each change leaves an audit_log row stored in the same transaction.
Reads are anyone's who reaches the queues. The other administration this service serves (removals,
requeueing dead letters, the audit log) is in `operations`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from uuid import uuid4

from vmsched import constants as c
from vmsched.contracts import (
    ApplyPolicies,
    ApplyReport,
    Change,
    ChangeAction,
    ClonePolicy,
    ClusterAttachment,
    DetachCluster,
    Message,
    PolicyChanged,
    PolicyDocument,
    PolicyHistory,
    PolicyListing,
    PolicyQuery,
    PolicyRef,
    PolicySet,
    PolicyVersion,
    RollbackPolicy,
    StoredPolicy,
    UnitInfo,
    UnitListing,
    UnitProperty,
    UnitQuery,
)
from vmsched.db import audit
from vmsched.db.audit import AuditRecord
from vmsched.db.pool import unavailable
from vmsched.db.repository import PolicyRepository
from vmsched.errors import InvalidPolicy, PolicyNotFound
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.policy_docs import (
    attachment_diff,
    diff,
    document_of,
    policy_of,
    policy_units,
    problems,
    property_problems,
)
from vmsched.scheduling.units import REGISTRY
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.store.catalogues import Announcement, UnitCatalogues
from vmsched_services.authz import POLICY_CHANGES, require_admin
from vmsched_services.policy_admin import operations
from vmsched_services.policy_admin.availability import routed_check, running_instances, strict_available

log = get_logger("vmsched.policy_admin")

#: Lines of a change's diff kept in its audit row (the count is kept whole).
AUDIT_DIFF_LINES = 200


def _stored(policy: Policy, clusters: Sequence[str]) -> StoredPolicy:
    return StoredPolicy(
        document=document_of(policy),
        id=str(policy.id),
        version=policy.version,
        locked=policy.locked,
        default=policy.is_default,
        clusters=list(clusters),
    )


def _refuse(found: Sequence[str]) -> InvalidPolicy:
    listed = "\n".join(f"  - {p}" for p in found)
    return InvalidPolicy(f"nothing was stored; {len(found)} problem(s):\n{listed}", location="policies")


def _attachment_change(had: ClusterAttachment | None, want: ClusterAttachment) -> Change:
    if had == want:
        return Change(kind="cluster", name=want.cluster_id, action=ChangeAction.UNCHANGED)
    return Change(kind="cluster", name=want.cluster_id, action=ChangeAction.ATTACH, diff=attachment_diff(had, want))


def _audit_records(
    actor: str,
    changes: Mapping[str, Change],
    attaching: Sequence[ClusterAttachment],
    rolled_back_from: int | None,
    saved: Sequence[Policy],
) -> list[AuditRecord]:
    """The audit rows of an apply: one per stored policy (its change's diff, cut at
    AUDIT_DIFF_LINES), one per attached cluster."""
    rows = []
    for p in saved:
        change = changes[p.name]
        details: dict[str, Any] = {
            "version": p.version,
            "diff": list(change.diff[:AUDIT_DIFF_LINES]),
            "diff_lines": len(change.diff),
        }
        if rolled_back_from is not None:
            action, details["to"] = audit.POLICY_ROLLED_BACK, rolled_back_from
        else:
            action = audit.POLICY_CREATED if change.action is ChangeAction.CREATE else audit.POLICY_UPDATED
        rows.append(AuditRecord(actor, action, p.name, details))
    for a in attaching:
        attached = {"policy": a.policy, "properties": dict(a.properties), "ha_reservation": a.ha_reservation}
        rows.append(AuditRecord(actor, audit.CLUSTER_ATTACHED, a.cluster_id, attached))
    return rows


class PolicyAdmin:
    def __init__(self, rt: Runtime, registry: Mapping[str, PolicyUnit] = REGISTRY) -> None:
        self.rt = rt
        rt.uses_postgres = True  # /readyz checks PostgreSQL in this process
        self.registry = registry

    async def _repo(self) -> PolicyRepository:
        return PolicyRepository(await self.rt.postgres(), self.registry)

    async def _announce(self, event: PolicyChanged) -> None:
        await self.rt.bus.publish(c.POLICY_CHANGED, event)

    # ------------------------------------------------------------------------------ reading
    async def read(self, query: PolicyQuery) -> PolicyListing:
        repo = await self._repo()
        policies = await repo.list()
        if query.names is not None:
            known = {p.name for p in policies}
            missing = [n for n in query.names if n not in known]
            if missing:
                raise PolicyNotFound(f"no policy {', '.join(map(repr, missing))}", location="names")
            policies = [p for p in policies if p.name in set(query.names)]
        attachments = await self._attachments(repo)
        by_policy: dict[str, list[str]] = {}
        for a in attachments:
            by_policy.setdefault(a.policy, []).append(a.cluster_id)
        stored = [_stored(p, by_policy.get(p.name, [])) for p in policies]
        shown = {p.name for p in policies}
        return PolicyListing(policies=stored, clusters=[a for a in attachments if a.policy in shown])

    async def _attachments(self, repo: PolicyRepository) -> list[ClusterAttachment]:
        return [
            ClusterAttachment(
                cluster_id=settings.cluster_id,
                policy=name,
                properties=dict(settings.properties),
                ha_reservation=settings.ha_reservation,
            )
            for settings, name in await repo.clusters()
        ]

    async def history(self, ref: PolicyRef) -> PolicyHistory:
        versions = await (await self._repo()).history(ref.name)
        return PolicyHistory(
            name=ref.name,
            versions=[
                PolicyVersion(version=v.version, stored_at=v.stored_at, document=v.document, author=v.author)
                for v in versions
            ],
        )

    async def units(self, _: UnitQuery) -> UnitListing:
        catalogues = UnitCatalogues(self.rt.redis, self.rt.settings)
        instances = await catalogues.instances()
        available: dict[str, frozenset[str]] = {}
        for a in instances:
            available[a.service] = available.get(a.service, frozenset(a.units)) & frozenset(a.units)
        return UnitListing(
            running={service: sorted(names) for service, names in sorted(available.items())},
            instances=running_instances(instances),
            units=[
                UnitInfo(
                    name=u.name,
                    origin=u.origin,
                    description=u.description[:2000],
                    filter=u.filter is not None,
                    weight=u.weight is not None,
                    balance=u.balance is not None,
                    properties=[
                        UnitProperty(name=n, regex=s.regex, default=s.default, description=s.description)
                        for n, s in u.properties.items()
                    ],
                )
                for u in sorted(self.registry.values(), key=lambda u: u.name)
            ],
        )

    # ------------------------------------------------------------------------------ writing
    async def apply(self, req: ApplyPolicies) -> ApplyReport:
        # A dry run stores nothing: anyone who reaches the queue may ask what a change would do.
        actor = None if req.dry_run else require_admin(self.rt.settings, POLICY_CHANGES)
        return await self._apply(req, actor)

    async def _apply(self, req: ApplyPolicies, actor: str | None, rolled_back_from: int | None = None) -> ApplyReport:
        repo = await self._repo()
        stored = {p.name: p for p in await repo.list()}
        attached = {a.cluster_id: a for a in await self._attachments(repo)}
        # What the running filter-workers, weighers and balancers can run (each announces its
        # catalogue): a policy no running instance could run is refused here, one some lack units of
        # is stored with a warning (its calls go to those that have them: vmsched.lifecycle.routes).
        instances = await UnitCatalogues(self.rt.redis, self.rt.settings).instances()
        found, warnings = self._check(req.desired, stored, instances)
        if found:
            raise _refuse(found)
        if warnings:
            log.warning("policies use units some running instances lack", warnings=warnings)
        changes: list[Change] = []
        writes: list[Policy] = []
        for doc in req.desired.policies:
            current = stored.get(doc.name)
            before = document_of(current) if current is not None else None
            if before == doc:
                changes.append(Change(kind="policy", name=doc.name, action=ChangeAction.UNCHANGED))
                continue
            action = ChangeAction.CREATE if current is None else ChangeAction.UPDATE
            changes.append(Change(kind="policy", name=doc.name, action=action, diff=diff(before, doc)))
            if current is None:
                writes.append(policy_of(doc, uuid4()))
            else:
                writes.append(policy_of(doc, current.id).model_copy(update={"is_default": current.is_default}))
        attaching = [want for want in req.desired.clusters if attached.get(want.cluster_id) != want]
        changes += [_attachment_change(attached.get(want.cluster_id), want) for want in req.desired.clusters]
        if actor is None or not (writes or attaching):
            return ApplyReport(dry_run=req.dry_run, changes=changes, warnings=warnings)
        by_name = {ch.name: ch for ch in changes if ch.kind == "policy"}
        records = functools.partial(_audit_records, actor, by_name, attaching, rolled_back_from)
        # One transaction: the whole set is stored with its audit rows, or (on a refusal the checks
        # above could not foresee, such as a concurrent edit) nothing of it is.
        attach_rows = [(a.cluster_id, a.policy, a.properties, a.ha_reservation) for a in attaching]
        saved = await repo.apply(writes, attach_rows, author=actor, audit=records)
        versions = {p.name: p.version for p in saved}
        changes = [
            ch.model_copy(update={"version": versions.get(ch.name)}) if ch.kind == "policy" else ch for ch in changes
        ]
        for policy in saved:
            await self._announce(PolicyChanged(policy_id=policy.id))
        for a in attaching:
            await self._announce(PolicyChanged(cluster_id=a.cluster_id))
        log.info("policies applied", actor=actor, changes=[(ch.kind, ch.name, ch.action.value) for ch in changes])
        return ApplyReport(dry_run=False, changes=changes, warnings=warnings)

    def _check(
        self, desired: PolicySet, stored: Mapping[str, Policy], instances: Sequence[Announcement]
    ) -> tuple[list[str], list[str]]:
        """Every problem of the whole set, each naming its policy or cluster; and the warnings."""
        found: list[str] = []
        warnings: list[str] = []
        available = strict_available(instances)
        names = [d.name for d in desired.policies]
        for name in sorted({n for n in names if names.count(n) > 1}):
            found.append(f"policy {name}: listed twice")
        documents = {d.name: d for d in desired.policies}
        for doc in desired.policies:
            current = stored.get(doc.name)
            if current is not None and current.locked and document_of(current) != doc:
                found.append(
                    f"policy {doc.name}: built in and locked; clone it and edit the clone "
                    f"(vmsched policy clone {doc.name} my-{doc.name})"
                )
                continue
            found += [f"policy {doc.name}: {p}" for p in problems(doc, self.registry, available=available)]
            unrunnable, lacked = routed_check(doc, self.registry, instances)
            found += [f"policy {doc.name}: {p}" for p in unrunnable]
            warnings += lacked
        clusters = [a.cluster_id for a in desired.clusters]
        for cluster in sorted({x for x in clusters if clusters.count(x) > 1}):
            found.append(f"cluster {cluster}: listed twice")
        for want in desired.clusters:
            policy: Policy | PolicyDocument | None = documents.get(want.policy) or stored.get(want.policy)
            if policy is None:
                known = sorted({*stored, *documents})
                found.append(f"cluster {want.cluster_id}: no policy {want.policy!r} (known: {', '.join(known)})")
                continue
            units = policy_units(policy, self.registry)
            found += [f"cluster {want.cluster_id}: {p}" for p in property_problems(want.properties, units)]
        return found, warnings

    async def clone(self, req: ClonePolicy) -> StoredPolicy:
        actor = require_admin(self.rt.settings, POLICY_CHANGES)
        repo = await self._repo()

        def records(copy: Policy) -> list[AuditRecord]:
            return [AuditRecord(actor, audit.POLICY_CLONED, copy.name, {"source": req.source, "version": copy.version})]

        copy = await repo.clone(req.source, req.name, description=req.description, author=actor, audit=records)
        await self._announce(PolicyChanged(policy_id=copy.id))
        return _stored(copy, [])

    async def delete(self, ref: PolicyRef) -> ApplyReport:
        actor = require_admin(self.rt.settings, POLICY_CHANGES)
        repo = await self._repo()
        policy = await repo.get(ref.name)
        details = {"id": str(policy.id), "version": policy.version}
        await repo.delete(policy.id, audit=[AuditRecord(actor, audit.POLICY_DELETED, ref.name, details)])
        await self._announce(PolicyChanged(policy_id=policy.id))
        return ApplyReport(dry_run=False, changes=[Change(kind="policy", name=ref.name, action=ChangeAction.DELETE)])

    async def detach(self, req: DetachCluster) -> ApplyReport:
        actor = require_admin(self.rt.settings, POLICY_CHANGES)
        repo = await self._repo()
        had = await repo.clear_cluster(
            req.cluster_id, audit=[AuditRecord(actor, audit.CLUSTER_DETACHED, req.cluster_id)]
        )
        action = ChangeAction.DETACH if had else ChangeAction.UNCHANGED
        if had:
            await self._announce(PolicyChanged(cluster_id=req.cluster_id))
        return ApplyReport(dry_run=False, changes=[Change(kind="cluster", name=req.cluster_id, action=action)])

    async def rollback(self, req: RollbackPolicy) -> ApplyReport:
        actor = require_admin(self.rt.settings, POLICY_CHANGES)
        repo = await self._repo()
        versions = await repo.history(req.name)
        current = versions[0].version if versions else 0
        target = req.version if req.version is not None else current - 1
        chosen = next((v.document for v in versions if v.version == target), None)
        if chosen is None:
            have = ", ".join(str(v.version) for v in versions) or "none"
            raise PolicyNotFound(
                f"policy {req.name} has no version {target} (stored versions: {have})", location="version"
            )
        return await self._apply(ApplyPolicies(desired=PolicySet(policies=[chosen])), actor, rolled_back_from=target)


Handler = Callable[[Any], Awaitable[Message]]


def naming_postgres(handler: Handler) -> Handler:
    """`handler`, whose PostgreSQL failures (a refused connection, a pool or query timeout, the
    driver's connection errors) are raised as PolicyStoreUnavailable: the dispatcher tries the request
    again and then answers `policy_store_unavailable`, which says PostgreSQL is away and what to do,
    instead of `internal`. A change interrupted by the outage stored nothing (one transaction)."""

    async def handle(request: Any) -> Message:
        try:
            return await handler(request)
        except Exception as exc:
            away = unavailable(exc, io=True)
            if away is None:
                raise
            raise away from exc

    return handle


async def start(rt: Runtime) -> PolicyAdmin:
    admin = PolicyAdmin(rt)
    routes: list[tuple[str, type[Message], Handler]] = [
        (c.RPC_POLICY_READ, PolicyQuery, naming_postgres(admin.read)),
        (c.RPC_POLICY_APPLY, ApplyPolicies, naming_postgres(admin.apply)),
        (c.RPC_POLICY_CLONE, ClonePolicy, naming_postgres(admin.clone)),
        (c.RPC_POLICY_DELETE, PolicyRef, naming_postgres(admin.delete)),
        (c.RPC_POLICY_DETACH, DetachCluster, naming_postgres(admin.detach)),
        (c.RPC_POLICY_HISTORY, PolicyRef, naming_postgres(admin.history)),
        (c.RPC_POLICY_ROLLBACK, RollbackPolicy, naming_postgres(admin.rollback)),
        (c.RPC_UNITS_LIST, UnitQuery, admin.units),  # read from Redis, not PostgreSQL
        *((route, request, naming_postgres(handler)) for route, request, handler in operations.routes(rt)),
    ]
    for route, request, handler in routes:
        await rt.bus.serve(route, request, handler)
    return admin
