"""Big batches: each VM folds only what was placed since the one before (decisions the same as
folding everything again), a placement stops at its deadline with nothing of the request kept, and
it lets the event loop's other work go on while it runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import host, pend, table, vm
from vmsched.bus.codec import decode
from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    DecisionStatus,
    PendingEntry,
    PlaceItem,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
    ScheduleDecision,
    ScheduleRequest,
    VmSpec,
)
from vmsched.errors import InvalidRequest
from vmsched.lifecycle.decisions import EXPIRED_WHILE_PLACING
from vmsched.lifecycle.placing import Placing
from vmsched.lifecycle.turns import GROUP_MAX_VMS, Turn
from vmsched.scheduling import placement
from vmsched.scheduling.hosts import PENDING_COLUMNS, HostTable, Prefix
from vmsched.scheduling.placement import (
    Expired,
    LocalSteps,
    Outcome,
    Placed,
    Screening,
    pending_entry,
    place,
    place_group,
)
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy
from vmsched.scheduling.units.rule_filters import network_filter
from vmsched_services.filter_worker.service import REPLY_MARGIN_MAX_S, stop_at
from vmsched_services.tools.bench.batches import batch_cost

POLICY: Policy = BUILTIN_POLICIES["evenly_distributed"]


def pending_for(v: VmSpec, host_id: str) -> PendingEntry:
    return pending_entry(v, host_id, request_id=uuid.UUID(int=1), fencing_token=1, expires_at=1e12)


class Refolding(LocalSteps):
    """The straightforward steps: every VM's pending folded into the table from scratch (a plain
    list, not a Prefix of the batch's log), as before the incremental fold."""

    async def filter(self, v: VmSpec, ids: Sequence[str], seen: Sequence[PendingEntry]) -> Screening:
        return await super().filter(v, ids, list(seen))

    async def weigh(self, v: VmSpec, ids: Sequence[str], seen: Sequence[PendingEntry]) -> Any:
        return await super().weigh(v, ids, list(seen))


def _place(
    steps: LocalSteps, req: ScheduleRequest, policy: Policy, pending: list[PendingEntry], deadline: float | None = None
) -> Outcome:
    return asyncio.run(
        place(
            req,
            policy.filter_names(),
            steps.hosts.ids,
            pending,
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=pending_for,
            may_wait=False,
            deadline=deadline,
        )
    )


def _hosts(n: int, mems: Sequence[int], nets: Sequence[bool]) -> HostTable:
    return table(
        *(
            host(
                f"h{i}",
                mem_free_mb=mems[i % len(mems)],
                physical_mem_mb=mems[i % len(mems)],
                cpu_cores=8,
                networks=["vmnet", "storage"] if nets[i % len(nets)] else ["vmnet"],
            )
            for i in range(n)
        )
    )


@st.composite
def mixed_batch(draw: st.DrawFn) -> tuple[HostTable, ScheduleRequest, Policy, list[PendingEntry]]:
    n = draw(st.integers(2, 12))
    hosts = _hosts(
        n, draw(st.lists(st.integers(2048, 16_384), min_size=1, max_size=4)), draw(st.lists(st.booleans())) or [True]
    )
    apart = AffinityGroup(
        group_id="apart", vms=["b0", "b1", "b2"], vm_rule=AffinityRule(positive=False, enforcing=True)
    )
    vms = [
        vm(
            vm_id=f"b{j}",
            mem_mb=draw(st.integers(256, 3072)),
            vcpus=draw(st.integers(1, 4)),
            networks=draw(st.sampled_from([["vmnet"], ["vmnet", "storage"]])),
            affinity_groups=[apart] if j < 3 and draw(st.booleans()) else [],
        )
        for j in range(draw(st.integers(1, 25)))
    ]
    req = ScheduleRequest(
        request_id=uuid.UUID(int=2),
        cluster_id="c1",
        vm=vms[0],
        batch=vms[1:],
        max_alternates=draw(st.integers(0, 3)),
        explain_hosts=draw(st.booleans()),
        explain_scores=draw(st.booleans()),
    )
    pending = [
        pend(f"h{draw(st.integers(0, n - 1))}", mem_mb=draw(st.integers(0, 2048)))
        for _ in range(draw(st.integers(0, 6)))
    ]
    return hosts, req, BUILTIN_POLICIES[draw(st.sampled_from(sorted(BUILTIN_POLICIES)))], pending


@settings(max_examples=80, deadline=None)
@given(mixed_batch())
def test_folding_only_the_newest_placement_decides_the_batch_as_refolding_everything_does(
    case: tuple[HostTable, ScheduleRequest, Policy, list[PendingEntry]],
) -> None:
    hosts, req, policy, pending = case
    incremental = _place(LocalSteps.of(hosts, policy), req, policy, pending)
    straightforward = _place(Refolding.of(hosts, policy), req, policy, pending)
    assert incremental == straightforward


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4096), st.integers(1, 8)), max_size=12),
    st.integers(0, 12),
    st.integers(0, 3),
)
def test_pending_folded_onto_a_fold_is_the_fold_of_all_of_it(
    records: list[tuple[int, int, int]], split: int, already: int
) -> None:
    """with_more_pending(with_pending(t, before), after) has with_pending(t, before + after)'s
    columns, whatever the table carried pending itself (it is replaced, not added to)."""
    base = table(*(host(f"h{i}") for i in range(6)), pending=[pend("h1", mem_mb=512)] * already)
    entries = [
        pending_entry(
            vm(vm_id=f"p{k}", mem_mb=m, vcpus=c), f"h{h}", request_id=uuid.UUID(int=3), fencing_token=1, expires_at=1e12
        )
        for k, (h, m, c) in enumerate(records)
    ] + [pend("elsewhere", mem_mb=1)]  # a host the table does not have is ignored
    whole = base.with_pending(entries)
    stepped = base.with_pending(entries[:split]).with_more_pending(entries[split:])
    for name in PENDING_COLUMNS:
        assert np.array_equal(getattr(stepped, name), getattr(whole, name)), name
    assert tuple(stepped.pending_vm_ids) == tuple(whole.pending_vm_ids)
    assert stepped.pending_rows() == whole.pending_rows()
    assert stepped.members_on(["p0", "p1"]).tolist() == whole.members_on(["p0", "p1"]).tolist()


def test_each_pending_record_is_folded_once_per_batch_not_once_per_later_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    """What made a batch cost the square of its size: each VM folded the cluster's pending and every
    earlier VM's record again. Now the first VM folds the cluster's, each later one the one new record."""
    hosts = _hosts(8, [65_536], [True])
    folded: list[int] = []
    whole, more = HostTable.with_pending, HostTable.with_more_pending

    def counting_whole(self: HostTable, entries: Any, *, now: float | None = None) -> HostTable:
        entries = list(entries)
        folded.append(len(entries))
        return whole(self, entries, now=now)

    def counting_more(self: HostTable, entries: Any) -> HostTable:
        entries = list(entries)
        folded.append(len(entries))
        return more(self, entries)

    monkeypatch.setattr(HostTable, "with_pending", counting_whole)
    monkeypatch.setattr(HostTable, "with_more_pending", counting_more)
    cluster_pending = [pend(f"h{i}", mem_mb=100) for i in range(5)]
    vms = [vm(vm_id=f"b{j}", mem_mb=512) for j in range(40)]
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vms[0], batch=vms[1:])
    outcome = _place(LocalSteps.of(hosts, POLICY), req, POLICY, cluster_pending)
    assert isinstance(outcome, Placed)
    assert folded[0] == 5  # the cluster's records, once
    assert sum(folded) == 5 + 39  # then one record per VM after the first


def test_a_prefix_reads_what_its_log_held_when_taken_and_what_was_added_since_an_earlier_one() -> None:
    log = [1, 2, 3]
    earlier = Prefix(log)
    log.append(4)
    later = Prefix(log)
    assert list(earlier) == [1, 2, 3]
    assert len(earlier) == 3
    assert earlier[-1] == 3
    assert later.since(earlier) == [4]
    assert earlier.since(later) is None  # a longer prefix is not earlier
    assert later.since(Prefix([1, 2, 3])) is None  # another log
    with pytest.raises(IndexError):
        earlier[3]


class FakeClock:
    """time.time for placement: each read one second later."""

    def __init__(self, start: float) -> None:
        self.now = start

    def time(self) -> float:
        self.now += 1.0
        return self.now

    def perf_counter(self) -> float:
        return self.now


def test_a_batch_still_being_placed_at_its_deadline_is_expired_with_nothing_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline is read every SLICE_S while the batch is placed (each VM here): at it, the
    request is Expired and no VM of it keeps a host or a pending record."""
    clock = FakeClock(1000.0)
    monkeypatch.setattr(placement, "time", clock)
    monkeypatch.setattr(placement, "SLICE_S", 0.0)
    hosts = _hosts(4, [65_536], [True])
    vms = [vm(vm_id=f"b{j}", mem_mb=512) for j in range(20)]
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vms[0], batch=vms[1:])
    outcome = _place(LocalSteps.of(hosts, POLICY), req, POLICY, [], deadline=1006.0)
    assert outcome == Expired(reached=5)  # read at 1001..1005 before VMs 0..4, 1006 before VM 5
    # Already past: not a VM is placed.
    assert _place(LocalSteps.of(hosts, POLICY), req, POLICY, [], deadline=clock.now) == Expired(reached=0)


def test_a_group_past_its_call_deadline_answers_expired_for_what_was_not_placed() -> None:
    """place_group with the call's deadline passed: the requests not placed are `expired`, without
    pending records (only placed requests carry records, which the selector commits under the fence)."""
    hosts = _hosts(4, [65_536], [True])
    small = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vm(vm_id="s0"))
    big_vms = [vm(vm_id=f"b{j}", mem_mb=512) for j in range(30)]
    big = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=big_vms[0], batch=big_vms[1:])
    group = PlaceRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        state_version=1,
        items=[PlaceItem(request=small), PlaceItem(request=big)],
        filters=POLICY.filter_calls(),
        weights=POLICY.weight_calls(),
        selector=POLICY.selector,
        now=1e9,
        pending_ttl_s=60.0,
        fencing_token=7,
    )
    results = asyncio.run(place_group(hosts, group, deadline=0.0))
    assert [r.outcome for r in results] == [PlaceOutcome.EXPIRED, PlaceOutcome.EXPIRED]
    assert all(r.pending == [] and r.placements == [] for r in results)
    placed = asyncio.run(place_group(hosts, group, deadline=None))
    assert [r.outcome for r in placed] == [PlaceOutcome.PLACED, PlaceOutcome.PLACED]
    assert len(placed[1].pending) == 30
    assert {e.fencing_token for e in placed[1].pending} == {7}


def test_a_big_batch_lets_other_work_on_the_loop_run_while_it_is_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Placing is CPU work on the event loop: it yields every SLICE_S so another cluster's request on
    the same worker is not held for the whole batch (here every VM, so the ticker must run between)."""
    monkeypatch.setattr(placement, "SLICE_S", 0.0)
    hosts = _hosts(6, [65_536], [True])
    vms = [vm(vm_id=f"b{j}", mem_mb=512) for j in range(30)]
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vms[0], batch=vms[1:])
    steps = LocalSteps.of(hosts, POLICY)

    async def both() -> tuple[Outcome, int]:
        done = False
        ticks_during = 0

        async def ticker() -> None:
            nonlocal ticks_during
            while not done:
                ticks_during += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks_during = 0  # count only from here
        outcome = await place(
            req,
            POLICY.filter_names(),
            hosts.ids,
            [],
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=pending_for,
            may_wait=False,
        )
        done = True
        await tick
        return outcome, ticks_during

    outcome, ticks = asyncio.run(both())
    assert isinstance(outcome, Placed)
    assert ticks >= 20  # about one per VM


def test_the_worker_stops_a_little_before_its_callers_deadline_so_the_reply_arrives() -> None:
    assert stop_at(None, 100.0) is None
    assert stop_at(110.0, 100.0) == pytest.approx(110.0 - REPLY_MARGIN_MAX_S)  # 10% of 10 s, capped
    assert stop_at(101.0, 100.0) == pytest.approx(100.9)  # 10% of what is left
    assert stop_at(99.0, 100.0) == 99.0  # already past: stop now


def test_network_reasons_made_once_per_network_set_say_what_each_host_misses() -> None:
    hosts = table(
        host("a", networks=["vmnet"]),
        host("b", networks=[]),
        host("c", networks=["vmnet"]),
        host("d", networks=["vmnet", "storage"]),
    )
    verdict = network_filter(hosts, vm(networks=["vmnet", "storage"]), {})
    assert list(verdict.reasons) == [
        "missing network 'storage'",
        "missing networks 'vmnet', 'storage'",
        "missing network 'storage'",
    ]


def test_a_request_of_more_vms_than_a_batch_may_carry_is_refused_up_front_naming_the_bound() -> None:
    """The bound that keeps one request within a `place` call's time: at most 1,000 batch VMs (a
    10,000-VM request is never placed for minutes; it is refused as it arrives)."""
    vms = [vm(vm_id=f"v{i}", mem_mb=1, vcpus=1) for i in range(1002)]
    fields = {**ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vms[0]).model_dump(mode="json")}
    fields["batch"] = [v.model_dump(mode="json") for v in vms[1:]]
    with pytest.raises(InvalidRequest) as refused:
        decode(json.dumps(fields).encode(), ScheduleRequest, max_bytes=4 * 1024 * 1024)
    assert refused.value.code == "invalid_request"
    assert refused.value.location == "batch"
    assert "at most 1000 items" in str(refused.value)
    assert GROUP_MAX_VMS == 1 + 1000  # a group holds the largest request whole


async def test_the_selector_answers_a_request_the_worker_stopped_at_its_deadline_expired_recording_nothing() -> None:
    """A `place` result `expired`: the request hears `expired` (why: a deadline passed while it was
    being placed); it is no outcome to commit, and nothing of it is counted pending for the next run."""
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c1", vm=vm(vm_id="b0"))
    turn = Turn(req, POLICY, "fp", 0.0, False, True, {})
    reply = PlaceReply(
        request_id=uuid.uuid4(),
        state_version=3,
        results=[PlaceResult(request_id=req.request_id, outcome=PlaceOutcome.EXPIRED)],
    )
    seen: list[PendingEntry] = []
    assert Placing._results([turn], reply, 7, 1, seen) == []
    assert seen == []
    decided = turn.done.result()
    assert isinstance(decided, ScheduleDecision)
    assert decided.status is DecisionStatus.EXPIRED
    assert decided.explanation.summary == f"not placed: {EXPIRED_WHILE_PLACING}"


async def test_the_bench_places_batches_past_what_a_request_may_carry_and_times_each() -> None:
    """`vmsched bench --batches`' in-process part: a batch larger than a request may carry, placed
    whole (it raises when not), its CPU time by size."""
    cost = await batch_cost(100, [5, 1200], 1)
    assert set(cost) == {"5", "1200"}
    assert all(seconds >= 0 for seconds in cost.values())
