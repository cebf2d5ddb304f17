"""HostTable: building, subsetting, pending, and the incremental row update the caches rely on."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, table
from vmsched.contracts import ClusterReport, HostState, HostStatus
from vmsched.scheduling.hosts import NUMERIC_COLUMNS, HostTable

SETTINGS = ClusterReport(cluster_id="c")


def _same(a: HostTable, b: HostTable) -> None:
    assert a.ids == b.ids
    assert a.networks == b.networks
    np.testing.assert_array_equal(a.up, b.up)
    np.testing.assert_array_equal(a.is_spm, b.is_spm)
    for name in NUMERIC_COLUMNS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


hosts_st = st.builds(
    lambda i, cores, free, vms, up, nets: host(
        f"h{i}",
        cpu_cores=cores,
        mem_free_mb=free,
        vm_count=vms,
        status=HostStatus.UP if up else HostStatus.DOWN,
        networks=nets,
    ),
    st.integers(0, 30),
    st.integers(0, 64),
    st.integers(0, 4096),
    st.integers(0, 50),
    st.booleans(),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
)


def _renamed(h: HostState, host_id: str) -> HostState:
    return h.model_copy(update={"report": h.report.model_copy(update={"host_id": host_id})})


@settings(max_examples=80, deadline=None)
@given(st.lists(hosts_st, min_size=1, max_size=12, unique_by=lambda h: h.report.host_id), st.data())
def test_with_rows_equals_a_full_rebuild(hosts: list[HostState], data: st.DataObject) -> None:
    base = HostTable.from_states(hosts, SETTINGS)
    changed_ids = data.draw(st.sets(st.sampled_from([h.report.host_id for h in hosts])))
    changes = {hid: _renamed(data.draw(hosts_st), hid) for hid in changed_ids}
    updated = base.with_rows(changes)
    assert updated is not None
    rebuilt = HostTable.from_states([changes.get(h.report.host_id, h) for h in hosts], SETTINGS)
    _same(updated, rebuilt)
    # the original is untouched (tables are shared between requests)
    _same(base, HostTable.from_states(hosts, SETTINGS))


def test_with_rows_refuses_a_new_host() -> None:
    base = HostTable.from_states([host("a")], SETTINGS)
    assert base.with_rows({"b": host("b")}) is None


def test_pending_is_summed_per_host_and_unknown_hosts_are_ignored() -> None:
    t = table(host("a"), host("b"), pending=[pend("a", 100, 2), pend("a", 50, 1, 1), pend("zz", 999)])
    assert t.pending_mem_mb.tolist() == [150, 0]
    assert t.pending_vcpus.tolist() == [3, 0]
    assert t.pending_cpus_pinned.tolist() == [1, 0]
    assert t.pending_vm_count.tolist() == [2, 0]


def test_take_and_subset_keep_columns_aligned() -> None:
    t = table(host("a", cpu_cores=1), host("b", cpu_cores=2), host("c", cpu_cores=3))
    s = t.subset(["c", "a", "nope"])
    assert s.ids == ("c", "a")
    assert s.cpu_cores.tolist() == [3, 1]
    assert s.position("a") == 1
    assert t.take(np.array([False, True, False])).ids == ("b",)


def test_effective_cpus_counts_threads_only_when_the_cluster_says_so() -> None:
    hs = [host("a", cpu_cores=8, cpu_threads=16), host("b", cpu_cores=4, cpu_threads=0)]
    assert table(*hs).effective_cpus.tolist() == [8, 4]
    assert table(*hs, threads=True).effective_cpus.tolist() == [16, 4]


def test_empty_table() -> None:
    t = HostTable.from_states([], SETTINGS)
    assert len(t) == 0
    assert t.mem_free_mb.shape == (0,)
