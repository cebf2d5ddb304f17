"""The PostgreSQL roles of `vmsched security`, applied to a private server after the migrations.

(The server trusts loopback connections: what is tested here is what each role may do once
connected; password authentication is tested with the secrets, tests/e2e/test_secrets.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from vmsched.db import migrate
from vmsched.db.generations import GenerationLedger
from vmsched_services.tools.security import apply, postgres_roles
from vmsched_services.tools.security.roles import SERVICE_ROLES, pg_role_name
from vmsched_services.tools.servers.postgres import PrivatePostgres

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PASSWORDS = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in SERVICE_ROLES}


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PrivatePostgres]:
    directory = tmp_path_factory.mktemp("pg-roles")
    pg = PrivatePostgres(directory / "pg")
    await pg.start()
    try:
        await migrate(pg.dsn)
        sql = directory / "roles.sql"
        sql.write_text(postgres_roles.roles_sql(PASSWORDS))
        await apply.postgres_roles(pg.dsn, sql)
        await apply.postgres_roles(pg.dsn, sql)  # applying again changes nothing and fails nothing
        yield pg
    finally:
        await pg.stop()
        pg.remove()


def as_role(server: PrivatePostgres, role: str) -> str:
    return server.dsn.replace("postgres@", f"{pg_role_name(role)}@", 1)


@pytest.mark.parametrize("role", SERVICE_ROLES)
async def test_every_service_reads_policies_and_keeps_the_generation_ledger(server: PrivatePostgres, role: str) -> None:
    pool = await asyncpg.create_pool(as_role(server, role), min_size=1, max_size=1)
    try:
        assert await pool.fetchval("SELECT count(*) FROM policy") > 0
        ledger = GenerationLedger(pool, f"roles-{role}")
        first = await ledger.advance("c1")
        assert (await ledger.advance("c1")).generation == first.generation + 1
    finally:
        await pool.close()


@pytest.mark.parametrize("role", [r for r in SERVICE_ROLES if r != "policy-admin"])
async def test_only_policy_admin_writes_policies(server: PrivatePostgres, role: str) -> None:
    conn = await asyncpg.connect(as_role(server, role))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM cluster_policy")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE policy SET description = 'x'")
    finally:
        await conn.close()


async def test_policy_admin_writes_policies_but_neither_the_migrations_record_nor_past_audit(
    server: PrivatePostgres,
) -> None:
    conn = await asyncpg.connect(as_role(server, "policy-admin"))
    try:
        async with conn.transaction():
            await conn.execute("UPDATE policy SET description = description")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM schema_migrations")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE TABLE intruder (x int)")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM audit_log")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE audit_log SET actor = 'someone else'")
    finally:
        await conn.close()


def test_the_roles_sql_holds_no_clear_password(tmp_path: Path) -> None:
    sql = postgres_roles.roles_sql(PASSWORDS)
    assert not [p for p in PASSWORDS.values() if p in sql]
    assert sql.count("SCRAM-SHA-256$4096:") == len(SERVICE_ROLES)
