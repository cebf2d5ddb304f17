"""api: the HTTP API and the console, served by uvicorn inside the service's own event loop.

`vmsched run api` gives it a BusRuntime (the bus alone: no Redis, no PostgreSQL); `vmsched up` the
shared Runtime. Its clients use that runtime's bus. The server runs as one of the runtime's tasks:
when the runner stops (SIGTERM, SIGINT), closing the runtime cancels the task, which tells uvicorn to
exit, lets it finish the requests in flight (at most SHUTDOWN_GRACE_S; event streams are closed) and
only then lets the bus go. uvicorn installs no signal handler of its own: the runner owns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from vmsched.client import SchedulerClient
from vmsched.errors import UsageError
from vmsched.logging import get_logger
from vmsched.policy_client import PolicyClient
from vmsched.runtime import BusRuntime
from vmsched_services.api.app import create_app
from vmsched_services.api.deps import Clients

log = get_logger("vmsched.api")

#: How long requests in flight get to finish when the service stops.
SHUTDOWN_GRACE_S = 5.0


class Server(uvicorn.Server):
    """uvicorn's server without its signal handlers (the runner's stop event stops it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a port in use stops the start with a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"the api cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="set VMSCHED_API_PORT (or VMSCHED_API_HOST) to a free address, or stop what uses it",
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(server: Server, sock: socket.socket) -> None:
    """Run `server` until cancelled; then stop it gracefully (the cancel is held off until it has)."""
    task = asyncio.create_task(server.serve(sockets=[sock]), name="api-uvicorn")
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        # stop_tasks cancels again every few tenths of a second: wait on until uvicorn is done.
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        raise
    finally:
        sock.close()


async def start(rt: BusRuntime) -> Server:
    settings = rt.settings
    clients = Clients(SchedulerClient(settings, bus=rt.bus), PolicyClient(settings, bus=rt.bus))
    app = create_app(settings, clients=clients)
    if not app.state.api.tokens:
        log.warning("no API tokens: every /api/v1 request is refused; set VMSCHED_API_TOKENS_FILE")
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
        proxy_headers=True,
    )
    server = Server(config)
    sock = bind(settings.api_host, settings.api_port)
    address = sock.getsockname()
    task = rt.spawn(serve(server, sock), "api-server")
    # Ready once uvicorn listens: the runner sets the process ready after the services start.
    while not server.started:
        if task.done():
            task.result()  # raises why it stopped
            raise UsageError("the api server stopped before it started listening (its log says why)")
        await asyncio.sleep(0.01)
    log.info("api listening", address=f"http://{address[0]}:{address[1]}")
    return server
