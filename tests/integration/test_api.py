"""The HTTP API against the real services (RabbitMQ, Redis, PostgreSQL), in this process: roles,
policies in oVirt's shape (dry run, apply, history, rollback) audited on behalf of the token's name,
cluster state, scheduling over HTTP, simulations, server-sent events from a real uvicorn, and `vmsched
run api` needing nothing but the bus."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from tests import factories
from tests.integration.conftest import Buses, services
from vmsched.client import SchedulerClient
from vmsched.db import migrate
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.api.app import create_app
from vmsched_services.api.auth import Role, TokenBook, TokenEntry, digest
from vmsched_services.api.deps import Clients
from vmsched_services.api.service import Server, bind, serve

pytestmark = [pytest.mark.integration]

TOKENS = {"viewer": "tv-secret", "operator": "to-secret", "admin": "ta-secret"}
BOOK = TokenBook([TokenEntry(f"{role}-user", Role.parse(role), digest(t)) for role, t in TOKENS.items()])
HOST = {"cpu_cores": 8, "physical_mem_mb": 8192, "mem_free_mb": 8192, "reserved_mem_mb": 0}


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    user = bus_settings.amqp_user or "guest"
    # The api's broker user administers (docs/security.md) and is trusted to say for whom it asks.
    cfg = bus_settings.model_copy(update={"postgres_url": database, "admin_users": user, "api_users": user})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", "ha-monitor", "policy-admin"):
        yield cfg


@pytest.fixture
async def engine(stack: Settings, buses: Buses) -> AsyncIterator[SchedulerClient]:
    async with buses.client(stack) as cl:
        yield cl


@contextlib.asynccontextmanager
async def app_clients(cfg: Settings) -> AsyncIterator[Clients]:
    async with SchedulerClient(cfg) as scheduler:
        yield Clients(scheduler, PolicyClient(cfg, bus=scheduler.bus))


@pytest.fixture
async def api(stack: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with app_clients(stack) as clients:
        app = create_app(stack, clients=clients, tokens=BOOK)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=60) as client:
            yield client


async def test_roles_on_reads_and_writes(api: httpx.AsyncClient) -> None:
    for role in TOKENS:
        r = await api.get("/api/v1/schedulingpolicies", headers=bearer(role))
        assert r.status_code == 200, r.text
    assert (await api.get("/api/v1/schedulingpolicies")).status_code == 401
    assert (await api.get("/api/v1/audit", headers=bearer("operator"))).status_code == 403
    assert (await api.get("/api/v1/audit", headers=bearer("admin"))).status_code == 200


async def test_policies_and_units_in_ovirt_shape(api: httpx.AsyncClient) -> None:
    policies = (await api.get("/api/v1/schedulingpolicies", headers=bearer("viewer"))).json()
    none = next(p for p in policies if p["name"] == "none")
    assert none["locked"] is True
    assert none["filters"]
    assert isinstance(none["balances"], list)
    assert (await api.get("/api/v1/schedulingpolicies/none", headers=bearer("viewer"))).json() == none
    r = await api.get("/api/v1/schedulingpolicies/no-such", headers=bearer("viewer"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "policy_not_found"
    units = (await api.get("/api/v1/schedulingpolicyunits", headers=bearer("viewer"))).json()
    memory = [u for u in units if u["name"] == "Memory"]
    assert [u["type"] for u in memory] == ["filter"]
    assert memory[0]["builtin"]
    assert {u["type"] for u in units} >= {"filter", "weight", "balance"}


async def test_validate_dry_run_apply_history_rollback_audited_for_the_token(
    api: httpx.AsyncClient, unique: str
) -> None:
    name = f"api-{unique}"
    r = await api.post("/api/v1/schedulingpolicies/none/clone", json={"name": name}, headers=bearer("admin"))
    assert r.status_code == 201, r.text
    policy = r.json()
    assert (policy["version"], policy["locked"]) == (1, False)

    bad = {**policy, "filters": ["Memry"]}
    v = (await api.post(f"/api/v1/schedulingpolicies/{name}/validate", json=bad, headers=bearer("viewer"))).json()
    assert v["valid"] is False
    assert "Memory" in v["errors"][0]["message"]
    assert v["errors"][0]["location"] == f"policy {name}"
    r = await api.put(f"/api/v1/schedulingpolicies/{name}", json=bad, headers=bearer("admin"))
    assert r.status_code == 422
    assert r.json()["error"]["errors"]

    edited = {**policy, "weights": [{"unit": "PreferredHosts", "factor": 5}]}
    v = (await api.post(f"/api/v1/schedulingpolicies/{name}/validate", json=edited, headers=bearer("viewer"))).json()
    assert v["valid"] is True
    assert any("PreferredHosts" in line for line in v["diff"])
    dry = await api.put(f"/api/v1/schedulingpolicies/{name}?dry_run=true", json=edited, headers=bearer("admin"))
    assert dry.status_code == 200
    assert dry.json()["dry_run"] is True
    assert any("PreferredHosts" in line for line in dry.json()["changes"][0]["diff"])
    assert (await api.get(f"/api/v1/schedulingpolicies/{name}", headers=bearer("viewer"))).json()["version"] == 1

    done = await api.put(f"/api/v1/schedulingpolicies/{name}", json=edited, headers=bearer("admin"))
    assert done.status_code == 200
    assert done.json()["changes"][0]["version"] == 2
    history = (await api.get(f"/api/v1/schedulingpolicies/{name}/history", headers=bearer("viewer"))).json()
    assert [v["version"] for v in history["versions"]] == [2, 1]
    back = await api.post(f"/api/v1/schedulingpolicies/{name}/rollback", json={}, headers=bearer("admin"))
    assert back.status_code == 200
    assert back.json()["changes"][0]["version"] == 3
    now = (await api.get(f"/api/v1/schedulingpolicies/{name}", headers=bearer("viewer"))).json()
    assert now["weights"] == policy["weights"]

    audit = (await api.get("/api/v1/audit?limit=20", headers=bearer("admin"))).json()["entries"]
    mine = [e for e in audit if e["target"] == name]
    assert {e["action"] for e in mine} >= {"policy.cloned", "policy.updated", "policy.rolled-back"}
    assert all(e["actor"].endswith(" for admin-user") for e in mine), mine
    assert history["versions"][0]["author"].endswith(" for admin-user")

    locked = await api.put("/api/v1/schedulingpolicies/none", json={**edited, "name": "none"}, headers=bearer("admin"))
    assert locked.status_code == 422  # built in: validation says to clone it
    assert (await api.delete(f"/api/v1/schedulingpolicies/{name}", headers=bearer("admin"))).status_code == 200


async def test_cluster_state_attach_schedule_and_ha(
    api: httpx.AsyncClient, engine: SchedulerClient, unique: str
) -> None:
    cluster = f"api-{unique}"
    await factories.make_cluster(engine, cluster, 3, **HOST)
    state = (await api.get(f"/api/v1/clusters/{cluster}", headers=bearer("viewer"))).json()
    assert len(state["hosts"]) == 3
    r = await api.get("/api/v1/clusters/no-such-cluster", headers=bearer("viewer"))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_cluster"

    attach = {"policy": "evenly_distributed", "properties": {"HighUtilization": "70"}, "ha_reservation": True}
    r = await api.put(f"/api/v1/clusters/{cluster}/policy", json=attach, headers=bearer("admin"))
    assert r.status_code == 200, r.text
    assert r.json()["report"]["changes"][0]["action"] == "attach"
    r = await api.put(
        f"/api/v1/clusters/{cluster}/policy", json={"policy": "evenly_distributed"}, headers=bearer("admin")
    )
    assert r.json()["report"]["changes"][0]["action"] == "unchanged"  # overrides and HA reservation kept

    vm = {"vm_id": f"vm-{unique}", "mem_mb": 1024, "vcpus": 1}
    r = await api.post(f"/api/v1/clusters/{cluster}/schedule", json={"vm": vm}, headers=bearer("viewer"))
    assert r.status_code == 403
    r = await api.post(
        f"/api/v1/clusters/{cluster}/schedule", json={"vm": vm, "explain_scores": True}, headers=bearer("operator")
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "placed"
    assert r.json()["host_id"].startswith(cluster)

    r = await api.get(f"/api/v1/clusters/{cluster}/ha", headers=bearer("viewer"))
    assert r.status_code == 200
    assert r.json()["cluster_id"] == cluster
    r = await api.delete(f"/api/v1/clusters/{cluster}/policy", headers=bearer("admin"))
    assert r.json()["changes"][0]["action"] == "detach"


async def test_clusters_decisions_explanations_and_what_if(
    api: httpx.AsyncClient, engine: SchedulerClient, unique: str
) -> None:
    cluster = f"dec-{unique}"
    await factories.make_cluster(engine, cluster, 3, **HOST)
    listed = (await api.get("/api/v1/clusters", headers=bearer("viewer"))).json()
    mine = next(c for c in listed if c["cluster_id"] == cluster)
    assert mine["hosts"] == 3
    vm = {"vm_id": f"vm-{unique}", "mem_mb": 1024, "vcpus": 1}
    placed = await api.post(f"/api/v1/clusters/{cluster}/schedule", json={"vm": vm}, headers=bearer("operator"))
    request_id = placed.json()["request_id"]
    recent = await factories.eventually(
        lambda: api.get(f"/api/v1/clusters/{cluster}/decisions?limit=5", headers=bearer("viewer")),
        lambda r: bool(r.json()),
        "the decision stored",
    )
    assert recent.json()[0]["request_id"] == request_id
    one = await api.get(f"/api/v1/clusters/{cluster}/decisions/{request_id}", headers=bearer("viewer"))
    assert one.status_code == 200
    assert one.json()["explanation"]["summary"]
    missing = "00000000-0000-4000-8000-000000000000"
    r = await api.get(f"/api/v1/clusters/{cluster}/decisions/{missing}", headers=bearer("viewer"))
    assert r.status_code == 404
    r = await api.get(f"/api/v1/clusters/{cluster}/decisions/not-a-uuid", headers=bearer("viewer"))
    assert r.status_code == 422
    assert r.json()["error"]["location"] == "path.request_id"

    body = {"vm": {**vm, "vm_id": f"what-{unique}"}, "policy": "power_saving"}
    r = await api.post(f"/api/v1/clusters/{cluster}/whatif", json=body, headers=bearer("operator"))
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["policy"] == "power_saving"
    assert {h["host_id"] for h in reply["hosts"]} == {f"{cluster}-h{i}" for i in range(3)}
    inline = {"vm": body["vm"], "policy_inline": {"name": "try", "filters": ["Memory"], "weights": []}}
    r = await api.post(f"/api/v1/clusters/{cluster}/whatif", json=inline, headers=bearer("operator"))
    assert r.status_code == 200, r.text
    assert r.json()["policy"] == "try"
    assert (
        await api.post(f"/api/v1/clusters/{cluster}/whatif", json=body, headers=bearer("viewer"))
    ).status_code == 403


async def test_a_simulation_returns_a_report_per_policy(api: httpx.AsyncClient) -> None:
    body = {"hosts": 8, "vms": 40, "hours": 1, "seed": 3, "policies": ["none", "power_saving"]}
    r = await api.post("/api/v1/simulations", json=body, headers=bearer("operator"))
    assert r.status_code == 200, r.text
    reports = r.json()["policies"]
    assert [p["policy"] for p in reports] == ["none", "power_saving"]
    assert all(p["samples"] for p in reports)
    r = await api.post("/api/v1/simulations", json={**body, "hosts": 100_000}, headers=bearer("operator"))
    assert r.status_code == 422
    assert r.json()["error"]["location"] == "body.hosts"


async def test_a_service_down_is_503_with_a_hint(stack: Settings) -> None:
    # Another prefix: no service consumes there.
    alone = stack.model_copy(update={"amqp_prefix": f"{stack.amqp_prefix}alone."})
    async with app_clients(alone) as clients:
        app = create_app(alone, clients=clients, tokens=BOOK)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            r = await client.get("/api/v1/schedulingpolicies", headers=bearer("viewer"))
    assert r.status_code == 503
    assert r.headers["retry-after"]
    assert "policy-admin" in r.json()["error"]["hint"]
    assert "Traceback" not in r.text


async def read_events(lines: AsyncIterator[str], until: str) -> list[tuple[str, dict[str, object]]]:
    """The stream's events up to the first named `until`."""
    seen: list[tuple[str, dict[str, object]]] = []
    name = ""
    async for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            seen.append((name, json.loads(line.removeprefix("data: "))))
            if name == until:
                return seen
    return seen


async def test_events_stream_a_decision_made_after_connecting(
    stack: Settings, engine: SchedulerClient, unique: str
) -> None:
    cluster = f"sse-{unique}"
    await factories.make_cluster(engine, cluster, 2, **HOST)
    async with app_clients(stack) as clients:
        server = Server(uvicorn.Config(create_app(stack, clients=clients, tokens=BOOK), log_level="warning"))
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        task = asyncio.create_task(serve(server, sock))
        while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
            await asyncio.sleep(0.01)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                url = f"/api/v1/events?cluster={cluster}"
                async with http.stream("GET", url, headers=bearer("viewer")) as response:
                    assert response.headers["content-type"].startswith("text/event-stream")
                    lines = response.aiter_lines()
                    async for line in lines:
                        if line == ": subscribed":
                            break
                    decision = await engine.schedule(cluster, factories.vm_spec(f"vm-{unique}", mem_mb=512, vcpus=1))
                    got = await asyncio.wait_for(read_events(lines, "decision"), 30)
            assert got[-1][0] == "decision"
            assert got[-1][1]["request_id"] == str(decision.request_id)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_vmsched_run_api_needs_only_the_bus(stack: Settings, tmp_path: object) -> None:
    # Redis and PostgreSQL addresses nothing answers at: the api starts and stops all the same.
    cfg = stack.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0", "postgres_url": "postgresql://127.0.0.1:1/x", "api_port": 0}
    )
    async with services(cfg, "api"):
        pass
