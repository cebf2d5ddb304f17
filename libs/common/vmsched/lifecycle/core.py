"""A schedule request from arrival to its decision.

validate -> take the cluster lock -> load the cluster's policy -> read pending + state -> place
(filter-worker, or filter-workers and weighers per VM; those having the policy's units,
vmsched.lifecycle.routes) -> record pending under the fencing token ->
store the decision -> publish it as event `decision.<cluster>` -> release -> the decision.

* Idempotent: a decision is stored under its request id with a fingerprint of the request; the same
  request again gets the same decision, a different one under the same id is refused
  (lifecycle.replay). Events: one per stored decision (lifecycle.events).
* No host but pending memory somewhere: release the lock, wait (bounded) for pending to change,
  retry once (as oVirt's scheduler does with pending resources).
* A request whose deadline passed is not placed.
* Errors that belong to the request (unknown cluster, unknown unit, invalid property, lock timeout)
  become a decision with status `error`, never a crash or a hang. They are not stored: the same
  request may succeed once the cause is fixed.
"""

from __future__ import annotations

import time
from typing import Protocol

import redis.asyncio as aioredis

from vmsched.bus import Bus
from vmsched.contracts import ScheduleDecision, ScheduleRequest
from vmsched.errors import LockTimeout, RemoteError, VmschedError
from vmsched.lifecycle.commit import Commit
from vmsched.lifecycle.decisions import error_decision, expired, expired_decision
from vmsched.lifecycle.events import Events
from vmsched.lifecycle.groups import Groups
from vmsched.lifecycle.lookups import Lookups
from vmsched.lifecycle.placing import Placing
from vmsched.lifecycle.replay import Stored, same_request
from vmsched.lifecycle.routes import UnitRoutes
from vmsched.lifecycle.timing import Stages, StageTimer
from vmsched.lifecycle.turns import Turn
from vmsched.logging import get_logger
from vmsched.scheduling.policy import Policy
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, PendingStore, StateCache
from vmsched.store.catalogues import UnitCatalogues
from vmsched.store.decisions import StoredDecision, request_fingerprint
from vmsched.store.generations import Recover
from vmsched.store.group_reads import GroupReads
from vmsched.store.group_writes import GroupWrites
from vmsched.tracing import current_span, span

# Under the selector's name: the selector is the service whose work these lines report.
log = get_logger("vmsched.selector")


class PolicySource(Protocol):
    async def for_cluster(self, cluster_id: str) -> Policy:
        """The cluster's policy (UnknownCluster, or another VmschedError, if there is none)."""
        ...


class Lifecycle:
    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        *,
        state: StateCache,
        policies: PolicySource,
        timer: StageTimer,
        locks: ClusterLock,
        pending: PendingStore,
        decisions: DecisionStore,
        reads: GroupReads,
        writes: GroupWrites,
        routes: UnitRoutes | None = None,
    ) -> None:
        self.settings = settings
        self.policies = policies
        self.timer = timer
        self.locks = locks
        self.pending = pending
        self.decisions = decisions
        # The arrival reads of stored decisions, coalesced per cluster under load.
        self.lookups = Lookups(decisions)
        # A claim on re-publishing lasts about two lock leases: far longer than a publish and its
        # marking take, and a replay finding a dead claimant's claim waits for no more than that.
        self.events = Events(bus, decisions, timer, claim_s=2 * settings.lock_lease_s)
        self.commit = Commit(writes, self.events, timer, settings.decision_ttl_s)
        self.groups = Groups(
            settings,
            locks=locks,
            pending=pending,
            decisions=decisions,
            reads=reads,
            state=state,
            events=self.events,
            placing=Placing(bus, self.events, timer, settings, routes),
            commit=self.commit,
            timer=timer,
        )

    @classmethod
    def open(
        cls,
        bus: Bus,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        state: StateCache,
        policies: PolicySource,
        timer: StageTimer,
        recover: Recover | None = None,
    ) -> Lifecycle:
        """The lifecycle over the cluster locks, pending records and decisions in `redis`; `recover`
        starts a new generation when Redis forgot a cluster (vmsched.recovery)."""
        decisions = DecisionStore(redis, settings)
        pending = PendingStore(redis, settings)
        return cls(
            bus,
            settings,
            state=state,
            policies=policies,
            timer=timer,
            locks=ClusterLock(redis, settings, recover=recover),
            pending=pending,
            decisions=decisions,
            # Pending, stored records and the state cache's catch-up in one round trip per group.
            reads=GroupReads(redis, pending, decisions, state),
            writes=GroupWrites(redis, settings, decisions),
            # Each policy's worker calls go to workers that have its units (plugins may differ).
            routes=UnitRoutes(UnitCatalogues(redis, settings)),
        )

    async def decide(self, req: ScheduleRequest) -> ScheduleDecision:
        """The decision on `req`: the stored one for a request id already decided, else a new one."""
        attributes = {"vmsched.request_id": str(req.request_id), "vmsched.cluster": req.cluster_id}
        with span("vmsched.decide", attributes) as decide_span:
            decision = await self._decide(req)
            if decide_span is not None:
                decide_span.set_attribute("vmsched.status", decision.status.value)
            return decision

    async def _decide(self, req: ScheduleRequest) -> ScheduleDecision:
        started = time.perf_counter()
        stages: Stages = {}
        fingerprint = request_fingerprint(req)
        found = await self.lookups.record(req.cluster_id, req.request_id)
        if found is not None:
            return await self._replay(req, found, fingerprint, stages)
        policy_name: str | None = None
        outcome: ScheduleDecision | Stored
        try:
            policy = await self.policies.for_cluster(req.cluster_id)
            policy_name = policy.name
            outcome = await self._schedule(req, policy, started, fingerprint, stages)
        except VmschedError as exc:
            # A worker's refusal carries the worker's own code (unknown_policy_unit, ...), which is
            # what the engine can act on, not the bus's "remote_error".
            code = exc.remote_code if isinstance(exc, RemoteError) else exc.code
            log.warning("request failed", code=code, error=str(exc))
            outcome = error_decision(req, started, code, str(exc), policy=policy_name)
        if isinstance(outcome, ScheduleDecision):
            # Not stored (an error, an expired request): published each time one is made.
            await self.events.publish(outcome, stages)
            self.timer.decided(outcome, stages, time.perf_counter() - started)
            return outcome
        if outcome.ours:
            self.timer.decided(outcome.record.decision, stages, time.perf_counter() - started)
            return outcome.record.decision
        # Another handling stored a decision for this request id while this one waited for the lock.
        return same_request(req, outcome.record, fingerprint)

    async def _replay(
        self, req: ScheduleRequest, found: StoredDecision, fingerprint: str, stages: Stages
    ) -> ScheduleDecision:
        """The answer to a request id that already has a stored decision."""
        decision = same_request(req, found, fingerprint)
        if found.published:
            return decision
        # Its event is not confirmed: the selector that stored it is publishing it under the
        # cluster's lock right now, or died first. Under the lock, the record tells which.
        try:
            async with self.locks.hold(decision.cluster_id):
                await self.events.publish_unconfirmed(req.cluster_id, req.request_id, stages)
        except LockTimeout:
            # Others held the lock for the whole acquire timeout: the storer finished (or died)
            # long ago, so publishing without the lock cannot race it.
            await self.events.publish_unconfirmed(req.cluster_id, req.request_id, stages)
        return decision

    async def _schedule(
        self, req: ScheduleRequest, policy: Policy, started: float, fingerprint: str, stages: Stages
    ) -> ScheduleDecision | Stored:
        retried = False
        for attempt in (0, 1):
            if expired(req):
                return expired_decision(req, started, policy.name)
            turn = Turn(req, policy, fingerprint, started, retried, attempt == 0, stages, trace=current_span())
            outcome = await self.groups.take_turn(turn)
            if not isinstance(outcome, int):
                return outcome
            # No host fits yet, but pending resources may free some: wait outside the lock, retry once.
            retried = True
            await self.pending.wait_for_change(req.cluster_id, outcome, self.settings.pending_wait_s)
        raise AssertionError("unreachable: the second attempt never asks to wait")


__all__ = ["Lifecycle", "PolicySource"]
