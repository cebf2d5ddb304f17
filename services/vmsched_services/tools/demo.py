"""`vmsched demo`: a simulated datacenter, end to end over the real bus.

Several clusters register their hosts through state reports, hundreds of VMs are scheduled at once,
each placed VM is "started" (reported RUNNING on its host, which clears its pending record), and
the summary says how it went: placed, unplaceable (and why), decisions per second, latency, and how
many hosts ended over-committed, counted from the demo's own record of where it started VMs, not
from vmsched's state, so the check is independent of the code it checks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterReport,
    DecisionStatus,
    HaAlert,
    HostReport,
    HostStatus,
    Message,
    MigrationDecision,
    ScheduleDecision,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.settings import Settings
from vmsched.store import Keys
from vmsched.store.redis import connect
from vmsched_services import BUS_ONLY, SERVICES
from vmsched_services.runner import run
from vmsched_services.tools.stats import percentile

M = TypeVar("M", bound=Message)


@dataclass
class SimHost:
    cluster_id: str
    host_id: str
    cores: int
    mem_mb: int
    reserved_mb: int
    overcommit_pct: int
    networks: list[str]
    status: HostStatus
    placed_mem_mb: int = 0  # what the demo itself started here (memory + overhead)

    @property
    def max_scheduling_mb(self) -> float:
        return self.mem_mb * self.overcommit_pct / 100 - self.reserved_mb


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    unplaceable_by_filter: Counter[str] = field(default_factory=Counter)
    example_unplaceable: dict[str, str] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)


def build_datacenter(rng: random.Random, tag: str, clusters: int, hosts: int) -> dict[str, list[SimHost]]:
    dc: dict[str, list[SimHost]] = {}
    for ci in range(clusters):
        cid = f"demo-{tag}-c{ci + 1}"
        overcommit = rng.choice([100, 100, 150])
        dc[cid] = [
            SimHost(
                cluster_id=cid,
                host_id=f"{cid}-h{hi + 1:03d}",
                cores=rng.choice([16, 24, 32, 48]),
                mem_mb=rng.choice([65536, 131072, 262144]),
                reserved_mb=321,
                overcommit_pct=overcommit,
                networks=["ovirtmgmt", "vmnet"] + (["storage"] if rng.random() < 0.6 else []),
                status=HostStatus.MAINTENANCE if rng.random() < 0.05 else HostStatus.UP,
            )
            for hi in range(hosts)
        ]
    return dc


def random_vm(rng: random.Random, i: int, tag: str) -> VmSpec:
    mem = rng.choices([1024, 2048, 4096, 8192, 16384, 32768, 65536], [10, 20, 25, 20, 12, 8, 5])[0]
    if rng.random() < 0.02:
        mem = 400_000  # larger than any host: unplaceable on memory
    networks = ["vmnet"]
    if rng.random() < 0.3:
        networks.append("storage")
    if rng.random() < 0.02:
        networks.append("backup")  # no host has it: unplaceable on network
    return VmSpec(
        vm_id=f"demo-{tag}-vm{i:05d}",
        mem_mb=mem,
        vcpus=rng.choice([1, 2, 2, 4, 4, 8, 16]),
        networks=networks,
        ha=rng.random() < 0.2,
    )


def _progress(done: int, total: int, placed: int, unplaceable: int, started: float) -> None:
    # A terminal gets a live bar; a log file gets a line every tenth of the way, not one per decision.
    tty = sys.stderr.isatty()
    if not tty and done != total and done % max(1, total // 10):
        return
    width = 32
    filled = int(width * done / max(total, 1))
    rate = done / max(time.perf_counter() - started, 1e-9)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  placed {placed}  "
        f"unplaceable {unplaceable}  {rate:6.1f} decisions/s" + ("" if tty else "\n")
    )
    sys.stderr.flush()


@dataclass
class Run:
    """One demo run: the datacenter, what the demo itself placed and started, and the tally."""

    client: SchedulerClient
    settings: Settings
    rng: random.Random
    dc: dict[str, list[SimHost]]
    json_output: bool
    tally: Tally = field(default_factory=Tally)
    starts: list[asyncio.Task[None]] = field(default_factory=list)
    placed_per_cluster: Counter[str] = field(default_factory=Counter)
    placements: dict[str, tuple[str, str, VmSpec]] = field(default_factory=dict)
    done: int = 0
    by_host: dict[str, SimHost] = field(init=False)

    def __post_init__(self) -> None:
        self.by_host = {h.host_id: h for hosts in self.dc.values() for h in hosts}

    async def report_datacenter(self) -> None:
        """Every cluster and host reported, then waited for until the state tracker knows them all."""
        for cid, hosts in self.dc.items():
            await self.client.report_cluster(
                ClusterReport(cluster_id=cid, memory_overcommit_pct=hosts[0].overcommit_pct)
            )
            for h in hosts:
                cpu = round(self.rng.uniform(3, 35), 1)
                await self.client.report_host(_report(h, cpu, datetime.now(UTC), is_spm=h is hosts[0]))
        for cid, hosts in self.dc.items():
            await self.client.wait_for_state(cid, hosts=len(hosts))

    async def schedule_all(self, work: list[tuple[str, VmSpec]], concurrency: int) -> float:
        """Schedule every request, `concurrency` at a time; returns the wall time in seconds."""
        gate = asyncio.Semaphore(concurrency)
        began = time.perf_counter()

        async def one(cid: str, vm: VmSpec) -> None:
            async with gate:
                t0 = time.perf_counter()
                try:
                    d = await self.client.schedule(cid, vm, explain_scores=False, timeout=30)
                except Exception as exc:  # an RPC failure is a result to report, not a crash
                    self.tally.errors[type(exc).__name__] += 1
                    self.tally.statuses["rpc_error"] += 1
                    d = None
                else:
                    self.tally.latencies_ms.append((time.perf_counter() - t0) * 1000)
            if d is not None:
                self.record(cid, vm, d)
            self.done += 1
            if not self.json_output:
                placed, unplaceable = self.tally.statuses["placed"], self.tally.statuses["unplaceable"]
                _progress(self.done, len(work), placed, unplaceable, began)

        await asyncio.gather(*(one(cid, vm) for cid, vm in work))
        wall = time.perf_counter() - began
        if not self.json_output and sys.stderr.isatty():
            sys.stderr.write("\n")
        await asyncio.gather(*self.starts)
        return wall

    def record(self, cid: str, vm: VmSpec, d: ScheduleDecision) -> None:
        """Count a decision; a placed VM is remembered on its host and started, as an engine would."""
        self.tally.statuses[d.status.value] += 1
        if d.status is DecisionStatus.PLACED and d.host_id is not None:
            self.by_host[d.host_id].placed_mem_mb += vm.mem_mb + vm.overhead_mb
            self.placements[vm.vm_id] = (cid, d.host_id, vm)
            self.placed_per_cluster[cid] += 1
            self.starts.append(asyncio.create_task(self.start_vm(vm, cid, d.host_id)))
        elif d.status is DecisionStatus.UNPLACEABLE:
            for f in {f.filter for f in d.explanation.filtered}:
                self.tally.unplaceable_by_filter[f] += 1
                self.tally.example_unplaceable.setdefault(f, d.explanation.summary)
        elif d.error is not None:
            self.tally.errors[d.error.code] += 1

    async def start_vm(self, vm: VmSpec, cluster: str, host: str) -> None:
        # The engine starts the VM; it reports running a little later.
        await asyncio.sleep(self.rng.uniform(0.01, 0.1))
        await self.client.report_vm(_running(vm, cluster, host, self.rng, mem_usage_pct=None))

    async def tracker_committed(self) -> dict[str, int]:
        """Memory committed per host as the state tracker sees it, once it has caught up with the starts."""
        committed: dict[str, int] = {}
        for cid in self.dc:
            deadline = time.monotonic() + 20
            while True:
                state = await self.client.state(cid)
                if len(state.vms) >= self.placed_per_cluster[cid] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            committed.update({h.report.host_id: h.mem_committed_mb for h in state.hosts})
        return committed

    def summary(self, args: argparse.Namespace, wall: float, tracker_committed: dict[str, int]) -> dict[str, Any]:
        by_host = self.by_host
        tally = self.tally
        over = [h.host_id for h in by_host.values() if h.placed_mem_mb > h.max_scheduling_mb]
        tracker_over = [hid for hid, mem in tracker_committed.items() if mem > by_host[hid].max_scheduling_mb]
        used = [h for h in by_host.values() if h.placed_mem_mb > 0]
        return {
            "clusters": len(self.dc),
            "hosts": len(by_host),
            "requests": args.requests,
            "placed": tally.statuses["placed"],
            "unplaceable": tally.statuses["unplaceable"],
            "unplaceable_reasons": dict(tally.unplaceable_by_filter.most_common()),
            "unplaceable_examples": tally.example_unplaceable,
            "errors": dict(tally.errors),
            "expired": tally.statuses["expired"],
            "decisions_per_second": round(len(tally.latencies_ms) / wall, 1) if wall else 0.0,
            "latency_ms_p50": round(percentile(tally.latencies_ms, 50), 2),
            "latency_ms_p99": round(percentile(tally.latencies_ms, 99), 2),
            "hosts_used": len(used),
            "over_committed_hosts": len(over),
            "over_committed_hosts_per_state_tracker": len(tracker_over),
            "concurrency": args.concurrency,
            "services": "external" if args.external else "in-process (vmsched up)",
        }


async def _start_services(settings: Settings, stop: asyncio.Event) -> asyncio.Task[None]:
    """Every service in this process, with short balancing and HA cycles so those phases show within seconds."""
    ready = asyncio.Event()
    quiet = settings.model_copy(
        update={
            # The services share the demo's terminal: their warnings (the HA alert the demo provokes)
            # as readable lines, not JSON.
            "log_level": "WARNING",
            "log_format": "console",
            "balance_interval_s": 1.0,
            "lease_ttl_s": 0.6,
            "ha_interval_s": 1.0,
        }
    )
    # Not the api: the demo talks over the bus, and a port of its own could clash with a running api.
    names = [n for n in SERVICES if n not in BUS_ONLY]
    services = asyncio.create_task(run(names, quiet, stop=stop, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({services, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if services.done():
        waiter.cancel()
        services.result()  # raises why the services could not start
    return services


async def run_demo(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tag = uuid.uuid4().hex[:6]
    stop = asyncio.Event()
    if not args.external:
        await migrate(settings.postgres_url)  # the selector reads policies; idempotent
    services = None if args.external else await _start_services(settings, stop)
    dc = build_datacenter(rng, tag, args.clusters, args.hosts)
    try:
        async with SchedulerClient(settings) as client:
            demo = Run(client, settings, rng, dc, json_output=args.json)
            await demo.report_datacenter()
            clusters = list(dc)
            work = [(rng.choice(clusters), random_vm(rng, i, tag)) for i in range(args.requests)]
            wall = await demo.schedule_all(work, args.concurrency)
            committed = await demo.tracker_committed()
            drift = alert = None
            if not args.external:
                drift = await drift_phase(demo, dc[clusters[0]])
                alert = await ha_phase(demo, dc[clusters[-1]])
                if drift is not None:
                    # the migration moved memory between hosts: read the tracker's view again
                    state = await client.state(drift["cluster"])
                    committed.update({h.report.host_id: h.mem_committed_mb for h in state.hosts})
    finally:
        stop.set()
        if services is not None:
            await services
        if not args.keep:
            await forget_clusters(settings, list(dc))
    return demo.summary(args, wall, committed) | {"balancer_migration": drift, "ha_alert": alert}


def _report(
    h: SimHost, cpu: float, at: datetime, mem_free_mb: int | None = None, *, is_spm: bool = False
) -> HostReport:
    return HostReport(
        cluster_id=h.cluster_id,
        host_id=h.host_id,
        status=h.status,
        cpu_cores=h.cores,
        cpu_threads=h.cores * 2,
        cpu_usage_pct=cpu,
        physical_mem_mb=h.mem_mb,
        mem_free_mb=h.mem_mb - 2048 if mem_free_mb is None else mem_free_mb,
        reserved_mem_mb=h.reserved_mb,
        networks=h.networks,
        is_spm=is_spm,
        reported_at=at,
    )


def _running(vm: VmSpec, cluster: str, host: str, rng: random.Random, *, mem_usage_pct: float | None) -> VmReport:
    """The engine's report of a VM running on a host."""
    return VmReport(
        cluster_id=cluster,
        vm_id=vm.vm_id,
        status=VmStatus.RUNNING,
        host_id=host,
        mem_mb=vm.mem_mb,
        overhead_mb=vm.overhead_mb,
        vcpus=vm.vcpus,
        ha=vm.ha,
        cpu_usage_pct=round(rng.uniform(1, 60), 1),
        mem_usage_pct=round(rng.uniform(30, 90), 1) if mem_usage_pct is None else mem_usage_pct,
    )


async def _set_policy(demo: Run, cluster: str, policy: str | None, **kw: Any) -> None:
    pool = await connect_pg(demo.settings.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(cluster, policy, **kw)
    finally:
        await pool.close()
    await demo.client.policy_changed(cluster_id=cluster)


async def _first_event(
    demo: Run, key: str, model: type[M], trigger: Callable[[], Awaitable[None]], timeout: float = 15
) -> M | None:
    """Subscribe to `key`, run `trigger`, and return the first event (None if none came in time)."""
    got: asyncio.Queue[M] = asyncio.Queue()
    sub = await demo.client.bus.subscribe([key], [model], got.put)
    try:
        await trigger()
        try:
            return await asyncio.wait_for(got.get(), timeout)
        except TimeoutError:
            return None
    finally:
        await sub.cancel()


async def drift_phase(demo: Run, hosts: list[SimHost]) -> dict[str, Any] | None:
    """A host runs hot for a while; the balancer migrates a VM off it; the engine carries it out."""
    cluster = hosts[0].cluster_id
    on_host = Counter(h for cid, h, _ in demo.placements.values() if cid == cluster)
    if not on_host:
        return None
    by_host = demo.by_host
    hot = by_host[on_host.most_common(1)[0][0]]
    await _set_policy(demo, cluster, "evenly_distributed", properties={"CpuOverCommitDurationMinutes": "1"})

    async def run_hot() -> None:
        now = datetime.now(UTC)
        for ago in (100, 70, 40, 10):
            await demo.client.report_host(_report(hot, 95.0, now - timedelta(seconds=ago)))

    m = await _first_event(demo, c.migration_key(cluster), MigrationDecision, run_hot)
    if m is None:
        return None
    _, _, vm = demo.placements[m.vm_id]
    await demo.client.report_vm(_running(vm, cluster, m.target_host, demo.rng, mem_usage_pct=50.0))
    need = vm.mem_mb + vm.overhead_mb
    by_host[m.source_host].placed_mem_mb -= need
    by_host[m.target_host].placed_mem_mb += need
    await demo.client.report_host(_report(hot, 40.0, datetime.now(UTC)))
    return {"cluster": cluster, "vm": m.vm_id, "from": m.source_host, "to": m.target_host, "reason": m.reason}


async def ha_phase(demo: Run, hosts: list[SimHost]) -> dict[str, Any] | None:
    """HA reservation on, then memory pressure everywhere: the HA monitor raises its alert."""
    cluster = hosts[0].cluster_id
    await _set_policy(demo, cluster, None, ha_reservation=True)

    async def squeeze() -> None:
        now = datetime.now(UTC)
        for h in hosts:
            await demo.client.report_host(_report(h, 30.0, now, mem_free_mb=512))

    alert = await _first_event(demo, c.ha_alert_key(cluster), HaAlert, squeeze)
    if alert is None:
        return None
    return {"cluster": cluster, "failing_hosts": len(alert.failing_hosts), "message": alert.message[:160]}


async def forget_clusters(settings: Settings, clusters: list[str]) -> None:
    """Remove the demo's clusters from Redis, so state trackers do not load them forever after."""

    keys = Keys.from_settings(settings)
    redis = connect(settings)
    try:
        for cid in clusters:
            await redis.delete(*keys.of_cluster(cid))
            for pattern in keys.cluster_patterns(cid):
                async for key in redis.scan_iter(match=pattern, count=1000):
                    await redis.delete(key)
            await redis.srem(keys.clusters(), cid)
    finally:
        await redis.aclose()


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"vmsched demo: {summary['clusters']} clusters, {summary['hosts']} hosts, {summary['requests']} requests "
        f"({summary['concurrency']} at a time, services {summary['services']})",
        f"  placed               {summary['placed']}",
        f"  unplaceable          {summary['unplaceable']}",
    ]
    for f, n in summary["unplaceable_reasons"].items():
        lines.append(f"    {n:>4} requests had hosts removed by {f}, e.g. {summary['unplaceable_examples'][f]}")
    if summary["errors"]:
        lines.append(f"  errors               {summary['errors']}")
    lines += [
        f"  decisions per second {summary['decisions_per_second']}",
        f"  latency p50 / p99    {summary['latency_ms_p50']} ms / {summary['latency_ms_p99']} ms",
        f"  hosts used           {summary['hosts_used']}",
        f"  over-committed hosts {summary['over_committed_hosts']} (state tracker's view: "
        f"{summary['over_committed_hosts_per_state_tracker']})",
    ]
    m = summary.get("balancer_migration")
    if m:
        lines.append(f"  load drift           balancer moved {m['vm']} {m['from']} -> {m['to']}: {m['reason']}")
    a = summary.get("ha_alert")
    if a:
        lines.append(f"  HA reservation       alert for {a['failing_hosts']} host(s): {a['message']}")
    if not summary["services"].startswith("external") and (not m or not a):
        lines.append("  (drift or HA phase saw no event in time)")
    return "\n".join(lines)


def main(args: argparse.Namespace, settings: Settings) -> int:
    summary = asyncio.run(run_demo(args, settings))
    print(json.dumps(summary) if args.json else render(summary))
    ok = summary["over_committed_hosts"] == 0 and summary["over_committed_hosts_per_state_tracker"] == 0
    return 0 if ok and not summary["errors"] else 1


__all__ = ["main", "run_demo"]
