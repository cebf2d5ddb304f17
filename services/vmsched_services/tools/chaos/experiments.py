"""The fault experiments. Each takes the base settings, a log directory and its size, runs real
service processes under prefixes of its own, and returns a Result (figures + thresholds).

The engine's side is played by vmsched.client.SchedulerClient, as an engine would use it: a call
that times out or loses its connection is sent again under the same request id. Each experiment
reads top to bottom as setup (its settings and stage), inject (its faults during a request
stream), observe (its figures, while its services and keys still exist) and judge (its thresholds).
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
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from vmsched.client import SchedulerClient
from vmsched.contracts import DecisionStatus, PendingEntry, VmReport, VmSpec, VmStatus
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, PendingStore
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
    schedule_with_retries,
    staged,
    timed,
)
from vmsched_services.tools.chaos.holder import stale_vm
from vmsched_services.tools.chaos.inject import close_broker_connections, kill_redis_clients, restart_broker_app
from vmsched_services.tools.procs import ServiceProcess, ServiceStack, settings_env
from vmsched_services.tools.stats import percentile


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
    with timed(res):
        settings = experiment_settings(base, "worker-kill")
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
                if await _kill_and_replace(stage.stack, service, rng, freeze_s=freeze_s) is not None:
                    kills[service] += 1

            async with periodically(kill_every_s, rng, kill):
                await _drive(
                    stage.client, outcomes, concurrency, call_timeout=5.0, give_up_after=30.0, spread_s=spread_s
                )
            _latency_figures(res, outcomes)
            res.figures["kills"] = sum(kills.values())
            res.figures["duplicate_placements"] = placement_faults(outcomes, stage.hosts)["duplicate_placements"]
            res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes)
        res.check("answered", ">=", requests)
        res.check("lost", "==", 0)
        res.check("latency_max_s", "<=", 5.0)
        res.check("duplicate_placements", "==", 0)
        res.check("pending_mismatches", "==", 0)
        res.check("kills", ">=", 1)
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
    with timed(res):
        settings = experiment_settings(base, "selector-kill")
        bound = settings.lock_acquire_timeout_s + 5.0
        rng = random.Random(seed)
        services = ("state-tracker", "filter-worker", "filter-worker", "weigher", *["selector"] * selectors)
        tag = run_tag("sk")
        # Small hosts: the clusters fill up, so a broken lock would show as over-commitment.
        async with staged(settings, log_dir, services, tag=tag, clusters=clusters, hosts=hosts, mem_mb=16_384) as stage:
            outcomes = stage.requests(rng, requests, (512, 1024, 2048, 4096))
            redis = connect_redis(settings)
            killer = _SelectorKiller(stage.stack, rng, ClusterLock(redis, settings), _cluster_ids(stage.hosts))
            try:
                async with periodically(kill_every_s, rng, killer.kill):
                    await _drive(
                        stage.client,
                        outcomes,
                        concurrency,
                        call_timeout=5.0,
                        give_up_after=settings.lock_acquire_timeout_s + settings.lock_hold_timeout_s + 15.0,
                        spread_s=spread_s,
                        start_placed=True,
                    )
            finally:
                await redis.aclose()
            await _selector_kill_figures(res, settings, stage, outcomes, killer, bound)
        res.check("over_committed_hosts", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("lost", "==", 0)
        res.check("answered_within_5s_pct", ">=", 99.0)
        res.check("latency_max_s", "<=", bound)
        res.check("kills", ">=", 1)
    return res


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
        victim = await _kill_and_replace(self.stack, "selector", self.rng, prefer=self.lock_holder)
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
    _latency_figures(res, outcomes)
    faults = placement_faults(outcomes, stage.hosts)
    within = sum(o.answered and o.latency_s <= 5.0 for o in outcomes)
    res.figures["answered_within_5s_pct"] = round(100.0 * within / max(1, len(outcomes)), 2)
    res.figures["latency_bound_s"] = bound
    res.figures["placed"] = faults["placed"]
    res.figures["over_committed_hosts"] = faults["over_committed_hosts"]
    res.figures["duplicate_placements"] = faults["duplicate_placements"]
    res.figures["kills"] = killer.kills
    res.figures["kills_holding_a_lock"] = killer.holding
    # Informational (no threshold: the client retries them): what the selectors refused themselves.
    await count_refused(res, settings, "requests_dead_lettered", "dead-lettered by the services", 2)
    res.notes.append(
        f"lock acquire/hold timeouts {settings.lock_acquire_timeout_s:g}/{settings.lock_hold_timeout_s:g} s "
        "(Settings defaults)"
    )


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
    with timed(res):
        overrides = {} if hold_s is None else {"lock_hold_timeout_s": hold_s}
        settings = experiment_settings(base, "stale-holder", **overrides)
        hold = settings.lock_hold_timeout_s
        tag = run_tag("sh")
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        redis = connect_redis(settings)
        taker = _Taker(settings, redis, res.notes)
        try:
            for r in range((trials + per_round - 1) // per_round):
                names = [f"{tag}-r{r}-c{i}" for i in range(min(per_round, trials - r * per_round))]
                await taker.round(names, log_dir / f"holder-{r}.stderr")
        finally:
            await redis.aclose()
        res.figures["refused"] = taker.outcomes["REFUSED"] + taker.outcomes["ABORTED"]
        res.figures["refused_by_fence"] = taker.outcomes["REFUSED"]
        res.figures["aborted_before_write"] = taker.outcomes["ABORTED"]
        res.figures["written"] = taker.outcomes["WRITTEN"]
        res.figures["stale_writes_landed"] = taker.landed
        res.figures["takeover_max_s"] = round(max(taker.takeovers, default=0.0), 3)
        res.figures["hold_timeout_s"] = hold
        res.check("refused", ">=", trials)
        res.check("written", "==", 0)
        res.check("stale_writes_landed", "==", 0)
        res.check("takeover_max_s", "<=", hold + 1.0)
    return res


@dataclass
class _Taker:
    """stale_holder's side of the lock: per round, it starts a holder process (holder.py) on some
    clusters, stops it once it holds their locks, takes each lock over and writes, resumes the
    holder for its stale write, and counts what became of it. `notes` gets what went wrong here."""

    settings: Settings
    redis: Redis
    notes: list[str]
    #: The holder's reports: REFUSED, WRITTEN, ABORTED (holder.py).
    outcomes: Counter[str] = field(default_factory=Counter)
    #: Seconds from stopping the holder to taking a lock over.
    takeovers: list[float] = field(default_factory=list)
    #: The holder's stale writes found in the pending store.
    landed: int = 0
    locks: ClusterLock = field(init=False)
    pending: PendingStore = field(init=False)

    def __post_init__(self) -> None:
        self.locks = ClusterLock(self.redis, self.settings, owner="chaos-taker")
        self.pending = PendingStore(self.redis, self.settings)

    async def round(self, names: list[str], stderr: Path) -> None:
        proc = await _start_holder(self.settings, names, stderr)
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            tokens = await _read_tokens(proc.stdout, len(names), stderr)
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            await asyncio.gather(*(self._take_over(cid, tokens[cid], stopped) for cid in names))
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write(b"WRITE\n")
            await proc.stdin.drain()
            self.outcomes.update(await _read_outcomes(proc.stdout))
            await self._look_for_writes(names)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
            await proc.wait()
        for cid in names:
            await self.redis.delete(*(k for k in _cluster_keys(self.settings, cid)))

    async def _take_over(self, cid: str, holder_token: int, stopped: float) -> None:
        # Waits for the stopped holder's lock to lapse: bounded by its hold timeout.
        lease = await self.locks.acquire(cid, timeout_s=self.settings.lock_hold_timeout_s + 5.0)
        try:
            self.takeovers.append(time.monotonic() - stopped)
            if lease.token <= holder_token:
                raise RuntimeError(f"token {lease.token} after the holder's {holder_token}")
            entry = PendingEntry(
                vm_id=f"taker-{cid}",
                host_id=f"{cid}-h1",
                mem_mb=1024,
                vcpus=1,
                request_id=uuid.uuid4(),
                fencing_token=lease.token,
                expires_at=time.time() + 300,
            )
            await self.pending.record(cid, [entry], lease.token)
        finally:
            await self.locks.release(lease)

    async def _look_for_writes(self, names: list[str]) -> None:
        for cid in names:
            if await self.pending.get(cid, stale_vm(cid)) is not None:
                self.landed += 1
            if await self.pending.get(cid, f"taker-{cid}") is None:
                self.notes.append(f"the taker's own write to {cid} is missing")


async def _start_holder(settings: Settings, names: list[str], stderr: Path) -> asyncio.subprocess.Process:
    with stderr.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vmsched_services.tools.chaos.holder",
            *names,
            env={**settings_env(settings), "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )


async def _read_tokens(stdout: asyncio.StreamReader, clusters: int, stderr: Path) -> dict[str, int]:
    """The holder's fencing token per cluster, from its `LOCKED <cluster> <token>` lines."""
    tokens: dict[str, int] = {}
    async with asyncio.timeout(30):
        while len(tokens) < clusters:
            line = (await stdout.readline()).decode().split()
            if not line:
                raise RuntimeError(f"holder exited before locking; see {stderr}")
            if line[0] == "LOCKED":
                tokens[line[1]] = int(line[2])
    return tokens


async def _read_outcomes(stdout: asyncio.StreamReader) -> Counter[str]:
    """What the holder reported of its stale writes, up to its `DONE`."""
    outcomes: Counter[str] = Counter()
    async with asyncio.timeout(30):
        while True:
            line = (await stdout.readline()).decode().split()
            if not line or line[0] == "DONE":
                break
            if line[0] in ("REFUSED", "WRITTEN", "ABORTED"):
                outcomes[line[0]] += 1
    return outcomes


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
            injector = asyncio.create_task(faults.inject(steps))
            try:
                await _drive(
                    stage.client, outcomes, concurrency, call_timeout=3.0, give_up_after=90.0, spread_s=spread_s
                )
                await injector
            finally:
                injector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await injector
            await _broker_drop_figures(res, settings, stage, outcomes, faults)
        res.check("lost", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("pending_mismatches", "==", 0)
        res.check("recovery_max_s", "<=", 5.0)
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
            took = await self._recovered_after(time.monotonic())
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

    async def _recovered_after(self, fault_end: float) -> float:
        """Seconds from `fault_end` until a fresh request is placed (probes retried every 0.2 s)."""
        while time.monotonic() - fault_end < 60:
            o = Outcome(
                self.stage.hosts[0].cluster_id,
                VmSpec(vm_id=f"{self.stage.tag}-probe{len(self.probes)}", mem_mb=64, vcpus=1),
                uuid.uuid4(),
            )
            self.probes.append(o)
            await schedule_with_retries(self.stage.client, o, call_timeout=1.0, give_up_after=1.0)
            if o.decision is not None and o.decision.status is DecisionStatus.PLACED:
                return time.monotonic() - fault_end
            await asyncio.sleep(0.2)
        return float("inf")


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
    _latency_figures(res, outcomes)
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
