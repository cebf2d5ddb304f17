"""The broker_drop experiment: the services' broker connections closed and their Redis clients killed
(the broker app restarted in the long run) during a request stream: nothing lost or placed twice,
and the time each fault took to heal."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    Stage,
    count_refused,
    experiment_settings,
    pending_duplicates,
    placement_faults,
    run_tag,
    staged,
    timed,
)
from vmsched_services.tools.chaos.inject import close_broker_connections, kill_redis_clients, restart_broker_app
from vmsched_services.tools.chaos.stream import drive_during, latency_figures, placed_again_after
from vmsched_services.tools.procs import ServiceStack


async def broker_drop(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 300,
    clusters: int = 2,
    concurrency: int = 4,
    spread_s: float = 30.0,
    restart_broker: bool = True,
    seed: int = 4,
) -> Result:
    """During a stream of schedule requests, the services' broker connections are closed, their
    Redis connections killed and (`restart_broker`) the broker app restarted: nothing is lost or
    placed twice, and scheduling works again within 5 s of each fault's end."""
    res = Result("broker_drop", {"requests": requests, "concurrency": concurrency, "restart_broker": restart_broker})
    with timed(res):
        settings = experiment_settings(base, "broker-drop")
        rng = random.Random(seed)
        services = ("state-tracker", "filter-worker", "weigher", "selector", "selector")
        tag = run_tag("bd")
        async with staged(settings, log_dir, services, tag=tag, clusters=clusters, hosts=4, mem_mb=262_144) as stage:
            outcomes = stage.requests(rng, requests)
            # Each connection drop twice: a reconnect race need not show the first time.
            steps = [(0.1, "amqp_close"), (0.25, "redis_kill"), (0.4, "amqp_close"), (0.55, "redis_kill")]
            if restart_broker:
                steps.append((0.7, "broker_restart"))
            faults = _BrokerFaults(settings, stage, outcomes)
            await drive_during(faults.inject(steps), stage.client, outcomes, concurrency, spread_s)
            await _broker_drop_figures(res, settings, stage, outcomes, faults)
        res.check("lost", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("pending_mismatches", "==", 0)
        res.check_timing("recovery_max_s", "<=", 5.0, short_bound=30.0)
        res.check("services_exited", "==", 0)
        res.check("valid_requests_dead_lettered", "==", 0)
        res.check("amqp_close_count", ">=", 1)
        res.check("redis_kill_count", ">=", 1)
    return res


@dataclass
class _BrokerFaults:
    """broker_drop's faults, each injected once the request stream has got a stated fraction of its
    answers, then probed until a fresh request is placed again: how many connections (or broker
    restarts) each kind of fault hit, and its slowest recovery."""

    settings: Settings
    stage: Stage
    outcomes: list[Outcome]
    probes: list[Outcome] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)
    recoveries: dict[str, float] = field(default_factory=dict)

    async def inject(self, steps: list[tuple[float, str]]) -> None:
        """Each (fraction of the stream answered, fault) in turn."""
        for at, fault in steps:
            while self._progress() < at * len(self.outcomes):  # noqa: ASYNC110 (progress is a count, not an event)
                await asyncio.sleep(0.05)
            n = await self._one(fault)
            self.injected[fault] = self.injected.get(fault, 0) + n
            took = await placed_again_after(self.stage, self.probes, time.monotonic())
            self.recoveries[fault] = max(self.recoveries.get(fault, 0.0), took)

    def _progress(self) -> int:
        return sum(o.decision is not None for o in self.outcomes)

    async def _one(self, fault: str) -> int:
        services = [p for p in self.stage.stack.procs if p.alive]
        if fault == "amqp_close":
            return await close_broker_connections(self.settings, services)
        if fault == "redis_kill":
            return await kill_redis_clients(self.settings, services)
        await restart_broker_app()
        return 1


def _logged(stack: ServiceStack, markers: tuple[str, ...]) -> Counter[str]:
    """How often each marker appears in the services' output."""
    logged = Counter[str]()
    for p in stack.procs:
        for path in (p.stdout, p.stderr):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                for marker in markers:
                    logged[marker] += text.count(marker)
    return logged


async def _broker_drop_figures(
    res: Result, settings: Settings, stage: Stage, outcomes: list[Outcome], faults: _BrokerFaults
) -> None:
    crashed = [f"{p.name}#{p.index}" for p in stage.stack.procs if not p.alive]
    # What the services logged about the drops (informational: a reconnect race shows here).
    logged = _logged(stage.stack, ("PRECONDITION_FAILED", "Traceback"))
    latency_figures(res, outcomes)
    placed = placement_faults(outcomes + faults.probes, stage.hosts)
    res.figures["duplicate_placements"] = placed["duplicate_placements"]
    res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes + faults.probes)
    for fault, n in faults.injected.items():
        res.figures[f"{fault}_count"] = n
    for fault, s in faults.recoveries.items():
        res.figures[f"{fault}_recovery_s"] = round(s, 3) if s != float("inf") else 999.0
    res.figures["recovery_max_s"] = max(
        (float(res.figures[f"{f}_recovery_s"]) for f in faults.recoveries), default=999.0
    )
    res.figures["services_exited"] = len(crashed)
    res.figures["logged_precondition_failed"] = logged["PRECONDITION_FAILED"]
    await count_refused(res, settings, "valid_requests_dead_lettered", "valid requests dead-lettered", 3)
    res.figures["logged_tracebacks"] = logged["Traceback"]
    if crashed:
        res.notes.append("exited: " + ", ".join(crashed))
