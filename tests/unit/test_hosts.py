"""HostTable: building, subsetting, pending, and the incremental row update the caches rely on."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, table
from vmsched.contracts import ClusterReport, HostState, HostStatus
from vmsched.scheduling.hosts import BOOLEAN_COLUMNS, NUMERIC_COLUMNS, OBJECT_COLUMNS, HostTable

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


# ---------------------------------------------------------------------- catching up: HostTable.updated

#: Hosts varied in every kind of column: NaN where a host never reported a time or has no CPU
#: samples, empty and non-empty sets and maps (tables share one object for those).
varied_hosts_st = st.builds(
    lambda i, cores, up, spm, nets, vms, samples, when, labels, caps, pages: host(
        f"h{i:02d}",
        cpu_cores=cores,
        status=HostStatus.UP if up else HostStatus.MAINTENANCE,
        is_spm=spm,
        networks=nets,
        vm_ids=sorted(vms),
        vm_count=len(vms),
        cpu_samples=[(1e9 + k, load) for k, load in enumerate(samples)],
        reported_at=None if when is None else datetime.fromtimestamp(when, UTC),
        labels=labels,
        capabilities=caps,
        hugepages_free=pages,
        metrics={"cpu.percent": float(cores)} if cores % 2 else {},
        host_groups=["g1"] if spm else [],
    ),
    st.integers(0, 15),
    st.integers(0, 64),
    st.booleans(),
    st.booleans(),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    st.sets(st.sampled_from(["vm-1", "vm-2", "vm-3"])),
    st.lists(st.floats(0, 100), max_size=3),
    st.none() | st.integers(1_600_000_000, 1_900_000_000),
    st.dictionaries(st.sampled_from(["rack", "availability_zone"]), st.sampled_from(["r1", "az1"]), max_size=2),
    st.dictionaries(st.sampled_from(["cpu_info", "numa"]), st.integers(0, 3) | st.lists(st.integers(0, 3)), max_size=2),
    st.dictionaries(st.sampled_from([2048, 1048576]), st.integers(0, 512), max_size=2),
)
#: One catch-up: the hosts whose records changed (or appeared), and the ids whose records are gone.
steps_st = st.tuples(
    st.lists(varied_hosts_st, max_size=5, unique_by=lambda h: h.report.host_id),
    st.sets(st.sampled_from([f"h{i:02d}" for i in range(16)]), max_size=4),
)


def _same_columns(a: HostTable, b: HostTable) -> None:
    """Every column of `a` equals `b`'s (NaN equals NaN), with the same dtype."""
    assert a.ids == b.ids
    assert a.settings == b.settings
    assert a.index == b.index
    for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    for name in OBJECT_COLUMNS:
        assert tuple(getattr(a, name)) == tuple(getattr(b, name)), name


@settings(max_examples=150, deadline=None)
@given(st.lists(varied_hosts_st, max_size=10, unique_by=lambda h: h.report.host_id), st.lists(steps_st, max_size=6))
def test_a_table_caught_up_through_adds_changes_and_removals_equals_a_rebuild(
    initial: list[HostState], steps: list[tuple[list[HostState], set[str]]]
) -> None:
    """What StateCache relies on instead of keeping every host's model: after any sequence of
    catch-ups, the table equals one built from the final states in id order."""
    states = {h.report.host_id: h for h in initial}
    caught_up = HostTable.from_states([states[h] for h in sorted(states)], SETTINGS)
    for changed, removed in steps:
        changes = {h.report.host_id: h for h in changed}
        previous = caught_up
        before = HostTable.from_states([states[h] for h in sorted(states)], SETTINGS)
        caught_up = caught_up.updated(changes, removed)
        for h in removed - changes.keys():
            states.pop(h, None)
        states.update(changes)
        _same_columns(caught_up, HostTable.from_states([states[h] for h in sorted(states)], SETTINGS))
        _same_columns(previous, before)  # the previous version is untouched (requests still read it)


def test_updated_inserts_in_id_order_keeps_pending_and_takes_new_settings() -> None:
    base = HostTable.from_states([host("b", cpu_cores=2), host("d", cpu_cores=4)], SETTINGS)
    base = base.with_pending([pend("b", 100), pend("d", 300)])
    assert base.index == {"b": 0, "d": 1}
    threads = ClusterReport(cluster_id="c", count_threads_as_cores=True)
    t = base.updated(
        {"c": host("c", cpu_cores=3), "a": host("a", cpu_cores=1), "d": host("d", cpu_cores=5)}, ["b"], threads
    )
    assert t.ids == ("a", "c", "d")
    assert t.position("d") == 2  # positions are the new table's own
    assert t.cpu_cores.tolist() == [1, 3, 5]
    assert t.pending_mem_mb.tolist() == [0, 0, 300]  # d keeps what is pending on it; new hosts have nothing
    assert t.settings is threads
    assert base.ids == ("b", "d")
    assert base.index == {"b": 0, "d": 1}
    # Removing an id the table does not have changes nothing; a host both changed and removed is changed.
    assert t.updated({}, ["zz"]).ids == t.ids
    assert t.updated({"a": host("a", cpu_cores=7)}, ["a"]).cpu_cores.tolist() == [7, 3, 5]


def test_tables_share_equal_immutable_values_between_hosts() -> None:
    t = HostTable.from_states([host("a", networks=["n1"]), host("b", networks=["n1"]), host("c")], SETTINGS)
    assert t.networks[0] is t.networks[1]
    assert t.vm_ids[0] is t.vm_ids[2]
    assert t.labels[0] is t.labels[1]
    with pytest.raises(TypeError):
        t.labels[0]["rack"] = "r1"  # type: ignore[index]  # shared, hence read-only


@given(st.lists(st.tuples(st.floats(0, 2e9), st.floats(0, 100)), max_size=130))
def test_cpu_samples_read_as_the_pairs_the_host_reported(pairs: list[tuple[float, float]]) -> None:
    t = HostTable.from_states([host("a", cpu_samples=pairs)], SETTINGS)
    samples = t.cpu_samples[0]
    assert samples == tuple(pairs)
    assert len(samples) == len(pairs)
    assert list(samples) == pairs
    assert list(samples.times) == [p[0] for p in pairs]
    assert list(samples.loads) == [p[1] for p in pairs]
    if pairs:
        assert samples[-1] == pairs[-1]
        assert samples[0] == pairs[0]
        assert tuple(samples[1:]) == tuple(pairs[1:])
        assert t.cpu_last_sample_pct[0] == pairs[-1][1]
    else:
        assert not samples
        with pytest.raises(IndexError):
            samples[0]
