"""`vmsched bench --suite`: one table of workloads in the shape of kube-scheduler's scheduler_perf.

Every workload runs against the same services, each in its own process as deployed (state-tracker,
filter-worker, weigher, selector), on clusters reported once at the start; the engine (this
process) reports each placed VM running, as a real one does. Per workload: decisions answered
(placed, unplaceable, errors), decisions per second, latency p50/p99, and the CPU every process
spent per decision (the services, RabbitMQ and Redis when they run here, the engine). The floors
under every decision (one bus hop, one Redis lock cycle) come first.

The workloads (H = --hosts, N = --requests):

* basic: one cluster of H hosts, N decisions, 32 in flight (scheduler_perf's SchedulingBasic);
* spread: N decisions over 10 clusters of H hosts, 64 in flight;
* churn: as basic while the engine reports host changes (a tenth of the hosts a second);
* unschedulable: as basic with one request in ten asking for more memory than any host has;
* sequential: one at a time on one cluster of H hosts (latency without queueing);
* big: one at a time on one cluster of 10 x H hosts (at most 10,000);
* burst: 1,000 requests (N when smaller) sent at once over the 10 clusters.

A request that is neither answered nor expected (an error, a timeout, an unschedulable one placed)
counts in `unexpected`: the figures of a run with any are not the scheduler's. Speed is never
asserted (tests/e2e/test_bench.py runs it tiny and checks the counts only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vmsched.client import ReportBatcher, SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, HostReport, VmReport
from vmsched.db import migrate
from vmsched.errors import InvalidRequest
from vmsched.settings import Settings
from vmsched_services.tools.bench.data import host_reports, vm_spec
from vmsched_services.tools.bench.floors import bench_hop, bench_lock
from vmsched_services.tools.bench.timing import costed
from vmsched_services.tools.procs import Supervisor, local_server_pids

#: The clusters the spread and burst workloads share their requests over.
SPREAD_CLUSTERS = 10
#: The burst's size (scheduler_perf's bar is a burst of this order) and the most hosts of "big".
BURST = 1000
BIG_HOSTS_MAX = 10_000
#: Memory no generated host has (the largest has 512 GB): an unschedulable request.
TOO_BIG_MB = 4 * 1024 * 1024
#: How long one request may take before it counts as unexpected (the burst's last ones wait long).
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    clusters: list[str]
    decisions: int
    in_flight: int
    unschedulable_every: int = 0
    churn_share_per_s: float = 0.0


def workloads(hosts: int, requests: int, tag: str) -> tuple[list[Workload], dict[str, int]]:
    """The suite's workloads and the clusters they need (name -> hosts)."""
    one, big = f"suite-{tag}-one", f"suite-{tag}-big"
    spread = [f"suite-{tag}-s{k}" for k in range(SPREAD_CLUSTERS)]
    big_hosts = min(10 * hosts, BIG_HOSTS_MAX)
    clusters = {one: hosts, big: big_hosts, **dict.fromkeys(spread, hosts)}
    sequential = max(1, requests // 2)
    return [
        Workload("basic", f"1 x {hosts} hosts, 32 in flight", [one], requests, 32),
        Workload("spread", f"{SPREAD_CLUSTERS} x {hosts} hosts, 64 in flight", spread, requests, 64),
        Workload("churn", f"basic, {hosts // 10} host reports/s", [one], requests, 32, churn_share_per_s=0.1),
        Workload("unschedulable", "basic, 1 in 10 fits no host", [one], requests, 32, unschedulable_every=10),
        Workload("sequential", f"1 x {hosts} hosts, one at a time", [one], sequential, 1),
        Workload("big", f"1 x {big_hosts} hosts, one at a time", [big], sequential, 1),
        Workload("burst", f"{min(BURST, requests * 5)} at once over {SPREAD_CLUSTERS} x {hosts}", spread, 0, 0),
    ], clusters


class _Engine:
    """The engine's side of a workload: sends each request, reports each placed VM running, and
    counts how every request ended."""

    def __init__(self, client: SchedulerClient, rng: random.Random) -> None:
        self.client = client
        self.rng = rng
        self.counter = 0
        self.starts: list[asyncio.Task[None]] = []
        # As an engine with many VMs starting would: the reports that wait go as one message.
        self.reports = ReportBatcher(client)

    async def one(self, w: Workload, i: int, ended: Counter[str]) -> None:
        cluster = w.clusters[i % len(w.clusters)]
        self.counter += 1
        vm = vm_spec(self.rng, self.counter)
        impossible = w.unschedulable_every > 0 and i % w.unschedulable_every == w.unschedulable_every - 1
        if impossible:
            vm = vm.model_copy(update={"mem_mb": TOO_BIG_MB, "vm_id": f"{vm.vm_id}-too-big"})
        try:
            d = await self.client.schedule(cluster, vm, timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # a timeout or the bus: the figures say how many
            ended[f"unexpected: {type(exc).__name__}"] += 1
            return
        if d.status is DecisionStatus.PLACED and d.host_id is not None and not impossible:
            ended["placed"] += 1
            self.starts.append(asyncio.create_task(self.reports.report(VmReport.running(cluster, d.host_id, vm))))
        elif d.status is DecisionStatus.UNPLACEABLE and impossible:
            ended["unplaceable"] += 1
        else:
            ended[f"unexpected: {d.status.value}"] += 1

    async def churn(self, cluster: str, reports: list[HostReport], per_s: float) -> None:
        """Report host changes (CPU usage moving) at `per_s` a second until cancelled."""
        period = 1.0 / max(per_s, 1e-9)
        while True:
            host = self.rng.choice(reports)
            usage = round(self.rng.uniform(0, 60), 1)
            await self.client.report_host(host.model_copy(update={"cpu_usage_pct": usage}))
            await asyncio.sleep(period)


def chosen(plan: list[Workload], clusters: dict[str, int], only: frozenset[str] | None) -> list[Workload]:
    """The workloads `only` names (all for None), in the suite's order; `clusters` keeps only those
    they use, so the setup reports no cluster that is not used."""
    known = [w.name for w in plan]
    if only is not None:
        unknown = sorted(only - set(known))
        if unknown or not only:
            raise InvalidRequest(
                f"--workloads: unknown {', '.join(unknown) or '(none given)'}; the suite's are {', '.join(known)}"
            )
        plan = [w for w in plan if w.name in only]
    used = {name for w in plan for name in w.clusters}
    for name in [n for n in clusters if n not in used]:
        del clusters[name]
    return plan


async def run_suite(
    settings: Settings, hosts: int, requests: int, seed: int, tag: str, *, only: frozenset[str] | None = None
) -> dict[str, Any]:
    """Every workload (or those `only` names), in order, into one JSON-ready dict."""
    plan, clusters = workloads(hosts, requests, tag)
    plan = chosen(plan, clusters, only)
    rng = random.Random(seed)
    await migrate(settings.postgres_url)
    result: dict[str, Any] = {
        "hosts": hosts,
        "requests": requests,
        "hop": await bench_hop(settings, 300),
        "lock": await bench_lock(settings, 300),
        "workloads": {},
    }
    sup = Supervisor(settings, Path(tempfile.mkdtemp(prefix="vmsched-bench-suite-")))
    try:
        for service in ("state-tracker", "filter-worker", "weigher", "selector"):
            await sup.start(service)
        async with SchedulerClient(settings) as client:
            engine = _Engine(client, rng)
            reported: dict[str, list[HostReport]] = {}
            for name, n in clusters.items():
                reported[name] = host_reports(random.Random(f"{seed}-{name}"), name, n)
                await client.report_cluster(ClusterReport(cluster_id=name))
                for report in reported[name]:
                    await client.report_host(report)
            for name, n in clusters.items():
                await client.wait_for_state(name, hosts=n, timeout=300)
            pids = {f"{name}-{i}": proc.pid for i, (name, proc) in enumerate(sup.procs)}
            pids |= {**local_server_pids(), "bench (the engine)": os.getpid()}
            warm: Counter[str] = Counter()
            for name in clusters:  # caches and connections warm on every cluster
                await engine.one(Workload("warm", "", [name], 1, 1), 0, warm)
            for w in plan:
                result["workloads"][w.name] = await _run(engine, w, pids, reported, requests)
            await asyncio.gather(*engine.starts)
        return result
    finally:
        sup.stop_all()


async def _run(
    engine: _Engine, w: Workload, pids: dict[str, int], reported: dict[str, list[HostReport]], requests: int
) -> dict[str, Any]:
    ended: Counter[str] = Counter()
    decisions, in_flight = w.decisions, w.in_flight
    if w.name == "burst":
        decisions = in_flight = min(BURST, requests * 5)
    churn = None
    if w.churn_share_per_s:
        cluster = w.clusters[0]
        rate = w.churn_share_per_s * len(reported[cluster])
        churn = asyncio.create_task(engine.churn(cluster, reported[cluster], rate))
    try:

        async def one(i: int) -> None:
            await engine.one(w, i, ended)

        stats = await costed(pids, decisions, in_flight, one)
    finally:
        if churn is not None:
            churn.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await churn
    cpu = stats["cpu_ms_per_decision"]
    return {
        **asdict(w),
        "decisions": decisions,
        "in_flight": in_flight,
        **stats,
        "cpu_ms_total": round(sum(cpu.values()), 2),
        "ended": dict(ended),
        "unexpected": sum(n for k, n in ended.items() if k.startswith("unexpected")),
    }


def render_suite(result: dict[str, Any]) -> str:
    """The table as a human reads it."""
    hop, lock = result["hop"], result["lock"]
    lines = [
        f"vmsched bench --suite: {result['hosts']} hosts per cluster, {result['requests']} requests per workload",
        f"floors: one bus hop p50 {hop['p50_ms']} ms, p99 {hop['p99_ms']} ms; Redis lock cycle p50 {lock['p50_ms']} ms",
        "",
        f"{'workload':<14}{'what':<42}{'answered':>9}{'dec/s':>9}{'p50 ms':>10}{'p99 ms':>10}{'CPU ms':>8}",
    ]
    for name, w in result["workloads"].items():
        answered = sum(w["ended"].values()) - w["unexpected"]
        lines.append(
            f"{name:<14}{w['what']:<42}{answered:>9}{w['decisions_per_s']:>9}{w['p50_ms']:>10}{w['p99_ms']:>10}"
            f"{w['cpu_ms_total']:>8}"
        )
    lines += ["", "CPU ms per decision, by process:"]
    for name, w in result["workloads"].items():
        parts = ", ".join(f"{k} {v}" for k, v in w["cpu_ms_per_decision"].items())
        lines.append(f"  {name:<14}{parts}")
    bad = {name: w["ended"] for name, w in result["workloads"].items() if w["unexpected"]}
    if bad:
        lines += ["", "NOT ANSWERED AS EXPECTED (these figures are not the scheduler's):"]
        lines += [f"  {name}: {ended}" for name, ended in bad.items()]
    return "\n".join(lines)


__all__ = ["BURST", "Workload", "render_suite", "run_suite", "workloads"]
