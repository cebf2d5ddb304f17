"""Connections to PostgreSQL: the pool the services use and single connections for administration.

Both map the driver's failures to vmsched errors (DatabaseUnavailable, DatabaseMissing) that name the
server and say what to do, so a caller never has to know asyncpg's exception classes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from uuid import UUID

import asyncpg
from asyncpg import exceptions as pg_errors

from vmsched.db.failures import diagnose
from vmsched.errors import DatabaseMissing, DatabaseUnavailable, PolicyStoreUnavailable
from vmsched.reach.tls import TlsFiles, postgres_context

# asyncpg ships no type information: connections and records are Any to mypy.
Connection = Any
Record = Any


async def init_connection(conn: Connection) -> None:
    """jsonb as Python objects (asyncpg passes text otherwise), uuid as the stdlib UUID class."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    # asyncpg's own UUID subclass would leak into Policy objects and their consumers.
    await conn.set_type_codec("uuid", encoder=str, decoder=UUID, schema="pg_catalog")


#: What the driver raises when it cannot get a connection at all (TimeoutError: no answer in time).
_UNREACHABLE = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


#: What the driver raises while the server is away, starting, shutting down or out of connections.
_AWAY = (
    pg_errors.PostgresConnectionError,  # ConnectionDoesNotExistError, ConnectionFailureError, ...
    pg_errors.CannotConnectNowError,
    pg_errors.AdminShutdownError,
    pg_errors.CrashShutdownError,
    pg_errors.TooManyConnectionsError,
)

#: What every policy_store_unavailable message ends with: what the reader can do.
AWAY_HINT = "start PostgreSQL (or point VMSCHED_POSTGRES_URL at a running one) and send it again"


def unavailable(exc: BaseException, *, io: bool = False) -> PolicyStoreUnavailable | None:
    """`exc` said as PolicyStoreUnavailable when it is the driver's (or the pool's) word that
    PostgreSQL is away, else None. With `io` (the caller knows `exc` came out of a PostgreSQL read or
    write) OSError and TimeoutError count too: a refused connection, a pool acquire or query that timed
    out. The text names no host: it goes back to callers; the service log has the error."""
    if isinstance(exc, PolicyStoreUnavailable):
        return exc
    if isinstance(exc, DatabaseMissing):
        return None
    if isinstance(exc, (*_AWAY, DatabaseUnavailable)) or (io and isinstance(exc, OSError | TimeoutError)):
        return PolicyStoreUnavailable(
            f"PostgreSQL, which keeps the policies, cannot be reached ({type(exc).__name__}); {AWAY_HINT}"
        )
    return None


#: Bound on opening one connection: a server that never answers (another kind of server at the
#: address, a firewall dropping packets) is named within seconds, not asyncpg's default minute.
CONNECT_TIMEOUT_S = 5.0


async def connect(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    tls: TlsFiles | None = None,
    timeout: float = CONNECT_TIMEOUT_S,
) -> asyncpg.Pool:
    """A pool whose connections speak jsonb as Python objects.

    TLS as the URL's sslmode asks, with the certificates of `tls` (VMSCHED_POSTGRES_TLS_*; none: the
    system's CAs). Raises DatabaseUnavailable naming what went wrong (its `kind`: the login refused, TLS,
    nothing listening, another server, away) and what to do, instead of the driver's own exception.
    """
    try:
        return await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, init=init_connection, ssl=_ssl(dsn, tls), timeout=timeout
        )
    except pg_errors.InvalidCatalogNameError as exc:
        raise DatabaseMissing(f"{exc}; run `vmsched db migrate` to create it") from exc
    except _UNREACHABLE as exc:
        raise await _failure(dsn, exc, tls) from exc


async def connect_one(dsn: str, *, tls: TlsFiles | None = None, timeout: float = CONNECT_TIMEOUT_S) -> Connection:
    """One plain connection (migrations, administration); DatabaseUnavailable as for connect(),
    DatabaseMissing when the server answers but the database does not exist."""
    try:
        conn: Connection = await asyncpg.connect(dsn, ssl=_ssl(dsn, tls), timeout=timeout)
    except pg_errors.InvalidCatalogNameError as exc:
        raise DatabaseMissing(f"{exc}; run `vmsched db migrate` to create it") from exc
    except _UNREACHABLE as exc:
        raise await _failure(dsn, exc, tls) from exc
    return conn


def _ssl(dsn: str, tls: TlsFiles | None) -> ssl.SSLContext | None:
    return postgres_context(dsn, tls or TlsFiles(prefix="VMSCHED_POSTGRES_TLS"))


async def _failure(dsn: str, exc: BaseException, tls: TlsFiles | None) -> DatabaseUnavailable:
    # The diagnosis may ask what answers at the address, with blocking sockets: not on the loop.
    return await asyncio.to_thread(diagnose, dsn, exc, tls)


__all__ = [
    "AWAY_HINT",
    "CONNECT_TIMEOUT_S",
    "Connection",
    "Record",
    "connect",
    "connect_one",
    "init_connection",
    "unavailable",
]
