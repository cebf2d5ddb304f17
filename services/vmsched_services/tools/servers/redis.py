"""A private Redis on a free loopback port, for the experiments and tests that stop Redis under
running services (never the shared one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vmsched_services.tools.servers.base import PrivateServer


class PrivateRedis(PrivateServer):
    """A standalone redis-server. By default it keeps nothing on disk (a restart is empty); with
    `persistent` every write goes to an append-only file first, so a stop and start loses nothing
    (an outage without data loss)."""

    name = "redis"

    def __init__(self, directory: Path, port: int | None = None, *, persistent: bool = False) -> None:
        super().__init__(directory, port)
        self.persistent = persistent

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> Sequence[str]:
        keep = ("--appendonly", "yes", "--appendfsync", "always") if self.persistent else ("--appendonly", "no")
        return [
            "redis-server",
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *keep),
            *("--dir", str(self.directory)),
        ]


__all__ = ["PrivateRedis"]
