"""Turns and groups (vmsched.lifecycle.turns), pure: which waiting attempts make a cluster's next
group, which come back as copies of a request id already in it, and where a group's `place` calls
are cut."""

from __future__ import annotations

import uuid
from collections import deque
from datetime import UTC, datetime, timedelta

from tests.factories import vm
from vmsched.contracts import ScheduleRequest
from vmsched.lifecycle.turns import Turn, fail, one_group, runs, settle
from vmsched.scheduling.policy import BUILTIN_POLICIES, DEFAULT_POLICY, Policy

AGING = 3600.0  # no aging within a test


def turn(
    name: str,
    *,
    request_id: uuid.UUID | None = None,
    priority: int = 0,
    mem_mb: int = 1024,
    deadline_s: float | None = None,
    policy: Policy = DEFAULT_POLICY,
) -> Turn:
    deadline = None if deadline_s is None else datetime.now(UTC) + timedelta(seconds=deadline_s)
    req = ScheduleRequest(
        request_id=request_id or uuid.uuid4(),
        cluster_id="c1",
        vm=vm(vm_id=name, mem_mb=mem_mb),
        priority=priority,
        deadline=deadline,
    )
    return Turn(req, policy, fingerprint=name, started=0.0, retried=False, may_wait=True, stages={})


def names(turns: list[Turn] | deque[Turn]) -> list[str]:
    return [t.req.vm.vm_id for t in turns]


async def test_a_group_takes_up_to_its_size_in_decision_order_the_rest_stay_in_arrival_order() -> None:
    queue = deque(
        [turn("plain-big", mem_mb=4096), turn("plain"), turn("urgent", priority=5), turn("soon", deadline_s=60)]
    )
    group, again = one_group(queue, 2, AGING)
    assert names(group) == ["urgent", "soon"]
    assert again == []
    assert names(queue) == ["plain-big", "plain"]
    group, again = one_group(queue, 2, AGING)
    assert names(group) == ["plain", "plain-big"]  # smaller first
    assert not queue


async def test_a_request_id_is_in_a_group_once_its_copies_come_back_separately() -> None:
    rid = uuid.uuid4()
    first, copy, other = turn("a", request_id=rid), turn("a", request_id=rid), turn("b")
    queue = deque([first, copy, other])
    group, again = one_group(queue, 10, AGING)
    assert group == [first, other]
    assert again == [copy]
    assert not queue


async def test_a_copy_beyond_the_group_size_still_comes_back_with_the_group() -> None:
    rid = uuid.uuid4()
    first, copy, other = turn("a", request_id=rid), turn("a", request_id=rid), turn("b")
    queue = deque([first, other, copy])
    group, again = one_group(queue, 1, AGING)
    assert group == [first]
    assert again == [copy]
    assert list(queue) == [other]


async def test_attempts_whose_caller_gave_up_are_dropped() -> None:
    gone, cancelled, live = turn("gone"), turn("cancelled"), turn("live")
    settle(gone, 7)
    cancelled.done.cancel()
    queue = deque([gone, cancelled, live])
    group, again = one_group(queue, 10, AGING)
    assert group == [live]
    assert again == []
    assert not queue


async def test_settle_and_fail_leave_a_turn_whose_caller_gave_up_alone() -> None:
    t = turn("a")
    settle(t, 3)
    settle(t, 4)
    fail(t, RuntimeError("late"))
    assert t.done.result() == 3
    u = turn("b")
    fail(u, RuntimeError("why"))
    settle(u, 1)
    assert isinstance(u.done.exception(), RuntimeError)


async def test_the_waiting_order_counts_every_vm_of_a_batch() -> None:
    t = turn("a", mem_mb=1024)
    assert (t.waiting.mem_mb, t.waiting.vcpus, t.waiting.deadline) == (1024 + 64, 2, None)
    assert turn("b", deadline_s=30).waiting.deadline is not None


async def test_runs_cut_where_the_policy_changes() -> None:
    other = next(p for p in BUILTIN_POLICIES.values() if p != DEFAULT_POLICY)
    turns = [turn("a"), turn("b"), turn("c", policy=other), turn("d")]
    assert [names(r) for r in runs(turns)] == [["a", "b"], ["c"], ["d"]]
    assert runs([]) == []


async def test_big_batches_go_in_groups_of_their_own_small_requests_still_share_one() -> None:
    """A group is placed in one call under one lock hold: two 1,000-VM batches in one ran out of
    both. A group takes at most GROUP_MAX_VMS VMs (its first request whatever its size), in decision
    order: after the first request that does not fit, none."""

    def batch(name: str, n: int) -> Turn:
        t = turn(name)
        vms = [vm(vm_id=f"{name}-{k}") for k in range(1, n)]
        return Turn(t.req.model_copy(update={"batch": vms}), t.policy, name, 0.0, False, True, {})

    queue = deque([batch("big1", 1001), batch("big2", 600), turn("small1"), batch("small2", 3)])
    group, _ = one_group(queue, 32, AGING)
    assert names(group) == ["small1", "small2", "big2"]  # decision order (smaller first): 604 VMs
    assert names(queue) == ["big1"]
    group, _ = one_group(queue, 32, AGING)
    assert names(group) == ["big1"]  # the most one request carries: alone
    queue = deque([batch("a", 600), batch("b", 600), batch("c", 600), turn("d", priority=-1)])
    group, _ = one_group(queue, 32, AGING)
    assert names(group) == ["a"]  # b does not fit, and the ones after it do not jump ahead of it
    assert names(queue) == ["b", "c", "d"]
