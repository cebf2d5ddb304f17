"""`vmsched bench` runs end to end (tiny sizes) and writes the figures it prints. Speed is never
asserted here: only that every measured path ran and produced numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import vmsched
from vmsched.settings import Settings

pytestmark = pytest.mark.e2e


async def test_bench_measures_every_path_and_writes_json(cli_settings: Settings, tmp_path: Path) -> None:
    out_file = tmp_path / "bench.json"
    code, out, err = await vmsched(
        cli_settings,
        "bench",
        "--hosts",
        "20",
        "--requests",
        "10",
        "--concurrency",
        "2",
        "--clusters",
        "2",
        "--spread-concurrency",
        "3",
        "--json-out",
        str(out_file),
        timeout=300,
    )
    assert code == 0, err[-3000:]
    result = json.loads(out_file.read_text())
    assert result["hop"]["p50_ms"] > 0
    assert result["lock"]["p50_ms"] > 0
    size = result["sizes"]["20"]
    for policy in ("none", "catalogue"):
        assert size[policy]["in_process"]["decisions"] >= 10
        assert size[policy]["in_process"]["p50_ms"] > 0
        assert size[policy]["bus"]["sequential"]["decisions"] > 0
        assert size[policy]["bus"]["sequential"]["p50_ms"] > 0
        assert size[policy]["bus"]["concurrent_3_over_2_clusters"]["decisions"] == 10
        cpu = size[policy]["bus"]["concurrent_2"]["cpu_ms_per_decision"]
        assert {"selector-3", "filter-worker-1", "bench (the engine)"} <= set(cpu)
        assert sum(cpu.values()) > 0  # clock ticks are coarse: one process alone may show 0 at this size
        assert size[policy]["bus_over_in_process"] > 0
        rss = size[policy]["bus"]["rss_mb"]
        assert {k.rsplit("-", 1)[0] for k in rss} == {"state-tracker", "filter-worker", "weigher", "selector"}
        assert all(v is not None and v > 0 for v in rss.values())
    balance = result["balance_pass"]
    assert (balance["hosts"], balance["vms"]) == (200, 4000)  # 10x the largest --hosts, 20 VMs per host
    assert set(balance["units"]) == {
        "OptimalForEvenCpuDistribution",
        "OptimalForCpuPowerSaving",
        "OptimalForEvenGuestDistribution",
        "OptimalForHaReservation",
        "EvenCpuSpread",
        "OptimalForPacking",
    }
    assert all(u["ms"] > 0 and u["no_fit_ms"] > 0 for u in balance["units"].values())
    assert "decisions/s" in out
    assert "balance pass" in out


async def test_bench_suite_answers_every_workload_as_expected(cli_settings: Settings, tmp_path: Path) -> None:
    out_file = tmp_path / "suite.json"
    code, out, err = await vmsched(
        cli_settings, "bench", "--suite", "--hosts", "20", "--requests", "10", "--json-out", str(out_file), timeout=600
    )
    assert code == 0, err[-3000:]
    suite = json.loads(out_file.read_text())["suite"]
    assert suite["hop"]["p50_ms"] > 0
    workloads = suite["workloads"]
    assert list(workloads) == ["basic", "spread", "churn", "unschedulable", "sequential", "big", "burst"]
    for name, w in workloads.items():
        assert w["unexpected"] == 0, (name, w["ended"])
        assert sum(w["ended"].values()) == w["decisions"], name
        assert {"selector-3", "filter-worker-1", "state-tracker-0", "bench (the engine)"} <= set(
            w["cpu_ms_per_decision"]
        )
    # One request in ten asks for more memory than any host has: refused, the rest placed.
    assert workloads["unschedulable"]["ended"] == {"placed": 9, "unplaceable": 1}
    assert workloads["burst"]["decisions"] == 50  # min(1,000, 5 x --requests), all at once
    assert workloads["burst"]["in_flight"] == 50
    assert workloads["big"]["what"].startswith("1 x 200 hosts")
    assert "NOT ANSWERED" not in out
    assert "burst" in out
