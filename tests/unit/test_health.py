"""The metrics port's answers: /metrics, /healthz, /readyz (with fake checks), 404 for anything else."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from vmsched.errors import UsageError
from vmsched.health import Health, MetricsServer, MetricsServers, Response, respond


def _body(response: Response) -> dict[str, Any]:
    assert response.content_type == "application/json"
    body = json.loads(response.body)
    assert isinstance(body, dict)
    return body


async def _ok() -> None:
    return None


async def _refused() -> None:
    raise ConnectionRefusedError("Error 111 connecting to 127.0.0.1:1. Connection refused.")


async def _hangs() -> None:
    await asyncio.sleep(3600)


async def _ready(checks: dict[str, Any], timeout_s: float = 0.2) -> Health:
    health = Health(timeout_s)
    health.starting(asyncio.get_running_loop())
    health.ready(checks)
    return health


# ---------------------------------------------------------------- paths
def test_metrics_are_prometheus_text() -> None:
    response = respond("/metrics", Health())
    assert response.status == 200
    assert response.content_type.startswith("text/plain")
    assert b"vmsched_build_info{" in response.body


def test_metrics_in_openmetrics_when_asked() -> None:
    response = respond("/metrics", Health(), accept="application/openmetrics-text; version=1.0.0")
    assert response.content_type.startswith("application/openmetrics-text")
    assert response.body.endswith(b"# EOF\n")


@pytest.mark.parametrize("path", ["/", "/metric", "/healthz/x", "/ready", "/../readyz", "/favicon.ico"])
def test_any_other_path_is_not_found(path: str) -> None:
    response = respond(path, Health())
    assert response.status == 404
    assert _body(response)["paths"] == ["/metrics", "/healthz", "/readyz"]


def test_the_query_string_does_not_change_the_path() -> None:
    assert respond("/metrics?name[]=x", Health()).status == 200


# ---------------------------------------------------------------- readiness
async def test_ready_when_every_check_passes() -> None:
    health = await _ready({"bus": _ok, "redis": _ok, "postgres": _ok})
    response = await asyncio.to_thread(respond, "/readyz", health)
    assert response.status == 200
    body = _body(response)
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"bus", "redis", "postgres"}
    assert all(c["ok"] is True and c["ms"] >= 0 for c in body["checks"].values())


async def test_one_failing_check_makes_it_not_ready_and_is_named() -> None:
    health = await _ready({"bus": _ok, "redis": _refused})
    response = await asyncio.to_thread(respond, "/readyz", health)
    assert response.status == 503
    body = _body(response)
    assert body["status"] == "not ready"
    assert body["checks"]["bus"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is False
    assert body["checks"]["redis"]["error"].startswith("ConnectionRefusedError: Error 111")


async def test_a_check_that_does_not_answer_fails_within_its_timeout() -> None:
    health = await _ready({"postgres": _hangs, "redis": _ok}, timeout_s=0.2)
    started = time.monotonic()
    response = await asyncio.to_thread(respond, "/readyz", health)
    assert time.monotonic() - started < 10.0  # the hung check never answers: only its 0.2 s timeout ends it
    assert response.status == 503
    checks = _body(response)["checks"]
    assert checks["postgres"] == {"ok": False, "error": "no answer within 0.2 s", "ms": checks["postgres"]["ms"]}
    assert checks["redis"]["ok"] is True


async def test_not_ready_while_starting_and_stopping() -> None:
    health = Health(0.2)
    assert respond("/readyz", health).status == 503  # no loop yet
    health.starting(asyncio.get_running_loop())
    response = await asyncio.to_thread(respond, "/readyz", health)
    assert (response.status, _body(response)["status"]) == (503, "starting")
    health.ready({"bus": _ok})
    assert (await asyncio.to_thread(respond, "/readyz", health)).status == 200
    health.stopping()
    response = await asyncio.to_thread(respond, "/readyz", health)
    assert (response.status, _body(response)["status"]) == (503, "stopping")


async def test_checks_run_on_the_service_loop() -> None:
    loop = asyncio.get_running_loop()
    seen: list[asyncio.AbstractEventLoop] = []

    async def where() -> None:
        seen.append(asyncio.get_running_loop())

    health = await _ready({"loop": where})
    await asyncio.to_thread(respond, "/readyz", health)
    assert seen == [loop]


# ---------------------------------------------------------------- liveness
async def test_live_while_the_loop_answers() -> None:
    health = await _ready({})
    response = await asyncio.to_thread(respond, "/healthz", health)
    assert response.status == 200
    assert _body(response)["status"] == "ok"


async def test_a_stuck_loop_is_reported_down_and_not_ready() -> None:
    health = await _ready({"bus": _ok}, timeout_s=0.1)
    loop = asyncio.get_running_loop()
    live = loop.run_in_executor(None, respond, "/healthz", health)
    ready = loop.run_in_executor(None, respond, "/readyz", health)
    time.sleep(1.0)  # noqa: ASYNC251 - the point: this loop is stuck while the probes wait for it
    live_response, ready_response = await live, await ready
    assert live_response.status == 503
    assert "did not answer within 0.1 s" in _body(live_response)["error"]
    assert ready_response.status == 503
    assert "did not run the checks" in _body(ready_response)["checks"]["bus"]["error"]
    # Once the loop runs again, so do the answers.
    assert (await asyncio.to_thread(respond, "/healthz", health)).status == 200


def test_no_loop_is_down() -> None:
    response = respond("/healthz", Health())
    assert response.status == 503
    assert _body(response)["error"] == "no event loop"


# ---------------------------------------------------------------- over HTTP
@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    health = await _ready({"bus": _ok, "redis": _refused})
    srv = MetricsServer(("127.0.0.1", 0), health)
    srv.start()
    try:
        yield srv
    finally:
        await asyncio.to_thread(srv.stop)


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


async def test_the_server_answers_each_path(server: MetricsServer) -> None:
    status, content_type, body = await asyncio.to_thread(_get, server.port, "/metrics")
    assert (status, content_type.split(";")[0]) == (200, "text/plain")
    assert b"vmsched_build_info" in body
    status, _, body = await asyncio.to_thread(_get, server.port, "/healthz")
    assert status == 200
    status, content_type, body = await asyncio.to_thread(_get, server.port, "/readyz")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body)["checks"]["redis"]["ok"] is False
    status, _, body = await asyncio.to_thread(_get, server.port, "/nothing")
    assert status == 404
    assert json.loads(body)["error"] == "no such path: /nothing"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_port_keeps_one_server_until_reset() -> None:
    """A second run in the process reuses its port's server (it could not bind it again); reset() frees it."""
    servers = MetricsServers()
    assert servers.serve(0) is None
    port = _free_port()
    try:
        first = servers.serve(port, timeout_s=1.0, host="127.0.0.1")
        again = servers.serve(port, timeout_s=2.0, host="127.0.0.1")
        assert first is not None
        assert again is first
        assert first.timeout_s == 2.0
        servers.reset()
        after = servers.serve(port, host="127.0.0.1")
        assert after is not None
        assert after is not first
        assert _get(port, "/healthz")[0] == 503  # a new server, whose Health has no loop yet
    finally:
        servers.reset()


def test_a_port_another_process_holds_is_a_setting_to_change() -> None:
    servers = MetricsServers()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError) as info:
            servers.serve(port, host="127.0.0.1")
    assert str(info.value) == (
        f"metrics port {port} is taken: another process listens on 127.0.0.1:{port} (VMSCHED_METRICS_PORT)"
    )
    assert info.value.hint is not None
    assert "set VMSCHED_METRICS_PORT to a free port" in info.value.hint
    assert f"sport = :{port}" in info.value.hint
    servers.reset()  # nothing was kept for the port
