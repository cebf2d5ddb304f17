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
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlsplit
from uuid import UUID, uuid4, uuid5

import asyncpg
from asyncpg import exceptions as pg_errors
from pydantic import BaseModel, ConfigDict, Field

from vmsched.errors import (
    DatabaseMissing,
    DatabaseUnavailable,
    InvalidRequest,
    PolicyError,
    PolicyExists,
    PolicyInUse,
    PolicyLocked,
    PolicyNotFound,
    UnknownPolicyUnit,
)
from vmsched.scheduling.policy import (
    BUILTIN_POLICIES,
    DEFAULT_POLICY,
    FilterSequence,
    Policy,
    PolicyFilter,
    PolicyWeight,
)
from vmsched.scheduling.units.base import UNIT_NAMESPACE, PolicyUnit, validate_properties
from vmsched.scheduling.units.registry import REGISTRY

#: The property that carries cluster_policy.ha_reservation to the units.
HA_RESERVATION_PROPERTY = "HaReservation"

# asyncpg ships no type information: connections and records are Any to mypy.
Connection = Any
Record = Any


# ------------------------------------------------------------------------------------------ pool
async def init_connection(conn: Connection) -> None:
    """jsonb as Python objects (asyncpg passes text otherwise), uuid as the stdlib UUID class."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    # asyncpg's own UUID subclass would leak into Policy objects and their consumers.
    await conn.set_type_codec("uuid", encoder=str, decoder=UUID, schema="pg_catalog")


#: What the driver raises when it cannot get a connection at all.
_UNREACHABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _unavailable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    url = urlsplit(dsn)  # named without its credentials
    where = f"{url.hostname or 'localhost'}:{url.port or 5432}{url.path}"
    return DatabaseUnavailable(
        f"PostgreSQL at {where} is unreachable: {type(exc).__name__}: {exc}; start it (and run "
        "`vmsched db migrate` to create the database), or point VMSCHED_POSTGRES_URL at a running one"
    )


async def connect(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections speak jsonb as Python objects.

    Raises DatabaseUnavailable (saying which server and what to do) when PostgreSQL does not answer
    or refuses the connection, instead of the driver's own exception.
    """
    try:
        return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init_connection)
    except _UNREACHABLE as exc:
        raise _unavailable(dsn, exc) from exc


async def connect_one(dsn: str) -> Connection:
    """One plain connection (migrations, administration); DatabaseUnavailable as for connect(),
    DatabaseMissing when the server answers but the database does not exist."""
    try:
        conn: Connection = await asyncpg.connect(dsn)
    except pg_errors.InvalidCatalogNameError as exc:
        raise DatabaseMissing(f"{exc}; run `vmsched db migrate` to create it") from exc
    except _UNREACHABLE as exc:
        raise _unavailable(dsn, exc) from exc
    return conn


# ---------------------------------------------------------------------------------------- models
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


def unit_id(name: str) -> UUID:
    """The policy_unit row id of a unit name: the same value as PolicyUnit.id."""
    return uuid5(UNIT_NAMESPACE, name)


def _link_id(policy_id: UUID, unit: str) -> UUID:
    # Deterministic so rewriting a policy's links reproduces identical rows.
    return uuid5(policy_id, unit)


def _balance_capable(unit: PolicyUnit) -> bool:
    # PolicyUnit has no balance function yet; the built-ins name weight units as their balancers.
    if getattr(unit, "balance", None) is not None:
        return True
    return any(p.balance == unit.name for p in BUILTIN_POLICIES.values())


@dataclass(frozen=True)
class _UnitRow:
    id: UUID
    name: str
    description: str
    has_filter: bool
    has_weight: bool
    has_balance: bool
    properties: dict[str, dict[str, str | None]]

    @classmethod
    def of(cls, unit: PolicyUnit) -> _UnitRow:
        return cls(
            id=unit.id,
            name=unit.name,
            description=unit.description,
            has_filter=unit.filter is not None,
            has_weight=unit.weight is not None,
            has_balance=_balance_capable(unit),
            properties={
                name: {"regex": spec.regex, "default": spec.default, "description": spec.description}
                for name, spec in unit.properties.items()
            },
        )


async def _upsert_units(conn: Connection, rows: Iterable[_UnitRow], *, refresh: bool) -> None:
    """Insert unit rows; with refresh, overwrite rows that differ (updated_at moves only then)."""
    on_conflict = (
        """DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,
               has_filter = EXCLUDED.has_filter, has_weight = EXCLUDED.has_weight,
               has_balance = EXCLUDED.has_balance, properties = EXCLUDED.properties, updated_at = now()
           WHERE (policy_unit.name, policy_unit.description, policy_unit.has_filter,
                  policy_unit.has_weight, policy_unit.has_balance, policy_unit.properties)
                 IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.description, EXCLUDED.has_filter,
                  EXCLUDED.has_weight, EXCLUDED.has_balance, EXCLUDED.properties)"""
        if refresh
        else "DO NOTHING"
    )
    await conn.executemany(
        f"""INSERT INTO policy_unit (id, name, description, is_internal, has_filter, has_weight,
                                     has_balance, properties)
            VALUES ($1, $2, $3, true, $4, $5, $6, $7)
            ON CONFLICT (id) {on_conflict}""",
        [(r.id, r.name, r.description, r.has_filter, r.has_weight, r.has_balance, r.properties) for r in rows],
    )


def _unit_names(policy: Policy) -> list[str]:
    names = [f.unit for f in policy.filters] + [w.unit for w in policy.weights]
    if policy.balance is not None:
        names.append(policy.balance)
    return list(dict.fromkeys(names))


async def _ensure_units(conn: Connection, policy: Policy, registry: Mapping[str, PolicyUnit]) -> None:
    # The registry may know units a migration has not seeded yet (newer code, older database).
    await _upsert_units(conn, [_UnitRow.of(registry[n]) for n in _unit_names(policy) if n in registry], refresh=False)


# ------------------------------------------------------------------------------ reading policies
_SELECT_POLICY: Final = """
    SELECT p.id, p.name, p.description, p.is_locked, p.is_default, p.selector, p.properties,
           bu.name AS balance
    FROM policy p LEFT JOIN policy_unit bu ON bu.id = p.balance_unit
"""


async def _load(conn: Connection, where: str = "true", *args: object) -> list[Policy]:
    rows = await conn.fetch(f"{_SELECT_POLICY} WHERE {where} ORDER BY p.name", *args)
    if not rows:
        return []
    links = await conn.fetch(
        """SELECT l.policy_id, u.name, l.filter_selected, l.filter_sequence, l.filter_position,
                  l.weight_selected, l.factor, l.weight_position
           FROM policy_unit_link l JOIN policy_unit u ON u.id = l.policy_unit_id
           WHERE l.policy_id = ANY($1::uuid[])""",
        [r["id"] for r in rows],
    )
    filters: dict[UUID, list[tuple[int, PolicyFilter]]] = {}
    weights: dict[UUID, list[tuple[int, PolicyWeight]]] = {}
    for link in links:
        pid = link["policy_id"]
        if link["filter_selected"]:
            f = PolicyFilter(unit=link["name"], sequence=FilterSequence(link["filter_sequence"]))
            filters.setdefault(pid, []).append((link["filter_position"], f))
        if link["weight_selected"]:
            w = PolicyWeight(unit=link["name"], factor=link["factor"])
            weights.setdefault(pid, []).append((link["weight_position"], w))
    return [
        Policy(
            id=r["id"],
            name=r["name"],
            description=r["description"],
            filters=tuple(f for _, f in sorted(filters.get(r["id"], []), key=lambda t: t[0])),
            weights=tuple(w for _, w in sorted(weights.get(r["id"], []), key=lambda t: t[0])),
            balance=r["balance"],
            selector=r["selector"],
            properties=dict(r["properties"]),
            locked=r["is_locked"],
            is_default=r["is_default"],
        )
        for r in rows
    ]


async def _load_one(conn: Connection, policy_id: UUID) -> Policy | None:
    found = await _load(conn, "p.id = $1", policy_id)
    return found[0] if found else None


async def _resolve(conn: Connection, ref: UUID | str, *, for_update: bool = False) -> Record:
    """The (id, is_locked, is_default) row of a policy given by id or name; PolicyNotFound if none."""
    lock = " FOR UPDATE" if for_update else ""
    as_id = ref if isinstance(ref, UUID) else _parse_uuid(ref)
    row: Record = None
    if as_id is not None:
        row = await conn.fetchrow(f"SELECT id, is_locked, is_default FROM policy WHERE id = $1{lock}", as_id)
    if row is None and isinstance(ref, str):
        row = await conn.fetchrow(f"SELECT id, is_locked, is_default FROM policy WHERE name = $1{lock}", ref)
    if row is None:
        raise PolicyNotFound(f"no policy {ref!s}", location="policy")
    return row


def _parse_uuid(text: str) -> UUID | None:
    try:
        return UUID(text)
    except ValueError:
        return None


async def _default_policy_id(conn: Connection) -> UUID:
    row = await conn.fetchrow("SELECT id FROM policy WHERE is_default")
    if row is not None:
        return UUID(str(row["id"]))
    # No default row (an operator cleared it by hand): fall back to the code's default.
    return UUID(str((await _resolve(conn, DEFAULT_POLICY.name))["id"]))


# ------------------------------------------------------------------------------ writing policies
@dataclass
class _Link:
    """One policy_unit_link row: everything a policy uses one unit for."""

    filter: bool = False
    sequence: FilterSequence = FilterSequence.NONE
    filter_position: int | None = None
    weight: bool = False
    factor: int = 1
    weight_position: int | None = None
    balance: bool = False


def _link_rows(policy: Policy) -> list[tuple[object, ...]]:
    links: dict[str, _Link] = {}
    for pos, f in enumerate(policy.filters):
        link = links.setdefault(f.unit, _Link())
        link.filter, link.sequence, link.filter_position = True, f.sequence, pos
    for pos, w in enumerate(policy.weights):
        link = links.setdefault(w.unit, _Link())
        link.weight, link.factor, link.weight_position = True, w.factor, pos
    if policy.balance is not None:
        links.setdefault(policy.balance, _Link()).balance = True
    return [
        (
            _link_id(policy.id, unit),
            policy.id,
            unit_id(unit),
            link.filter,
            link.sequence.value,
            link.filter_position,
            link.weight,
            link.factor,
            link.weight_position,
            link.balance,
        )
        for unit, link in links.items()
    ]


async def _write(conn: Connection, policy: Policy) -> None:
    """Insert or overwrite the policy row (is_default aside) and replace its links; in a transaction."""
    # Checked up front: after a foreign-key error the transaction is unusable for a useful message.
    names = _unit_names(policy)
    known = {r["name"] for r in await conn.fetch("SELECT name FROM policy_unit WHERE name = ANY($1)", names)}
    missing = [n for n in names if n not in known]
    if missing:
        raise UnknownPolicyUnit(f"policy {policy.name}: unknown units {missing}", location="unit")
    try:
        await conn.execute(
            """INSERT INTO policy (id, name, description, is_locked, selector, balance_unit, properties)
               VALUES ($1, $2, $3, $4, $5, $6, $7)
               ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,
                   is_locked = EXCLUDED.is_locked, selector = EXCLUDED.selector,
                   balance_unit = EXCLUDED.balance_unit, properties = EXCLUDED.properties,
                   updated_at = now()""",
            policy.id,
            policy.name,
            policy.description,
            policy.locked,
            policy.selector,
            unit_id(policy.balance) if policy.balance is not None else None,
            dict(policy.properties),
        )
        await conn.execute("DELETE FROM policy_unit_link WHERE policy_id = $1", policy.id)
        await conn.executemany(
            """INSERT INTO policy_unit_link (id, policy_id, policy_unit_id, filter_selected,
                   filter_sequence, filter_position, weight_selected, factor, weight_position,
                   balance_selected)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)""",
            _link_rows(policy),
        )
    except pg_errors.UniqueViolationError as exc:
        if exc.constraint_name == "policy_name_key":
            raise PolicyExists(f"a policy named {policy.name!r} exists", location="name") from exc
        raise


async def _set_default(conn: Connection, policy_id: UUID) -> None:
    # Clear first: the partial unique index allows one default at any moment of the statement order.
    await conn.execute(
        "UPDATE policy SET is_default = false, updated_at = now() WHERE is_default AND id <> $1", policy_id
    )
    await conn.execute(
        "UPDATE policy SET is_default = true, updated_at = now() WHERE id = $1 AND NOT is_default", policy_id
    )


async def seed_builtins(conn: Connection, registry: Mapping[str, PolicyUnit] = REGISTRY) -> None:
    """Write every registry unit and every built-in policy, changing rows only where they differ.

    Units a built-in names but the registry does not hold yet get a bare row (same uuid5 id) so
    the links can reference it; the registry's row replaces it once the unit exists. The default
    flag is only set when no policy is the default, so an operator's choice survives upgrades.
    """
    async with conn.transaction():
        await _upsert_units(conn, [_UnitRow.of(u) for u in registry.values()], refresh=True)
        usage: dict[str, dict[str, bool]] = {}
        for p in BUILTIN_POLICIES.values():
            for f in p.filters:
                usage.setdefault(f.unit, {})["filter"] = True
            for w in p.weights:
                usage.setdefault(w.unit, {})["weight"] = True
            if p.balance is not None:
                usage.setdefault(p.balance, {})["balance"] = True
        bare = [
            _UnitRow(unit_id(name), name, "", u.get("filter", False), u.get("weight", False),
                     u.get("balance", False), {})
            for name, u in usage.items()
            if name not in registry
        ]  # fmt: skip
        await _upsert_units(conn, bare, refresh=False)
        for p in BUILTIN_POLICIES.values():
            stored = await _load_one(conn, p.id)
            if stored is None or stored.model_copy(update={"is_default": p.is_default}) != p:
                await _write(conn, p)
        if await conn.fetchval("SELECT count(*) FROM policy WHERE is_default") == 0:
            await _set_default(conn, DEFAULT_POLICY.id)


# ---------------------------------------------------------------------------------- repository
class PolicyRepository:
    """Policies and per-cluster policy settings, on an asyncpg pool made by `connect`."""

    def __init__(self, pool: asyncpg.Pool, registry: Mapping[str, PolicyUnit] = REGISTRY) -> None:
        self._pool = pool
        self._registry = registry

    # ---------------------------------------------------------------------------------- reading
    async def get(self, policy_id_or_name: UUID | str) -> Policy:
        async with self._pool.acquire() as conn:
            row = await _resolve(conn, policy_id_or_name)
            return await self._load_existing(conn, row["id"])

    async def list(self) -> builtins.list[Policy]:
        """Every policy, by name."""
        async with self._pool.acquire() as conn:
            return await _load(conn)

    async def get_default(self) -> Policy:
        async with self._pool.acquire() as conn:
            return await self._load_existing(conn, await _default_policy_id(conn))

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
                policy_id = await _default_policy_id(conn)
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
        self._validate(policy)
        if policy.locked:
            raise InvalidRequest("only built-in policies are locked", location="locked")
        if policy.is_default:
            raise InvalidRequest("create the policy, then make it the default", location="is_default")
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchval("SELECT 1 FROM policy WHERE id = $1", policy.id):
                raise PolicyExists(f"a policy with id {policy.id} exists", location="id")
            await _ensure_units(conn, policy, self._registry)
            await _write(conn, policy)
            return await self._load_existing(conn, policy.id)

    async def update(self, policy: Policy) -> Policy:
        """Replace a stored policy (found by id); PolicyLocked for built-ins.

        `locked` and `is_default` must match the stored row: they are not edited this way.
        """
        self._validate(policy)
        async with self._pool.acquire() as conn, conn.transaction():
            row = await _resolve(conn, policy.id, for_update=True)
            if row["is_locked"]:
                raise PolicyLocked(f"policy {policy.name!r} is locked; clone it to edit", location="policy")
            if policy.locked:
                raise InvalidRequest("only built-in policies are locked", location="locked")
            if policy.is_default != row["is_default"]:
                raise InvalidRequest("the default policy is chosen with set_default", location="is_default")
            await _ensure_units(conn, policy, self._registry)
            await _write(conn, policy)
            return await self._load_existing(conn, policy.id)

    async def delete(self, policy_id: UUID | str) -> None:
        """Delete a policy; PolicyLocked for built-ins, PolicyInUse while clusters use it or it is
        the default."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await _resolve(conn, policy_id, for_update=True)
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

    async def clone(self, source: UUID | str, new_name: str, *, description: str | None = None) -> Policy:
        """An unlocked, non-default copy of a stored policy (built-ins included) under a new name."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await _resolve(conn, source)
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
            await _write(conn, copy)
            return await self._load_existing(conn, copy.id)

    async def set_default(self, policy_id: UUID | str) -> Policy:
        """Make a policy (locked or not) the one clusters without their own choice run."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await _resolve(conn, policy_id, for_update=True)
            await _set_default(conn, row["id"])
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
            current = await conn.fetchrow(
                "SELECT properties FROM cluster_policy WHERE cluster_id = $1 FOR UPDATE", cluster_id
            )
            chosen: UUID | None = None
            if policy_id is not None:
                chosen = UUID(str((await _resolve(conn, policy_id))["id"]))
            policy = await self._load_existing(conn, chosen or await _default_policy_id(conn))
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

    async def clear_cluster(self, cluster_id: str) -> bool:
        """Forget a cluster's settings (it then runs the default policy); True if it had a row."""
        async with self._pool.acquire() as conn:
            status: str = await conn.execute("DELETE FROM cluster_policy WHERE cluster_id = $1", cluster_id)
        return status != "DELETE 0"

    # ---------------------------------------------------------------------------------- helpers
    async def _load_existing(self, conn: Connection, policy_id: UUID) -> Policy:
        policy = await _load_one(conn, policy_id)
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
        for name in _unit_names(policy):
            unit = self._registry.get(name)
            if unit is not None:
                validate_properties(unit, properties)


__all__ = [
    "ClusterSettings",
    "PolicyError",
    "PolicyExists",
    "PolicyInUse",
    "PolicyLocked",
    "PolicyNotFound",
    "PolicyRepository",
    "connect",
    "init_connection",
    "seed_builtins",
    "unit_id",
]
