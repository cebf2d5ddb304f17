"""`vmsched simulate --over-bus` as a user runs it: alone (it starts the services it needs in its own
process), and next to running service processes (it uses them, and a balancer among them leaves the
replay's cluster alone); either way every decision is the one made in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import vmsched
from vmsched.settings import Settings
from vmsched_services.tools.procs import ServiceStack

pytestmark = pytest.mark.e2e

POLICIES = ("vm_evenly_distributed", "power_saving")


async def simulate_over_bus(settings: Settings) -> dict[str, Any]:
    argv = ["simulate", "--scenario", "even-vm-count", "--over-bus", "--json"]
    for p in POLICIES:
        argv += ["--policy", p]
    code, out, err = await vmsched(settings, *argv, timeout=180)
    assert code == 0, err[-3000:]
    data: dict[str, Any] = json.loads(out)
    return data


def assert_same_decisions(data: dict[str, Any]) -> None:
    summaries = {s["policy"]: s for s in data["over_bus"]["policies"]}
    assert set(summaries) == set(POLICIES)
    for s in summaries.values():
        assert s["identical"], s["differences"]
        assert s["decisions"] >= 45  # every arrival of the scenario, and the migrations
        assert s["bus_ms_mean"] > s["in_process_ms_mean"] > 0
    reports = {r["policy"]: r for r in data["policies"]}
    for p in POLICIES:  # balancing moved VMs, each to the target the selector chose
        assert summaries[p]["migration_decisions"] >= reports[p]["migrations"] > 0


async def test_alone_it_starts_the_services_it_needs(settings: Settings, database: str) -> None:
    data = await simulate_over_bus(settings.model_copy(update={"postgres_url": database}))
    assert data["over_bus"]["services_started"] == ["state-tracker", "filter-worker", "selector", "policy-admin"]
    assert_same_decisions(data)


async def test_it_uses_running_services_and_their_balancer_leaves_its_cluster_alone(
    service_settings: Settings, tmp_path: Path
) -> None:
    # A balancer that looks at every cluster several times a second: had the replay's cluster a
    # balance unit, it would migrate the scenario's crowded VMs at once, behind the replay's back.
    fast = service_settings.model_copy(update={"balance_interval_s": 0.2, "lease_ttl_s": 1.0})
    stack = ServiceStack(fast, tmp_path / "services")
    try:
        await stack.start("state-tracker", "filter-worker", "selector", "policy-admin", "balancer")
        data = await simulate_over_bus(fast)
    finally:
        await stack.close()
    assert data["over_bus"]["services_started"] == []
    assert_same_decisions(data)
