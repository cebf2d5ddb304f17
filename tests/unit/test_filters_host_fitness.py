"""Filter units that check a host's fitness for the VM beyond plain memory and CPU: Swap,
CPUOverloaded, CPUTopology, HugePages, Emulated-Machine, CPU-Level, ClusterInMaintenance,
MigrationDomain (hand-computed cases, edge cases and invariants)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, hosts_n, kept, pend, reasons, table, vm
from vmsched.contracts import HostStatus, UnitCall
from vmsched.errors import InvalidProperty
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import run_filters
from vmsched.scheduling.units.base import PolicyUnit, validate_properties
from vmsched.scheduling.units.filters import (
    CLUSTER_IN_MAINTENANCE,
    CPU_LEVEL,
    CPU_OVERLOADED,
    CPU_TOPOLOGY,
    EMULATED_MACHINE,
    FILTER_UNITS,
    HUGEPAGES,
    MIGRATION_DOMAIN,
    SWAP,
    cluster_in_maintenance_filter,
    cpu_level_filter,
    cpu_overloaded_filter,
    cpu_topology_filter,
    emulated_machine_filter,
    hugepages_filter,
    migration_domain_filter,
    swap_filter,
)
from vmsched.scheduling.units.registry import REGISTRY

HOST_FITNESS_FILTERS = (
    SWAP,
    CPU_OVERLOADED,
    CPU_TOPOLOGY,
    HUGEPAGES,
    EMULATED_MACHINE,
    CPU_LEVEL,
    CLUSTER_IN_MAINTENANCE,
    MIGRATION_DOMAIN,
)


def at(hosts: HostTable, now: float) -> HostTable:
    """The table as a decision at unix time `now` sees it."""
    return replace(hosts, as_of=now)


def in_maintenance(hosts: HostTable) -> HostTable:
    """The maintenance filter needs no cluster flag (the policy is the switch); kept for readability."""
    return hosts


# ------------------------------------------------------------------------------------ the units
def test_host_fitness_filters_are_declared_and_registered() -> None:
    assert [u.name for u in HOST_FITNESS_FILTERS] == [
        "Swap",
        "CPUOverloaded",
        "CPUTopology",
        "HugePages",
        "Emulated-Machine",
        "CPU-Level",
        "ClusterInMaintenance",
        "MigrationDomain",
    ]
    for unit in HOST_FITNESS_FILTERS:
        assert unit in FILTER_UNITS
        assert REGISTRY[unit.name] is unit
        assert unit.kinds == ("filter",)
        assert unit.description
        assert unit.summary


def test_property_defaults_and_regexes() -> None:
    assert validate_properties(SWAP, {}) == {"MaximumAllowedSwapUsage": "0"}
    assert validate_properties(CPU_OVERLOADED, {}) == {"HighUtilization": "80", "CpuOverCommitDurationMinutes": "2"}
    for value in ("0", "5", "50", "100", "199"):
        validate_properties(SWAP, {"MaximumAllowedSwapUsage": value})
    for value in ("200", "-1", "1000", "x"):
        with pytest.raises(InvalidProperty):
            validate_properties(SWAP, {"MaximumAllowedSwapUsage": value})
    for bad in ({"HighUtilization": "49"}, {"HighUtilization": "100"}, {"CpuOverCommitDurationMinutes": "0"}):
        with pytest.raises(InvalidProperty):
            validate_properties(CPU_OVERLOADED, bad)


@pytest.mark.parametrize("unit", HOST_FITNESS_FILTERS, ids=lambda u: u.name)
def test_zero_hosts(unit: PolicyUnit) -> None:
    assert unit.filter is not None
    hosts = in_maintenance(table())
    spec = vm(hugepages=True, exclusive_cpus=True, emulated_machine="q35", cpu_model="Skylake")
    verdict = unit.filter(at(hosts, 1000.0), spec, validate_properties(unit, {}))
    assert verdict.keep.shape == (0,)
    assert list(verdict.reasons) == []


@pytest.mark.parametrize(
    "unit", [u for u in HOST_FITNESS_FILTERS if u.name != "ClusterInMaintenance"], ids=lambda u: u.name
)  # the maintenance filter removes every host for a plain VM: that is its job (tested below)
def test_plain_vm_on_plain_hosts_keeps_all(unit: PolicyUnit) -> None:
    """Equal, ordinary hosts and a VM that asks for nothing special: nothing is removed."""
    assert unit.filter is not None
    hosts = hosts_n(3)
    verdict = unit.filter(hosts, vm(), validate_properties(unit, {}))
    assert kept(hosts, verdict) == ["h0", "h1", "h2"]


# ------------------------------------------------------------------------------------ Swap
def test_swap_hand_computed() -> None:
    hosts = table(
        # (8192 - 1024 - 2048) x 100 / 16384 = 31.25 -> 31 (integer division)
        host("swapping", physical_mem_mb=16384, mem_free_mb=2048, swap_total_mb=8192, swap_free_mb=1024),
        # swap in use (7168) < free memory: negative, fine
        host("calm", physical_mem_mb=16384, mem_free_mb=8192, swap_total_mb=8192, swap_free_mb=1024),
        host("no-swap", physical_mem_mb=16384, mem_free_mb=10),
    )
    verdict = swap_filter(hosts, vm(), {"MaximumAllowedSwapUsage": "0"})
    assert kept(hosts, verdict) == ["calm", "no-swap"]
    assert reasons(hosts, verdict) == {
        "swapping": "swapping: (swap 8192 MB - free swap 1024 MB - free memory 2048 MB) x 100 / physical "
        "16384 MB = 31% > allowed 0%"
    }
    assert kept(hosts, swap_filter(hosts, vm(), {"MaximumAllowedSwapUsage": "31"})) == ["swapping", "calm", "no-swap"]
    assert kept(hosts, swap_filter(hosts, vm(), {"MaximumAllowedSwapUsage": "30"})) == ["calm", "no-swap"]


def test_swap_missing_information_passes() -> None:
    hosts = table(
        host("no-free", physical_mem_mb=16384, mem_free_mb=0, swap_total_mb=8192, swap_free_mb=0),
        host("no-physical", physical_mem_mb=0, mem_free_mb=10, swap_total_mb=8192, swap_free_mb=0),
    )
    assert kept(hosts, swap_filter(hosts, vm(), {})) == ["no-free", "no-physical"]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 1 << 20),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 20),
    st.integers(0, 199),
)
def test_swap_matches_java_long_arithmetic(phys: int, free: int, total: int, swap_free: int, allowed: int) -> None:
    swap_free = min(swap_free, total)
    hosts = table(host("h", physical_mem_mb=phys, mem_free_mb=free, swap_total_mb=total, swap_free_mb=swap_free))
    beyond = total - swap_free - free
    java = abs(beyond) * 100 // phys * (1 if beyond >= 0 else -1)  # Java truncates toward zero
    swapping = total > 0 and free > 0 and java > allowed
    verdict = swap_filter(hosts, vm(), {"MaximumAllowedSwapUsage": str(allowed)})
    assert bool(verdict.keep[0]) is not swapping


# ------------------------------------------------------------------------------------ CPUOverloaded
def test_cpu_overloaded_hand_computed() -> None:
    hosts = table(
        # over 80 since t=60; at 240 that is 3 minutes >= 2
        host("hot", cpu_samples=[(0, 50), (60, 90), (120, 95), (180, 92)]),
        # was hot, cooled down in the last sample
        host("cooled", cpu_samples=[(0, 90), (60, 90), (120, 50)]),
        # over only since 180: 1 minute
        host("recent", cpu_samples=[(0, 50), (180, 90)]),
        # exactly at the threshold is not over it (oVirt compares with >)
        host("at-80", cpu_samples=[(0, 80), (60, 80), (120, 80)]),
        host("no-samples"),
    )
    verdict = cpu_overloaded_filter(at(hosts, 240.0), vm(), {})
    assert kept(hosts, verdict) == ["cooled", "recent", "at-80", "no-samples"]
    assert reasons(hosts, verdict) == {
        "hot": "CPU load 92% > HighUtilization 80% since 1970-01-01T00:01:00Z: 3 min >= 2 min",
    }


def test_cpu_overloaded_properties() -> None:
    hosts = at(table(host("hot", cpu_samples=[(0, 50), (60, 90), (120, 95), (180, 92)])), 240.0)
    assert kept(hosts, cpu_overloaded_filter(hosts, vm(), {"HighUtilization": "91"})) == []
    # 92 is over 91, but the run starts at 120 (90 is not over 91): 2 minutes, still >= 2
    assert kept(hosts, cpu_overloaded_filter(hosts, vm(), {"HighUtilization": "92"})) == ["hot"]
    assert kept(hosts, cpu_overloaded_filter(hosts, vm(), {"CpuOverCommitDurationMinutes": "3"})) == []
    assert kept(hosts, cpu_overloaded_filter(hosts, vm(), {"CpuOverCommitDurationMinutes": "4"})) == ["hot"]


def test_cpu_overloaded_without_decision_time_uses_last_sample() -> None:
    hosts = table(
        host("two-minutes", cpu_samples=[(0, 50), (60, 90), (180, 92)]),  # 60..180
        host("one-minute", cpu_samples=[(0, 50), (100, 90), (160, 92)]),  # 100..160
    )
    assert math.isnan(hosts.as_of)
    verdict = cpu_overloaded_filter(hosts, vm(), {})
    assert kept(hosts, verdict) == ["one-minute"]
    assert reasons(hosts, verdict)["two-minutes"].endswith("since 1970-01-01T00:01:00Z: 2 min >= 2 min")
    # with a decision time, the load is assumed to last until then
    assert kept(hosts, cpu_overloaded_filter(at(hosts, 1000.0), vm(), {})) == []


def test_cpu_overloaded_spm_share_counts() -> None:
    """SPM costs 1 vCPU x 10% / 4 cores = 2.5% of the host: 78% becomes 80.5% > 80."""
    samples = [(0.0, 78.0), (60.0, 78.0), (180.0, 78.0)]
    hosts = at(table(host("spm", is_spm=True, cpu_samples=samples), host("plain", cpu_samples=samples)), 180.0)
    verdict = cpu_overloaded_filter(hosts, vm(), {})
    assert kept(hosts, verdict) == ["plain"]
    assert reasons(hosts, verdict) == {
        "spm": "CPU load 80.5% (78% + SPM 2.5%) > HighUtilization 80% since 1970-01-01T00:00:00Z: 3 min >= 2 min"
    }


def test_cpu_overloaded_unknown_cores_removed() -> None:
    hosts = table(host("unknown", cpu_cores=0), host("known"))
    verdict = cpu_overloaded_filter(hosts, vm(), {})
    assert reasons(hosts, verdict) == {"unknown": "unknown CPU topology (the host reported 0 cores)"}


def test_cpu_overloaded_one_host_and_all_equal() -> None:
    samples = [(0.0, 99.0), (600.0, 99.0)]
    one = at(hosts_n(1, cpu_samples=samples), 600.0)
    assert kept(one, cpu_overloaded_filter(one, vm(), {})) == []
    many = at(hosts_n(4, cpu_samples=samples), 600.0)
    assert cpu_overloaded_filter(many, vm(), {}).keep.tolist() == [False] * 4


samples_strategy = st.lists(st.tuples(st.integers(0, 20), st.floats(0, 100)), max_size=12).map(
    lambda pairs: [(60.0 * k, load) for k, (_, load) in enumerate(pairs)]
)


@settings(max_examples=80, deadline=None)
@given(st.lists(samples_strategy, min_size=1, max_size=5), st.integers(50, 98), st.integers(1, 10))
def test_cpu_overloaded_is_monotone_in_its_properties(
    samples: list[list[tuple[float, float]]], high: int, minutes: int
) -> None:
    """A higher threshold or a longer duration never removes a host that a lower/shorter one kept."""
    hosts = at(table(*(host(f"h{i}", cpu_samples=s) for i, s in enumerate(samples))), 720.0)
    base = cpu_overloaded_filter(
        hosts, vm(), {"HighUtilization": str(high), "CpuOverCommitDurationMinutes": str(minutes)}
    )
    higher = cpu_overloaded_filter(
        hosts, vm(), {"HighUtilization": str(high + 1), "CpuOverCommitDurationMinutes": str(minutes)}
    )
    longer = cpu_overloaded_filter(
        hosts, vm(), {"HighUtilization": str(high), "CpuOverCommitDurationMinutes": str(minutes + 1)}
    )
    assert (higher.keep >= base.keep).all()
    assert (longer.keep >= base.keep).all()
    # a host whose newest sample is not over the threshold is always kept
    for i, s in enumerate(samples):
        if not s or s[-1][1] <= high:
            assert base.keep[i]


# ------------------------------------------------------------------------------------ CPUTopology
def test_cpu_topology_dedicated_threads_per_core() -> None:
    hosts = table(
        host("smt", cpu_cores=8, cpu_threads=16),
        host("no-smt", cpu_cores=8, cpu_threads=8),
        host("odd", cpu_cores=8, cpu_threads=12),  # 12 // 8 = 1 (Java integer division)
        host("unreported", cpu_cores=8),
    )
    spec = vm(exclusive_cpus=True, cpu_cores_per_socket=2, cpu_threads_per_core=2, vcpus=4)
    verdict = cpu_topology_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["smt"]
    assert reasons(hosts, verdict) == {
        "no-smt": "dedicated CPUs need 2 threads per core, the host has 1 (8 threads / 8 cores)",
        "odd": "dedicated CPUs need 2 threads per core, the host has 1 (12 threads / 8 cores)",
        "unreported": "dedicated CPUs need 2 threads per core, the host has 1 (no thread count reported)",
    }
    # one thread per core fits everywhere
    assert kept(hosts, cpu_topology_filter(hosts, vm(exclusive_cpus=True), {})) == list(hosts.ids)


def test_cpu_topology_shared_vcpus_any_layout() -> None:
    hosts = table(host("no-smt", cpu_cores=8, cpu_threads=8), host("unreported", cpu_cores=2))
    spec = vm(cpu_sockets=4, cpu_cores_per_socket=4, cpu_threads_per_core=2, vcpus=32)
    assert kept(hosts, cpu_topology_filter(hosts, spec, {})) == ["no-smt", "unreported"]


def test_cpu_topology_unknown_topology_removed() -> None:
    hosts = table(host("no-cores", cpu_cores=0), host("no-sockets", cpu_sockets=0), host("ok"))
    verdict = cpu_topology_filter(hosts, vm(), {})
    assert reasons(hosts, verdict) == {
        "no-cores": "unknown CPU topology (reported sockets 1, cores 0)",
        "no-sockets": "unknown CPU topology (reported sockets 0, cores 4)",
    }


# ------------------------------------------------------------------------------------ HugePages
HP_VM = {"hugepages": True, "mem_mb": 1024, "hugepage_size_kb": 2048}  # 1024 x 1024 / 2048 = 512 pages


def test_hugepages_hand_computed() -> None:
    hosts = table(
        host("enough", hugepages_free={2048: 512}),
        host("short", hugepages_free={2048: 511}),
        host("other-size", hugepages_free={1048576: 4}),
        host("none"),
    )
    verdict = hugepages_filter(hosts, vm(**HP_VM), {})
    assert kept(hosts, verdict) == ["enough"]
    assert reasons(hosts, verdict) == {
        "short": "free 2048 KiB huge pages 511 < required 512",
        "other-size": "no 2048 KiB huge pages on the host (sizes reported: 1048576 KiB); required 512",
        "none": "no 2048 KiB huge pages on the host (sizes reported: none); required 512",
    }


def test_hugepages_pending_memory_counts_as_pages() -> None:
    # 100 MB pending -> ceil(100 x 1024 / 2048) = 50 pages
    hosts = table(
        host("h1", hugepages_free={2048: 600}),
        host("h2", hugepages_free={2048: 561}),
        pending=[pend("h1", mem_mb=100), pend("h2", mem_mb=100)],
    )
    verdict = hugepages_filter(hosts, vm(**HP_VM), {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict) == {
        "h2": "free 2048 KiB huge pages 561 - pending 50 (for 100 MB) = 511 < required 512",
    }


def test_hugepages_one_gib_pages_round_up() -> None:
    hosts = table(host("two", hugepages_free={1048576: 2}), host("one", hugepages_free={1048576: 1}))
    spec = vm(hugepages=True, mem_mb=1500, hugepage_size_kb=1048576)  # ceil(1.46) = 2
    assert kept(hosts, hugepages_filter(hosts, spec, {})) == ["two"]


def test_hugepages_vm_without_hugepages_and_current_host() -> None:
    hosts = table(host("none"), host("running-here"))
    assert kept(hosts, hugepages_filter(hosts, vm(), {})) == ["none", "running-here"]
    spec = vm(**HP_VM, current_host="running-here")
    assert kept(hosts, hugepages_filter(hosts, spec, {})) == ["running-here"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 8192), st.booleans()), min_size=1, max_size=6),
    st.integers(1, 8192),
    st.sampled_from([2048, 1048576]),
)
def test_hugepages_matches_reference(rows: list[tuple[int, int, bool]], mem: int, size: int) -> None:
    hosts = table(
        *(host(f"h{i}", hugepages_free={size: free} if has else {}) for i, (free, _, has) in enumerate(rows)),
        pending=[pend(f"h{i}", mem_mb=p) for i, (_, p, _) in enumerate(rows) if p],
    )
    need = -(-mem * 1024 // size)
    expected = [has and free - -(-p * 1024 // size) >= need for free, p, has in rows]
    assert hugepages_filter(hosts, vm(hugepages=True, mem_mb=mem, hugepage_size_kb=size), {}).keep.tolist() == expected


# ------------------------------------------------------------------------------------ Emulated-Machine / CPU-Level
def test_emulated_machine() -> None:
    hosts = table(
        host("new", emulated_machines=["pc-q35-rhel9.2.0", "pc-q35-rhel8.6.0"]),
        host("old", emulated_machines=["pc-q35-rhel8.6.0"]),
        host("silent"),
    )
    verdict = emulated_machine_filter(hosts, vm(emulated_machine="pc-q35-rhel9.2.0"), {})
    assert kept(hosts, verdict) == ["new"]
    assert reasons(hosts, verdict) == {
        "old": "emulated machine 'pc-q35-rhel9.2.0' not supported (the host supports 'pc-q35-rhel8.6.0')",
        "silent": "emulated machine 'pc-q35-rhel9.2.0' required; the host reports no emulated machines",
    }
    assert kept(hosts, emulated_machine_filter(hosts, vm(), {})) == ["new", "old", "silent"]
    assert kept(hosts, emulated_machine_filter(hosts, vm(emulated_machine=""), {})) == ["new", "old", "silent"]


def test_cpu_level() -> None:
    many = [f"m{i}" for i in range(7)]
    hosts = table(
        host("icelake", cpu_models=["Icelake-Server", "Skylake-Server"]),
        host("many", cpu_models=many),
        host("silent"),
    )
    verdict = cpu_level_filter(hosts, vm(cpu_model="Icelake-Server"), {})
    assert kept(hosts, verdict) == ["icelake"]
    assert reasons(hosts, verdict) == {
        "many": "CPU model 'Icelake-Server' not offered (the host offers 'm0', 'm1', 'm2', 'm3', 'm4' and 2 more)",
        "silent": "CPU model 'Icelake-Server' required; the host reports no CPU models",
    }
    assert kept(hosts, cpu_level_filter(hosts, vm(), {})) == ["icelake", "many", "silent"]


# ------------------------------------------------------------------------------------ ClusterInMaintenance
def test_cluster_in_maintenance() -> None:
    hosts = in_maintenance(hosts_n(3))
    verdict = cluster_in_maintenance_filter(hosts, vm(), {})
    assert kept(hosts, verdict) == []
    assert set(reasons(hosts, verdict).values()) == {
        "the cluster is in maintenance: only HA VMs may start (this VM is not HA)"
    }
    assert kept(hosts, cluster_in_maintenance_filter(hosts, vm(ha=True), {})) == ["h0", "h1", "h2"]
    assert kept(hosts, cluster_in_maintenance_filter(hosts, vm(current_host="h0"), {})) == ["h0", "h1", "h2"]


# ------------------------------------------------------------------------------------ MigrationDomain
def test_migration_domain_keeps_up_hosts_of_the_table() -> None:
    hosts = table(host("up"), host("maint", status=HostStatus.MAINTENANCE), host("down", status=HostStatus.DOWN))
    verdict = migration_domain_filter(hosts, vm(current_host="up"), {})
    assert kept(hosts, verdict) == ["up"]
    assert reasons(hosts, verdict) == {"maint": "the host is not Up", "down": "the host is not Up"}
    assert kept(hosts_n(2), migration_domain_filter(hosts_n(2), vm(), {})) == ["h0", "h1"]


# ------------------------------------------------------------------------------------ in the pipeline
def test_a_chain_of_host_fitness_filters_records_who_removed_what() -> None:
    hosts = at(
        table(
            host("ok", hugepages_free={2048: 1024}, emulated_machines=["q35"], cpu_models=["Skylake"]),
            host("swapping", physical_mem_mb=16384, mem_free_mb=100, swap_total_mb=8192, swap_free_mb=0),
            host("hot", cpu_samples=[(0, 99), (600, 99)]),
            host("no-pages", emulated_machines=["q35"], cpu_models=["Skylake"]),
            host("old-machine", hugepages_free={2048: 1024}, emulated_machines=["i440fx"], cpu_models=["Skylake"]),
        ),
        600.0,
    )
    calls = [UnitCall(unit=u) for u in ("Swap", "CPUOverloaded", "HugePages", "Emulated-Machine", "CPU-Level")]
    spec = vm(hugepages=True, emulated_machine="q35", cpu_model="Skylake")
    outcome = run_filters(hosts, spec, calls)
    assert outcome.survivors.ids == ("ok",)
    assert [(r.host_id, r.filter) for r in outcome.removed] == [
        ("swapping", "Swap"),
        ("hot", "CPUOverloaded"),
        ("no-pages", "HugePages"),
        ("old-machine", "Emulated-Machine"),
    ]


def test_keep_masks_are_boolean_arrays() -> None:
    hosts = hosts_n(2)
    for unit in HOST_FITNESS_FILTERS:
        assert unit.filter is not None
        keep = unit.filter(hosts, vm(), validate_properties(unit, {})).keep
        assert isinstance(keep, np.ndarray)
        assert keep.dtype == np.bool_
