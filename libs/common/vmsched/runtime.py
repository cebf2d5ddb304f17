"""One process's connections (bus, Redis, PostgreSQL) and shared caches, opened once.

`vmsched run SERVICE` opens a Runtime for one service; `vmsched up` opens one Runtime and starts
every service on it, so they share the connections and the cluster-state cache.

The services consume only while the servers they need answer (`consume_while_ready`): while Redis is
away a process cancels its consumers, so RabbitMQ hands the requests to other instances (or keeps
them queued) instead of this one failing them, and consumes again once Redis answers. PostgreSQL is
not such a server: the policy caches decide with the policies they read last while it is away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from vmsched.bus import Bus, connect
from vmsched.db import connect as connect_pg
from vmsched.db.pool import unavailable as postgres_unavailable
from vmsched.errors import DatabaseUnavailable
from vmsched.health import Check, run_checks
from vmsched.logging import get_logger
from vmsched.policy_cache import PolicyStoreWatch
from vmsched.reach import TlsFiles
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import StateCache
from vmsched.store.catalogues import instance_id
from vmsched.store.generations import GenerationMarkers
from vmsched.store.redis import connect as connect_redis
from vmsched.store.redis import ping as ping_redis
from vmsched.store.redis import unavailable as redis_unavailable
from vmsched.store.redis_failures import check_at_start as check_redis_at_start

if TYPE_CHECKING:
    import asyncpg


#: How often a background task that has not stopped yet is cancelled again while closing.
RECANCEL_INTERVAL_S = 0.2
#: Readiness checks whose failure leaves a process ready, and consuming: it works without them for a
#: while (the policy caches serve the policies they read last; policy-admin answers that PostgreSQL is away).
DEGRADING_CHECKS = frozenset({"postgres"})
#: Checks that do not decide consuming: with the broker away there is nothing to consume, and the
#: robust connection restores the consumers itself.
NOT_GATING_CHECKS = frozenset({"bus", *DEGRADING_CHECKS})

log = get_logger("vmsched.runtime")


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until every one has ended.

    One cancel is not always enough: on Python 3.11 a cancellation that arrives while redis-py is
    inside asyncio.wait_for can be swallowed (see vmsched.store._aio), and a periodic loop would
    then run on forever and hang the shutdown. So the cancel is repeated until the task is done.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_INTERVAL_S)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()  # retrieved, so asyncio does not warn it was never read


@dataclass(kw_only=True)
class BusRuntime:
    """A process's bus alone, for a service that holds no state and reads no server but RabbitMQ
    (the api service: every answer comes over the bus). `vmsched run api` opens one of these, not a
    Runtime, so it never connects to Redis or PostgreSQL; `vmsched up` gives it the shared Runtime,
    a BusRuntime with Redis and PostgreSQL besides."""

    settings: Settings
    bus: Bus
    #: Named in the log line and the resync request when this process finds that Redis forgot.
    service: str = "vmsched"
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def open(cls, settings: Settings, service: str = "vmsched", bus: Bus | None = None) -> BusRuntime:
        bus = bus or connect(settings, service)
        await bus.start()
        return cls(settings=settings, bus=bus, service=service)

    def readiness_checks(self) -> dict[str, Check]:
        """What /readyz checks: the bus."""
        return {"bus": self._check_bus}

    async def _check_bus(self) -> None:
        if not self.bus.is_open():
            raise ConnectionError("the bus is not connected to the broker")

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a service's background loop (a periodic balancer or HA check); close() cancels it."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    async def close(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks.clear()
        await self.bus.close()


@dataclass(kw_only=True)
class Runtime(BusRuntime):
    """A service's servers: the bus (BusRuntime's), Redis, and PostgreSQL opened on first use."""

    redis: aioredis.Redis
    state: StateCache
    #: Set by what reads PostgreSQL (vmsched.policy_cache), which opens the pool only on first use:
    #: readiness checks PostgreSQL from the start in a process that will need it, and only there.
    uses_postgres: bool = False
    #: Whether PostgreSQL answered the policy caches of this process (vmsched.policy_cache).
    policy_watch: PolicyStoreWatch = field(init=False)
    _pg: asyncpg.Pool | None = None
    _pg_opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: This process among its services' instances: its unit catalogue is announced under it, and a
    #: worker refusing a policy it lacks units of names itself with it.
    instance: str = field(default_factory=instance_id)
    _recovery: Recovery | None = None

    def __post_init__(self) -> None:
        self.policy_watch = PolicyStoreWatch(self.settings.readiness_interval_s)

    @classmethod
    async def open(cls, settings: Settings, service: str = "vmsched", bus: Bus | None = None) -> Runtime:
        bus = bus or connect(settings, service)
        # A server away is transient, and is named in the answer when the attempts run out.
        bus.recognise(redis_unavailable, postgres_unavailable)
        await bus.start()
        redis = connect_redis(settings)
        try:
            # Redis refusing this process (password, rights, TLS, another server there) stops the start;
            # Redis merely away does not: the process waits for it without consuming.
            away = await check_redis_at_start(redis, settings)
        except BaseException:
            await redis.aclose()
            await bus.close()
            raise
        if away is not None:
            log.warning("Redis does not answer yet; not consuming until it does", error=str(away))
        return cls(settings=settings, bus=bus, redis=redis, state=StateCache(redis, settings), service=service)

    async def check_postgres_at_start(self) -> None:
        """Open the PostgreSQL pool once, if this process uses it: PostgreSQL refusing it (password,
        rights, TLS, another server there) stops the start; PostgreSQL away does not (the policy caches
        wait for it)."""
        if not self.uses_postgres:
            return
        try:
            await self.postgres()
        except DatabaseUnavailable as exc:
            if exc.needs_action:
                raise
            log.warning("PostgreSQL does not answer yet", error=str(exc))

    @property
    def recovery(self) -> Recovery:
        """The `recover` hook of this process's stores (vmsched.recovery): a new generation from
        PostgreSQL when Redis forgot a cluster. PostgreSQL is opened only when that happens."""
        if self._recovery is None:
            self._recovery = Recovery(
                GenerationMarkers(self.redis, self.settings), self._postgres_pool, self.bus, found_by=self.service
            )
        return self._recovery

    async def _postgres_pool(self) -> object:
        return await self.postgres()

    async def postgres(self) -> asyncpg.Pool:
        """The PostgreSQL pool, opened on first use (the services with a policy cache need it)."""
        if self._pg is None:
            # A first request and a readiness probe may both open it: one pool, not two.
            async with self._pg_opening:
                if self._pg is None:
                    tls = TlsFiles.of(self.settings, "postgres")
                    self._pg = await connect_pg(self.settings.postgres_url, tls=tls)
        return self._pg

    def readiness_checks(self) -> dict[str, Check]:
        """What /readyz checks (vmsched.health): the bus, Redis, and PostgreSQL if this process uses it."""
        checks: dict[str, Check] = {**super().readiness_checks(), "redis": self._check_redis}
        if self.uses_postgres:
            checks["postgres"] = self._check_postgres
        return checks

    async def _check_redis(self) -> None:
        await ping_redis(self.redis)

    async def _check_postgres(self) -> None:
        pool = await self.postgres()
        if await pool.fetchval("SELECT 1") != 1:
            raise ConnectionError("PostgreSQL did not answer SELECT 1 with 1")

    async def gate_consuming(self) -> bool:
        """Pause the bus's consumers if a gating readiness check fails (Redis away), resume them once
        every one passes; one log line each way. True when consuming afterwards."""
        checks = {n: c for n, c in self.readiness_checks().items() if n not in NOT_GATING_CHECKS}
        results = await run_checks(checks, self.settings.health_timeout_s)
        failing = {name: r.get("error", "") for name, r in results.items() if not r["ok"]}
        if failing and not self.bus.paused:
            await self.bus.pause_consuming()
            log.warning("stopped consuming: a server this process needs is away", away=failing)
        elif not failing and self.bus.paused and await self.bus.resume_consuming():
            log.info("consuming: every server this process needs answers")
        return not self.bus.paused

    async def consume_while_ready(self) -> None:
        """gate_consuming every VMSCHED_READINESS_INTERVAL_S until cancelled (the runner spawns it)."""
        while True:
            await asyncio.sleep(self.settings.readiness_interval_s)
            await self.gate_consuming()

    async def close(self) -> None:
        await super().close()
        if self._pg is not None:
            await self._pg.close()
            self._pg = None
        await self.redis.aclose()
