"""The order of requests waiting for one cluster: priority, aging, deadline, size, arrival."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vmsched.lifecycle.queueing import Waiting, decision_order, effective_priority

AGING = 1.0


def w(priority: int = 0, at: float = 0.0, deadline: float | None = None, mem: int = 1024, vcpus: int = 1) -> Waiting:
    return Waiting(priority=priority, enqueued_at=at, deadline=deadline, mem_mb=mem, vcpus=vcpus)


def test_higher_priority_first_then_deadline_then_smaller_then_arrival() -> None:
    queue = [
        w(at=0.0, mem=4096),  # 0: plain, big
        w(at=0.1, mem=1024),  # 1: plain, small
        w(at=0.2, deadline=5.0),  # 2: a deadline
        w(priority=5, at=0.3),  # 3: urgent
        w(at=0.4, mem=1024),  # 4: same as 1, later
    ]
    assert decision_order(queue, now=0.5, aging_s=AGING) == [3, 2, 1, 4, 0]


def test_waiting_raises_priority_so_nobody_starves() -> None:
    old, new = w(priority=0, at=0.0), w(priority=3, at=9.5)
    assert effective_priority(old, now=10.0, aging_s=AGING) == 10
    assert decision_order([new, old], now=10.0, aging_s=AGING) == [1, 0]


waiting = st.builds(
    Waiting,
    priority=st.integers(-10, 10),
    enqueued_at=st.floats(0, 100),
    deadline=st.none() | st.floats(0, 200),
    mem_mb=st.integers(1, 1 << 16),
    vcpus=st.integers(1, 64),
)


@given(st.lists(waiting, max_size=30), st.floats(100, 200))
def test_the_order_is_a_permutation_sorted_by_effective_priority(queue: list[Waiting], now: float) -> None:
    order = decision_order(queue, now, AGING)
    assert sorted(order) == list(range(len(queue)))
    prios = [effective_priority(queue[i], now, AGING) for i in order]
    assert prios == sorted(prios, reverse=True)


@given(waiting, st.integers(0, 20), st.floats(0, 1000))
def test_any_request_overtakes_a_fixed_priority_after_bounded_waiting(low: Waiting, gap: int, arrival: float) -> None:
    """A request `gap` priority levels below a newcomer is decided first once it has waited
    (gap + 1) aging periods longer."""
    high = Waiting(low.priority + gap, arrival, None, low.mem_mb, low.vcpus)
    old = Waiting(low.priority, arrival - (gap + 1) * AGING, None, low.mem_mb, low.vcpus)
    assert decision_order([high, old], now=arrival, aging_s=AGING) == [1, 0]
