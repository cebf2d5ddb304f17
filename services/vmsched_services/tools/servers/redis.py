"""A private Redis on a free loopback port, for the experiments and tests that stop Redis under
running services (never the shared one)."""

from __future__ import annotations

from collections.abc import Sequence

from vmsched_services.tools.servers.base import PrivateServer


class PrivateRedis(PrivateServer):
    """A standalone redis-server that keeps nothing on disk (no RDB, no AOF): a restart is empty."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> Sequence[str]:
        return [
            "redis-server",
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(self.directory)),
        ]


__all__ = ["PrivateRedis"]
