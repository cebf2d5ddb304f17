"""oVirt's HA reservation check: its monitoring loop's outcomes, and the fast check against the naive one."""

from __future__ import annotations

import random
import uuid
from contextlib import ExitStack
from functools import partial
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories import CLUSTER, host, pend, vm_report
from vmsched.contracts import HostState, HostStatus, PendingEntry, VmReport, VmStatus
from vmsched.scheduling import ha
from vmsched.scheduling.ha import alert_message, check, failing_hosts, naive_failing_hosts, vm_mem_used

#: An HA VM using all of its 1024 MB and no CPU, running on `host_id`, unless told otherwise.
vm = partial(vm_report, CLUSTER, mem_mb=1024, vcpus=1, mem_usage_pct=100.0, cpu_usage_pct=0.0, ha=True)


def both(
    hosts: list[HostState], vms: list[VmReport], pending: list[PendingEntry] | None = None, **kw: Any
) -> list[str]:
    """Failing hosts, asserting the naive and the fast check agree."""
    naive = naive_failing_hosts(hosts, vms, pending or [], **kw)
    fast = failing_hosts(hosts, vms, pending or [], **kw)
    assert fast == naive
    return fast


# ------------------------------------------------------------------------------------ outcomes
def test_ok_cluster_passes() -> None:
    hosts = [host("h1", mem_free_mb=3000), host("h2", mem_free_mb=3000), host("h3", mem_free_mb=3000)]
    vms = [vm("a", "h1"), vm("b", "h1"), vm("c", "h2"), vm("d", "h3")]
    assert both(hosts, vms) == []
    result = check(hosts, vms)
    assert result.ok
    assert result.hosts == 3
    assert result.ha_vms == 4


def test_host_whose_ha_vms_do_not_fit_elsewhere_fails_and_is_named() -> None:
    # h1's three 1024 MB VMs need 3072 MB; h2 + h3 have 1500 each: one VM fits on each, the third not.
    hosts = [host("h1", mem_free_mb=8000), host("h2", mem_free_mb=1500), host("h3", mem_free_mb=1500)]
    vms = [vm("a", "h1"), vm("b", "h1"), vm("c", "h1"), vm("d", "h2")]
    assert both(hosts, vms) == ["h1"]
    assert alert_message("prod", ["h1", "h4"]) == (
        "Cluster prod failed the HA Reservation check, HA VMs on host(s): h1, h4 will fail to migrate in "
        "case of a failover, consider adding resources or shutting down unused VMs."
    )


def test_memory_actually_used_not_configured() -> None:
    # 4096 MB VMs using 25% need 1024 MB each (oVirt: Math.round(mem * usage / 100)).
    hosts = [host("h1"), host("h2", mem_free_mb=2048)]
    vms = [vm("a", "h1", mem_mb=4096, mem_usage_pct=25.0), vm("b", "h1", mem_mb=4096, mem_usage_pct=25.0)]
    assert both(hosts, vms) == []
    assert vm_mem_used(vm("x", "h1", mem_mb=3, mem_usage_pct=50.0)) == 2  # 1.5 rounds half up
    assert both(hosts, [*vms, vm("c", "h1", mem_mb=10, mem_usage_pct=10.0)]) == ["h1"]


def test_cpu_share_scaled_by_target_host_cores() -> None:
    # A 4-vCPU VM at 50% is 200% of one core: 25% of an 8-core host, 50% of a 4-core one.
    big = vm("a", "h1", mem_usage_pct=0.0, cpu_usage_pct=50.0, vcpus=4)
    assert both([host("h1"), host("h2", cpu_cores=8, cpu_usage_pct=75.0)], [big]) == []
    assert both([host("h1"), host("h2", cpu_cores=4, cpu_usage_pct=75.0)], [big]) == ["h1"]
    # Counting threads as cores: the 4-core host with 8 threads takes it.
    target = host("h2", cpu_cores=4, cpu_threads=8, cpu_usage_pct=75.0)
    assert both([host("h1"), target], [big], count_threads_as_cores=True) == []
    # A host with unknown topology (0 cores) takes nothing.
    assert both([host("h1"), host("h2", cpu_cores=0)], [vm("z", "h1", mem_usage_pct=0.0)]) == ["h1"]


def test_one_up_host_alone_fails_no_hosts_passes() -> None:
    assert both([host("h1", mem_free_mb=1 << 20)], [vm("a", "h1", mem_usage_pct=0.0)]) == ["h1"]
    assert both([host("h1")], []) == []
    assert both([], []) == []
    assert both([], [vm("a", "h9")]) == []


def test_host_without_ha_vms_passes() -> None:
    hosts = [host("h1", mem_free_mb=0), host("h2", mem_free_mb=0)]
    vms = [vm("a", "h1", ha=False), vm("b", "h2", ha=False, mem_mb=4096)]
    assert both(hosts, vms) == []


def test_non_up_hosts_are_ignored_as_sources_and_targets() -> None:
    down = host("h3", status=HostStatus.MAINTENANCE, mem_free_mb=1 << 20)
    hosts = [host("h1"), host("h2", mem_free_mb=512), down]
    # h3 would take h1's VM but is in maintenance; h3's own HA VM is not checked.
    assert both(hosts, [vm("a", "h1"), vm("b", "h3", mem_mb=1 << 20)]) == ["h1"]
    # With only one Up host left, that host fails alone.
    assert both([host("h1"), down], [vm("a", "h1", mem_usage_pct=0.0)]) == ["h1"]


def test_pending_counted_once() -> None:
    hosts = [host("h1"), host("h2", mem_free_mb=2048)]
    vms = [vm("a", "h1")]
    assert both(hosts, vms, [pend("h2", mem_mb=1024)]) == []  # 2048 - 1024 still takes 1024
    assert both(hosts, vms, [pend("h2", mem_mb=1025)]) == ["h1"]
    # The same VM's record twice counts once.
    one = pend("h2", mem_mb=600)
    assert both(hosts, vms, [one, one]) == []
    # A VM already reported running on its pending host is in the host's measured free memory.
    started = pend("h2", mem_mb=1500)
    running = vm(started.vm_id, "h2", ha=False)
    assert both(hosts, [*vms, running], [started]) == []
    assert both(hosts, vms, [started]) == ["h1"]
    # Pending elsewhere (another cluster's host) does not count.
    assert both(hosts, vms, [pend("h9", mem_mb=1 << 20)]) == []


def test_first_fit_in_host_id_and_vm_id_order() -> None:
    # In id order: a (600) -> h2 (1000, 400 left), b (500) -> h3 (500), c (400) -> h2: all placed.
    # In the listed order b, c, a it would fail: b, c -> h2 (100 left), a fits neither.
    hosts = [host("h3", mem_free_mb=500), host("h1"), host("h2", mem_free_mb=1000)]
    vms = [vm("b", "h1", mem_mb=500), vm("c", "h1", mem_mb=400), vm("a", "h1", mem_mb=600)]
    assert both(hosts, vms) == []
    renamed = [vm("a", "h1", mem_mb=500), vm("b", "h1", mem_mb=400), vm("c", "h1", mem_mb=600)]
    assert both(hosts, renamed) == ["h1"]


def test_only_placed_vms_are_ha_vms_of_a_host() -> None:
    hosts = [host("h1"), host("h2", mem_free_mb=0)]
    vms = [vm("a", "h1", status=VmStatus.DOWN), vm("b", None, status=VmStatus.FAILED), vm("c", "h1", ha=False)]
    assert both(hosts, vms) == []
    assert both(hosts, [vm("d", "h1", status=VmStatus.MIGRATING)]) == ["h1"]


# ------------------------------------------------------------------------------------ property
# Coarse values, so exact fits (free == need) are common: that is where off-by-one bugs live.
_MEM = st.sampled_from([0, 256, 512, 768, 1024, 1280, 1536, 2048, 3000])
_PCT = st.sampled_from([0.0, 25.0, 50.0, 75.0, 100.0, 33.3])


Case = tuple[list[HostState], list[VmReport], list[PendingEntry], bool]


@st.composite
def clusters(draw: st.DrawFn, max_vms: int = 14) -> Case:
    n = draw(st.integers(0, 5))
    hosts = [
        host(
            f"h{i}",
            status=draw(st.sampled_from([HostStatus.UP, HostStatus.UP, HostStatus.UP, HostStatus.DOWN])),
            mem_free_mb=draw(_MEM),
            cpu_cores=draw(st.sampled_from([0, 1, 2, 4])),
            cpu_threads=draw(st.sampled_from([0, 2, 8, 16])),
            cpu_usage_pct=draw(_PCT),
        )
        for i in range(n)
    ]
    host_ids = [f"h{i}" for i in range(n + 1)]  # one id no host has
    # Skewed placement: most VMs on one host, the shape where one row has far more VMs than the rest.
    crowded = draw(st.sampled_from([None, *host_ids]))
    placement = st.sampled_from(host_ids) if crowded is None else st.sampled_from([crowded] * 3 + host_ids)
    vms = [
        vm(
            f"v{j}",
            draw(placement),
            status=draw(st.sampled_from([VmStatus.RUNNING, VmStatus.RUNNING, VmStatus.STARTING, VmStatus.DOWN])),
            mem_mb=draw(st.sampled_from([256, 512, 1024, 1000])),
            mem_usage_pct=draw(_PCT),
            vcpus=draw(st.integers(1, 4)),
            cpu_usage_pct=draw(_PCT),
            ha=draw(st.booleans()) or draw(st.booleans()),
        )
        for j in range(draw(st.integers(0, max_vms)))
    ]
    pending = [
        PendingEntry(
            vm_id=draw(st.sampled_from([f"v{j}" for j in range(16)])),
            host_id=draw(st.sampled_from(host_ids)),
            mem_mb=draw(_MEM),
            vcpus=1,
            request_id=uuid.uuid4(),
            fencing_token=1,
            expires_at=1e12,
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    return hosts, vms, pending, draw(st.booleans())


def expected(hosts: list[HostState], vms: list[VmReport], pending: list[PendingEntry], threads: bool) -> ha.HaResult:
    """The whole result from its definition: naive failing hosts, Up hosts, HA VMs on Up hosts."""
    up = {h.report.host_id for h in hosts if h.report.status is HostStatus.UP}
    ha_vms = sum(1 for v in vms if v.ha and v.status in ha.HA_VM_STATUSES and v.host_id in up)
    return ha.HaResult(naive_failing_hosts(hosts, vms, pending, count_threads_as_cores=threads), len(up), ha_vms)


#: Settings of the fast check's shortcuts, small ones included so that every path runs on small
#: clusters: few first columns (the wider look), one row at a time from the start or never, tiny
#: chunks (VMs walked past columns touched earlier in the chunk), tiny blocks.
_TUNINGS = st.fixed_dictionaries(
    {
        "_FIRST_COLUMNS": st.sampled_from([1, 2, 32]),
        "_ROW_AT_A_TIME": st.sampled_from([0, 1, 2, 4, 1 << 20]),
        "_CHUNK": st.sampled_from([1, 2, 3, 64]),
        "_BLOCK_CELLS": st.sampled_from([1, 3, 4_000_000]),
    }
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_fast_and_naive_agree(case: Case) -> None:
    hosts, vms, pending, threads = case
    naive = naive_failing_hosts(hosts, vms, pending, count_threads_as_cores=threads)
    assert failing_hosts(hosts, vms, pending, count_threads_as_cores=threads) == naive


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_vms=40), _TUNINGS)
def test_fast_result_equals_definition_under_every_tuning(case: Case, tuning: dict[str, int]) -> None:
    hosts, vms, pending, threads = case
    with ExitStack() as stack:
        for name, value in tuning.items():
            stack.enter_context(patch.object(ha, name, value))
        assert check(hosts, vms, pending, count_threads_as_cores=threads) == expected(hosts, vms, pending, threads)


@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_fast_and_naive_agree_on_larger_clusters_in_small_blocks(
    seed: int, skew: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bigger random clusters (half the VMs on one host when skewed), with small shortcut settings."""
    rnd = random.Random(seed)
    n = rnd.randint(5, 40)
    hosts = [
        host(
            f"h{i:02d}",
            mem_free_mb=rnd.randrange(0, 8192, 128),
            cpu_cores=rnd.choice([2, 4, 8]),
            cpu_usage_pct=rnd.choice([0.0, 20.0, 50.0, 90.0]),
        )
        for i in range(n)
    ]
    vms = [
        vm(
            f"v{j:03d}",
            f"h{0 if skew and j % 2 == 0 else rnd.randrange(n):02d}",
            mem_mb=rnd.choice([512, 1024, 2048]),
            mem_usage_pct=rnd.uniform(0, 100),
            vcpus=rnd.randint(1, 4),
            cpu_usage_pct=rnd.uniform(0, 100),
        )
        for j in range(rnd.randint(0, 6 * n))
    ]
    naive = naive_failing_hosts(hosts, vms)
    monkeypatch.setattr(ha, "_BLOCK_CELLS", 3 * n)
    monkeypatch.setattr(ha, "_FIRST_COLUMNS", 2)
    monkeypatch.setattr(ha, "_CHUNK", 5)
    assert failing_hosts(hosts, vms) == naive
