"""The placement algorithm with local filter and weigh steps (the pure pipeline over a HostTable):
batches see earlier VMs as pending, all or nothing, waiting for pending resources."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, table, vm
from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    PendingEntry,
    PlaceItem,
    PlaceOutcome,
    PlaceRequest,
    ScheduleRequest,
    UnitCall,
    VmSpec,
)
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import (
    LocalSteps,
    Outcome,
    Placed,
    Screening,
    Unplaceable,
    WaitForPending,
    pending_entry,
    place,
    place_group,
)
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy

POLICY: Policy = BUILTIN_POLICIES["evenly_distributed"]


class Local(LocalSteps):
    """The library's in-process steps, noting what each filtering saw."""

    def __init__(self, hosts: HostTable) -> None:
        super().__init__(hosts, POLICY.filter_calls(), POLICY.weight_calls(), POLICY.selector)
        self.filtered: list[tuple[str, int]] = []  # (vm, pending records it saw)

    async def filter(self, v: VmSpec, ids: Sequence[str], seen: Sequence[PendingEntry]) -> Screening:
        self.filtered.append((v.vm_id, len(seen)))
        return await super().filter(v, ids, seen)


def pending_for(v: VmSpec, host_id: str) -> PendingEntry:
    return pending_entry(v, host_id, request_id=uuid.uuid4(), fencing_token=1, expires_at=1e12)


def request(*vms: VmSpec) -> ScheduleRequest:
    return ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vms[0], batch=list(vms[1:]))


def run(
    req: ScheduleRequest, hosts: HostTable, pending: list[PendingEntry] | None = None, *, may_wait: bool = False
) -> tuple[Outcome, Local]:
    local = Local(hosts)
    outcome = asyncio.run(
        place(
            req,
            POLICY.filter_names(),
            list(hosts.ids),
            pending or [],
            filter_fn=local.filter,
            weigh_fn=local.weigh,
            pending_for=pending_for,
            may_wait=may_wait,
        )
    )
    return outcome, local


def test_a_batch_sees_the_earlier_vms_as_pending_and_spreads() -> None:
    hosts = table(host("a", mem_free_mb=3000, physical_mem_mb=3000), host("b", mem_free_mb=3000, physical_mem_mb=3000))
    outcome, local = run(request(vm(vm_id="v1", mem_mb=2000), vm(vm_id="v2", mem_mb=2000)), hosts)
    assert isinstance(outcome, Placed)
    assert sorted(p.host_id for p in outcome.placements) == ["a", "b"]  # the second does not fit beside the first
    assert [e.vm_id for e in outcome.pending] == ["v1", "v2"]
    assert local.filtered == [("v1", 0), ("v2", 1)]
    assert outcome.explanation.summary.startswith("placed 2 VMs; first: v1 (1/2)")


def test_a_batch_is_placed_whole_or_not_at_all() -> None:
    hosts = table(host("a", mem_free_mb=3000, physical_mem_mb=3000))
    outcome, _ = run(request(vm(vm_id="v1", mem_mb=2000), vm(vm_id="v2", mem_mb=2000)), hosts)
    assert isinstance(outcome, Unplaceable)
    assert outcome.explanation.summary.startswith("v2 (2/2): 0/1 hosts available")


def test_no_host_but_memory_pending_on_a_candidate_asks_to_wait_once() -> None:
    hosts = table(host("a", mem_free_mb=3000, physical_mem_mb=3000))
    big = request(vm(vm_id="v1", mem_mb=2000))
    busy = [pend("a", mem_mb=2000)]
    assert isinstance(run(big, hosts, busy, may_wait=True)[0], WaitForPending)
    assert isinstance(run(big, hosts, busy, may_wait=False)[0], Unplaceable)


def test_no_candidates_is_unplaceable_without_calling_the_filters() -> None:
    local = Local(table(host("a")))
    outcome = asyncio.run(
        place(
            request(vm()),
            POLICY.filter_names(),
            [],
            [],
            filter_fn=local.filter,
            weigh_fn=local.weigh,
            pending_for=pending_for,
            may_wait=True,
        )
    )
    assert isinstance(outcome, Unplaceable)
    assert outcome.explanation.summary == "0/0 hosts available"
    assert local.filtered == []


def test_a_vm_pending_outside_the_candidates_is_still_found_by_affinity() -> None:
    """The filter-worker folds pending into the whole cluster before taking the candidates, so a
    group member pending on a host that is not a candidate is found; the local steps must too."""
    hosts = table(host("a"), host("b"), host("c"))
    member = pending_entry(vm(vm_id="v1"), "c", request_id=uuid.uuid4(), fencing_token=1, expires_at=1e12)
    together = AffinityGroup(group_id="g", vms=["v1", "v2"], vm_rule=AffinityRule(positive=True, enforcing=True))
    local = Local(hosts)
    outcome = asyncio.run(
        place(
            request(vm(vm_id="v2", affinity_groups=[together])),
            POLICY.filter_names(),
            ["a", "b"],  # c is not a candidate (blacklisted, say)
            [member],
            filter_fn=local.filter,
            weigh_fn=local.weigh,
            pending_for=pending_for,
            may_wait=False,
        )
    )
    assert isinstance(outcome, Unplaceable)
    assert "members are on c" in outcome.explanation.summary


@st.composite
def placement_case(draw: st.DrawFn) -> tuple[HostTable, ScheduleRequest, Policy]:
    n = draw(st.integers(1, 8))
    hosts = table(
        *(
            host(
                f"h{i}",
                cpu_usage_pct=draw(st.floats(0, 100)),
                mem_free_mb=(mem := draw(st.integers(512, 16_384))),
                physical_mem_mb=mem,
                vm_count=draw(st.integers(0, 20)),
            )
            for i in range(n)
        )
    )
    vms = [vm(vm_id=f"v{j}", mem_mb=draw(st.integers(256, 4096))) for j in range(draw(st.integers(1, 3)))]
    req = ScheduleRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        vm=vms[0],
        batch=vms[1:],
        max_alternates=draw(st.integers(0, 4)),
        explain_scores=draw(st.booleans()),
    )
    return hosts, req, BUILTIN_POLICIES[draw(st.sampled_from(sorted(BUILTIN_POLICIES)))]


def _place_with(steps: LocalSteps, req: ScheduleRequest, policy: Policy) -> Outcome:
    return asyncio.run(
        place(
            req,
            policy.filter_names(),
            list(steps.hosts.ids),
            [],
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=pending_for,
            may_wait=False,
        )
    )


@settings(max_examples=60, deadline=None)
@given(placement_case())
def test_ranking_in_the_filter_step_or_only_the_best_few_decides_the_same(
    case: tuple[HostTable, ScheduleRequest, Policy],
) -> None:
    """The filter-worker weighing the survivors itself, and workers answering only the best
    1 + max_alternates hosts, are optimisations: the decision is the one the separate, whole-table
    weigh step makes."""
    hosts, req, policy = case
    top = None if req.explain_scores else 1 + req.max_alternates
    separate = _place_with(LocalSteps.of(hosts, policy), req, policy)
    combined = _place_with(LocalSteps.of(hosts, policy, weigh_in_filter=True, top=top), req, policy)
    assert type(combined) is type(separate)
    if isinstance(separate, Placed):
        assert isinstance(combined, Placed)
        assert combined.placements == separate.placements
        assert [e.host_id for e in combined.pending] == [e.host_id for e in separate.pending]
        if req.explain_scores:
            assert combined.explanation == separate.explanation


@st.composite
def group_case(draw: st.DrawFn) -> tuple[HostTable, list[ScheduleRequest], Policy, list[bool]]:
    hosts, first, policy = draw(placement_case())
    requests = [first]
    for k in range(draw(st.integers(0, 4))):
        vms = [vm(vm_id=f"g{k}-{j}", mem_mb=draw(st.integers(256, 8192))) for j in range(draw(st.integers(1, 2)))]
        requests.append(
            ScheduleRequest(
                request_id=uuid.uuid4(),
                cluster_id="c1",
                vm=vms[0],
                batch=vms[1:],
                max_alternates=draw(st.integers(0, 3)),
                explain_scores=draw(st.booleans()),
                explain_hosts=draw(st.booleans()),
                # A whitelist or blacklist of the first hosts: candidates differ per request.
                whitelist=draw(st.one_of(st.none(), st.just(list(hosts.ids[:2])))),
                blacklist=draw(st.sampled_from([[], list(hosts.ids[:1])])),
            )
        )
    return hosts, requests, policy, [draw(st.booleans()) for _ in requests]


@settings(max_examples=60, deadline=None)
@given(group_case())
def test_a_group_placed_in_one_call_decides_as_one_request_at_a_time(
    case: tuple[HostTable, list[ScheduleRequest], Policy, list[bool]],
) -> None:
    """place_group (what the filter-worker runs for a `place` call: filter and rank in one step,
    only the best few hosts, the whole group in order) gives each request the decision it gets
    alone with separate filter and whole-table weigh steps, after the earlier requests' VMs were
    recorded as pending."""
    hosts, requests, policy, waits = case
    pending = [
        pending_entry(vm(vm_id="elsewhere"), hosts.ids[-1], request_id=uuid.uuid4(), fencing_token=1, expires_at=1e12)
    ]
    group = PlaceRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        state_version=1,
        items=[PlaceItem(request=r, may_wait=w) for r, w in zip(requests, waits, strict=True)],
        filters=policy.filter_calls(),
        weights=policy.weight_calls(),
        selector=policy.selector,
        pending=pending,
        now=1e9,
    )
    results = asyncio.run(place_group(hosts, group))
    assert [r.request_id for r in results] == [r.request_id for r in requests]

    seen = list(pending)
    for req, may_wait, got in zip(requests, waits, results, strict=True):
        steps = LocalSteps.of(hosts, policy, now=1e9)
        alone = asyncio.run(
            place(
                req,
                policy.filter_names(),
                candidate_hosts(hosts, req.whitelist, req.blacklist).ids,
                seen,
                filter_fn=steps.filter,
                weigh_fn=steps.weigh,
                pending_for=pending_for,
                may_wait=may_wait,
            )
        )
        if isinstance(alone, Placed):
            assert got.outcome is PlaceOutcome.PLACED
            assert got.placements == alone.placements
            assert got.explanation is not None
            assert got.explanation.summary == alone.explanation.summary
            assert got.explanation.filtered == alone.explanation.filtered
            seen.extend(alone.pending)
        elif isinstance(alone, Unplaceable):
            assert got.outcome is PlaceOutcome.UNPLACEABLE
            assert got.explanation == alone.explanation
            # Nothing fits: every candidate is listed with its reason.
            assert len(got.explanation.filtered) == got.explanation.candidates
        else:
            assert got.outcome is PlaceOutcome.WAIT


def test_a_request_that_cannot_be_evaluated_is_an_error_and_the_group_goes_on() -> None:
    # MetricsWeigher with MetricsRequired refuses to weigh a host that lacks the metric: a request
    # that reaches h2 (no metric) cannot be evaluated; one whitelisted to h0 and h1 can.
    hosts = table(host("h0", metrics={"m": 1.0}), host("h1", metrics={"m": 2.0}), host("h2"))
    weigher = UnitCall(unit="MetricsWeigher", properties={"WeightSetting": "m=1.0", "MetricsRequired": "true"})
    requests = [
        request(vm(vm_id="a")).model_copy(update={"whitelist": ["h0", "h1"]}),
        request(vm(vm_id="bad")),
        request(vm(vm_id="c")).model_copy(update={"whitelist": ["h0", "h1"]}),
    ]
    group = PlaceRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        state_version=1,
        items=[PlaceItem(request=r) for r in requests],
        filters=[],
        weights=[weigher],
        now=1e9,
    )
    a, bad, c = asyncio.run(place_group(hosts, group))
    assert [a.outcome, bad.outcome, c.outcome] == [PlaceOutcome.PLACED, PlaceOutcome.ERROR, PlaceOutcome.PLACED]
    assert bad.error is not None
    assert "h2 does not report metric 'm'" in bad.error.message
    assert a.placements[0].host_id == "h1"  # the higher metric
    # c saw a's VM pending on h1, but metrics alone weigh: h1 still wins.
    assert c.placements[0].host_id == "h1"
