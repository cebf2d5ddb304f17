"""Fault experiments that kill services mid-request: filter-workers and weighers (worker_kill), and
selectors holding cluster locks (selector_kill). Each reads top to bottom as setup, inject, observe,
judge."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from vmsched import constants as c
from vmsched.bus import Subscription
from vmsched.contracts import DecisionStatus, ScheduleDecision
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.chaos.base import (
    Host,
    Outcome,
    Result,
    Stage,
    count_refused,
    experiment_settings,
    pending_duplicates,
    periodically,
    placement_faults,
    run_tag,
    staged,
    timed,
)
from vmsched_services.tools.chaos.stream import (
    drive,
    engine_stream,
    kill_and_replace,
    latency_figures,
    placement_figures,
)
from vmsched_services.tools.procs import ServiceProcess, ServiceStack


async def worker_kill(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 100,
    clusters: int = 4,
    hosts: int = 6,
    concurrency: int = 8,
    spread_s: float = 20.0,
    kill_every_s: tuple[float, float] = (0.5, 1.5),
    freeze_s: float = 0.5,
    seed: int = 1,
) -> Result:
    """Filter-workers and weighers (2 each) are SIGKILLed mid-request and restarted while
    `requests` schedule requests run: every one is answered, within 5 s, exactly once."""
    res = Result("worker_kill", {"requests": requests, "clusters": clusters, "concurrency": concurrency})
    with timed(res):
        # The workers must be on the path: the selector places no group itself here.
        settings = experiment_settings(base, "worker-kill", place_in_selector=False)
        rng = random.Random(seed)
        services = ("state-tracker", "filter-worker", "filter-worker", "weigher", "weigher", "selector")
        tag = run_tag("wk")
        async with staged(
            settings, log_dir, services, tag=tag, clusters=clusters, hosts=hosts, mem_mb=262_144
        ) as stage:
            outcomes = stage.requests(rng, requests)
            kills: Counter[str] = Counter()

            async def kill() -> None:
                service = rng.choice(("filter-worker", "weigher"))
                if await kill_and_replace(stage.stack, service, rng, freeze_s=freeze_s) is not None:
                    kills[service] += 1

            async with periodically(kill_every_s, rng, kill):
                await drive(
                    stage.client, outcomes, concurrency, call_timeout=5.0, give_up_after=30.0, spread_s=spread_s
                )
            latency_figures(res, outcomes)
            res.figures["kills"] = sum(kills.values())
            res.figures["duplicate_placements"] = placement_faults(outcomes, stage.hosts)["duplicate_placements"]
            res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes)
        res.check("answered", ">=", requests)
        res.check("lost", "==", 0)
        res.check_timing("latency_max_s", "<=", 5.0, short_bound=25.0)
        res.check("duplicate_placements", "==", 0)
        res.check("pending_mismatches", "==", 0)
        res.check("kills", ">=", 1)
    return res


async def selector_kill(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 800,
    clusters: int = 4,
    hosts: int = 4,
    selectors: int = 3,
    concurrency: int = 64,
    spread_s: float = 20.0,
    kill_every_s: tuple[float, float] = (1.0, 2.0),
    seed: int = 2,
) -> Result:
    """Selectors are SIGKILLed every 1-2 s (and restarted) while `requests` schedule requests
    compete for `clusters` clusters that fill up: no host is over-committed, >= 99 % are answered
    within 5 s, and every one within the lock's acquire timeout plus a few seconds."""
    res = Result(
        "selector_kill",
        {"requests": requests, "clusters": clusters, "selectors": selectors, "concurrency": concurrency},
    )
    with timed(res):
        settings = experiment_settings(base, "selector-kill")
        bound = settings.lock_acquire_timeout_s + 5.0
        give_up_s = settings.lock_acquire_timeout_s + settings.lock_hold_timeout_s + 15.0
        rng = random.Random(seed)
        services = ("state-tracker", "filter-worker", "filter-worker", "weigher", *["selector"] * selectors)
        tag = run_tag("sk")
        # Small hosts: the clusters fill up, so a broken lock would show as over-commitment.
        async with staged(settings, log_dir, services, tag=tag, clusters=clusters, hosts=hosts, mem_mb=16_384) as stage:
            outcomes = stage.requests(rng, requests, (512, 1024, 2048, 4096))
            redis = connect_redis(settings)
            killer = _SelectorKiller(
                stage.stack,
                rng,
                ClusterLock(redis, settings, recover=Recovery.standalone(redis, settings, "chaos")),
                _cluster_ids(stage.hosts),
            )
            seen = await _DecisionEvents.watch(settings, stage)
            try:
                async with periodically(kill_every_s, rng, killer.kill):
                    await engine_stream(stage.client, outcomes, concurrency, give_up_after=give_up_s, spread_s=spread_s)
            finally:
                await redis.aclose()
            await seen.settle()
            await _selector_kill_figures(res, settings, stage, outcomes, killer, bound)
            seen.figures(res, outcomes)
        res.check("over_committed_hosts", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("lost", "==", 0)
        res.check_timing("answered_within_5s_pct", ">=", 99.0, short_bound=50.0)
        res.check_timing("latency_max_s", "<=", bound, short_bound=give_up_s)
        res.check("kills", ">=", 1)
        # Events: at least one per stored decision, and a repeat is the same event again.
        res.check("stored_decisions_without_event", "==", 0)
        res.check("repeated_events_differing", "==", 0)
    return res


#: The statuses of stored decisions: one event each, repeated only as the identical event.
_STORED = frozenset({DecisionStatus.PLACED, DecisionStatus.UNPLACEABLE})


@dataclass
class _DecisionEvents:
    """Every `decision.*` event of stored decisions seen during the experiment, by request id."""

    settings: Settings
    sub: Subscription
    by_id: dict[str, list[ScheduleDecision]] = field(default_factory=dict)

    #: A durable queue of the experiment's own (deleted in `settle`): events published while the
    #: watcher's connection is re-established wait there instead of passing for never published.
    QUEUE = "chaos-decision-watch"

    @classmethod
    async def watch(cls, settings: Settings, stage: Stage) -> _DecisionEvents:
        seen: dict[str, list[ScheduleDecision]] = {}

        async def on_event(event: ScheduleDecision) -> None:
            if event.status in _STORED:
                seen.setdefault(str(event.request_id), []).append(event)

        sub = await stage.client.bus.subscribe([c.decision_key("*")], [ScheduleDecision], on_event, queue=cls.QUEUE)
        return cls(settings, sub, seen)

    async def settle(self, quiet_s: float = 1.0) -> None:
        """Wait until no event has arrived for `quiet_s` (the last ones still in flight), then stop."""
        count = -1
        while count != (count := sum(map(len, self.by_id.values()))):  # noqa: ASYNC110 (quiet, not a flag)
            await asyncio.sleep(quiet_s)
        with contextlib.suppress(Exception):  # its channel may be gone with a lost connection
            await self.sub.cancel()
        conn = await aio_pika.connect(self.settings.amqp_url)
        try:
            await (await conn.channel()).queue_delete(self.settings.amqp_prefix + self.QUEUE)
        finally:
            await conn.close()

    def figures(self, res: Result, outcomes: list[Outcome]) -> None:
        """Events per stored decision: repeats (how many, the most of one request id), repeats that
        are not the identical event (the dedup identity, request id, would hide a different one),
        and stored decisions the engine was answered with that never had an event."""
        repeats = {rid: events for rid, events in self.by_id.items() if len(events) > 1}
        stored = [o for o in outcomes if o.decision is not None and o.decision.status in _STORED]
        res.figures["decision_events"] = sum(map(len, self.by_id.values()))
        res.figures["repeated_events"] = sum(len(e) - 1 for e in repeats.values())
        res.figures["request_ids_repeated"] = len(repeats)
        res.figures["events_per_request_id_max"] = max(map(len, self.by_id.values()), default=0)
        res.figures["repeated_events_differing"] = sum(
            any(e != events[0] for e in events[1:]) for events in repeats.values()
        )
        res.figures["stored_decisions_without_event"] = sum(str(o.request_id) not in self.by_id for o in stored)


def _cluster_ids(hosts: list[Host]) -> list[str]:
    return sorted({h.cluster_id for h in hosts})


@dataclass
class _SelectorKiller:
    """selector_kill's fault: SIGKILL a selector and start its replacement, the one holding a
    cluster's lock right now if there is one; counts the kills, and those that hit a lock holder."""

    stack: ServiceStack
    rng: random.Random
    locks: ClusterLock
    cluster_ids: list[str]
    kills: int = 0
    holding: int = 0
    chosen: set[int] = field(default_factory=set)

    async def kill(self) -> None:
        victim = await kill_and_replace(self.stack, "selector", self.rng, prefer=self.lock_holder)
        if victim is not None:
            self.kills += 1
            self.holding += victim.pid in self.chosen

    async def lock_holder(self, live: list[ServiceProcess]) -> ServiceProcess | None:
        """The worst victim: a selector holding a cluster's lock right now (polled up to 0.5 s).
        The lock's value names its owner process ("host-PID/..."), as ClusterLock.holder shows."""
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            values = [await self.locks.holder(cid) for cid in self.cluster_ids]
            for p in live:
                if any(v is not None and re.search(rf"-{p.pid}\b", v) for v in values):
                    self.chosen.add(p.pid)
                    return p
            await asyncio.sleep(0.01)
        return None


async def _selector_kill_figures(
    res: Result, settings: Settings, stage: Stage, outcomes: list[Outcome], killer: _SelectorKiller, bound: float
) -> None:
    placement_figures(res, outcomes, stage.hosts)
    res.figures["latency_bound_s"] = bound
    res.figures["kills"] = killer.kills
    res.figures["kills_holding_a_lock"] = killer.holding
    # Informational (no threshold: the client retries them): what the selectors refused themselves.
    await count_refused(res, settings, "requests_dead_lettered", "dead-lettered by the services", 2)
    res.notes.append(
        f"lock acquire/hold timeouts {settings.lock_acquire_timeout_s:g}/{settings.lock_hold_timeout_s:g} s "
        "(Settings defaults)"
    )
