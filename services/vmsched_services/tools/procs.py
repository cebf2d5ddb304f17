"""Start vmsched services as child processes and wait until they consume (bench, tests, tools).

Readiness is observed from the broker, not guessed from sleeps: a service is ready when its RPC
queue has one more consumer than before it started. `Supervisor` starts and stops a set of
services; `ServiceStack` (the end-to-end tests and the fault suite, vmsched_services.tools.chaos) can also freeze,
kill and restart one, and tell what a process holds (its sockets, its memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aio_pika

from vmsched import constants as c
from vmsched.scheduling.units import BUILTIN_UNITS, REGISTRY
from vmsched.settings import Settings
from vmsched.store.catalogues import catalogue_hash, units_of
from vmsched_services import SERVICES

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

#: The RPC queue whose consumer count shows a service is up (a service serving several consumes
#: this one last, so it shows all are up), and where its requests wait.
READY_ROUTE = {
    "state-tracker": c.RPC_STATE,
    "filter-worker": c.RPC_PLACE,
    "weigher": c.RPC_WEIGH,
    "selector": c.RPC_SCHEDULE,
    "policy-admin": c.RPC_UNITS_LIST,
}


#: Bound on one observation of the broker (a consumer count) before the observer reconnects.
OBSERVE_TIMEOUT_S = 10.0


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process the same Settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMSCHED_")}
    for name, value in settings.model_dump().items():
        env[f"VMSCHED_{name.upper()}"] = str(value)
    return env


def service_command(service: str) -> list[str]:
    """The command line of a service child process (`vmsched run SERVICE` on this interpreter)."""
    return [sys.executable, "-m", "vmsched_services.tools.cli", "run", service]


def rpc_queue(settings: Settings, service: str) -> str:
    """The RPC queue a service consumes (services without one are not in READY_ROUTE)."""
    return f"{settings.amqp_prefix}{c.RPC_QUEUES[READY_ROUTE[service]]}"


async def consumer_count(conn: AbstractConnection, settings: Settings, service: str) -> int:
    """Consumers on the service's RPC queue, 0 while the queue does not exist yet."""
    ch = await conn.channel()
    try:
        q = await ch.declare_queue(rpc_queue(settings, service), passive=True)
    except Exception:  # no queue yet; the failed declare closed the channel
        return 0
    try:
        return int(q.declaration_result.consumer_count or 0)
    finally:
        with contextlib.suppress(Exception):
            await ch.close()


@dataclass
class Supervisor:
    settings: Settings
    log_dir: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    async def consumers(self, service: str) -> int:
        conn = await aio_pika.connect(self.settings.amqp_url)
        try:
            return await consumer_count(conn, self.settings, service)
        finally:
            await conn.close()

    async def start(self, service: str, *, timeout: float = 30.0, consuming: bool = True) -> subprocess.Popen[bytes]:
        """Start `service` and wait until it consumes its queue (`consuming=False`: return at once,
        for a service that must not consume, its Redis being away)."""
        before = await self.consumers(service)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{service}-{len(self.procs)}.log").open("wb")
        env = {**settings_env(self.settings), **self.extra_env}
        # Popen only forks: it does not wait for the child, so it is safe on the event loop.
        proc = subprocess.Popen(  # noqa: ASYNC220
            service_command(service), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append((service, proc))
        end = time.monotonic() + timeout
        while consuming and await self.consumers(service) <= before:
            if proc.poll() is not None:
                raise RuntimeError(f"{service} exited with {proc.returncode}; see {log.name}")
            if time.monotonic() > end:
                raise TimeoutError(f"{service} did not start consuming within {timeout:g} s; see {log.name}")
            await asyncio.sleep(0.05)
        return proc

    def stop_all(self, grace: float = 5.0) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for _, proc in self.procs:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


#: How long a service may take from exec to consuming (imports dominate on a small machine).
START_TIMEOUT_S = 30.0
#: How long a SIGTERM-ed service gets to exit before it is SIGKILL-ed.
STOP_GRACE_S = 5.0
TAIL_BYTES = 4000


async def _exited(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether the process exits within `timeout` (waited for in a thread, off the event loop)."""
    try:
        await asyncio.to_thread(popen.wait, timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


@dataclass
class ServiceProcess:
    name: str
    index: int
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    frozen: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, nbytes: int = TAIL_BYTES) -> str:
        parts = []
        for path in (self.stdout, self.stderr):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            text = data[-nbytes:].decode(errors="replace").rstrip()
            if text:
                parts.append(f"--- {path.name} (last {min(nbytes, len(data))} bytes) ---\n{text}")
        state = "running" if self.alive else f"exited with {self.popen.returncode}"
        body = "\n".join(parts) if parts else "(no output)"
        return f"=== {self.name}#{self.index} pid {self.pid}: {state}\n{body}"


@dataclass
class ServiceStack:
    settings: Settings
    log_dir: Path
    procs: list[ServiceProcess] = field(default_factory=list)
    _conn: Any = None

    # ------------------------------------------------------------------ environment
    @property
    def env(self) -> dict[str, str]:
        """The environment of a service (or CLI) process: os.environ plus VMSCHED_* for this run."""
        return {**settings_env(self.settings), "PYTHONUNBUFFERED": "1"}

    def queue_name(self, service: str) -> str:
        return rpc_queue(self.settings, service)

    def live(self, service: str) -> list[ServiceProcess]:
        return [p for p in self.procs if p.name == service and p.alive]

    # ------------------------------------------------------------------ broker observations
    async def consumers(self, service: str) -> int:
        """Consumers on the service's RPC queue (0 if the queue does not exist yet)."""

        for attempt in (1, 2):
            try:
                # Bounded: a connection whose reader died (seen once in a fault run, after kills
                # under load) answers no channel open, and an unbounded wait hung the experiment.
                async with asyncio.timeout(OBSERVE_TIMEOUT_S):
                    if self._conn is None or self._conn.is_closed:
                        self._conn = await aio_pika.connect(self.settings.amqp_url)
                    return await consumer_count(self._conn, self.settings, service)
            except (RuntimeError, ConnectionError, TimeoutError, aio_pika.exceptions.AMQPError):
                # The broker closed this observer connection (a broker restart, a fault experiment):
                # it can look open and still refuse channels, or not answer. Once more, on a new one.
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(OBSERVE_TIMEOUT_S):
                            await self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def unacknowledged(self, service: str) -> int | None:
        """Messages delivered from the service's queue but not yet acked, via rabbitmqctl; None if unavailable."""
        try:
            proc = await asyncio.create_subprocess_exec(
                "rabbitmqctl",
                "-q",
                "list_queues",
                "name",
                "messages_unacknowledged",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError:
            return None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None
        if proc.returncode != 0:
            return None
        wanted = self.queue_name(service)
        for line in out.decode(errors="replace").splitlines():
            cols = line.split()
            if len(cols) == 2 and cols[0] == wanted and cols[1].isdigit():
                return int(cols[1])
        return None

    async def _wait_consumers(self, service: str, ok: Any, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not ok(await self.consumers(service)):
            for p in self.procs:
                if (
                    p.name == service
                    and not p.alive
                    and p.popen.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM)
                ):
                    raise RuntimeError(f"{service} exited with {p.popen.returncode}\n{p.tail()}")
            if time.monotonic() > end:
                raise TimeoutError(f"{service}: {what} within {timeout:g} s\n{self.tails()}")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ lifecycle
    def spawn(self, service: str, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """Start one service process without waiting for it (`env`: over the run's environment)."""

        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}")
        index = sum(1 for p in self.procs if p.name == service)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = self.log_dir / f"{service}-{index}.stdout"
        err = self.log_dir / f"{service}-{index}.stderr"
        with out.open("wb") as fo, err.open("wb") as fe:
            # Popen only forks and execs; it does not wait for the child.
            popen = subprocess.Popen(
                service_command(service),
                env={**self.env, **(env or {})},
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        proc = ServiceProcess(service, index, popen, out, err)
        self.procs.append(proc)
        return proc

    async def start(
        self, *services: str, timeout: float = START_TIMEOUT_S, env: Mapping[str, str] | None = None
    ) -> list[ServiceProcess]:
        """Start services (all at once) and wait until every live one consumes its RPC queue."""
        started = [self.spawn(s, env) for s in services]
        # Services without an RPC queue (balancer) show no consumer to wait for: they start async.
        for service in (s for s in dict.fromkeys(services) if s in READY_ROUTE):
            expected = len(self.live(service))
            await self._wait_consumers(
                service, lambda n, e=expected: n >= e, f"fewer than {expected} consumer(s)", timeout
            )
        return started

    def freeze(self, proc: ServiceProcess) -> None:
        """SIGSTOP: the process keeps its connection (and its prefetched messages) but does nothing."""
        os.kill(proc.pid, signal.SIGSTOP)
        proc.frozen = True

    def thaw(self, proc: ServiceProcess) -> None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.frozen = False

    async def kill(self, proc: ServiceProcess, sig: int = signal.SIGKILL, *, timeout: float = STOP_GRACE_S) -> int:
        """Send `sig`, wait for the exit (SIGKILL after `timeout`), and until the broker dropped its consumer."""
        if proc.alive:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(sig)
                if proc.frozen and sig != signal.SIGKILL:
                    self.thaw(proc)  # a stopped process cannot handle SIGTERM
        if not await _exited(proc.popen, timeout):
            proc.popen.kill()
        code = await asyncio.to_thread(proc.popen.wait)
        if proc.name in READY_ROUTE:
            remaining = len(self.live(proc.name))
            await self._wait_consumers(
                proc.name,
                lambda n: n <= remaining,
                f"the broker still counts more than {remaining} consumer(s)",
                timeout,
            )
        return code

    async def stop_all(self) -> None:
        for p in self.procs:
            if p.alive:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGTERM)
                    if p.frozen:
                        self.thaw(p)
        end = time.monotonic() + STOP_GRACE_S
        for p in self.procs:
            if not await _exited(p.popen, max(0.0, end - time.monotonic())):
                p.popen.kill()
            await asyncio.to_thread(p.popen.wait)
        # The next test's readiness check counts consumers: let the broker drop these first.
        for service in {p.name for p in self.procs} & set(READY_ROUTE):
            with contextlib.suppress(TimeoutError):
                await self._wait_consumers(service, lambda n: n == 0, "consumers left", STOP_GRACE_S)

    async def close(self) -> None:
        try:
            await self.stop_all()
        finally:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    def tails(self) -> str:
        return "\n\n".join(p.tail() for p in self.procs) or "(no service processes)"


# ---------------------------------------------------------------------- what a process holds (Linux /proc)
def local_ports(pid: int, remote_port: int) -> set[int]:
    """Local TCP ports of `pid`'s connections to `remote_port` (its AMQP or Redis connections).

    Read from /proc: the process's socket inodes (/proc/PID/fd) matched against the TCP tables of
    its network namespace (/proc/PID/net/tcp and tcp6). The broker and Redis see these ports as
    the client's peer port, which is how the fault suite finds its own processes' connections among
    everybody else's. Empty when the process is gone.
    """
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(cols) < 10 or cols[9] not in inodes:
                continue
            local, remote = cols[1], cols[2]
            if int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def rss_mb(pid: int) -> float | None:
    """The process's resident set size (VmRSS) in MB; None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float | None:
    """CPU time the process has used so far (user + system), in ms; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / _CLOCK_TICKS


def local_server_pids() -> dict[str, int]:
    """The servers vmsched talks to, when they run on this machine (RabbitMQ's Erlang VM, Redis),
    by name: what they spend per decision is part of its cost."""
    wanted = {"beam.smp": "rabbitmq", "redis-server": "redis"}
    found: dict[str, int] = {}
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        name = wanted.get(comm)
        if name is not None and name not in found:  # the oldest: the server, not a helper it forked
            found[name] = int(entry.name)
    return found


async def delete_broker_objects(settings: Settings) -> None:
    """Delete the queues and exchanges under `settings.amqp_prefix` (a test run's or an experiment's)."""

    queues = [*c.RPC_QUEUES.values(), c.STATE_EVENTS_QUEUE, c.ENGINE_EVENTS_QUEUE, c.DEAD_LETTER_QUEUE]
    # The catalogue routes' queues of the processes this machine starts, with plugins and without.
    hashes = {catalogue_hash(units_of(REGISTRY)), catalogue_hash({u.name: u.origin for u in BUILTIN_UNITS})}
    queues += [c.rpc_queue(c.catalogue_route(route, h)) for route in c.CATALOGUE_ROUTES for h in sorted(hashes)]
    exchanges = [*c.RPC_EXCHANGES, c.EVENTS_EXCHANGE, c.DEAD_LETTER_EXCHANGE]
    prefix = settings.amqp_prefix
    await _delete(settings, [prefix + q for q in queues], [prefix + x for x in exchanges])


async def delete_prefixed(settings: Settings, prefix: str) -> int:
    """Delete every queue and exchange whose name starts with `prefix` (a test run's, with every
    sub-prefix its tests made), listed by the local node's rabbitmqctl; how many queues went.

    Each quorum queue is a Raft group of its own: hundreds left behind by runs slow a small
    broker's boot and, past some point, its accepting connections at all. Only where the broker of
    `settings` is the local one (127.0.0.1:5672) and rabbitmqctl answers; 0 otherwise.
    """
    url = urlsplit(settings.amqp_url)
    if not prefix or url.hostname not in ("127.0.0.1", "localhost") or (url.port or 5672) != 5672:
        return 0
    queues = [q for q in await _ctl_names("list_queues") if q.startswith(prefix)]
    exchanges = [x for x in await _ctl_names("list_exchanges") if x.startswith(prefix)]
    await _delete(settings, queues, exchanges)
    return len(queues)


async def _ctl_names(command: str) -> list[str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            "rabbitmqctl", command, "name", "-q", "--no-table-headers",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        async with asyncio.timeout(60):
            out, _ = await proc.communicate()
    except (OSError, TimeoutError):
        return []
    return out.decode(errors="replace").split() if proc.returncode == 0 else []


async def _delete(settings: Settings, queues: list[str], exchanges: list[str]) -> None:
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        for name in queues:
            ch = await conn.channel()  # a failed delete closes the channel: one per object
            with contextlib.suppress(Exception):
                await ch.queue_delete(name)
        for name in exchanges:
            ch = await conn.channel()
            with contextlib.suppress(Exception):
                await ch.exchange_delete(name)
    finally:
        await conn.close()
