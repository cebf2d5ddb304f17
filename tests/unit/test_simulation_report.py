"""The report's operator figures on small runs whose answer is known: energy, unmet CPU demand and
time over HighUtilization, overcommit, used/FFD both ways; targets that fail and say why; HA restart
failures apart from placement failures; scenarios' expected figures against actual; the plots'
step lines, event markers, legend and page; the report's keys documented."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Counts, Timing, simulate
from vmsched.simulation.plots import MARK_STYLES, STEPS, marks_of, over_time_figure
from vmsched.simulation.power import default_watts, host_watts
from vmsched.simulation.report import PolicyReport, Recorder, Sample, policy_report, render_table
from vmsched.simulation.scenarios import Scenario, expectations, load_scenario, render_expectations, scenario
from vmsched.simulation.targets import verdicts
from vmsched.simulation.workload import HostSpec, MaintenanceWindow, Workload, parse_workload
from vmsched_services.tools import cli
from vmsched_services.tools.simulate import policies_of, run_all

DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulating.md"


def one_host(vms: list[dict[str, Any]], *, cores: int = 4, mem_mb: int = 65536, **host: Any) -> Workload:
    """One host `h` for an hour, sampled at 0 and 3600 s, with `vms` arriving at 0 (running at once)."""
    arrivals = [{"at_s": 0.0, "vm_id": f"vm{n}", "pinned_hosts": ["h"], **vm} for n, vm in enumerate(vms)]
    return parse_workload(
        repr(
            {
                "duration_s": 3600.0,
                "sample_interval_s": 3600.0,
                "start_delay_s": 0.0,
                "hosts": [{"id": "h", "cpu_cores": cores, "mem_mb": mem_mb, "reserved_mem_mb": 0, **host}],
                "arrivals": arrivals,
            }
        ).replace("'", '"'),
        "test.json",
    )


def run(workload: Workload, policy: str = "none") -> PolicyReport:
    p = BUILTIN_POLICIES[policy]
    recorder = Recorder.for_policy(workload, p.properties)
    counts, timing = asyncio.run(simulate(workload, p, recorder))
    return policy_report(policy, len(workload.host_ids()), counts, timing, recorder.samples, p.properties)


# ------------------------------------------------------------------------------ energy
def test_one_host_at_half_load_for_an_hour_draws_idle_plus_half_the_swing() -> None:
    # 4 vCPUs at 50 % on 4 cores: the host at 50 %; 100 W idle, 300 W at full load -> 200 W for 1 h.
    w = one_host([{"mem_mb": 1024, "vcpus": 4, "cpu_usage_pct": 50.0}], idle_watts=100, max_watts=300)
    r = run(w)
    assert [s.power_w for s in r.samples] == [200.0, 200.0]
    assert r.energy_kwh == pytest.approx(0.2)
    assert r.power_kw_mean == pytest.approx(0.2)
    assert r.energy_saved_kwh == 0.0


def test_watts_default_by_size_and_the_workloads_own_win() -> None:
    idle, peak = default_watts(32)
    assert (round(idle, 1), peak) == (150.4, 420.0)
    spec = HostSpec(id="h", cpu_cores=32, mem_mb=1024, idle_watts=90.0)
    assert host_watts(spec) == (90.0, 420.0)
    # A maximum below idle is taken as idle (a host never draws less loaded than idle).
    assert host_watts(HostSpec(id="h", cpu_cores=8, mem_mb=1024, idle_watts=200.0, max_watts=100.0)) == (200.0, 200.0)


def test_a_host_powered_off_saves_its_idle_watts_for_as_long_as_it_is_off() -> None:
    samples = [
        dataclasses.replace(blank(t, 0, 0), off_idle_w=w, power_w=100.0) for t, w in ((0.0, 0.0), (1800.0, 150.0))
    ]
    r = policy_report("p", 2, Counts(), Timing(1.0, 0.0, 3600.0), samples)
    # 150 W held from 1800 s to the end (3600 s): 0.075 kWh; 100 W throughout: 0.1 kWh.
    assert r.energy_saved_kwh == pytest.approx(0.075)
    assert r.energy_kwh == pytest.approx(0.1)


# ------------------------------------------------------------------------------ unmet demand, SLA
def test_an_overloaded_host_shows_the_cpu_it_could_not_give() -> None:
    # Two VMs of 2 vCPUs at 100 % on a 2-core host: 4 CPUs wanted, 2 given, for an hour.
    w = one_host([{"mem_mb": 1024, "vcpus": 2, "cpu_usage_pct": 100.0}] * 2, cores=2)
    r = run(w)
    assert r.placed == 2
    assert r.cpu_hours_wanted == pytest.approx(4.0)
    assert r.cpu_hours_unmet == pytest.approx(2.0)
    # At 100 % it is over HighUtilization (80) throughout: one host-hour.
    assert r.host_hours_over_high == pytest.approx(1.0)
    assert r.high_utilization_pct == 80.0


def test_a_host_with_room_has_no_unmet_demand() -> None:
    r = run(one_host([{"mem_mb": 1024, "vcpus": 2, "cpu_usage_pct": 30.0}], cores=4))
    assert r.cpu_hours_wanted == pytest.approx(0.6)
    assert r.cpu_hours_unmet == 0.0
    assert r.host_hours_over_high == 0.0


# ------------------------------------------------------------------------------ overcommit
def test_overcommit_is_vcpus_per_cpu_and_memory_committed_per_usable() -> None:
    w = one_host([{"mem_mb": 2048, "vcpus": 4, "cpu_usage_pct": 10.0}] * 2, cores=4, mem_mb=8192)
    r = run(w)
    assert r.vcpu_ratio_mean == 2.0
    assert r.vcpu_ratio_max == 2.0
    # 2 x 2 GB and their overhead of 8 GB.
    assert 0.5 <= r.mem_overcommit_mean <= 0.52
    assert r.mem_overcommit_max == r.mem_overcommit_mean


# ------------------------------------------------------------------------------ the spread's floor
def test_the_spread_floor_is_the_largest_vms_points_over_the_mean() -> None:
    # A VM of 16 vCPUs at 100 % on one of two 32-core hosts: that host at 50 %, the other idle.
    w = one_host([{"mem_mb": 1024, "vcpus": 16, "cpu_usage_pct": 100.0}], cores=32)
    w = w.model_copy(update={"hosts": [*w.hosts, w.hosts[0].model_copy(update={"id": "idle"})]})
    last = run(w).samples[-1]
    assert last.cpu_spread == 50.0
    # 16 CPUs less an eighth (the demand's loads are in quarters of a CPU) of 32: 49.6 points;
    # the mean host is at 25 %, so no placement gets the spread under 24.6.
    assert last.cpu_vm_max == pytest.approx(1587.5 / 32)
    assert last.cpu_spread_floor == pytest.approx(1587.5 / 32 - 25.0)
    assert last.cpu_spread_floor <= last.cpu_spread


def test_a_vm_small_against_the_mean_leaves_no_floor() -> None:
    w = one_host(
        [{"mem_mb": 1024, "vcpus": 1, "cpu_usage_pct": 50.0}, {"mem_mb": 1024, "vcpus": 2, "cpu_usage_pct": 50.0}]
    )
    last = run(w).samples[-1]
    assert last.cpu_vm_max > 0.0
    assert last.cpu_spread_floor == 0.0


# ------------------------------------------------------------------------------ used / FFD
def blank(at_s: float, hosts_used: int, ffd_hosts: int) -> Sample:
    return Sample(
        at_s=at_s, vms=1, hosts_used=hosts_used, ffd_hosts=ffd_hosts, cpu_spread=0.0, cpu_std=0.0, mem_spread=0.0,
        mem_std=0.0, vm_count_spread=0, ha_per_host_max=0, cpu_mean_in_use=0.0, mem_mean_in_use=0.0,
    )  # fmt: skip


def test_used_over_ffd_as_a_ratio_of_means_beside_the_mean_of_ratios() -> None:
    # A nearly empty sample (2 hosts where 1 would do) and a full one (10 of 10).
    r = policy_report("p", 10, Counts(), Timing(1.0, 0.0, 600.0), [blank(0.0, 2, 1), blank(300.0, 10, 10)])
    assert r.packing_ratio_mean == 1.5
    assert r.packing_ratio_of_means == pytest.approx(12 / 11, abs=1e-3)
    assert "used / FFD (ratio of means)" in render_table("t", [r])


# ------------------------------------------------------------------------------ targets
def test_vm_evenly_distributed_fails_when_the_spread_is_wide_and_no_host_is_over_high_vm_count() -> None:
    base = policy_report("vm_evenly_distributed", 5, Counts(), Timing(1.0, 0.0, 600.0), [blank(0.0, 5, 1)])
    wide = dataclasses.replace(base, vm_count_spread_final=7, vm_count_max_final=8)
    (v,) = verdicts([wide])
    assert not v.met
    assert (v.value, v.limit) == (7.0, 4.0)
    assert "no host is over HighVmCount 10" in v.why
    assert "why: no host is over HighVmCount" in v.line()
    narrow = dataclasses.replace(base, vm_count_spread_final=3, vm_count_max_final=8)
    (ok,) = verdicts([narrow])
    assert ok.met
    assert ok.why == ""


def test_an_idle_balancer_says_why_the_spread_target_was_missed() -> None:
    counts = Counts(balance_passes=12)
    samples = [dataclasses.replace(blank(t, 5, 1), cpu_spread=30.0, cpu_max=40.0) for t in (3600.0, 7200.0)]
    r = policy_report("evenly_distributed", 5, counts, Timing(1.0, 0.0, 7200.0), samples)
    spread = next(v for v in verdicts([r]) if "CPU max - min" in v.target)
    assert not spread.met
    assert "12 balancing passes moved nothing" in spread.why
    assert "peaked at 40%" in spread.why
    assert "HighUtilization 80%" in spread.why


def test_power_saving_packing_miss_names_its_cause() -> None:
    samples = [dataclasses.replace(blank(0.0, 4, 2), cpus_used=128.0, ffd_cpus=120.0, cpu_mean_in_use=40.0)]
    r = policy_report("power_saving", 10, Counts(), Timing(1.0, 0.0, 300.0), samples)
    (v,) = [v for v in verdicts([r]) if v.target == "hosts used / first-fit-decreasing hosts"]
    assert not v.met
    assert "fills small hosts" in v.why
    assert "stops short of the headroom" in v.why


# ------------------------------------------------------------------------------ HA restarts apart
def test_ha_restart_failures_are_counted_apart_from_placement_failures(capsys: pytest.CaptureFixture[str]) -> None:
    w = load_scenario("ha-reservation")
    r = run(w)
    assert (r.placed, r.arrivals, r.failed) == (12, 12, 0)
    assert r.restart_failures == 2
    assert r.restart_failure_reasons == {"Memory": 2}
    assert r.ha_alert_times
    assert r.ha_alerts == 1
    table = render_table("t", [r])
    assert re.search(r"placement failures \(arrivals\)\s+0\n", table)
    assert re.search(r"HA restarts failed / needed\s+2 / 2\n", table)
    assert "2 HA VMs not restarted; filters that removed hosts: Memory 2" in table


# ------------------------------------------------------------------------------ scenarios
def test_a_scenario_runs_its_own_policy_and_prints_expected_against_actual(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--scenario", "even-vm-count"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("vm_evenly_distributed"))
    assert "none" not in header  # its own policy, not `none`
    assert "expected against actual (4 of 4 as expected)" in out
    assert "vm_evenly_distributed: migrations: expected 2, got 2: as expected" in out


def test_every_scenario_meets_what_it_expects() -> None:
    for name in ("even-vm-count", "ha-reservation", "ha-reservation-balance"):
        s = scenario(name)
        assert s.run
        assert s.expect
        runs = asyncio.run(run_all(s.workload, policies_of(list(s.run), s.workload)))
        found = expectations(s, [report for report, _ in runs])
        assert found
        assert all(e.met for e in found), render_expectations(found)


def test_an_expectation_not_met_says_so() -> None:
    base = policy_report("none", 1, Counts(migrations=3), Timing(1.0, 0.0, 60.0), [blank(0.0, 1, 1)])
    s = Scenario("x", load_scenario("ha-reservation"), ("none",), {"none": {"migrations": 2, "placed": "<= 1"}})
    found = expectations(s, [base])
    assert [(e.figure, e.met) for e in found] == [("migrations", False), ("placed", True)]
    assert "migrations: expected 2, got 3: NOT as expected" in render_expectations(found)


# ------------------------------------------------------------------------------ plots
def test_plots_draw_steps_mark_events_fit_the_legend_and_list_targets(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (optional dependency)

    w = load_scenario("ha-reservation")
    w = w.model_copy(update={"maintenance": [MaintenanceWindow(host_id="h2", start_s=4000.0, end_s=5000.0)]})
    w = Workload.model_validate(w.model_dump())
    reports = [dataclasses.replace(run(w), policy=name) for name in ("none", "power_saving", "evenly_dist", "four")]
    marks = marks_of(w, reports)
    assert {m.kind for m in marks} == {"failure", "maintenance", "ha_alert"}
    fig = over_time_figure("t", reports, marks)
    FigureCanvasAgg(fig).draw()  # type: ignore[no-untyped-call]
    policy_lines = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_label() in {r.policy for r in reports}]
    assert policy_lines
    assert all(ln.get_drawstyle() == STEPS for ln in policy_lines)
    first = fig.axes[0]
    failure_x = 3600.0 / 60.0  # minutes: a 2-hour run
    vertical = [
        ln for ln in first.get_lines() if np.asarray(ln.get_xdata(), dtype=float).tolist() == [failure_x, failure_x]
    ]
    assert vertical
    assert vertical[0].get_color() == MARK_STYLES["failure"][0]
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"host failure", "maintenance", "HA alert (none)"} <= set(labels)
    assert any(label.startswith("four") for label in labels)  # the fourth policy's entry fits too
    box, frame = legend.get_window_extent(), fig.bbox
    assert box.x0 >= frame.x0
    assert box.x1 <= frame.x1
    assert box.y0 >= frame.y0


def test_the_page_lists_targets_with_why_and_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    args = ["simulate", "--hosts", "6", "--vms", "40", "--hours", "2", "--policy", "vm_evenly_distributed"]
    assert cli.main([*args, "--plot", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "<h2>Quality targets</h2>" in page
    assert "VM count spread at the end" in page
    assert re.search(r'<tr class="(met|missed)">', page)
    assert "<h2>Workload</h2>" in page
    assert "generated-6h-40vm-2h-seed1" in page
    assert re.search(r"\d+ x (32|64) cores \(\d+ threads\), \d+ GB, [\d.]+-[\d.]+ W", page)


# ------------------------------------------------------------------------------ documented
def test_every_report_key_is_documented() -> None:
    r = policy_report("p", 1, Counts(), Timing(1.0, 0.0, 60.0), [blank(0.0, 1, 1)])
    text = DOCS.read_text(encoding="utf-8")
    missing = [k for k in r.as_json(with_samples=False) if f"`{k}`" not in text]
    assert not missing, f"report keys not in {DOCS.name}: {missing}"
    sample_keys = [f.name for f in dataclasses.fields(Sample)]
    missing = [k for k in sample_keys if f"`{k}`" not in text]
    assert not missing, f"sample keys not in {DOCS.name}: {missing}"


def test_the_operator_uses_the_policys_high_utilization() -> None:
    w = one_host([{"mem_mb": 1024, "vcpus": 1, "cpu_usage_pct": 1.0}])
    assert Recorder.for_policy(w, {"HighUtilization": "65"}).operator.high_utilization == 65.0
    assert Recorder.for_policy(w, {"HighUtilization": "65"}).cpu_limit_pct == 65.0
    # Unset: the SLA line is the unit's default, the packing headroom all of a CPU.
    assert (Recorder.for_policy(w, {}).operator.high_utilization, Recorder.for_policy(w, {}).cpu_limit_pct) == (
        80.0,
        100.0,
    )
