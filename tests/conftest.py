"""Fixtures shared by every test directory.

Each test run is isolated on the shared servers: its own AMQP name prefix, its own Redis key
prefix (in Redis database 15), and its own PostgreSQL database, all removed at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis
import structlog

from tests import servers
from vmsched.client import SchedulerClient
from vmsched.logging import configure
from vmsched.settings import Settings
from vmsched_services.tools.procs import delete_broker_objects, delete_prefixed

if TYPE_CHECKING:
    from vmsched.client import SchedulerClient
    from vmsched_services.tools.procs import ServiceStack

TEST_REDIS_DB = 15


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def server_urls() -> Iterator[servers.Servers]:
    found = servers.resolve()
    yield found
    for c in found.containers:
        c.stop()  # type: ignore[attr-defined]  # a testcontainers container (optional, untyped)


def _with_path(url: str, path: str) -> str:
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, path, p.query, p.fragment))


@pytest.fixture(scope="session", autouse=True)
def quiet_logs() -> None:
    """Services started in-process log at WARNING, like the test settings say."""
    configure("WARNING", "console")


@pytest.fixture(scope="session")
async def settings(run_id: str, server_urls: servers.Servers) -> AsyncIterator[Settings]:
    """Settings for this run: real servers, names and keys no other run shares.

    At the end, the run's exchanges and queues are deleted from the broker.
    """
    cfg = _settings(run_id, server_urls)
    yield cfg
    await delete_broker_objects(cfg)
    # And whatever the run's tests made under prefixes of their own (test-<run>.away-..., dl-q-...).
    await delete_prefixed(cfg, f"test-{run_id}")


def _settings(run_id: str, server_urls: servers.Servers) -> Settings:
    return Settings(
        amqp_url=server_urls.amqp_url,
        # The tests' own user administers (policies, removals, requeues): on the shared broker, the
        # only user there is. tests/integration/test_authorization.py varies the identity.
        admin_users=f"vmsched-admin,{servers.amqp_user(server_urls.amqp_url)}",
        redis_url=_with_path(server_urls.redis_url, f"/{TEST_REDIS_DB}"),
        postgres_url=_with_path(server_urls.postgres_url, f"/vmsched_test_{run_id}"),
        amqp_prefix=f"test-{run_id}.",
        redis_prefix=f"vmsched-test-{run_id}",
        lock_acquire_timeout_s=5.0,
        lock_hold_timeout_s=5.0,
        rpc_timeout_s=5.0,
        pending_ttl_s=30.0,
        pending_wait_s=0.5,
        log_level="WARNING",
    )


@pytest.fixture(scope="session")
async def redis_client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
    yield client
    async for key in client.scan_iter(match=f"{settings.redis_prefix}:*", count=1000):
        await client.delete(key)
    await client.aclose()


@pytest.fixture(scope="session")
async def database(settings: Settings) -> AsyncIterator[str]:
    """A fresh PostgreSQL database for this run (dropped at the end); yields its URL."""

    name = urlsplit(settings.postgres_url).path.lstrip("/")
    admin_url = _with_path(settings.postgres_url, "/postgres")
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    yield settings.postgres_url
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> Callable[[ModuleType], None]:
    """Give a module's `log` a logger not cached yet, so structlog.testing.capture_logs sees its
    lines: a logger cached under an earlier structlog configuration (another test configured it
    again since) keeps writing past the capture, and whether one is depends on test order."""

    def give(module: ModuleType) -> None:
        monkeypatch.setattr(module, "log", structlog.get_logger(module.__name__))

    return give


@pytest.fixture
def unique() -> str:
    """A short id for names a single test owns (cluster ids, host ids)."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
async def client(stack: Settings | ServiceStack) -> AsyncIterator[SchedulerClient]:
    """A SchedulerClient (the engine's side) on the services of the test's `stack`.

    The e2e `stack` is a ServiceStack of processes, whose settings the client shares; a `stack` of
    Settings is services running in this process. Integration tests use their own `client`
    (tests/integration/conftest.py), which puts the client on the module's bus.
    """

    cfg = stack if isinstance(stack, Settings) else stack.settings
    async with SchedulerClient(cfg) as cl:
        yield cl
