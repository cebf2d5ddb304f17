"""The redis_restart experiment: the services' Redis SIGKILLed and started again EMPTY (no persistence)
during a stream of schedule requests, with a lock holder frozen across the loss.

What it stands for: a Redis restarted without its data. Everything it held is gone: the fencing
counters, the cluster state, the pending records, the stored decisions. vmsched must find the loss
(vmsched.store.generations), refuse until the engine has reported the cluster in full again, and then:

* place nothing on part of the picture: no host over-committed by the VMs the engine runs there;
* accept nothing a lock holder from before the loss writes (its fencing token is of an old generation);
* place no request decided before the loss a second time (its VM is on a host: `decision_lost`).

The engine (this process, through SchedulerClient) creates clusters of small hosts that the stream
fills up, reports every placed VM running, answers every ResyncRequested with a full report of what
it knows (the cluster, its hosts, its running VMs) and `resync_complete`, and sends a request answered
`state_resyncing` again under the same request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterReport,
    DecisionStatus,
    VmReport,
    VmSpec,
)
from vmsched.errors import StateResyncing
from vmsched.recovery import Recovery
from vmsched.settings import Settings
from vmsched.store import ClusterLock, PendingStore
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.chaos.base import (
    RETRYABLE_CODES,
    Host,
    Outcome,
    Result,
    experiment_settings,
    host_report,
    placement_faults,
    run_tag,
    running,
    schedule_with_retries,
    timed,
)
from vmsched_services.tools.chaos.holder import stale_vm
from vmsched_services.tools.chaos.stale import read_outcomes, read_tokens, start_holder, taker_entry
from vmsched_services.tools.chaos.stream import latency_figures
from vmsched_services.tools.servers.redis import PrivateRedis

#: The memory of a stream cluster's hosts: a few VMs each, so the stream fills the clusters up and
#: any VM the state forgot would over-commit them.
SMALL_HOST_MB = 8192
#: The probe cluster's host: roomy, so a probe is placed as soon as the cluster is scheduled again.
PROBE_HOST_MB = 262_144
#: A request answered within this long counts as answered in time.
IN_TIME_S = 5.0
#: What the engine sends again under the same request id: the stream's transient errors, and the
#: cluster waiting for its full report after the loss.
RESEND_CODES = RETRYABLE_CODES | {StateResyncing.code}


@dataclass
class _Engine:
    """The engine's side: the clusters and hosts it reported, the VMs it runs (placed and reported
    running), and its answers to vmsched's requests for a full report."""

    client: SchedulerClient
    hosts: dict[str, list[Host]] = field(default_factory=lambda: defaultdict(list))
    #: cluster -> vm_id -> (host_id, spec) of every VM the engine placed and started.
    vms: dict[str, dict[str, tuple[str, VmSpec]]] = field(default_factory=lambda: defaultdict(dict))
    resync_requests: Counter[str] = field(default_factory=Counter)
    #: Full reports sent (one per request: the services ask again while a cluster waits).
    full_reports: int = 0

    async def add_cluster(self, cluster_id: str, hosts: int, mem_mb: int) -> None:
        self.hosts[cluster_id] = [Host(cluster_id, f"{cluster_id}-h{i}", mem_mb) for i in range(hosts)]
        await self._report_cluster(cluster_id)
        await self.client.wait_for_state(cluster_id, hosts=hosts, timeout=30)

    async def _report_cluster(self, cluster_id: str) -> None:
        await self.client.report_cluster(ClusterReport(cluster_id=cluster_id))
        for h in self.hosts[cluster_id]:
            await self.client.report_host(host_report(h))

    async def start_vm(self, cluster_id: str, host_id: str, vm: VmSpec) -> None:
        """Start a placed VM: known to the engine first (a full report includes VMs starting), then reported."""
        self.vms[cluster_id][vm.vm_id] = (host_id, vm)
        await self.client.report_vm(VmReport.running(cluster_id, host_id, vm))

    async def answer_resyncs(self) -> None:
        """Answer every ResyncRequested for a cluster of ours with a full report (runs until cancelled)."""
        async for asked in self.client.resync_requests("*"):
            cid = asked.cluster_id
            if cid not in self.hosts:
                continue
            self.resync_requests[cid] += 1
            await self._report_cluster(cid)
            vms = list(self.vms[cid].values())
            for host_id, vm in vms:
                await self.client.report_vm(VmReport.running(cid, host_id, vm))
            await self.client.resync_complete(cid, asked.generation, hosts=len(self.hosts[cid]), vms=len(vms))
            self.full_reports += 1

    def all_hosts(self) -> list[Host]:
        return [h for hs in self.hosts.values() for h in hs]


async def _schedule(
    engine: _Engine, o: Outcome, *, call_timeout: float, give_up_after: float, start: bool = True
) -> Outcome:
    """Send the request until a final answer (the same request id on every resend, `state_resyncing`
    included); with `start`, start the VM it places."""
    await schedule_with_retries(
        engine.client, o, call_timeout=call_timeout, give_up_after=give_up_after, retry_codes=RESEND_CODES, pause_s=0.1
    )
    if start and o.decision is not None and o.decision.status is DecisionStatus.PLACED and o.decision.host_id:
        await engine.start_vm(o.cluster_id, o.decision.host_id, o.vm)
    return o


async def _stream(engine: _Engine, outcomes: list[Outcome], concurrency: int, spread_s: float) -> None:
    gate = asyncio.Semaphore(concurrency)
    t0 = time.monotonic()
    step = spread_s / max(1, len(outcomes))

    async def one(i: int, o: Outcome) -> None:
        await asyncio.sleep(max(0.0, t0 + i * step - time.monotonic()))
        async with gate:
            await _schedule(engine, o, call_timeout=5.0, give_up_after=90.0)

    await asyncio.gather(*(one(i, o) for i, o in enumerate(outcomes)))


@dataclass
class _Loss:
    """The fault: freeze the holder, SIGKILL Redis, start it again empty; then time recovery, take
    the holder's locks over, resume the holder for its stale write."""

    server: PrivateRedis
    engine: _Engine
    settings: Settings
    holder: asyncio.subprocess.Process
    holder_tokens: dict[str, int]
    probe_cluster: str
    replays: int
    decided_before: list[Outcome] = field(default_factory=list)
    back_at: float = 0.0
    recovery_s: float = 999.0
    holder_outcomes: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    landed: int = 0
    replayed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    async def run(self, outcomes: list[Outcome], at: float) -> None:
        while sum(o.decision is not None for o in outcomes) < at * len(outcomes):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        os.kill(self.holder.pid, signal.SIGSTOP)
        self.decided_before = [o for o in outcomes if o.decision is not None]
        await self.server.kill()
        await self.server.start()
        self.back_at = time.monotonic()
        self.recovery_s = await self._placed_again()
        # At once, while the clusters still have room: a replay placed again would be placed.
        self.replayed = await _replay(self.engine, self.decided_before, self.replays)
        await self._take_over_and_resume()

    async def _placed_again(self) -> float:
        """Seconds from Redis back until a fresh request on the probe cluster is placed (999: not in 90 s)."""
        while time.monotonic() - self.back_at < 90:
            vm = VmSpec(vm_id=f"{self.probe_cluster}-{uuid.uuid4().hex[:8]}", mem_mb=64, vcpus=1)
            probe = Outcome(self.probe_cluster, vm, uuid.uuid4())
            await _schedule(self.engine, probe, call_timeout=2.0, give_up_after=2.0)
            if probe.decision is not None and probe.decision.status is DecisionStatus.PLACED:
                return time.monotonic() - self.back_at
        return 999.0

    async def _take_over_and_resume(self) -> None:
        """A scheduler of after the loss takes each of the holder's locks and writes; then the frozen
        holder resumes and tries its fenced write with its token of before the loss."""
        redis = connect_redis(self.settings)
        try:
            locks = ClusterLock(
                redis, self.settings, owner="chaos-taker", recover=Recovery.standalone(redis, self.settings, "taker")
            )
            pending = PendingStore(redis, self.settings)
            for cid in self.holder_tokens:
                if await self._take_over(locks, pending, cid):
                    self.takeovers += 1
            os.kill(self.holder.pid, signal.SIGCONT)
            assert self.holder.stdin is not None
            assert self.holder.stdout is not None
            self.holder.stdin.write(b"WRITE\n")
            await self.holder.stdin.drain()
            self.holder_outcomes.update(await read_outcomes(self.holder.stdout))
            for cid in self.holder_tokens:
                if await pending.get(cid, stale_vm(cid)) is not None:
                    self.landed += 1
        finally:
            await redis.aclose()

    async def _take_over(self, locks: ClusterLock, pending: PendingStore, cid: str) -> bool:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                lease = await locks.acquire(cid, timeout_s=self.settings.lock_hold_timeout_s + 5.0)
            except StateResyncing:  # until the engine's full report of the cluster is in
                await asyncio.sleep(0.2)
                continue
            try:
                await pending.record(cid, [taker_entry(cid, lease.token)], lease.token)
            finally:
                await locks.release(lease)
            return True
        self.notes.append(f"the holder's lock of {cid} was never taken over after the loss")
        return False


async def _replay(engine: _Engine, before: list[Outcome], k: int) -> dict[str, int]:
    """Send again `k` requests placed before the loss (same request id, same VM: an engine that did not
    hear its answer). Their VMs run: a placement is counted, not started again."""
    placed = [o for o in before if o.decision is not None and o.decision.status is DecisionStatus.PLACED][:k]
    got = Counter[str]()
    for orig in placed:
        again = Outcome(orig.cluster_id, orig.vm, orig.request_id)
        r = await _schedule(engine, again, call_timeout=5.0, give_up_after=60.0, start=False)
        d, first = r.decision, orig.decision
        assert first is not None
        if d is None:
            got["replays_unanswered"] += 1
        elif d.error is not None and d.error.code == "decision_lost":
            got["replays_decision_lost"] += 1
        elif d.status is DecisionStatus.PLACED and d.decided_at == first.decided_at:
            got["replays_same_decision"] += 1
        elif d.status is DecisionStatus.PLACED:
            got["placed_twice"] += 1
            got["placed_twice_elsewhere"] += d.host_id != first.host_id
        else:
            got[f"replays_{d.status.value}"] += 1
    keys = ("replays_decision_lost", "replays_same_decision", "placed_twice", "placed_twice_elsewhere")
    return {"replayed": len(placed), **{k: got[k] for k in keys}, **{k: n for k, n in got.items() if k not in keys}}


@dataclass(frozen=True)
class _Size:
    requests: int
    clusters: int
    hosts: int
    holder_clusters: int
    replays: int
    concurrency: int
    spread_s: float
    at: float
    seed: int


async def redis_restart(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 120,
    clusters: int = 2,
    hosts: int = 2,
    holder_clusters: int = 4,
    replays: int = 5,
    concurrency: int = 4,
    spread_s: float = 30.0,
    at: float = 0.4,
    seed: int = 18,
) -> Result:
    """Redis SIGKILLed and started empty during a request stream, a lock holder frozen across it."""
    size = _Size(requests, clusters, hosts, holder_clusters, replays, concurrency, spread_s, at, seed)
    res = Result(
        "redis_restart",
        {"requests": requests, "clusters": clusters, "hosts": hosts, "holders": holder_clusters, "replays": replays},
    )
    with timed(res):
        server = PrivateRedis(log_dir / "redis", aof=False)
        try:
            await server.start()
            settings = experiment_settings(
                base, "redis-restart", redis_url=server.url, readiness_interval_s=0.5, resync_repeat_s=1.0
            )
            await _run(res, settings, server, log_dir, size)
        finally:
            await server.kill()
        res.check("lost", "==", 0)
        res.check("placed_twice", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("over_committed_hosts", "==", 0)
        res.check("replayed", "==", replays)
        res.check("stale_writes_kept_out", "==", holder_clusters)
        res.check("stale_writes_accepted", "==", 0)
        res.check("stale_writes_landed", "==", 0)
        res.check("resync_requests", ">=", 1)
        res.check_timing("answered_within_5s_pct", ">=", 99.0, short_bound=50.0)
        res.check_timing("recovery_s", "<=", 10.0, short_bound=60.0)
    return res


async def _run(res: Result, settings: Settings, server: PrivateRedis, log_dir: Path, size: _Size) -> None:
    tag = run_tag("rr")
    async with running(settings, log_dir) as stack:
        for service in ("state-tracker", "filter-worker", "weigher", "selector"):
            await stack.start(service)  # one at a time: the machine is busy
        async with SchedulerClient(settings) as client:
            engine = _Engine(client)
            for ci in range(size.clusters):
                await engine.add_cluster(f"{tag}-c{ci}", size.hosts, SMALL_HOST_MB)
            await engine.add_cluster(f"{tag}-probe", 1, PROBE_HOST_MB)
            held = [f"{tag}-held{i}" for i in range(size.holder_clusters)]
            for cid in held:
                await engine.add_cluster(cid, 1, SMALL_HOST_MB)
            answering = asyncio.create_task(engine.answer_resyncs())
            holder = await start_holder(settings, held, log_dir / "holder.stderr")
            try:
                assert holder.stdout is not None
                tokens = await read_tokens(holder.stdout, len(held), log_dir / "holder.stderr")
                rng = random.Random(size.seed)
                outcomes = [
                    Outcome(
                        f"{tag}-c{i % size.clusters}",
                        VmSpec(vm_id=f"{tag}-vm{i}", mem_mb=rng.choice((512, 1024, 2048)), vcpus=1),
                        uuid.uuid4(),
                    )
                    for i in range(size.requests)
                ]
                loss = _Loss(server, engine, settings, holder, tokens, f"{tag}-probe", size.replays)
                fault = asyncio.create_task(loss.run(outcomes, size.at))
                await _stream(engine, outcomes, size.concurrency, size.spread_s)
                await fault
            finally:
                answering.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await answering
                if holder.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(holder.pid, signal.SIGCONT)
                        holder.kill()
                await holder.wait()
    _figures(res, engine, outcomes, loss)


def _figures(res: Result, engine: _Engine, outcomes: list[Outcome], loss: _Loss) -> None:
    latency_figures(res, outcomes)
    in_time = sum(o.answered and o.latency_s <= IN_TIME_S for o in outcomes)
    res.figures["answered_within_5s"] = in_time
    res.figures["answered_within_5s_pct"] = round(100.0 * in_time / max(1, len(outcomes)), 1)
    res.figures["placed"] = sum(o.decision is not None and o.decision.status is DecisionStatus.PLACED for o in outcomes)
    res.figures["decided_before_loss"] = len(loss.decided_before)
    res.figures["state_resyncing_answers"] = sum(
        1 for o in outcomes for d in o.replies if d.error is not None and d.error.code == StateResyncing.code
    )
    faults = placement_faults(outcomes, engine.all_hosts())
    res.figures["duplicate_placements"] = faults["duplicate_placements"]
    res.figures["over_committed_hosts"] = faults["over_committed_hosts"]
    res.figures.update({"placed_twice": 0, **loss.replayed})
    res.figures["stale_writes_refused"] = loss.holder_outcomes["REFUSED"]
    # The holder noticed it lost its lock (its renewal failed) before writing: as safe as refused.
    res.figures["stale_writes_aborted"] = loss.holder_outcomes["ABORTED"]
    res.figures["stale_writes_accepted"] = loss.holder_outcomes["WRITTEN"]
    res.figures["stale_writes_landed"] = loss.landed
    res.figures["stale_writes_kept_out"] = int(res.figures["stale_writes_refused"]) + int(
        res.figures["stale_writes_aborted"]
    )
    res.figures["takeovers"] = loss.takeovers
    res.figures["resync_requests"] = sum(engine.resync_requests.values())
    res.figures["full_reports"] = engine.full_reports
    res.figures["recovery_s"] = round(loss.recovery_s, 3)
    res.notes += loss.notes


__all__ = ["redis_restart"]
