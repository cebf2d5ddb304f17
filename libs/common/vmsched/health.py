"""The metrics port: /metrics (Prometheus), /healthz (liveness), /readyz (readiness); 404 otherwise.

* /healthz: 200 when the process's event loop runs a callback within VMSCHED_HEALTH_TIMEOUT_S,
  503 when it does not (a loop stuck in a long computation or a blocking call).
* /readyz: 200 when the services have started and every readiness check passes, 503 otherwise
  (also while starting and stopping). The checks (Runtime.readiness_checks: the bus connection is
  open, Redis answers PING, PostgreSQL answers SELECT 1 where the process reads it) run on the
  event loop, concurrently, each bounded by VMSCHED_HEALTH_TIMEOUT_S. A degrading check failing
  (PostgreSQL: the services work on with the policies they read last) leaves it 200, status
  "degraded". The JSON body names each check with its result:
  {"status": "ready", "checks": {"redis": {"ok": true, "ms": 0.4}, ...}}.

The HTTP server runs in threads of its own, not on the event loop, and health questions are handed
to the loop (call_soon_threadsafe, run_coroutine_threadsafe) with a bound on the wait. Why not serve
on the loop: /metrics must still answer when the loop is stuck, which is when its figures are most
wanted, and rendering a scrape (thousands of series with per-cluster labels) must not stall the
requests the loop is deciding; and a stuck loop then gets an explicit 503 from /healthz instead of
a connection that never answers. Metrics themselves are thread-safe (prometheus_client locks them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from vmsched.errors import UsageError
from vmsched.logging import SECRETS, get_logger

log = get_logger("vmsched.health")

#: A readiness check: returns when its dependency answers, raises (anything) when it does not.
Check = Callable[[], Awaitable[object]]

JSON = "application/json"
#: Extra time the HTTP thread gives the loop beyond the checks' own bound before answering 503.
LOOP_GRACE_S = 0.5
#: Longest error text a check reports.
ERROR_TEXT_LIMIT = 300


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


def _json(status: int, body: Mapping[str, Any]) -> Response:
    return Response(status, JSON, json.dumps(body, sort_keys=True).encode())


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    # /readyz is read by anyone who reaches the port: a driver's message never shows a credential.
    return SECRETS.mask(text)[:ERROR_TEXT_LIMIT]


async def run_checks(checks: Mapping[str, Check], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Every check at once, each bounded by `timeout_s`: {name: {"ok", "ms"[, "error"]}}."""

    async def one(check: Check) -> dict[str, Any]:
        started = time.perf_counter()
        result: dict[str, Any] = {"ok": True}
        try:
            async with asyncio.timeout(timeout_s):
                await check()
        except TimeoutError:
            result = {"ok": False, "error": f"no answer within {timeout_s:g} s"}
        except Exception as exc:
            result = {"ok": False, "error": _error_text(exc)}
        result["ms"] = round((time.perf_counter() - started) * 1000, 3)
        return result

    results = await asyncio.gather(*(one(check) for check in checks.values()))
    return dict(zip(checks, results, strict=True))


class Health:
    """What /healthz and /readyz answer, asked from the HTTP threads about the process's event loop.

    The runner calls `starting(loop)` before it opens the connections, `ready(checks)` once its
    services consume, `stopping()` before it closes them.
    """

    def __init__(self, timeout_s: float = 1.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checks: Mapping[str, Check] | None = None
        self._degrading: frozenset[str] = frozenset()
        self._phase = "starting"

    def starting(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._loop, self._checks, self._phase = loop, None, "starting"

    def ready(self, checks: Mapping[str, Check], *, degrading: frozenset[str] = frozenset()) -> None:
        """Started: /readyz runs `checks`; those named in `degrading` may fail without making it 503."""
        with self._lock:
            self._checks, self._degrading, self._phase = dict(checks), degrading, "ready"

    def stopping(self) -> None:
        with self._lock:
            self._checks, self._phase = None, "stopping"

    def liveness(self) -> Response:
        with self._lock:
            loop = self._loop
        if loop is None or loop.is_closed():
            return _json(503, {"status": "down", "error": "no event loop"})
        answered = threading.Event()
        asked = time.perf_counter()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed in the meantime
            return _json(503, {"status": "down", "error": "no event loop"})
        if not answered.wait(self.timeout_s):
            return _json(503, {"status": "down", "error": f"the event loop did not answer within {self.timeout_s:g} s"})
        return _json(200, {"status": "ok", "loop_ms": round((time.perf_counter() - asked) * 1000, 3)})

    def readiness(self) -> Response:
        with self._lock:
            loop, checks, phase, degrading = self._loop, self._checks, self._phase, self._degrading
        if loop is None or checks is None or loop.is_closed():
            return _json(503, {"status": phase, "checks": {}})
        try:
            future = asyncio.run_coroutine_threadsafe(run_checks(checks, self.timeout_s), loop)
        except RuntimeError:  # the loop closed in the meantime
            return _json(503, {"status": "stopping", "checks": {}})
        try:
            results = future.result(self.timeout_s + LOOP_GRACE_S)
        except TimeoutError:
            future.cancel()
            error = f"the event loop did not run the checks within {self.timeout_s + LOOP_GRACE_S:g} s"
            results = {name: {"ok": False, "error": error} for name in checks}
        except concurrent.futures.CancelledError:  # the loop is shutting down
            return _json(503, {"status": "stopping", "checks": {}})
        ok = all(r["ok"] for name, r in results.items() if name not in degrading)
        status = "not ready" if not ok else "ready" if all(r["ok"] for r in results.values()) else "degraded"
        return _json(200 if ok else 503, {"status": status, "checks": results})


PATHS = ("/metrics", "/healthz", "/readyz")


def respond(path: str, health: Health, *, accept: str = "", registry: CollectorRegistry = REGISTRY) -> Response:
    """The answer to GET `path` (query string ignored)."""
    route = urlsplit(path).path
    if route == "/metrics":
        encoder, content_type = choose_encoder(accept)
        return Response(200, content_type, encoder(registry))
    if route == "/healthz":
        return health.liveness()
    if route == "/readyz":
        return health.readiness()
    return _json(404, {"error": f"no such path: {route[:200]}", "paths": list(PATHS)})


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        try:
            response = respond(self.path, self.server.health, accept=self.headers.get("Accept", ""))
        except Exception as exc:  # never let one request take the thread's answer away
            log.warning("metrics endpoint failed", path=self.path[:200], error=_error_text(exc))
            response = _json(500, {"error": _error_text(exc)})
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape or a probe every few seconds is not worth a log line."""


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], health: Health) -> None:
        self.health = health
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name=f"metrics-{self.port}", daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class MetricsServers:
    """The metrics servers of a process, one per port, each started once and kept for the life of the
    process: a second run in the process (tests, `vmsched up` after `run`) reuses its port's server,
    which it could not bind again."""

    def __init__(self) -> None:
        self._by_port: dict[int, MetricsServer] = {}

    def serve(self, port: int, *, timeout_s: float = 1.0, host: str = "127.0.0.1") -> Health | None:
        """The Health of the server on `port`, started on first use (None when port is 0: disabled)."""
        if not port:
            return None
        server = self._by_port.get(port)
        if server is None:
            try:
                server = MetricsServer((host, port), Health(timeout_s))
            except OSError as exc:
                raise _cannot_listen(host, port, exc) from None
            self._by_port[port] = server
            server.start()
        server.health.timeout_s = timeout_s
        return server.health

    def reset(self) -> None:
        """Stop every server and forget it (tests: the next serve starts afresh)."""
        servers, self._by_port = list(self._by_port.values()), {}
        for server in servers:
            server.stop()


def _cannot_listen(host: str, port: int, exc: OSError) -> UsageError:
    """The metrics port cannot be bound: a setting to change (VMSCHED_METRICS_PORT or _HOST), said as
    such, not an unexpected error."""
    where = f"{host or 'every interface'}:{port}"
    hint = (
        "set VMSCHED_METRICS_PORT to a free port (each service process on a machine needs its own), or 0 "
        "to serve no metrics"
    )
    if exc.errno == errno.EADDRINUSE:
        taken = f"ss -ltnp 'sport = :{port}'"
        return UsageError(
            f"metrics port {port} is taken: another process listens on {where} (VMSCHED_METRICS_PORT)",
            hint=f"{hint}; `{taken}` shows which process has it",
        )
    if exc.errno == errno.EACCES:
        return UsageError(
            f"metrics port {port}: not allowed to listen on {where} (VMSCHED_METRICS_PORT; ports below "
            "1024 need privileges)",
            hint=hint,
        )
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return UsageError(
            f"metrics host {host!r} is not an address of this machine (VMSCHED_METRICS_HOST)",
            hint="set VMSCHED_METRICS_HOST to one of its addresses, or unset it for loopback",
        )
    return UsageError(f"cannot serve metrics on {where}: {exc.strerror or exc} (VMSCHED_METRICS_PORT)", hint=hint)


#: The process's one MetricsServers, owned by this module: `serve` (the runner's only way in) is its
#: only user; tests reset() it.
SERVERS = MetricsServers()


def serve(port: int, *, timeout_s: float = 1.0, host: str = "127.0.0.1") -> Health | None:
    """Serve /metrics, /healthz and /readyz on `host`:`port` (VMSCHED_METRICS_HOST, loopback unless
    set: "" or 0.0.0.0 is every interface), once per port per process;
    its Health (None when port is 0: disabled). A second run in the process reuses the server.
    A port taken by another process (or an address not this machine's) is a UsageError naming the
    setting to change."""
    return SERVERS.serve(port, timeout_s=timeout_s, host=host)


__all__ = [
    "PATHS",
    "SERVERS",
    "Check",
    "Health",
    "MetricsServer",
    "MetricsServers",
    "Response",
    "respond",
    "run_checks",
    "serve",
]
