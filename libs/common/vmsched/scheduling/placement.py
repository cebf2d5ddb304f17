"""How a decision is made for one request, as one pure function over injected filter and weigh steps.

`place` holds the placement algorithm: the VMs of a request (one, or an oVirt batch / Nova's N
instances) are placed one after another; each is filtered and weighed after the earlier ones were
virtually placed (they count as pending on their chosen hosts: memory, CPUs, VM ids for affinity),
and the request is placed whole or not at all. When no host fits but pending resources sit on the
candidates, it asks the caller to wait for them to change and retry, as oVirt's scheduler does.

The filter and weigh steps are passed in: the selector passes ones that call the filter-workers and
weighers over the bus, the in-process paths (tests, the bench) pass local ones. Either way this is
the one place that decides.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from vmsched.contracts import (
    ErrorInfo,
    Explanation,
    FilteredHost,
    PendingEntry,
    Placement,
    PlaceOutcome,
    PlaceRequest,
    PlaceResult,
    ScheduleRequest,
    ScoreTable,
    UnitCall,
    VmSpec,
)
from vmsched.errors import VmschedError
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import HostTable, Prefix, TakenIds
from vmsched.scheduling.pipeline import Removal, candidate_hosts, filtered_hosts, rank, screen, summarize
from vmsched.scheduling.policy import Policy


@dataclass(frozen=True)
class Screening:
    """What filtering one VM found; `scores` when the step also ranked the survivors (then the
    weigh step is not called)."""

    survivors: Sequence[str]
    #: Every removed host with its filter and reason.
    removed: Sequence[Removal | FilteredHost]
    scores: ScoreTable | None = None


#: Filter `vm` over the candidate host ids, with these pending records counted.
#: `seen` is a Prefix of one log for all the VMs of a request: a step may keep what it made of one
#: VM's and read only what was added for the next (LocalSteps does).
FilterFn = Callable[[VmSpec, Sequence[str], Sequence[PendingEntry]], Awaitable[Screening]]
#: Weigh `vm` over the surviving host ids (2 or more), with these pending records counted; best first.
WeighFn = Callable[[VmSpec, Sequence[str], Sequence[PendingEntry]], Awaitable[ScoreTable]]
#: The pending record of `vm` placed on the host id (the caller adds request id, fencing token, expiry).
PendingFor = Callable[[VmSpec, str], PendingEntry]


@dataclass(frozen=True)
class Placed:
    placements: list[Placement]
    #: One per placed VM, to be recorded together (fenced) by the caller.
    pending: list[PendingEntry]
    #: The first VM's explanation (a batch's summary says how many were placed).
    explanation: Explanation


@dataclass(frozen=True)
class WaitForPending:
    """No host fits now, but pending resources on the candidates may free one: wait, then retry."""


@dataclass(frozen=True)
class Unplaceable:
    #: The explanation of the VM that did not fit (nothing of the request is placed).
    explanation: Explanation


@dataclass(frozen=True)
class Expired:
    """The deadline passed while the request was being placed: nothing of it is placed."""

    #: How many of its VMs had a host when it stopped (none of them is kept).
    reached: int


Outcome = Placed | WaitForPending | Unplaceable | Expired


#: How long a batch's placement runs before it lets the event loop's other work go on (seconds):
#: placing is CPU work on the loop, and a 1,000-VM batch held every other message of its worker
#: (another cluster's one-VM requests) for its whole run. Also how often the deadline is read.
SLICE_S = 0.01


async def place(
    request: ScheduleRequest,
    filters: Sequence[str],
    candidates: Sequence[str],
    pending: Sequence[PendingEntry],
    *,
    filter_fn: FilterFn,
    weigh_fn: WeighFn,
    pending_for: PendingFor,
    may_wait: bool,
    deadline: float | None = None,
) -> Outcome:
    """Place every VM of `request` on `candidates` (Up hosts, black/whitelist applied), or none.

    `filters` names the policy's filter chain in order (for the explanation). `pending` is what is
    pending in the cluster besides this request's own VMs. With `may_wait`, a VM that fits nowhere
    while memory is pending on a candidate gives WaitForPending. A request still being placed at
    `deadline` (unix seconds) gives Expired; the loop yields to the event loop every SLICE_S.
    """
    # A table's ids as they are (immutable; a copy of 10,000 would be made for every decision).
    cands = candidates if isinstance(candidates, (tuple, TakenIds)) else list(candidates)
    chain = list(filters)
    vms = request.vms  # a new list on each read
    # What each VM sees pending: the cluster's, then the VMs placed before it. One log that only
    # grows, each VM given a prefix of it: a copy per VM made a batch cost the square of its size.
    log = list(pending)
    placements: list[Placement] = []
    first: Explanation | None = None
    slices = _Slices(deadline)
    for n, vm in enumerate(vms):
        if await slices.expired():
            return Expired(len(placements))  # all or nothing: nothing of the request is placed
        seen = Prefix(log)
        screened = await filter_fn(vm, cands, seen) if cands else None
        which = f"{vm.vm_id} ({n + 1}/{len(vms)})"
        if screened is None or not screened.survivors:
            removed = screened.removed if screened is not None else []
            explanation = _explain(request, which, chain, len(cands), [], removed)
            on_candidates = set(cands)
            if may_wait and any(e.mem_mb > 0 and e.host_id in on_candidates for e in pending):
                return WaitForPending()
            return Unplaceable(explanation)  # all or nothing: nothing of the request is placed
        ordered, scores = await _ranked(vm, screened, seen, weigh_fn)
        if first is None:
            explanation = _explain(request, which, chain, len(cands), screened.survivors, screened.removed)
            first = explanation.model_copy(update={"scores": scores if request.explain_scores else None})
            summary = explanation.summary
        else:
            # Only the first VM's explanation is kept: the others' need only their summary line.
            summary = _summary(request, which, len(cands), len(screened.survivors), screened.removed)
        placements.append(
            Placement(
                vm_id=vm.vm_id,
                host_id=ordered[0],
                alternates=list(ordered[1 : 1 + request.max_alternates]),
                summary=summary,
            )
        )
        log.append(pending_for(vm, ordered[0]))
    assert first is not None  # a request has at least one VM
    if request.batch:
        first = first.model_copy(update={"summary": f"placed {len(placements)} VMs; first: {first.summary}"})
    return Placed(placements, log[len(log) - len(placements) :], first)


class _Slices:
    """A placement's turns on the event loop: it lets the loop's other work go on every SLICE_S,
    and then reads the clock for its deadline."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.began: float | None = None

    async def expired(self) -> bool:
        """Whether the deadline has passed (read at the first VM and after each yield)."""
        began = self.began
        if began is not None and time.perf_counter() - began < SLICE_S:
            return False
        if began is not None:
            await asyncio.sleep(0)  # let other clusters' requests on this loop go on
        self.began = time.perf_counter()
        return self.deadline is not None and time.time() >= self.deadline


async def _ranked(
    vm: VmSpec, screened: Screening, seen: Sequence[PendingEntry], weigh_fn: WeighFn
) -> tuple[Sequence[str], ScoreTable | None]:
    """The survivors best first, and their scores when there were two or more to rank."""
    survivors = screened.survivors
    if len(survivors) < 2:
        return survivors, None
    scores = screened.scores if screened.scores is not None else await weigh_fn(vm, survivors, seen)
    return scores.hosts, scores


def _summary(
    request: ScheduleRequest, which: str, candidates: int, available: int, removed: Sequence[Removal | FilteredHost]
) -> str:
    """The summary line of the VM `which` names in a batch (`vm-7 (7/1000)`)."""
    summary = summarize(candidates, available, removed)
    return f"{which}: {summary}" if request.batch else summary


def _explain(
    request: ScheduleRequest,
    which: str,
    chain: list[str],
    candidates: int,
    survivors: Sequence[str],
    removed: Sequence[Removal | FilteredHost],
) -> Explanation:
    """VM n's explanation. Every removed host with its reason only when asked or when nothing fits
    (then it is the answer to "why"): at 1,000 hosts it is most of the decision's size, and the
    decision is serialized for the store, the event and the reply."""
    summary = _summary(request, which, candidates, len(survivors), removed)
    listed = filtered_hosts(removed) if request.explain_hosts or not survivors else []
    return Explanation(summary=summary, candidates=candidates, filters=chain, filtered=listed)


def pending_entry(vm: VmSpec, host_id: str, *, request_id: UUID, fencing_token: int, expires_at: float) -> PendingEntry:
    """What `vm` placed on `host_id` holds there until the engine reports it running (or failed)."""
    cost = vm_cost(vm)
    return PendingEntry(
        vm_id=vm.vm_id,
        host_id=host_id,
        mem_mb=cost.mem_mb,
        vcpus=cost.vcpus,
        cpus_pinned=cost.cpus_pinned,
        request_id=request_id,
        fencing_token=fencing_token,
        expires_at=expires_at,
    )


def top_hosts(request: ScheduleRequest) -> int | None:
    """How many ranked hosts a decision needs: the best and its alternates, unless the request
    wants the whole score table (None)."""
    return None if request.explain_scores else 1 + request.max_alternates


class LocalSteps:
    """Filter and weigh steps in this process, over one cluster's HostTable: what the filter-worker
    and the weigher run, without the bus (`place_group` in the filter-worker, the bench's in-process
    path, tests, a simulator)."""

    def __init__(
        self,
        hosts: HostTable,
        filters: Sequence[UnitCall],
        weights: Sequence[UnitCall],
        selector: str,
        *,
        now: float | None = None,
        weigh_in_filter: bool = False,
        top: int | None = None,
    ) -> None:
        self.hosts = hosts
        self.filters = list(filters)
        self.weights = list(weights)
        self.selector = selector
        #: The decision's instant for time-dependent units (as a worker gets it from the request).
        self.now = now
        #: Rank the survivors in the filter step (saves a second view of the hosts).
        self.weigh_in_filter = weigh_in_filter
        #: Rank only the best `top` hosts, without the per-unit table (None: every host, with it).
        self.top = top
        #: The last pending a VM saw, folded into the cluster's table: the next VM of the batch
        #: sees it and one more record, folded onto it instead of all of them again.
        self._folded: tuple[Prefix[PendingEntry], HostTable] | None = None

    @classmethod
    def of(
        cls,
        hosts: HostTable,
        policy: Policy,
        *,
        now: float | None = None,
        weigh_in_filter: bool = False,
        top: int | None = None,
    ) -> LocalSteps:
        """The steps of `policy` (its filter chain in order, its weights, its selector)."""
        return cls(
            hosts,
            policy.filter_calls(),
            policy.weight_calls(),
            policy.selector,
            now=now,
            weigh_in_filter=weigh_in_filter,
            top=top,
        )

    def view(self, ids: Sequence[str], seen: Sequence[PendingEntry]) -> HostTable:
        """The hosts `ids` with `seen` pending, as HostTable.view makes them."""
        if not isinstance(seen, Prefix):
            return self.hosts.view(ids, seen, now=self.now)
        known = self._folded
        added = seen.since(known[0]) if known is not None else None
        if known is not None and added is not None and known[1].cluster is known[1]:
            whole = known[1].with_more_pending(added)  # a whole cluster's table (a sub-table refolds)
        else:
            whole = self.hosts.with_pending(seen, now=self.now)
        self._folded = (seen, whole)
        return whole.part(ids)

    async def filter(self, vm: VmSpec, ids: Sequence[str], seen: Sequence[PendingEntry]) -> Screening:
        view = self.view(ids, seen)
        weights = self.weights if self.weigh_in_filter else None
        out, scores = screen(view, vm, self.filters, weights, self.selector, top=self.top)
        return Screening(out.survivors.ids, out.removals, scores)

    async def weigh(self, vm: VmSpec, ids: Sequence[str], seen: Sequence[PendingEntry]) -> ScoreTable:
        return rank(self.view(ids, seen), vm, self.weights, self.selector, top=self.top)


async def place_group(hosts: HostTable, group: PlaceRequest, *, deadline: float | None = None) -> list[PlaceResult]:
    """Place the requests of `group` in order on one cluster's hosts, each seeing what the earlier
    ones placed as pending: the same decisions as placing them one at a time with `place`. A placed
    request's result carries its pending records (the group's fencing token, expiring
    `pending_ttl_s` after the group's `now`): what the selector records, as they were counted here.

    A request that cannot be evaluated (an unknown unit, an invalid property) gets an `error`
    result; the rest of the group goes on. One still being placed at its own deadline or at
    `deadline` (unix seconds: when the caller stops waiting for the group) is `expired`, and so are
    the ones after it once `deadline` has passed.
    """
    names = [f.unit for f in group.filters]
    placed: list[PendingEntry] = []
    results: list[PlaceResult] = []
    for k, item in enumerate(group.items):
        request = item.request
        if k:
            await asyncio.sleep(0)  # a group of many small requests lets the loop's other work go on too
        ours = {vm.vm_id for vm in request.vms}
        steps = LocalSteps(
            hosts,
            group.filters,
            group.weights,
            group.selector,
            now=group.now,
            weigh_in_filter=True,
            top=top_hosts(request),
        )

        def pending_for(vm: VmSpec, host_id: str, request_id: UUID = request.request_id) -> PendingEntry:
            expires = group.now + group.pending_ttl_s
            return pending_entry(
                vm, host_id, request_id=request_id, fencing_token=group.fencing_token, expires_at=expires
            )

        try:
            outcome = await place(
                request,
                names,
                candidate_hosts(hosts, request.whitelist, request.blacklist).ids,
                [e for e in [*group.pending, *placed] if e.vm_id not in ours],
                filter_fn=steps.filter,
                weigh_fn=steps.weigh,
                pending_for=pending_for,
                may_wait=item.may_wait,
                deadline=_earlier(deadline, request.deadline.timestamp() if request.deadline else None),
            )
        except VmschedError as exc:
            error = ErrorInfo(code=exc.code, message=str(exc)[:2000])
            results.append(PlaceResult(request_id=request.request_id, outcome=PlaceOutcome.ERROR, error=error))
            continue
        results.append(_result(request.request_id, outcome))
        if isinstance(outcome, Placed):
            placed.extend(outcome.pending)
    return results


def _earlier(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _result(request_id: UUID, outcome: Outcome) -> PlaceResult:
    if isinstance(outcome, Placed):
        return PlaceResult(
            request_id=request_id,
            outcome=PlaceOutcome.PLACED,
            placements=outcome.placements,
            explanation=outcome.explanation,
            pending=outcome.pending,
        )
    if isinstance(outcome, Unplaceable):
        return PlaceResult(request_id=request_id, outcome=PlaceOutcome.UNPLACEABLE, explanation=outcome.explanation)
    if isinstance(outcome, Expired):
        return PlaceResult(request_id=request_id, outcome=PlaceOutcome.EXPIRED)
    return PlaceResult(request_id=request_id, outcome=PlaceOutcome.WAIT)


__all__ = [
    "Expired",
    "FilterFn",
    "LocalSteps",
    "Outcome",
    "PendingFor",
    "Placed",
    "Screening",
    "Unplaceable",
    "WaitForPending",
    "WeighFn",
    "pending_entry",
    "place",
    "place_group",
    "top_hosts",
]
