"""tracker_kill: two state trackers take turns on the state queue (a single active consumer); the
one consuming is SIGKILLed while an engine streams one host's reports. Setup, inject, observe, judge:
no report lost, never an earlier report applied after a later one, and how long the standby took
to go on (the takeover: from the kill to the first report newer than any applied before it being
applied)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis.asyncio as aioredis

from vmsched.client import SchedulerClient
from vmsched.contracts import HostReport, HostState, HostStatus
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.chaos.base import Result, experiment_settings, run_tag, running, timed
from vmsched_services.tools.chaos.stream import kill_and_replace
from vmsched_services.tools.procs import ServiceProcess

#: The kills must all happen within this: one waits for two trackers consuming, which a replacement
#: reaches within seconds; past it the experiment fails instead of waiting for ever.
KILLS_WITHIN_S = 180.0


async def tracker_kill(
    base: Settings, log_dir: Path, *, kills: int = 3, report_every_s: float = 0.05, settle_s: float = 3.0, seed: int = 4
) -> Result:
    """Kill the consuming one of two state trackers `kills` times (each replaced), `settle_s` apart,
    while one host is reported every `report_every_s`, each report with one more MB free."""
    res = Result("tracker_kill", {"kills": kills, "report_every_s": report_every_s})
    with timed(res):
        settings = experiment_settings(base, "tracker-kill")
        redis = connect_redis(settings)
        async with running(settings, log_dir) as stack, SchedulerClient(settings) as client:
            await stack.start("state-tracker", "state-tracker")
            stream = _Stream(client, redis, Keys.from_settings(settings), run_tag("tk"))
            tasks = [asyncio.create_task(stream.report(report_every_s)), asyncio.create_task(stream.observe())]
            takeovers: list[float] = []
            rng = random.Random(seed)
            try:
                await asyncio.sleep(settle_s)
                give_up = time.monotonic() + KILLS_WITHIN_S
                while len(takeovers) < kills:
                    if time.monotonic() > give_up:
                        raise RuntimeError(
                            f"tracker_kill: {len(takeovers)} of {kills} kills in {KILLS_WITHIN_S:g} s: two trackers"
                            " were never both consuming (see the trackers' logs)"
                        )
                    # The oldest: the broker hands the queue to consumers in the order they came,
                    # so from the second kill on it is the consuming one (the first may hit the
                    # standby, which costs no takeover); the longest gap counts. Only while the
                    # other one consumes too (a replacement may still be starting).
                    killed_at, newest = time.monotonic(), max(stream.applied, default=-1)
                    if await kill_and_replace(stack, "state-tracker", rng, prefer=_oldest) is None:
                        await asyncio.sleep(0.5)
                        continue
                    await asyncio.sleep(settle_s)
                    seen_at = min((t for i, t in stream.applied.items() if i > newest), default=None)
                    takeovers.append(settle_s if seen_at is None else seen_at - killed_at)
                tasks[0].cancel()
                await _until(lambda: stream.sent - 1 in stream.applied, 30.0)
                await stream.figures(res)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await redis.aclose()
        res.figures["takeover_max_s"] = round(max(takeovers, default=0.0), 3)
        res.figures["takeover_median_s"] = round(sorted(takeovers)[len(takeovers) // 2], 3) if takeovers else 0.0
    res.check("reports_lost", "==", 0)
    res.check("regressions", "==", 0)
    res.check_timing("takeover_max_s", "<=", 2.0, short_bound=settle_s)
    return res


@dataclass
class _Stream:
    """One host's reports, each with one more MB free (report i: i MB), and when each was first
    seen applied in Redis."""

    client: SchedulerClient
    redis: aioredis.Redis
    keys: Keys
    cluster: str
    sent: int = 0
    applied: dict[int, float] = field(default_factory=dict)
    #: Every report whose load sample was seen in the host's state: each report applied adds one
    #: (CPU_SAMPLES_KEPT are kept, far more than are applied between two looks).
    sampled: set[int] = field(default_factory=set)
    start: float = field(default_factory=time.time)

    async def report(self, every_s: float) -> None:
        while True:
            await self.client.report_host(_report(self.cluster, self.sent, self.start))
            self.sent += 1
            await asyncio.sleep(every_s)

    async def observe(self) -> None:
        while True:
            raw = await self.redis.hget(self.keys.state_hosts(self.cluster), "h1")
            if raw is not None:
                state = HostState.model_validate_json(raw)
                self.applied.setdefault(state.report.mem_free_mb, time.monotonic())
                self.sampled.update(round((when - self.start) * 1000) for when, _ in state.cpu_samples)
            await asyncio.sleep(0.005)

    async def figures(self, res: Result) -> None:
        version = int(await self.redis.get(self.keys.state_version(self.cluster)) or 0)
        order = sorted(self.applied, key=lambda i: self.applied[i])
        res.figures["reports"] = self.sent
        # Reports that waited together are applied as one version (state_tracker.batches), so the
        # versions no longer count reports: a report is lost if its load sample never showed up.
        res.figures["state_versions"] = version
        res.figures["reports_lost"] = len(set(range(self.sent)) - self.sampled)
        res.figures["regressions"] = sum(b < a for a, b in itertools.pairwise(order))


def _report(cluster: str, i: int, start: float) -> HostReport:
    """Report i: i MB free, taken i ms after `start` (its load sample's time names it)."""
    return HostReport(
        cluster_id=cluster,
        host_id="h1",
        status=HostStatus.UP,
        cpu_cores=8,
        physical_mem_mb=1 << 20,
        mem_free_mb=i,
        networks=["vmnet"],
        reported_at=datetime.fromtimestamp(start + i / 1000, UTC),
    )


async def _until(done: Callable[[], bool], timeout_s: float) -> None:
    """Poll `done` (observed by another task) until it holds or `timeout_s` passes."""
    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:  # noqa: ASYNC110 (another task fills what done reads)
        await asyncio.sleep(0.05)


async def _oldest(live: list[ServiceProcess]) -> ServiceProcess:
    return live[0]
