"""The code's catalogue in the database: a policy_unit row per registry unit, and the built-in policies.

`seed_builtins` (run by every migration) writes the registry's units and the built-in policies,
touching only rows that differ; `ensure_units` adds the rows of registry units a policy names that an
older database does not hold yet, before the policy is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from uuid import UUID

from vmsched.db.policy_rows import load_policy, set_default_policy, unit_id, unit_names, write_policy
from vmsched.db.pool import Connection
from vmsched.scheduling.policy import BUILTIN_POLICIES, DEFAULT_POLICY, Policy
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.scheduling.units.registry import REGISTRY


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


async def ensure_units(conn: Connection, policy: Policy, registry: Mapping[str, PolicyUnit]) -> None:
    """Add the missing rows of the registry units the policy names; existing rows stay as they are."""
    # The registry may know units a migration has not seeded yet (newer code, older database).
    await _upsert_units(conn, [_UnitRow.of(registry[n]) for n in unit_names(policy) if n in registry], refresh=False)


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
            stored = await load_policy(conn, p.id)
            if stored is None or stored.model_copy(update={"is_default": p.is_default}) != p:
                await write_policy(conn, p)
        if await conn.fetchval("SELECT count(*) FROM policy WHERE is_default") == 0:
            await set_default_policy(conn, DEFAULT_POLICY.id)


__all__ = ["ensure_units", "seed_builtins"]
