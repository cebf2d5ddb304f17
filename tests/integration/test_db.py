"""vmsched.db against the real PostgreSQL: migrations, built-in rows, the policy repository.

The policy-unit registry is filled by other code; these tests only name the units the built-in
policies name and otherwise iterate over whatever REGISTRY holds. Tests that need a unit with a
custom property either find one in REGISTRY or use a small registry of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import NAMESPACE_OID, UUID, uuid5

import asyncpg
import pytest

from vmsched.db import (
    ClusterSettings,
    PolicyExists,
    PolicyInUse,
    PolicyLocked,
    PolicyNotFound,
    PolicyRepository,
    connect,
    load_migrations,
    migrate,
    unit_id,
)
from vmsched.errors import InvalidProperty, InvalidRequest, UnknownPolicyUnit
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.policy import (
    BUILTIN_POLICIES,
    DEFAULT_POLICY,
    FilterSequence,
    Policy,
    PolicyFilter,
    PolicyWeight,
)
from vmsched.scheduling.units.base import FilterVerdict, PolicyUnit, PropertySpec, Props
from vmsched.scheduling.units.registry import REGISTRY

pytestmark = pytest.mark.integration

ALL_VERSIONS = [m.version for m in load_migrations()]
POLICY_IDS = {p.id for p in BUILTIN_POLICIES.values()}


def _with_db(url: str, name: str) -> str:
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, f"/{name}", p.query, p.fragment))


async def _drop(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(_with_db(url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, timestamps included: idempotent runs must not touch any."""
    conn = await asyncpg.connect(url)
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table, key in (
            ("schema_migrations", "version"),
            ("policy_unit", "id"),
            ("policy", "id"),
            ("policy_unit_link", "id"),
            ("cluster_policy", "cluster_id"),
        ):
            out[table] = [tuple(r) for r in await conn.fetch(f"SELECT * FROM {table} ORDER BY {key}")]
        return out
    finally:
        await conn.close()


@pytest.fixture
async def fresh_url(database: str, unique: str) -> AsyncIterator[str]:
    """The URL of a database that does not exist yet (migrate must create it); dropped afterwards."""
    url = _with_db(database, f"{urlsplit(database).path.lstrip('/')}_m{unique}")
    yield url
    await _drop(url)


@pytest.fixture(scope="module")
async def pool(database: str) -> AsyncIterator[asyncpg.Pool]:
    await migrate(database)
    p = await connect(database)
    yield p
    await p.close()


@pytest.fixture
def repo(pool: asyncpg.Pool) -> PolicyRepository:
    return PolicyRepository(pool)


def _keep_all(hosts: HostTable, vm: object, props: Props) -> FilterVerdict:
    return FilterVerdict.keep_all(hosts)


def _test_registry(unique: str) -> tuple[Mapping[str, PolicyUnit], PolicyUnit]:
    """REGISTRY plus a filter unit of this test's own that declares a property with a regex."""
    unit = PolicyUnit(
        name=f"TestThreshold{unique}",
        description="test unit",
        filter=_keep_all,
        properties={"TestThreshold": PropertySpec(regex="^([1-9][0-9]*)$", default="5")},
    )
    return {**REGISTRY, unit.name: unit}, unit


def _bad_value(spec: PropertySpec) -> str | None:
    for candidate in ("not a number", "-1", "", "x", "1.5.5", "99999999999999999999", "true false"):
        if not spec.matches(candidate):
            return candidate
    return None


# ----------------------------------------------------------------------------------- migrations
async def test_migrate_creates_database_and_applies(fresh_url: str) -> None:
    assert await migrate(fresh_url) == ALL_VERSIONS
    conn = await asyncpg.connect(fresh_url)
    try:
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
    finally:
        await conn.close()
    assert sorted(versions) == ALL_VERSIONS


async def test_second_migrate_applies_nothing_and_changes_no_row(fresh_url: str) -> None:
    await migrate(fresh_url)
    before = await _snapshot(fresh_url)
    assert await migrate(fresh_url) == []
    assert await _snapshot(fresh_url) == before


async def test_concurrent_migrations_serialize(fresh_url: str) -> None:
    results = await asyncio.gather(*(migrate(fresh_url) for _ in range(3)))
    assert sorted(results, key=len) == [[], [], ALL_VERSIONS]
    snap = await _snapshot(fresh_url)
    assert {r[0] for r in snap["policy"]} == POLICY_IDS


async def test_builtins_track_the_code(fresh_url: str) -> None:
    # First run with no units known: built-ins still seed, with bare unit rows for what they name.
    await migrate(fresh_url, registry={})
    conn = await asyncpg.connect(fresh_url)
    try:
        await conn.execute(
            "UPDATE policy SET description = 'tampered', properties = '{}' WHERE id = $1",
            BUILTIN_POLICIES["power_saving"].id,
        )
        await conn.execute("DELETE FROM policy_unit_link WHERE policy_id = $1", DEFAULT_POLICY.id)
    finally:
        await conn.close()
    assert await migrate(fresh_url) == []
    pool = await connect(fresh_url)
    try:
        repo = PolicyRepository(pool)
        for p in BUILTIN_POLICIES.values():
            stored = await repo.get(p.id)
            assert stored.model_dump(exclude={"version"}) == p.model_dump(exclude={"version"})
            # Re-seeding stores a new version only of what was changed behind its back.
            tampered = p.id in (BUILTIN_POLICIES["power_saving"].id, DEFAULT_POLICY.id)
            assert stored.version == (2 if tampered else 1), p.name
        rows = {r["name"]: r for r in await pool.fetch("SELECT * FROM policy_unit")}
    finally:
        await pool.close()
    for unit in REGISTRY.values():
        row = rows[unit.name]
        assert row["id"] == unit.id
        assert row["description"] == unit.description
        assert (row["has_filter"], row["has_weight"]) == (unit.filter is not None, unit.weight is not None)
        assert set(row["properties"]) == set(unit.properties)


# ------------------------------------------------------------------------------------- built-ins
async def test_unit_rows_for_registry_and_builtins(pool: asyncpg.Pool) -> None:
    rows = {r["name"]: r for r in await pool.fetch("SELECT * FROM policy_unit")}
    for unit in REGISTRY.values():
        row = rows[unit.name]
        assert row["id"] == unit.id == unit_id(unit.name)
        assert row["has_filter"] == (unit.filter is not None)
        assert row["has_weight"] == (unit.weight is not None)
        assert row["properties"] == {
            name: {"regex": s.regex, "default": s.default, "description": s.description}
            for name, s in unit.properties.items()
        }
    for p in BUILTIN_POLICIES.values():
        for name in [f.unit for f in p.filters] + [w.unit for w in p.weights]:
            assert rows[name]["id"] == unit_id(name)
        if p.balance is not None:
            assert rows[p.balance]["has_balance"]


async def test_builtin_policies_round_trip(repo: PolicyRepository) -> None:
    listed = {p.name: p for p in await repo.list()}
    for name, builtin in BUILTIN_POLICIES.items():
        assert listed[name] == builtin
        assert await repo.get(builtin.id) == builtin
        assert await repo.get(name) == builtin
        assert await repo.get(str(builtin.id)) == builtin
        stored = await repo.get(name)
        assert stored.locked
        assert stored.ordered_filters() == builtin.ordered_filters()
        assert [(w.unit, w.factor) for w in stored.weights] == [(w.unit, w.factor) for w in builtin.weights]
    assert [p.name for p in listed.values() if p.is_default] == ["none"]
    assert (await repo.get_default()).id == DEFAULT_POLICY.id


async def test_single_default_enforced_by_schema(pool: asyncpg.Pool) -> None:
    with pytest.raises(asyncpg.UniqueViolationError):
        await pool.execute("UPDATE policy SET is_default = true WHERE name = 'power_saving'")


async def test_get_unknown_policy(repo: PolicyRepository, unique: str) -> None:
    with pytest.raises(PolicyNotFound):
        await repo.get(f"no-such-policy-{unique}")


# -------------------------------------------------------------------------------------- clusters
async def test_cluster_without_row_runs_default(repo: PolicyRepository, unique: str) -> None:
    assert await repo.get_for_cluster(f"c-{unique}") == DEFAULT_POLICY
    settings = await repo.get_cluster_settings(f"c-{unique}")
    assert settings == ClusterSettings(cluster_id=f"c-{unique}")
    assert settings.ha_reservation is False


async def test_set_cluster_policy_merges_overrides(repo: PolicyRepository, unique: str) -> None:
    cluster = f"c-{unique}"
    ps = BUILTIN_POLICIES["power_saving"]
    set_ = await repo.set_cluster_policy(cluster, ps.id, {"HighUtilization": "90"}, ha_reservation=True)
    assert (set_.policy_id, set_.properties, set_.ha_reservation) == (ps.id, {"HighUtilization": "90"}, True)

    got = await repo.get_for_cluster(cluster)
    assert got.id == ps.id
    assert got.filters == ps.filters
    assert got.weights == ps.weights
    assert got.balance == ps.balance
    # the cluster's HA reservation switch reaches the units as the property HaReservation
    assert dict(got.properties) == {**ps.properties, "HighUtilization": "90", "HaReservation": "true"}
    assert await repo.get(ps.id) == ps  # the policy itself is untouched

    # None keeps the overrides and the HA setting; a policy named by name works too.
    await repo.set_cluster_policy(cluster, "evenly_distributed")
    settings = await repo.get_cluster_settings(cluster)
    assert settings.policy_id == BUILTIN_POLICIES["evenly_distributed"].id
    assert (settings.properties, settings.ha_reservation) == ({"HighUtilization": "90"}, True)
    assert (await repo.get_for_cluster(cluster)).properties["HighUtilization"] == "90"

    # None as policy: follow the default again, keeping the row's HA setting.
    await repo.set_cluster_policy(cluster, None, {}, ha_reservation=False)
    assert await repo.get_for_cluster(cluster) == DEFAULT_POLICY
    assert not (await repo.get_cluster_settings(cluster)).ha_reservation
    assert await repo.clear_cluster(cluster)
    assert not await repo.clear_cluster(cluster)


async def test_set_cluster_policy_unknown_policy(repo: PolicyRepository, unique: str) -> None:
    with pytest.raises(PolicyNotFound):
        await repo.set_cluster_policy(f"c-{unique}", f"nope-{unique}")


async def test_set_cluster_policy_rejects_invalid_override(pool: asyncpg.Pool, unique: str) -> None:
    registry, unit = _test_registry(unique)
    repo = PolicyRepository(pool, registry)
    policy = await repo.create(
        Policy(id=_uuid(unique, "ov"), name=f"ov-{unique}", filters=(PolicyFilter(unit=unit.name),))
    )
    with pytest.raises(InvalidProperty) as info:
        await repo.set_cluster_policy(f"c-{unique}", policy.id, {"TestThreshold": "0"})
    assert info.value.regex == "^([1-9][0-9]*)$"
    assert (await repo.get_cluster_settings(f"c-{unique}")).policy_id is None


# ---------------------------------------------------------------------------------------- create
def _uuid(unique: str, tag: str) -> UUID:
    return uuid5(NAMESPACE_OID, f"{unique}-{tag}")


@pytest.mark.parametrize("where", ["filter", "weight", "balance"])
async def test_create_unknown_unit(repo: PolicyRepository, unique: str, where: str) -> None:
    missing = f"NoSuchUnit{unique}"
    by_where: dict[str, dict[str, Any]] = {
        "filter": {"filters": (PolicyFilter(unit=missing),)},
        "weight": {"weights": (PolicyWeight(unit=missing),)},
        "balance": {"balance": missing},
    }
    fields = by_where[where]
    policy = Policy(id=_uuid(unique, where), name=f"bad-{unique}-{where}", **fields)
    with pytest.raises(UnknownPolicyUnit, match=missing):
        await repo.create(policy)
    with pytest.raises(PolicyNotFound):
        await repo.get(policy.id)


async def test_create_invalid_property_names_regex(repo: PolicyRepository, unique: str) -> None:
    found = next(
        (
            (unit, prop, spec, bad)
            for unit in REGISTRY.values()
            for prop, spec in unit.properties.items()
            if (bad := _bad_value(spec)) is not None
        ),
        None,
    )
    if found is None:
        pytest.skip("no unit in REGISTRY declares a property with a regex that rejects a value")
    unit, prop, spec, bad = found
    link: dict[str, Any] = (
        {"filters": (PolicyFilter(unit=unit.name),)}
        if unit.filter is not None
        else {"weights": (PolicyWeight(unit=unit.name),)}
    )
    policy = Policy(id=_uuid(unique, "prop"), name=f"prop-{unique}", properties={prop: bad}, **link)
    with pytest.raises(InvalidProperty) as info:
        await repo.create(policy)
    assert (info.value.prop, info.value.value, info.value.regex) == (prop, bad, spec.regex)
    assert spec.regex in str(info.value)
    assert prop in str(info.value)


async def test_create_update_delete_custom_policy(pool: asyncpg.Pool, unique: str) -> None:
    registry, unit = _test_registry(unique)
    repo = PolicyRepository(pool, registry)
    weights = tuple(PolicyWeight(unit=u.name, factor=3) for u in REGISTRY.values() if u.weight is not None)
    policy = Policy(
        id=_uuid(unique, "custom"),
        name=f"custom-{unique}",
        description="mine",
        filters=(
            PolicyFilter(unit=unit.name, sequence=FilterSequence.LAST),
            *(PolicyFilter(unit=u.name) for u in REGISTRY.values() if u.filter is not None),
        ),
        weights=weights,
        selector="RankSelector",
        properties={"TestThreshold": "7"},
    )
    assert await repo.create(policy) == policy
    assert await repo.get(policy.name) == policy

    with pytest.raises(InvalidProperty) as info:
        await repo.create(
            policy.model_copy(
                update={
                    "id": _uuid(unique, "c2"),
                    "name": f"c2-{unique}",
                    "properties": {"TestThreshold": "0"},
                }
            )
        )
    assert info.value.regex == "^([1-9][0-9]*)$"
    assert "^([1-9][0-9]*)$" in str(info.value)

    with pytest.raises(PolicyExists):
        await repo.create(policy.model_copy(update={"id": _uuid(unique, "c3")}))
    with pytest.raises(PolicyExists):
        await repo.create(policy.model_copy(update={"name": f"c4-{unique}"}))
    with pytest.raises(InvalidRequest):
        await repo.create(policy.model_copy(update={"id": _uuid(unique, "c5"), "name": f"c5-{unique}", "locked": True}))

    edited = policy.model_copy(
        update={
            "description": "edited",
            "filters": tuple(reversed(policy.filters)),
            "weights": tuple(PolicyWeight(unit=w.unit, factor=w.factor + 1) for w in reversed(weights)),
            "properties": {"TestThreshold": "12"},
        }
    )
    stored = edited.model_copy(update={"version": 2})  # every stored change is a new version
    assert await repo.update(edited) == stored
    assert await repo.get(policy.id) == stored
    assert await repo.update(edited) == stored  # the same document again: no new version
    with pytest.raises(InvalidProperty):
        await repo.update(edited.model_copy(update={"properties": {"TestThreshold": "x"}}))
    assert await repo.get(policy.id) == stored
    assert [v.version for v in await repo.history(policy.id)] == [2, 1]

    # In use by a cluster: not deletable until the cluster lets go.
    await repo.set_cluster_policy(f"c-{unique}", policy.id, {"TestThreshold": "9"})
    assert (await repo.get_for_cluster(f"c-{unique}")).properties["TestThreshold"] == "9"
    with pytest.raises(PolicyInUse, match=f"c-{unique}"):
        await repo.delete(policy.id)
    await repo.clear_cluster(f"c-{unique}")
    await repo.delete(policy.id)
    with pytest.raises(PolicyNotFound):
        await repo.get(policy.id)
    assert await pool.fetchval("SELECT count(*) FROM policy_unit_link WHERE policy_id = $1", policy.id) == 0


# ---------------------------------------------------------------------------------- locked / clone
@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
async def test_locked_policy_cannot_be_updated_or_deleted(repo: PolicyRepository, name: str) -> None:
    builtin = BUILTIN_POLICIES[name]
    with pytest.raises(PolicyLocked):
        await repo.update(builtin.model_copy(update={"description": "changed"}))
    with pytest.raises(PolicyLocked):
        await repo.update(builtin.model_copy(update={"description": "changed", "locked": False}))
    with pytest.raises(PolicyLocked):
        await repo.delete(builtin.id)
    with pytest.raises(PolicyLocked):
        await repo.delete(name)
    assert await repo.get(builtin.id) == builtin


async def test_clone_of_locked_policy_is_editable(repo: PolicyRepository, unique: str) -> None:
    source = BUILTIN_POLICIES["power_saving"]
    clone = await repo.clone(source.name, f"my-power-saving-{unique}")
    assert not clone.locked
    assert not clone.is_default
    assert clone.id != source.id
    assert (clone.filters, clone.weights, clone.balance, clone.properties) == (
        source.filters,
        source.weights,
        source.balance,
        source.properties,
    )
    with pytest.raises(PolicyExists):
        await repo.clone(source.id, clone.name)

    # Keep only what the registry can run, so the edit validates whatever the registry holds today.
    edited = clone.model_copy(
        update={
            "description": "edited clone",
            "filters": tuple(f for f in clone.filters if f.unit in REGISTRY),
            "weights": tuple(
                PolicyWeight(unit=w.unit, factor=w.factor + 5) for w in clone.weights if w.unit in REGISTRY
            ),
            "balance": clone.balance if clone.balance in REGISTRY else None,
            "properties": {**clone.properties, "HighUtilization": "75"},
        }
    )
    assert await repo.update(edited) == edited.model_copy(update={"version": 2})
    assert await repo.get(clone.id) == edited.model_copy(update={"version": 2})
    assert await repo.get(source.id) == source
    await repo.delete(clone.id)
    with pytest.raises(PolicyNotFound):
        await repo.get(clone.id)


async def test_set_default(repo: PolicyRepository, unique: str) -> None:
    clone = await repo.clone("none", f"default-{unique}")
    cluster = f"c-{unique}"
    try:
        assert (await repo.set_default(clone.id)).is_default
        assert (await repo.get_for_cluster(cluster)).id == clone.id
        assert not (await repo.get("none")).is_default
        with pytest.raises(PolicyInUse):
            await repo.delete(clone.id)
        with pytest.raises(InvalidRequest):
            await repo.update((await repo.get(clone.id)).model_copy(update={"is_default": False}))
    finally:
        await repo.set_default("none")
    assert await repo.get("none") == DEFAULT_POLICY
    assert await repo.get_for_cluster(cluster) == DEFAULT_POLICY
    await repo.delete(clone.id)


async def test_apply_stores_a_whole_set_or_nothing(repo: PolicyRepository, unique: str) -> None:
    base = BUILTIN_POLICIES["none"]
    fresh = base.model_copy(
        update={"id": _uuid(unique, "set-a"), "name": f"set-a-{unique}", "locked": False, "is_default": False}
    )
    # The attachment names a policy that does not exist: refused after the new policy was written
    # in the same transaction, which must then leave nothing behind.
    with pytest.raises(PolicyNotFound):
        await repo.apply([fresh], [(f"c-{unique}", f"nosuch-{unique}", {}, False)])
    with pytest.raises(PolicyNotFound):
        await repo.get(fresh.id)
    stored = await repo.apply([fresh], [(f"c-{unique}", fresh.name, {}, True)])
    assert [p.version for p in stored] == [1]
    settings = await repo.get_cluster_settings(f"c-{unique}")
    assert (settings.policy_id, settings.ha_reservation) == (fresh.id, True)
    await repo.clear_cluster(f"c-{unique}")
