"""Private RabbitMQ nodes on loopback, and a cluster of them, for the experiments that stop a node.

Each node is a separate Erlang node of its own name (`vmsched-chaos-<x>-<run>@localhost`), with its
AMQP and distribution ports, its database, logs, configuration and enabled-plugins file (none: no
management plugin) under its own directory. The machine's own configuration (/etc/rabbitmq, whose
node is `rabbit@localhost` on 5672, used by everyone else) is never read: every file the scripts
would take from there is pointed at our directory. rabbitmqctl is always given `-n`, so it never
talks to the shared node. The nodes of one cluster share an Erlang cookie, written into each node's
HOME (the CLI tools and the server both read `$HOME/.erlang.cookie`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from vmsched_services.tools.servers.base import PrivateServer, TlsListener, free_port

#: The scripts themselves, not /usr/sbin's wrappers (those switch to the rabbitmq user and its HOME).
RABBIT_BIN = Path(os.environ.get("VMSCHED_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


class RabbitNode(PrivateServer):
    """One RabbitMQ node on loopback ports, files under `directory`."""

    name = "rabbitmq"

    def __init__(
        self, directory: Path, nodename: str, cookie: str, port: int | None = None, *, tls: TlsListener | None = None
    ) -> None:
        super().__init__(directory, port)
        if nodename.startswith("rabbit@"):
            raise ValueError("rabbit@<host> is the shared node's name; a private node needs another")
        self.nodename = nodename
        self.cookie = cookie
        self.dist_port = free_port()
        #: A TLS listener on `tls_port` besides the plain one on `port` (peers verified; with
        #: `client_cert_required`, fail_if_no_peer_cert).
        self.tls = tls
        self.tls_port = free_port() if tls is not None else None
        self._write_files()

    @property
    def tls_url(self) -> str:
        """The amqps:// URL of the TLS listener (guest may log in: the connection is over loopback)."""
        if self.tls_port is None:
            raise ValueError("this node has no TLS listener")
        return f"amqps://guest:guest@127.0.0.1:{self.tls_port}/"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _write_files(self) -> None:
        d = self.directory
        (d / "home").mkdir(exist_ok=True)
        cookie = d / "home" / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq-env.conf").write_text("")
        # guest may connect over loopback only (the default); quorum queues need no more.
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            "log.console = false\n"
            "log.file.level = info\n"
            # The fault suite runs on small shared machines: do not block publishers for a full disk.
            "disk_free_limit.absolute = 10MB\n" + self._tls_config()
        )

    def _tls_config(self) -> str:
        if self.tls is None:
            return ""
        return (
            f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.tls.ca}\n"
            f"ssl_options.certfile = {self.tls.cert}\n"
            f"ssl_options.keyfile = {self.tls.key}\n"
            "ssl_options.verify = verify_peer\n"
            f"ssl_options.fail_if_no_peer_cert = {'true' if self.tls.client_cert_required else 'false'}\n"
        )

    def command(self) -> Sequence[str]:
        return [str(RABBIT_BIN / "rabbitmq-server")]

    def signal(self, sig: signal.Signals) -> None:
        """To the node's whole process group: the script runs the Erlang VM as its child, so a
        signal to the script alone would leave the node running."""
        if self.running and self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def environment(self) -> dict[str, str]:
        d = self.directory
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        ctl_port = free_port()
        env.update(
            HOME=str(d / "home"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_PID_FILE=str(d / "rabbit.pid"),
            RABBITMQ_CTL_DIST_PORT_MIN=str(ctl_port),
            RABBITMQ_CTL_DIST_PORT_MAX=str(ctl_port),
            # Loopback only; and on a small shared machine, no scheduler spinning for work (three
            # idle nodes would otherwise keep the cores busy) and one scheduler each.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none +sbwtdio none +S 1:1"
            ),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def reap_group(self) -> None:
        """SIGKILL whatever of the node's process group outlived its script (nothing, normally)."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    async def ctl(self, *args: str, timeout_s: float = 60.0) -> str:
        """`rabbitmqctl -n <this node> args...`; its output, RuntimeError if it fails."""
        proc = await asyncio.create_subprocess_exec(
            str(RABBIT_BIN / "rabbitmqctl"),
            "-n",
            self.nodename,
            *args,
            env=self.environment(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.nodename}: no answer in {timeout_s}s") from None
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.nodename} failed: {text[-1500:]}")
        return text

    async def start(self, timeout_s: float = 90.0) -> None:
        """Spawn, then wait until the AMQP port accepts and the app has booted."""
        await super().start(timeout_s)
        await self.ctl("await_startup", timeout_s=timeout_s)


class RabbitCluster:
    """Nodes sharing a cookie, the first one's cluster joined by the others."""

    def __init__(self, directory: Path, size: int = 3, tag: str | None = None) -> None:
        tag = tag or secrets.token_hex(3)
        cookie = secrets.token_hex(16).upper()
        self.nodes = [
            RabbitNode(directory / f"node-{chr(97 + i)}", f"vmsched-chaos-{chr(97 + i)}-{tag}@localhost", cookie)
            for i in range(size)
        ]
        #: Seconds the last `start` took (spawn to clustered), for reports.
        self.startup_s = 0.0

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    async def start(self, timeout_s: float = 180.0) -> None:
        """Boot all nodes at once, then join the others to the first, together (stop_app, join, start_app)."""
        started = time.monotonic()
        await asyncio.gather(*(n.start(timeout_s) for n in self.nodes))
        first = self.nodes[0]

        async def join(node: RabbitNode) -> None:
            await node.ctl("stop_app")
            await node.ctl("join_cluster", first.nodename)
            await node.ctl("start_app")

        await asyncio.gather(*(join(n) for n in self.nodes[1:]))
        await first.ctl("await_online_nodes", str(len(self.nodes)), "--timeout", str(int(timeout_s)))
        self.startup_s = time.monotonic() - started

    def node_named(self, nodename: str) -> RabbitNode:
        for n in self.nodes:
            if n.nodename == nodename:
                return n
        raise KeyError(nodename)

    async def queue_leaders(self, vhost: str = "/") -> dict[str, str]:
        """Quorum queue name -> its leader's node name, asked of any node that answers."""
        for node in self.nodes:
            if not node.running:
                continue
            out = await node.ctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "type", "leader")
            leaders: dict[str, str] = {}
            for line in out.splitlines():
                parts = line.split("\t")
                if len(parts) == 3 and parts[1] == "quorum":
                    leaders[parts[0]] = parts[2]
            return leaders
        raise RuntimeError("no node of the cluster is running")

    async def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL), and anything left of their process groups."""
        await asyncio.gather(*(n.stop() for n in self.nodes))
        for n in self.nodes:
            n.reap_group()


__all__ = ["RABBIT_BIN", "RabbitCluster", "RabbitNode"]
