"""A server process of our own: started on a free loopback port with its files under a directory
we own, waited for until it accepts connections, then frozen, killed or stopped on demand."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsListener:
    """What a private server's TLS listener uses (PEM files): its certificate and key, the CA it checks
    client certificates against, and whether a client must present one."""

    cert: Path
    key: Path
    ca: Path
    client_cert_required: bool = False


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


class PrivateServer:
    """One server process. Subclasses give the command; `start` waits until `port` accepts."""

    name = "server"

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    async def start(self, timeout_s: float = 30.0) -> None:
        if not self.running:
            self.spawn()
        await self.wait_accepting(timeout_s)

    def spawn(self) -> None:
        """Start the process (its own session, so signals to it reach nothing else); returns at once."""
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                list(self.command()),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=self.environment(),
                start_new_session=True,
            )

    async def wait_accepting(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not accepts(self.port):
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} on port {self.port} exited ({self.popen.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} on port {self.port} not accepting after {timeout_s}s: {self.tail()}")
            await asyncio.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, nbytes: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-nbytes:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def signal(self, sig: signal.Signals) -> None:
        if self.running and self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL: the server loses whatever it had not written to disk."""
        self.thaw()
        self.signal(signal.SIGKILL)
        await self._reap(10.0)

    async def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        self.thaw()
        self.signal(signal.SIGTERM)
        if not await self._reap(timeout_s):
            await self.kill()

    async def _reap(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.popen is not None and self.popen.poll() is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


__all__ = ["PrivateServer", "TlsListener", "accepts", "free_port"]
