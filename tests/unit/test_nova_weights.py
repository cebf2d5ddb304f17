"""Nova weighers: hand-computed raw weights, Nova's normalization through the MinMaxSelector, and
the sign convention (vmsched totals = Nova totals + a constant per host)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, hosts_n, pend, table, vm
from tests.factories import floats as w
from vmsched.contracts import ClusterReport, HostState
from vmsched.errors import InvalidProperty, SchedulingError
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.selection import WeighedUnit, min_max_points, min_max_select
from vmsched.scheduling.units.base import Direction, PolicyUnit, validate_properties
from vmsched.scheduling.units.nova_weights import (
    BUILD_FAILURE_WEIGHER,
    CPU_WEIGHER,
    DISK_WEIGHER,
    IO_OPS_WEIGHER,
    METRICS_WEIGHER,
    NOVA_DEFAULT_FACTORS,
    NOVA_WEIGHT_UNITS,
    NUM_INSTANCES_WEIGHER,
    RAM_WEIGHER,
    build_failure_weight,
    free_disk_weight,
    free_ram_weight,
    free_vcpus_weight,
    io_ops_weight,
    metrics_weight,
    num_instances_weight,
    parse_weight_setting,
)
from vmsched.scheduling.units.registry import REGISTRY

LOWER = Direction.LOWER_IS_BETTER
HIGHER = Direction.HIGHER_IS_BETTER


def grouped(*hosts: HostState, groups: dict[str, dict[str, str]], pending: Sequence[Any] = ()) -> HostTable:
    settings_ = ClusterReport(cluster_id=CLUSTER, host_groups=groups)
    return HostTable.from_states(list(hosts), settings_).with_pending(pending)


def weigh(unit: PolicyUnit, hosts: HostTable, props: dict[str, str] | None = None) -> np.ndarray:
    assert unit.weight is not None
    return unit.weight(hosts, vm(), validate_properties(unit, props or {}))


def weighed(unit: PolicyUnit, factor: float, hosts: HostTable, props: dict[str, str] | None = None) -> WeighedUnit:
    """What the pipeline hands the selector for this unit."""
    return WeighedUnit(
        unit=unit.name,
        factor=factor,
        raw=weigh(unit, hosts, props),
        direction=unit.direction,
        maximum=unit.maximum,
        minimum=unit.minimum,
    )


# ------------------------------------------------------------------------------------ the units
def test_units_are_declared_and_registered() -> None:
    assert [u.name for u in NOVA_WEIGHT_UNITS] == [
        "RAMWeigher",
        "CPUWeigher",
        "DiskWeigher",
        "IoOpsWeigher",
        "NumInstancesWeigher",
        "BuildFailureWeigher",
        "MetricsWeigher",
    ]
    for unit in NOVA_WEIGHT_UNITS:
        assert unit.weight is not None
        assert unit.filter is None
        assert unit.description
        assert unit.summary
        assert REGISTRY[unit.name] is unit
        assert unit.name in NOVA_DEFAULT_FACTORS
    # Nova's minval = 0 weighers.
    assert {u.name for u in NOVA_WEIGHT_UNITS if u.minimum == 0.0} == {
        "RAMWeigher",
        "CPUWeigher",
        "DiskWeigher",
        "IoOpsWeigher",
    }
    # Nova's negative-multiplier weighers report counts, lower is better.
    assert {u.name for u in NOVA_WEIGHT_UNITS if u.direction is LOWER} == {
        "IoOpsWeigher",
        "NumInstancesWeigher",
        "BuildFailureWeigher",
    }


def test_default_factors_are_novas_multipliers() -> None:
    # Nova: ram/cpu/disk/metrics 1.0, io_ops -1.0, num_instances 0.0, build_failure 1e6 (negated by Nova).
    assert NOVA_DEFAULT_FACTORS["RAMWeigher"] == 1.0
    assert NOVA_DEFAULT_FACTORS["IoOpsWeigher"] == 1.0
    assert NOVA_DEFAULT_FACTORS["NumInstancesWeigher"] == 0.0
    assert NOVA_DEFAULT_FACTORS["BuildFailureWeigher"] == 1_000_000.0


@pytest.mark.parametrize("unit", NOVA_WEIGHT_UNITS, ids=lambda u: u.name)
def test_zero_and_one_host(unit: PolicyUnit) -> None:
    assert weigh(unit, table()).shape == (0,)
    one = weigh(unit, hosts_n(1))
    assert one.shape == (1,)
    assert np.isfinite(one).all()
    # Min-max over one host: a minval-0 unit gives 1 (or 0 when the host has nothing), others 0.
    points = min_max_points(one, unit.direction, unit.minimum)
    assert points.shape == (1,)
    assert 0.0 <= points[0] <= 1.0


@pytest.mark.parametrize("unit", NOVA_WEIGHT_UNITS, ids=lambda u: u.name)
def test_all_hosts_equal(unit: PolicyUnit) -> None:
    hosts = hosts_n(4, mem_committed_mb=1024, vcpus_committed=2, disk_free_mb=500, vm_count=3, num_io_ops=2)
    raw = weigh(unit, hosts)
    assert len(set(raw.tolist())) == 1
    points = min_max_points(raw, unit.direction, unit.minimum)
    assert len(set(points.tolist())) == 1


def test_all_equal_without_fixed_minimum_normalizes_to_zero() -> None:
    raw = weigh(NUM_INSTANCES_WEIGHER, hosts_n(3, vm_count=5))
    assert w(raw) == [5, 5, 5]
    assert w(min_max_points(raw, NUM_INSTANCES_WEIGHER.direction, NUM_INSTANCES_WEIGHER.minimum)) == [0, 0, 0]
    # All-zero free RAM: min 0 == max 0 -> 0 everywhere (Nova), no division by zero.
    full = hosts_n(2, mem_committed_mb=4096)
    assert w(min_max_points(weigh(RAM_WEIGHER, full), HIGHER, 0.0)) == [0, 0]


# ------------------------------------------------------------------------------------ RAM
def test_ram_is_free_ram_without_allocation_ratio() -> None:
    hosts = table(
        host("a", physical_mem_mb=8192, reserved_mem_mb=512, mem_committed_mb=2048),
        host("b", physical_mem_mb=4096, mem_committed_mb=1024),
        pending=[pend("b", mem_mb=1024)],
    )
    # a: 8192 - 512 - 2048 = 5632; b: 4096 - 1024 - 1024 pending = 2048.
    assert w(free_ram_weight(hosts, vm(), {})) == [5632, 2048]
    # Free memory as measured (mem_free_mb) plays no part: Nova weighs its own accounting.
    measured = table(host("a", mem_free_mb=10, mem_committed_mb=1024))
    assert w(free_ram_weight(measured, vm(), {})) == [3072]


def test_ram_overcommitted_host_is_clamped_at_minval() -> None:
    hosts = table(host("over", mem_committed_mb=6000), host("ok", mem_committed_mb=1096))
    assert w(free_ram_weight(hosts, vm(), {})) == [0, 3000]


# ------------------------------------------------------------------------------------ CPU
def test_cpu_is_free_vcpus_under_the_allocation_ratio() -> None:
    hosts = table(
        host("a", cpu_cores=4, vcpus_committed=10),
        host("b", cpu_cores=8, vcpus_committed=100),
        pending=[pend("a", vcpus=6)],
    )
    # a: 4 x 16 - (10 + 6) = 48; b: 8 x 16 - 100 = 28.
    assert w(weigh(CPU_WEIGHER, hosts)) == [48, 28]
    # ratio 2: a: 8 - 16 < 0 -> 0 (minval); b: 16 - 100 -> 0.
    assert w(weigh(CPU_WEIGHER, hosts, {"CpuAllocationRatio": "2"})) == [0, 0]
    assert w(weigh(CPU_WEIGHER, hosts, {"CpuAllocationRatio": "20.5"})) == [66, 64]


def test_cpu_counts_threads_when_the_cluster_does() -> None:
    h = host("h", cpu_cores=4, cpu_threads=8, vcpus_committed=8)
    assert w(free_vcpus_weight(table(h), vm(), {"CpuAllocationRatio": "1.5"})) == [0]  # 6 - 8 -> 0 (minval)
    assert w(free_vcpus_weight(table(h, threads=True), vm(), {"CpuAllocationRatio": "1.5"})) == [4]


def test_cpu_ratio_from_host_group_metadata_lowest_wins() -> None:
    hosts = grouped(
        host("a", cpu_cores=4, host_groups=["g1", "g2"]),
        host("b", cpu_cores=4, host_groups=["g3"]),
        host("c", cpu_cores=4),
        host("d", cpu_cores=4, host_groups=["bad"]),
        groups={
            "g1": {"cpu_allocation_ratio": "4.0"},
            "g2": {"cpu_allocation_ratio": "2"},
            "g3": {"ram_allocation_ratio": "1.0"},
            "bad": {"cpu_allocation_ratio": "lots"},
        },
    )
    # a: min(4, 2) x 4 = 8; b: no cpu key -> property 3 x 4 = 12; c: no group -> 12; d: unreadable -> 12.
    assert w(weigh(CPU_WEIGHER, hosts, {"CpuAllocationRatio": "3"})) == [8, 12, 12, 12]


# ------------------------------------------------------------------------------------ disk, counts
def test_disk_is_free_disk() -> None:
    hosts = table(host("a", disk_total_mb=1000, disk_free_mb=300), host("b", disk_free_mb=0))
    assert w(free_disk_weight(hosts, vm(), {})) == [300, 0]
    # minval 0: the emptier host gets 1, the full one 0.
    assert w(min_max_points(weigh(DISK_WEIGHER, hosts), DISK_WEIGHER.direction, DISK_WEIGHER.minimum)) == [1, 0]


def test_io_ops_count_pending_builds() -> None:
    hosts = table(host("a", num_io_ops=3), host("b"), pending=[pend("b"), pend("b")])
    assert w(io_ops_weight(hosts, vm(), {})) == [3, 2]


def test_num_instances_counts_pending() -> None:
    hosts = table(host("a", vm_count=3), host("b", vm_count=1), pending=[pend("b"), pend("b"), pend("b")])
    assert w(num_instances_weight(hosts, vm(), {})) == [3, 4]


def test_build_failures() -> None:
    hosts = table(host("a", build_failures=2), host("b"))
    raw = build_failure_weight(hosts, vm(), {})
    assert w(raw) == [2, 0]
    # With Nova's factor one failure outweighs any sum of ordinary weighers (each at most 1 x factor).
    sel = min_max_select(
        hosts.ids,
        [
            weighed(BUILD_FAILURE_WEIGHER, NOVA_DEFAULT_FACTORS["BuildFailureWeigher"], hosts),
            WeighedUnit("RAMish", 1000.0, np.array([1.0, 0.0]), HIGHER, minimum=0.0),
        ],
    )
    assert sel.ordered_ids == ["b", "a"]


# ------------------------------------------------------------------------------------ metrics
def test_parse_weight_setting() -> None:
    assert parse_weight_setting("") == []
    assert parse_weight_setting("cpu.percent=1.0, mem = -2") == [("cpu.percent", 1.0), ("mem", -2.0)]


@pytest.mark.parametrize(
    ("prop", "good", "bad"),
    [
        ("WeightSetting", ["", "a=1", "a=1.0, b=-2.5", "cpu.percent=+1", " a = 1 "], ["a", "a=", "=1", "a=1,", "a=x"]),
        ("MetricsRequired", ["true", "false"], ["True", "yes", ""]),
        ("WeightOfUnavailable", ["-10000.0", "0", "5"], ["", "-", "1e3", "x"]),
    ],
)
def test_metrics_property_regexes(prop: str, good: list[str], bad: list[str]) -> None:
    for value in good:
        assert validate_properties(METRICS_WEIGHER, {prop: value})[prop] == value
    for value in bad:
        with pytest.raises(InvalidProperty) as info:
            validate_properties(METRICS_WEIGHER, {prop: value})
        assert (info.value.prop, info.value.value) == (prop, value)


def test_cpu_ratio_regex() -> None:
    for value in ("16.0", "1", "0.5"):
        assert validate_properties(CPU_WEIGHER, {"CpuAllocationRatio": value})["CpuAllocationRatio"] == value
    for value in ("-1", "1.", "x", ""):
        with pytest.raises(InvalidProperty):
            validate_properties(CPU_WEIGHER, {"CpuAllocationRatio": value})


def test_metrics_defaults() -> None:
    assert validate_properties(METRICS_WEIGHER, {}) == {
        "WeightSetting": "",
        "MetricsRequired": "true",
        "WeightOfUnavailable": "-10000.0",
    }
    assert w(weigh(METRICS_WEIGHER, hosts_n(2))) == [0, 0]


def test_metrics_sum_value_times_ratio() -> None:
    hosts = table(
        host("a", metrics={"cpu": 10.0, "mem": 2.0}),
        host("b", metrics={"cpu": 40.0, "mem": 1.0, "other": 99.0}),
    )
    # a: 10 x -1 + 2 x 3 = -4; b: -40 + 3 = -37.
    assert w(weigh(METRICS_WEIGHER, hosts, {"WeightSetting": "cpu=-1, mem=3"})) == [-4, -37]
    # Unvalidated props (a direct call) fall back to the defaults: nothing weighed.
    assert w(metrics_weight(hosts, vm(), {})) == [0, 0]


def test_metrics_missing_required_fails_the_request() -> None:
    hosts = table(host("a", metrics={"cpu": 1.0}), host("b"))
    with pytest.raises(SchedulingError, match=r"host b does not report metric 'cpu'"):
        weigh(METRICS_WEIGHER, hosts, {"WeightSetting": "cpu=1"})
    # Required even when its ratio is 0 (Nova raises before looking at the ratio).
    with pytest.raises(SchedulingError):
        weigh(METRICS_WEIGHER, hosts, {"WeightSetting": "cpu=0"})


def test_metrics_missing_not_required_weighs_unavailable() -> None:
    hosts = table(
        host("a", metrics={"cpu": 1.0, "mem": 5.0}),
        host("b", metrics={"mem": 5.0}),
        host("c", metrics={"cpu": 3.0}),
    )
    props = {"WeightSetting": "cpu=2, mem=1", "MetricsRequired": "false"}
    assert w(weigh(METRICS_WEIGHER, hosts, props)) == [7, -10000, -10000]
    assert w(weigh(METRICS_WEIGHER, hosts, {**props, "WeightOfUnavailable": "-5"})) == [7, -5, -5]
    # A missing metric with ratio 0 is skipped: the rest still counts (Nova).
    assert w(weigh(METRICS_WEIGHER, hosts, {**props, "WeightSetting": "cpu=0, mem=1"})) == [5, 5, -10000]


# ------------------------------------------------------------------------------------ end to end
def three_hosts() -> HostTable:
    """free RAM 6144 / 2048 / 3072 MB, io ops 4 / 0 / 1 (h3's one is a pending build)."""
    return table(
        host("h1", physical_mem_mb=8192, mem_committed_mb=2048, num_io_ops=4),
        host("h2", physical_mem_mb=8192, mem_committed_mb=6144),
        host("h3", physical_mem_mb=8192, mem_committed_mb=4096),
        pending=[pend("h3", mem_mb=1024)],
    )


def test_min_max_reproduces_novas_ordering() -> None:
    hosts = three_hosts()
    assert w(weigh(RAM_WEIGHER, hosts)) == [6144, 2048, 3072]
    assert w(weigh(IO_OPS_WEIGHER, hosts)) == [4, 0, 1]

    # Nova, RAM x1 + IoOps x-1: RAM / 6144 = [1, 1/3, 1/2]; io / 4 = [1, 0, 1/4] x -1
    # -> totals [0, 1/3, 1/4]: h2, h3, h1. vmsched (IoOps factor +1): [1, 4/3, 5/4], the same + 1.
    sel = min_max_select(hosts.ids, [weighed(RAM_WEIGHER, 1.0, hosts), weighed(IO_OPS_WEIGHER, 1.0, hosts)])
    assert sel.ordered_ids == ["h2", "h3", "h1"]
    assert sel.totals == pytest.approx([1.0, 4 / 3, 5 / 4])
    assert sel.points[0] == pytest.approx([1.0, 1 / 3, 1 / 2])
    assert sel.points[1] == pytest.approx([0.0, 1.0, 3 / 4])

    # RAM alone spreads: most free RAM first.
    spread = min_max_select(hosts.ids, [weighed(RAM_WEIGHER, 1.0, hosts)])
    assert spread.ordered_ids == ["h1", "h3", "h2"]
    # A negative multiplier stacks: least free RAM first (Nova: ram_weight_multiplier = -1).
    stack = min_max_select(hosts.ids, [weighed(RAM_WEIGHER, -1.0, hosts)])
    assert stack.ordered_ids == ["h2", "h3", "h1"]
    assert stack.totals == pytest.approx([-1.0, -1 / 3, -1 / 2])
    # IoOps with Nova's multiplier +1 (factor -1): the busiest host wins.
    busy = min_max_select(hosts.ids, [weighed(IO_OPS_WEIGHER, -1.0, hosts)])
    assert busy.ordered_ids == ["h1", "h3", "h2"]


def test_ram_stacking_beats_io_spreading_when_heavier() -> None:
    hosts = three_hosts()
    # RAM x-2 (stack) + IoOps x1: h1 -2 + 0 = -2; h2 -2/3 + 1 = 1/3; h3 -1 + 3/4 = -1/4.
    sel = min_max_select(hosts.ids, [weighed(RAM_WEIGHER, -2.0, hosts), weighed(IO_OPS_WEIGHER, 1.0, hosts)])
    assert sel.totals == pytest.approx([-2.0, 1 / 3, -1 / 4])
    assert sel.ordered_ids == ["h2", "h3", "h1"]


# ------------------------------------------------------------------------------------ Nova reference
def nova_normalize(weights: list[float], minval: float | None) -> list[float]:
    """nova.weights.normalize, transcribed."""
    if not weights:
        return []
    hi = max(weights)
    lo = min(weights) if minval is None else minval
    if lo == hi:
        return [0.0] * len(weights)
    return [(x - lo) / (hi - lo) for x in weights]


host_rows = st.lists(
    st.fixed_dictionaries(
        {
            "mem_committed_mb": st.integers(0, 6000),
            "num_io_ops": st.integers(0, 20),
            "vm_count": st.integers(0, 30),
            "build_failures": st.integers(0, 5),
            "vcpus_committed": st.integers(0, 100),
        }
    ),
    min_size=2,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(rows=host_rows, m_ram=st.floats(-3, 3), m_io=st.floats(-3, 3), m_inst=st.floats(-3, 3))
def test_totals_differ_from_novas_by_a_constant(
    rows: list[dict[str, int]], m_ram: float, m_io: float, m_inst: float
) -> None:
    """With Nova multipliers m, vmsched factors (m_ram, -m_io, -m_inst) give Nova's totals plus the
    same constant on every host: the same order, the same gaps."""
    hosts = table(*(host(f"h{i}", **row) for i, row in enumerate(rows)))
    ram = w(weigh(RAM_WEIGHER, hosts))
    io = w(weigh(IO_OPS_WEIGHER, hosts))
    inst = w(weigh(NUM_INSTANCES_WEIGHER, hosts))
    nova = (
        m_ram * np.array(nova_normalize(ram, 0.0))
        + m_io * np.array(nova_normalize(io, 0.0))
        + m_inst * np.array(nova_normalize(inst, None))
    )
    sel = min_max_select(
        hosts.ids,
        [
            weighed(RAM_WEIGHER, m_ram, hosts),
            weighed(IO_OPS_WEIGHER, -m_io, hosts),
            weighed(NUM_INSTANCES_WEIGHER, -m_inst, hosts),
        ],
    )
    diff = sel.totals - nova
    assert np.allclose(diff, diff[0], atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(0, 10_000), min_size=1, max_size=10),
    scale=st.floats(0.001, 1000),
    unit=st.sampled_from(NOVA_WEIGHT_UNITS),
)
def test_scaling_raw_weights_keeps_points(values: list[int], scale: float, unit: PolicyUnit) -> None:
    raw = np.array(values, dtype=np.float64)
    base = min_max_points(raw, unit.direction, unit.minimum)
    scaled = min_max_points(raw * scale, unit.direction, unit.minimum)
    assert np.allclose(base, scaled, atol=1e-9)
    assert ((base >= 0) & (base <= 1 + 1e-12)).all()


@settings(max_examples=40, deadline=None)
@given(committed=st.lists(st.integers(0, 4096), min_size=1, max_size=6), extra=st.integers(1, 2048))
def test_pending_memory_only_lowers_free_ram(committed: list[int], extra: int) -> None:
    hosts = table(*(host(f"h{i}", mem_committed_mb=c) for i, c in enumerate(committed)))
    with_pending = hosts.with_pending([pend("h0", mem_mb=extra)])
    before, after = weigh(RAM_WEIGHER, hosts), weigh(RAM_WEIGHER, with_pending)
    assert after[0] == max(before[0] - extra, 0)
    assert w(after[1:]) == w(before[1:])
