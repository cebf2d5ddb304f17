"""Policies as rows: reading them into `Policy` objects and writing a policy with its unit links.

A policy is one `policy` row plus one `policy_unit_link` row per unit it uses (as filter, weight or
balancer, with positions and factors). These helpers work on a connection the caller holds, so the
repository and the built-in catalogue can run them inside their own transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from uuid import UUID, uuid5

from asyncpg import exceptions as pg_errors

from vmsched.db.pool import Connection, Record
from vmsched.errors import PolicyExists, PolicyNotFound, UnknownPolicyUnit
from vmsched.scheduling.policy import DEFAULT_POLICY, FilterSequence, Policy, PolicyFilter, PolicyWeight
from vmsched.scheduling.policy_docs import document_of
from vmsched.scheduling.units.base import UNIT_NAMESPACE


# ------------------------------------------------------------------------------------------- ids
def unit_id(name: str) -> UUID:
    """The policy_unit row id of a unit name: the same value as PolicyUnit.id."""
    return uuid5(UNIT_NAMESPACE, name)


def _link_id(policy_id: UUID, unit: str) -> UUID:
    # Deterministic so rewriting a policy's links reproduces identical rows.
    return uuid5(policy_id, unit)


def unit_names(policy: Policy) -> list[str]:
    """Every unit the policy uses (filters, weights, balancer), once each, in that order."""
    names = [f.unit for f in policy.filters] + [w.unit for w in policy.weights]
    if policy.balance is not None:
        names.append(policy.balance)
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------ reading policies
_SELECT_POLICY: Final = """
    SELECT p.id, p.name, p.description, p.is_locked, p.is_default, p.selector, p.properties,
           p.version, bu.name AS balance
    FROM policy p LEFT JOIN policy_unit bu ON bu.id = p.balance_unit
"""


async def load_policies(conn: Connection, where: str = "true", *args: object) -> list[Policy]:
    """The policies whose row (alias p) matches `where`, by name, filters and weights in link order."""
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
            version=r["version"],
        )
        for r in rows
    ]


async def load_policy(conn: Connection, policy_id: UUID) -> Policy | None:
    """One policy by id; None when there is no such row."""
    found = await load_policies(conn, "p.id = $1", policy_id)
    return found[0] if found else None


async def resolve_policy(conn: Connection, ref: UUID | str, *, for_update: bool = False) -> Record:
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


async def default_policy_id(conn: Connection) -> UUID:
    """The id of the policy clusters without their own choice run."""
    row = await conn.fetchrow("SELECT id FROM policy WHERE is_default")
    if row is not None:
        return UUID(str(row["id"]))
    # No default row (an operator cleared it by hand): fall back to the code's default.
    return UUID(str((await resolve_policy(conn, DEFAULT_POLICY.name))["id"]))


# ------------------------------------------------------------------------------ writing policies
@dataclass
class _Link:
    """One policy_unit_link row: everything a policy uses one unit for."""

    filter: bool = False
    sequence: FilterSequence = FilterSequence.NONE
    filter_position: int | None = None
    weight: bool = False
    factor: float = 1
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


async def write_policy(conn: Connection, policy: Policy, *, author: str | None = None) -> None:
    """Insert or overwrite the policy row (is_default aside) and replace its links; in a transaction.
    A new version names `author` (the AMQP user that asked; None: not known, as for built-ins)."""
    # Checked up front: after a foreign-key error the transaction is unusable for a useful message.
    names = unit_names(policy)
    known = {r["name"] for r in await conn.fetch("SELECT name FROM policy_unit WHERE name = ANY($1)", names)}
    missing = [n for n in names if n not in known]
    if missing:
        raise UnknownPolicyUnit(f"policy {policy.name}: unknown units {missing}", location="unit")
    # A new version only when what the administrator wrote changed: re-seeding the built-ins at
    # every migration, or applying the same file twice, stores nothing new.
    before = await load_policy(conn, policy.id)
    document = document_of(policy)
    changed = before is None or document_of(before) != document or before.locked != policy.locked
    version = 1 if before is None else before.version + 1 if changed else before.version
    try:
        await conn.execute(
            """INSERT INTO policy (id, name, description, is_locked, selector, balance_unit, properties, version)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
               ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, description = EXCLUDED.description,
                   is_locked = EXCLUDED.is_locked, selector = EXCLUDED.selector,
                   balance_unit = EXCLUDED.balance_unit, properties = EXCLUDED.properties,
                   version = EXCLUDED.version, updated_at = now()""",
            policy.id,
            policy.name,
            policy.description,
            policy.locked,
            policy.selector,
            unit_id(policy.balance) if policy.balance is not None else None,
            dict(policy.properties),
            version,
        )
        if changed:
            await conn.execute(
                """INSERT INTO policy_version (policy_id, version, document, author) VALUES ($1, $2, $3, $4)
                   ON CONFLICT (policy_id, version) DO UPDATE SET document = EXCLUDED.document,
                       author = EXCLUDED.author""",
                policy.id,
                version,
                document.model_dump(mode="json"),
                author,
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


async def set_default_policy(conn: Connection, policy_id: UUID) -> None:
    """Make the policy the one default, clearing the flag elsewhere."""
    # Clear first: the partial unique index allows one default at any moment of the statement order.
    await conn.execute(
        "UPDATE policy SET is_default = false, updated_at = now() WHERE is_default AND id <> $1", policy_id
    )
    await conn.execute(
        "UPDATE policy SET is_default = true, updated_at = now() WHERE id = $1 AND NOT is_default", policy_id
    )


__all__ = [
    "default_policy_id",
    "load_policies",
    "load_policy",
    "resolve_policy",
    "set_default_policy",
    "unit_id",
    "unit_names",
    "write_policy",
]
