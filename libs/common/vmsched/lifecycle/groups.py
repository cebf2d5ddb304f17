"""Group commit: the attempts waiting for one cluster are decided in groups under one lock acquisition.

One runner per cluster takes the queued attempts, up to VMSCHED_GROUP_MAX at a time, in decision
order (lifecycle.queueing), and decides them back to back under one acquisition of the cluster's
lock: each sees the earlier ones of its group as pending, exactly as if it had come one at a time,
and their pending records and decisions are written together, fenced (lifecycle.commit). Under load
this turns a lock round trip, a state read and a pending write per request into one per group.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from vmsched.contracts import RequestKind
from vmsched.errors import DecisionLost, UnknownCluster
from vmsched.lifecycle.commit import Commit
from vmsched.lifecycle.decisions import expired, expired_decision
from vmsched.lifecycle.events import Events
from vmsched.lifecycle.placing import Placing
from vmsched.lifecycle.timing import StageTimer, lap_all
from vmsched.lifecycle.turns import Outcome, Turn, TurnResult, Verdict, fail, one_group, settle
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, PendingStore, StateCache
from vmsched.store.group_reads import GroupReads
from vmsched.tracing import group_span, link_members


class Groups:
    def __init__(
        self,
        settings: Settings,
        *,
        locks: ClusterLock,
        pending: PendingStore,
        decisions: DecisionStore,
        reads: GroupReads,
        state: StateCache,
        events: Events,
        placing: Placing,
        commit: Commit,
        timer: StageTimer,
    ) -> None:
        self.settings = settings
        self.locks = locks
        self.pending = pending
        self.decisions = decisions
        self.reads = reads
        self.state = state
        self.events = events
        self.placing = placing
        self.commit = commit
        self.timer = timer
        self._queues: dict[str, deque[Turn]] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}

    async def take_turn(self, turn: Turn) -> TurnResult:
        """Queue this request's attempt for its cluster and wait for its outcome."""
        cluster = turn.req.cluster_id
        queue = self._queues.setdefault(cluster, deque())
        queue.append(turn)
        if turn.waiting.deadline is not None:
            _expire_when_due(queue, turn, turn.waiting.deadline)
        if cluster not in self._runners:
            self._runners[cluster] = asyncio.create_task(self._run_turns(cluster), name=f"turns-{cluster}")
        return await turn.done

    async def _run_turns(self, cluster: str) -> None:
        queue = self._queues[cluster]
        try:
            while queue:
                await self._run_group(cluster, queue)
        finally:
            del self._runners[cluster]
            if not queue:
                del self._queues[cluster]

    async def _run_group(self, cluster: str, queue: deque[Turn]) -> None:
        """Take the lock, then every attempt queued by then (up to the group size): the requests
        that arrived while the previous holder worked are one group."""
        # Traced as a child of the request that waited longest (its lock wait, reads, `place` call
        # and commit are in its trace), linked to every request of the group (vmsched.tracing).
        with group_span("vmsched.group", queue[0].trace, {"vmsched.cluster": cluster}) as traced:
            await self._run_traced_group(cluster, queue, traced)

    async def _run_traced_group(self, cluster: str, queue: deque[Turn], traced: Any) -> None:
        wait_from = time.perf_counter()
        group: list[Turn] = []
        again: list[Turn] = []
        try:
            async with self.locks.hold(cluster) as lease:
                self.timer.lock_waited(time.perf_counter() - wait_from)
                group, again = one_group(queue, self.settings.group_max, self.settings.priority_aging_s)
                if traced is not None:
                    traced.set_attribute("vmsched.group_size", len(group))
                    link_members(traced, [turn.trace for turn in group])
                lap_all(self.timer, [turn.stages for turn in group], "lock_wait", wait_from)
                if lease.replay_guard and group:
                    group = await self._without_lost_replays(cluster, group)
                if group:
                    await self._decide_group(cluster, group, lease.token)
                # The same request id sent again while its first copy was in this group: now
                # decided and stored, it is a replay; otherwise it goes round again.
                for turn in again:
                    found = await self.events.decided_meanwhile(turn.req, turn.fingerprint, turn.stages)
                    if found is None:
                        queue.appendleft(turn)
                    else:
                        settle(turn, found)
        except Exception as exc:  # the lock, Redis or a worker failed: every undecided turn hears why
            if not group:  # the lock was never taken: the turns waiting for it hear why
                group = [queue.popleft() for _ in range(min(len(queue), self.settings.group_max))]
            for turn in [*group, *again]:
                fail(turn, exc)

    async def _without_lost_replays(self, cluster: str, group: list[Turn]) -> list[Turn]:
        """Not long after Redis forgot the cluster, a request id without a stored decision may have
        been decided before the loss. A `run` request whose VM the engine reports on a host already
        is then refused (DecisionLost) instead of placed a second time; the rest go on."""
        records = await self.decisions.records(cluster, [turn.req.request_id for turn in group])
        fresh = [t for t, r in zip(group, records, strict=True) if r is None and t.req.kind is RequestKind.RUN]
        placed = await self.state.placed_vms(cluster, sorted({vm.vm_id for t in fresh for vm in t.req.vms}))
        if not placed:
            return group
        checked = {id(t) for t in fresh}
        kept: list[Turn] = []
        for turn in group:
            vms = turn.req.vms if id(turn) in checked else []
            already = [placed[vm.vm_id] for vm in vms if vm.vm_id in placed]
            if not already:
                kept.append(turn)
                continue
            where = ", ".join(f"{vm.vm_id} on {vm.host_id} ({vm.status})" for vm in already)
            fail(
                turn,
                DecisionLost(
                    f"request {turn.req.request_id} has no stored decision and Redis lost the decisions made "
                    f"before a failure not long ago, while the engine reports {where}: not placed a second "
                    "time; send a new request id to place it anyway",
                    location="request_id",
                ),
            )
        return kept

    async def _decide_group(self, cluster: str, group: list[Turn], token: int) -> None:
        since = time.perf_counter()
        outcomes: list[Outcome]
        if self.settings.place_in_worker:
            # Pending and the state version read together, whether any request of the group was
            # decided while it waited, and (placing here) the state cache's catch-up: one round trip.
            read = await self.reads.read(
                cluster, [turn.req.request_id for turn in group], catch_up=self.settings.place_in_selector
            )
            version = read.state_version
            if version is None:
                raise UnknownCluster(f"no state reported for cluster {cluster}", location="cluster_id")
            table = None
            if self.settings.place_in_selector:
                # The state at least as new as the pending read: the catch-up above got there unless
                # the tracker wrote in between, or nothing was cached yet (then the usual read).
                version, table = await self.state.table(cluster, min_version=version)
            lap_all(self.timer, [turn.stages for turn in group], "read_state", since)
            outcomes = await self.placing.in_workers(
                cluster, group, token, read.pending_version, read.pending, version, read.records, table
            )
        else:
            # Pending first, then state (see state_tracker): a VM is never counted nowhere.
            pending_version, pending = await self.pending.snapshot(cluster)
            version, table = await self.state.table(cluster)
            lap_all(self.timer, [turn.stages for turn in group], "read_state", since)
            outcomes = await self.placing.here(group, token, pending_version, pending, version, table)
        await self.commit(cluster, token, _still_placed(outcomes))


def _expire_when_due(queue: deque[Turn], turn: Turn, deadline: float) -> None:
    """Answer `turn` expired the moment its deadline passes while it still waits in `queue`: under a
    burst, a request that can no longer be placed in time hears so then, not when its turn comes
    (it leaves the queue, so it takes no place in a group either). Once taken into a group, the
    group's own check applies (_still_placed)."""

    def expire() -> None:
        for i, waiting in enumerate(queue):
            if waiting is turn:
                del queue[i]
                settle(turn, expired_decision(turn.req, turn.started, turn.policy.name))
                return

    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), expire)
    turn.done.add_done_callback(lambda _: timer.cancel())


def _still_placed(outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes to commit: a request whose deadline passed while its group was decided is not
    placed (the later ones saw its VMs as pending, which only made them more careful), nor is one
    whose caller gave up waiting."""
    kept: list[Outcome] = []
    for outcome in outcomes:
        turn = outcome.turn
        if isinstance(outcome, Verdict) and outcome.placed:
            if expired(turn.req):
                settle(turn, expired_decision(turn.req, turn.started, turn.policy.name))
            if turn.done.done():
                continue
        kept.append(outcome)
    return kept


__all__ = ["Groups"]
