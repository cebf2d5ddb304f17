"""The services a replay over the bus talks to: those already running are used as they are, the
others run in this process for as long as the replay."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aio_pika

from vmsched.client import SchedulerClient
from vmsched.db import migrate
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched.store import DecisionStore, PendingStore, StateCache
from vmsched.store.redis import connect as connect_redis
from vmsched_services.runner import run as run_services
from vmsched_services.tools.procs import consumer_count


def needed_services(settings: Settings) -> list[str]:
    """The services a replay talks to, in start order: the tracker takes the reports, the selector
    decides with the filter-workers (and the weigher, when it weighs through one), policy-admin
    stores the run's policy."""
    names = ["state-tracker", "filter-worker", "selector", "policy-admin"]
    if not settings.place_in_worker:
        names.insert(1, "weigher")
    return names


@dataclass
class Services:
    """What a replay talks to: the bus (as the engine, and as the policy administrator) and Redis."""

    settings: Settings
    client: SchedulerClient
    admin: PolicyClient
    pending: PendingStore
    decisions: DecisionStore
    #: The cluster state in Redis, read directly (what the tracker has applied).
    state: StateCache
    #: The services this process started (those no process was serving).
    started: list[str]


async def running_services(settings: Settings, names: Sequence[str]) -> list[str]:
    """Those of `names` with a consumer on their RPC queue (running somewhere)."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        return [n for n in names if await consumer_count(conn, settings, n) > 0]
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def services(settings: Settings) -> AsyncIterator[Services]:
    """The bus, Redis and the services a replay needs. Those no process serves yet run in this one
    until the block ends (as `vmsched demo` runs them); those that do are used as they are, so a
    second state tracker never splits the reports of a cluster with the running one.

    A server that does not answer raises the library's error for it (BusUnavailable, Redis's
    ConnectionError, DatabaseUnavailable), which the CLI says in a sentence.
    """
    async with SchedulerClient(settings) as client:
        redis = connect_redis(settings)
        try:
            await redis.ping()
            needed = needed_services(settings)
            running = await running_services(settings, needed)
            missing = [n for n in needed if n not in running]
            stop = asyncio.Event()
            task = await _start(missing, settings, stop) if missing else None
            try:
                admin = PolicyClient(settings, bus=client.bus)
                stores = PendingStore(redis, settings), DecisionStore(redis, settings), StateCache(redis, settings)
                yield Services(settings, client, admin, *stores, missing)
            finally:
                stop.set()
                if task is not None:
                    await task
        finally:
            await redis.aclose()


async def _start(names: list[str], settings: Settings, stop: asyncio.Event) -> asyncio.Task[None]:
    await migrate(settings.postgres_url)  # the selector reads policies; idempotent
    quiet = settings.model_copy(
        update={
            # They share the command's terminal: warnings only, as readable lines.
            "log_level": "WARNING",
            "log_format": "console",
            # A metrics port is the running services' (`vmsched up`), not this command's.
            "metrics_port": 0,
            # The simulated engine never waits for pending resources to free (it has none but its
            # migrations'): an unplaceable VM is answered at once instead of after a bounded wait.
            "pending_wait_s": 0.0,
            # The command attaches its policy to its clusters and removes them after: the services
            # it runs itself take its own user (whoever runs the whole stack) as an administrator.
            # Services already running elsewhere decide for themselves (VMSCHED_ADMIN_USERS).
            "admin_users": ",".join(filter(None, (settings.admin_users, settings.amqp_user or "guest"))),
        }
    )
    ready = asyncio.Event()
    task = asyncio.create_task(run_services(names, quiet, stop=stop, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises why the services could not start
    # The runner stops the services on Ctrl-C; the command is what should stop (exit 130).
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    return task


__all__ = ["Services", "needed_services", "running_services", "services"]
