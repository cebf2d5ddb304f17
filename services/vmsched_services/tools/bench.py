"""`vmsched bench`: what a decision costs, at 100 and 1,000 hosts per cluster.

Three measurements per cluster size, written as JSON (bench-results/bench.json by default):

* in_process: the same pipeline (candidates, filter chain, weights, RankSelector, summary) called
  directly on a HostTable: the floor any deployment pays.
* bus: full decisions through RabbitMQ with every service in its own process, as deployed
  (state-tracker, filter-worker, weigher, selector), Redis lock + pending + idempotency, and the
  engine reporting each placed VM running (so caches really move). Once one request at a time
  (latency), once `--concurrency` at a time (throughput), and with `--clusters N` that many at a
  time spread over N clusters; after a warm-up that touches every cluster (steady state). Each run
  also says how much CPU every process spent per decision: the services, the bench itself (the
  engine) and RabbitMQ and Redis when they run on this machine.
* costs: one RPC round trip with an empty handler (the price of a bus hop), and encode + decode
  of every message on the hot path at that size (the price of serialization).
* balance_pass: one balancer pass per balance unit (table building + the unit), in process, on a
  cluster of 10x the largest `--hosts` size (10,000 hosts by default, and at most) with 20 VMs per
  host.

It is a benchmark, not a test: numbers depend on the machine; nothing asserts on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from vmsched.bus import connect as connect_bus
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterReport,
    ClusterState,
    Explanation,
    FilteredHost,
    FilterReply,
    FilterRequest,
    HostReport,
    HostState,
    HostStatus,
    Message,
    PendingEntry,
    PlaceItem,
    Placement,
    PlaceOutcome,
    PlaceReply,
    PlaceRequest,
    PlaceResult,
    ScheduleDecision,
    ScheduleRequest,
    ScoreTable,
    StateRequest,
    UnitScores,
    VmReport,
    VmSpec,
    VmStatus,
    WeighReply,
    WeighRequest,
)
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.errors import VmschedError
from vmsched.logging import configure
from vmsched.scheduling.ha import check, naive_failing_hosts
from vmsched.scheduling.host_aggregates import aggregate_host
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import LocalSteps, Placed, pending_entry, place, top_hosts
from vmsched.scheduling.policy import DEFAULT_POLICY, FilterSequence, Policy, PolicyFilter, PolicyWeight
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.scheduling.units import BUILTIN_UNITS, validate_properties
from vmsched.scheduling.units.base import BalanceFn, BalanceOutcome
from vmsched.settings import Settings
from vmsched.store import ClusterLock
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.procs import Supervisor, cpu_ms, local_server_pids, rss_mb
from vmsched_services.tools.stats import percentile


def _hosts(rng: random.Random, cluster: str, n: int) -> list[HostReport]:
    return [
        HostReport(
            cluster_id=cluster,
            host_id=f"{cluster}-h{i:05d}",
            status=HostStatus.UP,
            cpu_cores=rng.choice([16, 32, 64]),
            cpu_threads=128,
            cpu_usage_pct=round(rng.uniform(0, 60), 1),
            physical_mem_mb=rng.choice([131072, 262144, 524288]),
            mem_free_mb=rng.choice([65536, 131072]),
            networks=["ovirtmgmt", "vmnet"] + (["storage"] if rng.random() < 0.8 else []),
            disk_total_mb=2_000_000,
            disk_free_mb=1_000_000,
            reported_at=datetime.now(UTC),
        )
        for i in range(n)
    ]


def catalogue_policy() -> Policy:
    """Every built-in filter and weight unit, factor 1: what the whole catalogue costs (plugins
    installed here are left out, so the numbers compare across installations).

    ClusterInMaintenance is left out: it is a mode (only HA VMs start), not a constraint a
    policy combines with others, and it would stop every bench VM.
    """

    return Policy(
        id=uuid.uuid5(uuid.NAMESPACE_URL, "vmsched:bench-catalogue"),
        name="bench-catalogue",
        filters=tuple(
            PolicyFilter(unit=u.name, sequence=FilterSequence.FIRST if u.name == "Migration" else FilterSequence.NONE)
            for u in BUILTIN_UNITS
            if u.filter is not None and u.name != "ClusterInMaintenance"
        ),
        weights=tuple(PolicyWeight(unit=u.name) for u in BUILTIN_UNITS if u.weight is not None),
    )


def _policies() -> dict[str, Policy]:
    return {"none": DEFAULT_POLICY, "catalogue": catalogue_policy()}


def _vm(rng: random.Random, i: int) -> VmSpec:
    return VmSpec(
        vm_id=f"bench-vm{i:06d}",
        mem_mb=rng.choice([1024, 2048, 4096]),
        vcpus=rng.choice([1, 2, 4]),
        networks=["vmnet", "storage"] if rng.random() < 0.5 else ["vmnet"],
    )


def _stats(latencies_s: list[float], wall_s: float) -> dict[str, float]:
    ms = [x * 1000 for x in latencies_s]
    return {
        "decisions": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else 0.0,
        "decisions_per_s": round(len(ms) / wall_s, 1) if wall_s else 0.0,
    }


# ---------------------------------------------------------------------------- in process
async def bench_in_process(
    n_hosts: int, decisions: int, seed: int, policy: Policy = DEFAULT_POLICY
) -> dict[str, float]:
    """The selector's decision path without the bus: the same placement function (scheduling.place)
    with local filter and weigh steps, over one cluster's HostTable."""
    rng = random.Random(seed)
    reports = _hosts(rng, "inproc", n_hosts)
    table = HostTable.from_states([HostState(report=r) for r in reports], ClusterReport(cluster_id="inproc"))
    vms = [_vm(rng, i) for i in range(decisions)]

    def pending_for(vm: VmSpec, host_id: str) -> PendingEntry:
        return pending_entry(vm, host_id, request_id=uuid.uuid4(), fencing_token=1, expires_at=time.time() + 60)

    async def run() -> tuple[list[float], int]:
        lat: list[float] = []
        placed = 0
        for vm in vms:
            t0 = time.perf_counter()
            req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="inproc", vm=vm)
            # As the selector asks the workers by default: rank in the filter step, best 1 + alternates only.
            steps = LocalSteps.of(table, policy, now=time.time(), weigh_in_filter=True, top=top_hosts(req))
            outcome = await place(
                req,
                policy.filter_names(),
                candidate_hosts(table, req.whitelist, req.blacklist).ids,
                [],
                filter_fn=steps.filter,
                weigh_fn=steps.weigh,
                pending_for=pending_for,
                may_wait=False,
            )
            placed += isinstance(outcome, Placed)
            lat.append(time.perf_counter() - t0)
        return lat, placed

    began = time.perf_counter()
    lat, placed = await run()
    if placed < len(vms):
        raise RuntimeError(f"policy {policy.name}: only {placed}/{len(vms)} bench VMs fit; the bench data is wrong")
    return _stats(lat, time.perf_counter() - began)


# ---------------------------------------------------------------------------- serialization
#: The largest cluster the balance pass is measured on.
BALANCE_HOSTS_MAX = 10_000

_SUMMARY = "765/1000 hosts available: 221 Network (missing network 'storage'), 14 Memory (insufficient free memory)"


def _roundtrip_us(msg: Message, repeat: int) -> dict[str, float]:
    model = type(msg)
    body = msg.__pydantic_serializer__.to_json(msg)
    t0 = time.perf_counter()
    for _ in range(repeat):
        msg.__pydantic_serializer__.to_json(msg)
    enc = (time.perf_counter() - t0) / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        model.model_validate_json(body)
    dec = (time.perf_counter() - t0) / repeat
    return {"bytes": len(body), "encode_us": round(enc * 1e6, 1), "decode_us": round(dec * 1e6, 1)}


def bench_codec(n_hosts: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    ids = [h.host_id for h in _hosts(rng, "codec", n_hosts)]
    vm = _vm(rng, 0)
    rid = uuid.uuid4()
    filters, weights = DEFAULT_POLICY.filter_calls(), DEFAULT_POLICY.weight_calls()
    removed = [FilteredHost(host_id=h, filter="Memory", reason="free memory 487 MB < required 1088 MB") for h in ids]
    repeat = max(5, 20_000 // n_hosts)
    decision = ScheduleDecision(
        request_id=rid,
        cluster_id="codec",
        vm_id=vm.vm_id,
        status="placed",
        host_id=ids[0],
        alternates=ids[1:4],
        explanation=Explanation(summary="x", candidates=n_hosts, filtered=removed[: n_hosts // 2]),
        decided_at=datetime.now(UTC),
    )
    group = [ScheduleRequest(request_id=uuid.uuid4(), cluster_id="codec", vm=_vm(rng, k)) for k in range(8)]
    pending = [
        pending_entry(_vm(rng, 100 + k), ids[k % n_hosts], request_id=rid, fencing_token=1, expires_at=1e12)
        for k in range(32)
    ]
    placed = [
        PlaceResult(
            request_id=r.request_id,
            outcome=PlaceOutcome.PLACED,
            placements=[Placement(vm_id=r.vm.vm_id, host_id=ids[0], alternates=ids[1:4], summary=_SUMMARY)],
            explanation=Explanation(summary=_SUMMARY, candidates=n_hosts, filters=[f.unit for f in filters]),
        )
        for r in group
    ]
    return {
        "PlaceRequest(8 requests, 32 pending)": _roundtrip_us(
            PlaceRequest(
                request_id=rid,
                cluster_id="codec",
                state_version=1,
                items=[PlaceItem(request=r) for r in group],
                filters=filters,
                weights=weights,
                pending=pending,
            ),
            repeat,
        ),
        "PlaceReply(8 placed)": _roundtrip_us(PlaceReply(request_id=rid, state_version=1, results=placed), repeat),
        "ScheduleDecision(placed)": _roundtrip_us(
            decision.model_copy(update={"explanation": placed[0].explanation}), repeat
        ),
        "FilterRequest": _roundtrip_us(
            FilterRequest(request_id=rid, cluster_id="codec", state_version=1, vm=vm, candidates=ids, filters=filters),
            repeat,
        ),
        "FilterReply(all survive)": _roundtrip_us(FilterReply(request_id=rid, survivors=ids, removed=[]), repeat),
        "FilterReply(all removed)": _roundtrip_us(FilterReply(request_id=rid, survivors=[], removed=removed), repeat),
        "WeighRequest": _roundtrip_us(
            WeighRequest(request_id=rid, cluster_id="codec", state_version=1, vm=vm, hosts=ids, weights=weights),
            repeat,
        ),
        "WeighReply(best 4)": _roundtrip_us(
            WeighReply(
                request_id=rid, scores=ScoreTable(selector="RankSelector", hosts=ids[:4], units=[], totals=[1.0] * 4)
            ),
            repeat,
        ),
        "WeighReply(with table)": _roundtrip_us(
            WeighReply(
                request_id=rid,
                scores=ScoreTable(
                    selector="RankSelector",
                    hosts=ids,
                    units=[
                        UnitScores(
                            unit=w.unit, factor=w.factor, raw=[rng.random() for _ in ids], points=[1.0] * len(ids)
                        )
                        for w in weights
                    ],
                    totals=[1.0] * len(ids),
                ),
            ),
            repeat,
        ),
        "ScheduleDecision(half filtered, explain_hosts)": _roundtrip_us(decision, repeat),
    }


# ---------------------------------------------------------------------------- HA reservation check
def _ha_cluster(n_hosts: int, n_vms: int, seed: int, *, skew: bool = False) -> tuple[list[HostState], list[VmReport]]:
    rng = random.Random(seed)
    hosts = [
        HostState(
            report=HostReport(
                cluster_id="ha",
                host_id=f"h{i:05d}",
                status=HostStatus.UP,
                cpu_cores=rng.choice([8, 16, 32, 64]),
                physical_mem_mb=262144,
                mem_free_mb=rng.randint(20000, 120000),
                cpu_usage_pct=round(rng.uniform(0, 70), 1),
            )
        )
        for i in range(n_hosts)
    ]
    vms = [
        VmReport(
            cluster_id="ha",
            vm_id=f"vm{j:06d}",
            status=VmStatus.RUNNING,
            host_id=f"h{0 if skew and j % 2 == 0 else rng.randrange(n_hosts):05d}",
            mem_mb=rng.choice([1024, 2048, 4096, 8192]),
            vcpus=rng.choice([1, 2, 4]),
            cpu_usage_pct=round(rng.uniform(0, 100), 1),
            mem_usage_pct=round(rng.uniform(10, 100), 1),
            ha=True,
        )
        for j in range(n_vms)
    ]
    return hosts, vms


def bench_ha(seed: int) -> dict[str, Any]:
    """oVirt's HA reservation check: the fast version at 1,000 hosts / 20,000 HA VMs, and against the naive one."""

    out: dict[str, Any] = {}
    for label, skew in (("spread", False), ("half_on_one_host", True)):
        hosts, vms = _ha_cluster(1000, 20000, seed, skew=skew)
        out[f"fast_1000_hosts_20000_vms_{label}_ms"] = _best_ms(partial(check, hosts, vms))
    hosts, vms = _ha_cluster(200, 4000, seed)
    naive = _seconds(lambda: naive_failing_hosts(hosts, vms))
    fast = _seconds(lambda: check(hosts, vms))
    out["naive_200_hosts_4000_vms_ms"] = round(naive * 1000, 1)
    out["fast_200_hosts_4000_vms_ms"] = round(fast * 1000, 1)
    out["agree_at_200_hosts"] = naive_failing_hosts(hosts, vms) == check(hosts, vms).failing_hosts
    return out


# ---------------------------------------------------------------------------- one balance pass
#: Balance units and the policy properties the bench runs them with: power management and HA
#: reservation on, so those units have something to decide.
_BALANCE_PROPS: dict[str, str] = {
    "EnableAutomaticHostPowerManagement": "true",
    "HostsInReserve": "2",
    HA_RESERVATION_PROPERTY: "true",
}
_BALANCE_NOW = 1_700_000_000.0
#: MaxFreeMemoryForOverUtilized above any bench host's memory: every host short, none a destination.
_NO_FIT_MB = "1000000"


def _balance_cluster(
    n_hosts: int, n_vms: int, seed: int
) -> tuple[list[HostState], list[VmReport], list[PendingEntry], ClusterReport]:
    """A cluster the balance units find work in: 2% of the hosts over HighUtilization (80%) for
    10 minutes, 10% under LowUtilization (20%), a few empty; a fifth of the VMs HA; 1% of the VMs
    pending (placed, not yet running), the rest movable. Every host reports 10 one-minute samples."""
    rng = random.Random(seed)
    vms: list[VmReport] = []
    per_host: list[list[VmReport]] = [[] for _ in range(n_hosts)]
    empty = set(rng.sample(range(n_hosts), min(n_hosts, max(1, n_hosts // 500))))
    occupied = [i for i in range(n_hosts) if i not in empty] or [0]
    for j in range(n_vms):
        i = rng.choice(occupied)
        vm = VmReport(
            cluster_id="balance",
            vm_id=f"vm{j:07d}",
            status=VmStatus.RUNNING,
            host_id=f"h{i:05d}",
            mem_mb=rng.choice([1024, 2048, 4096, 8192]),
            vcpus=rng.choice([1, 2, 4]),
            cpu_usage_pct=round(rng.uniform(0, 100), 1),
            mem_usage_pct=round(rng.uniform(10, 100), 1),
            ha=rng.random() < 0.2,
        )
        vms.append(vm)
        per_host[i].append(vm)
    hosts = []
    for i, on in enumerate(per_host):
        kind = rng.random()
        level = rng.uniform(85, 99) if kind < 0.02 else rng.uniform(2, 18) if kind < 0.12 else rng.uniform(25, 70)
        band = (80.0, 100.0) if kind < 0.02 else (0.0, 19.9) if kind < 0.12 else (0.0, 100.0)
        cpu_samples = [
            (_BALANCE_NOW - 60.0 * (9 - k), round(min(band[1], max(band[0], level + rng.uniform(-5, 5))), 1))
            for k in range(10)
        ]
        report = HostReport(
            cluster_id="balance",
            host_id=f"h{i:05d}",
            status=HostStatus.UP,
            cpu_cores=rng.choice([32, 64, 128]),
            physical_mem_mb=rng.choice([262144, 524288]),
            mem_free_mb=65536,
            cpu_usage_pct=cpu_samples[-1][1],
            is_spm=i == 0,
        )
        # As the state tracker aggregates a host's VMs.
        hosts.append(aggregate_host(report, on, cpu_samples))
    in_flight = rng.sample(vms, n_vms // 100)
    pending = [
        PendingEntry(
            vm_id=v.vm_id,
            host_id=f"h{rng.choice(occupied):05d}",
            mem_mb=v.mem_mb + v.overhead_mb,
            vcpus=v.vcpus,
            request_id=uuid.UUID(int=rng.getrandbits(128)),
            fencing_token=1,
            expires_at=_BALANCE_NOW + 60,
        )
        for v in in_flight
    ]
    flying = {v.vm_id for v in in_flight}
    return hosts, [v for v in vms if v.vm_id not in flying], pending, ClusterReport(cluster_id="balance")


def _balance_table(hosts: list[HostState], settings: ClusterReport, pending: list[PendingEntry]) -> HostTable:
    """The table the balancer builds for a pass: the state's hosts with the pending records folded in."""
    return HostTable.from_states(hosts, settings).with_pending(pending, now=_BALANCE_NOW)


def bench_balance(seed: int, n_hosts: int = 10_000, n_vms: int = 200_000) -> dict[str, Any]:
    """One balancer pass per built-in balance unit, as the balancer runs it (HostTable.from_states +
    with_pending + unit.balance), best of 3, on one cluster built once: as the cluster is, and with
    nothing fitting anywhere (no_fit_ms); with the table alone."""
    hosts, movable, pending, settings = _balance_cluster(n_hosts, n_vms, seed)
    table = partial(_balance_table, hosts, settings, pending)
    units: dict[str, Any] = {}
    for unit in BUILTIN_UNITS:
        if unit.balance is None:
            continue
        props = validate_properties(unit, _BALANCE_PROPS)
        one_pass = partial(_balance_pass, unit.balance, table, movable, props)
        best_ms = _best_ms(one_pass)
        outcome = one_pass()
        # The worst case: every host short of memory, none with room to take a VM: the pass tries
        # every source and finds nothing (units without memory limits decide as above).
        no_fit = validate_properties(unit, {**_BALANCE_PROPS, "MaxFreeMemoryForOverUtilized": _NO_FIT_MB})
        walk = partial(_balance_pass, unit.balance, table, movable, no_fit)
        units[unit.name] = {
            "ms": best_ms,
            "no_fit_ms": _best_ms(walk),
            "migration": None if outcome.migration is None else outcome.migration.vm_id,
            "power": [p.action for p in outcome.power],
        }
    return {
        "hosts": n_hosts,
        "vms": n_vms,
        "movable": len(movable),
        "table_ms": _best_ms(table),
        "units": units,
    }


def _balance_pass(
    balance: BalanceFn, table: Callable[[], HostTable], movable: list[VmReport], props: dict[str, str]
) -> BalanceOutcome:
    return balance(table(), movable, props)


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _best_ms(fn: Callable[[], object], runs: int = 3) -> float:
    """The best of `runs` timings of `fn`, in milliseconds (the least disturbed by the machine)."""
    return round(min(_seconds(fn) for _ in range(runs)) * 1000, 1)


# ---------------------------------------------------------------------------- over the bus
async def _timed(n: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)
    lat: list[float] = []

    async def run(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            await one(i)
            lat.append(time.perf_counter() - t0)

    began = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(n)))
    return _stats(lat, time.perf_counter() - began)


async def _costed(
    pids: dict[str, int], n: int, concurrency: int, one: Callable[[int], Awaitable[None]]
) -> dict[str, Any]:
    """_timed, plus the CPU each process spent per decision (ms): where a decision's work goes,
    the servers' share included, and which process saturates first."""
    before = {name: cpu_ms(pid) for name, pid in pids.items()}
    stats: dict[str, Any] = dict(await _timed(n, concurrency, one))
    spent = {name: cpu_ms(pid) for name, pid in pids.items()}
    stats["cpu_ms_per_decision"] = {
        name: round((after - start) / n, 2)
        for name, after in spent.items()
        if after is not None and (start := before[name]) is not None
    }
    return stats


async def bench_hop(settings: Settings, calls: int) -> dict[str, float]:
    """One RPC round trip to an empty handler in another bus connection: the cost of a hop."""

    server, client = connect_bus(settings, "bench-echo"), connect_bus(settings, "bench-client")
    await server.start()
    await client.start()

    async def echo(req: StateRequest) -> ClusterState:
        return ClusterState(
            cluster_id=req.cluster_id, version=0, settings=ClusterReport(cluster_id="e"), hosts=[], vms=[]
        )

    await server.serve("bench-echo", StateRequest, echo)
    req = StateRequest(cluster_id="e")

    async def one(_: int) -> None:
        await client.call("bench-echo", req, ClusterState)

    try:
        await _timed(20, 1, one)  # warm up
        return await _timed(calls, 1, one)
    finally:
        await client.close()
        await server.close()


async def bench_bus(
    settings: Settings,
    n_hosts: int,
    decisions: int,
    concurrency: int,
    seed: int,
    policy: Policy = DEFAULT_POLICY,
    *,
    clusters: int = 1,
    spread_concurrency: int | None = None,
) -> dict[str, Any]:
    """Decisions over the bus, every service its own process: sequential and `concurrency` at a time
    on one cluster, then (with `clusters` > 1) `spread_concurrency` (default: `concurrency`) at a
    time spread over that many clusters of `n_hosts` each; with the RSS each service ends with."""
    spread_concurrency = spread_concurrency or concurrency

    rng = random.Random(seed)
    await migrate(settings.postgres_url)
    names = [f"bench-{n_hosts}-{policy.name}-{k}" for k in range(max(1, clusters))]
    cluster = names[0]
    pool = await connect_pg(settings.postgres_url)
    repo = PolicyRepository(pool)
    await _attach(repo, names, policy)
    sup = Supervisor(settings, Path(tempfile.mkdtemp(prefix="vmsched-bench-")))
    try:
        for service in ("state-tracker", "filter-worker", "weigher", "selector"):
            await sup.start(service)
        async with SchedulerClient(settings) as client:
            await _report_clusters(client, rng, names, n_hosts)
            starts: list[asyncio.Task[None]] = []
            counter = iter(range(10**9))

            async def one(i: int, spread: bool = False) -> None:
                target = names[i % len(names)] if spread else cluster
                vm = _vm(rng, next(counter))
                d = await client.schedule(target, vm, timeout=60)
                if d.host_id is None:
                    raise RuntimeError(f"bench VM not placed: {d.explanation.summary}")
                # The engine starts it; the state tracker clears its pending record.
                report = VmReport(
                    cluster_id=target,
                    vm_id=vm.vm_id,
                    status=VmStatus.RUNNING,
                    host_id=d.host_id,
                    mem_mb=vm.mem_mb,
                    vcpus=vm.vcpus,
                )
                starts.append(asyncio.create_task(client.report_vm(report)))

            # Warm caches and connections, of every cluster: the runs measure a steady state.
            await _timed(max(10, len(names)), 1, partial(one, spread=True))
            pids = {f"{name}-{i}": proc.pid for i, (name, proc) in enumerate(sup.procs)}
            pids |= {**local_server_pids(), "bench (the engine)": os.getpid()}
            runs = {"sequential": await _costed(pids, decisions // 2, 1, one)}
            runs[f"concurrent_{concurrency}"] = await _costed(pids, decisions, concurrency, one)
            if len(names) > 1:
                spread = await _costed(pids, decisions, spread_concurrency, partial(one, spread=True))
                runs[f"concurrent_{spread_concurrency}_over_{len(names)}_clusters"] = spread
            await asyncio.gather(*starts)
        rss = {f"{name}-{i}": rss_mb(proc.pid) for i, (name, proc) in enumerate(sup.procs)}
        return {**runs, "rss_mb": rss, "logs": str(sup.log_dir)}
    finally:
        sup.stop_all()
        await _detach(repo, names, policy)
        await pool.close()


async def _attach(repo: PolicyRepository, clusters: list[str], policy: Policy) -> None:
    """The bench's clusters run `policy` (a cluster with no link runs the default)."""
    if policy.name == DEFAULT_POLICY.name:
        return
    for name in clusters:
        await repo.clear_cluster(name)
    with contextlib.suppress(VmschedError):
        await repo.delete(policy.id)
    await repo.create(policy)
    for name in clusters:
        await repo.set_cluster_policy(name, policy.id)


async def _detach(repo: PolicyRepository, clusters: list[str], policy: Policy) -> None:
    if policy.name == DEFAULT_POLICY.name:
        return
    for name in clusters:
        await repo.clear_cluster(name)
    await repo.delete(policy.id)


async def _report_clusters(client: SchedulerClient, rng: random.Random, clusters: list[str], n_hosts: int) -> None:
    for name in clusters:
        await client.report_cluster(ClusterReport(cluster_id=name))
        for h in _hosts(rng, name, n_hosts):
            await client.report_host(h)
    for name in clusters:
        await client.wait_for_state(name, hosts=n_hosts, timeout=120)


async def bench_lock(settings: Settings, rounds: int) -> dict[str, float]:
    """Take and release a cluster's lock in Redis, uncontended: the floor under every decision."""
    redis = connect_redis(settings)
    locks = ClusterLock(redis, settings)

    async def one(_: int) -> None:
        async with locks.hold("bench-lock"):
            pass

    try:
        await _timed(20, 1, one)  # warm up
        return await _timed(rounds, 1, one)
    finally:
        await redis.aclose()


async def run_bench(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    settings = settings.model_copy(
        update={
            "amqp_prefix": f"bench-{tag}.",
            "redis_prefix": f"vmsched-bench-{tag}",
            "log_level": "WARNING",
        }
    )
    sizes = [int(x) for x in str(args.hosts).split(",") if x.strip()]
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": _cpus(), "platform": platform.platform()},
        "policy": DEFAULT_POLICY.name,
        "hop": await bench_hop(settings, 300),
        "lock": await bench_lock(settings, 300),
        "ha_check": bench_ha(args.seed),
        "sizes": {},
    }
    # The balance pass at 10x the largest cluster size (10,000 hosts by default), 20 VMs per host,
    # capped at the 10,000 hosts the performance target names (10x of --hosts 10000 would be two
    # million VMs).
    balance_hosts = min(10 * max(sizes, default=100), BALANCE_HOSTS_MAX)
    print(f"bench: balance pass, {balance_hosts} hosts ...", file=sys.stderr)
    result["balance_pass"] = bench_balance(args.seed, balance_hosts, 20 * balance_hosts)
    for n in sizes:
        entry: dict[str, Any] = {"codec": bench_codec(n, args.seed)}
        for name, policy in _policies().items():
            print(f"bench: {n} hosts, policy {name} ...", file=sys.stderr)
            entry[name] = {
                "units": len(policy.filters) + len(policy.weights),
                "in_process": await bench_in_process(n, max(200, args.requests), args.seed, policy),
                "bus": await bench_bus(
                    settings,
                    n,
                    args.requests,
                    args.concurrency,
                    args.seed,
                    policy,
                    clusters=args.clusters,
                    spread_concurrency=args.spread_concurrency,
                ),
            }
            entry[name]["bus_over_in_process"] = round(
                entry[name]["bus"]["sequential"]["p50_ms"] / max(entry[name]["in_process"]["p50_ms"], 1e-9), 1
            )
        result["sizes"][str(n)] = entry
    await _cleanup(settings)
    return result


def _cpus() -> int:
    return os.cpu_count() or 0


async def _cleanup(settings: Settings) -> None:
    redis = connect_redis(settings)
    try:
        async for key in redis.scan_iter(match=f"{settings.redis_prefix}:*", count=1000):
            await redis.delete(key)
    finally:
        await redis.aclose()


def render(result: dict[str, Any]) -> str:
    """The figures as a human reads them: the floors first, then decisions per size and policy."""
    hop, lock = result["hop"], result["lock"]
    lines = [
        f"vmsched bench ({result['when']}, {result['machine']['cpus']} CPUs, policy {result['policy']})",
        f"floors: one bus hop (RPC to an empty handler) p50 {hop['p50_ms']} ms, p99 {hop['p99_ms']} ms; "
        f"Redis lock take + release p50 {lock['p50_ms']} ms",
        "HA reservation check: " + ", ".join(f"{k} {v}" for k, v in result["ha_check"].items()),
        _balance_line(result["balance_pass"]),
        "",
        f"{'hosts':>6}  {'policy, mode':<56}{'p50 ms':>9}{'p99 ms':>9}{'decisions/s':>13}",
    ]
    for n, r in result["sizes"].items():
        for name in _policies():
            lines += _decision_rows(n, name, r[name])
    lines.append("")
    lines.append(f"{'hosts':>6}  {'message':<46}{'bytes':>9}{'encode us':>11}{'decode us':>11}")
    for n, r in result["sizes"].items():
        for name, c in r["codec"].items():
            lines.append(f"{n:>6}  {name:<46}{c['bytes']:>9}{c['encode_us']:>11}{c['decode_us']:>11}")
    return "\n".join(lines)


def _balance_line(b: dict[str, Any]) -> str:
    units = ", ".join(f"{name} {u['ms']} ({u['no_fit_ms']})" for name, u in b["units"].items())
    return (
        f"balance pass, {b['hosts']} hosts / {b['vms']} VMs, table + unit ms (nothing fits): {units};"
        f" table alone {b['table_ms']} ms"
    )


def _decision_rows(n: str, name: str, p: dict[str, Any]) -> list[str]:
    runs = [("in process, no bus", p["in_process"])]
    runs += [(f"bus, {k}", v) for k, v in p["bus"].items() if k not in ("logs", "rss_mb")]
    lines = []
    for label, s in runs:
        text = f"{name} ({p['units']} units) {label}"
        lines.append(f"{n:>6}  {text:<56}{s['p50_ms']:>9}{s['p99_ms']:>9}{s['decisions_per_s']:>13}")
        if "cpu_ms_per_decision" in s:
            cpu = s["cpu_ms_per_decision"]
            parts = ", ".join(f"{k} {v}" for k, v in cpu.items())
            lines.append(f"{'':>8}CPU ms per decision: {parts}; total {round(sum(cpu.values()), 2)}")
    rss = ", ".join(f"{k} {v:.0f}" for k, v in p["bus"]["rss_mb"].items() if v is not None)
    lines.append(f"{'':>6}  bus / in process (sequential p50): {p['bus_over_in_process']}x;  RSS MB: {rss}")
    return lines


def main(args: argparse.Namespace, settings: Settings) -> int:
    configure("WARNING", "console")
    result = asyncio.run(run_bench(args, settings))
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"\nwritten to {out}")
    return 0


__all__ = ["main", "run_bench"]
