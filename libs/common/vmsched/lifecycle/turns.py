"""Turns and groups (pure, no I/O): one attempt of one request waiting for its cluster, how the
next group is taken from a cluster's queue, and what deciding a request of a group comes to.

A turn ends in a decision not stored (expired), a stored one (`Stored`), or the pending version
to wait on before its retry; or in the failure that ended it. Its caller may give up waiting
(its future is then done): the work stands, a stored decision is there for the request id's replay.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias
from uuid import UUID

from vmsched.contracts import Explanation, PendingEntry, Placement, ScheduleDecision, ScheduleRequest
from vmsched.lifecycle.queueing import Waiting, decision_order
from vmsched.lifecycle.replay import Stored
from vmsched.lifecycle.timing import Stages
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.policy import Policy

#: What a request's turn under the lock ends in: a decision not stored (expired), a stored one, or
#: the pending version to wait on before its retry.
TurnResult: TypeAlias = "ScheduleDecision | Stored | int"


@dataclass
class Turn:
    """One attempt of one request, queued for its cluster's next group."""

    req: ScheduleRequest
    policy: Policy
    fingerprint: str
    #: When the request's handling began (time.perf_counter).
    started: float
    retried: bool
    may_wait: bool
    #: The handling's stage timings (see lifecycle.timing).
    stages: Stages
    #: What the decision order looks at (priority, time queued, deadline, size).
    waiting: Waiting = field(init=False)
    done: asyncio.Future[TurnResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    #: The request's span (vmsched.decide) while tracing is on, else None: its group's span is a
    #: child of the first waiting one and linked to each (vmsched.tracing.group_span).
    trace: Any = None

    def __post_init__(self) -> None:
        now = time.monotonic()
        deadline = None
        if self.req.deadline is not None:
            deadline = now + (self.req.deadline - datetime.now(UTC)).total_seconds()
        costs = [vm_cost(v) for v in self.req.vms]
        self.waiting = Waiting(
            priority=self.req.priority,
            enqueued_at=now,
            deadline=deadline,
            mem_mb=sum(c.mem_mb for c in costs),
            vcpus=sum(c.vcpus for c in costs),
        )


@dataclass(frozen=True)
class Verdict:
    """What placing one request of a group found, to commit: placed (every VM has a placement and a
    pending record) or unplaceable (none: `explanation` says which VM fits nowhere)."""

    turn: Turn
    placements: list[Placement]
    #: One per placed VM, with the group's fencing token: recorded by the commit.
    pending: list[PendingEntry]
    explanation: Explanation
    #: The cluster state version it was decided at.
    version: int

    @property
    def placed(self) -> bool:
        return bool(self.placements)


@dataclass(frozen=True)
class Wait:
    """No host fits the request now, but pending memory may free one: it waits for the cluster's
    pending version to move past `pending_version`, then retries once."""

    turn: Turn
    pending_version: int


#: What deciding one request of a group comes to, for the group's commit.
Outcome: TypeAlias = Verdict | Wait


def settle(turn: Turn, result: TurnResult) -> None:
    """Hand a turn its outcome, unless its caller gave up waiting."""
    if not turn.done.done():
        turn.done.set_result(result)


def fail(turn: Turn, exc: BaseException) -> None:
    """Hand a turn the failure that ended it, unless its caller gave up waiting."""
    if not turn.done.done():
        turn.done.set_exception(exc)


#: The most VMs of one group (but a group always takes its first request, whatever its size): the
#: most one request carries (a batch of 1,000 with its first VM). A group is placed in one `place`
#: call under one lock hold, both bounded in time; three 1,000-VM batches in one group ran out of
#: both, where each in its own group is placed in time (and the next cluster's lock holder waits
#: for one batch, not three).
GROUP_MAX_VMS = 1001


def one_group(
    queue: deque[Turn], size: int, aging_s: float, max_vms: int = GROUP_MAX_VMS
) -> tuple[list[Turn], list[Turn]]:
    """The next group: up to `size` waiting attempts in decision order (lifecycle.queueing:
    priority with aging, deadline, size, arrival), each request id once, up to `max_vms` VMs in all
    (the first taken whatever its size; after the first that does not fit, none). Later copies of a
    request id already in the group come back separately (answered once the first is decided); the
    rest stay queued in arrival order. Attempts whose caller gave up are dropped."""
    live = [t for t in queue if not t.done.done()]
    queue.clear()
    order = decision_order([t.waiting for t in live], time.monotonic(), aging_s)
    group: list[Turn] = []
    again: list[Turn] = []
    ids: set[UUID] = set()
    taken: set[int] = set()
    vms = 0
    full = False
    for i in order:
        turn = live[i]
        count = 1 + len(turn.req.batch)
        if turn.req.request_id in ids:
            again.append(turn)
        elif not full and len(group) < size and (not group or vms + count <= max_vms):
            ids.add(turn.req.request_id)
            group.append(turn)
            vms += count
        else:
            full = True  # the rest wait for the next group, in decision order
            continue
        taken.add(i)
    queue.extend(t for i, t in enumerate(live) if i not in taken)
    return group, again


def runs(turns: list[Turn]) -> list[list[Turn]]:
    """The turns cut where the policy changes (it can, between requests that waited for the lock):
    one `place` call runs one policy."""
    out: list[list[Turn]] = []
    for turn in turns:
        if out and out[-1][0].policy == turn.policy:
            out[-1].append(turn)
        else:
            out.append([turn])
    return out


__all__ = ["GROUP_MAX_VMS", "Outcome", "Turn", "TurnResult", "Verdict", "Wait", "fail", "one_group", "runs", "settle"]
