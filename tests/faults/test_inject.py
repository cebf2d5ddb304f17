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

from vmsched.chaos.inject import close_broker_connections, kill_redis_clients, redis_port
from vmsched.procs import ServiceProcess, local_ports
from vmsched.settings import Settings
from vmsched.store.redis import connect

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
