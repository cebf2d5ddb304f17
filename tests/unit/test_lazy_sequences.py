"""The lazy sequences (a table's rows, a filter's reasons, the removed hosts, VMs host by host) share one
base: an item is read where it is until the sequence is read whole, which makes its items once."""

from __future__ import annotations

import numpy as np
import pytest

from tests.factories import vm_report
from vmsched.scheduling.pipeline import Removal, Removals
from vmsched.scheduling.units.base import LazyReasons, VmsByHost


def test_a_reason_is_made_once_whether_read_alone_or_whole() -> None:
    made: list[int] = []

    def reason(i: int) -> str:
        made.append(i)
        return f"host {i}"

    reasons = LazyReasons(reason, np.array([4, 7, 9]))
    assert reasons[1] == "host 7"
    assert reasons[-1] == "host 9"
    assert made == [7, 9]
    assert reasons == ["host 4", "host 7", "host 9"]
    assert list(reasons[:2]) == ["host 4", "host 7"]
    assert made == [7, 9, 4]
    with pytest.raises(TypeError):
        hash(reasons)


def test_removals_are_made_again_after_a_filter_adds_its_own() -> None:
    removals = Removals()
    removals.add("Memory", ["h1", "h2", "h3"], [0, 2], ["low memory", "low memory"])
    assert len(removals) == 2
    assert removals[1] == Removal("h3", "Memory", "low memory")
    removals.add("CPU", ["h2"], [0], ["too few CPUs"])
    assert len(removals) == 3
    assert list(removals) == [
        Removal("h1", "Memory", "low memory"),
        Removal("h3", "Memory", "low memory"),
        Removal("h2", "CPU", "too few CPUs"),
    ]
    assert removals.tally() == [("Memory", 2, "low memory"), ("CPU", 1, "too few CPUs")]


def test_vms_by_host_read_host_after_host_of_those_kept() -> None:
    by_host = {
        "a": {"v1": vm_report("c", "v1", "a", mem_mb=1, vcpus=1), "v2": vm_report("c", "v2", "a", mem_mb=2, vcpus=1)},
        "b": {"v3": vm_report("c", "v3", "b", mem_mb=3, vcpus=1)},
    }
    vms = VmsByHost(by_host)
    assert [v.vm_id for v in vms] == ["v1", "v2", "v3"]
    assert vms[-1].vm_id == "v3"
    big = vms.kept(lambda v: v.mem_mb >= 2)
    assert [v.vm_id for v in big] == ["v2", "v3"]
    assert [v.vm_id for v in big.on("a")] == ["v2"]
    assert big.on("nowhere") == []
    assert len(big) == 2
