"""Schema migrations and built-in rows: `await migrate(dsn)` brings a database up to the code.

Steps: create the database if missing; take a session advisory lock so concurrent migrators (several
services starting at once) run one after another; apply every `migrations/NNNN_name.sql` not yet
recorded in schema_migrations, each in its own transaction; then write the registry's units and the
built-in policies (vmsched.db.catalogue.seed_builtins), touching only rows that differ. A second run
applies nothing and changes no row.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Final
from urllib.parse import unquote, urlsplit, urlunsplit

from asyncpg import exceptions as pg_errors

from vmsched.db.catalogue import seed_builtins
from vmsched.db.pool import Connection, connect_one, init_connection
from vmsched.errors import DatabaseMissing, MigrationError
from vmsched.reach.tls import TlsFiles
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.scheduling.units.registry import REGISTRY

#: pg_advisory_lock key shared by every migrator ("vmsched" in ASCII); only its constancy matters.
MIGRATION_LOCK_KEY: Final = 0x766D_7363_6865_64
_FILE_NAME: Final = re.compile(r"^(\d{4}_[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The packaged migration files, in version order."""
    found: list[Migration] = []
    for item in (files("vmsched.db") / "migrations").iterdir():
        match = _FILE_NAME.match(item.name)
        if match is not None:
            found.append(Migration(match.group(1), item.read_text(encoding="utf-8")))
        elif item.name.endswith(".sql"):
            raise MigrationError(f"migration file {item.name} is not named NNNN_name.sql")
    return sorted(found, key=lambda m: m.version)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def ensure_database(dsn: str, *, tls: TlsFiles | None = None) -> bool:
    """Create the database the DSN names when it does not exist; True if this call created it."""
    try:
        conn = await connect_one(dsn, tls=tls)
    except DatabaseMissing:
        pass
    else:
        await conn.close()
        return False
    parts = urlsplit(dsn)
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise MigrationError("the database URL names no database to create", location="dsn")
    admin = await connect_one(urlunsplit(parts._replace(path="/postgres")), tls=tls)
    try:
        # Advisory locks are per database: every creator locks in 'postgres', so they serialize.
        await admin.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            if await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                return False
            try:
                await admin.execute(f"CREATE DATABASE {_quote_ident(name)}")
            except pg_errors.DuplicateDatabaseError:
                return False  # created by a process that does not take our lock
            return True
        finally:
            await admin.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await admin.close()


async def _apply(conn: Connection, migrations: list[Migration]) -> list[str]:
    await conn.execute(
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version    text PRIMARY KEY,
               checksum   text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now()
           )"""
    )
    done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
    applied: list[str] = []
    for m in migrations:
        if m.version in done:
            if done[m.version] != m.checksum:
                # An applied migration was edited: the database no longer matches what the file says.
                raise MigrationError(f"migration {m.version} changed after it was applied; add a new migration instead")
            continue
        async with conn.transaction():
            await conn.execute(m.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)", m.version, m.checksum
            )
        applied.append(m.version)
    return applied


async def migrate(dsn: str, *, registry: Mapping[str, PolicyUnit] = REGISTRY, tls: TlsFiles | None = None) -> list[str]:
    """Create, migrate and seed the database; returns the versions this call applied. `tls`: the
    certificates for a URL that asks for TLS (VMSCHED_POSTGRES_TLS_*)."""
    migrations = load_migrations()
    await ensure_database(dsn, tls=tls)
    conn = await connect_one(dsn, tls=tls)
    try:
        await init_connection(conn)
        # Session-level: held across the per-migration transactions; released by unlock or on close.
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            applied = await _apply(conn, migrations)
            await seed_builtins(conn, registry)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()
    return applied


__all__ = [
    "MIGRATION_LOCK_KEY",
    "Migration",
    "MigrationError",
    "ensure_database",
    "load_migrations",
    "migrate",
]
