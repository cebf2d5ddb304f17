"""selector: serves schedule requests end to end (RPC `schedule`).

validate -> take the cluster lock -> load the cluster's policy -> read pending + state -> filter
(filter-worker) -> weigh (weigher) -> select -> record pending under the fencing token -> store the
decision -> publish it as event `decision.<cluster>` -> release -> reply.

* Idempotent: a decision is stored under its request id with a fingerprint of the request; the
  same request again gets the same decision. The same id with a different request (another
  cluster, VM, batch, ...; a new deadline does not count) is refused with InvalidRequest.
* Events (see store/decisions.py): one per stored decision, published under the lock by the
  selector that stored it and then marked published. A replay that finds a stored decision not
  marked published (its selector died in between) publishes and marks it; one that finds it marked
  does not publish again. Publishing under the lock is what keeps a concurrent duplicate from
  publishing too: it reads the mark only after the storer has released the lock. A crash between
  publishing and marking repeats the event once (events carry the request id). Decisions that are
  not stored (errors, expired requests) are published each time one is made.
* No host but pending memory somewhere: release the lock, wait (bounded) for pending to change,
  retry once (as oVirt's scheduler does with pending resources).
* A request whose deadline passed is not placed.
* Errors that belong to the request (unknown cluster, unknown unit, invalid property, lock timeout)
  become a decision with status `error`, never a crash or a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeAlias
from uuid import UUID, uuid4

import structlog

from vmsched import constants as c
from vmsched.contracts import (
    DecisionStatus,
    ErrorInfo,
    Explanation,
    FilterReply,
    FilterRequest,
    PendingEntry,
    PlaceItem,
    Placement,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
    ScheduleDecision,
    ScheduleRequest,
    ScoreTable,
    VmSpec,
    WeighReply,
    WeighRequest,
)
from vmsched.errors import InvalidRequest, LockTimeout, RemoteError, UnknownCluster, VmschedError
from vmsched.logging import get_logger
from vmsched.metrics import DECISION_SECONDS, DECISIONS, LOCK_WAIT_SECONDS, cluster_label
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts, unweighed
from vmsched.scheduling.placement import Placed, Screening, Unplaceable, WaitForPending, pending_entry, place, top_hosts
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.queueing import Waiting, decision_order
from vmsched.store import ClusterLock, DecisionStore, PendingStore
from vmsched.store.decisions import StoredDecision, request_fingerprint

log = get_logger("vmsched.selector")

#: Milliseconds spent per stage of the current request (logged with its decision).
_STAGES: ContextVar[dict[str, float]] = ContextVar("selector_stages")


def _lap(stage: str, since: float) -> None:
    """Add the time since `since` to `stage` of the current request."""
    stages = _STAGES.get(None)
    if stages is not None:
        _lap_into(stages, stage, since)


@contextmanager
def _stage(stage: str) -> Iterator[None]:
    """Time the body as `stage` of the current request (a filter or weigh call)."""
    since = time.perf_counter()
    try:
        yield
    finally:
        _lap(stage, since)


def _lap_into(stages: dict[str, float], stage: str, since: float) -> None:
    """Add the time since `since` to `stage` of one request's timings (a group's shared steps are
    counted for each request of the group)."""
    stages[stage] = round(stages.get(stage, 0.0) + (time.perf_counter() - since) * 1000, 3)


#: What a request's turn under the lock ends in: a decision not stored (expired), a stored one, or
#: the pending version to wait on before its retry.
_TurnResult: TypeAlias = "ScheduleDecision | _Stored | int"


@dataclass
class _Turn:
    """One attempt of one request, queued for its cluster's next group."""

    req: ScheduleRequest
    policy: Policy
    fingerprint: str
    started: float
    retried: bool
    may_wait: bool
    #: The request's stage timings (the handler's, filled in by the group runner).
    stages: dict[str, float]
    #: What the decision order looks at (priority, time queued, deadline, size).
    waiting: Waiting = field(init=False)
    done: asyncio.Future[_TurnResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

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


def _settle(turn: _Turn, result: _TurnResult) -> None:
    """Hand a turn its outcome, unless its caller gave up waiting (the work stands: a stored
    decision is there for the request id's replay)."""
    if not turn.done.done():
        turn.done.set_result(result)


def _fail(turn: _Turn, exc: BaseException) -> None:
    """Hand a turn the failure that ended it, unless its caller gave up waiting."""
    if not turn.done.done():
        turn.done.set_exception(exc)


def _one_group(queue: deque[_Turn], size: int, aging_s: float) -> tuple[list[_Turn], list[_Turn]]:
    """The next group: up to `size` waiting attempts in decision order (scheduling.queueing:
    priority with aging, deadline, size, arrival), each request id once. Later copies of a request
    id already in the group come back separately (answered once the first is decided); the rest
    stay queued in arrival order."""
    live = [t for t in queue if not t.done.done()]  # else its caller gave up
    queue.clear()
    order = decision_order([t.waiting for t in live], time.monotonic(), aging_s)
    group: list[_Turn] = []
    again: list[_Turn] = []
    ids: set[UUID] = set()
    taken: set[int] = set()
    for i in order:
        turn = live[i]
        if turn.req.request_id in ids:
            again.append(turn)
        elif len(group) < size:
            ids.add(turn.req.request_id)
            group.append(turn)
        else:
            continue
        taken.add(i)
    queue.extend(t for i, t in enumerate(live) if i not in taken)
    return group, again


def _runs(turns: list[_Turn]) -> list[list[_Turn]]:
    """The turns cut where the policy changes (it can, between requests that waited for the lock):
    one `place` call runs one policy."""
    runs: list[list[_Turn]] = []
    for turn in turns:
        if runs and runs[-1][0].policy == turn.policy:
            runs[-1].append(turn)
        else:
            runs.append([turn])
    return runs


@dataclass(frozen=True)
class _Stored:
    """A stored decision whose event is settled; `ours` if this request's handling stored it."""

    record: StoredDecision
    ours: bool


class Selector:
    def __init__(self, rt: Runtime, policies: PolicyCache | None = None) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.policies = policies or PolicyCache(rt)
        self.locks = ClusterLock(rt.redis, rt.settings)
        self.pending = PendingStore(rt.redis, rt.settings)
        self.decisions = DecisionStore(rt.redis, rt.settings)
        self._queues: dict[str, deque[_Turn]] = {}
        self._runners: dict[str, asyncio.Task[None]] = {}

    async def handle(self, req: ScheduleRequest) -> ScheduleDecision:
        started = time.perf_counter()
        structlog.contextvars.bind_contextvars(request_id=str(req.request_id), cluster=req.cluster_id)
        _STAGES.set({})
        try:
            decision = await self._decide(req, started)
        finally:
            structlog.contextvars.unbind_contextvars("request_id", "cluster")
        return decision

    async def _decide(self, req: ScheduleRequest, started: float) -> ScheduleDecision:
        fingerprint = request_fingerprint(req)
        found = await self.decisions.record(req.request_id)
        if found is not None:
            return await self._replay(req, found, fingerprint)
        policy_name: str | None = None
        try:
            policy = await self.policies.for_cluster(req.cluster_id)
            policy_name = policy.name
            outcome = await self._schedule(req, policy, started, fingerprint)
        except VmschedError as exc:
            # A worker's refusal carries the worker's own code (unknown_policy_unit, ...), which is
            # what the engine can act on, not the bus's "remote_error".
            code = exc.remote_code if isinstance(exc, RemoteError) else exc.code
            log.warning("request failed", code=code, error=str(exc))
            outcome = self._decision(
                req,
                started,
                DecisionStatus.ERROR,
                Explanation(summary=f"not scheduled: {exc}"[:2000], candidates=0),
                policy=policy_name,
                error=ErrorInfo(code=code, message=str(exc)[:2000]),
            )
            # Errors are not stored: the same request may succeed once the cause is fixed.
        if isinstance(outcome, ScheduleDecision):
            # Not stored (an error, an expired request): published each time one is made.
            await self._publish(outcome)
            self._done(outcome, started)
            return outcome
        if outcome.ours:
            self._done(outcome.record.decision, started)
            return outcome.record.decision
        # Another selector stored a decision for this request id while this one waited for the lock.
        return self._same_request(req, outcome.record, fingerprint)

    async def _replay(self, req: ScheduleRequest, found: StoredDecision, fingerprint: str) -> ScheduleDecision:
        """The answer to a request id that already has a stored decision."""
        decision = self._same_request(req, found, fingerprint)
        if found.published:
            return decision
        # Its event is not confirmed: the selector that stored it is publishing it under the
        # cluster's lock right now, or died first. Under the lock, the record tells which.
        try:
            async with self.locks.hold(decision.cluster_id):
                await self._publish_unconfirmed(req.request_id)
        except LockTimeout:
            # Others held the lock for the whole acquire timeout: the storer finished (or died)
            # long ago, so publishing without the lock cannot race it.
            await self._publish_unconfirmed(req.request_id)
        return decision

    def _same_request(self, req: ScheduleRequest, found: StoredDecision, fingerprint: str) -> ScheduleDecision:
        """The stored decision, if it was made for this same request; InvalidRequest if the request
        id was used for a different one (answering with another request's decision would be wrong)."""
        if not found.matches(fingerprint):
            d = found.decision
            log.warning("request id reused for a different request", first_cluster=d.cluster_id, first_vm=d.vm_id)
            raise InvalidRequest(
                f"request id {req.request_id} was already used for a different request "
                f"(cluster {d.cluster_id}, vm {d.vm_id}); send a new request id",
                location="request_id",
            )
        return found.decision

    async def _publish_unconfirmed(self, request_id: UUID) -> None:
        """Publish the stored decision if it is still not marked published."""
        current = await self.decisions.record(request_id)
        if current is not None and not current.published:
            log.info("publishing a stored decision whose event was not confirmed")
            await self._publish_stored(current.decision)

    async def _publish_stored(self, decision: ScheduleDecision) -> None:
        await self._publish(decision)
        await self.decisions.mark_published(decision.request_id)

    async def _publish(self, decision: ScheduleDecision) -> None:
        published = time.perf_counter()
        await self.rt.bus.publish(c.decision_key(decision.cluster_id), decision)
        _lap("publish", published)

    def _done(self, decision: ScheduleDecision, started: float) -> None:
        cluster = cluster_label(decision.cluster_id)
        DECISIONS.labels(cluster, decision.status.value).inc()
        DECISION_SECONDS.labels(cluster).observe(time.perf_counter() - started)
        log.info(
            "decision",
            status=decision.status.value,
            host=decision.host_id,
            summary=decision.explanation.summary,
            elapsed_ms=round(decision.elapsed_ms, 2),
            stages_ms=_STAGES.get(None),
        )

    async def _schedule(
        self, req: ScheduleRequest, policy: Policy, started: float, fingerprint: str
    ) -> ScheduleDecision | _Stored:
        retried = False
        for attempt in (0, 1):
            if self._expired(req):
                return self._expired_decision(req, started, policy)
            turn = _Turn(req, policy, fingerprint, started, retried, attempt == 0, _STAGES.get({}))
            outcome = await self._take_turn(turn)
            if not isinstance(outcome, int):
                return outcome
            # No host fits yet, but pending resources may free some: wait outside the lock, retry once.
            retried = True
            await self.pending.wait_for_change(req.cluster_id, outcome, self.settings.pending_wait_s)
        raise AssertionError("unreachable: the second attempt never asks to wait")

    # ------------------------------------------------------------------ group commit
    async def _take_turn(self, turn: _Turn) -> _TurnResult:
        """Queue this request's attempt for its cluster and wait for its outcome.

        One runner per cluster takes the queued attempts in arrival order, up to
        VMSCHED_GROUP_MAX at a time, and decides them back to back under one lock acquisition: each
        sees the earlier ones of its group as pending, exactly as if it had come one at a time, and
        their pending records are written together (fenced). Under load this turns a lock round
        trip, a state read and a pending write per request into one per group.
        """
        cluster = turn.req.cluster_id
        self._queues.setdefault(cluster, deque()).append(turn)
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

    async def _run_group(self, cluster: str, queue: deque[_Turn]) -> None:
        """Take the lock, then every attempt queued by then (up to the group size): the requests
        that arrived while the previous holder worked are one group."""
        wait_from = time.perf_counter()
        group: list[_Turn] = []
        again: list[_Turn] = []
        try:
            async with self.locks.hold(cluster) as lease:
                LOCK_WAIT_SECONDS.observe(time.perf_counter() - wait_from)
                group, again = _one_group(queue, self.settings.group_max, self.settings.priority_aging_s)
                for turn in group:
                    _lap_into(turn.stages, "lock_wait", wait_from)
                if group:
                    await self._decide_group(cluster, group, lease.token)
                # The same request id sent again while its first copy was in this group: now
                # decided and stored, it is a replay; otherwise it goes round again.
                for turn in again:
                    found = await self._decided_meanwhile(turn.req, turn.fingerprint)
                    if found is None:
                        queue.appendleft(turn)
                    else:
                        _settle(turn, found)
        except Exception as exc:  # the lock, Redis or a worker failed: every undecided turn hears why
            if not group:  # the lock was never taken: the turns waiting for it hear why
                group = [queue.popleft() for _ in range(min(len(queue), self.settings.group_max))]
            for turn in [*group, *again]:
                _fail(turn, exc)

    async def _decide_group(self, cluster: str, group: list[_Turn], token: int) -> None:
        t = time.perf_counter()
        if self.settings.place_in_worker:
            # Pending and the state version in one read, and whether any request of the group was
            # decided while it waited, side by side.
            (pending_version, pending, version), records = await asyncio.gather(
                self.pending.snapshot_with_state(cluster),
                self.decisions.records([turn.req.request_id for turn in group]),
            )
            if version is None:
                raise UnknownCluster(f"no state reported for cluster {cluster}", location="cluster_id")
            for turn in group:
                _lap_into(turn.stages, "read_state", t)
            placed = await self._place_in_workers(cluster, group, token, pending_version, pending, version, records)
        else:
            # Pending first, then state (see state_tracker): a VM is never counted nowhere.
            pending_version, pending = await self.pending.snapshot(cluster)
            version, table = await self.rt.state.table(cluster)
            for turn in group:
                _lap_into(turn.stages, "read_state", t)
            placed = await self._place_here(group, token, pending_version, pending, version, table)
        # A request whose deadline passed while its group was decided is not placed; the later
        # ones saw its VMs as pending, which only made them more careful.
        for turn, _, _ in placed:
            if self._expired(turn.req):
                _settle(turn, self._expired_decision(turn.req, turn.started, turn.policy))
        placed = [p for p in placed if not p[0].done.done()]
        if placed:
            await self._commit_group(cluster, placed, token)

    async def _place_here(
        self,
        group: list[_Turn],
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        table: HostTable,
    ) -> list[tuple[_Turn, Placed, int]]:
        """Place the group's requests one by one in this process, calling the filter-workers and the
        weighers for each VM (VMSCHED_PLACE_IN_WORKER=false)."""
        placed: list[tuple[_Turn, Placed, int]] = []
        seen = list(pending)  # the cluster's pending, then what the group placed so far
        for turn in group:
            _STAGES.set(turn.stages)
            try:
                result = await self._turn(turn, token, pending_version, seen, version, table)
            except VmschedError as exc:
                # This request's own failure (a worker that died under its call, a refused request):
                # it hears why; the rest of the group goes on.
                _fail(turn, exc)
                continue
            if isinstance(result, Placed):
                placed.append((turn, result, version))
                seen.extend(result.pending)
            else:
                _settle(turn, result)
        return placed

    async def _place_in_workers(
        self,
        cluster: str,
        group: list[_Turn],
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        records: list[StoredDecision | None],
    ) -> list[tuple[_Turn, Placed, int]]:
        """Send the group to a filter-worker in one `place` call (one per run of requests under the
        same policy, in case the policy changed while they waited): it filters, weighs and selects
        each request in order, each seeing the earlier ones as pending. `records`: what is stored
        for each request id of the group."""
        live: list[_Turn] = []
        for turn, record in zip(group, records, strict=True):
            if record is not None:
                _settle(turn, await self._stored_meanwhile(record, turn.fingerprint))
            elif self._expired(turn.req):
                _settle(turn, self._expired_decision(turn.req, turn.started, turn.policy))
            else:
                live.append(turn)
        placed: list[tuple[_Turn, Placed, int]] = []
        seen = list(pending)
        for run in _runs(live):
            t = time.perf_counter()
            try:
                reply = await self._place_call(cluster, run, version, seen)
            except VmschedError as exc:  # no worker answered, or it failed on the whole group
                for turn in run:
                    _fail(turn, exc)
                continue
            for turn in run:
                _lap_into(turn.stages, "place", t)
            for turn, result in zip(run, reply.results, strict=True):
                outcome = await self._outcome(turn, result, token, pending_version, reply.state_version)
                if isinstance(outcome, Placed):
                    placed.append((turn, outcome, reply.state_version))
                    seen.extend(outcome.pending)
        return placed

    async def _place_call(
        self, cluster: str, run: list[_Turn], version: int, pending: list[PendingEntry]
    ) -> PlaceReply:
        policy = run[0].policy
        may_wait = self.settings.pending_wait_s > 0
        reply = await self.rt.bus.call(
            c.RPC_PLACE,
            PlaceRequest(
                request_id=uuid4(),
                cluster_id=cluster,
                state_version=version,
                items=[PlaceItem(request=t.req, may_wait=t.may_wait and may_wait) for t in run],
                filters=policy.filter_calls(),
                weights=policy.weight_calls(),
                selector=policy.selector,
                pending=pending,
                now=time.time(),
                pending_ttl_s=self.settings.pending_ttl_s,
            ),
            PlaceReply,
        )
        if [r.request_id for r in reply.results] != [t.req.request_id for t in run]:
            raise InvalidRequest("a filter-worker answered a place call with results for other requests")
        return reply

    async def _outcome(
        self, turn: _Turn, result: PlaceResult, token: int, pending_version: int, version: int
    ) -> Placed | None:
        """Settle a request from its `place` result; its placements to commit when it was placed."""
        if result.outcome is PlaceOutcome.PLACED and result.explanation is not None:
            expires = time.time() + self.settings.pending_ttl_s
            vms = {vm.vm_id: vm for vm in turn.req.vms}
            entries = [
                pending_entry(
                    vms[p.vm_id], p.host_id, request_id=turn.req.request_id, fencing_token=token, expires_at=expires
                )
                for p in result.placements
            ]
            return Placed(result.placements, entries, result.explanation)
        if result.outcome is PlaceOutcome.UNPLACEABLE and result.explanation is not None:
            decision = self._decision(
                turn.req,
                turn.started,
                DecisionStatus.UNPLACEABLE,
                result.explanation,
                policy=turn.policy.name,
                version=version,
                retried=turn.retried,
            )
            try:
                _settle(turn, await self._store(turn.fingerprint, token, decision))
            except VmschedError as exc:
                _fail(turn, exc)
        elif result.outcome is PlaceOutcome.WAIT:
            _settle(turn, pending_version)
        else:
            error = result.error or ErrorInfo(code="internal", message="the filter-worker gave no result")
            _fail(turn, RemoteError(error.code, error.message))
        return None

    async def _commit_group(self, cluster: str, placed: list[tuple[_Turn, Placed, int]], token: int) -> None:
        """One fenced pending write for the group, one write storing its decisions, their events
        published side by side (confirms overlap), one write marking them published."""
        t = time.perf_counter()
        await self.pending.record(cluster, [e for _, p, _ in placed for e in p.pending], token)
        turns = [turn for turn, _, _ in placed]
        for turn in turns:
            _lap_into(turn.stages, "record_pending", t)
        decisions = [self._placed_decision(turn, p, version, token) for turn, p, version in placed]
        stored = await self.decisions.put_many(
            [(d, turn.fingerprint) for d, turn in zip(decisions, turns, strict=True)],
            token=token,
            ttl_s=self.settings.decision_ttl_s,
        )
        # Exactly one event per stored decision: ours, or one stored before (a duplicate request)
        # whose event was never confirmed.
        events = [
            record.decision if created or (record.matches(turn.fingerprint) and not record.published) else None
            for turn, (created, record) in zip(turns, stored, strict=True)
        ]
        t = time.perf_counter()
        sent = await asyncio.gather(
            *(self.rt.bus.publish(c.decision_key(cluster), e) for e in events if e is not None),
            return_exceptions=True,
        )
        outcomes = iter(sent)
        failed: dict[int, BaseException] = {}
        for i, event in enumerate(events):
            if event is None:
                continue
            _lap_into(turns[i].stages, "publish", t)
            result = next(outcomes)
            if isinstance(result, BaseException):
                failed[i] = result
        await self.decisions.mark_published_many(
            [e.request_id for i, e in enumerate(events) if e is not None and i not in failed]
        )
        for i, (turn, (created, record)) in enumerate(zip(turns, stored, strict=True)):
            if i in failed:
                # Stored but its event not confirmed: a replay of the request id publishes it.
                _fail(turn, failed[i])
            else:
                _settle(turn, _Stored(record, ours=created))

    async def _turn(
        self,
        turn: _Turn,
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        table: HostTable,
    ) -> _TurnResult | Placed:
        """One request under the lock: a stored decision (its event published), a decision not to
        store (expired), the pending version to wait on before retrying, or its placements to commit.

        How the VMs are placed is vmsched.scheduling.placement.place, with filter and weigh steps
        that call the filter-workers and weighers.
        """
        req, policy = turn.req, turn.policy
        found = await self._decided_meanwhile(req, turn.fingerprint)
        if found is not None:
            return found
        if self._expired(req):
            return self._expired_decision(req, turn.started, policy)
        cands = candidate_hosts(table, req.whitelist, req.blacklist)
        ours = {vm.vm_id for vm in req.vms}

        async def filter_fn(vm: VmSpec, hosts: Sequence[str], seen: list[PendingEntry]) -> Screening:
            with _stage("filter"):
                reply = await self._filter(req, vm, policy, version, list(hosts), seen)
            return Screening(reply.survivors, reply.removed)

        async def weigh_fn(vm: VmSpec, hosts: Sequence[str], seen: list[PendingEntry]) -> ScoreTable:
            with _stage("weigh"):
                return await self._weigh(req, vm, policy, version, list(hosts), seen)

        def pending_for(vm: VmSpec, host_id: str) -> PendingEntry:
            expires = time.time() + self.settings.pending_ttl_s
            return pending_entry(vm, host_id, request_id=req.request_id, fencing_token=token, expires_at=expires)

        outcome = await place(
            req,
            policy.filter_names(),
            cands.ids,
            [e for e in pending if e.vm_id not in ours],
            filter_fn=filter_fn,
            weigh_fn=weigh_fn,
            pending_for=pending_for,
            may_wait=turn.may_wait and self.settings.pending_wait_s > 0,
        )
        if isinstance(outcome, WaitForPending):
            return pending_version
        if isinstance(outcome, Unplaceable):
            decision = self._decision(
                req,
                turn.started,
                DecisionStatus.UNPLACEABLE,
                outcome.explanation,
                policy=policy.name,
                version=version,
                retried=turn.retried,
            )
            return await self._store(turn.fingerprint, token, decision)
        return outcome

    def _placed_decision(self, turn: _Turn, outcome: Placed, version: int, token: int) -> ScheduleDecision:
        head = outcome.placements[0]
        return self._decision(
            turn.req,
            turn.started,
            DecisionStatus.PLACED,
            outcome.explanation,
            host=head.host_id,
            alternates=head.alternates,
            placements=outcome.placements,
            token=token,
            policy=turn.policy.name,
            version=version,
            retried=turn.retried,
        )

    async def _decided_meanwhile(self, req: ScheduleRequest, fingerprint: str) -> _Stored | None:
        """The decision another selector stored for this request while we waited for the lock."""
        found = await self.decisions.record(req.request_id)
        if found is None:
            return None
        return await self._stored_meanwhile(found, fingerprint)

    async def _stored_meanwhile(self, found: StoredDecision, fingerprint: str) -> _Stored:
        # Holding the lock now, the other selector has left it: an event still unconfirmed was
        # never published (it died between storing and publishing).
        if found.matches(fingerprint) and not found.published:
            await self._publish_stored(found.decision)
        return _Stored(found, ours=False)

    async def _filter(
        self,
        req: ScheduleRequest,
        vm: VmSpec,
        policy: Policy,
        version: int,
        candidates: list[str],
        pending: list[PendingEntry],
    ) -> FilterReply:
        return await self.rt.bus.call(
            c.RPC_FILTER,
            FilterRequest(
                request_id=req.request_id,
                cluster_id=req.cluster_id,
                state_version=version,
                vm=vm,
                candidates=candidates,
                filters=policy.filter_calls(),
                pending=pending,
                now=time.time(),
            ),
            FilterReply,
        )

    async def _weigh(
        self,
        req: ScheduleRequest,
        vm: VmSpec,
        policy: Policy,
        version: int,
        hosts: list[str],
        pending: list[PendingEntry],
    ) -> ScoreTable:
        calls = policy.weight_calls()
        if not calls:
            return unweighed(hosts, policy.selector, top=top_hosts(req))
        reply = await self.rt.bus.call(
            c.RPC_WEIGH,
            WeighRequest(
                request_id=req.request_id,
                cluster_id=req.cluster_id,
                state_version=version,
                vm=vm,
                hosts=hosts,
                weights=calls,
                selector=policy.selector,
                top=top_hosts(req),
                pending=pending,
                now=time.time(),
            ),
            WeighReply,
        )
        return reply.scores

    def _expired(self, req: ScheduleRequest) -> bool:
        return req.deadline is not None and datetime.now(UTC) >= req.deadline

    def _expired_decision(self, req: ScheduleRequest, started: float, policy: Policy) -> ScheduleDecision:
        return self._decision(
            req,
            started,
            DecisionStatus.EXPIRED,
            Explanation(summary="not placed: the request's deadline passed", candidates=0),
            policy=policy.name,
        )

    async def _store(self, fingerprint: str, token: int, decision: ScheduleDecision) -> _Stored:
        """Store the decision (fenced by the lock's token) and publish it, still under the lock."""
        created, record = await self.decisions.put(
            decision, fingerprint=fingerprint, token=token, ttl_s=self.settings.decision_ttl_s
        )
        if created:
            await self._publish_stored(decision)
            return _Stored(record, ours=True)
        if record.matches(fingerprint) and not record.published:
            await self._publish_stored(record.decision)
        return _Stored(record, ours=False)

    def _decision(
        self,
        req: ScheduleRequest,
        started: float,
        status: DecisionStatus,
        explanation: Explanation,
        *,
        policy: str | None,
        version: int = 0,
        host: str | None = None,
        alternates: list[str] | None = None,
        placements: list[Placement] | None = None,
        token: int = 0,
        retried: bool = False,
        error: ErrorInfo | None = None,
    ) -> ScheduleDecision:
        return ScheduleDecision(
            request_id=req.request_id,
            cluster_id=req.cluster_id,
            vm_id=req.vm.vm_id,
            status=status,
            host_id=host,
            alternates=alternates or [],
            placements=placements or [],
            policy=policy,
            state_version=version,
            fencing_token=token,
            explanation=explanation,
            error=error,
            retried=retried,
            decided_at=datetime.now(UTC),
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )


async def start(rt: Runtime) -> Selector:
    selector = Selector(rt)
    await selector.policies.subscribe()
    await rt.bus.serve(c.RPC_SCHEDULE, ScheduleRequest, selector.handle)
    return selector
