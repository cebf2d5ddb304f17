"""One way to open the Redis client every service shares: one server, Sentinel or Redis Cluster."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, ClusterDownError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vmsched.errors import RedisUnavailable
from vmsched.reach import TlsFiles
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
    """A client for the configured Redis (no I/O happens until the first command): one server at
    `settings.redis_url`, the master the sentinels of `settings.redis_sentinels` name, or a Redis
    Cluster reached through the node at `settings.redis_url` (`settings.redis_cluster`).

    Responses are bytes (decode_responses=False): stored JSON goes straight to pydantic.
    Commands are retried on connection errors and timeouts with jittered exponential backoff
    (redis.asyncio.retry.Retry, not redis.retry.Retry: the sync one is not awaited). Every Lua
    script of vmsched.store is written to be safe to run twice for exactly this reason.
    """
    if settings.redis_sentinels and settings.redis_cluster:
        raise ValueError("VMSCHED_REDIS_SENTINELS and VMSCHED_REDIS_CLUSTER exclude each other")
    options = _options(max_connections) | tls_options(settings)
    if settings.redis_sentinels:
        return _sentinel_master(settings, options)
    if settings.redis_cluster:
        return _cluster(settings, options)
    return aioredis.Redis.from_url(settings.redis_url, **options)


def tls_options(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS options when redis_url is rediss:// (the master, the sentinels and every cluster
    node then speak TLS), else none. The URL's scheme turns TLS on for one server and a cluster; a
    sentinel-found master is told by `ssl`."""
    if not settings.redis_url.startswith("rediss:"):
        return {}
    return TlsFiles.of(settings, "redis").redis_options()


def sentinel_addresses(sentinels: str) -> list[tuple[str, int]]:
    """`host:port,host:port` as (host, port) pairs (IPv6 hosts in brackets: `[::1]:26379`)."""
    out = addresses(sentinels, "VMSCHED_REDIS_SENTINELS")
    if not out:
        raise ValueError("VMSCHED_REDIS_SENTINELS names no sentinel")
    return out


def addresses(text: str, setting: str) -> list[tuple[str, int]]:
    """A comma-separated list of host:port as (host, port) pairs; `setting` names it in errors."""
    out: list[tuple[str, int]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{setting}: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    return out


def _options(max_connections: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {
        "decode_responses": False,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "socket_timeout": 5.0,
        "socket_connect_timeout": 5.0,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), retries=3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    return options


def _sentinel_master(settings: Settings, options: dict[str, Any]) -> aioredis.Redis:
    """The master of `redis_sentinel_master` as the sentinels name it, asked again whenever a
    connection is made. After a failover the old master's connections fail (or answer READONLY,
    which redis-py turns into a connection error) and the retry reconnects to the new master;
    while no master is elected the sentinels answer none (MasterNotFoundError, a ConnectionError,
    so retried too, then raised as a transient failure)."""
    url = urlsplit(settings.redis_url)
    master: dict[str, Any] = {
        "db": int(url.path.lstrip("/") or 0),
        "username": unquote(url.username) if url.username else None,
        "password": unquote(url.password) if url.password else None,
    }
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
    if settings.redis_sentinel_password:
        sentinel_kwargs["password"] = settings.redis_sentinel_password
    tls = tls_options(settings)
    if tls:
        sentinel_kwargs |= {"ssl": True, **tls}
        master["ssl"] = True
    addresses = sentinel_addresses(settings.redis_sentinels)
    sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: aioredis.Redis = sentinel.master_for(settings.redis_sentinel_master, **options, **master)
    return client


def pipelines_scripts(client: aioredis.Redis) -> bool:
    """Whether `client` sends EVALSHA in a pipeline: redis-py refuses it on a Redis Cluster client
    (RedisClusterException, "Calling pipelined function evalsha is blocked"), so there the scripts
    go one command each."""
    return not isinstance(client, RedisCluster)


def _cluster(settings: Settings, options: dict[str, Any]) -> aioredis.Redis:
    """A Redis Cluster client. Typed as a Redis: vmsched.store uses only commands RedisCluster has
    too (one slot per script, transaction or MGET, the keys' hash tags see to that), and the
    integration tests run the stores over a real cluster."""
    nodes = [
        ClusterNode(host, port) for host, port in addresses(settings.redis_cluster_nodes, "VMSCHED_REDIS_CLUSTER_NODES")
    ]
    client = RedisCluster.from_url(settings.redis_url, startup_nodes=nodes, **options)
    return cast(aioredis.Redis, client)
