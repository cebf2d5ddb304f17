"""What the fault experiments share while they run: the engine's request stream (sent again under the
same request id when a call times out or loses its connection, as an engine does), a service killed
and replaced, and the latency figures of the stream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, VmReport, VmSpec
from vmsched.errors import BusUnavailable
from vmsched_services.tools.chaos.base import (
    Host,
    Outcome,
    Result,
    Stage,
    host_report,
    placement_faults,
    schedule_with_retries,
)
from vmsched_services.tools.procs import ServiceProcess, ServiceStack
from vmsched_services.tools.stats import percentile


async def drive(
    client: SchedulerClient,
    outcomes: list[Outcome],
    concurrency: int,
    *,
    call_timeout: float,
    give_up_after: float,
    spread_s: float = 0.0,
    start_placed: bool = False,
) -> None:
    """Send every request (at most `concurrency` at once), the i-th not before i/n of `spread_s`:
    a stream that lasts long enough for the faults to land among the requests.

    `start_placed`: the engine starts every placed VM (reports it running on its host, as the demo
    does), so its memory stays committed in the state tracker after its pending record would
    have expired, and a cluster filled up stays full however long the experiment runs.
    """
    gate = asyncio.Semaphore(concurrency)
    t0 = time.monotonic()
    step = spread_s / max(1, len(outcomes))

    async def one(i: int, o: Outcome) -> None:
        await asyncio.sleep(max(0.0, t0 + i * step - time.monotonic()))
        async with gate:
            await schedule_with_retries(client, o, call_timeout=call_timeout, give_up_after=give_up_after)
        if start_placed and o.decision is not None and o.decision.status is DecisionStatus.PLACED:
            for p in o.decision.placements:
                await _report_with_retries(client, VmReport.running(o.cluster_id, p.host_id, o.vm), give_up_after)

    await asyncio.gather(*(one(i, o) for i, o in enumerate(outcomes)))


async def _report_with_retries(client: SchedulerClient, report: VmReport, give_up_after: float) -> None:
    """Publish the report, again while the client's connection is being re-established (as an
    engine would): the experiment is about the services' faults, not its own client's."""
    end = time.monotonic() + give_up_after
    while True:
        try:
            await client.report_vm(report)
            return
        except BusUnavailable:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.2)


async def drive_during(
    fault: Coroutine[Any, Any, None],
    client: SchedulerClient,
    outcomes: list[Outcome],
    concurrency: int,
    spread_s: float,
) -> None:
    """`drive` the stream (3 s calls, each request sent again for up to 90 s) while `fault` runs beside
    it; the fault is awaited too, and cancelled if the stream fails."""
    injector = asyncio.create_task(fault)
    try:
        await drive(client, outcomes, concurrency, call_timeout=3.0, give_up_after=90.0, spread_s=spread_s)
        await injector
    finally:
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await injector


async def kill_and_replace(
    stack: ServiceStack,
    service: str,
    rng: random.Random,
    *,
    freeze_s: float = 0.0,
    prefer: Callable[[list[ServiceProcess]], Awaitable[ServiceProcess | None]] | None = None,
) -> ServiceProcess | None:
    """SIGKILL one live `service` process and start its replacement (not waited for), but only
    while another one is consuming: the experiment is about losing a process, not all of them.

    With `freeze_s`, the victim is SIGSTOPped that long first: it keeps its connection, so the
    broker goes on handing it requests it never answers, and the SIGKILL lands with requests
    certainly in flight (a worker answers in milliseconds: a plain kill would mostly hit it idle).
    `prefer` picks the victim among the live ones (None: a random one).
    """
    live = [p for p in stack.live(service) if not p.frozen]
    if len(live) < 2 or await stack.consumers(service) < 2:
        return None
    victim = (await prefer(live) if prefer is not None else None) or rng.choice(live)
    with contextlib.suppress(ProcessLookupError):
        if freeze_s > 0:
            stack.freeze(victim)
            await asyncio.sleep(freeze_s)
        os.kill(victim.pid, signal.SIGKILL)
    stack.spawn(service)
    return victim


async def engine_stream(
    client: SchedulerClient, outcomes: list[Outcome], concurrency: int, *, give_up_after: float, spread_s: float
) -> None:
    """`drive` as an engine whose placed VMs start (so clusters fill up and stay full): calls
    bounded at 5 s, each request sent again until `give_up_after`."""
    await drive(
        client,
        outcomes,
        concurrency,
        call_timeout=5.0,
        give_up_after=give_up_after,
        spread_s=spread_s,
        start_placed=True,
    )


def placement_figures(res: Result, outcomes: list[Outcome], hosts: list[Host]) -> None:
    """The latency figures, the share answered within 5 s, and what the hosts got: placed VMs,
    over-committed hosts, duplicate placements."""
    latency_figures(res, outcomes)
    faults = placement_faults(outcomes, hosts)
    within = sum(o.answered and o.latency_s <= 5.0 for o in outcomes)
    res.figures["answered_within_5s_pct"] = round(100.0 * within / max(1, len(outcomes)), 2)
    res.figures["placed"] = faults["placed"]
    res.figures["over_committed_hosts"] = faults["over_committed_hosts"]
    res.figures["duplicate_placements"] = faults["duplicate_placements"]


async def placed_again_after(stage: Stage, probes: list[Outcome], since: float, give_up_s: float = 60.0) -> float:
    """Seconds from `since` (a fault's end) until a fresh request is placed: a small probe VM sent
    every 0.2 s, each kept in `probes` (their placements count in the experiment's figures); inf if
    none is placed within `give_up_s`."""
    while time.monotonic() - since < give_up_s:
        o = Outcome(
            stage.hosts[0].cluster_id,
            VmSpec(vm_id=f"{stage.tag}-probe{len(probes)}", mem_mb=64, vcpus=1),
            uuid.uuid4(),
        )
        probes.append(o)
        await schedule_with_retries(stage.client, o, call_timeout=1.0, give_up_after=1.0)
        if o.decision is not None and o.decision.status is DecisionStatus.PLACED:
            return time.monotonic() - since
        await asyncio.sleep(0.2)
    return float("inf")


async def settle(client: SchedulerClient, outcomes: list[Outcome], give_up_s: float = 30.0) -> int:
    """Send every unanswered request of `outcomes` again under its id (the selector answers a replay
    with the decision it made, if it made one); how many were unanswered before."""
    unanswered = [o for o in outcomes if o.decision is None]
    for o in unanswered:
        await schedule_with_retries(client, o, call_timeout=3.0, give_up_after=give_up_s)
    return len(unanswered)


@contextlib.asynccontextmanager
async def answering_resyncs(
    client: SchedulerClient, hosts: list[Host], outcomes: list[Outcome]
) -> AsyncIterator[Counter[str]]:
    """While the block runs, the engine answers each ResyncRequested for one of its clusters (Redis
    forgot it, or failed over) with a full report: the cluster, its hosts and the VMs it placed and
    started, then resync_complete. Yields the requests answered, per cluster."""
    answered: Counter[str] = Counter()
    mine = {h.cluster_id for h in hosts}

    async def answer() -> None:
        async for asked in client.resync_requests("*"):
            cid = asked.cluster_id
            if cid not in mine:
                continue
            answered[cid] += 1
            await client.report_cluster(ClusterReport(cluster_id=cid))
            cluster_hosts = [h for h in hosts if h.cluster_id == cid]
            for h in cluster_hosts:
                await client.report_host(host_report(h))
            running = [
                (o, p)
                for o in outcomes
                if o.cluster_id == cid and o.decision is not None and o.decision.status is DecisionStatus.PLACED
                for p in o.decision.placements
            ]
            for o, p in running:
                await client.report_vm(VmReport.running(cid, p.host_id, o.vm))
            await client.resync_complete(cid, asked.generation, hosts=len(cluster_hosts), vms=len(running))

    task = asyncio.create_task(answer())
    await asyncio.sleep(0.2)  # subscribed before anything is asked
    try:
        yield answered
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def latency_figures(res: Result, outcomes: list[Outcome]) -> None:
    lat = [o.latency_s for o in outcomes if o.answered]
    res.figures["requests"] = len(outcomes)
    res.figures["answered"] = sum(o.answered for o in outcomes)
    res.figures["lost"] = len(outcomes) - int(res.figures["answered"])
    res.figures["retries"] = sum(o.attempts - 1 for o in outcomes)
    res.figures["latency_p50_s"] = round(percentile(lat, 50), 3)
    res.figures["latency_p99_s"] = round(percentile(lat, 99), 3)
    res.figures["latency_max_s"] = round(max((o.latency_s for o in outcomes), default=0.0), 3)
    errors = Counter(e.split(":")[0] for o in outcomes for e in o.errors)
    if errors:
        res.notes.append("client retries were caused by: " + ", ".join(f"{k} x{v}" for k, v in errors.most_common(5)))
