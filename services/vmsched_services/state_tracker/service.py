"""state-tracker: the writer of cluster state (several may run: they take turns on the state queue,
one active consumer at a time, constants.SINGLE_ACTIVE_QUEUES; the others stand by).

Consumes the engine's reports (state.cluster.*, state.host.*, state.vm.*) and removals
(state.host-removed.*, state.cluster-removed.*) from a durable queue, keeps every cluster versioned
in Redis (vmsched.store.StateWriter), clears a VM's pending record once the VM is reported running
(or failed, or down), and answers state requests (RPC `state`) and the reads of callers without
Redis (RPCs `clusters.list`, `decisions.recent`, `decisions.get`: state_tracker.reads). A removed
cluster's pending records and HA status go with its state.
Removals are taken only from an administrator (VMSCHED_ADMIN_USERS) or the policy-admin service
(VMSCHED_POLICY_ADMIN_USER), which publishes them on an administrator's authorized request: from
any other sender, as the broker vouches for it (AMQP user_id), they are refused (NotAuthorized) and
dead-lettered with why, so an engine's credentials cannot delete a cluster's state.
Order matters: the state is applied (version bumped) *before* the pending record is cleared, and
the selector reads pending *before* the state version, so a VM is never counted nowhere.
Reports that wait together are applied together (state_tracker.batches): a run of one cluster's
host and VM reports is one state commit, then one round trip takes the pending records of the VMs
it settled; what is stored is what applying them one at a time stores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import cast

from vmsched import constants as c
from vmsched.contracts import (
    ClusterQuery,
    ClusterRemoved,
    ClusterReport,
    ClusterState,
    DecisionQuery,
    DecisionRef,
    HostRemoved,
    HostReport,
    Message,
    PendingEntry,
    ResyncComplete,
    ResyncRequested,
    StateReports,
    StateRequest,
    VmReport,
    VmStatus,
)
from vmsched.logging import get_logger
from vmsched.metrics import STATE_REPORTS
from vmsched.runtime import Runtime
from vmsched.store import PendingStore, StateWriter
from vmsched.store.memories import FailedHosts, HaStatus
from vmsched_services.authz import require_one_of
from vmsched_services.state_tracker.batches import MAX_BATCH, ReportQueue
from vmsched_services.state_tracker.gauges import HostGauges, Refresher
from vmsched_services.state_tracker.reads import Reads

log = get_logger("vmsched.state_tracker")

#: Who a refused removal should have come from, as the refusal says it.
REMOVERS = "VMSCHED_ADMIN_USERS or VMSCHED_POLICY_ADMIN_USER"

#: Statuses after which a VM no longer needs its pending record.
_SETTLED = {VmStatus.RUNNING, VmStatus.FAILED, VmStatus.DOWN}


def _run_of(report: Message) -> str | None:
    """The cluster whose run of reports this one may join (batches.ReportQueue); None: alone."""
    return report.cluster_id if isinstance(report, HostReport | VmReport) else None


def _ended_elsewhere(report: VmReport, entry: PendingEntry) -> bool:
    """Whether a settled VM did not end up on the host it was placed on (failed, or elsewhere)."""
    return report.status is VmStatus.FAILED or (report.host_id is not None and report.host_id != entry.host_id)


def received(report: Message) -> Message:
    """The report with `reported_at` as the contract defines an absent one: the time the state
    tracker takes it. Stored as given, an absent time read as "no heartbeat ever" and put every
    host of an engine that leaves it out behind ComputeFilter."""
    if isinstance(report, HostReport | VmReport | ClusterReport) and report.reported_at is None:
        return report.model_copy(update={"reported_at": datetime.now(UTC)})
    return report


class StateTracker:
    def __init__(self, rt: Runtime, *, max_batch: int = MAX_BATCH) -> None:
        self.rt = rt
        self.writer = StateWriter(rt.redis, rt.settings, recover=rt.recovery)
        self.pending = PendingStore(rt.redis, rt.settings)
        self.failed_hosts = FailedHosts(rt.redis, rt.settings)
        self.ha_status = HaStatus(rt.redis, rt.settings)
        self.host_gauges = HostGauges(self.writer)
        # aio-pika runs one task per delivery; tasks reach this queue in delivery order, so reports
        # are applied in the order the engine published them (those waiting together: batches).
        self.queue = ReportQueue(self._apply, self._apply_run, _run_of, max_batch=max_batch)
        self.removers = rt.settings.admin_user_names | {rt.settings.policy_admin_user}

    async def load(self) -> None:
        await self.writer.load()
        self.host_gauges.export_all()

    async def on_report(self, report: Message) -> None:
        if isinstance(report, HostRemoved | ClusterRemoved):
            # Checked before taking a turn: a refusal changes nothing, so it waits for no one.
            require_one_of(self.removers, "removals need", REMOVERS, message="event")
        if isinstance(report, StateReports):
            await self._on_reports(report)
            return
        await self.queue.submit(received(report))

    async def _on_reports(self, message: StateReports) -> None:
        """Its reports join the queue as lone ones would, in its order. Acked once all are in; a
        server away fails it whole (delivered again: a report applied twice stores what it did
        once); reports refused for what they say are logged by position and the message dead-lettered
        with the first one's reason, the rest staying applied."""
        reports = message.reports()
        outcomes = await self.queue.submit_all([received(r) for r in reports])
        failed = [(i, exc) for i, exc in enumerate(outcomes) if exc is not None]
        if not failed:
            return
        away = next((exc for _, exc in failed if self._away(exc)), None)
        if away is not None:
            raise away
        log.warning(
            "reports of a StateReports refused; the others are applied",
            cluster=message.cluster_id,
            refused=[f"{StateReports.position(i, len(message.hosts))}: {exc}" for i, exc in failed],
            of=len(reports),
        )
        # Its dead letter says why the first was refused (the log line names them all).
        raise failed[0][1]

    async def _apply(self, report: Message) -> None:
        if isinstance(report, ResyncComplete):
            await self._resync_complete(report)
        elif isinstance(report, ResyncRequested):
            return  # vmsched's own request to the engine, seen on the way (state.#): nothing to apply
        elif isinstance(report, HostReport | VmReport):
            (failure,) = await self._apply_run(report.cluster_id, [report])
            if failure is not None:
                raise failure
        elif isinstance(report, ClusterReport):
            await self.writer.apply_cluster(report)
            STATE_REPORTS.labels("cluster").inc()
        elif isinstance(report, HostRemoved):
            version = await self.writer.remove_hosts(report.cluster_id, report.host_ids)
            STATE_REPORTS.labels("host_removed").inc()
            self.host_gauges.export(report.cluster_id)
            log.info("hosts removed", cluster=report.cluster_id, hosts=report.host_ids, version=version)
        elif isinstance(report, ClusterRemoved):
            # State first: once it is gone the selector answers unknown_cluster and adds no pending.
            had = await self.writer.remove_cluster(report.cluster_id)
            await self.pending.forget(report.cluster_id)
            await self.ha_status.set_failing(report.cluster_id, [])
            STATE_REPORTS.labels("cluster_removed").inc()
            self.host_gauges.forget(report.cluster_id)
            log.info("cluster removed", cluster=report.cluster_id, version=had)

    async def _apply_run(self, cluster_id: str, reports: Sequence[Message]) -> list[BaseException | None]:
        """Apply a run of one cluster's host and VM reports (batches.ReportQueue; a lone report is a
        run of one): their state in one commit, then, for the VMs it settled, the pending records
        in one round trip (state first: see the module docstring). Returns each report's outcome.
        A run that fails is applied again one report at a time, so a bad report is refused alone;
        one that failed because a server is away fails whole (each report is tried again later, as
        one alone would be)."""
        state = [r for r in reports if isinstance(r, HostReport | VmReport)]
        if len(state) != len(reports):
            raise TypeError("only host and VM reports are applied as a run")
        try:
            await self.writer.apply_reports(cluster_id, state)
        except Exception as exc:
            if len(state) == 1 or self._away(exc):
                return [exc] * len(state)
            log.warning("a run of reports failed; applying them one at a time", cluster=cluster_id, error=str(exc))
            return [outcome for r in state for outcome in await self._apply_run(cluster_id, [r])]
        hosts = sum(1 for r in state if isinstance(r, HostReport))
        STATE_REPORTS.labels("host").inc(hosts)
        STATE_REPORTS.labels("vm").inc(len(state) - hosts)
        if hosts:
            self.host_gauges.export(cluster_id)
        outcomes: list[BaseException | None] = [None] * len(state)
        settled = [i for i, r in enumerate(state) if isinstance(r, VmReport) and r.status in _SETTLED]
        if settled:
            failures = await self._settle(cluster_id, [cast(VmReport, state[i]) for i in settled])
            for i, failure in zip(settled, failures, strict=True):
                outcomes[i] = failure
        return outcomes

    async def _settle(self, cluster_id: str, settled: Sequence[VmReport]) -> list[BaseException | None]:
        """These VMs' starts or migrations are over (reports of one cluster, in order, their state
        applied): clear their pending records, and for a VM that did not end up on the host it was
        placed on (failed, or still on its source), remember that host so its next migrations
        avoid it (the Retry idea). One round trip, plus one for the failed hosts when there are
        any. A VM settled twice: its record is the first report's to judge, as the second, alone,
        would have found none. Returns each report's outcome (its state is in either way)."""
        try:
            taken = await self.pending.take(cluster_id, [r.vm_id for r in settled])
            tried: list[tuple[str, str]] = []
            for r in settled:
                entry = taken.pop(r.vm_id, None)
                if entry is not None and _ended_elsewhere(r, entry):
                    tried.append((r.vm_id, entry.host_id))
                    log.info("placement failed; host remembered", vm=r.vm_id, host=entry.host_id)
            await self.failed_hosts.remember_all(cluster_id, tried)
        except Exception as exc:
            if len(settled) == 1 or self._away(exc):
                return [exc] * len(settled)
            return [failure for r in settled for failure in await self._settle(cluster_id, [r])]
        return [None] * len(settled)

    def _away(self, exc: BaseException) -> bool:
        """Whether the bus would take `exc` for a server being away (tried again, not refused)."""
        return self.rt.bus.dispatcher.unavailable(exc) is not None

    async def _resync_complete(self, done: ResyncComplete) -> None:
        outcome = await self.rt.recovery.markers.complete(done.cluster_id, done.generation, done.hosts, done.vms)
        if outcome > 0:
            log.info(
                "resync complete: scheduling the cluster again", cluster=done.cluster_id, generation=done.generation
            )
        elif outcome == 0:
            log.info(
                "resync reported; waiting for its reports", cluster=done.cluster_id, hosts=done.hosts, vms=done.vms
            )
        else:
            log.info("resync complete for a generation not awaited; ignored", cluster=done.cluster_id)

    async def handle_state(self, req: StateRequest) -> ClusterState:
        # Pending read first, as the selector reads it: a record cleared meanwhile shows its VM in
        # the state instead, never nowhere.
        pending = await self.pending.read(req.cluster_id)
        state = await self.rt.state.snapshot(req.cluster_id)
        return state.model_copy(update={"pending": pending})


async def start(rt: Runtime) -> None:
    tracker = StateTracker(rt)
    await tracker.load()
    await rt.bus.subscribe(
        [c.STATE_EVENTS_BINDING],
        [
            ClusterReport,
            HostReport,
            VmReport,
            StateReports,
            HostRemoved,
            ClusterRemoved,
            ResyncComplete,
            ResyncRequested,
        ],
        tracker.on_report,
        queue=c.STATE_EVENTS_QUEUE,
    )
    reads = Reads(rt)
    await rt.bus.serve(c.RPC_CLUSTERS_LIST, ClusterQuery, reads.clusters)
    await rt.bus.serve(c.RPC_DECISIONS_RECENT, DecisionQuery, reads.recent)
    await rt.bus.serve(c.RPC_DECISIONS_GET, DecisionRef, reads.get)
    # Last: its consumer is what shows the tracker is up (vmsched_services.tools.procs.READY_ROUTE).
    await rt.bus.serve(c.RPC_STATE, StateRequest, tracker.handle_state)
    if rt.settings.metrics_port:
        rt.spawn(Refresher(rt, tracker.writer).run(), name="gauges")
    rt.spawn(_ask_again_every(tracker, rt.settings.resync_repeat_s), name="resync-requests")
    rt.spawn(_close_when_stopped(tracker), name="state-reports-closer")


async def _close_when_stopped(tracker: StateTracker) -> None:
    """Runs until the runtime stops (Runtime.close cancels its tasks before it closes the bus), then
    stops the report queue: nothing is applied once the service is stopping."""
    try:
        await asyncio.Event().wait()
    finally:
        tracker.queue.close()


async def _ask_again_every(tracker: StateTracker, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await tracker.rt.recovery.ask_again()
        except Exception as exc:  # Redis or the broker away: the next round asks again
            log.warning("resync requests not sent", error=str(exc))
