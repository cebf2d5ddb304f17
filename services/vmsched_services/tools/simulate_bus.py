"""`vmsched simulate --over-bus`: a workload replayed with its decisions made by the real services.

The replay is the simulation's own (vmsched.simulation.engine.Simulation: the same event loop, the
same simulated cluster); only its decision seam, `Simulation.decide`, is replaced. Before each
decision the simulated cluster is reported to the state tracker as an engine reports its own (a
ClusterReport once, a HostReport per host that changed, a VmReport per VM started, moved or gone),
the replay waits until the tracker has applied them (the cluster's state version in Redis) and has
cleared the pending record of every VM that settled, then sends the ScheduleRequest to the selector
through SchedulerClient and turns the ScheduleDecision into the engine's Outcome. Each VM the
selector places is reported running before the next decision, as the simulated engine starts it at
once: a decision sees nothing pending but the balancing migrations in flight, in both modes.

What stays in this process: the balancing pass (which VM moves, `balance_pass` on the simulated
clock), as in the plain simulation; the migration's target is the selector's decision, as when the
balancer service asks it. So each run's policy is stored as a copy without its balance unit, named
after the run's own cluster (`simulate-<12 hex>-<policy>`): no balancer service balances the
simulated cluster behind the replay's back. The cluster's state, pending records and decision
history, its policy link and the copy are removed at the end.

Time: the services judge time by the wall clock (the tracker stamps a CPU sample when it applies a
host report; a decision's instant is when it is made), the simulation by its own clock, which runs
hours in seconds. A decision that depends on how long something lasted can therefore differ:
CPUOverloaded removes a host over HighUtilization for CpuOverCommitDurationMinutes of simulated
time in process, while over the bus the same overload has lasted wall milliseconds. Pending records
expire by the wall clock too (VMSCHED_PENDING_TTL_S), which only a migration in flight for that long
in wall time would notice. Every run is therefore also replayed in process, and the report lists the
decisions that differ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aio_pika

from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterAttachment,
    ClusterReport,
    DecisionStatus,
    HostReport,
    Placement,
    PolicyDocument,
    PolicySet,
    RequestKind,
    ScheduleDecision,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.db import migrate
from vmsched.errors import CommandError, RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.scheduling.placement import Outcome, Placed, Unplaceable, pending_entry
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.policy_docs import document_of, policy_units
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.simulation.engine import Counts, Sampler, Simulation, Timing
from vmsched.simulation.hostseries import HostSeries
from vmsched.simulation.plots import require_matplotlib
from vmsched.simulation.report import PolicyReport, Recorder, policy_report
from vmsched.simulation.workload import Workload
from vmsched.store import DecisionStore, PendingStore
from vmsched.store.redis import connect as connect_redis
from vmsched_services.runner import run as run_services
from vmsched_services.tools.demo import forget_clusters
from vmsched_services.tools.procs import consumer_count
from vmsched_services.tools.simulate import emit, policies_of, workload_of
from vmsched_services.tools.stats import percentile

#: Every replay's cluster id starts with this (then 12 hex digits): `vmsched clusters list` tells them.
CLUSTER_PREFIX = "simulate-"
#: How long the state tracker may take to apply one decision's reports.
CATCH_UP_TIMEOUT_S = 30.0
#: How long the end of a replay waits for the tracker to apply the cluster's removal.
REMOVAL_TIMEOUT_S = 10.0
#: Polling the state version: the tracker applies a report in about a millisecond.
POLL_S = 0.002
#: How long a simulated placement's pending record would count (the engine's own figure, unused:
#: the engine starts a placed VM at once).
PENDING_S = 60.0


# ------------------------------------------------------------------------------ decisions, recorded
@dataclass(frozen=True)
class Decided:
    """One decision of a replay: when (simulated seconds), for what, and the host chosen (None: not placed)."""

    at_s: float
    kind: RequestKind
    vm_id: str
    host_id: str | None

    def text(self) -> str:
        what = "migration of" if self.kind is RequestKind.MIGRATE else "arrival of"
        return f"{what} {self.vm_id} at {self.at_s:g} s"


class RecordingSimulation(Simulation):
    """A Simulation that keeps its decisions in order (arrivals and balancing migrations) and the
    wall time each took. In process: the engine's own decisions."""

    def __init__(self, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> None:
        super().__init__(workload, policy, sampler)
        self.decisions: list[Decided] = []
        self.decide_s: list[float] = []
        #: Wall seconds of the whole run (set by `run`).
        self.wall_s = 0.0

    async def run(self) -> Counts:
        began = time.perf_counter()
        try:
            await self.prepare()
            return await super().run()
        finally:
            self.wall_s = time.perf_counter() - began

    async def prepare(self) -> None:
        """Before the first event (nothing to do in process)."""

    async def decide(self, request: ScheduleRequest, now: float) -> Outcome:
        began = time.perf_counter()
        outcome = await self.decision(request, now)
        self.decide_s.append(time.perf_counter() - began)
        host = outcome.placements[0].host_id if isinstance(outcome, Placed) else None
        self.decisions.append(Decided(self.clock, request.kind, request.vm.vm_id, host))
        return outcome

    async def decision(self, request: ScheduleRequest, now: float) -> Outcome:
        """How a decision is made: here, in process (`place` with the policy's local steps)."""
        return await super().decide(request, now)

    @property
    def placements(self) -> dict[str, str | None]:
        """Each VM -> the host its last start was placed on (None: not placed): an arrival, or an
        HA VM's restart after its host failed."""
        return {d.vm_id: d.host_id for d in self.decisions if d.kind is RequestKind.RUN}

    def timing(self) -> Timing:
        return Timing(self.wall_s, self.sampling_s, self.clock)


@dataclass
class _Reported:
    """What the state tracker has been told about the simulated cluster."""

    hosts: dict[str, HostReport] = field(default_factory=dict)
    vms: dict[str, VmReport] = field(default_factory=dict)
    #: Host -> the VMs last reported on it.
    on_host: dict[str, set[str]] = field(default_factory=dict)
    #: VMs the selector placed (started or migrated) whose pending record is still to be cleared by
    #: a report of where they are, with their spec (to report one that left before it was reported).
    awaiting: dict[str, VmSpec] = field(default_factory=dict)
    #: Reports published: each one makes exactly one new state version.
    published: int = 0


class BusSimulation(RecordingSimulation):
    """The simulation with each decision made by the selector, after the state tracker was brought
    up to date with the simulated cluster (see the module's docstring). `cluster_id` is the cluster
    it reports as; its policy must already be attached to it (`replay` stores and attaches it).

    It reads the engine's own record of the cluster (`_changed`, the hook every host change goes
    through, and `_vms`, each host's VMs): were either renamed, the tracker would miss changes and
    the over-bus tests, which compare every decision with the in-process replay's, would fail."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        sampler: Sampler | None = None,
        *,
        client: SchedulerClient,
        pending: PendingStore,
        cluster_id: str,
        catch_up_timeout_s: float = CATCH_UP_TIMEOUT_S,
    ) -> None:
        #: Hosts changed since they were last reported (set before the engine can note a change).
        self._unreported: set[str] = set()
        super().__init__(workload, policy, sampler)
        self.cluster_id = cluster_id
        self.catch_up_timeout_s = catch_up_timeout_s
        self._client = client
        self._pending_store = pending
        self._reported = _Reported()
        self._version_base = 0
        #: The requests sent (their decisions are stored under these ids until the replay's end).
        self.request_ids: list[uuid.UUID] = []
        #: Per decision, wall seconds: reporting and waiting for the tracker, then the schedule call.
        self.report_s: list[float] = []
        self.call_s: list[float] = []

    # ------------------------------------------------------------------ the engine's hooks
    def _changed(self, host_id: str, *, load: bool = False) -> None:
        super()._changed(host_id, load=load)
        self._unreported.add(host_id)

    async def prepare(self) -> None:
        """Register the cluster: its settings and every host, as the engine knows them at the start."""
        _, _, version = await self._pending_store.snapshot_with_state(self.cluster_id)
        self._version_base = version or 0
        await self._publish(self.settings.model_copy(update={"cluster_id": self.cluster_id}))
        for host_id in self.workload.host_ids():
            await self._report_host(host_id)
        self._unreported.clear()
        await self._caught_up()

    async def decision(self, request: ScheduleRequest, now: float) -> Outcome:
        began = time.perf_counter()
        before = self._reported.published
        await self._report_changes()
        if self._reported.published != before:
            await self._caught_up()
        sent = time.perf_counter()
        # A fresh request id: decisions are stored under theirs, and the engine numbers its own from 1.
        ours = request.model_copy(update={"cluster_id": self.cluster_id, "request_id": uuid.uuid4()})
        self.request_ids.append(ours.request_id)
        decision = await self._client.send(ours)
        self.report_s.append(sent - began)
        self.call_s.append(time.perf_counter() - sent)
        return self._outcome(request, decision, now)

    # ------------------------------------------------------------------ reporting
    async def _report_changes(self) -> None:
        """Report what changed since the last decision: the VMs that settled, started, moved or
        left, then the hosts whose report changed."""
        rep = self._reported
        in_flight = {e.vm_id for e in self.pending()}
        vms: dict[str, VmReport] = {}
        # A VM the selector placed is reported wherever it is now (or gone), changed or not: that
        # report is what clears its pending record. A VM still starting (start_delay_s) or a
        # migration still in flight keeps its record, as the engine's pending does.
        for vm_id in [v for v in rep.awaiting if v not in in_flight]:
            spec = rep.awaiting.pop(vm_id)
            vms[vm_id] = self._vm_now(vm_id) or VmReport(
                cluster_id=self.cluster_id, vm_id=vm_id, status=VmStatus.DOWN, mem_mb=spec.mem_mb, vcpus=spec.vcpus
            )
        hosts = sorted(self._unreported)
        self._unreported.clear()
        for host_id in hosts:
            here = self._vms[host_id]
            for vm_id in here:
                now = self._vm_now(vm_id)
                if now is not None and rep.vms.get(vm_id) != now:
                    vms[vm_id] = now
            for vm_id in sorted(rep.on_host.get(host_id, set()) - set(here)):
                if self.where(vm_id) is None and vm_id not in vms:  # gone (departed, lost), not moved
                    vms[vm_id] = rep.vms[vm_id].model_copy(update={"status": VmStatus.DOWN, "host_id": None})
        for vm_id in sorted(vms):
            await self._publish(vms[vm_id])
        for host_id in hosts:
            await self._report_host(host_id)

    def _vm_now(self, vm_id: str) -> VmReport | None:
        host_id = self.where(vm_id)
        if host_id is None:
            return None
        return self._vms[host_id][vm_id].model_copy(update={"cluster_id": self.cluster_id})

    async def _report_host(self, host_id: str) -> None:
        report = self.host_state(host_id).report.model_copy(update={"cluster_id": self.cluster_id})
        if self._reported.hosts.get(host_id) != report:
            await self._publish(report)

    async def _publish(self, report: ClusterReport | HostReport | VmReport) -> None:
        rep = self._reported
        if isinstance(report, VmReport):
            await self._client.report_vm(report)
            old = rep.vms.pop(report.vm_id, None)
            if old is not None and old.host_id is not None:
                rep.on_host.get(old.host_id, set()).discard(report.vm_id)
            if report.status is VmStatus.RUNNING and report.host_id is not None:
                rep.vms[report.vm_id] = report
                rep.on_host.setdefault(report.host_id, set()).add(report.vm_id)
        elif isinstance(report, HostReport):
            await self._client.report_host(report)
            rep.hosts[report.host_id] = report
        else:
            await self._client.report_cluster(report)
        rep.published += 1

    async def _caught_up(self) -> None:
        """Wait until the tracker has applied every report published (the state version) and holds
        no pending record but those of the VMs starting and the migrations in flight."""
        want = self._version_base + self._reported.published
        in_flight = {e.vm_id for e in self.pending()}
        loop = asyncio.get_running_loop()
        end = loop.time() + self.catch_up_timeout_s
        while True:
            _, pending, version = await self._pending_store.snapshot_with_state(self.cluster_id)
            # A record may have expired (wall clock) while the engine still has its flight: a subset.
            if version is not None and version >= want and all(e.vm_id in in_flight for e in pending):
                return
            if loop.time() > end:
                raise CommandError(
                    f"the state tracker has not applied the simulation's reports within {self.catch_up_timeout_s:g} s "
                    f"(cluster {self.cluster_id}: state version {version}, {want} expected; "
                    f"{len(pending)} pending record(s), {len(in_flight)} expected)",
                    hint="is the state-tracker running and keeping up (`vmsched run state-tracker`)? "
                    "Its log says why a report was refused",
                )
            await asyncio.sleep(POLL_S)

    def _outcome(self, request: ScheduleRequest, decision: ScheduleDecision, now: float) -> Outcome:
        if decision.status is DecisionStatus.PLACED and decision.host_id is not None:
            placements = decision.placements or [
                Placement(vm_id=request.vm.vm_id, host_id=decision.host_id, alternates=decision.alternates)
            ]
            specs = {vm.vm_id: vm for vm in request.vms}
            for p in placements:
                self._reported.awaiting[p.vm_id] = specs[p.vm_id]
            entries = [
                pending_entry(
                    specs[p.vm_id],
                    p.host_id,
                    request_id=request.request_id,
                    fencing_token=decision.fencing_token,
                    expires_at=now + PENDING_S,
                )
                for p in placements
            ]
            return Placed(list(placements), entries, decision.explanation)
        if decision.status is DecisionStatus.UNPLACEABLE:
            return Unplaceable(decision.explanation)
        if decision.error is not None:
            raise RemoteError(decision.error.code, decision.error.message)
        status = decision.status.value
        raise RemoteError(status, f"the selector answered {status} for {request.vm.vm_id}")


# ------------------------------------------------------------------------------ the services
def needed_services(settings: Settings) -> list[str]:
    """The services a replay talks to, in start order: the tracker takes the reports, the selector
    decides with the filter-workers (and the weigher, when it weighs through one), policy-admin
    stores the run's policy."""
    names = ["state-tracker", "filter-worker", "selector", "policy-admin"]
    if not settings.place_in_worker:
        names.insert(1, "weigher")
    return names


@dataclass
class Services:
    """What a replay talks to: the bus (as the engine, and as the policy administrator) and Redis."""

    settings: Settings
    client: SchedulerClient
    admin: PolicyClient
    pending: PendingStore
    decisions: DecisionStore
    #: The services this process started (those no process was serving).
    started: list[str]


async def running_services(settings: Settings, names: Sequence[str]) -> list[str]:
    """Those of `names` with a consumer on their RPC queue (running somewhere)."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        return [n for n in names if await consumer_count(conn, settings, n) > 0]
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def services(settings: Settings) -> AsyncIterator[Services]:
    """The bus, Redis and the services a replay needs. Those no process serves yet run in this one
    until the block ends (as `vmsched demo` runs them); those that do are used as they are, so a
    second state tracker never splits the reports of a cluster with the running one.

    A server that does not answer raises the library's error for it (BusUnavailable, Redis's
    ConnectionError, DatabaseUnavailable), which the CLI says in a sentence.
    """
    async with SchedulerClient(settings) as client:
        redis = connect_redis(settings)
        try:
            await redis.ping()
            needed = needed_services(settings)
            running = await running_services(settings, needed)
            missing = [n for n in needed if n not in running]
            stop = asyncio.Event()
            task = await _start(missing, settings, stop) if missing else None
            try:
                admin = PolicyClient(settings, bus=client.bus)
                stores = PendingStore(redis, settings), DecisionStore(redis, settings)
                yield Services(settings, client, admin, *stores, missing)
            finally:
                stop.set()
                if task is not None:
                    await task
        finally:
            await redis.aclose()


async def _start(names: list[str], settings: Settings, stop: asyncio.Event) -> asyncio.Task[None]:
    await migrate(settings.postgres_url)  # the selector reads policies; idempotent
    quiet = settings.model_copy(
        update={
            # They share the command's terminal: warnings only, as readable lines.
            "log_level": "WARNING",
            "log_format": "console",
            # A metrics port is the running services' (`vmsched up`), not this command's.
            "metrics_port": 0,
            # The simulated engine never waits for pending resources to free (it has none but its
            # migrations'): an unplaceable VM is answered at once instead of after a bounded wait.
            "pending_wait_s": 0.0,
        }
    )
    ready = asyncio.Event()
    task = asyncio.create_task(run_services(names, quiet, stop=stop, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises why the services could not start
    # The runner stops the services on Ctrl-C; the command is what should stop (exit 130).
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    return task


# ------------------------------------------------------------------------------ one replay
def stored_policy(policy: Policy, name: str) -> PolicyDocument:
    """The policy as a replay stores it for its cluster, under `name`: without its balance unit (the
    pass runs in this process), with only the properties its filters and weights read (policy-admin
    refuses a property no unit of the policy reads; the others were the balance unit's)."""
    placing = policy.model_copy(update={"balance": None, "name": name})
    read = {p for unit in policy_units(placing, REGISTRY) for p in unit.properties}
    doc = document_of(placing)
    return doc.model_copy(update={"properties": {k: v for k, v in doc.properties.items() if k in read}})


async def replay(svc: Services, workload: Workload, policy: Policy, sampler: Sampler | None = None) -> BusSimulation:
    """Replay `workload` under `policy` over the bus, on a cluster of its own, removed at the end."""
    cluster_id = f"{CLUSTER_PREFIX}{uuid.uuid4().hex[:12]}"
    sim = BusSimulation(workload, policy, sampler, client=svc.client, pending=svc.pending, cluster_id=cluster_id)
    name = f"{cluster_id}-{policy.name}"[:128]
    attach = ClusterAttachment(cluster_id=cluster_id, policy=name)
    await svc.admin.apply(PolicySet(policies=[stored_policy(sim.policy, name)], clusters=[attach]))
    try:
        await sim.run()
    except BaseException:
        with contextlib.suppress(Exception):  # the first failure is the one to tell
            await forget(svc, cluster_id, name, sim.request_ids)
        raise
    await forget(svc, cluster_id, name, sim.request_ids)
    return sim


async def forget(svc: Services, cluster_id: str, policy_name: str, request_ids: Sequence[uuid.UUID] = ()) -> None:
    """Remove a replay's cluster (state and pending records, through the state tracker, then every
    key left: decision history, memories), its stored decisions and its policy copy."""
    await svc.client.remove_cluster(cluster_id, reason="vmsched simulate --over-bus: the replay is over")
    loop = asyncio.get_running_loop()
    end = loop.time() + REMOVAL_TIMEOUT_S
    while loop.time() < end:
        _, _, version = await svc.pending.snapshot_with_state(cluster_id)
        if version is None:  # the tracker has applied the removal
            break
        await asyncio.sleep(0.01)
    await svc.admin.detach(cluster_id)
    await svc.admin.delete(policy_name)
    await forget_clusters(svc.settings, [cluster_id])
    for request_id in request_ids:
        await svc.decisions.delete(request_id)


# ------------------------------------------------------------------------------ comparing
@dataclass(frozen=True)
class Difference:
    """The n-th decision of the two replays, where they differ (None: that replay made fewer)."""

    index: int
    in_process: Decided | None
    over_bus: Decided | None

    def text(self) -> str:
        first = self.over_bus or self.in_process
        assert first is not None

        def host(d: Decided | None) -> str:
            if d is None:
                return "no such decision"
            if d.vm_id != first.vm_id or d.kind is not first.kind:
                return f"[{d.text()}]"
            return d.host_id or "not placed"

        return f"{first.text()}: {host(self.over_bus)} over the bus, {host(self.in_process)} in process"


def differences(in_process: Sequence[Decided], over_bus: Sequence[Decided]) -> list[Difference]:
    """The decisions that differ, position by position (once one differs, the cluster does, and
    later ones may follow)."""
    return [Difference(n, a, b) for n, (a, b) in enumerate(itertools.zip_longest(in_process, over_bus)) if a != b]


@dataclass(frozen=True)
class BusSummary:
    """One policy's replay over the bus against the same replay in process."""

    policy: str
    decisions: int
    #: Of them, balancing migrations' targets asked of the selector (placed or not).
    migration_decisions: int
    #: Wall milliseconds per decision over the bus (reporting + waiting for the tracker + the call).
    bus_ms_mean: float
    bus_ms_p50: float
    bus_ms_p99: float
    #: Of it: reports and the wait for the tracker; the schedule call.
    report_ms_mean: float
    call_ms_mean: float
    #: Wall milliseconds per decision in process, and the whole replays' wall seconds.
    in_process_ms_mean: float
    bus_wall_s: float
    in_process_wall_s: float
    differences: list[Difference]

    @property
    def identical(self) -> bool:
        return not self.differences

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["differences"] = [d.text() for d in self.differences]
        data["identical"] = self.identical
        return data


def _ms(values: Sequence[float]) -> float:
    return round(1000.0 * sum(values) / len(values), 3) if values else 0.0


def summary_of(policy: str, local: RecordingSimulation, bus: BusSimulation) -> BusSummary:
    per = [r + c for r, c in zip(bus.report_s, bus.call_s, strict=True)]
    return BusSummary(
        policy=policy,
        decisions=len(bus.decisions),
        migration_decisions=sum(d.kind is RequestKind.MIGRATE for d in bus.decisions),
        bus_ms_mean=_ms(per),
        bus_ms_p50=round(1000.0 * percentile(per, 50), 3),
        bus_ms_p99=round(1000.0 * percentile(per, 99), 3),
        report_ms_mean=_ms(bus.report_s),
        call_ms_mean=_ms(bus.call_s),
        in_process_ms_mean=_ms(local.decide_s),
        bus_wall_s=round(bus.wall_s, 3),
        in_process_wall_s=round(local.wall_s, 3),
        differences=differences(local.decisions, bus.decisions),
    )


@dataclass(frozen=True)
class OverBus:
    """What `vmsched simulate --over-bus` reports: each policy's replay over the bus, compared."""

    runs: list[tuple[PolicyReport, HostSeries | None]]
    summaries: list[BusSummary]
    started: list[str]


async def run_over_bus(
    settings: Settings, workload: Workload, policies: Sequence[Policy], *, per_host: bool = False
) -> OverBus:
    """Each policy replayed in process, then over the bus (its report is the bus replay's; with
    `per_host`, every host's utilisation over time too, for --plot)."""
    hosts = len(workload.host_ids())
    runs: list[tuple[PolicyReport, HostSeries | None]] = []
    summaries: list[BusSummary] = []
    async with services(settings) as svc:
        for policy in policies:
            local = RecordingSimulation(workload, policy)
            await local.run()
            recorder = Recorder(workload.cluster.vcpus_per_cpu, per_host=per_host)
            bus = await replay(svc, workload, policy, recorder)
            report = policy_report(
                policy.name, hosts, bus.counts, bus.timing(), recorder.samples, bus.policy.properties
            )
            runs.append((report, recorder.hosts))
            summaries.append(summary_of(policy.name, local, bus))
        started = list(svc.started)
    return OverBus(runs, summaries, started)


def main(args: argparse.Namespace, settings: Settings) -> int:
    """`vmsched simulate --over-bus`: the workload and policies as `vmsched simulate` reads them."""
    workload = workload_of(args)
    if args.plot:
        require_matplotlib()  # before the replay, not after it
    policies = policies_of(args.policy, workload)
    result = asyncio.run(run_over_bus(settings, workload, policies, per_host=bool(args.plot)))
    extra = {"over_bus": {"services_started": result.started, "policies": [s.as_json() for s in result.summaries]}}
    text = render_over_bus(result)
    return emit(args, workload, result.runs, how=", decided over the bus", json_extra=extra, text_extra=text)


#: Differences listed per policy; the rest are counted.
SHOWN_DIFFERENCES = 5


def render_over_bus(result: OverBus) -> str:
    """The lines under the report's table: per policy, the cost of a decision over the bus against
    in process, and whether the decisions were the same."""
    where = (
        f"services started in this process: {', '.join(result.started)}"
        if result.started
        else "the services already running"
    )
    lines = [f"\nover the bus ({where}); the same replay in process for comparison:"]
    width = max((len(s.policy) for s in result.summaries), default=0)
    for s in result.summaries:
        slower = s.bus_ms_mean / s.in_process_ms_mean if s.in_process_ms_mean > 0 else 0.0
        lines.append(
            f"  {s.policy:<{width}}  {s.decisions} decisions ({s.migration_decisions} for migrations): "
            f"{s.bus_ms_mean:.1f} ms each "
            f"over the bus (p50 {s.bus_ms_p50:.1f}, p99 {s.bus_ms_p99:.1f}; reports and catch-up "
            f"{s.report_ms_mean:.1f}, schedule call {s.call_ms_mean:.1f}), {s.in_process_ms_mean:.2f} ms in process "
            f"({slower:.0f}x); "
            f"replay {s.bus_wall_s:.2f} s against {s.in_process_wall_s:.2f} s"
        )
        if s.identical:
            lines.append(f"  {'':<{width}}  every decision the same as in process")
            continue
        lines.append(
            f"  {'':<{width}}  {len(s.differences)} of {s.decisions} decisions differ from in process (a decision "
            "that depends on elapsed time: the services judge it by the wall clock):"
        )
        lines.extend(f"  {'':<{width}}    {d.text()}" for d in s.differences[:SHOWN_DIFFERENCES])
        if len(s.differences) > SHOWN_DIFFERENCES:
            lines.append(f"  {'':<{width}}    and {len(s.differences) - SHOWN_DIFFERENCES} more")
    return "\n".join(lines)


__all__ = [
    "CLUSTER_PREFIX",
    "BusSimulation",
    "BusSummary",
    "Decided",
    "Difference",
    "OverBus",
    "RecordingSimulation",
    "Services",
    "differences",
    "forget",
    "main",
    "needed_services",
    "render_over_bus",
    "replay",
    "run_over_bus",
    "running_services",
    "services",
    "stored_policy",
    "summary_of",
]
