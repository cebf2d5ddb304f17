"""Weight units: hand-computed raw weights, property regexes, and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import floats as w
from tests.factories import host, hosts_n, pend, table, vm
from vmsched.errors import InvalidProperty
from vmsched.scheduling.units.base import Direction, PolicyUnit, validate_properties
from vmsched.scheduling.units.registry import REGISTRY
from vmsched.scheduling.units.weights import (
    EVEN_CPU,
    EVEN_GUEST,
    EVEN_MEMORY,
    POWER_SAVING_CPU,
    WEIGHT_UNITS,
    WORST_WEIGHT,
    even_cpu_weight,
    even_guest_weight,
    even_memory_weight,
    java_round,
    power_saving_cpu_weight,
)


# ------------------------------------------------------------------------------------ the units
def test_weight_units_are_declared() -> None:
    assert {u.name for u in WEIGHT_UNITS} >= {
        "OptimalForEvenCpuDistribution",
        "OptimalForEvenMemoryDistribution",
        "OptimalForCpuPowerSaving",
        "OptimalForEvenGuestDistribution",
    }
    for unit in WEIGHT_UNITS:
        assert unit.weight is not None
        assert unit.filter is None
        assert unit.direction is Direction.LOWER_IS_BETTER
        assert unit.description
        assert unit.summary
        assert REGISTRY[unit.name] is unit


@pytest.mark.parametrize("unit", WEIGHT_UNITS, ids=lambda u: u.name)
def test_zero_and_one_host(unit: PolicyUnit) -> None:
    assert unit.weight is not None
    props = validate_properties(unit, {})
    assert unit.weight(table(), vm(), props).shape == (0,)
    one = unit.weight(hosts_n(1), vm(), props)
    assert one.shape == (1,)
    assert np.isfinite(one).all()


@pytest.mark.parametrize("unit", WEIGHT_UNITS, ids=lambda u: u.name)
def test_all_hosts_equal_get_equal_weights(unit: PolicyUnit) -> None:
    assert unit.weight is not None
    raw = unit.weight(hosts_n(4, cpu_usage_pct=30, vm_count=2), vm(), validate_properties(unit, {}))
    assert len(set(raw.tolist())) == 1


# ------------------------------------------------------------------------------------ properties
def test_defaults_fill_in() -> None:
    assert validate_properties(EVEN_CPU, {}) == {
        "HighUtilization": "80",
        "CpuOverCommitDurationMinutes": "2",
        "VCpuToPhysicalCpuRatio": "0",
    }
    assert validate_properties(POWER_SAVING_CPU, {})["LowUtilization"] == "20"
    assert validate_properties(EVEN_GUEST, {}) == {
        "HighVmCount": "10",
        "MigrationThreshold": "5",
        "SpmVmGrace": "5",
    }
    assert validate_properties(EVEN_MEMORY, {"HighUtilization": "x"}) == {}


@pytest.mark.parametrize(
    ("unit", "prop", "good", "bad"),
    [
        (EVEN_CPU, "HighUtilization", ["50", "80", "99"], ["49", "100", "8", "80%", ""]),
        (POWER_SAVING_CPU, "LowUtilization", ["0", "9", "20", "49"], ["50", "100", "-1"]),
        (EVEN_CPU, "CpuOverCommitDurationMinutes", ["1", "2", "120"], ["0", "01", "1.5"]),
        (EVEN_CPU, "VCpuToPhysicalCpuRatio", ["0", "1.5", "2.25", "0.0"], ["3", "2.", "-1", "1,5"]),
        (EVEN_GUEST, "HighVmCount", ["0", "9", "10", "250"], ["01", "-1", "x"]),
        (EVEN_GUEST, "MigrationThreshold", ["2", "9", "10", "15"], ["0", "1", "01"]),
        (EVEN_GUEST, "SpmVmGrace", ["0", "5", "12"], ["05", "-5"]),
    ],
)
def test_property_regexes(unit: PolicyUnit, prop: str, good: list[str], bad: list[str]) -> None:
    for value in good:
        assert validate_properties(unit, {prop: value})[prop] == value
    for value in bad:
        with pytest.raises(InvalidProperty) as info:
            validate_properties(unit, {prop: value})
        assert info.value.prop == prop
        assert info.value.value == value
        assert info.value.regex == unit.properties[prop].regex


def test_java_round_is_half_up() -> None:
    assert w(java_round(np.array([12.5, 12.49, -12.5, -12.51, 0.5]))) == [13, 12, -12, -13, 1]


# ------------------------------------------------------------------------------------ even CPU
def test_even_cpu_is_projected_load_per_cpu() -> None:
    # busy: (50 % x 4 + 10 % x 2 vCPUs) / 4 = 55; idle: (10 x 4 + 20) / 4 = 15.
    hosts = table(host("busy", cpu_usage_pct=50), host("idle", cpu_usage_pct=10))
    assert w(even_cpu_weight(hosts, vm(vcpus=2), {})) == [55, 15]


def test_even_cpu_counts_spm_and_pending() -> None:
    # spm: (40 + 10 x 1 SPM vCPU + 20) / 4 = 17.5 -> 18; pending: (40 + 10 x 4 + 20) / 4 = 25.
    hosts = table(
        host("spm", cpu_usage_pct=10, is_spm=True),
        host("pending", cpu_usage_pct=10),
        pending=[pend("pending", vcpus=4)],
    )
    assert w(even_cpu_weight(hosts, vm(vcpus=2), {})) == [18, 25]


def test_even_cpu_uses_threads_when_cluster_counts_them() -> None:
    h = host("h1", cpu_cores=4, cpu_threads=8, cpu_usage_pct=50)
    assert w(even_cpu_weight(table(h), vm(vcpus=2), {})) == [55]
    # (50 x 8 + 20) / 8 = 52.5 -> 53.
    assert w(even_cpu_weight(table(h, threads=True), vm(vcpus=2), {})) == [53]


def test_even_cpu_migration_uses_measured_load_and_adds_nothing_at_source() -> None:
    hosts = table(host("src", cpu_usage_pct=50), host("dst", cpu_usage_pct=10))
    spec = vm(vcpus=2, cpu_usage_pct=30, current_host="src")
    # src: 50 (already there); dst: (40 + 30 x 2) / 4 = 25.
    assert w(even_cpu_weight(hosts, spec, {})) == [50, 25]


def test_even_cpu_vcpu_ratio_penalty() -> None:
    hosts = table(
        host("full", cpu_usage_pct=50, vcpus_committed=4),
        host("roomy", cpu_usage_pct=10, vcpus_committed=2),
    )
    spec = vm(vcpus=2)
    # full: (4 + 2) / 4 = 1.5, not < 1.5 -> 55 x 1000; roomy: (2 + 2) / 4 = 1 -> 15.
    assert w(even_cpu_weight(hosts, spec, {"VCpuToPhysicalCpuRatio": "1.5"})) == [55000, 15]
    assert w(even_cpu_weight(hosts, spec, {"VCpuToPhysicalCpuRatio": "1.6"})) == [55, 15]
    assert w(even_cpu_weight(hosts, spec, {"VCpuToPhysicalCpuRatio": "0"})) == [55, 15]


def test_even_cpu_ratio_counts_pending_vcpus() -> None:
    hosts = table(host("h1", vcpus_committed=2), pending=[pend("h1", vcpus=2)])
    # (2 + 2 + 2) / 4 = 1.5 -> penalized at 1.5; load (0 + 20 pending + 20) / 4 = 10.
    assert w(even_cpu_weight(hosts, vm(vcpus=2), {"VCpuToPhysicalCpuRatio": "1.5"})) == [10000]


def test_even_cpu_unknown_topology_is_worst() -> None:
    hosts = table(host("unknown", cpu_cores=0), host("h2", cpu_usage_pct=100))
    raw = even_cpu_weight(hosts, vm(), {})
    assert raw[0] == WORST_WEIGHT
    assert raw[0] > raw[1]


# ------------------------------------------------------------------------------------ power saving
def test_power_saving_prefers_busiest_host_under_high() -> None:
    hosts = table(host("half", cpu_usage_pct=50), host("idle", cpu_usage_pct=10), host("hot", cpu_usage_pct=90))
    # hot: 90 x 4 = 360 > 80 x 4 -> worst; others: negated projected load.
    assert w(power_saving_cpu_weight(hosts, vm(vcpus=2), {})) == [-55, -15, WORST_WEIGHT]
    # HighUtilization 95: hot stays eligible, (360 + 20) / 4 = 95.
    assert w(power_saving_cpu_weight(hosts, vm(vcpus=2), {"HighUtilization": "95"})) == [-55, -15, -95]


def test_power_saving_threshold_is_strict_and_counts_spm() -> None:
    at = host("at", cpu_usage_pct=80)
    spm = host("spm", cpu_usage_pct=80, is_spm=True)  # 320 + 10 > 320
    raw = power_saving_cpu_weight(table(at, spm), vm(vcpus=2), {"HighUtilization": "80"})
    assert w(raw) == [-85, WORST_WEIGHT]


def test_power_saving_overloaded_and_unknown_tie() -> None:
    hosts = table(host("hot1", cpu_usage_pct=95), host("hot2", cpu_usage_pct=99), host("x", cpu_cores=0))
    assert w(power_saving_cpu_weight(hosts, vm(), {})) == [WORST_WEIGHT] * 3


def test_power_saving_is_zero_not_negative_zero() -> None:
    hosts = table(host("idle"))
    raw = power_saving_cpu_weight(hosts, vm(current_host="idle"), {})
    assert raw[0] == 0
    assert not np.signbit(raw[0])


# ------------------------------------------------------------------------------------ even memory
def test_even_memory_hand_computed() -> None:
    hosts = table(host("empty"), host("half", mem_committed_mb=2048))
    # max scheduling memory 4096 and 2048; VM needs 1088; denominator 4096 - 1.
    # empty: 1000 - round(3007 x 999 / 4095 = 733.57) = 266; half: 1000 - round(233.95) = 766.
    assert w(even_memory_weight(hosts, vm(), {})) == [266, 766]


def test_even_memory_counts_pending_like_committed() -> None:
    committed = table(host("a", mem_committed_mb=2048), host("b", mem_committed_mb=2048))
    pending = table(host("a", mem_committed_mb=2048), host("b"), pending=[pend("b", mem_mb=2048)])
    assert w(even_memory_weight(committed, vm(), {})) == w(even_memory_weight(pending, vm(), {}))


def test_even_memory_overcommit_and_reserved() -> None:
    hosts = table(host("a", reserved_mem_mb=321), host("b"), overcommit=200)
    raw = even_memory_weight(hosts, vm(), {})
    assert raw[0] > raw[1]  # reserved memory leaves a less free
    # b: 8192 - 1088 = 7104 -> 1000 - round(7103 x 999 / 8191) = 1000 - 866 = 134.
    assert raw[1] == 134


def test_even_memory_source_host_keeps_its_memory() -> None:
    hosts = table(host("src", mem_committed_mb=1088), host("dst"))
    raw = even_memory_weight(hosts, vm(current_host="src"), {})
    # Same free scheduling memory after the move: src already holds the VM.
    assert raw[0] == raw[1]


def test_even_memory_hosts_without_memory_stay_finite() -> None:
    hosts = table(host("a", physical_mem_mb=0, mem_free_mb=0), host("b", physical_mem_mb=0, mem_free_mb=0))
    raw = even_memory_weight(hosts, vm(), {})
    assert np.isfinite(raw).all()
    assert raw[0] == raw[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 16384), min_size=1, max_size=8), st.integers(1, 4096))
def test_even_memory_is_decreasing_in_free_scheduling_memory(committed: list[int], mem: int) -> None:
    hosts = table(*(host(f"h{i}", physical_mem_mb=16384, mem_committed_mb=c) for i, c in enumerate(committed)))
    raw = even_memory_weight(hosts, vm(mem_mb=mem), {})
    free = [16384 - c for c in committed]
    for i in range(len(free)):
        for j in range(len(free)):
            if free[i] > free[j]:
                assert raw[i] <= raw[j]


# ------------------------------------------------------------------------------------ even guest
def test_even_guest_counts_slots() -> None:
    hosts = table(
        host("three", vm_count=3),
        host("spm", vm_count=1, is_spm=True),
        host("pending"),
        pending=[pend("pending"), pend("pending")],
    )
    assert w(even_guest_weight(hosts, vm(), {})) == [3, 6, 2]
    assert w(even_guest_weight(hosts, vm(), {"SpmVmGrace": "0"})) == [3, 1, 2]
    assert w(even_guest_weight(hosts, vm(), {"SpmVmGrace": "12"})) == [3, 13, 2]


# ------------------------------------------------------------------------------------ invariants
host_specs = st.lists(
    st.fixed_dictionaries(
        {
            "cpu_cores": st.integers(0, 64),
            "cpu_usage_pct": st.floats(0, 100),
            "physical_mem_mb": st.integers(0, 1 << 20),
            "mem_committed_mb": st.integers(0, 1 << 20),
            "vm_count": st.integers(0, 200),
            "vcpus_committed": st.integers(0, 512),
            "is_spm": st.booleans(),
        }
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(host_specs, st.integers(1, 64), st.sampled_from(["0", "1.5", "2"]))
def test_weights_are_finite_and_aligned(specs: list[dict[str, object]], vcpus: int, ratio: str) -> None:
    hosts = table(*(host(f"h{i}", **s) for i, s in enumerate(specs)))
    for unit in WEIGHT_UNITS:
        assert unit.weight is not None
        props = validate_properties(unit, {"VCpuToPhysicalCpuRatio": ratio})
        raw = unit.weight(hosts, vm(vcpus=vcpus), props)
        assert raw.shape == (len(hosts),)
        assert np.isfinite(raw).all()
        assert (raw <= WORST_WEIGHT).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=2, max_size=8))
def test_even_cpu_and_power_saving_order_opposite_below_high(usages: list[float]) -> None:
    usages = [min(u, 75.0) for u in usages]  # stay below HighUtilization 80 with the VM's load
    hosts = table(*(host(f"h{i}", cpu_usage_pct=u) for i, u in enumerate(usages)))
    even = even_cpu_weight(hosts, vm(vcpus=1), {})
    saving = power_saving_cpu_weight(hosts, vm(vcpus=1), {"HighUtilization": "80"})
    assert w(saving) == w(-even + 0.0)
