"""connect(): which Redis client the settings ask for (no I/O happens until the first command)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from vmsched.settings import Settings
from vmsched.store.redis import connect, sentinel_addresses


def test_sentinel_addresses_are_host_port_pairs() -> None:
    assert sentinel_addresses("10.0.0.1:26379, s2:26380,[::1]:26381,") == [
        ("10.0.0.1", 26379),
        ("s2", 26380),
        ("::1", 26381),
    ]


@pytest.mark.parametrize("bad", ["", " , ", "s1", "s1:port", ":26379"])
def test_a_sentinel_list_that_names_no_sentinel_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="VMSCHED_REDIS_SENTINELS"):
        sentinel_addresses(bad)


async def test_with_sentinels_the_client_asks_them_for_the_named_master() -> None:
    client = connect(
        Settings(
            redis_url="redis://:secret@ignored/3",
            redis_sentinels="127.0.0.1:1,127.0.0.1:2",
            redis_sentinel_master="m1",
        )
    )
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "m1"
        assert pool.connection_kwargs["db"] == 3
        assert pool.connection_kwargs["password"] == "secret"
    finally:
        await client.aclose()


async def test_without_sentinels_or_cluster_the_client_is_one_server() -> None:
    client = connect(Settings(redis_url="redis://127.0.0.1:1/0"))
    try:
        assert type(client) is aioredis.Redis
        assert not isinstance(client.connection_pool, SentinelConnectionPool)
    finally:
        await client.aclose()


async def test_cluster_mode_builds_a_cluster_client_starting_from_every_node_named() -> None:
    client = connect(
        Settings(redis_url="redis://127.0.0.1:1/0", redis_cluster=True, redis_cluster_nodes="127.0.0.1:2, 127.0.0.1:3")
    )
    try:
        assert isinstance(client, RedisCluster)
        assert set(client.nodes_manager.startup_nodes) == {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
    finally:
        await client.aclose()


def test_sentinels_and_cluster_together_are_refused() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        connect(Settings(redis_sentinels="127.0.0.1:1", redis_cluster=True))
