"""Fault injection touches only the experiment's own processes (the servers are shared)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import pytest

from vmsched.settings import Settings
from vmsched.store.redis import connect
from vmsched_services.tools.chaos.inject import (
    amqp_port,
    broker_connections,
    close_broker_connections,
    kill_redis_clients,
    redis_port,
    run_tool,
)
from vmsched_services.tools.procs import ServiceProcess, ServiceStack, local_ports

pytestmark = pytest.mark.faults

#: A stand-in for a service child: one AMQP connection named as the selector's, one Redis connection.
CHILD = """
import asyncio, socket, sys, aio_pika
async def main():
    conn = await aio_pika.connect(sys.argv[1], client_properties={"connection_name": "vmsched-selector"})
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    print("ready", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_local_ports_finds_this_process_connection(settings: Settings) -> None:
    host = urlsplit(settings.redis_url).hostname or "127.0.0.1"
    _, writer = await asyncio.open_connection(host, redis_port(settings))
    try:
        port = writer.get_extra_info("sockname")[1]
        assert port in local_ports(os.getpid(), redis_port(settings))
    finally:
        writer.close()
        await writer.wait_closed()
    assert local_ports(2**22 + 12345, redis_port(settings)) == set()  # no such process


async def test_only_the_experiment_childrens_connections_are_dropped(settings: Settings, tmp_path: Path) -> None:
    """The child's connections are closed and killed; this process's connection, named exactly like
    the child's, and its Redis client survive."""
    ours = await aio_pika.connect(settings.amqp_url, client_properties={"connection_name": "vmsched-selector"})
    redis = connect(settings)
    # Popen only forks and execs; the child is read from a thread.
    child = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", CHILD, settings.amqp_url, str(redis_port(settings))],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.strip() == b"ready"
        await redis.ping()
        proc = ServiceProcess("selector", 0, child, tmp_path / "out", tmp_path / "err")
        assert await close_broker_connections(settings, [proc]) == 1
        assert await kill_redis_clients(settings, [proc]) == 1
        assert not ours.is_closed
        ch = await ours.channel()
        await ch.close()
        assert await redis.ping()
    finally:
        child.kill()
        child.wait()
        await ours.close()
        await redis.aclose()


async def test_the_stack_keeps_observing_after_the_broker_closed_its_connection(
    settings: Settings, tmp_path: Path
) -> None:
    """After a broker restart (or a dropped connection) the stack still counts consumers and stops
    its services: its observer connection is this process's own, closed here on the broker."""
    stack = ServiceStack(settings.model_copy(update={"amqp_prefix": f"{settings.amqp_prefix}obs."}), tmp_path)
    try:
        assert await stack.consumers("filter-worker") == 0  # opens the observer connection
        before = set(local_ports(os.getpid(), amqp_port(settings)))
        closed = 0
        for conn in await broker_connections():
            if conn.peer_port in before:  # this process's connections only
                await run_tool("rabbitmqctl", "-q", "close_connection", conn.pid, "test: observer dropped")
                closed += 1
        assert closed >= 1
        await asyncio.sleep(0.5)
        assert await stack.consumers("filter-worker") == 0
    finally:
        await stack.close()
