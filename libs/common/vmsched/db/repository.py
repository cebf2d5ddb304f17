"""Cluster policies in PostgreSQL: the repository the services read and the admin API writes.

Policies are stored as rows (schema: migrations/0001_policies.sql) and handed out as the plain
`vmsched.scheduling.policy.Policy` objects the rest of the code works with. Built-in policies are
written by `vmsched.db.migrate` from the code on every run and are locked: update and delete refuse
them (PolicyLocked), clone copies them into an editable policy.

A cluster runs the policy of its cluster_policy row, or the default policy when it has none (or its
row names no policy), with the row's property overrides merged over the policy's properties.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID, uuid4

import asyncpg
from pydantic import BaseModel, ConfigDict, Field

from vmsched.contracts.policies import PolicyDocument
from vmsched.db.audit import AuditRecord, write_audit
from vmsched.db.catalogue import ensure_units
from vmsched.db.policy_rows import (
    default_policy_id,
    load_policies,
    load_policy,
    resolve_policy,
    set_default_policy,
    unit_names,
    write_policy,
)
from vmsched.db.pool import Connection
from vmsched.errors import (
    InvalidRequest,
    PolicyExists,
    PolicyInUse,
    PolicyLocked,
    PolicyNotFound,
    UnknownPolicyUnit,
)
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.scheduling.units.base import PolicyUnit, validate_properties
from vmsched.scheduling.units.registry import REGISTRY


class ClusterSettings(BaseModel):
    """A cluster's row in cluster_policy; a cluster without a row gets the defaults below."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster_id: str
    #: None: the cluster follows whichever policy is the default.
    policy_id: UUID | None = None
    #: Overrides merged over the policy's properties.
    properties: dict[str, str] = Field(default_factory=dict)
    ha_reservation: bool = False
    updated_at: datetime | None = None


class StoredVersion(NamedTuple):
    """One stored version of a policy (policy_version row)."""

    version: int
    stored_at: datetime
    document: PolicyDocument
    #: The AMQP user that stored it; None: not recorded (built-ins, versions older than 0006_audit).
    author: str | None


# ---------------------------------------------------------------------------------- repository
class PolicyRepository:
    """Policies and per-cluster policy settings, on an asyncpg pool made by `connect`."""

    def __init__(self, pool: asyncpg.Pool, registry: Mapping[str, PolicyUnit] = REGISTRY) -> None:
        self._pool = pool
        self._registry = registry

    # ---------------------------------------------------------------------------------- reading
    async def get(self, policy_id_or_name: UUID | str) -> Policy:
        async with self._pool.acquire() as conn:
            row = await resolve_policy(conn, policy_id_or_name)
            return await self._load_existing(conn, row["id"])

    async def list(self) -> builtins.list[Policy]:
        """Every policy, by name."""
        async with self._pool.acquire() as conn:
            return await load_policies(conn)

    async def get_default(self) -> Policy:
        async with self._pool.acquire() as conn:
            return await self._load_existing(conn, await default_policy_id(conn))

    async def get_for_cluster(self, cluster_id: str) -> Policy:
        """The policy the cluster runs, with the cluster's property overrides merged in.

        The cluster's HA reservation switch travels as the property HaReservation=true, so the units
        that depend on it (the HA reservation weight and balance) see it like any other property.
        """
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            row = await conn.fetchrow(
                "SELECT policy_id, properties, ha_reservation FROM cluster_policy WHERE cluster_id = $1", cluster_id
            )
            policy_id = row["policy_id"] if row is not None else None
            if policy_id is None:
                policy_id = await default_policy_id(conn)
            policy = await self._load_existing(conn, policy_id)
        overrides: dict[str, str] = dict(row["properties"]) if row is not None else {}
        if row is not None and row["ha_reservation"]:
            overrides[HA_RESERVATION_PROPERTY] = "true"
        if not overrides:
            return policy
        return policy.model_copy(update={"properties": {**policy.properties, **overrides}})

    async def get_cluster_settings(self, cluster_id: str) -> ClusterSettings:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                """SELECT cluster_id, policy_id, properties, ha_reservation, updated_at
                   FROM cluster_policy WHERE cluster_id = $1""",
                cluster_id,
            )
        if row is None:
            return ClusterSettings(cluster_id=cluster_id)
        return ClusterSettings(**dict(row))

    # ---------------------------------------------------------------------------------- writing
    async def create(self, policy: Policy) -> Policy:
        """Store a new policy after checking its units and properties against the registry.

        Raises UnknownPolicyUnit, InvalidProperty (naming property, value and regex), PolicyExists
        for a taken name or id, InvalidRequest for a locked or default policy (only built-ins are
        locked; the default is chosen with set_default).
        """
        async with self._pool.acquire() as conn, conn.transaction():
            return await self._create(conn, policy)

    async def _create(self, conn: Connection, policy: Policy, author: str | None = None) -> Policy:
        self._validate(policy)
        if policy.locked:
            raise InvalidRequest("only built-in policies are locked", location="locked")
        if policy.is_default:
            raise InvalidRequest("create the policy, then make it the default", location="is_default")
        if await conn.fetchval("SELECT 1 FROM policy WHERE id = $1", policy.id):
            raise PolicyExists(f"a policy with id {policy.id} exists", location="id")
        await ensure_units(conn, policy, self._registry)
        await write_policy(conn, policy, author=author)
        return await self._load_existing(conn, policy.id)

    async def update(self, policy: Policy) -> Policy:
        """Replace a stored policy (found by id); PolicyLocked for built-ins.

        `locked` and `is_default` must match the stored row: they are not edited this way.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            return await self._update(conn, policy)

    async def _update(self, conn: Connection, policy: Policy, author: str | None = None) -> Policy:
        self._validate(policy)
        row = await resolve_policy(conn, policy.id, for_update=True)
        if row["is_locked"]:
            raise PolicyLocked(f"policy {policy.name!r} is locked; clone it to edit", location="policy")
        if policy.locked:
            raise InvalidRequest("only built-in policies are locked", location="locked")
        if policy.is_default != row["is_default"]:
            raise InvalidRequest("the default policy is chosen with set_default", location="is_default")
        await ensure_units(conn, policy, self._registry)
        await write_policy(conn, policy, author=author)
        return await self._load_existing(conn, policy.id)

    async def delete(self, policy_id: UUID | str, *, audit: Sequence[AuditRecord] = ()) -> None:
        """Delete a policy; PolicyLocked for built-ins, PolicyInUse while clusters use it or it is
        the default. `audit` rows are stored with the deletion (in its transaction)."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await resolve_policy(conn, policy_id, for_update=True)
            if row["is_locked"]:
                raise PolicyLocked(f"policy {policy_id!s} is locked and cannot be deleted", location="policy")
            if row["is_default"]:
                raise PolicyInUse(f"policy {policy_id!s} is the default policy", location="policy")
            clusters = await conn.fetch(
                "SELECT cluster_id FROM cluster_policy WHERE policy_id = $1 ORDER BY cluster_id", row["id"]
            )
            if clusters:
                names = ", ".join(c["cluster_id"] for c in clusters)
                raise PolicyInUse(f"policy {policy_id!s} is used by clusters {names}", location="policy")
            await conn.execute("DELETE FROM policy WHERE id = $1", row["id"])
            await write_audit(conn, audit)

    async def clone(
        self,
        source: UUID | str,
        new_name: str,
        *,
        description: str | None = None,
        author: str | None = None,
        audit: Callable[[Policy], Sequence[AuditRecord]] | None = None,
    ) -> Policy:
        """An unlocked, non-default copy of a stored policy (built-ins included) under a new name,
        its first version by `author`; the rows `audit` makes of the copy are stored with it."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await resolve_policy(conn, source)
            original = await self._load_existing(conn, row["id"])
            copy = Policy.model_validate(
                {
                    **original.model_dump(),
                    "id": uuid4(),
                    "name": new_name,
                    "description": original.description if description is None else description,
                    "locked": False,
                    "is_default": False,
                }
            )
            # No registry check: the source's units are already stored, and a clone must be possible
            # even while the running code lacks one of them.
            await write_policy(conn, copy, author=author)
            stored = await self._load_existing(conn, copy.id)
            if audit is not None:
                await write_audit(conn, audit(stored))
            return stored

    async def set_default(self, policy_id: UUID | str) -> Policy:
        """Make a policy (locked or not) the one clusters without their own choice run."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await resolve_policy(conn, policy_id, for_update=True)
            await set_default_policy(conn, row["id"])
            return await self._load_existing(conn, row["id"])

    async def set_cluster_policy(
        self,
        cluster_id: str,
        policy_id: UUID | str | None,
        properties: Mapping[str, str] | None = None,
        ha_reservation: bool | None = None,
    ) -> ClusterSettings:
        """Attach a policy to a cluster (None: follow the default policy).

        `properties` replaces the cluster's overrides; None keeps the current ones (none for a new
        row). `ha_reservation` None likewise keeps the current value (False for a new row). The
        merged properties are checked against the regexes of the policy's units that the registry
        holds; InvalidProperty names property, value and regex.
        """
        if not cluster_id:
            raise InvalidRequest("empty cluster id", location="cluster_id")
        if properties is not None:
            bad = [k for k, v in properties.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad:
                raise InvalidRequest(f"property values must be strings: {bad}", location="properties")
        async with self._pool.acquire() as conn, conn.transaction():
            return await self._set_cluster_policy(conn, cluster_id, policy_id, properties, ha_reservation)

    async def apply(
        self,
        policies: Sequence[Policy],
        clusters: Sequence[tuple[str, str, Mapping[str, str], bool]],
        *,
        author: str | None = None,
        audit: Callable[[builtins.list[Policy]], Sequence[AuditRecord]] | None = None,
    ) -> builtins.list[Policy]:
        """Store `policies` (created when their id is new, else updated; new versions by `author`)
        and attach clusters (cluster id, policy name, property overrides, HA reservation), with the
        rows `audit` makes of the stored policies, all in one transaction: either everything is
        stored or, on the first refusal, nothing is. The stored policies, in order."""
        async with self._pool.acquire() as conn, conn.transaction():
            stored = []
            for policy in policies:
                exists = await conn.fetchval("SELECT 1 FROM policy WHERE id = $1", policy.id)
                write = self._update if exists else self._create
                stored.append(await write(conn, policy, author))
            for cluster_id, name, properties, ha_reservation in clusters:
                await self._set_cluster_policy(conn, cluster_id, name, properties, ha_reservation)
            if audit is not None:
                await write_audit(conn, audit(stored))
            return stored

    async def _set_cluster_policy(
        self,
        conn: Connection,
        cluster_id: str,
        policy_id: UUID | str | None,
        properties: Mapping[str, str] | None,
        ha_reservation: bool | None,
    ) -> ClusterSettings:
        current = await conn.fetchrow(
            "SELECT properties FROM cluster_policy WHERE cluster_id = $1 FOR UPDATE", cluster_id
        )
        chosen: UUID | None = None
        if policy_id is not None:
            chosen = UUID(str((await resolve_policy(conn, policy_id))["id"]))
        policy = await self._load_existing(conn, chosen or await default_policy_id(conn))
        overrides = dict(properties) if properties is not None else {}
        if properties is None and current is not None:
            overrides = dict(current["properties"])
        self._validate_properties(policy, {**policy.properties, **overrides})
        row = await conn.fetchrow(
            """INSERT INTO cluster_policy (cluster_id, policy_id, properties, ha_reservation)
               VALUES ($1, $2, $3, COALESCE($4, false))
               ON CONFLICT (cluster_id) DO UPDATE SET policy_id = EXCLUDED.policy_id,
                   properties = EXCLUDED.properties,
                   ha_reservation = COALESCE($4, cluster_policy.ha_reservation),
                   updated_at = now()
               RETURNING cluster_id, policy_id, properties, ha_reservation, updated_at""",
            cluster_id,
            chosen,
            overrides,
            ha_reservation,
        )
        return ClusterSettings(**dict(row))

    async def clear_cluster(self, cluster_id: str, *, audit: Sequence[AuditRecord] = ()) -> bool:
        """Forget a cluster's settings (it then runs the default policy); True if it had a row.
        `audit` rows are stored with the change (in its transaction), and only if there was one."""
        async with self._pool.acquire() as conn, conn.transaction():
            status: str = await conn.execute("DELETE FROM cluster_policy WHERE cluster_id = $1", cluster_id)
            had = status != "DELETE 0"
            if had:
                await write_audit(conn, audit)
        return had

    async def history(self, policy_id_or_name: UUID | str) -> builtins.list[StoredVersion]:
        """The stored versions of a policy, newest first."""
        async with self._pool.acquire() as conn:
            row = await resolve_policy(conn, policy_id_or_name)
            rows = await conn.fetch(
                """SELECT version, stored_at, document, author FROM policy_version WHERE policy_id = $1
                   ORDER BY version DESC""",
                row["id"],
            )
        return [
            StoredVersion(r["version"], r["stored_at"], PolicyDocument.model_validate(r["document"]), r["author"])
            for r in rows
        ]

    async def clusters(self) -> builtins.list[tuple[ClusterSettings, str]]:
        """Every cluster with settings of its own, by id, with the name of the policy it runs."""
        async with self._pool.acquire() as conn:
            default = await default_policy_id(conn)
            rows = await conn.fetch(
                """SELECT c.cluster_id, c.policy_id, c.properties, c.ha_reservation, c.updated_at,
                          p.name AS policy_name
                   FROM cluster_policy c JOIN policy p ON p.id = COALESCE(c.policy_id, $1)
                   ORDER BY c.cluster_id""",
                default,
            )
        return [(ClusterSettings(**{k: r[k] for k in ClusterSettings.model_fields}), r["policy_name"]) for r in rows]

    # ---------------------------------------------------------------------------------- helpers
    async def _load_existing(self, conn: Connection, policy_id: UUID) -> Policy:
        policy = await load_policy(conn, policy_id)
        if policy is None:
            raise PolicyNotFound(f"no policy {policy_id}", location="policy")
        return policy

    def _validate(self, policy: Policy) -> None:
        for kind, names in (
            ("filter", [f.unit for f in policy.filters]),
            ("weight", [w.unit for w in policy.weights]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise InvalidRequest(f"policy {policy.name}: {kind} units listed twice: {dupes}")
        policy.validate_against(self._registry)
        if policy.balance is not None:
            unit = self._registry.get(policy.balance)
            if unit is None:
                raise UnknownPolicyUnit(
                    f"policy {policy.name}: unknown balance unit {policy.balance!r}", location="balance"
                )
            validate_properties(unit, policy.properties)

    def _validate_properties(self, policy: Policy, properties: Mapping[str, str]) -> None:
        # Units missing from the registry were checked when the policy was stored; skip them here.
        for name in unit_names(policy):
            unit = self._registry.get(name)
            if unit is not None:
                validate_properties(unit, properties)


__all__ = ["ClusterSettings", "PolicyRepository", "StoredVersion"]
