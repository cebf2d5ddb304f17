"""What happens on the simulated clock besides placing: VMs starting (pending meanwhile), the
load curve, maintenance drains, power actions, HA-reservation checks, a workload's own policies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Simulation
from vmsched.simulation.generator import GeneratorSpec, generate, load_curve
from vmsched.simulation.report import Recorder, Sample
from vmsched.simulation.workload import HostFailure, HostSpec, MaintenanceWindow, VmArrival, Workload
from vmsched_services.tools import cli

NONE = BUILTIN_POLICIES["none"]


def vm(at: float, name: str, mem_gb: int = 4, **kw: object) -> VmArrival:
    return VmArrival.model_validate({"at_s": at, "vm_id": name, "mem_mb": mem_gb * 1024, "vcpus": 2, **kw})


def workload(*arrivals: VmArrival, hosts: int = 3, mem_gb: int = 16, **kw: object) -> Workload:
    spec = HostSpec(id="h", count=hosts, cpu_cores=16, mem_mb=mem_gb * 1024)
    data = {"hosts": [spec], "arrivals": list(arrivals), "duration_s": 3600.0, "sample_interval_s": 60.0, **kw}
    return Workload.model_validate(data)


def run(w: Workload, policy: str = "none") -> tuple[Simulation, list[Sample]]:
    recorder = Recorder()
    sim = Simulation(w, BUILTIN_POLICIES[policy], recorder)
    asyncio.run(sim.run())
    return sim, recorder.samples


# ------------------------------------------------------------------------------ starting VMs
def test_a_starting_vm_is_pending_so_the_next_one_goes_elsewhere() -> None:
    # Each 16 GB host holds one 10 GB VM. Both arrive before the first has started: only its
    # pending record keeps the second off the same host.
    w = workload(vm(0, "a", mem_gb=10), vm(5, "b", mem_gb=10), hosts=2, start_delay_s=30.0)
    sim, _ = run(w)
    assert not sim.counts.failures
    assert {sim.where("a"), sim.where("b")} == {"h1", "h2"}


def test_a_vm_runs_after_its_start_delay_and_one_whose_host_fails_meanwhile_is_lost() -> None:
    w = workload(
        vm(0, "a", pinned_hosts=["h1"]),
        vm(0, "b", pinned_hosts=["h2"]),
        hosts=2,
        start_delay_s=120.0,
        failures=[HostFailure(at_s=60, host_id="h2")],
    )
    seen: dict[float, int] = {}
    sim = Simulation(w, NONE, lambda snap: seen.__setitem__(snap.at_s, int(snap.table.vm_count.sum())))
    asyncio.run(sim.run())
    assert (seen[60.0], seen[120.0]) == (0, 1)  # pending until 120, then running
    assert sim.where("a") == "h1"
    assert sim.where("b") is None
    assert (sim.counts.starts_lost, sim.counts.vms_lost) == (1, 0)


def test_a_vm_leaving_before_it_started_is_a_departure() -> None:
    sim, _ = run(workload(vm(0, "a", lifetime_s=10.0), start_delay_s=60.0))
    assert sim.counts.departures == 1
    assert sim.where("a") is None
    assert not sim.pending()


# ------------------------------------------------------------------------------ the load curve
def test_the_load_curve_scales_every_vms_cpu_load_by_the_hour() -> None:
    curve = [1.0] * 24
    curve[1] = 2.0  # 01:00-02:00 of the simulated day (the clock starts at midnight UTC)
    w = workload(
        vm(0, "a", cpu_usage_pct=40.0), vm(0, "b", cpu_usage_pct=70.0), load_curve=curve, duration_s=3 * 3600.0
    )
    loads: dict[float, float] = {}
    sim = Simulation(w, NONE, lambda snap: loads.__setitem__(snap.at_s, float(snap.table.cpu_usage_pct.sum())))
    asyncio.run(sim.run())
    # 2 vCPUs of 16 CPUs each: 40% -> 5%, 70% -> 8.75% of the host; doubled (capped at 100% per VM).
    assert loads[0.0] == pytest.approx(13.75)
    assert loads[3600.0] == pytest.approx(22.5)
    assert loads[7200.0] == pytest.approx(13.75)
    assert sim.counts.load_changes == 2


def test_a_load_curve_must_have_an_hour_each() -> None:
    with pytest.raises(ValueError, match=r"(?s)load_curve.*not 24"):
        workload(load_curve=[1.0] * 23)


def test_the_generated_load_curve_follows_the_day() -> None:
    curve = load_curve(0.5)
    assert len(curve) == 24
    assert min(curve) == curve[2] == pytest.approx(0.5, abs=0.01)  # before dawn
    assert max(curve) == curve[14] == pytest.approx(1.5, abs=0.01)  # mid-afternoon
    w = generate(GeneratorSpec(hosts=4, vms=10, hours=1))
    assert w.load_curve == curve
    assert w.start_delay_s == 30.0


# ------------------------------------------------------------------------------ maintenance
def test_a_drain_with_no_room_leaves_the_vm_and_tries_again_each_balancing_interval() -> None:
    w = workload(
        vm(0, "big", mem_gb=10, pinned_hosts=["h1"]),
        vm(0, "blocker", mem_gb=10, pinned_hosts=["h2"]),
        vm(0, "spare", mem_gb=2, pinned_hosts=["h2"]),
        hosts=2,
        balance_interval_s=600.0,
        maintenance=[MaintenanceWindow(host_id="h1", start_s=100, end_s=3000)],
        departures=[{"at_s": 1000, "vm_id": "blocker"}],
    )
    sim, _ = run(w)
    # At 100 and 700 h2 has no room; the try at 1300 (after the blocker left) moves it.
    assert sim.counts.drain_unplaced == 2
    assert sim.counts.drain_migrations == 1
    assert sim.where("big") == "h2"


# ------------------------------------------------------------------------------ power
def power_workload(**kw: object) -> Workload:
    """Six hosts, three small VMs: power saving packs them and powers off the empty hosts but two."""
    power = {"EnableAutomaticHostPowerManagement": "true", "HostsInReserve": "2"}
    vms = [vm(0, f"v{i}", mem_gb=2, cpu_usage_pct=10.0) for i in range(3)]
    settings: dict[str, object] = {"duration_s": 2 * 3600.0, "policy_properties": power, **kw}
    return workload(*vms, hosts=6, mem_gb=16, **settings)


def test_power_saving_powers_off_empty_hosts_down_to_the_reserve() -> None:
    sim, samples = run(power_workload(), "power_saving")
    used = samples[-1].hosts_used
    assert sim.counts.power_offs == 6 - used - 2
    assert samples[-1].hosts_on == used + 2
    assert samples[0].hosts_on == 6
    off = [h for h in sim.table.ids if sim.host_status(h).value == "down"]
    assert len(off) == sim.counts.power_offs
    assert all(not sim.vms_on(h) for h in off)


def test_advice_is_only_counted_without_power_actions() -> None:
    sim, samples = run(power_workload(power_actions=False), "power_saving")
    assert sim.counts.power_advice > 0
    assert sim.counts.power_offs == sim.counts.power_ons == 0
    assert samples[-1].hosts_on == 6


def test_a_host_powered_on_comes_up_after_its_boot_delay() -> None:
    # A failure takes an Up host away: fewer empty hosts than the reserve, so a powered-off one is
    # powered on, and is Up power_on_delay_s later.
    w = power_workload(failures=[HostFailure(at_s=3600, host_id="h6")], power_on_delay_s=600.0)
    sim, samples = run(w, "power_saving")
    assert sim.counts.power_ons >= 1
    by_time = {s.at_s: s.hosts_on for s in samples}
    assert by_time[3600.0 + 540.0] < by_time[3600.0 + 660.0]


# ------------------------------------------------------------------------------ HA reservation
def test_ha_checks_raise_an_alert_when_a_hosts_ha_vms_could_not_restart_and_recover() -> None:
    # Two 16 GB hosts; h1 runs a 10 GB HA VM; h2 has room for it until "filler" takes the room.
    w = workload(
        vm(0, "ha", mem_gb=10, ha=True, pinned_hosts=["h1"]),
        vm(400, "filler", mem_gb=10, pinned_hosts=["h2"], lifetime_s=1200.0),
        hosts=2,
        cluster={"ha_reservation": True},
    )
    sim, _ = run(w)
    c = sim.counts
    assert c.ha_checks == 12  # every 300 s for an hour
    # Checks at 600..1500 fail (filler on h2 from 400 to 1600), the others pass.
    assert (c.ha_checks_failed, c.ha_alerts, c.ha_recoveries) == (4, 1, 1)
    assert c.ha_failing_hosts_max == 1
    assert sim.ha_failing() == []
    assert sim.policy.properties["HaReservation"] == "true"


def test_no_ha_checks_without_ha_reservation() -> None:
    sim, _ = run(workload(vm(0, "ha", ha=True)))
    assert sim.counts.ha_checks == 0
    assert sim.ha_failing() is None


# ------------------------------------------------------------------------------ the workload's policies
def test_a_workloads_own_policies_are_simulated_and_nameable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = workload(vm(0, "a")).model_dump(mode="json")
    data["policies"] = [
        {"name": "mine", "filters": [{"unit": "Memory"}], "weights": [{"unit": "OptimalForEvenCpuDistribution"}]}
    ]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    assert cli.main(["simulate", "--workload", str(path), "--json"]) == 0
    assert [p["policy"] for p in json.loads(capsys.readouterr().out)["policies"]] == ["mine"]
    assert cli.main(["simulate", "--workload", str(path), "--policy", "mine", "--policy", "none", "--json"]) == 0
    assert [p["policy"] for p in json.loads(capsys.readouterr().out)["policies"]] == ["mine", "none"]
    data["policies"][0]["weights"] = [{"unit": "OptimalForEvenCpuDistributon"}]
    path.write_text(json.dumps(data))
    assert cli.main(["simulate", "--workload", str(path)]) == 2
    assert "the workload's policy mine" in capsys.readouterr().err
