"""The simulator's shortcuts give what the straightforward computation gives: first-fit-decreasing
worked out over the bins it reaches against over every bin, the hosts as bins kept between samples
against made again, the lower bound from an array against from a list; and a small generated day's
figures pinned, so a faster engine or sampler that changes a result is caught."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.contracts import ClusterReport
from vmsched.scheduling.host_aggregates import aggregate_host
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy
from vmsched.simulation import engine
from vmsched.simulation.engine import Simulation, host_report, simulate
from vmsched.simulation.generator import GeneratorSpec, generate
from vmsched.simulation.packing_bound import bins_of, ffd_bins, lower_bound
from vmsched.simulation.records import Sampler
from vmsched.simulation.report import Recorder, policy_report
from vmsched.simulation.workload import HostSpec, Workload


def reference_ffd(
    items: Mapping[tuple[float, ...], int], capacities: Sequence[Sequence[float]]
) -> tuple[npt.NDArray[np.bool_], int]:
    """First-fit-decreasing over every bin for every size (what ffd_bins did before it stopped at
    the bins it reaches)."""
    if not capacities:
        return np.zeros(0, dtype=np.bool_), sum(items.values())
    free = np.array([list(c) for c in capacities], dtype=np.float64)
    used = np.zeros(len(free), dtype=np.bool_)
    overflow = 0
    for size, count in sorted(items.items(), key=lambda kv: tuple(-x for x in kv[0])):
        if count <= 0:
            continue
        need = np.asarray(size, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_dim = np.where(need > 0, np.floor(free / np.where(need > 0, need, 1.0)), np.inf)
        room = np.minimum(per_dim.min(axis=1), float(count))
        before = np.concatenate(([0.0], np.cumsum(room)[:-1]))
        take = np.clip(count - before, 0.0, room)
        free -= take[:, None] * need[None, :]
        used |= take > 0
        overflow += round(float(count - take.sum()))
    return used, overflow


sizes = st.tuples(
    st.sampled_from([512.0, 1024.0, 2048.0, 4096.0, 8192.0, 0.0]),
    st.integers(1, 16).map(float),
    st.sampled_from([0.0, 25.0, 50.0, 100.0, 175.0, 400.0]),
)
capacity = st.tuples(
    st.sampled_from([16384.0, 65536.0, 262144.0]),
    st.sampled_from([math.inf, 32.0, 128.0]),
    st.sampled_from([800.0, 3200.0, 6400.0]),
)


@settings(max_examples=200, deadline=None)
@given(
    items=st.dictionaries(sizes, st.integers(0, 400), max_size=12),
    caps=st.lists(capacity, min_size=0, max_size=300),
)
def test_ffd_over_the_bins_it_reaches_equals_ffd_over_all(
    items: dict[tuple[float, ...], int], caps: list[tuple[float, float, float]]
) -> None:
    used, overflow = ffd_bins(items, caps)
    ref_used, ref_overflow = reference_ffd(items, caps)
    assert used.tolist() == ref_used.tolist()
    assert overflow == ref_overflow
    as_array = ffd_bins(items, np.array(caps, dtype=np.float64).reshape(len(caps), 3))
    assert as_array[0].tolist() == ref_used.tolist()
    assert as_array[1] == ref_overflow
    assert lower_bound(items, np.array(caps, dtype=np.float64).reshape(len(caps), 3)) == lower_bound(items, caps)


def _table(cores: Sequence[int]) -> HostTable:
    settings_ = ClusterReport(cluster_id="sim", memory_overcommit_pct=150)
    specs = [HostSpec(id=f"h{n:03d}", cpu_cores=c, mem_mb=1024 * c) for n, c in enumerate(cores)]
    states = [aggregate_host(host_report(s, s.id), []) for s in specs]
    return HostTable.from_states(states, settings_)


def _fresh_bins(
    table: HostTable, alive: Sequence[str], ratio: float | None, limit: float
) -> list[tuple[float, float, float]]:
    idx = table.index_of(alive)
    mem = min(100.0, float(table.settings.memory_overcommit_pct)) * table.physical_mem_mb[idx] / 100.0
    mem = mem - table.reserved_mem_mb[idx]
    cpus = table.effective_cpus[idx]
    vcpus = cpus * ratio if ratio is not None else np.full(len(idx), math.inf)
    load = cpus * limit
    order = np.lexsort((np.asarray(alive), -load, -mem))
    return [(float(mem[i]), float(vcpus[i]), float(load[i])) for i in order]


@settings(max_examples=60, deadline=None)
@given(
    cores=st.lists(st.sampled_from([4, 8, 16, 64]), min_size=1, max_size=40),
    calls=st.lists(
        st.tuples(st.integers(0, 2**40), st.sampled_from([None, 4.0]), st.sampled_from([80.0, 100.0])),
        min_size=1,
        max_size=6,
    ),
)
def test_bins_kept_between_samples_equal_bins_made_again(
    cores: list[int], calls: list[tuple[int, float | None, float]]
) -> None:
    tables = [_table(cores), _table([c * 2 for c in cores])]
    for n, (mask, ratio, limit) in enumerate(calls):
        table = tables[n % 2]
        alive = [h for i, h in enumerate(table.ids) if not mask >> i & 1]
        for _ in range(2):  # the second call is the kept answer
            bins = bins_of(table, alive, ratio, limit)
            assert [tuple(r) for r in bins.tolist()] == _fresh_bins(table, alive, ratio, limit)


def test_a_small_generated_days_figures_are_pinned() -> None:
    # A faster engine or sampler must not change a result: these are the figures before either.
    workload = generate(GeneratorSpec(hosts=30, vms=300, hours=6, seed=5))
    policy = BUILTIN_POLICIES["none"]
    recorder = Recorder.for_policy(workload, policy.properties)
    counts, timing = asyncio.run(simulate(workload, policy, recorder))
    r = policy_report("none", 30, counts, timing, recorder.samples, policy.properties)
    got = {k: getattr(r, k) for k in PINNED}
    assert got == PINNED


PINNED: dict[str, object] = {
    "placed": 300,
    "departures": 124,
    "hosts_used_mean": 27.29,
    "ffd_hosts_mean": 1.71,
    "ffd_hosts_final": 3,
    "packing_ratio_mean": 17.222,
    "packing_ratio_of_means": 15.976,
    "cpu_capacity_ratio_mean": 11.905,
    "cpu_spread_mean": 7.7,
    "cpu_std_mean": 1.64,
    "mem_spread_mean": 8.38,
    "vm_count_spread_final": 9,
    "vm_count_max_final": 13,
    "ha_per_host_max_final": 4,
    "energy_kwh": 33.556,
    "power_kw_mean": 5.593,
    "cpu_hours_wanted": 285.888,
    "vcpu_ratio_mean": 0.272,
    "vcpu_ratio_max": 0.641,
    "mem_overcommit_mean": 0.069,
    "mem_overcommit_max": 0.161,
}


def test_states_kept_through_load_changes_equal_states_made_again() -> None:
    # The hour's load curve changes only the VMs' CPU load: those hosts' states are the last ones
    # with the new load, which must be what making them again from their VMs gives.
    workload = generate(GeneratorSpec(hosts=12, vms=150, hours=8, seed=2))
    assert workload.load_curve
    checked: list[int] = []

    def check(_: object) -> None:
        sim.current_table()
        for h in workload.host_ids():
            assert sim._states[h] == sim.host_state(h), h
        checked.append(1)

    for name in ("none", "power_saving"):
        sim = Simulation(workload, BUILTIN_POLICIES[name], check)
        asyncio.run(sim.run())
    assert len(checked) > 10


def test_the_collector_runs_rarely_while_the_cluster_is_built_and_the_day_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's thresholds are GC_THRESHOLD from before the cluster is built (10,000 hosts'
    reports and states are as many allocations as a stretch of the day) to the end of the run, and
    are the caller's again after, also when building the cluster fails."""
    seen: list[tuple[int, ...]] = []

    class Watched(engine.Simulation):
        def __init__(self, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> None:
            seen.append(gc.get_threshold())
            super().__init__(workload, policy, sampler)

    class Broken(engine.Simulation):
        def __init__(self, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> None:
            raise RuntimeError("no cluster")

    workload = generate(GeneratorSpec(hosts=4, vms=10, hours=1, seed=3))
    before = gc.get_threshold()
    monkeypatch.setattr(engine, "Simulation", Watched)
    asyncio.run(engine.simulate(workload, BUILTIN_POLICIES["none"]))
    assert seen == [engine.GC_THRESHOLD]
    assert gc.get_threshold() == before
    monkeypatch.setattr(engine, "Simulation", Broken)
    with pytest.raises(RuntimeError):
        asyncio.run(engine.simulate(workload, BUILTIN_POLICIES["none"]))
    assert gc.get_threshold() == before
