"""Private Redis servers: a standalone server (optionally with AOF), a replica, a Sentinel group
(primary, replica, three sentinels, quorum 2) and a Redis Cluster of three masters (optionally one
replica each), on free loopback ports with their files under a directory of ours.

Timings are small so a failover happens within seconds in a test: sentinels count a master down
after `down_after_ms` and a cluster node after `node_timeout_ms`.

    async with SentinelGroup(tmp_path) as group:
        settings = settings.model_copy(update=group.settings_update())
        ...
        await group.primary.kill()      # the sentinels promote the replica
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis.asyncio as aioredis

from vmsched_services.tools.servers.base import PrivateServer, TlsListener, free_port

#: The service name the sentinels monitor the primary under.
MASTER_NAME = "vmsched"


class PrivateRedis(PrivateServer):
    """One redis-server: no RDB snapshots; AOF (fsync every second) only if asked for."""

    name = "redis"

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        aof: bool = False,
        replica_of: int | None = None,
        cluster_node_timeout_ms: int | None = None,
        tls: TlsListener | None = None,
        password: str | None = None,
        aclfile: Path | None = None,
    ) -> None:
        super().__init__(directory, port)
        #: The users (`aclfile` in redis.conf), e.g. what `vmsched security init` generated.
        self.aclfile = aclfile
        self.aof = aof
        self.replica_of = replica_of
        self.cluster_node_timeout_ms = cluster_node_timeout_ms
        #: With TLS, `port` is the TLS port and there is no plain one.
        self.tls = tls
        #: `requirepass`: clients must AUTH with it.
        self.password = password

    def command(self) -> Sequence[str]:
        cmd = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.aof else "no",
            "--dir",
            str(self.directory),
        ]
        if self.tls is not None:
            cmd[1:3] = ["--port", "0", "--tls-port", str(self.port)]
            cmd += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            cmd += ["--tls-ca-cert-file", str(self.tls.ca)]
            cmd += ["--tls-auth-clients", "yes" if self.tls.client_cert_required else "no"]
        if self.password is not None:
            cmd += ["--requirepass", self.password]
        if self.aclfile is not None:
            cmd += ["--aclfile", str(self.aclfile)]
        if self.replica_of is not None:
            cmd += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        if self.cluster_node_timeout_ms is not None:
            cmd += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.cluster_node_timeout_ms),
                # The masters left serve their own slots while one has no one to take over its own.
                "--cluster-require-full-coverage",
                "no",
                # A replica takes over however long it was cut off from its master. On a loaded
                # 2-core machine a replica's link can look stale for longer than the default
                # allows (validity factor 10 x node timeout), and it then refuses to fail over at
                # all ("Disconnected from master for longer than allowed"): the slots stay down.
                # vmsched is built to survive the data a stale replica lacks (generations).
                "--cluster-replica-validity-factor",
                "0",
            ]
        return cmd

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        auth = f":{self.password}@" if self.password is not None else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0, password=self.password)

    async def info(self, section: str) -> dict[str, Any]:
        client = self.client()
        try:
            return dict(await client.info(section))
        finally:
            await client.aclose()

    async def cluster_info(self) -> dict[str, Any]:
        """CLUSTER INFO as a dict (integers as int)."""
        client = self.client()
        try:
            raw = await client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
        finally:
            await client.aclose()
        if isinstance(raw, dict):
            return raw
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {k: int(v) if v.isdigit() else v for k, v in pairs}


class PrivateSentinel(PrivateServer):
    """One sentinel watching the primary at `master_port` (its config file is its own: sentinels
    rewrite it)."""

    name = "sentinel"

    def __init__(
        self,
        directory: Path,
        master_port: int,
        *,
        quorum: int = 2,
        down_after_ms: int = 500,
        failover_timeout_ms: int = 2000,
    ) -> None:
        super().__init__(directory)
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {directory}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
                    f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )

    def command(self) -> Sequence[str]:
        return ["redis-server", str(self.config), "--sentinel"]

    async def master_port(self) -> int | None:
        """The port this sentinel names as the master's now (None if it cannot say)."""
        client = aioredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            addr = await client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)  # type: ignore[no-untyped-call]
        except (OSError, aioredis.RedisError):
            return None
        finally:
            await client.aclose()
        return int(addr[1]) if addr else None


class _Group:
    """Servers started together (all stopped if one fails to start) and stopped together."""

    async def start(self, timeout_s: float = 60.0) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class SentinelGroup(_Group):
    """A primary, its replica and three sentinels (quorum 2), started together, stopped together."""

    def __init__(self, directory: Path, *, down_after_ms: int = 500, failover_timeout_ms: int = 2000) -> None:
        self.primary = PrivateRedis(directory / "primary")
        self.replica = PrivateRedis(directory / "replica", replica_of=self.primary.port)
        self.sentinels = [
            PrivateSentinel(
                directory / f"sentinel-{i}",
                self.primary.port,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for i in range(3)
        ]

    @property
    def servers(self) -> list[PrivateServer]:
        return [self.primary, self.replica, *self.sentinels]

    def settings_update(self) -> dict[str, Any]:
        """What to put in Settings to reach the primary through the sentinels."""
        return {
            "redis_url": "redis://127.0.0.1/0",
            "redis_sentinels": ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels),
            "redis_sentinel_master": MASTER_NAME,
            "redis_cluster": False,
        }

    async def start(self, timeout_s: float = 30.0) -> None:
        for server in self.servers:
            await server.start(timeout_s)
        await self.wait_replicated(timeout_s)
        await self.wait_known(self.primary.port, timeout_s)

    async def wait_replicated(self, timeout_s: float) -> None:
        """Until the replica has finished its first sync with the primary."""
        deadline = time.monotonic() + timeout_s
        while (await self.replica.info("replication")).get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica not in sync after {timeout_s}s: {self.replica.tail()}")
            await asyncio.sleep(0.05)

    async def wait_known(self, port: int, timeout_s: float) -> None:
        """Until every sentinel names the server at `port` as the master."""
        deadline = time.monotonic() + timeout_s
        while [await s.master_port() for s in self.sentinels] != [port] * len(self.sentinels):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sentinels do not agree on master port {port} after {timeout_s}s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for server in self.servers:
            await server.kill()


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher, so at most 65535) is free too."""
    while True:
        port = free_port()
        if port <= 55535 and _bindable(port + 10000):
            return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PrivateRedisCluster(_Group):
    """A Redis Cluster of `masters` masters, each with `replicas` replicas (on 2 cores, 3 masters
    and 3 replicas are six idle processes: affordable)."""

    def __init__(self, directory: Path, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000) -> None:
        self.masters = masters
        self.replicas = replicas
        self.nodes = [
            PrivateRedis(directory / f"node-{i}", cluster_port(), cluster_node_timeout_ms=node_timeout_ms)
            for i in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def settings_update(self) -> dict[str, Any]:
        return {
            "redis_url": self.url,
            "redis_cluster": True,
            "redis_cluster_nodes": ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[1:]),
            "redis_sentinels": "",
        }

    async def start(self, timeout_s: float = 60.0) -> None:
        for node in self.nodes:
            await node.start(timeout_s)
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        cmd = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas)]
        done = await asyncio.to_thread(
            subprocess.run, [*cmd, "--cluster-yes"], capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
        await self.wait_ok(timeout_s)

    async def wait_ok(self, timeout_s: float, nodes: Sequence[PrivateRedis] | None = None) -> None:
        """Until every (running) node says cluster_state:ok and knows every slot is served."""
        deadline = time.monotonic() + timeout_s
        for node in nodes or [n for n in self.nodes if n.running]:
            while True:
                info = await node.cluster_info()
                if info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == 16384:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster not ok after {timeout_s}s: node {node.port} says {info}")
                await asyncio.sleep(0.1)

    async def master_of(self, key: str) -> PrivateRedis:
        """The node serving `key`'s slot now."""
        client = next(n for n in self.nodes if n.running).client()
        try:
            slot = int(await client.execute_command("CLUSTER", "KEYSLOT", key))  # type: ignore[no-untyped-call]
            shards = await client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        finally:
            await client.aclose()
        for start, end, master, *_ in shards:
            if int(start) <= slot <= int(end):
                port = int(master[1])
                return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no node serves slot {slot}")

    async def stop(self) -> None:
        for node in self.nodes:
            await node.kill()


__all__ = ["MASTER_NAME", "PrivateRedis", "PrivateRedisCluster", "PrivateSentinel", "SentinelGroup"]
