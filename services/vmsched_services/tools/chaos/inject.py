"""Fault injection that touches only the experiment's own processes.

The broker and Redis are shared (other clusters, other test runs): a connection is closed or a
Redis client killed only when its peer port is one of the experiment's own child processes' local
ports (read from /proc, vmsched_services.tools.procs.local_ports), and, for the broker, when its connection name
is `vmsched-<service>` too. Nothing here closes "all connections" or kills "all clients".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from vmsched.errors import InjectionError
from vmsched.settings import Settings
from vmsched.store.redis import connect
from vmsched_services.tools.procs import ServiceProcess, local_ports

#: Bound on one rabbitmqctl call (the CLI boots an Erlang VM: a second or two on a small machine).
RABBITMQCTL_TIMEOUT_S = 30.0

_CONNECTION_NAME = re.compile(r'\{"connection_name","([^"]*)"\}')


async def run_tool(*argv: str, timeout: float = RABBITMQCTL_TIMEOUT_S) -> str:
    """Run a command line tool; its stdout, or InjectionError with its stderr."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
        )
    except OSError as exc:
        raise InjectionError(f"{argv[0]} cannot be run: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise InjectionError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        raise InjectionError(f"{' '.join(argv)} failed ({proc.returncode}): {err.decode(errors='replace')[-500:]}")
    return out.decode(errors="replace")


@dataclass(frozen=True)
class BrokerConnection:
    pid: str  # the broker's Erlang pid of the connection, what close_connection takes
    peer_port: int
    name: str  # the client's connection_name property


async def broker_connections() -> list[BrokerConnection]:
    out = await run_tool("rabbitmqctl", "-q", "list_connections", "pid", "peer_port", "client_properties")
    conns: list[BrokerConnection] = []
    for line in out.splitlines():
        cols = line.split("\t")
        if len(cols) < 3 or not cols[1].strip().isdigit():
            continue  # the header line
        m = _CONNECTION_NAME.search(cols[2])
        conns.append(BrokerConnection(cols[0].strip(), int(cols[1]), m.group(1) if m else ""))
    return conns


def amqp_port(settings: Settings) -> int:
    return urlsplit(settings.amqp_url).port or 5672


def redis_port(settings: Settings) -> int:
    return urlsplit(settings.redis_url).port or 6379


async def close_broker_connections(settings: Settings, procs: Iterable[ServiceProcess]) -> int:
    """Close, on the broker, every connection of these processes named vmsched-<service> (all at
    once); returns how many."""
    own: dict[int, ServiceProcess] = {}
    for p in procs:
        if p.alive:
            for port in local_ports(p.pid, amqp_port(settings)):
                own[port] = p
    targets = [
        conn
        for conn in await broker_connections()
        if conn.peer_port in own and conn.name == f"vmsched-{own[conn.peer_port].name}"  # else: not ours
    ]

    async def close(conn: BrokerConnection) -> bool:
        try:
            await run_tool("rabbitmqctl", "-q", "close_connection", conn.pid, "vmsched fault suite: broker drop")
        except InjectionError:
            return False  # it went away by itself meanwhile
        return True

    # All at once: one after the other, the first would have reconnected before the last is closed.
    return sum(await asyncio.gather(*(close(conn) for conn in targets)))


async def kill_redis_clients(settings: Settings, procs: Iterable[ServiceProcess]) -> int:
    """CLIENT KILL, one by one, the Redis connections of these processes (by their address); returns how many."""

    ports = set()
    for p in procs:
        if p.alive:
            ports |= local_ports(p.pid, redis_port(settings))
    redis = connect(settings)
    killed = 0
    try:
        # redis-py leaves execute_command untyped.
        raw = await redis.execute_command("CLIENT", "LIST")  # type: ignore[no-untyped-call]
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            addr = fields.get("addr", "")
            host, _, port = addr.rpartition(":")
            if port.isdigit() and int(port) in ports and host in ("127.0.0.1", "::1", "[::1]"):
                reply = await redis.execute_command("CLIENT", "KILL", "ADDR", addr, "SKIPME", "yes")  # type: ignore[no-untyped-call]
                killed += int(reply or 0)
    finally:
        await redis.aclose()
    return killed


async def restart_broker_app(down_s: float = 2.0) -> None:
    """`rabbitmqctl stop_app`, a pause, `rabbitmqctl start_app`. Disturbs every broker client on the
    machine: only the long broker_drop experiment does it, never the short suite."""
    await run_tool("rabbitmqctl", "-q", "stop_app", timeout=120)
    try:
        await asyncio.sleep(down_s)
    finally:
        await run_tool("rabbitmqctl", "-q", "start_app", timeout=120)
    await run_tool("rabbitmqctl", "-q", "await_startup", timeout=120)


async def queue_depths(settings: Settings) -> dict[str, tuple[int, int, int]]:
    """(ready, unacknowledged, consumers) of the experiment's queues, by name without the prefix."""
    out = await run_tool(
        "rabbitmqctl", "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers"
    )
    depths: dict[str, tuple[int, int, int]] = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) == 4 and cols[0].startswith(settings.amqp_prefix) and all(x.isdigit() for x in cols[1:]):
            depths[cols[0][len(settings.amqp_prefix) :]] = (int(cols[1]), int(cols[2]), int(cols[3]))
    return depths


__all__ = [
    "BrokerConnection",
    "broker_connections",
    "close_broker_connections",
    "kill_redis_clients",
    "queue_depths",
    "restart_broker_app",
]
