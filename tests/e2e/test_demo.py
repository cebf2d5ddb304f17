"""The README's first command ends in `vmsched demo`: run it (small) as a user would, and read its JSON."""

from __future__ import annotations

import json

import pytest

from tests.e2e.cli import vmsched
from vmsched.settings import Settings

pytestmark = pytest.mark.e2e


async def test_demo_places_vms_and_overcommits_no_host(cli_settings: Settings) -> None:
    code, out, err = await vmsched(
        cli_settings, "demo", "--json", "--clusters", "2", "--hosts", "6", "--requests", "60", timeout=120
    )
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["requests"] == 60
    assert summary["placed"] > 30
    assert summary["placed"] + summary["unplaceable"] + summary["expired"] == 60
    assert summary["over_committed_hosts"] == 0
    assert summary["over_committed_hosts_per_state_tracker"] == 0
    assert summary["errors"] == {}
    assert summary["latency_ms_p50"] > 0
    for filter_name, example in summary["unplaceable_examples"].items():
        assert filter_name in example
    # the drift phase: the balancer moved a VM off the hot host, and nothing ended over-committed
    migration = summary["balancer_migration"]
    assert migration is not None
    assert migration["from"] != migration["to"]
    assert "HighUtilization 80%" in migration["reason"]
    # the HA phase: memory pressure made the cluster unsafe, the HA monitor said so
    alert = summary["ha_alert"]
    assert alert is not None
    assert alert["failing_hosts"] >= 1
    assert alert["message"].startswith("Cluster ")
