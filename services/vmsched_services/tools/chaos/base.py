"""What every fault experiment shares: its result, its isolated scope on the servers, its stage (services,
the engine's client, clusters), its request stream and its fault loop.

An experiment runs real service processes (vmsched_services.tools.procs.ServiceStack) against the real RabbitMQ,
Redis and PostgreSQL, under AMQP and Redis prefixes of its own: it never sees, and never disturbs,
another cluster's or another test run's queues, keys and connections. It ends with a `Result`: the
figures it measured, and one `Check` per threshold (the figure, the bound, whether it held).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aio_pika

from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, HostReport, HostStatus, ScheduleDecision, VmSpec
from vmsched.settings import Settings
from vmsched.store import PendingStore
from vmsched.store.redis import connect
from vmsched_services.tools.procs import ServiceProcess, ServiceStack, delete_broker_objects

Figure = int | float | str


@dataclass(frozen=True)
class Check:
    """One threshold: `figure` (a name in Result.figures) compared with `bound`.

    A timing check (`short_bound` set) holds a latency or recovery time to `bound` only in a long
    run (`vmsched chaos --long`, a machine of its own): in a short run, on a shared and busy CI
    machine, it is held to `short_bound`, a bound only a real regression crosses (a wedged consumer,
    a lock kept until it expires), so the suite asserts invariants and never flakes on a slow second.
    """

    figure: str
    op: str  # "<=", ">=", "=="
    bound: float
    value: float
    short_bound: float | None = None
    long: bool = True

    @property
    def timing(self) -> bool:
        return self.short_bound is not None

    @property
    def applied_bound(self) -> float:
        return self.bound if self.long or self.short_bound is None else self.short_bound

    @property
    def passed(self) -> bool:
        return _compare(self.value, self.op, self.applied_bound)

    def __str__(self) -> str:
        mark = "ok" if self.passed else "FAILED"
        want = f"want {self.op} {_fmt(self.applied_bound)}"
        if self.timing and not self.long:
            held = "holds" if _compare(self.value, self.op, self.bound) else "misses"
            want += f"; {held} the long run's {self.op} {_fmt(self.bound)}"
        return f"{self.figure} = {_fmt(self.value)} ({want}): {mark}"


def _compare(value: float, op: str, bound: float) -> bool:
    return value <= bound if op == "<=" else value >= bound if op == ">=" else value == bound


@dataclass
class Result:
    """What one experiment measured, and whether every threshold held."""

    experiment: str
    size: dict[str, Figure]
    figures: dict[str, Figure] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(ch.passed for ch in self.checks)

    def check(self, figure: str, op: str, bound: float) -> None:
        """Record the threshold `figures[figure] op bound` (the figure must be numeric): an invariant,
        held in every run."""
        self.checks.append(Check(figure, op, bound, self._number(figure)))

    def check_timing(self, figure: str, op: str, bound: float, *, short_bound: float) -> None:
        """Record a latency or recovery-time threshold: `bound` in a long run, `short_bound` (what only
        a real regression crosses) in a short one. Both are printed, so a short run still reports
        whether the long run's bound held."""
        self.checks.append(Check(figure, op, bound, self._number(figure), short_bound=short_bound))

    def judged_as(self, *, long: bool) -> Result:
        """This result with its timing checks judged by the long (or the short) run's bounds."""
        self.checks = [replace(ch, long=long) for ch in self.checks]
        return self

    def _number(self, figure: str) -> float:
        value = self.figures[figure]
        assert not isinstance(value, str), f"figure {figure} is not a number"
        return float(value)

    def failures(self) -> list[str]:
        return [str(ch) for ch in self.checks if not ch.passed]

    def summary(self) -> str:
        """Several lines: verdict, size, every figure, every threshold, notes."""
        lines = [f"{self.experiment}: {'PASSED' if self.passed else 'FAILED'} in {self.elapsed_s:.1f} s"]
        lines.append("  size     " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.size.items()))
        lines.append("  figures  " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items()))
        lines += [f"  check    {ch}" for ch in self.checks]
        lines += [f"  note     {n}" for n in self.notes]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "passed": self.passed,
            "elapsed_s": round(self.elapsed_s, 2),
            "size": self.size,
            "figures": self.figures,
            "checks": [
                {
                    "figure": ch.figure,
                    "op": ch.op,
                    "bound": ch.bound,
                    "applied_bound": ch.applied_bound,
                    "timing": ch.timing,
                    "value": ch.value,
                    "passed": ch.passed,
                }
                for ch in self.checks
            ],
            "notes": self.notes,
        }


@contextlib.contextmanager
def timed(res: Result) -> Iterator[Result]:
    """Time the block (the whole experiment, setup and teardown included) into res.elapsed_s."""
    started = time.monotonic()
    yield res
    res.elapsed_s = time.monotonic() - started


def _fmt(v: Figure) -> str:
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# ---------------------------------------------------------------------- isolation
def scoped_settings(base: Settings, experiment: str, **overrides: Any) -> Settings:
    """`base` with AMQP and Redis prefixes no one else uses (the experiment's own), plus overrides."""
    tag = f"{experiment}-{uuid.uuid4().hex[:6]}"
    return base.model_copy(
        update={
            "amqp_prefix": f"{base.amqp_prefix}chaos-{tag}.",
            "redis_prefix": f"{base.redis_prefix}-chaos-{tag}",
            "log_level": "WARNING",
            **overrides,
        }
    )


#: Timeouts the experiments run with: the Settings defaults, whatever the caller's settings say
#: (the test suite's settings shorten them), because the thresholds are stated against those.
DEFAULT_TIMEOUTS = ("lock_acquire_timeout_s", "lock_hold_timeout_s", "rpc_timeout_s", "pending_ttl_s", "pending_wait_s")


def experiment_settings(base: Settings, experiment: str, **overrides: Any) -> Settings:
    """`scoped_settings` with the DEFAULT_TIMEOUTS at their Settings defaults, then `overrides`."""
    defaults = {n: Settings.model_fields[n].default for n in DEFAULT_TIMEOUTS}
    return scoped_settings(base, experiment, **{**defaults, **overrides})


def run_tag(prefix: str) -> str:
    """A name prefix of the experiment's clusters and VMs, new on every run."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def cleanup(settings: Settings) -> None:
    """Delete the experiment's queues, exchanges and Redis keys (only those under its prefixes)."""

    with contextlib.suppress(Exception):
        await delete_broker_objects(settings)
    redis = connect(settings)
    try:
        with contextlib.suppress(Exception):
            async for key in redis.scan_iter(match=f"{settings.redis_prefix}:*", count=1000):
                await redis.delete(key)
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def running(settings: Settings, log_dir: Path) -> AsyncIterator[ServiceStack]:
    """A ServiceStack under the experiment's settings; everything stopped and deleted on exit."""
    stack = ServiceStack(settings, log_dir)
    try:
        yield stack
    finally:
        try:
            await stack.close()
        except Exception as exc:
            # The figures are measured by now: a teardown failure must not lose them (it is
            # reported; stop_all already SIGKILLed what did not stop).
            print(f"vmsched chaos: stopping the services failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            await cleanup(settings)


# ---------------------------------------------------------------------- clusters and requests
@dataclass
class Host:
    cluster_id: str
    host_id: str
    mem_mb: int
    reserved_mb: int = 256
    overcommit_pct: int = 100

    @property
    def capacity_mb(self) -> float:
        """What the Memory filter may commit on the host (as the demo counts over-commitment)."""
        return self.mem_mb * self.overcommit_pct / 100 - self.reserved_mb


def host_report(h: Host) -> HostReport:
    """The engine's report of `h`: Up, 32 cores, all its memory free."""
    return HostReport(
        cluster_id=h.cluster_id,
        host_id=h.host_id,
        status=HostStatus.UP,
        cpu_cores=32,
        cpu_usage_pct=5.0,
        physical_mem_mb=h.mem_mb,
        mem_free_mb=h.mem_mb,
        reserved_mem_mb=h.reserved_mb,
        networks=["vmnet"],
    )


async def make_clusters(client: SchedulerClient, prefix: str, clusters: int, hosts: int, mem_mb: int) -> list[Host]:
    """Report `clusters` clusters of `hosts` Up hosts each and wait until the state tracker has them."""
    out: list[Host] = []
    for ci in range(clusters):
        cid = f"{prefix}-c{ci}"
        await client.report_cluster(ClusterReport(cluster_id=cid))
        for hi in range(hosts):
            h = Host(cid, f"{cid}-h{hi}", mem_mb)
            out.append(h)
            await client.report_host(host_report(h))
    for ci in range(clusters):
        await client.wait_for_state(f"{prefix}-c{ci}", hosts=hosts, timeout=30)
    return out


#: The memory sizes (MB) of the VMs an experiment asks for, unless it states its own.
VM_SIZES_MB = (512, 1024, 2048)


def random_vm(rng: random.Random, vm_id: str, sizes: tuple[int, ...] = VM_SIZES_MB) -> VmSpec:
    return VmSpec(vm_id=vm_id, mem_mb=rng.choice(sizes), vcpus=rng.choice((1, 2)), networks=["vmnet"])


#: Decision errors worth sending the same request again (a lock held by a dead selector).
#: How long the engine waits before sending again a request answered `state_resyncing`.
RESYNC_PAUSE_S = 0.2
RETRYABLE_CODES = frozenset({"lock_timeout", "rpc_timeout", "no_consumer", "fenced_out", "state_resyncing"})


@dataclass
class Outcome:
    """One request as the engine lived it: its final decision (None: never answered), attempts, latency."""

    cluster_id: str
    vm: VmSpec
    request_id: uuid.UUID
    decision: ScheduleDecision | None = None
    attempts: int = 0
    latency_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    #: Every decision received for this request id (retries included): they must all agree.
    replies: list[ScheduleDecision] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.decision is not None and self.decision.status is not DecisionStatus.ERROR


# ---------------------------------------------------------------------- the stage an experiment runs on
@dataclass
class Stage:
    """An experiment's services, started under its settings; the engine's client on them; and the
    clusters it reported (`clusters` of them, named after `tag`), with their hosts."""

    stack: ServiceStack
    started: list[ServiceProcess]
    client: SchedulerClient
    tag: str
    clusters: int
    hosts: list[Host]

    def requests(self, rng: random.Random, n: int, sizes: tuple[int, ...] = VM_SIZES_MB) -> list[Outcome]:
        """`n` schedule requests for random VMs of `sizes`, dealt to the clusters in turn (none sent yet)."""
        return [
            Outcome(f"{self.tag}-c{i % self.clusters}", random_vm(rng, f"{self.tag}-vm{i}", sizes), uuid.uuid4())
            for i in range(n)
        ]


@contextlib.asynccontextmanager
async def staged(
    settings: Settings, log_dir: Path, services: Sequence[str], *, tag: str, clusters: int, hosts: int, mem_mb: int
) -> AsyncIterator[Stage]:
    """`running` with `services` started and a SchedulerClient on them that reported `clusters` clusters
    of `hosts` Up hosts of `mem_mb` each; on exit the client is closed, then the services stopped and
    the experiment's broker objects and keys deleted (measure what lives there before leaving)."""
    async with running(settings, log_dir) as stack:
        started = await stack.start(*services)
        async with SchedulerClient(settings) as client:
            all_hosts = await make_clusters(client, tag, clusters, hosts, mem_mb)
            yield Stage(stack, started, client, tag, clusters, all_hosts)


async def schedule_with_retries(
    client: SchedulerClient,
    outcome: Outcome,
    *,
    call_timeout: float,
    give_up_after: float,
    retry_codes: frozenset[str] = RETRYABLE_CODES,
    pause_s: float = 0.0,
) -> Outcome:
    """Send the request; on a timeout, a lost connection or a transient error decision (`retry_codes`,
    then a pause of `pause_s`), send it again under the same request id (the selector's decision store
    makes that idempotent), until `give_up_after` seconds have passed since the first send."""
    started = time.monotonic()
    end = started + give_up_after
    while time.monotonic() < end:
        outcome.attempts += 1
        try:
            d = await client.schedule(
                outcome.cluster_id,
                outcome.vm,
                request_id=outcome.request_id,
                explain_scores=False,
                timeout=max(0.5, min(call_timeout, end - time.monotonic())),
            )
        except Exception as exc:  # a timeout, a lost connection, a broker restarting: the engine retries
            outcome.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(0.1)
            continue
        outcome.replies.append(d)
        if d.status is DecisionStatus.ERROR and d.error is not None and d.error.code in retry_codes:
            outcome.errors.append(f"decision error {d.error.code}")
            # A cluster waiting for the engine's full report stays refused for a while: back off.
            await asyncio.sleep(max(pause_s, RESYNC_PAUSE_S if d.error.code == "state_resyncing" else 0.0))
            continue
        outcome.decision = d
        break
    outcome.latency_s = time.monotonic() - started
    return outcome


def placement_faults(outcomes: list[Outcome], hosts: list[Host]) -> dict[str, int]:
    """Duplicates and over-commitment, counted from the decisions the engine received.

    * duplicate_placements: requests answered with different hosts on different replies (a VM
      placed twice), plus VMs that got placements under two request ids.
    * over_committed_hosts: hosts whose placed memory (VM + overhead, every placed VM once)
      exceeds what the host may commit.
    """
    duplicates = 0
    placed_on: dict[str, str] = {}
    committed: dict[str, int] = {}
    for o in outcomes:
        hosts_seen = {r.host_id for r in o.replies if r.status is DecisionStatus.PLACED}
        if len(hosts_seen) > 1:
            duplicates += 1
        d = o.decision
        if d is None or d.status is not DecisionStatus.PLACED:
            continue
        for p in d.placements or []:
            if p.vm_id in placed_on:
                duplicates += 1
                continue
            placed_on[p.vm_id] = p.host_id
            committed[p.host_id] = committed.get(p.host_id, 0) + o.vm.mem_mb + o.vm.overhead_mb
    by_id = {h.host_id: h for h in hosts}
    over = sum(1 for hid, mb in committed.items() if mb > by_id[hid].capacity_mb)
    return {"duplicate_placements": duplicates, "over_committed_hosts": over, "placed": len(placed_on)}


async def pending_duplicates(settings: Settings, outcomes: list[Outcome]) -> int:
    """Pending records that disagree with the decisions: a record for a VM on a host its decision
    did not name, or a record under a request id that is not the VM's (recorded twice)."""

    redis = connect(settings)
    try:
        store = PendingStore(redis, settings)
        expected: dict[str, tuple[str, uuid.UUID]] = {}
        clusters = {o.cluster_id for o in outcomes}
        for o in outcomes:
            if o.decision is not None and o.decision.status is DecisionStatus.PLACED:
                for p in o.decision.placements:
                    expected[p.vm_id] = (p.host_id, o.request_id)
        bad = 0
        for cid in clusters:
            for e in await store.read(cid):
                want = expected.get(e.vm_id)
                if want is None or want != (e.host_id, e.request_id):
                    bad += 1
        return bad
    finally:
        await redis.aclose()


async def every(
    interval: tuple[float, float], rng: random.Random, stop: asyncio.Event, fn: Callable[[], Awaitable[None]]
) -> int:
    """Call `fn` every uniform(*interval) seconds until `stop` is set; returns how often it ran."""
    n = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(*interval))
        if stop.is_set():
            break
        await fn()
        n += 1
    return n


@contextlib.asynccontextmanager
async def periodically(
    interval: tuple[float, float], rng: random.Random, fn: Callable[[], Awaitable[None]]
) -> AsyncIterator[None]:
    """Call `fn` every uniform(*interval) seconds (see `every`) while the block runs; on leaving it,
    stop and wait for a call in progress to end."""
    stop = asyncio.Event()
    task = asyncio.create_task(every(interval, rng, stop, fn))
    try:
        yield
    finally:
        stop.set()
        await task


async def refused_requests(settings: Settings, limit: int = 100_000) -> Counter[str]:
    """What the services dead-lettered themselves (header x-vmsched-reason), by reason, from the
    experiment's own dead-letter queue (consumed). Requests that merely expired in a queue while
    their caller had given up (the broker's own dead-lettering, or "deadline passed") are left out:
    the caller retried those."""

    reasons: Counter[str] = Counter()
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        try:
            q = await ch.declare_queue(settings.amqp_prefix + c.DEAD_LETTER_QUEUE, passive=True)
        except Exception:
            return reasons  # no dead-letter queue: nothing was refused
        for _ in range(limit):
            msg = await q.get(no_ack=True, fail=False, timeout=5)
            if msg is None:
                break
            reason = str(msg.headers.get(c.HEADER_DLX_REASON, ""))
            if reason and not reason.startswith("deadline passed"):
                reasons[reason[:120]] += 1
    finally:
        await conn.close()
    return reasons


async def count_refused(res: Result, settings: Settings, figure: str, note: str, top: int) -> None:
    """`refused_requests` as the figure `figure`, and (if any) a note `note: ` naming the `top` most
    common reasons."""
    refused = await refused_requests(settings)
    res.figures[figure] = sum(refused.values())
    if refused:
        res.notes.append(f"{note}: " + "; ".join(f"{r} x{n}" for r, n in refused.most_common(top)))
