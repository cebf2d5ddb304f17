"""The simulator: workloads (format, schema, generator), the packing bound, the event loop, the
built-in scenarios and the `vmsched simulate` command."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.contracts import ScheduleRequest
from vmsched.errors import InvalidRequest
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.placement import Outcome, Placed
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Simulation, decide
from vmsched.simulation.generator import GeneratorSpec, generate
from vmsched.simulation.packing_bound import first_fit_decreasing
from vmsched.simulation.scenarios import SCENARIOS, load_scenario
from vmsched.simulation.workload import (
    HostFailure,
    HostSpec,
    MaintenanceWindow,
    VmArrival,
    VmDeparture,
    Workload,
    dump_workload,
    parse_workload,
    schema_text,
)
from vmsched_services.tools import cli
from vmsched_services.tools.simulate import policies_of

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "workload.schema.json"
NONE = BUILTIN_POLICIES["none"]


def run(sim: Simulation) -> None:
    asyncio.run(sim.run())


def vm(at: float, name: str, mem_gb: int = 4, **kw: object) -> VmArrival:
    return VmArrival.model_validate({"at_s": at, "vm_id": name, "mem_mb": mem_gb * 1024, "vcpus": 2, **kw})


def cluster(*arrivals: VmArrival, hosts: int = 3, mem_gb: int = 16, **kw: object) -> Workload:
    spec = HostSpec(id="h", count=hosts, cpu_cores=16, mem_mb=mem_gb * 1024)
    return Workload.model_validate({"hosts": [spec], "arrivals": list(arrivals), "duration_s": 3600.0, **kw})


# ------------------------------------------------------------------------------ workloads
def test_committed_schema_is_the_models_schema() -> None:
    # Regenerate: vmsched simulate --schema > docs/workload.schema.json
    assert SCHEMA.read_text(encoding="utf-8") == schema_text()


def test_simulate_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "Workload"


def test_yaml_round_trip_and_json_reads_too() -> None:
    w = generate(GeneratorSpec(hosts=5, vms=40, hours=2, seed=3))
    assert parse_workload(dump_workload(w)) == w
    assert parse_workload(json.dumps(w.model_dump(mode="json"))) == w


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("hosts: [", "not valid YAML"),
        ("- 1", "expected a mapping"),
        ("hosts: []", "hosts: List should have at least 1 item"),
        (
            "hosts: [{id: h, cpu_cores: 4, mem_mb: 1024}]\nfailures: [{at_s: 1, host_id: x}]",
            "failures.0: host x: no such host; hosts are h",
        ),
        (
            "hosts: [{id: h, cpu_cores: 4, mem_mb: 1024}]\narrivals: [{at_s: 0, vm_id: a, mem_mb: 1, vcpus: 1, "
            "affinity_groups: [g]}]",
            "arrivals.0.affinity_groups: vm a names affinity group g: no such affinity group; affinity groups are none",
        ),
        ("hosts: [{id: h, cpu_cores: 4, mem_mb: 1024, cpus: 3}]", "hosts.0.cpus: Extra inputs are not permitted"),
    ],
)
def test_bad_workloads_say_what_and_where(text: str, where: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_workload(text, "w.yaml")
    assert str(err.value).startswith("w.yaml: ")
    assert where in str(err.value)


def test_host_counts_expand_to_numbered_ids() -> None:
    assert HostSpec(id="r1-", count=12, cpu_cores=1, mem_mb=1).ids()[:2] == ["r1-01", "r1-02"]
    assert HostSpec(id="solo", cpu_cores=1, mem_mb=1).ids() == ["solo"]


# ------------------------------------------------------------------------------ generator
def test_generator_is_deterministic_for_a_seed_and_differs_across_seeds() -> None:
    a = generate(GeneratorSpec(hosts=10, vms=200, hours=12, seed=5))
    b = generate(GeneratorSpec(hosts=10, vms=200, hours=12, seed=5))
    c = generate(GeneratorSpec(hosts=10, vms=200, hours=12, seed=6))
    assert a == b
    assert dump_workload(a) == dump_workload(b)
    assert a.arrivals != c.arrivals


def test_generated_mix_has_the_documented_shapes() -> None:
    w = generate(GeneratorSpec(hosts=20, vms=2000, hours=24, seed=2))
    arrivals = w.arrivals
    assert len(arrivals) == 2000
    assert len(w.host_ids()) == 20
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    assert {(a.vcpus, a.mem_mb // 1024) for a in arrivals} <= {(1, 2), (2, 4), (4, 8), (8, 16), (16, 32)}
    ha = sum(a.ha for a in arrivals) / len(arrivals)
    stay = sum(a.lifetime_s is None for a in arrivals) / len(arrivals)
    assert 0.15 < ha < 0.25
    assert 0.25 < stay < 0.35
    # diurnal: the afternoon (12-18 h) is busier than the small hours (0-6 h)
    night = sum(a.at_s < 6 * 3600 for a in arrivals)
    afternoon = sum(12 * 3600 <= a.at_s < 18 * 3600 for a in arrivals)
    assert afternoon > 1.5 * night
    # bursts: some minute holds far more arrivals than the mean
    per_minute = [0] * (24 * 60)
    for a in arrivals:
        per_minute[int(a.at_s // 60)] += 1
    assert max(per_minute) >= 10 * len(arrivals) / len(per_minute)


# ------------------------------------------------------------------------------ packing bound
def _optimum(items: list[tuple[int, int]], caps: list[tuple[int, int]]) -> int | None:
    """Fewest bins holding every item (brute force), None when they cannot all fit."""
    best: int | None = None
    for assignment in itertools.product(range(len(caps)), repeat=len(items)):
        load = [[0, 0] for _ in caps]
        for (m, c), b in zip(items, assignment, strict=True):
            load[b][0] += m
            load[b][1] += c
        if all(lm <= cm and lc <= cc for (lm, lc), (cm, cc) in zip(load, caps, strict=True)):
            used = len(set(assignment))
            best = used if best is None else min(best, used)
    return best


def _counts(items: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


sizes = st.tuples(st.integers(1, 10), st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(sizes, min_size=0, max_size=6),
    bins=st.integers(1, 4),
    cap=st.tuples(st.integers(5, 12), st.integers(2, 8)),
)
def test_ffd_never_beats_the_optimum_and_is_close_on_identical_bins(
    items: list[tuple[int, int]], bins: int, cap: tuple[int, int]
) -> None:
    caps = [cap] * bins
    used, overflow = first_fit_decreasing(_counts(items), caps)
    best = _optimum(items, caps)
    if best is None:
        assert overflow > 0  # FFD cannot pack what nothing packs
        return
    if overflow == 0:
        assert used >= best
        # one dimension: FFD <= 11/9 OPT + 6/9; two dimensions are looser, but never past every bin
        if cap[1] >= sum(c for _, c in items):  # the vCPUs never bind: one dimension
            assert used <= 11 / 9 * best + 6 / 9
    assert used <= bins


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(sizes, min_size=0, max_size=30),
    caps=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 10)), min_size=1, max_size=8),
)
def test_ffd_equals_first_fit_one_item_at_a_time(items: list[tuple[int, int]], caps: list[tuple[int, int]]) -> None:
    # the grouped version (all copies of a size at once) is the textbook algorithm
    free = [list(c) for c in caps]
    used = set()
    overflow = 0
    for m, c in sorted(items, reverse=True):
        for b, room in enumerate(free):
            if room[0] >= m and room[1] >= c:
                room[0] -= m
                room[1] -= c
                used.add(b)
                break
        else:
            overflow += 1
    assert first_fit_decreasing(_counts(items), caps) == (len(used), overflow)


# ------------------------------------------------------------------------------ the engine
def test_arrivals_place_and_departures_free() -> None:
    w = cluster(vm(0, "a"), vm(10, "b", lifetime_s=100.0), vm(20, "c"), departures=[VmDeparture(at_s=50, vm_id="a")])
    sim = Simulation(w, NONE)
    run(sim)
    assert sim.counts.placed == 3
    assert sim.counts.departures == 2
    assert sim.where("a") is None
    assert sim.where("b") is None
    host = sim.where("c")
    assert host is not None
    table = sim.current_table()
    i = table.index[host]
    assert table.vm_count.sum() == 1
    assert table.mem_committed_mb[i] == 4096 + 64
    assert table.vm_ids[i] == frozenset({"c"})


def test_full_cluster_fails_placements_with_the_memory_filter_as_reason() -> None:
    w = cluster(*(vm(i, f"v{i}", mem_gb=8) for i in range(5)), hosts=2, mem_gb=16)
    sim = Simulation(w, NONE)
    run(sim)
    # 16 GB - 321 MB reserved holds one 8 GB VM (+ overhead) per host
    assert sim.counts.placed == 2
    assert [f.vm_id for f in sim.counts.failures] == ["v2", "v3", "v4"]
    assert all(f.filters == ("Memory",) for f in sim.counts.failures)
    assert "0/2 hosts available" in sim.counts.failures[0].summary


def test_a_failed_host_loses_its_vms_and_takes_none_until_repaired() -> None:
    pinned = [vm(0, f"p{i}", ha=(i == 0), pinned_hosts=["h1"]) for i in range(2)]
    w = cluster(
        *pinned,
        vm(200, "during", pinned_hosts=["h1"]),
        vm(400, "after", pinned_hosts=["h1"]),
        failures=[HostFailure(at_s=100, host_id="h1", repair_s=200)],
    )
    sim = Simulation(w, NONE)
    run(sim)
    assert sim.counts.host_failures == 1
    assert sim.counts.vms_lost == 2
    # The HA one is restarted at once, and fails: pinned to h1, which is down.
    assert (sim.counts.ha_restarted, sim.counts.ha_vms_lost) == (0, 1)
    assert [(f.vm_id, f.restart) for f in sim.counts.failures] == [("p0", True), ("during", False)]
    assert sim.counts.failures[1].filters == ("PinToHost",)  # h1 is no candidate; the others are not its pin
    assert sim.vms_on("h1") == frozenset({"after"})


def test_maintenance_hosts_are_drained_and_get_nothing_new_until_it_ends() -> None:
    w = cluster(
        vm(0, "old", pinned_hosts=["h2"]),  # pinned to start there; it may move afterwards
        *(vm(100 + i, f"new{i}", mem_gb=1) for i in range(6)),
        vm(700, "later", pinned_hosts=["h2"]),
        maintenance=[MaintenanceWindow(host_id="h2", start_s=50, end_s=600)],
    )
    sim = Simulation(w, NONE)
    run(sim)
    assert not sim.counts.failures
    assert sim.where("old") in {"h1", "h3"}  # moved off when maintenance began (after the migration delay)
    assert sim.vms_on("h2") == frozenset({"later"})
    assert {sim.where(f"new{i}") for i in range(6)} == {"h1", "h3"}
    assert (sim.counts.drain_migrations, sim.counts.migrations, sim.counts.drain_unplaced) == (1, 0, 0)


class Checked(Simulation):
    """Decides as the engine does, and checks that `place` on a table built afresh from the
    engine's host states (the state tracker's view) with the migrations in flight pending on their
    targets decides the same."""

    checked = 0

    async def decide(self, request: ScheduleRequest, now: float) -> Outcome:
        outcome = await super().decide(request, now)
        fresh = HostTable.from_states(self.host_states(), self.settings)
        again = await decide(fresh, self.policy, request, now, self.pending())
        assert type(again) is type(outcome)
        if isinstance(outcome, Placed):
            assert isinstance(again, Placed)
            assert again.placements == outcome.placements
        Checked.checked += 1
        return outcome


@pytest.mark.parametrize("policy", ["none", "power_saving", "vm_evenly_distributed"])
def test_each_placement_is_what_place_decides_on_the_trackers_view(policy: str) -> None:
    w = generate(GeneratorSpec(hosts=8, vms=120, hours=6, seed=9))
    Checked.checked = 0
    sim = Checked(w, BUILTIN_POLICIES[policy])
    run(sim)
    c = sim.counts
    assert Checked.checked == 120 + c.migrations_started + c.migrations_unplaced


def test_a_run_is_deterministic() -> None:
    w = generate(GeneratorSpec(hosts=6, vms=150, hours=4, seed=4))
    a, b = Simulation(w, NONE), Simulation(w, NONE)
    run(a)
    run(b)
    assert [a.where(x.vm_id) for x in w.arrivals] == [b.where(x.vm_id) for x in w.arrivals]


# ------------------------------------------------------------------------------ scenarios
def test_every_scenario_loads() -> None:
    for name in SCENARIOS:
        assert load_scenario(name).name == name


def test_even_vm_count_scenario_starts_as_the_example_does_and_is_balanced() -> None:
    sim = Simulation(load_scenario("even-vm-count"), BUILTIN_POLICIES["vm_evenly_distributed"])
    seen: dict[float, list[int]] = {}
    sim.sampler = lambda snap: seen.__setitem__(snap.at_s, [int(n) for n in snap.table.vm_count])
    run(sim)
    assert seen[0.0] == [12, 10, 8, 9, 6]
    assert sim.policy.properties["MigrationThreshold"] == "4"
    # The balancer moves VM1 then VM2 (the least loaded on VDS1) to the host with fewest VMs, then
    # the counts are within MigrationThreshold of each other and nothing moves again.
    assert seen[600.0] == seen[3600.0] == [10, 10, 8, 9, 8]
    assert (sim.where("VM1"), sim.where("VM2")) == ("VDS5", "VDS5")
    assert (sim.counts.migrations, sim.counts.ping_pongs) == (2, 0)


def test_ha_reservation_scenario_spreads_ha_vms_two_per_host_and_the_check_foretells_the_failover() -> None:
    sim = Simulation(load_scenario("ha-reservation"), NONE)
    seen: dict[float, list[float]] = {}
    sim.sampler = lambda snap: seen.__setitem__(snap.at_s, list(snap.table.ha_vm_count))
    run(sim)
    assert seen[3300.0] == [2.0, 2.0, 2.0, 2.0]  # the example's optimal count, before the failure
    c = sim.counts
    # The check passes at 300 and 600 s (before the 20 GB VMs fill the hosts), fails from 900 s on
    # with one alert; when h1 fails its two HA VMs find no room elsewhere, as the check said.
    assert (c.ha_checks, c.ha_checks_failed, c.ha_alerts, c.ha_recoveries) == (24, 22, 1, 0)
    assert c.ha_failing_hosts_max == 4
    assert (c.vms_lost, c.ha_restarted, c.ha_vms_lost) == (3, 0, 2)
    assert [(f.vm_id, f.restart, f.filters) for f in c.failures] == [
        ("ha1", True, ("Memory",)),
        ("ha5", True, ("Memory",)),
    ]
    assert c.failures[0].summary.startswith("restarting HA VM ha1 after its host failed: 0/3 hosts available")


def test_ha_reservation_balance_scenario_moves_nothing_until_a_host_has_five() -> None:
    w = load_scenario("ha-reservation-balance")
    (policy,) = policies_of([], w)
    sim = Simulation(w, policy)
    counts: dict[float, list[int]] = {}
    sim.sampler = lambda snap: counts.__setitem__(snap.at_s, [int(n) for n in snap.table.ha_vm_count])
    run(sim)
    # Optimal 2 (7 HA VMs on 4 hosts) x OverUtilization 200%: h1's 4 stay.
    assert counts[1740.0] == [4, 1, 1, 1]
    # The eighth makes 5 on h1; the next pass moves one of them (the least CPU-hungry, ha1) to a
    # host below the optimal count, after the migration delay; then 4 is not over 4 and nothing moves.
    assert counts[1800.0] == [5, 1, 1, 1]
    assert counts[3600.0][0] == 4
    assert sorted(counts[3600.0]) == [1, 1, 2, 4]
    assert sim.where("ha1") != "h1"
    assert (sim.counts.migrations, sim.counts.ping_pongs) == (1, 0)


# ------------------------------------------------------------------------------ the command
def test_simulate_command_prints_policies_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["simulate", "--hosts", "6", "--vms", "80", "--hours", "3", "--policy", "none", "--policy", "power_saving"]
    )
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if "power_saving" in line)
    assert header.split() == ["none", "power_saving"]
    assert "VMs placed / asked" in out
    assert "FFD bound" in out
    assert "VM events / s" in out


def test_simulate_json_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scenario", "ha-reservation", "--policy", "none", "--json", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    data = json.loads(capsys.readouterr().out)
    (report,) = data["policies"]
    assert report["policy"] == "none"
    assert report["placed"] == 12
    assert report["ha_vms_lost"] == 2
    full = json.loads((tmp_path / "report.json").read_text())
    assert full["policies"][0]["samples"]
    assert parse_workload((tmp_path / "workload.yaml").read_text()) == load_scenario("ha-reservation")


def test_simulate_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps(cluster(vm(0, "a"), vm(1, "b")).model_dump(mode="json")))
    pol = tmp_path / "p.yaml"
    pol.write_text(
        "policies:\n- name: memory-only\n  filters: [Memory]\n  weights: [{unit: OptimalForEvenMemoryDistribution}]\n"
    )
    assert cli.main(["simulate", "--workload", str(wl), "--policy", str(pol), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["policies"]
    assert report["policy"] == "memory-only"
    assert report["placed"] == 2


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--workload", "/nonexistent/w.yaml"], "/nonexistent/w.yaml: cannot read it"),
        (["--scenario", "nope"], "no scenario 'nope'"),
        (["--policy", "nope"], "--policy nope: neither a built-in policy nor a file"),
    ],
)
def test_simulate_usage_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *argv]) == 2
    assert said in capsys.readouterr().err


def test_simulate_bad_workload_file_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("hosts: [{id: h, cpu_cores: 0, mem_mb: 1}]\n")
    assert cli.main(["simulate", "--workload", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: 1 problem(s)" in err
    assert "hosts.0.cpu_cores" in err


CSV_WORKLOAD = """kind,id,at_s,end_s,count,cpu_cores,mem_mb,vcpus,ha,cpu_usage_pct,networks,lifetime_s,repair_s,value
setting,start_delay_s,,,,,,,,,,,,30
setting,cluster.ha_reservation,,,,,,,,,,,,true
setting,policy_properties.HighUtilization,,,,,,,,,,,,70
setting,load_curve,,,,,,,,,,,,0.5;0.5;0.5;0.5;0.5;0.5;1;1;1;1;1;1;1.5;1.5;1.5;1.5;1.5;1.5;1;1;1;1;1;1
host,h,,,3,16,65536,,,,vmnet;storage,,,
arrival,vm1,0,,,,4096,2,true,30,vmnet,3600,,
arrival,vm2,60,,,,2048,1,false,10,,,,
departure,vm2,1800,,,,,,,,,,,
failure,h2,2400,,,,,,,,,,600,
maintenance,h3,100,900,,,,,,,,,,
"""

YAML_WORKLOAD = """
name: w.csv
start_delay_s: 30
cluster: {ha_reservation: true}
policy_properties: {HighUtilization: "70"}
load_curve: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1, 1, 1, 1, 1, 1, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1, 1, 1, 1, 1, 1]
hosts: [{id: h, count: 3, cpu_cores: 16, mem_mb: 65536, networks: [vmnet, storage]}]
arrivals:
  - {vm_id: vm1, at_s: 0, mem_mb: 4096, vcpus: 2, ha: true, cpu_usage_pct: 30, networks: [vmnet], lifetime_s: 3600}
  - {vm_id: vm2, at_s: 60, mem_mb: 2048, vcpus: 1, cpu_usage_pct: 10}
departures: [{vm_id: vm2, at_s: 1800}]
failures: [{host_id: h2, at_s: 2400, repair_s: 600}]
maintenance: [{host_id: h3, start_s: 100, end_s: 900}]
"""


def test_a_csv_workload_is_the_same_workload_as_its_yaml() -> None:
    assert parse_workload(CSV_WORKLOAD, "data/w.csv") == parse_workload(YAML_WORKLOAD, "w.yaml")


def test_a_broken_csv_workload_says_which_line_or_column() -> None:
    with pytest.raises(InvalidRequest, match="line 7: kind 'vm' is not one of host, arrival"):
        parse_workload(CSV_WORKLOAD.replace("arrival,vm1", "vm,vm1"), "w.csv")
    with pytest.raises(InvalidRequest, match=r"\(unknown: colour\)"):
        parse_workload("kind,id,colour\nhost,h,red\n", "w.csv")
    with pytest.raises(InvalidRequest, match=r"arrivals\.0\.mem_mb"):
        parse_workload(CSV_WORKLOAD.replace("4096", "lots"), "w.csv")
    with pytest.raises(InvalidRequest, match="line 2: setting 'start_delay' is not a workload setting"):
        parse_workload(CSV_WORKLOAD.replace("setting,start_delay_s", "setting,start_delay"), "w.csv")
    with pytest.raises(InvalidRequest, match="line 2: setting 'arrivals' is not a workload setting"):
        parse_workload(CSV_WORKLOAD.replace("setting,start_delay_s", "setting,arrivals"), "w.csv")
    with pytest.raises(InvalidRequest, match=r"start_delay_s: Input should be a valid number"):
        parse_workload(CSV_WORKLOAD.replace(",30\n", ",soon\n", 1), "w.csv")
