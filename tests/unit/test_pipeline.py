"""The pipeline glue: candidates, the filter chain, the aggregate line, the one-host shortcut."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.factories import host, pending_entry, table, vm
from vmsched.contracts import FilteredHost, HostStatus, PendingEntry, ScheduleRequest, UnitCall, VmSpec
from vmsched.errors import InvalidProperty, UnknownPolicyUnit
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts, run_filters, run_weights, summarize
from vmsched.scheduling.placement import LocalSteps, Placed, place
from vmsched.scheduling.policy import DEFAULT_POLICY


def test_candidates_are_up_hosts_minus_blacklist_within_whitelist() -> None:
    t = table(host("a"), host("b", status=HostStatus.MAINTENANCE), host("c"), host("d"))
    assert candidate_hosts(t).ids == ("a", "c", "d")
    assert candidate_hosts(t, blacklist=["c"]).ids == ("a", "d")
    assert candidate_hosts(t, whitelist=["b", "c", "zz"]).ids == ("c",)
    assert candidate_hosts(t, whitelist=[], blacklist=[]).ids == ()


def test_chain_each_filter_sees_only_survivors_and_records_who_removed_whom() -> None:
    t = table(
        host("small", mem_free_mb=100, physical_mem_mb=100),
        host("nonet", networks=[]),
        host("ok", networks=["storage"]),
    )
    out = run_filters(t, vm(mem_mb=1024, networks=["storage"]), DEFAULT_POLICY.filter_calls())
    assert out.survivors.ids == ("ok",)
    by_host = {f.host_id: f.filter for f in out.removed}
    assert by_host == {"small": "Memory", "nonet": "Network"}
    # a host removed by Memory is not judged again by Network
    assert sum(1 for f in out.removed if f.host_id == "small") == 1


def test_chain_stops_when_no_host_is_left() -> None:
    t = table(host("a", mem_free_mb=10, physical_mem_mb=10))
    calls = [UnitCall(unit="Memory"), UnitCall(unit="NoSuchUnitWouldFailIfReached")]
    out = run_filters(t, vm(mem_mb=4096), calls)
    assert out.survivors.ids == ()


def test_unknown_unit_and_invalid_property_are_clear_errors() -> None:
    t = table(host("a"), host("b"))
    with pytest.raises(UnknownPolicyUnit, match="Nope"):
        run_filters(t, vm(), [UnitCall(unit="Nope")])
    with pytest.raises(InvalidProperty, match=r"HighUtilization='500'.*\^\(\[5-9\]\[0-9\]\)\$"):
        run_weights(t, vm(), [UnitCall(unit="OptimalForEvenCpuDistribution", properties={"HighUtilization": "500"})])


def test_summary_shows_one_reason_when_all_agree_and_the_unit_summary_otherwise() -> None:
    removed = [FilteredHost(host_id=f"h{i}", filter="Network", reason="missing network 'storage'") for i in range(3)]
    removed += [
        FilteredHost(host_id="m1", filter="Memory", reason="free memory 1 MB < required 2 MB"),
        FilteredHost(host_id="m2", filter="Memory", reason="free memory 3 MB < required 4 MB"),
    ]
    assert summarize(5, 0, removed) == (
        "0/5 hosts available: 3 Network (missing network 'storage'), 2 Memory (insufficient free memory)"
    )
    assert summarize(4, 4, []) == "4/4 hosts available"


def decide(t: HostTable, v: VmSpec) -> Placed:
    """The selector's placement function with local steps, for one VM under the default policy."""
    steps = LocalSteps.of(t, DEFAULT_POLICY)
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=v, explain_scores=True)

    def no_record(vm: VmSpec, host_id: str) -> PendingEntry:
        return pending_entry(vm.vm_id, host_id, 1, mem_mb=vm.mem_mb)

    outcome = asyncio.run(
        place(
            req,
            DEFAULT_POLICY.filter_names(),
            list(t.ids),
            [],
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=no_record,
            may_wait=False,
        )
    )
    assert isinstance(outcome, Placed), outcome
    return outcome


def test_one_survivor_is_chosen_without_weighing() -> None:
    t = table(host("a", networks=["x"]), host("b"))
    d = decide(t, vm(networks=["x"]))
    assert [p.host_id for p in d.placements] == ["a"]
    assert d.explanation.scores is None
    assert d.explanation.summary == "1/2 hosts available: 1 Network (missing network 'x')"


def test_all_survivors_are_ordered_with_a_score_table() -> None:
    t = table(host("busy", cpu_usage_pct=90), host("idle", cpu_usage_pct=5), host("mid", cpu_usage_pct=40))
    d = decide(t, vm())
    scores = d.explanation.scores
    assert scores is not None
    assert d.placements[0].host_id == "idle"
    assert [d.placements[0].host_id, *d.placements[0].alternates] == scores.hosts
    assert [u.unit for u in scores.units] == [w.unit for w in DEFAULT_POLICY.weights]
    assert scores.totals == sorted(scores.totals, reverse=True)
