"""The fault experiments. Each takes the base settings, a log directory and its size, runs real
service processes under prefixes of its own, and returns a Result (figures + thresholds).

The engine's side is played by vmsched.client.SchedulerClient, as an engine would use it: a call
that times out or loses its connection is sent again under the same request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from vmsched.client import SchedulerClient
from vmsched.contracts import DecisionStatus, PendingEntry, VmReport, VmSpec, VmStatus
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    every,
    make_clusters,
    pending_duplicates,
    percentile,
    placement_faults,
    random_vm,
    refused_requests,
    running,
    schedule_with_retries,
    scoped_settings,
)
from vmsched_services.tools.chaos.holder import stale_vm
from vmsched_services.tools.chaos.inject import close_broker_connections, kill_redis_clients, restart_broker_app
from vmsched_services.tools.procs import ServiceProcess, ServiceStack, settings_env

#: Timeouts the experiments run with: the Settings defaults, whatever the caller's settings say
#: (the test suite's settings shorten them), because the thresholds are stated against those.
DEFAULT_TIMEOUTS = ("lock_acquire_timeout_s", "lock_hold_timeout_s", "rpc_timeout_s", "pending_ttl_s", "pending_wait_s")


def _defaults(*names: str) -> dict[str, Any]:
    return {n: Settings.model_fields[n].default for n in names}


def _tag(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def _drive(
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
                await client.report_vm(
                    VmReport(
                        cluster_id=o.cluster_id,
                        vm_id=p.vm_id,
                        status=VmStatus.RUNNING,
                        host_id=p.host_id,
                        mem_mb=o.vm.mem_mb,
                        overhead_mb=o.vm.overhead_mb,
                        vcpus=o.vm.vcpus,
                    )
                )

    await asyncio.gather(*(one(i, o) for i, o in enumerate(outcomes)))


async def _kill_and_replace(
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


def _latency_figures(res: Result, outcomes: list[Outcome]) -> None:
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


# ====================================================================== 1. worker_kill
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
    started = time.monotonic()
    settings = scoped_settings(base, "worker-kill", **_defaults(*DEFAULT_TIMEOUTS))
    rng = random.Random(seed)
    tag = _tag("wk")
    async with running(settings, log_dir) as stack:
        await stack.start("state-tracker", "filter-worker", "filter-worker", "weigher", "weigher", "selector")
        async with SchedulerClient(settings) as client:
            all_hosts = await make_clusters(client, tag, clusters, hosts, 262_144)
            outcomes = [
                Outcome(f"{tag}-c{i % clusters}", random_vm(rng, f"{tag}-vm{i}"), uuid.uuid4()) for i in range(requests)
            ]
            stop = asyncio.Event()
            kills: Counter[str] = Counter()

            async def kill() -> None:
                service = rng.choice(("filter-worker", "weigher"))
                if await _kill_and_replace(stack, service, rng, freeze_s=freeze_s) is not None:
                    kills[service] += 1

            killer = asyncio.create_task(every(kill_every_s, rng, stop, kill))
            try:
                await _drive(client, outcomes, concurrency, call_timeout=5.0, give_up_after=30.0, spread_s=spread_s)
            finally:
                stop.set()
                await killer
        _latency_figures(res, outcomes)
        faults = placement_faults(outcomes, all_hosts)
        res.figures["kills"] = sum(kills.values())
        res.figures["duplicate_placements"] = faults["duplicate_placements"]
        res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes)
    res.check("answered", ">=", requests)
    res.check("lost", "==", 0)
    res.check("latency_max_s", "<=", 5.0)
    res.check("duplicate_placements", "==", 0)
    res.check("pending_mismatches", "==", 0)
    res.check("kills", ">=", 1)
    res.elapsed_s = time.monotonic() - started
    return res


# ====================================================================== 2. selector_kill
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
    started = time.monotonic()
    settings = scoped_settings(base, "selector-kill", **_defaults(*DEFAULT_TIMEOUTS))
    bound = settings.lock_acquire_timeout_s + 5.0
    rng = random.Random(seed)
    tag = _tag("sk")
    async with running(settings, log_dir) as stack:
        await stack.start("state-tracker", "filter-worker", "filter-worker", "weigher", *["selector"] * selectors)
        async with SchedulerClient(settings) as client:
            # Small hosts: the clusters fill up, so a broken lock would show as over-commitment.
            all_hosts = await make_clusters(client, tag, clusters, hosts, 16_384)
            outcomes = [
                Outcome(f"{tag}-c{i % clusters}", random_vm(rng, f"{tag}-vm{i}", (512, 1024, 2048, 4096)), uuid.uuid4())
                for i in range(requests)
            ]
            stop = asyncio.Event()
            kills = 0
            holding = 0
            chosen: set[int] = set()
            cluster_ids = sorted({h.cluster_id for h in all_hosts})
            redis = connect_redis(settings)
            locks = ClusterLock(redis, settings)

            async def lock_holder(live: list[ServiceProcess]) -> ServiceProcess | None:
                """The worst victim: a selector holding a cluster's lock right now (polled up to 0.5 s).
                The lock's value names its owner process ("host-PID/..."), as ClusterLock.holder shows."""
                end = time.monotonic() + 0.5
                while time.monotonic() < end:
                    values = [await locks.holder(cid) for cid in cluster_ids]
                    for p in live:
                        if any(v is not None and re.search(rf"-{p.pid}\b", v) for v in values):
                            chosen.add(p.pid)
                            return p
                    await asyncio.sleep(0.01)
                return None

            async def kill() -> None:
                nonlocal kills, holding
                victim = await _kill_and_replace(stack, "selector", rng, prefer=lock_holder)
                if victim is not None:
                    kills += 1
                    holding += victim.pid in chosen

            killer = asyncio.create_task(every(kill_every_s, rng, stop, kill))
            try:
                await _drive(
                    client,
                    outcomes,
                    concurrency,
                    call_timeout=5.0,
                    give_up_after=settings.lock_acquire_timeout_s + settings.lock_hold_timeout_s + 15.0,
                    spread_s=spread_s,
                    start_placed=True,
                )
            finally:
                stop.set()
                await killer
                await redis.aclose()
        _latency_figures(res, outcomes)
        faults = placement_faults(outcomes, all_hosts)
        within = sum(o.answered and o.latency_s <= 5.0 for o in outcomes)
        res.figures["answered_within_5s_pct"] = round(100.0 * within / max(1, requests), 2)
        res.figures["latency_bound_s"] = bound
        res.figures["placed"] = faults["placed"]
        res.figures["over_committed_hosts"] = faults["over_committed_hosts"]
        res.figures["duplicate_placements"] = faults["duplicate_placements"]
        res.figures["kills"] = kills
        res.figures["kills_holding_a_lock"] = holding
        # Informational (no threshold: the client retries them): what the selectors refused themselves.
        refused = await refused_requests(settings)
        res.figures["requests_dead_lettered"] = sum(refused.values())
        if refused:
            top = "; ".join(f"{r} x{n}" for r, n in refused.most_common(2))
            res.notes.append(f"dead-lettered by the services: {top}")
        res.notes.append(
            f"lock acquire/hold timeouts {settings.lock_acquire_timeout_s:g}/{settings.lock_hold_timeout_s:g} s "
            "(Settings defaults)"
        )
    res.check("over_committed_hosts", "==", 0)
    res.check("duplicate_placements", "==", 0)
    res.check("lost", "==", 0)
    res.check("answered_within_5s_pct", ">=", 99.0)
    res.check("latency_max_s", "<=", bound)
    res.check("kills", ">=", 1)
    res.elapsed_s = time.monotonic() - started
    return res


# ====================================================================== 3. stale_holder
async def stale_holder(
    base: Settings, log_dir: Path, *, trials: int = 20, per_round: int = 5, hold_s: float | None = None
) -> Result:
    """A lock holder process is SIGSTOPped past its lease; this process takes the lock over and
    writes; the holder is SIGCONTed and tries its fenced pending write: every one is refused.

    `per_round` clusters share one holder process (one stop per round). `hold_s` replaces the
    hold timeout (None: the Settings default); the takeover is awaited, not assumed, so the
    experiment holds for a lock whose hold timeout is its TTL as for a short renewed lease.
    """

    res = Result("stale_holder", {"trials": trials, "per_round": per_round})
    started = time.monotonic()
    overrides = _defaults(*DEFAULT_TIMEOUTS)
    if hold_s is not None:
        overrides["lock_hold_timeout_s"] = hold_s
    settings = scoped_settings(base, "stale-holder", **overrides)
    hold = settings.lock_hold_timeout_s
    tag = _tag("sh")
    outcomes: Counter[str] = Counter()
    takeovers: list[float] = []
    landed = 0
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    redis = connect_redis(settings)
    locks = ClusterLock(redis, settings, owner="chaos-taker")
    pending = PendingStore(redis, settings)
    try:
        for r in range((trials + per_round - 1) // per_round):
            names = [f"{tag}-r{r}-c{i}" for i in range(min(per_round, trials - r * per_round))]
            with (log_dir / f"holder-{r}.stderr").open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "vmsched_services.tools.chaos.holder",
                    *names,
                    env={**settings_env(settings), "PYTHONUNBUFFERED": "1"},
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                )
            assert proc.stdin is not None
            assert proc.stdout is not None
            try:
                tokens: dict[str, int] = {}
                async with asyncio.timeout(30):
                    while len(tokens) < len(names):
                        line = (await proc.stdout.readline()).decode().split()
                        if not line:
                            raise RuntimeError(f"holder exited before locking; see {err.name}")
                        if line[0] == "LOCKED":
                            tokens[line[1]] = int(line[2])
                os.kill(proc.pid, signal.SIGSTOP)
                stopped = time.monotonic()

                async def take_over(cid: str, tokens: dict[str, int] = tokens, stopped: float = stopped) -> None:
                    # Waits for the stopped holder's lock to lapse: bounded by its hold timeout.
                    lease = await locks.acquire(cid, timeout_s=hold + 5.0)
                    try:
                        takeovers.append(time.monotonic() - stopped)
                        if lease.token <= tokens[cid]:
                            raise RuntimeError(f"token {lease.token} after the holder's {tokens[cid]}")
                        entry = PendingEntry(
                            vm_id=f"taker-{cid}",
                            host_id=f"{cid}-h1",
                            mem_mb=1024,
                            vcpus=1,
                            request_id=uuid.uuid4(),
                            fencing_token=lease.token,
                            expires_at=time.time() + 300,
                        )
                        await pending.record(cid, [entry], lease.token)
                    finally:
                        await locks.release(lease)

                await asyncio.gather(*(take_over(cid) for cid in names))
                os.kill(proc.pid, signal.SIGCONT)
                proc.stdin.write(b"WRITE\n")
                await proc.stdin.drain()
                async with asyncio.timeout(30):
                    while True:
                        line = (await proc.stdout.readline()).decode().split()
                        if not line or line[0] == "DONE":
                            break
                        if line[0] in ("REFUSED", "WRITTEN", "ABORTED"):
                            outcomes[line[0]] += 1
                for cid in names:
                    if await pending.get(cid, stale_vm(cid)) is not None:
                        landed += 1
                    if await pending.get(cid, f"taker-{cid}") is None:
                        res.notes.append(f"the taker's own write to {cid} is missing")
            finally:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGCONT)
                        proc.kill()
                await proc.wait()
            for cid in names:
                await redis.delete(*(k for k in _cluster_keys(settings, cid)))
    finally:
        await redis.aclose()
    res.figures["refused"] = outcomes["REFUSED"] + outcomes["ABORTED"]
    res.figures["refused_by_fence"] = outcomes["REFUSED"]
    res.figures["aborted_before_write"] = outcomes["ABORTED"]
    res.figures["written"] = outcomes["WRITTEN"]
    res.figures["stale_writes_landed"] = landed
    res.figures["takeover_max_s"] = round(max(takeovers, default=0.0), 3)
    res.figures["hold_timeout_s"] = hold
    res.check("refused", ">=", trials)
    res.check("written", "==", 0)
    res.check("stale_writes_landed", "==", 0)
    res.check("takeover_max_s", "<=", hold + 1.0)
    res.elapsed_s = time.monotonic() - started
    return res


def _cluster_keys(settings: Settings, cid: str) -> list[str]:

    k = Keys.from_settings(settings)
    return [k.lock(cid), k.fence(cid), k.pending(cid), k.pending_version(cid)]


# ====================================================================== 4. broker_drop
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
    started = time.monotonic()
    settings = scoped_settings(base, "broker-drop", **_defaults(*DEFAULT_TIMEOUTS))
    rng = random.Random(seed)
    tag = _tag("bd")
    recoveries: dict[str, float] = {}
    injected: dict[str, int] = {}
    async with running(settings, log_dir) as stack:
        await stack.start("state-tracker", "filter-worker", "weigher", "selector", "selector")
        async with SchedulerClient(settings) as client:
            all_hosts = await make_clusters(client, tag, clusters, 4, 262_144)
            outcomes = [
                Outcome(f"{tag}-c{i % clusters}", random_vm(rng, f"{tag}-vm{i}"), uuid.uuid4()) for i in range(requests)
            ]
            probes: list[Outcome] = []

            async def recovered_after(fault_end: float) -> float:
                """Seconds from `fault_end` until a fresh request is placed (probes retried every 0.2 s)."""
                while time.monotonic() - fault_end < 60:
                    o = Outcome(
                        all_hosts[0].cluster_id,
                        VmSpec(vm_id=f"{tag}-probe{len(probes)}", mem_mb=64, vcpus=1),
                        uuid.uuid4(),
                    )
                    probes.append(o)
                    await schedule_with_retries(client, o, call_timeout=1.0, give_up_after=1.0)
                    if o.decision is not None and o.decision.status is DecisionStatus.PLACED:
                        return time.monotonic() - fault_end
                    await asyncio.sleep(0.2)
                return float("inf")

            async def faults() -> None:
                def progress() -> int:
                    return sum(o.decision is not None for o in outcomes)

                # Each connection drop twice: a reconnect race need not show the first time.
                steps: list[tuple[float, str]] = [
                    (0.1, "amqp_close"),
                    (0.25, "redis_kill"),
                    (0.4, "amqp_close"),
                    (0.55, "redis_kill"),
                ]
                if restart_broker:
                    steps.append((0.7, "broker_restart"))
                for at, fault in steps:
                    while progress() < at * requests:  # noqa: ASYNC110 (progress is a count, not an event)
                        await asyncio.sleep(0.05)
                    services = [p for p in stack.procs if p.alive]
                    if fault == "amqp_close":
                        n = await close_broker_connections(settings, services)
                    elif fault == "redis_kill":
                        n = await kill_redis_clients(settings, services)
                    else:
                        await restart_broker_app()
                        n = 1
                    injected[fault] = injected.get(fault, 0) + n
                    took = await recovered_after(time.monotonic())
                    recoveries[fault] = max(recoveries.get(fault, 0.0), took)

            injector = asyncio.create_task(faults())
            try:
                await _drive(client, outcomes, concurrency, call_timeout=3.0, give_up_after=90.0, spread_s=spread_s)
                await injector
            finally:
                injector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await injector
            crashed = [f"{p.name}#{p.index}" for p in stack.procs if not p.alive]
            # What the services logged about the drops (informational: a reconnect race shows here).
            logged = Counter[str]()
            for p in stack.procs:
                for path in (p.stdout, p.stderr):
                    with contextlib.suppress(OSError):
                        text = path.read_text(errors="replace")
                        for marker in ("PRECONDITION_FAILED", "Traceback"):
                            logged[marker] += text.count(marker)
        _latency_figures(res, outcomes)
        faults_ = placement_faults(outcomes + probes, all_hosts)
        res.figures["duplicate_placements"] = faults_["duplicate_placements"]
        res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes + probes)
        for fault, n in injected.items():
            res.figures[f"{fault}_count"] = n
        for fault, s in recoveries.items():
            res.figures[f"{fault}_recovery_s"] = round(s, 3) if s != float("inf") else 999.0
        res.figures["recovery_max_s"] = max((float(res.figures[f"{f}_recovery_s"]) for f in recoveries), default=999.0)
        res.figures["services_exited"] = len(crashed)
        res.figures["logged_precondition_failed"] = logged["PRECONDITION_FAILED"]
        refused = await refused_requests(settings)
        res.figures["valid_requests_dead_lettered"] = sum(refused.values())
        if refused:
            res.notes.append(
                "valid requests dead-lettered: " + "; ".join(f"{r} x{n}" for r, n in refused.most_common(3))
            )
        res.figures["logged_tracebacks"] = logged["Traceback"]
        if crashed:
            res.notes.append("exited: " + ", ".join(crashed))
    res.check("lost", "==", 0)
    res.check("duplicate_placements", "==", 0)
    res.check("pending_mismatches", "==", 0)
    res.check("recovery_max_s", "<=", 5.0)
    res.check("services_exited", "==", 0)
    res.check("valid_requests_dead_lettered", "==", 0)
    res.check("amqp_close_count", ">=", 1)
    res.check("redis_kill_count", ">=", 1)
    res.elapsed_s = time.monotonic() - started
    return res
