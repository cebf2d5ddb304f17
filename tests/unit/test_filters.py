"""Filter units: Memory, CPU, Network, PinToHost, Migration (hand-computed cases and invariants)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, hosts_n, kept, pend, reasons, table, vm
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.scheduling.units.filters import (
    FILTER_UNITS,
    cpu_filter,
    memory_filter,
    migration_filter,
    network_filter,
    pin_to_host_filter,
)
from vmsched.scheduling.units.helpers import fmt_num
from vmsched.scheduling.units.registry import REGISTRY


# ------------------------------------------------------------------------------------ the units
def test_filter_units_are_declared() -> None:
    names = {u.name for u in FILTER_UNITS}
    assert names >= {"Memory", "CPU", "Network", "PinToHost", "Migration"}
    for unit in FILTER_UNITS:
        assert unit.filter is not None
        assert unit.weight is None
        assert unit.description
        assert unit.summary
        assert unit.kinds == ("filter",)
        assert REGISTRY[unit.name] is unit
    assert REGISTRY["Memory"].summary == "insufficient free memory"
    assert REGISTRY["Network"].summary == "missing network"


def test_builtin_policies_name_existing_units() -> None:
    for policy in BUILTIN_POLICIES.values():
        policy.validate_against(REGISTRY)


@pytest.mark.parametrize("unit", FILTER_UNITS, ids=lambda u: u.name)
def test_zero_hosts(unit: PolicyUnit) -> None:
    assert unit.filter is not None
    hosts = table()
    verdict = unit.filter(hosts, vm(networks=["n"], pinned_hosts=["x"], current_host="x"), {})
    assert verdict.keep.shape == (0,)
    assert list(verdict.reasons) == []


def test_fmt_num() -> None:
    assert fmt_num(1088.0) == "1088"
    assert fmt_num(6145.5) == "6145.5"
    assert fmt_num(-200.0) == "-200"


# ------------------------------------------------------------------------------------ Memory
def test_memory_keeps_host_with_room() -> None:
    hosts = table(host("h1"))
    verdict = memory_filter(hosts, vm(), {})
    assert kept(hosts, verdict) == ["h1"]
    assert list(verdict.reasons) == []


def test_memory_physical_check_reason() -> None:
    hosts = table(host("ok"), host("small", mem_free_mb=487))
    verdict = memory_filter(hosts, vm(), {})
    assert kept(hosts, verdict) == ["ok"]
    assert reasons(hosts, verdict) == {"small": "free memory 487 MB < required 1088 MB"}


def test_memory_physical_check_subtracts_pending() -> None:
    # 2000 - 1000 pending = 1000 < 1024 + 64.
    hosts = table(host("h1", mem_free_mb=2000), pending=[pend("h1", mem_mb=1000)])
    verdict = memory_filter(hosts, vm(), {})
    assert reasons(hosts, verdict) == {"h1": "free memory 2000 MB - pending 1000 MB = 1000 MB < required 1088 MB"}


def test_memory_need_is_exactly_enough() -> None:
    hosts = table(host("h1", mem_free_mb=1088, physical_mem_mb=1088))
    assert kept(hosts, memory_filter(hosts, vm(), {})) == ["h1"]
    hosts = table(host("h1", mem_free_mb=1087, physical_mem_mb=1088))
    assert kept(hosts, memory_filter(hosts, vm(), {})) == []


def test_memory_counts_free_swap_only_when_allowed() -> None:
    hosts = table(host("h1", mem_free_mb=1000, swap_total_mb=1000, swap_free_mb=500))
    assert kept(hosts, memory_filter(hosts, vm(use_swap=True), {})) == ["h1"]
    no_swap = memory_filter(hosts, vm(use_swap=False), {})
    assert reasons(hosts, no_swap) == {"h1": "free memory 1000 MB < required 1088 MB"}
    # Static huge pages are never swapped, whatever use_swap says.
    huge = memory_filter(hosts, vm(use_swap=True, hugepages=True), {})
    assert kept(hosts, huge) == []


def test_memory_swap_shows_in_reason() -> None:
    hosts = table(host("h1", mem_free_mb=500, swap_total_mb=500, swap_free_mb=100))
    verdict = memory_filter(hosts, vm(), {})
    assert reasons(hosts, verdict) == {"h1": "free memory 500 MB + free swap 100 MB = 600 MB < required 1088 MB"}


def test_memory_overcommit_check_reason() -> None:
    hosts = table(host("h1", mem_committed_mb=2900, reserved_mem_mb=321))
    verdict = memory_filter(hosts, vm(), {})
    # 100 % x 4096 - 2900 - 321 - 0 = 875 < 1088 (free memory itself would do).
    assert reasons(hosts, verdict) == {
        "h1": "max scheduling memory 875 MB < required 1088 MB "
        "(overcommit 100% of 4096 MB - committed 2900 MB - reserved 321 MB - pending 0 MB)"
    }


def test_memory_overcommit_percentage_allows_more() -> None:
    h = host("h1", mem_committed_mb=4000)
    assert kept(table(h), memory_filter(table(h), vm(), {})) == []
    # 150 % x 4096 = 6144; 6144 - 4000 = 2144 >= 1088.
    hosts = table(h, overcommit=150)
    assert kept(hosts, memory_filter(hosts, vm(), {})) == ["h1"]


def test_memory_overcommit_subtracts_pending() -> None:
    # Physical: 4096 - 1500 = 2596 is fine; overcommit: 4096 - 2000 - 0 - 1500 = 596 is not.
    hosts = table(host("h1", mem_committed_mb=2000), pending=[pend("h1", mem_mb=1500)])
    verdict = memory_filter(hosts, vm(), {})
    assert reasons(hosts, verdict)["h1"].startswith("max scheduling memory 596 MB < required 1088 MB")
    assert reasons(hosts, verdict)["h1"].endswith("pending 1500 MB)")


def test_memory_fractional_overcommit_in_reason() -> None:
    hosts = table(host("h1", physical_mem_mb=1001, mem_committed_mb=1000), overcommit=150)
    verdict = memory_filter(hosts, vm(), {})
    assert "max scheduling memory 501.5 MB" in verdict.reasons[0]


def test_memory_host_without_memory_is_removed() -> None:
    hosts = table(host("h1", physical_mem_mb=0, mem_free_mb=0))
    verdict = memory_filter(hosts, vm(mem_mb=1, overhead_mb=0), {})
    assert reasons(hosts, verdict) == {"h1": "free memory 0 MB < required 1 MB"}


def test_memory_skips_checks_on_current_host() -> None:
    # oVirt: the VM's memory is already on its current host.
    hosts = table(host("src", mem_free_mb=10), host("dst", mem_free_mb=10))
    verdict = memory_filter(hosts, vm(current_host="src"), {})
    assert kept(hosts, verdict) == ["src"]


HUGE_VM = {"hugepages": True, "mem_mb": 1024, "hugepage_size_kb": 2048}  # 512 pages of 2 MiB, + 64 MB overhead


def test_memory_hugepage_vm_needs_only_uncovered_pages_and_overhead() -> None:
    # Static huge pages are outside the host's free memory: pages the host has free cover the
    # VM's memory, and only the rest (plus the overhead) must come from free memory.
    hosts = table(
        host("covered", mem_free_mb=500, hugepages_free={2048: 512}),
        host("half", mem_free_mb=500, hugepages_free={2048: 256}),  # 256 pages = 512 MB + 64 > 500
        host("half-roomy", mem_free_mb=576, hugepages_free={2048: 256}),
        host("other-size", mem_free_mb=1000, hugepages_free={1048576: 4}),  # none of 2 MiB: all 1088
    )
    verdict = memory_filter(hosts, vm(**HUGE_VM), {})
    assert kept(hosts, verdict) == ["covered", "half-roomy"]
    assert reasons(hosts, verdict) == {
        "half": "free memory 500 MB < required 576 MB"
        " (512 MB not covered by free 2048 KiB huge pages + overhead 64 MB)",
        "other-size": "free memory 1000 MB < required 1088 MB"
        " (1024 MB not covered by free 2048 KiB huge pages + overhead 64 MB)",
    }


def test_memory_hugepage_vm_overcommit_check_counts_only_uncovered_pages() -> None:
    # 100 % x 4096 - committed 3996 = 100 MB of max scheduling memory: enough for the overhead of
    # a VM whose pages are all free on the host, not for one that needs 38 MB of pages more.
    hosts = table(
        host("covered", mem_committed_mb=3996, hugepages_free={2048: 512}),
        host("short-19-pages", mem_committed_mb=3996, mem_free_mb=4096 - 3996 + 100, hugepages_free={2048: 493}),
    )
    verdict = memory_filter(hosts, vm(**HUGE_VM), {})
    assert kept(hosts, verdict) == ["covered"]
    # 19 pages uncovered = 38 MB + 64 = 102 > 100
    assert reasons(hosts, verdict)["short-19-pages"].startswith(
        "max scheduling memory 100 MB < required 102 MB (38 MB not covered by free 2048 KiB huge pages"
    )


def test_memory_hugepage_pending_counts_against_pages_and_memory() -> None:
    # 100 MB pending -> 50 pages of 2 MiB may be taken, and 100 MB of free memory.
    hosts = table(
        host("h1", mem_free_mb=200, hugepages_free={2048: 562}),  # 512 pages left: need 64 <= 100
        host("h2", mem_free_mb=200, hugepages_free={2048: 540}),  # 490 left: 22 pages = 44 + 64 > 100
        pending=[pend("h1", mem_mb=100), pend("h2", mem_mb=100)],
    )
    verdict = memory_filter(hosts, vm(**HUGE_VM), {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict)["h2"].startswith("free memory 200 MB - pending 100 MB = 100 MB < required 108 MB")


def test_memory_hugepage_uncovered_part_rounds_up_to_whole_pages_and_never_uses_swap() -> None:
    # 1500 MB in 1 GiB pages is 2 pages: without free 1 GiB pages the kernel must find 2048 MB.
    spec = vm(hugepages=True, mem_mb=1500, hugepage_size_kb=1048576, use_swap=True)
    hosts = table(
        host("h1", mem_free_mb=2112),
        host("h2", mem_free_mb=2111, swap_total_mb=4096, swap_free_mb=4096),
        host("h3", mem_free_mb=100, hugepages_free={1048576: 1}),  # 1 page uncovered: 1024 + 64
    )
    verdict = memory_filter(hosts, spec, {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict)["h2"].startswith("free memory 2111 MB < required 2112 MB")
    assert reasons(hosts, verdict)["h3"].startswith("free memory 100 MB < required 1088 MB")


memory_hosts = st.lists(
    st.fixed_dictionaries(
        {
            "physical_mem_mb": st.integers(0, 8192),
            "mem_free_mb": st.integers(0, 8192),
            "swap_free_mb": st.integers(0, 2048),
            "mem_committed_mb": st.integers(0, 8192),
            "reserved_mem_mb": st.integers(0, 512),
            "pending": st.integers(0, 4096),
            "free_pages": st.integers(0, 4096),
        }
    ),
    min_size=0,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(
    memory_hosts,
    st.integers(1, 4096),
    st.sampled_from([100, 150, 200]),
    st.booleans(),
    st.booleans(),
)
def test_memory_keeps_exactly_the_hosts_that_pass_both_checks(
    specs: list[dict[str, int]], mem: int, overcommit: int, use_swap: bool, hugepages: bool
) -> None:
    states = [
        host(
            f"h{i}",
            **{k: v for k, v in s.items() if k not in ("pending", "free_pages")},
            swap_total_mb=s["swap_free_mb"],
            hugepages_free={2048: s["free_pages"]},
        )
        for i, s in enumerate(specs)
    ]
    pending = [pend(f"h{i}", mem_mb=s["pending"]) for i, s in enumerate(specs) if s["pending"]]
    hosts = table(*states, overcommit=overcommit, pending=pending)
    spec = vm(mem_mb=mem, use_swap=use_swap, hugepages=hugepages, hugepage_size_kb=2048)
    verdict = memory_filter(hosts, spec, {})
    for i, s in enumerate(specs):
        need = mem + 64
        if hugepages:  # 2 MiB pages: the pages not free after the pending ones, 2 MB each
            pages, pending_pages = -(-mem // 2), -(-s["pending"] // 2)
            need = 2 * max(pages - max(s["free_pages"] - pending_pages, 0), 0) + 64
        swap = s["swap_free_mb"] if use_swap and not hugepages else 0
        physical_ok = need <= s["mem_free_mb"] - s["pending"] + swap
        max_sched = (
            overcommit * s["physical_mem_mb"] / 100 - s["mem_committed_mb"] - s["reserved_mem_mb"] - s["pending"]
        )
        # The invariant of the brief: never keep a host whose max scheduling memory < need.
        if max_sched < need:
            assert not verdict.keep[i]
        assert bool(verdict.keep[i]) == (physical_ok and max_sched >= need)
    assert len(verdict.reasons) == int((~verdict.keep).sum())


# ------------------------------------------------------------------------------------ CPU
def test_cpu_vcpus_against_cores() -> None:
    hosts = table(host("big", cpu_cores=8), host("small", cpu_cores=4))
    verdict = cpu_filter(hosts, vm(vcpus=8), {})
    assert kept(hosts, verdict) == ["big"]
    assert reasons(hosts, verdict) == {"small": "4 cores < 8 vCPUs"}


def test_cpu_threads_count_when_cluster_says_so() -> None:
    h = host("h1", cpu_cores=4, cpu_threads=8)
    assert kept(table(h), cpu_filter(table(h), vm(vcpus=8), {})) == []
    threads = table(h, threads=True)
    assert kept(threads, cpu_filter(threads, vm(vcpus=8), {})) == ["h1"]
    assert cpu_filter(threads, vm(vcpus=9), {}).reasons == ["8 threads < 9 vCPUs"]


def test_cpu_exclusive_pinning_consumes_cpus() -> None:
    hosts = table(host("h1", cpu_cores=8, cpus_pinned=4), pending=[pend("h1", cpus_pinned=2)])
    verdict = cpu_filter(hosts, vm(vcpus=4), {})
    assert reasons(hosts, verdict) == {"h1": "8 cores - 6 exclusively pinned = 2 CPUs < 4 vCPUs"}
    assert kept(hosts, cpu_filter(hosts, vm(vcpus=2), {})) == ["h1"]


def test_cpu_unknown_topology_is_removed() -> None:
    hosts = table(host("h1", cpu_cores=0), host("h2"))
    verdict = cpu_filter(hosts, vm(vcpus=1), {})
    assert kept(hosts, verdict) == ["h2"]
    assert "unknown CPU topology" in reasons(hosts, verdict)["h1"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 16), st.integers(0, 32), st.integers(0, 16), st.integers(0, 8)),
        max_size=6,
    ),
    st.integers(1, 20),
    st.booleans(),
)
def test_cpu_keeps_exactly_hosts_with_enough_free_cpus(
    specs: list[tuple[int, int, int, int]], vcpus: int, threads: bool
) -> None:
    states = [host(f"h{i}", cpu_cores=c, cpu_threads=t, cpus_pinned=p) for i, (c, t, p, _) in enumerate(specs)]
    pending = [pend(f"h{i}", cpus_pinned=q) for i, (_, _, _, q) in enumerate(specs) if q]
    hosts = table(*states, threads=threads, pending=pending)
    verdict = cpu_filter(hosts, vm(vcpus=vcpus), {})
    for i, (cores, thr, pinned, pending_pinned) in enumerate(specs):
        cpus = thr if threads and thr > 0 else cores
        assert bool(verdict.keep[i]) == (cores > 0 and cpus - pinned - pending_pinned >= vcpus)
    assert len(verdict.reasons) == int((~verdict.keep).sum())


# ------------------------------------------------------------------------------------ Network
def test_network_lists_every_missing_network() -> None:
    hosts = table(
        host("all", networks=["ovirtmgmt", "storage"]),
        host("nostorage", networks=["ovirtmgmt"]),
        host("none"),
    )
    verdict = network_filter(hosts, vm(networks=["ovirtmgmt", "storage"]), {})
    assert kept(hosts, verdict) == ["all"]
    assert reasons(hosts, verdict) == {
        "nostorage": "missing network 'storage'",
        "none": "missing networks 'ovirtmgmt', 'storage'",
    }


def test_network_without_requirements_keeps_all() -> None:
    hosts = hosts_n(3)
    assert kept(hosts, network_filter(hosts, vm(), {})) == ["h0", "h1", "h2"]


def test_network_duplicates_are_listed_once() -> None:
    hosts = table(host("h1"))
    verdict = network_filter(hosts, vm(networks=["a", "a"]), {})
    assert list(verdict.reasons) == ["missing network 'a'"]


def test_network_long_lists_are_shortened() -> None:
    hosts = table(host("h1"))
    verdict = network_filter(hosts, vm(networks=[f"n{i}" for i in range(7)]), {})
    assert verdict.reasons[0] == "missing networks 'n0', 'n1', 'n2', 'n3', 'n4' and 2 more"


# ------------------------------------------------------------------------------------ PinToHost
def test_pin_to_host_keeps_only_pinned_hosts() -> None:
    hosts = hosts_n(3)
    verdict = pin_to_host_filter(hosts, vm(pinned_hosts=["h1"]), {})
    assert kept(hosts, verdict) == ["h1"]
    assert reasons(hosts, verdict) == {
        "h0": "the VM is pinned to other hosts ('h1')",
        "h2": "the VM is pinned to other hosts ('h1')",
    }


def test_pin_to_host_unpinned_vm_keeps_all() -> None:
    hosts = hosts_n(2)
    assert kept(hosts, pin_to_host_filter(hosts, vm(), {})) == ["h0", "h1"]


def test_pin_to_absent_host_removes_all() -> None:
    hosts = hosts_n(2)
    assert kept(hosts, pin_to_host_filter(hosts, vm(pinned_hosts=["elsewhere"]), {})) == []


# ------------------------------------------------------------------------------------ Migration
def test_migration_removes_source_host() -> None:
    hosts = hosts_n(3)
    verdict = migration_filter(hosts, vm(current_host="h1"), {})
    assert kept(hosts, verdict) == ["h0", "h2"]
    assert reasons(hosts, verdict) == {"h1": "the VM already runs on this host"}


def test_migration_without_source_keeps_all() -> None:
    hosts = hosts_n(2)
    assert kept(hosts, migration_filter(hosts, vm(), {})) == ["h0", "h1"]
    assert kept(hosts, migration_filter(hosts, vm(current_host="other"), {})) == ["h0", "h1"]


@pytest.mark.parametrize("unit", FILTER_UNITS, ids=lambda u: u.name)
def test_one_host_verdict_is_aligned(unit: PolicyUnit) -> None:
    assert unit.filter is not None
    hosts = hosts_n(1)
    verdict = unit.filter(hosts, vm(), {})
    assert verdict.keep.dtype == np.bool_
    assert verdict.keep.shape == (1,)
