"""A replay whose decisions the selector makes: before each, the simulated cluster is reported to
the state tracker as an engine reports its own (a ClusterReport once, a HostReport per host that
changed, a VmReport per VM started, moved or gone), and the replay waits until the tracker has
applied them and has cleared the pending record of every VM that settled; then the ScheduleRequest
goes to the selector through SchedulerClient and the ScheduleDecision becomes the engine's Outcome.

The tracker applies a cluster's reports in order, those that wait together as one state version, so
versions do not count reports: after a decision's reports the replay sends the cluster's own report
once more, stamped with a time of its own (`reported_at`), and waits until Redis holds that stamp
(the tracker applies a cluster report after every report before it)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ClusterReport,
    DecisionStatus,
    HostReport,
    Placement,
    ScheduleDecision,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.errors import CommandError, RemoteError
from vmsched.scheduling.placement import Outcome, Placed, Unplaceable, pending_entry
from vmsched.scheduling.policy import Policy
from vmsched.simulation.engine import Sampler
from vmsched.simulation.workload import Workload
from vmsched.store import PendingStore, StateCache
from vmsched_services.tools.simulate_bus.recording import RecordingSimulation

#: How long the state tracker may take to apply one decision's reports.
CATCH_UP_TIMEOUT_S = 30.0
#: Polling the state version: the tracker applies a report in about a millisecond.
POLL_S = 0.002
#: How long a simulated placement's pending record would count (the engine's own figure, unused:
#: the engine starts a placed VM at once).
PENDING_S = 60.0


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
    #: Reports published.
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
        state: StateCache,
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
        self._state = state
        self._reported = _Reported()
        #: The stamp of the last probe (the cluster's report sent again; see the module doc).
        self._probe_at = datetime.fromtimestamp(0, UTC)
        #: The requests sent (their decisions are stored under these ids until the replay's end).
        self.request_ids: list[uuid.UUID] = []
        #: Per decision, wall seconds: reporting and waiting for the tracker, then the schedule call.
        self.report_s: list[float] = []
        self.call_s: list[float] = []

    # ------------------------------------------------------------------ the engine's hooks
    def _changed(self, host_id: str, *, load: bool = False, load_only: bool = False) -> None:
        super()._changed(host_id, load=load, load_only=load_only)
        self._unreported.add(host_id)

    async def prepare(self) -> None:
        """Register the cluster: its settings and every host, as the engine knows them at the start."""
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
        """Wait until the tracker has applied every report published (the probe that follows them is
        in Redis) and holds no pending record but those of the VMs starting and the migrations in
        flight."""
        # Strictly later than the last probe, whatever the clock's resolution.
        self._probe_at = max(datetime.now(UTC), self._probe_at + timedelta(microseconds=1))
        await self._client.report_cluster(
            self.settings.model_copy(update={"cluster_id": self.cluster_id, "reported_at": self._probe_at})
        )
        in_flight = {e.vm_id for e in self.pending()}
        loop = asyncio.get_running_loop()
        end = loop.time() + self.catch_up_timeout_s
        while True:
            applied = await self._state.stored_settings(self.cluster_id)
            stamp = applied.reported_at if applied is not None else None
            _, pending = await self._pending_store.snapshot(self.cluster_id)
            # A record may have expired (wall clock) while the engine still has its flight: a subset.
            if stamp == self._probe_at and all(e.vm_id in in_flight for e in pending):
                return
            if loop.time() > end:
                raise CommandError(
                    f"the state tracker has not applied the simulation's reports within {self.catch_up_timeout_s:g} s "
                    f"(cluster {self.cluster_id}: {self._reported.published} reports sent, the last not applied; "
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


__all__ = ["CATCH_UP_TIMEOUT_S", "PENDING_S", "POLL_S", "BusSimulation"]
