"""The outage experiments: a server the services need stopped during a request stream, then started.

* postgres_away: a private PostgreSQL (the services' policy store) stopped for `away_s`, longer than
  the policy caches' TTL. Every request is answered (from the policies read last), none `internal`;
  a cluster whose policy was never read is refused `policy_store_unavailable`; the selector's
  staleness gauge counts the outage and /readyz says "degraded"; once PostgreSQL is back that
  cluster is decided again within seconds.
* redis_away: a private Redis (every service's; append-only, so the outage loses no data: losing
  it is another fault) stopped for `away_s`, then started. The services cancel their consumers (the
  broker counts none on the selector's queue), the requests sent meanwhile wait in the queue,
  nothing is answered `internal`, and once Redis is back every request is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from vmsched.contracts import ClusterReport, DecisionStatus, VmSpec
from vmsched.db.migrate import migrate
from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    Stage,
    experiment_settings,
    host_report,
    make_clusters,
    run_tag,
    schedule_with_retries,
    staged,
    timed,
)
from vmsched_services.tools.chaos.stream import drive, latency_figures
from vmsched_services.tools.procs import ServiceStack
from vmsched_services.tools.servers.base import free_port
from vmsched_services.tools.servers.postgres import PrivatePostgres
from vmsched_services.tools.servers.redis import PrivateRedis

#: The host memory of the experiments' clusters: large enough that no request is unplaceable.
HOST_MEM_MB = 262_144
#: A request answered within this long counts as answered in time.
IN_TIME_S = 5.0


def _internal(outcomes: list[Outcome]) -> int:
    """Requests answered `internal` at least once (a decision error, or an ErrorReply the client raised)."""
    return sum(
        any(d.error is not None and d.error.code == "internal" for d in o.replies)
        or any("internal error in" in e for e in o.errors)
        for o in outcomes
    )


def _stream_figures(res: Result, outcomes: list[Outcome]) -> None:
    latency_figures(res, outcomes)
    res.figures["answered_within_5s"] = sum(o.answered and o.latency_s <= IN_TIME_S for o in outcomes)
    res.figures["internal_errors"] = _internal(outcomes)


async def _scrape(port: int, path: str) -> str:
    def get() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return str(r.read().decode())
        except urllib.error.HTTPError as exc:  # /readyz answers 503 with a body
            return str(exc.read().decode())
        except OSError:
            return ""

    return await asyncio.to_thread(get)


async def _one_by_one(stack: ServiceStack, *services: str) -> None:
    """Start the services one after another: several Python processes importing at once on a busy
    2-core machine can outlast the stack's start timeout."""
    for service in services:
        await stack.start(service)


def _probe(cluster: str) -> Outcome:
    return Outcome(cluster, VmSpec(vm_id=f"{uuid.uuid4().hex[:8]}-probe", mem_mb=64, vcpus=1), uuid.uuid4())


async def _placed_after(st: Stage, cluster: str, started: float, call_timeout: float = 2.0) -> float:
    """Seconds from `started` until a fresh request for `cluster` is placed (999 if not within 60 s)."""
    while time.monotonic() - started < 60:
        o = await schedule_with_retries(
            st.client, _probe(cluster), call_timeout=call_timeout, give_up_after=call_timeout
        )
        if o.decision is not None and o.decision.status is DecisionStatus.PLACED:
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    return 999.0


def _gauge(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


# ---------------------------------------------------------------------------------------- postgres_away
@dataclass
class _PostgresOutage:
    """Stops PostgreSQL once the stream is `at` through, watches the selector meanwhile, starts it
    again after `away_s`, and times until a cluster never decided before is placed."""

    server: PrivatePostgres
    stage: Stage
    outcomes: list[Outcome]
    metrics_port: int
    new_cluster: str
    staleness_max_s: float = 0.0
    readiness: set[str] = field(default_factory=set)
    never_seen_code: str = "none"
    answered_while_away: int = 0
    recovery_s: float = 999.0

    async def run(self, at: float, away_s: float) -> None:
        while sum(o.decision is not None for o in self.outcomes) < at * len(self.outcomes):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        answered_before = sum(o.decision is not None for o in self.outcomes)
        await self.server.stop()
        stopped = time.monotonic()
        probe = await self._probe()
        if probe.decision is not None and probe.decision.error is not None:
            self.never_seen_code = probe.decision.error.code
        while time.monotonic() - stopped < away_s:
            await self._watch()
            await asyncio.sleep(0.25)
        self.answered_while_away = sum(o.decision is not None for o in self.outcomes) - answered_before
        await self.server.start()
        self.recovery_s = await _placed_after(self.stage, self.new_cluster, time.monotonic(), 5.0)

    async def _watch(self) -> None:
        staleness = _gauge(await _scrape(self.metrics_port, "/metrics"), "vmsched_policy_staleness_seconds")
        self.staleness_max_s = max(self.staleness_max_s, staleness or 0.0)
        with contextlib.suppress(ValueError):
            self.readiness.add(str(json.loads(await _scrape(self.metrics_port, "/readyz")).get("status")))

    async def _probe(self) -> Outcome:
        return await schedule_with_retries(
            self.stage.client, _probe(self.new_cluster), call_timeout=5.0, give_up_after=5.0
        )


@contextlib.asynccontextmanager
async def _private_postgres(log_dir: Path) -> AsyncIterator[PrivatePostgres]:
    server = PrivatePostgres(log_dir / "postgres")
    try:
        await server.start()
        await migrate(server.dsn)
        yield server
    finally:
        await server.kill()
        server.remove()


async def postgres_away(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 200,
    clusters: int = 2,
    concurrency: int = 4,
    spread_s: float = 30.0,
    at: float = 0.2,
    away_s: float = 15.0,
    cache_ttl_s: float = 2.0,
    seed: int = 11,
) -> Result:
    """PostgreSQL stopped for `away_s` (several cache TTLs) during a stream of schedule requests."""
    res = Result("postgres_away", {"requests": requests, "away_s": away_s, "cache_ttl_s": cache_ttl_s})
    with timed(res):
        async with _private_postgres(log_dir) as server:
            settings = experiment_settings(
                base, "postgres-away", postgres_url=server.dsn, policy_cache_ttl_s=cache_ttl_s, readiness_interval_s=0.5
            )
            tag, port = run_tag("pa"), free_port()
            async with staged(
                settings, log_dir, ("state-tracker",), tag=tag, clusters=clusters, hosts=4, mem_mb=HOST_MEM_MB
            ) as st:
                await _one_by_one(st.stack, "filter-worker", "weigher")
                # The selector alone serves metrics (one port per process).
                selector = ServiceStack(settings.model_copy(update={"metrics_port": port}), log_dir)
                try:
                    await selector.start("selector")
                    await make_clusters(st.client, f"{tag}-new", 1, 2, HOST_MEM_MB)
                    outcomes = st.requests(random.Random(seed), requests)
                    outage = _PostgresOutage(server, st, outcomes, port, f"{tag}-new-c0")
                    fault = asyncio.create_task(outage.run(at, away_s))
                    await drive(
                        st.client, outcomes, concurrency, call_timeout=5.0, give_up_after=60.0, spread_s=spread_s
                    )
                    await fault
                finally:
                    await selector.close()
            _stream_figures(res, outcomes)
            res.figures["answered_while_away"] = outage.answered_while_away
            res.figures["staleness_max_s"] = round(outage.staleness_max_s, 2)
            res.figures["readiness_while_away"] = ",".join(sorted(outage.readiness)) or "none"
            res.figures["never_seen_refused_retryable"] = int(outage.never_seen_code == "policy_store_unavailable")
            res.figures["recovery_s"] = round(outage.recovery_s, 3)
        res.check("lost", "==", 0)
        res.check("internal_errors", "==", 0)
        res.check("answered_while_away", ">=", 1)
        res.check("staleness_max_s", ">=", cache_ttl_s)
        res.check("never_seen_refused_retryable", "==", 1)
        res.check_timing("recovery_s", "<=", 5.0, short_bound=30.0)
    return res


# ---------------------------------------------------------------------------------------- redis_away
async def redis_away(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 100,
    clusters: int = 2,
    concurrency: int = 8,
    spread_s: float = 20.0,
    at: float = 0.3,
    away_s: float = 10.0,
    seed: int = 12,
) -> Result:
    """Redis stopped for `away_s` during a stream of schedule requests, then started again."""
    res = Result("redis_away", {"requests": requests, "away_s": away_s})
    with timed(res):
        server = PrivateRedis(log_dir / "redis", aof=True)
        try:
            await server.start()
            settings = experiment_settings(base, "redis-away", redis_url=server.url, readiness_interval_s=0.5)
            tag = run_tag("ra")
            async with staged(
                settings, log_dir, ("state-tracker",), tag=tag, clusters=clusters, hosts=4, mem_mb=HOST_MEM_MB
            ) as st:
                await _one_by_one(st.stack, "filter-worker", "weigher", "selector", "selector")
                outcomes = st.requests(random.Random(seed), requests)
                outage = asyncio.create_task(_redis_outage(res, server, st, outcomes, at, away_s))
                await drive(st.client, outcomes, concurrency, call_timeout=5.0, give_up_after=90.0, spread_s=spread_s)
                await outage
            _stream_figures(res, outcomes)
        finally:
            await server.kill()
        res.check("lost", "==", 0)
        res.check("internal_errors", "==", 0)
        res.check("consumers_while_away", "==", 0)
        res.check_timing("recovery_s", "<=", 5.0, short_bound=30.0)
    return res


async def _redis_outage(
    res: Result, server: PrivateRedis, st: Stage, outcomes: list[Outcome], at: float, away_s: float
) -> None:
    """Stop Redis once the stream is `at` through; count the selectors' consumers while it is away;
    start it again, report the clusters again, and time until a fresh request is placed."""
    while sum(o.decision is not None for o in outcomes) < at * len(outcomes):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await server.stop()
    stopped = time.monotonic()
    await asyncio.sleep(min(away_s, 3.0))  # each service notices within its readiness interval
    res.figures["consumers_while_away"] = await st.stack.consumers("selector")
    await asyncio.sleep(max(0.0, away_s - (time.monotonic() - stopped)))
    # A restarted Redis is a new server run: vmsched cannot know it lost nothing, so it asks the
    # engine for a full report of each cluster; this engine answers as the contract says.
    answering = asyncio.create_task(_answer_resyncs(st))
    await asyncio.sleep(0.2)  # subscribed before anything is asked
    await server.start()
    started = time.monotonic()
    try:
        res.figures["recovery_s"] = round(await _placed_after(st, f"{st.tag}-c0", started), 3)
    finally:
        answering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await answering


async def _answer_resyncs(st: Stage) -> None:
    """The engine's full report of each of its clusters vmsched asks for: the cluster and its hosts
    (this stream starts none of its VMs, so none hold resources), then resync_complete."""
    async for asked in st.client.resync_requests("*"):
        hosts = [h for h in st.hosts if h.cluster_id == asked.cluster_id]
        if not hosts:
            continue
        await st.client.report_cluster(ClusterReport(cluster_id=asked.cluster_id))
        for h in hosts:
            await st.client.report_host(host_report(h))
        await st.client.resync_complete(asked.cluster_id, asked.generation, hosts=len(hosts), vms=0)


__all__ = ["postgres_away", "redis_away"]
