"""One way to open the Redis client every service shares."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, ClusterDownError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vmsched.errors import RedisUnavailable
from vmsched.settings import Settings

#: Seconds a pooled connection may sit idle before it is PINGed before use: catches connections a
#: server restart or a NAT timeout silently dropped, instead of failing the next command.
HEALTH_CHECK_INTERVAL_S = 30


def text(raw: bytes | str) -> str:
    """A Redis reply as text: the client returns bytes (decode_responses=False)."""
    return raw.decode() if isinstance(raw, bytes) else raw


async def ping(client: aioredis.Redis) -> None:
    """Raise unless Redis answers PING (readiness)."""
    if not await client.ping():
        raise ConnectionError("Redis did not answer PING with PONG")


#: What the client raises while Redis is away, restarting (BusyLoadingError is a ConnectionError), or
#: in the middle of a fail-over (a replica refusing writes, a cluster slot moving): each passes.
_AWAY = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, ClusterDownError, TryAgainError)
#: Connection errors that do not pass by themselves: wrong credentials or permissions.
_REFUSED = (AuthenticationError, AuthorizationError)


def unavailable(exc: BaseException) -> RedisUnavailable | None:
    """`exc` said as RedisUnavailable when it is the client's word that Redis is away, else None.

    The bus's dispatcher asks this (vmsched.runtime hands it over) so a Redis outage is retried as
    transient and, when the attempts run out, answered `redis_unavailable` instead of `internal`.
    The text names neither host nor port: it goes back to callers; the service log has the error.
    """
    if isinstance(exc, _AWAY) and not isinstance(exc, _REFUSED):
        return RedisUnavailable(f"Redis cannot be reached ({type(exc).__name__}); send the request again later")
    return None


def connect(settings: Settings, *, max_connections: int | None = None) -> aioredis.Redis:
    """A client for `settings.redis_url` (no I/O happens until the first command).

    Responses are bytes (decode_responses=False): stored JSON goes straight to pydantic.
    Commands are retried on connection errors and timeouts with jittered exponential backoff
    (redis.asyncio.retry.Retry, not redis.retry.Retry: the sync one is not awaited). Every Lua
    script of vmsched.store is written to be safe to run twice for exactly this reason.
    """
    return aioredis.Redis.from_url(
        settings.redis_url,
        decode_responses=False,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        socket_timeout=5.0,
        socket_connect_timeout=5.0,
        retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        max_connections=max_connections,
    )
