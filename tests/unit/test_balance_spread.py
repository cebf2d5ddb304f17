"""EvenCpuSpread's placement weight, move choice and hysteresis, the even_spread policy, and the
disruption budgets every balance unit obeys."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, pend, table, vm_report
from tests.factories import vm as new_vm
from vmsched.errors import InvalidProperty
from vmsched.scheduling.balancing import balance_pass
from vmsched.scheduling.budgets import Budget, BudgetLimits, MigrationLedger, MoveRecord
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.units.balance_spread import EVEN_CPU_SPREAD, SPREAD_TIE, even_spread_balance, spread_weight
from vmsched.scheduling.units.base import IdleKind
from vmsched.scheduling.units.helpers import VCPU_CONSUMPTION_PCT
from vmsched.scheduling.units.weights import WORST_WEIGHT, even_cpu_weight
from vmsched.simulation.engine import simulate
from vmsched.simulation.generator import GeneratorSpec, generate

T = 1_700_000_000.0
vmr = partial(vm_report, CLUSTER, mem_mb=512)
PROPS = {"SpreadThreshold": "6", "ImbalanceHoldMinutes": "5", "MinimumGainPercent": "1", "HighUtilization": "80"}


def cluster(loads: dict[str, float], since_min: float = 30.0) -> HostTable:
    hosts = [
        host(h, cpu_usage_pct=load, cpu_cores=10, vm_count=2, cpu_samples=[(T - since_min * 60, load)])
        for h, load in loads.items()
    ]
    return replace(table(*hosts), as_of=T)


# h1 at 40 % of 10 CPUs: a VM of 100 % of 2 CPUs is 20 points there.
VMS = [
    vmr("big", "h1", vcpus=2, cpu_usage_pct=100),
    vmr("small", "h1", vcpus=1, cpu_usage_pct=30),
    vmr("other", "h2", vcpus=1, cpu_usage_pct=20),
]


def test_moves_the_vm_that_brings_the_busiest_host_into_the_band() -> None:
    out = even_spread_balance(cluster({"h1": 40, "h2": 20, "h3": 10}), VMS, PROPS)
    assert out.migration is not None
    # Mean 23.3, band [20.3, 26.3]: "small" (3 points) leaves h1 at 37; "big" (20) leaves it at 20
    # and h3 at 30: more load back in the band, and the spread 40 -> 10.
    assert out.migration.vm_id == "big"
    assert out.migration.source_host == "h1"
    assert out.migration.candidates == ("h3",)  # h2 would go to 40: the spread would not narrow


def test_idle_without_imbalance() -> None:
    out = even_spread_balance(cluster({"h1": 22, "h2": 20, "h3": 18}), VMS, PROPS)
    assert out.migration is None
    assert out.idle_kind is IdleKind.NO_IMBALANCE
    assert "<= SpreadThreshold 6" in out.idle


def test_idle_until_the_imbalance_has_held() -> None:
    fresh = cluster({"h1": 40, "h2": 20, "h3": 10}, since_min=2.0)
    out = even_spread_balance(fresh, VMS, PROPS)
    assert out.migration is None
    assert out.idle_kind is IdleKind.NOT_HELD
    # Held for 2 minutes: a hold of 1 minute is over.
    assert even_spread_balance(fresh, VMS, {**PROPS, "ImbalanceHoldMinutes": "1"}).migration is not None


def test_idle_when_no_move_gains_the_margin() -> None:
    tiny = [vmr("t", "h1", vcpus=1, cpu_usage_pct=3)]  # 0.3 points off h1, 0.3 onto h3
    out = even_spread_balance(cluster({"h1": 40, "h2": 20, "h3": 10}), tiny, PROPS)
    assert out.migration is None
    assert out.idle_kind is IdleKind.GAIN_BELOW_MARGIN
    assert "MinimumGainPercent 1" in out.idle


def test_unit_declares_its_properties() -> None:
    assert set(EVEN_CPU_SPREAD.properties) >= {"SpreadThreshold", "ImbalanceHoldMinutes", "MinimumGainPercent"}
    assert BUILTIN_POLICIES["even_spread"].balance == "EvenCpuSpread"
    assert BUILTIN_POLICIES["evenly_distributed"].balance == "OptimalForEvenCpuDistribution"  # oVirt's kept


# ------------------------------------------------------------------ placing
def loads(*hosts: tuple[int, float]) -> HostTable:
    """Hosts h0, h1, ... of (cores, CPU %)."""
    return table(*(host(f"h{i}", cpu_cores=c, cpu_usage_pct=pct) for i, (c, pct) in enumerate(hosts)))


def best(weights: np.ndarray) -> int:
    return int(np.argmin(weights))


def test_a_large_vm_goes_where_its_expected_load_adds_fewest_points() -> None:
    # 16 vCPUs at 50 %: 8 CPUs, 12.5 points of a 64-core host and 25 of a 32-core one.
    hosts = loads((64, 20.0), (32, 18.0), (32, 25.0))
    big = new_vm(vcpus=16, cpu_usage_pct=50.0)
    w = spread_weight(hosts, big, {})
    assert best(w) == 0
    # Spread with it on h0: 32.5 - 18; on h1: 43 - 20; on h2: 50 - 18 (and a hundredth of the load after).
    assert w == pytest.approx([14.5 + SPREAD_TIE * 32.5, 23.0 + SPREAD_TIE * 43.0, 32.0 + SPREAD_TIE * 50.0])
    # oVirt's weight counts the new VM at 10 % a vCPU and rounds: h0 and h1 tie at 23 %.
    assert list(even_cpu_weight(hosts, big, {})[:2]) == [23.0, 23.0]


def test_a_small_vm_raises_the_idlest_host_rather_than_the_least_loaded_after_it() -> None:
    # 4 vCPUs at 50 %: 6.25 points on the idlest (32 cores, 10 %), 3.1 on h1 (64 cores, 10.5 %):
    # h1 would be less loaded after it, but on h0 it lifts the cluster's minimum to 10.5.
    hosts = loads((32, 10.0), (64, 10.5), (32, 30.0))
    w = spread_weight(hosts, new_vm(vcpus=4, cpu_usage_pct=50.0), {})
    assert best(w) == 0
    assert w[0] == pytest.approx(30.0 - 10.5 + SPREAD_TIE * 16.25)


def test_of_hosts_that_leave_the_spread_alike_the_less_loaded_after_wins() -> None:
    # 1 vCPU at 64 %: 2 points on h1 (32 cores), 1 on h2 (64 cores); neither moves the ends.
    hosts = loads((32, 10.0), (32, 20.0), (64, 20.0), (32, 30.0))
    w = spread_weight(hosts, new_vm(vcpus=1, cpu_usage_pct=64.0), {})
    assert w[2] < w[1]
    assert w[1] - w[2] == pytest.approx(SPREAD_TIE * 1.0)


def test_a_vm_without_an_expected_load_counts_vcpu_consumption_and_pending_vcpus_count() -> None:
    hosts = table(
        host("h0", cpu_cores=10, cpu_usage_pct=10.0),
        host("h1", cpu_cores=10, cpu_usage_pct=20.0),
        pending=[pend("h0", vcpus=5)],
    )
    w = spread_weight(hosts, new_vm(vcpus=2), {})
    # h0: 10 % + 5 pending vCPUs x 10 % / 10 CPUs = 15 %; the VM adds 2 x 10 % / 10 = 2 points.
    assert w[0] == pytest.approx(20.0 - 17.0 + SPREAD_TIE * 17.0)
    assert w[1] == pytest.approx(22.0 - 15.0 + SPREAD_TIE * 22.0)
    assert VCPU_CONSUMPTION_PCT == 10.0


def test_a_host_of_unknown_cpus_is_worst_and_left_out_of_the_spread() -> None:
    hosts = table(host("h0", cpu_cores=0, cpu_usage_pct=99.0), host("h1", cpu_cores=8), host("h2", cpu_cores=8))
    w = spread_weight(hosts, new_vm(vcpus=1, cpu_usage_pct=80.0), {})
    assert w[0] == WORST_WEIGHT
    assert w[1] == pytest.approx(10.0 + SPREAD_TIE * 10.0)  # h1 at 10 %, h2 at 0: h0's 99 % counts nowhere
    unknown = table(host("h0", cpu_cores=0), host("h1", cpu_cores=0))
    assert list(spread_weight(unknown, new_vm(vcpus=1), {})) == [WORST_WEIGHT, WORST_WEIGHT]


def test_even_spread_places_by_the_spread_and_ovirts_policies_keep_ovirts_weights() -> None:
    even = BUILTIN_POLICIES["even_spread"]
    assert [(w.unit, w.factor) for w in even.weights][:1] == [("EvenCpuSpread", 2)]
    assert not {w.unit for w in even.weights} & {"OptimalForEvenCpuDistribution", "OptimalForEvenMemoryDistribution"}
    for name in ("none", "evenly_distributed", "cluster_maintenance"):
        assert [(w.unit, w.factor) for w in BUILTIN_POLICIES[name].weights][:2] == [
            ("OptimalForEvenCpuDistribution", 2),
            ("OptimalForEvenMemoryDistribution", 1),
        ]
    assert all(
        "EvenCpuSpread" not in {w.unit for w in p.weights} for n, p in BUILTIN_POLICIES.items() if n != "even_spread"
    )


def test_even_spread_lets_a_host_take_part_in_three_migrations_an_hour_the_cluster_a_quarter() -> None:
    limits = BudgetLimits.from_props(BUILTIN_POLICIES["even_spread"].properties, 50)
    assert (limits.per_host_hour, limits.per_cluster_hour) == (3.0, 12.5)
    assert BUILTIN_POLICIES["even_spread"].properties["SpreadThreshold"] == "8"


# ------------------------------------------------------------------ budgets
LIMITS = BudgetLimits(per_host_hour=1, per_cluster_hour=2, concurrent=1, return_cooldown_s=4 * 3600)


def test_budget_properties_defaults_and_errors() -> None:
    limits = BudgetLimits.from_props({}, 40)
    assert (limits.per_host_hour, limits.per_cluster_hour, limits.concurrent) == (1.0, 10.0, 2)
    assert limits.return_cooldown_s == 240 * 60
    with pytest.raises(InvalidProperty, match="ConcurrentMigrations"):
        BudgetLimits.from_props({"ConcurrentMigrations": "many"}, 40)


def test_pass_says_budget_exhausted_and_strikes_returns() -> None:
    t = cluster({"h1": 40, "h2": 20, "h3": 10})
    ledger = MigrationLedger(LIMITS.return_cooldown_s, [MoveRecord(T - 60, "x", "h4", "h5")])
    ledger.record(MoveRecord(T - 50, "y", "h6", "h7"))
    pick = balance_pass(EVEN_CPU_SPREAD, PROPS, t, VMS, Budget(LIMITS, ledger, T, 0))
    assert pick.migration is None
    assert pick.idle_kind is IdleKind.BUDGET_EXHAUSTED
    # "big" left h3 an hour ago (outside the hour, inside the return cool-down): h3 is struck.
    ledger = MigrationLedger(LIMITS.return_cooldown_s, [MoveRecord(T - 3700, "big", "h3", "h1")])
    ledger.prune(T)
    pick = balance_pass(EVEN_CPU_SPREAD, PROPS, t, VMS, Budget(LIMITS, ledger, T, 0))
    # Its only target struck, the unit is asked again without it: "small" goes instead.
    assert pick.migration is not None
    assert pick.migration.vm_id == "small"


moves = st.lists(
    st.tuples(
        st.floats(0, 600),
        st.sampled_from(["v1", "v2", "v3"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(moves, st.integers(0, 3))
def test_budgets_never_exceeded_over_random_moves(asked: list[tuple[float, str, str, list[str]]], flying: int) -> None:
    """Whatever is asked, in whatever order, what the budgets admit keeps every limit."""
    limits = BudgetLimits(per_host_hour=1, per_cluster_hour=3, concurrent=2, return_cooldown_s=7200)
    ledger = MigrationLedger(limits.return_cooldown_s)
    now, done = 0.0, []
    for step, vm, source, candidates in asked:
        now += step
        ledger.prune(now)
        budget = Budget(limits, ledger, now, flying)
        if budget.exhausted() is not None:
            continue
        admitted = budget.admit(vm, source, [c for c in candidates if c != source])
        if admitted:
            move = MoveRecord(now, vm, source, admitted[0])
            ledger.record(move)
            done.append(move)
    assert flying < 2 or not done
    for m in done:
        window = [d for d in done if m.at_s - 3600 < d.at_s <= m.at_s]
        assert len(window) <= 3
        for h in (m.source, m.target):
            assert sum(h in (d.source, d.target) for d in window) <= 1
        back = [d for d in done if d.vm_id == m.vm_id and d.source == m.target and 0 <= m.at_s - d.at_s < 7200]
        assert not back


# ------------------------------------------------------------------ simulation
@pytest.mark.parametrize("policy", ["even_spread", "power_saving"])
def test_simulated_day_keeps_budgets_and_no_returns(policy: str) -> None:
    hosts, hours = 12, 6.0
    w = generate(GeneratorSpec(hosts=hosts, vms=240, hours=hours, seed=3))
    counts, _ = asyncio.run(simulate(w, BUILTIN_POLICIES[policy]))
    assert counts.ping_pongs == 0
    assert counts.migrations_started <= 0.25 * hosts * hours
    passes_idle = sum(counts.idle.values())
    assert passes_idle > 0
    assert set(counts.idle) <= {k.value for k in IdleKind}
