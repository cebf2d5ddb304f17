"""Connections to PostgreSQL: the pool the services use and single connections for administration.

Both map the driver's failures to vmsched errors (DatabaseUnavailable, DatabaseMissing) that name the
server and say what to do, so a caller never has to know asyncpg's exception classes.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import asyncpg
from asyncpg import exceptions as pg_errors

from vmsched.errors import DatabaseMissing, DatabaseUnavailable

# asyncpg ships no type information: connections and records are Any to mypy.
Connection = Any
Record = Any


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


__all__ = ["Connection", "Record", "connect", "connect_one", "init_connection"]
