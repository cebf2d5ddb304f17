"""OptimalForPacking (the tight_packing policy's weight and balance): best fit within
HighUtilization, the VM's shape against the host's leftover, the largest empty host when one must
be opened, size-aware power advice; and the policy meeting its targets in a small simulation."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, table, vm
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.units.balance_packing import packing_balance
from vmsched.scheduling.units.base import validate_properties
from vmsched.scheduling.units.registry import REGISTRY
from vmsched.scheduling.units.weights_packing import (
    EMPTY_BASE,
    OVER_BASE,
    PACKING,
    PACKING_MAXIMUM,
    packing_weight,
)
from vmsched.simulation.engine import effective_policy, simulate
from vmsched.simulation.generator import GeneratorSpec, generate
from vmsched.simulation.packing_bound import headroom_of
from vmsched.simulation.report import Recorder, policy_report
from vmsched.simulation.targets import verdicts

PROPS = validate_properties(PACKING, {"HighUtilization": "80"})
GB = 1024


def weights(*hosts: object, spec: object = None) -> dict[str, float]:
    t = table(*hosts)  # type: ignore[arg-type]
    raw = packing_weight(t, spec if spec is not None else vm(), PROPS)  # type: ignore[arg-type]
    return dict(zip(t.ids, raw.tolist(), strict=True))


def test_registered_and_in_the_tight_packing_policy() -> None:
    assert REGISTRY["OptimalForPacking"] is PACKING
    assert PACKING.kinds == ("weight", "balance")
    policy = BUILTIN_POLICIES["tight_packing"]
    assert policy.balance == "OptimalForPacking"
    assert next(w.unit for w in policy.weights) == "OptimalForPacking"
    policy.validate_against(REGISTRY)
    # power_saving stays oVirt's
    assert [w.unit for w in BUILTIN_POLICIES["power_saving"].weights][:2] == [
        "OptimalForCpuPowerSaving",
        "OptimalForMemoryPowerSaving",
    ]


def test_prefers_the_fuller_used_host_that_still_fits() -> None:
    w = weights(
        host("roomy", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=4 * GB, cpu_usage_pct=20, vm_count=2),
        host("full", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=12 * GB, cpu_usage_pct=50, vm_count=6),
        host("overfull", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=12 * GB, cpu_usage_pct=79, vm_count=6),
        spec=vm(vcpus=4, cpu_usage_pct=50, mem_mb=2 * GB),
    )
    assert w["full"] < w["roomy"] < EMPTY_BASE
    # 79 % + 4 x 50 % / 8 CPUs = 104 % > HighUtilization 80: after every host it fits within it
    assert w["overfull"] >= OVER_BASE


def test_prefers_the_host_the_vm_shape_complements() -> None:
    # Same fill (CPU and memory left add up the same), opposite shapes: a memory-heavy VM belongs
    # on the host with memory left over and CPU used, not the other way round.
    w = weights(
        host("cpu-left", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=11 * GB, cpu_usage_pct=20, vm_count=3),
        host("mem-left", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=5 * GB, cpu_usage_pct=50, vm_count=3),
        spec=vm(vcpus=1, cpu_usage_pct=10, mem_mb=4 * GB),
    )
    assert w["mem-left"] < w["cpu-left"]


def test_opens_an_empty_host_only_when_no_used_host_fits_and_then_the_largest() -> None:
    small = {"cpu_cores": 8, "physical_mem_mb": 16 * GB, "mem_free_mb": 16 * GB}
    large = {"cpu_cores": 32, "physical_mem_mb": 64 * GB, "mem_free_mb": 64 * GB}
    w = weights(
        host("a-small", **small),
        host("b-large", **large),
        host("used", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=GB, cpu_usage_pct=70, vm_count=1),
        spec=vm(vcpus=2, cpu_usage_pct=10, mem_mb=GB),
    )
    assert w["used"] < w["b-large"] < w["a-small"]
    assert EMPTY_BASE <= w["b-large"] < w["a-small"] <= EMPTY_BASE + 1
    # the used host cannot take it within HighUtilization: the largest empty host is next
    w = weights(
        host("a-small", **small),
        host("b-large", **large),
        host("used", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=GB, cpu_usage_pct=79, vm_count=1),
        spec=vm(vcpus=4, cpu_usage_pct=50, mem_mb=GB),
    )
    assert w["b-large"] < w["a-small"] < w["used"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([8, 16, 32]),
            st.integers(0, 95),
            st.integers(0, 100),
            st.integers(0, 12),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 8),
    st.integers(0, 100),
    st.integers(1, 8),
)
def test_never_prefers_an_empty_host_when_a_used_host_fits(
    rows: list[tuple[int, int, int, int]], vcpus: int, load: int, mem_gb: int
) -> None:
    hosts = table(
        *(
            host(
                f"h{i}",
                cpu_cores=cores,
                physical_mem_mb=4 * cores * GB,
                mem_committed_mb=int(4 * cores * GB * (100 - free_pct) / 100) if n else 0,
                cpu_usage_pct=cpu if n else 0,
                vm_count=n,
            )
            for i, (cores, cpu, free_pct, n) in enumerate(rows)
        )
    )
    raw = packing_weight(hosts, vm(vcpus=vcpus, cpu_usage_pct=load, mem_mb=mem_gb * GB), PROPS)
    assert ((raw >= 0) & (raw <= PACKING_MAXIMUM)).all()
    used, empty = hosts.vm_count > 0, hosts.vm_count == 0
    fitting_used = used & (raw < EMPTY_BASE)
    if fitting_used.any() and empty.any():
        assert raw[fitting_used].max() < raw[empty].min()
    # among empty hosts that fit, a larger one never scores worse than a smaller one
    fit_empty = empty & (raw < OVER_BASE)
    cpus = hosts.effective_cpus
    for i in np.flatnonzero(fit_empty):
        for j in np.flatnonzero(fit_empty):
            if cpus[i] > cpus[j]:
                assert raw[i] < raw[j]


def test_power_advice_takes_the_smallest_empty_host_off_first() -> None:
    hosts = table(
        host("a-large", cpu_cores=32, physical_mem_mb=64 * GB, mem_free_mb=64 * GB),
        host("b-small", cpu_cores=8, physical_mem_mb=16 * GB, mem_free_mb=16 * GB),
        host("c-large", cpu_cores=32, physical_mem_mb=64 * GB, mem_free_mb=64 * GB),
        host("used", cpu_cores=8, physical_mem_mb=16 * GB, mem_committed_mb=8 * GB, cpu_usage_pct=50, vm_count=2),
    )
    props = validate_properties(
        PACKING, {"EnableAutomaticHostPowerManagement": "true", "HostsInReserve": "2", "HighUtilization": "80"}
    )
    outcome = packing_balance(hosts, [], props)
    assert [(p.host_id, p.action) for p in outcome.power] == [("b-small", "power_off")]


def test_tight_packing_meets_its_targets_on_a_small_generated_day() -> None:
    """A real run (50 hosts, 1,000 arrivals, 12 hours, seed 1): hosts used within the limits of
    first-fit-decreasing and of the lower bound (ratio of means after the first hour), every VM
    placed, far fewer hosts than power_saving keeps, churn within the budgets."""
    workload = generate(GeneratorSpec(hosts=50, vms=1000, hours=12.0, seed=1))
    reports = []
    for name in ("tight_packing", "power_saving"):
        policy = BUILTIN_POLICIES[name]
        props = effective_policy(workload, policy).properties
        recorder = Recorder(workload.cluster.vcpus_per_cpu, cpu_limit_pct=headroom_of(props))
        counts, timing = asyncio.run(simulate(workload, policy, recorder))
        reports.append(policy_report(name, 50, counts, timing, recorder.samples, props))
    packed, power = reports
    assert packed.failed == 0
    found = verdicts([packed])
    # Its consolidation within the disruption budgets every balance unit obeys, judged too.
    assert [v.target for v in found] == [
        "hosts used / first-fit-decreasing hosts (ratio of means)",
        "hosts used / lower bound ceil(demand / capacity)",
        "migrations per host per hour",
        "VMs migrated back within their cool-down",
    ]
    assert all(v.met for v in found), [v.line() for v in found]
    assert packed.hosts_used_mean < power.hosts_used_mean
    assert packed.migrations_per_host_hour <= 0.25
    assert packed.ping_pongs == 0
