"""Decimal weight factors in PostgreSQL: migration 0007 turns an existing database's integer factors
into double precision keeping every value, applies once, and leaves a column that holds 1.5 and 0.1
exactly and refuses NaN, infinity and factors past the bound; policies with decimal factors read
back equal, and their history compares equal."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit
from uuid import NAMESPACE_OID, uuid5

import asyncpg
import pytest

from vmsched.db import PolicyRepository, connect, load_migrations, migrate
from vmsched.db.catalogue import seed_builtins
from vmsched.db.migrate import _apply
from vmsched.db.pool import init_connection
from vmsched.scheduling.policy import BUILTIN_POLICIES, DEFAULT_POLICY, PolicyWeight
from vmsched.scheduling.policy_docs import document_of
from vmsched.scheduling.units.registry import REGISTRY

pytestmark = pytest.mark.integration

DECIMAL = "0007_decimal_factors"


def _with_db(url: str, name: str) -> str:
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, f"/{name}", p.query, p.fragment))


@pytest.fixture
async def fresh_url(database: str, unique: str) -> AsyncIterator[str]:
    """A database of this test's own (created empty, dropped afterwards)."""
    name = f"{urlsplit(database).path.lstrip('/')}_f{unique}"
    admin = await asyncpg.connect(_with_db(database, "postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield _with_db(database, name)
    admin = await asyncpg.connect(_with_db(database, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _factor_type(conn: asyncpg.Connection) -> str:
    found: str = await conn.fetchval(
        """SELECT data_type FROM information_schema.columns
           WHERE table_name = 'policy_unit_link' AND column_name = 'factor'"""
    )
    return found


async def test_0007_turns_integer_factors_into_decimals_keeping_them(fresh_url: str, unique: str) -> None:
    # A database as the release before this one left it: migrations up to 0006, built-ins seeded
    # (integer factors), and an administrator's policy with a negative one.
    before = [m for m in load_migrations() if m.version < DECIMAL]
    conn = await asyncpg.connect(fresh_url)
    try:
        await init_connection(conn)
        await _apply(conn, before)
        await seed_builtins(conn, REGISTRY)
        assert await _factor_type(conn) == "integer"
        mine = uuid5(NAMESPACE_OID, f"mine-{unique}")
        await conn.execute(
            """INSERT INTO policy (id, name) VALUES ($1, $2);""",
            mine,
            f"mine-{unique}",
        )
        await conn.execute(
            """INSERT INTO policy_unit_link (id, policy_id, policy_unit_id, weight_selected, factor, weight_position)
               SELECT $1, $2, id, true, -1000000, 0 FROM policy_unit WHERE name = 'RAMWeigher'""",
            uuid5(mine, "RAMWeigher"),
            mine,
        )
        integers = sorted(tuple(r) for r in await conn.fetch("SELECT id, factor FROM policy_unit_link"))
    finally:
        await conn.close()

    assert await migrate(fresh_url) == [DECIMAL]
    assert await migrate(fresh_url) == []  # applied once; a second run changes nothing

    conn = await asyncpg.connect(fresh_url)
    try:
        assert await _factor_type(conn) == "double precision"
        decimals = sorted(tuple(r) for r in await conn.fetch("SELECT id, factor FROM policy_unit_link"))
        assert decimals == integers  # 2 == 2.0: every factor kept
        assert all(type(f) is float for _, f in decimals)
        # The column holds decimals exactly and refuses what no factor may be.
        link = uuid5(mine, "RAMWeigher")
        for value in (1.5, 0.1, -0.25, 1e6, -1e6, 1e-9):
            await conn.execute("UPDATE policy_unit_link SET factor = $1 WHERE id = $2", value, link)
            assert await conn.fetchval("SELECT factor FROM policy_unit_link WHERE id = $1", link) == value
        for value in (math.nan, math.inf, -math.inf, 1_000_000.5, -2e6):
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE policy_unit_link SET factor = $1 WHERE id = $2", value, link)
    finally:
        await conn.close()

    pool = await connect(fresh_url)
    try:
        repo = PolicyRepository(pool)
        for builtin in BUILTIN_POLICIES.values():
            stored = await repo.get(builtin.id)
            assert stored == builtin
            assert all(type(w.factor) is int for w in stored.weights)  # exported as 2, not 2.0
            assert (await repo.history(builtin.id))[0].document == document_of(builtin)
            assert stored.version == 1  # the migration stored no new version of the built-ins
    finally:
        await pool.close()


async def test_a_policy_with_decimal_factors_reads_back_equal_with_its_history(fresh_url: str, unique: str) -> None:
    await migrate(fresh_url)
    pool = await connect(fresh_url)
    try:
        repo = PolicyRepository(pool)
        weights = (
            PolicyWeight(unit="OptimalForEvenCpuDistribution", factor=1.5),
            PolicyWeight(unit="OptimalForEvenMemoryDistribution", factor=0.1),
            PolicyWeight(unit="PreferredHosts", factor=1_000_000.0),
            PolicyWeight(unit="VmAffinityGroups", factor=-0.25),
            PolicyWeight(unit="VmToHostsAffinityGroups", factor=20),
        )
        policy = DEFAULT_POLICY.model_copy(
            update={
                "id": uuid5(NAMESPACE_OID, f"dec-{unique}"),
                "name": f"dec-{unique}",
                "locked": False,
                "is_default": False,
                "weights": weights,
            }
        )
        created = await repo.create(policy)
        stored = await repo.get(policy.id)
        assert stored == created
        assert [w.factor for w in stored.weights] == [1.5, 0.1, 1_000_000, -0.25, 20]
        assert [type(w.factor) for w in stored.weights] == [float, float, int, float, int]
        # Writing what was read stores no new version: nothing differs after the round trip.
        assert (await repo.update(stored)).version == 1
        changed = await repo.update(
            stored.model_copy(update={"weights": (weights[0].model_copy(update={"factor": 2.5}), *weights[1:])})
        )
        assert changed.version == 2
        history = await repo.history(policy.id)
        assert [v.version for v in history] == [2, 1]
        assert history[1].document == document_of(stored)
        assert history[0].document.weights[0].factor == 2.5
    finally:
        await pool.close()
