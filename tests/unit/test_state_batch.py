"""Merging a run's state writes (vmsched.store.state_batch): each VM's last outcome, the union of
changed hosts, and the counts after earlier reports where a resync could have ended."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import vm_report
from vmsched.contracts import ClusterReport
from vmsched.store.state_batch import StateWrite, earlier_counts, merge


def _vm(vm_id: str, host: str = "h1") -> StateWrite:
    return StateWrite(kind="vm", hosts=[host], vms_set=[vm_report("c", vm_id, host, mem_mb=1, vcpus=1)])


def test_each_vm_ends_as_its_last_write_left_it() -> None:
    gone = StateWrite(kind="vm", hosts=["h1"], vms_deleted=["vm-1"])
    merged = merge(
        [_vm("vm-1"), _vm("vm-2", "h2"), gone, _vm("vm-3"), StateWrite(kind="vm", vms_deleted=["vm-3"])], [(1, 1)] * 5
    )
    assert merged.hosts == ["h1", "h2"]
    assert [vm.vm_id for vm in merged.vms_set] == ["vm-2"]
    assert sorted(merged.vms_deleted) == ["vm-1", "vm-3"]
    back = merge([gone, _vm("vm-1", "h3")], [(1, 0), (1, 1)])
    assert [(vm.vm_id, vm.host_id) for vm in back.vms_set] == [("vm-1", "h3")]
    assert back.vms_deleted == []
    assert back.kind == "vm"


def test_settings_and_removals_do_not_merge() -> None:
    with pytest.raises(ValueError, match="alone"):
        merge([_vm("vm-1"), StateWrite(kind="cluster", settings=ClusterReport(cluster_id="c"))], [(0, 1), (0, 1)])
    with pytest.raises(ValueError, match="alone"):
        merge([_vm("vm-1"), StateWrite(kind="host-removed", hosts_deleted=["h1"])], [(0, 1), (0, 0)])
    with pytest.raises(ValueError, match="counts"):
        merge([_vm("vm-1")], [])


def test_earlier_counts_are_the_points_no_later_one_covers() -> None:
    assert earlier_counts([]) == []
    assert earlier_counts([(1, 1), (2, 2)]) == []
    assert earlier_counts([(1, 3), (2, 2), (3, 1)]) == [(-2, 2), (-1, 1)]
    assert earlier_counts([(1, 3), (1, 3), (2, 1)]) == [(-1, 2)]


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=12),
    st.integers(0, 6),
    st.integers(0, 6),
)
def test_a_resync_ends_with_earlier_counts_iff_it_ends_after_some_report(
    counts: list[tuple[int, int]], hosts: int, vms: int
) -> None:
    """A flag waiting for (hosts, vms) is settled by the merged check (the final counts, or one of
    the earlier offsets added to them) exactly when one report's check, alone, would have settled it."""
    final_hosts, final_vms = counts[-1]
    points = [(final_hosts, final_vms)] + [(final_hosts + h, final_vms + v) for h, v in earlier_counts(counts)]
    merged = any(h >= hosts and v >= vms for h, v in points)
    assert merged == any(h >= hosts and v >= vms for h, v in counts)
