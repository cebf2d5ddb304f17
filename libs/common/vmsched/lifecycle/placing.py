"""Placing a group's requests under the cluster's lock, one of two ways, into outcomes to commit.

* In a filter-worker (VMSCHED_PLACE_IN_WORKER, the default): one `place` call per run of requests
  under the same policy (it can change while they wait); the worker filters, weighs and selects
  each request in order, each seeing the earlier ones as pending, and returns the pending records
  of the ones it placed (stamped with the group's fencing token).
* Here: vmsched.scheduling.placement.place for each request in turn, with filter and weigh steps
  that call the filter-workers and weighers per VM.

Either way a request already decided meanwhile gets that decision, one whose deadline passed before
or while it was being placed is not placed (`expired`, nothing of it recorded), and one whose own
evaluation failed hears why while the rest of the group goes on. Placed and unplaceable requests
come back as a Verdict, waiting ones as a Wait: lifecycle.commit writes them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TypeVar

from vmsched import constants as c
from vmsched.bus import Bus
from vmsched.contracts import (
    ErrorInfo,
    PendingEntry,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
    ScheduleDecision,
    ScoreTable,
    VmSpec,
)
from vmsched.errors import NoConsumer, RemoteError, UnitsUnavailable, VmschedError
from vmsched.lifecycle.calls import filter_call, place_call, place_request, weigh_call
from vmsched.lifecycle.decisions import EXPIRED_WHILE_PLACING, expired, expired_decision
from vmsched.lifecycle.events import Events
from vmsched.lifecycle.replay import Stored
from vmsched.lifecycle.routes import UnitRoutes
from vmsched.lifecycle.timing import StageTimer, lap_all, timed
from vmsched.lifecycle.turns import Outcome, Turn, Verdict, Wait, fail, runs, settle
from vmsched.metrics import PLACED_GROUPS
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import (
    Expired,
    Placed,
    Screening,
    Unplaceable,
    WaitForPending,
    pending_entry,
    place,
    place_group,
)
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.store.decisions import StoredDecision
from vmsched.tracing import span

T = TypeVar("T")


class Placing:
    def __init__(
        self, bus: Bus, events: Events, timer: StageTimer, settings: Settings, routes: UnitRoutes | None = None
    ) -> None:
        self.bus = bus
        self.events = events
        self.timer = timer
        self.settings = settings
        #: Which workers get a policy's calls (None: the plain routes, every worker alike).
        self.routes = routes

    async def routed(
        self, route: str, units: Collection[str], policy: Policy, send: Callable[[str], Awaitable[T]]
    ) -> T:
        """`send` to the route of a worker having every one of `units` (vmsched.lifecycle.routes);
        UnitsUnavailable when none runs. A worker answering that it lacks some (it started since the
        catalogues were read, and refused before doing anything) has the catalogues read again and
        the call sent once more. A catalogue route nobody consumes any more (its last worker stopped
        since: its announcement may outlive it by up to the catalogue TTL) is left out and the call
        sent once more, so it is UnitsUnavailable when no other worker has the units."""
        if self.routes is None:
            return await send(route)
        chosen = await self.routes.route(route, units, policy=policy.name)
        gone: list[str] = []
        try:
            return await send(chosen)
        except RemoteError as exc:
            if exc.remote_code != UnitsUnavailable.code:
                raise
        except NoConsumer:
            if chosen == route:
                raise
            gone.append(chosen.rpartition(".")[2])
        self.routes.forget()
        return await send(await self.routes.route(route, units, policy=policy.name, gone=gone))

    @property
    def may_wait(self) -> bool:
        """Whether a request may wait for pending to change at all."""
        return self.settings.pending_wait_s > 0

    async def in_workers(
        self,
        cluster: str,
        group: list[Turn],
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        records: Sequence[StoredDecision | None],
        table: HostTable | None = None,
    ) -> list[Outcome]:
        """The group placed by filter-workers; `records`: what is stored for each request id. With
        `table` (the cluster at `version` or later, VMSCHED_PLACE_IN_SELECTOR), a run small enough
        whose units are all installed here is placed in this process instead (`local_place`)."""
        live: list[Turn] = []
        for turn, record in zip(group, records, strict=True):
            if record is not None:
                settle(turn, await self.events.found(record, turn.fingerprint, turn.stages))
            elif expired(turn.req):
                settle(turn, expired_decision(turn.req, turn.started, turn.policy.name))
            else:
                live.append(turn)
        outcomes: list[Outcome] = []
        seen = list(pending)  # the cluster's pending, then what the group placed so far
        for run in runs(live):
            since = time.perf_counter()
            policy = run[0].policy
            request = place_request(
                cluster, run, version=version, pending=seen, token=token, may_wait=self.may_wait,
                pending_ttl_s=self.settings.pending_ttl_s,
            )  # fmt: skip

            async def send(route: str, request: PlaceRequest = request) -> PlaceReply:
                return await place_call(self.bus, request, route=route)

            try:
                units = [f.unit for f in policy.filters] + [w.unit for w in policy.weights]
                if table is not None and runs_here(table, request, units):
                    reply = await local_place(table, request)
                    PLACED_GROUPS.labels("selector").inc()
                else:
                    reply = await self.routed(c.RPC_PLACE, units, policy, send)
                    PLACED_GROUPS.labels("worker").inc()
            except VmschedError as exc:  # no worker (with the units) answered, or it failed on the whole group
                for turn in run:
                    fail(turn, exc)
                continue
            lap_all(self.timer, [turn.stages for turn in run], "place", since)
            outcomes.extend(self._results(run, reply, token, pending_version, seen))
        return outcomes

    @staticmethod
    def _results(
        run: list[Turn], reply: PlaceReply, token: int, pending_version: int, seen: list[PendingEntry]
    ) -> list[Outcome]:
        """What the worker's results come to; `seen` gets what was placed (the next run sees it)."""
        outcomes: list[Outcome] = []
        for turn, result in zip(run, reply.results, strict=True):
            if result.outcome is PlaceOutcome.EXPIRED:
                # Its deadline passed while it was being placed: nothing of it is recorded.
                settle(turn, expired_decision(turn.req, turn.started, turn.policy.name, EXPIRED_WHILE_PLACING))
                continue
            outcome = _outcome(turn, result, token, pending_version, reply.state_version)
            if isinstance(outcome, RemoteError):
                fail(turn, outcome)
                continue
            outcomes.append(outcome)
            if isinstance(outcome, Verdict):
                seen.extend(outcome.pending)
        return outcomes

    async def here(
        self,
        group: list[Turn],
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        table: HostTable,
    ) -> list[Outcome]:
        """The group placed one request after another in this process (VMSCHED_PLACE_IN_WORKER=false)."""
        outcomes: list[Outcome] = []
        seen = list(pending)  # the cluster's pending, then what the group placed so far
        for turn in group:
            try:
                result = await self._one(turn, token, pending_version, seen, version, table)
            except VmschedError as exc:
                # This request's own failure (a worker that died under its call, a refused request):
                # it hears why; the rest of the group goes on.
                fail(turn, exc)
                continue
            if isinstance(result, (Verdict, Wait)):
                outcomes.append(result)
                if isinstance(result, Verdict):
                    seen.extend(result.pending)
            else:
                settle(turn, result)
        return outcomes

    async def _one(
        self,
        turn: Turn,
        token: int,
        pending_version: int,
        pending: list[PendingEntry],
        version: int,
        table: HostTable,
    ) -> Outcome | Stored | ScheduleDecision:
        req, policy, stages = turn.req, turn.policy, turn.stages
        found = await self.events.decided_meanwhile(req, turn.fingerprint, stages)
        if found is not None:
            return found
        if expired(req):
            return expired_decision(req, turn.started, policy.name)
        cands = candidate_hosts(table, req.whitelist, req.blacklist)
        ours = {vm.vm_id for vm in req.vms}

        async def filter_fn(vm: VmSpec, hosts: Sequence[str], seen: Sequence[PendingEntry]) -> Screening:
            with timed(self.timer, stages, "filter"):
                return await self._filter(turn, version, vm, hosts, seen)

        async def weigh_fn(vm: VmSpec, hosts: Sequence[str], seen: Sequence[PendingEntry]) -> ScoreTable:
            with timed(self.timer, stages, "weigh"):
                return await self._weigh(turn, version, vm, hosts, seen)

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
            may_wait=turn.may_wait and self.may_wait,
            deadline=req.deadline.timestamp() if req.deadline is not None else None,
        )
        if isinstance(outcome, Expired):
            return expired_decision(req, turn.started, policy.name, EXPIRED_WHILE_PLACING)
        if isinstance(outcome, WaitForPending):
            return Wait(turn, pending_version)
        if isinstance(outcome, Unplaceable):
            return Verdict(turn, [], [], outcome.explanation, version)
        assert isinstance(outcome, Placed)
        return Verdict(turn, outcome.placements, outcome.pending, outcome.explanation, version)

    async def _filter(
        self, turn: Turn, version: int, vm: VmSpec, hosts: Sequence[str], seen: Sequence[PendingEntry]
    ) -> Screening:
        """One VM's filter call, to a filter-worker having the policy's filters."""
        req, policy = turn.req, turn.policy

        async def send(route: str) -> Screening:
            reply = await filter_call(self.bus, req, vm, policy, version, list(hosts), list(seen), route)
            return Screening(reply.survivors, reply.removed)

        return await self.routed(c.RPC_FILTER, [f.unit for f in policy.filters], policy, send)

    async def _weigh(
        self, turn: Turn, version: int, vm: VmSpec, hosts: Sequence[str], seen: Sequence[PendingEntry]
    ) -> ScoreTable:
        """One VM's weigh call, to a weigher having the policy's weights."""
        req, policy = turn.req, turn.policy

        async def send(route: str) -> ScoreTable:
            return await weigh_call(self.bus, req, vm, policy, version, list(hosts), list(seen), route)

        return await self.routed(c.RPC_WEIGH, [w.unit for w in policy.weights], policy, send)


#: The most host-VM evaluations (hosts x VMs) of a run the selector places itself: about 0.1 s of
#: placing at the speed of a 1,000-host cluster. The selector's loop also renews the cluster's lock
#: (a one-second lease) and answers every other request meanwhile; a bigger run goes to a worker.
LOCAL_PLACE_MAX_WORK = 150_000


def runs_here(table: HostTable, request: PlaceRequest, units: Collection[str]) -> bool:
    """Whether `request` is placed in this process under VMSCHED_PLACE_IN_SELECTOR: small enough
    (LOCAL_PLACE_MAX_WORK) and every unit of its policy installed here."""
    vms = sum(1 + len(item.request.batch) for item in request.items)
    return len(table) * vms <= LOCAL_PLACE_MAX_WORK and all(u in REGISTRY for u in units)


async def local_place(table: HostTable, request: PlaceRequest) -> PlaceReply:
    """What a filter-worker answers to `request`, worked out here on the same code (place_group),
    under the same span as the worker's: a trace shows the place step wherever it ran."""
    attributes = {"vmsched.cluster": request.cluster_id, "vmsched.group_size": len(request.items)}
    with span("vmsched.place", {**attributes, "vmsched.placed_by": "selector"}):
        results = await place_group(table, request)
    return PlaceReply(request_id=request.request_id, state_version=request.state_version, results=results)


def _outcome(turn: Turn, result: PlaceResult, token: int, pending_version: int, version: int) -> Outcome | RemoteError:
    """What a `place` result comes to for its request."""
    if result.outcome is PlaceOutcome.PLACED and result.explanation is not None:
        if not _records_placements(result, token):
            return RemoteError("internal", "the filter-worker placed a request without its pending records")
        return Verdict(turn, result.placements, result.pending, result.explanation, version)
    if result.outcome is PlaceOutcome.UNPLACEABLE and result.explanation is not None:
        return Verdict(turn, [], [], result.explanation, version)
    if result.outcome is PlaceOutcome.WAIT:
        return Wait(turn, pending_version)
    error = result.error or ErrorInfo(code="internal", message="the filter-worker gave no result")
    return RemoteError(error.code, error.message)


def _records_placements(result: PlaceResult, token: int) -> bool:
    """A placed result carries one pending record per placement, same VM and host, under `token`
    (recording anything else would hold resources where nothing was placed, or be fenced)."""
    return [(p.vm_id, p.host_id) for p in result.placements] == [(e.vm_id, e.host_id) for e in result.pending] and all(
        e.fencing_token == token for e in result.pending
    )


__all__ = ["Placing"]
