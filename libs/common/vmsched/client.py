"""The engine's side of vmsched: report state, ask for placements, follow decisions.

async with SchedulerClient(Settings()) as client:
    await client.report_host(HostReport(...))
    decision = await client.schedule("cluster-a", VmSpec(vm_id="vm1", mem_mb=2048, vcpus=2))
    async for d in client.decisions("cluster-a"):
        ...
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from vmsched import constants as c
from vmsched.bus import Bus, Subscription, connect
from vmsched.contracts import (
    ClusterListing,
    ClusterQuery,
    ClusterReport,
    ClusterState,
    DecisionListing,
    DecisionQuery,
    DecisionRef,
    HaAlert,
    HaCheckRequest,
    HaRecovered,
    HaReport,
    HostReport,
    MaintenancePlan,
    Message,
    MigrationDecision,
    PolicyChanged,
    PolicyDocument,
    PowerAction,
    Removal,
    RemoveCluster,
    RemoveHosts,
    RequestKind,
    ResyncComplete,
    ResyncRequested,
    ScheduleDecision,
    ScheduleRequest,
    StateReports,
    StateRequest,
    VmReport,
    VmSpec,
    WhatIfReply,
    WhatIfRequest,
)
from vmsched.contracts.state import MAX_STATE_REPORTS
from vmsched.errors import InvalidRequest, RemoteError
from vmsched.settings import Settings
from vmsched.tracing import Tracing, span


class BusClient:
    """A client on a bus of its own (started and closed with `async with`), or on one it is given
    (left as it is)."""

    #: The bus connection's label (logs, the broker's connection name).
    label = "client"

    def __init__(self, settings: Settings | None = None, *, bus: Bus | None = None) -> None:
        self.settings = settings or Settings()
        self.bus = bus or connect(self.settings, self.label)
        self._own_bus = bus is None
        self._tracing: Tracing | None = None

    async def __aenter__(self) -> Self:
        # With tracing configured (VMSCHED_TRACING_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT) the client
        # traces its calls, joining a tracing already running in this process; before its bus
        # connects, so the instrumentation sees the reply consumer.
        self._tracing = Tracing.start(self.settings, f"vmsched-{self.label}")
        if self._own_bus:
            await self.bus.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own_bus:
            await self.bus.close()
        if self._tracing is not None:
            self._tracing.shutdown()
            self._tracing = None


class SchedulerClient(BusClient):
    # ---------------------------------------------------------------- scheduling
    async def schedule(
        self,
        cluster_id: str,
        vm: VmSpec | dict[str, Any],
        *,
        request_id: uuid.UUID | None = None,
        kind: RequestKind = RequestKind.RUN,
        whitelist: Sequence[str] | None = None,
        blacklist: Sequence[str] = (),
        max_alternates: int = 3,
        deadline: datetime | None = None,
        priority: int = 0,
        explain_scores: bool = False,
        explain_hosts: bool = False,
        batch: Sequence[VmSpec] = (),
        timeout: float | None = None,
    ) -> ScheduleDecision:
        """Ask where `vm` (and the `batch` VMs with it, all or none) should run; the decision also goes
        out as event decision.<cluster>."""
        request = ScheduleRequest(
            request_id=request_id or uuid.uuid4(),
            cluster_id=cluster_id,
            vm=vm if isinstance(vm, VmSpec) else VmSpec.model_validate(vm),
            kind=kind,
            whitelist=list(whitelist) if whitelist is not None else None,
            blacklist=list(blacklist),
            max_alternates=max_alternates,
            deadline=deadline,
            priority=priority,
            explain_scores=explain_scores,
            explain_hosts=explain_hosts,
            batch=list(batch),
        )
        return await self.send(request, timeout=timeout)

    async def schedule_instances(self, cluster_id: str, vm: VmSpec, count: int, **kwargs: Any) -> ScheduleDecision:
        """Nova's multi-instance boot: `count` copies of `vm` (ids `<vm_id>-1` ... `<vm_id>-<count>`),
        placed together, all or none."""
        copies = [vm.model_copy(update={"vm_id": f"{vm.vm_id}-{i}"}) for i in range(1, count + 1)]
        return await self.schedule(cluster_id, copies[0], batch=copies[1:], **kwargs)

    async def send(self, request: ScheduleRequest, *, timeout: float | None = None) -> ScheduleDecision:
        # One decision, one trace: this span begins it (or continues the engine's current one).
        attributes = {"vmsched.request_id": str(request.request_id), "vmsched.cluster": request.cluster_id}
        with span("vmsched.schedule", attributes, kind="client"):
            return await self.bus.call(c.RPC_SCHEDULE, request, ScheduleDecision, timeout=timeout)

    async def what_if(
        self,
        cluster_id: str,
        vm: VmSpec | dict[str, Any],
        *,
        policy: str | None = None,
        policy_inline: PolicyDocument | dict[str, Any] | None = None,
        properties: Mapping[str, str] | None = None,
        kind: RequestKind = RequestKind.RUN,
        timeout: float | None = None,
    ) -> WhatIfReply:
        """Where `vm` would be placed now, and why, host by host (every host's filter verdict, every
        weight unit's score), under the cluster's policy, the stored policy `policy` or the policy
        document `policy_inline`, with `properties` overriding the policy's. Nothing is locked,
        recorded, stored or published. RemoteError unknown_cluster, policy_not_found, invalid_policy."""
        request = WhatIfRequest(
            cluster_id=cluster_id,
            vm=vm if isinstance(vm, VmSpec) else VmSpec.model_validate(vm),
            kind=kind,
            policy=policy,
            policy_inline=(
                policy_inline
                if policy_inline is None or isinstance(policy_inline, PolicyDocument)
                else PolicyDocument.model_validate(policy_inline)
            ),
            properties=dict(properties or {}),
        )
        return await self.bus.call(c.RPC_WHATIF, request, WhatIfReply, timeout=timeout)

    async def clusters(self, *, timeout: float | None = None) -> ClusterListing:
        """Every cluster with state: its host and VM counts, state version and policy."""
        return await self.bus.call(c.RPC_CLUSTERS_LIST, ClusterQuery(), ClusterListing, timeout=timeout)

    async def recent_decisions(
        self, cluster_id: str, limit: int = 50, *, timeout: float | None = None
    ) -> DecisionListing:
        """The cluster's latest stored decisions, newest first (at most `limit`, 1 to 1000)."""
        query = DecisionQuery(cluster_id=cluster_id, limit=limit)
        return await self.bus.call(c.RPC_DECISIONS_RECENT, query, DecisionListing, timeout=timeout)

    async def decision(
        self, cluster_id: str, request_id: uuid.UUID | str, *, timeout: float | None = None
    ) -> ScheduleDecision:
        """The stored decision on `request_id`, with its explanation (RemoteError decision_not_found)."""
        try:
            rid = request_id if isinstance(request_id, uuid.UUID) else uuid.UUID(request_id)
        except ValueError:
            shown = str(request_id)[:100]
            raise InvalidRequest(f"not a request id (a UUID): {shown!r}", location="request_id") from None
        ref = DecisionRef(cluster_id=cluster_id, request_id=rid)
        return await self.bus.call(c.RPC_DECISIONS_GET, ref, ScheduleDecision, timeout=timeout)

    async def decisions(self, cluster_id: str = "*", *, maxsize: int = 10_000) -> AsyncIterator[ScheduleDecision]:
        """Every decision for `cluster_id` ("*" for all clusters) from now on."""
        async for d in self._stream([c.decision_key(cluster_id)], [ScheduleDecision], maxsize):
            assert isinstance(d, ScheduleDecision)
            yield d

    async def migrations(self, cluster_id: str = "*", *, maxsize: int = 10_000) -> AsyncIterator[MigrationDecision]:
        """Every migration the balancer decides for `cluster_id` ("*" for all)."""
        async for m in self._stream([c.migration_key(cluster_id)], [MigrationDecision], maxsize):
            yield m

    async def events(self, cluster_id: str = "*", *, maxsize: int = 10_000) -> AsyncIterator[Message]:
        """Everything vmsched says about a cluster: decisions, migrations, power advice, HA alerts."""
        async for event in self._stream(*_event_bindings(cluster_id), maxsize):
            yield event

    async def subscribe_events(self, cluster_id: str, handler: Callable[[Message], Awaitable[None]]) -> Subscription:
        """What `events` yields, given to `handler` as it comes, from the moment this returns (the
        subscription is bound then); `cancel()` the subscription to stop. For a reader that must know
        when it starts receiving (the api's event stream), or that drops rather than waits."""
        bindings, models = _event_bindings(cluster_id)
        return await self.bus.subscribe(bindings, models, handler)

    async def resync_requests(self, cluster_id: str = "*", *, maxsize: int = 10_000) -> AsyncIterator[ResyncRequested]:
        """vmsched's requests for a full report of `cluster_id` ("*" for all): answer each with every
        report it names, then `resync_complete` (see contracts.ResyncRequested)."""
        async for r in self._stream([c.resync_requested_key(cluster_id)], [ResyncRequested], maxsize):
            yield r

    async def resync_complete(self, cluster_id: str, generation: int, *, hosts: int, vms: int) -> None:
        """Say the full report for `generation` is published, with `hosts` hosts and `vms` VMs that
        hold resources: the cluster is scheduled again once the state holds them."""
        done = ResyncComplete(cluster_id=cluster_id, generation=generation, hosts=hosts, vms=vms)
        await self.bus.publish(c.resync_complete_key(cluster_id), done)

    async def _stream(self, bindings: list[str], models: list[Any], maxsize: int) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        sub: Subscription = await self.bus.subscribe(bindings, models, queue.put)
        try:
            while True:
                yield await queue.get()
        finally:
            await sub.cancel()

    # ---------------------------------------------------------------- state (the engine reports)
    async def report_cluster(self, report: ClusterReport) -> None:
        await self.bus.publish(c.cluster_report_key(report.cluster_id), report)

    async def report_host(self, report: HostReport) -> None:
        await self.bus.publish(c.host_report_key(report.cluster_id), report)

    async def report_vm(self, report: VmReport) -> None:
        await self.bus.publish(c.vm_report_key(report.cluster_id), report)

    async def report_states(self, reports: StateReports) -> None:
        """Several of one cluster's host and VM reports as one message (see StateReports);
        `ReportBatcher` makes them from reports handed in one at a time."""
        await self.bus.publish(c.state_reports_key(reports.cluster_id), reports)

    # Removals are administration: asked of policy-admin (RPC), which checks that this client's AMQP
    # user is an administrator (else RemoteError not_authorized), records them in the audit log and
    # publishes the removal event the state tracker applies in order with the reports.
    async def remove_hosts(
        self, cluster_id: str, host_ids: Sequence[str], *, reason: str = "", timeout: float | None = None
    ) -> Removal:
        """Take hosts out of the cluster for good (see HostRemoved). A host that reports again is back."""
        request = RemoveHosts(cluster_id=cluster_id, host_ids=list(host_ids), reason=reason)
        return await self.bus.call(c.RPC_HOSTS_REMOVE, request, Removal, timeout=timeout)

    async def remove_cluster(self, cluster_id: str, *, reason: str = "", timeout: float | None = None) -> Removal:
        """Take the cluster out of vmsched: its state and pending resources are deleted (see
        ClusterRemoved); its policy link in PostgreSQL stays."""
        request = RemoveCluster(cluster_id=cluster_id, reason=reason)
        return await self.bus.call(c.RPC_CLUSTERS_REMOVE, request, Removal, timeout=timeout)

    async def ha_check(self, cluster_id: str, *, timeout: float | None = None) -> HaReport:
        """Run the HA reservation check for the cluster now (an HA monitor answers)."""
        return await self.bus.call(c.RPC_HA_CHECK, HaCheckRequest(cluster_id=cluster_id), HaReport, timeout=timeout)

    async def state(self, cluster_id: str, *, timeout: float | None = None) -> ClusterState:
        return await self.bus.call(c.RPC_STATE, StateRequest(cluster_id=cluster_id), ClusterState, timeout=timeout)

    async def wait_for_state(
        self, cluster_id: str, *, hosts: int, timeout: float = 30.0, poll: float = 0.05
    ) -> ClusterState:
        """Wait until the state tracker knows at least `hosts` hosts of the cluster."""

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            try:
                state = await self.state(cluster_id)
                if len(state.hosts) >= hosts:
                    return state
            except RemoteError as exc:
                if exc.remote_code != "unknown_cluster":
                    raise
            if loop.time() > end:
                raise TimeoutError(f"cluster {cluster_id} did not reach {hosts} hosts within {timeout:g} s")
            await asyncio.sleep(poll)

    async def policy_changed(self, *, cluster_id: str | None = None, policy_id: uuid.UUID | None = None) -> None:
        """Tell every selector to drop its cached copy (after changing policies in PostgreSQL)."""
        await self.bus.publish(c.POLICY_CHANGED, PolicyChanged(cluster_id=cluster_id, policy_id=policy_id))


def _event_bindings(cluster_id: str) -> tuple[list[str], list[Any]]:
    """The routing keys and models of every event about `cluster_id` ("*": every cluster)."""
    bindings = [
        c.decision_key(cluster_id),
        c.migration_key(cluster_id),
        c.power_key(cluster_id),
        c.ha_alert_key(cluster_id),
        c.ha_recovered_key(cluster_id),
        c.maintenance_key(cluster_id),
    ]
    return bindings, [ScheduleDecision, MigrationDecision, PowerAction, HaAlert, HaRecovered, MaintenancePlan]


class ReportBatcher:
    """Hands an engine's host and VM reports to the state tracker in as few messages as keeps them
    in order: a cluster's reports wait while that cluster's previous message is being confirmed,
    then go together as one StateReports (at most MAX_STATE_REPORTS; a lone report as itself). No
    timer: a report handed in while nothing of its cluster is in flight goes at once (on the next
    pass of the event loop, with whatever else came in meanwhile).

    `report` returns once its message is confirmed, or raises what publishing it raised. A cluster's
    messages go one at a time, so its reports reach the broker in the order they were handed in
    (hosts before VMs within one message: see StateReports)."""

    def __init__(self, client: SchedulerClient, *, max_reports: int = MAX_STATE_REPORTS) -> None:
        if not 1 <= max_reports <= MAX_STATE_REPORTS:
            raise ValueError(f"max_reports must be within 1..{MAX_STATE_REPORTS}, not {max_reports}")
        self._client = client
        self._max = max_reports
        self._waiting: dict[str, deque[tuple[HostReport | VmReport, asyncio.Future[None]]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def report(self, report: HostReport | VmReport) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(report.cluster_id, deque()).append((report, done))
        if report.cluster_id not in self._senders:
            self._senders[report.cluster_id] = asyncio.create_task(self._send(report.cluster_id))
        # Shielded: a caller that stops waiting does not take its report out of a message.
        await asyncio.shield(done)

    async def wait_sent(self) -> None:
        """Until everything handed in so far is confirmed or has failed."""
        while self._senders:
            await asyncio.wait(list(self._senders.values()))

    async def _send(self, cluster: str) -> None:
        waiting = self._waiting[cluster]
        try:
            while waiting:
                taken = [waiting.popleft() for _ in range(min(len(waiting), self._max))]
                try:
                    await self._publish(cluster, [r for r, _ in taken])
                except Exception as exc:
                    for _, done in taken:
                        if not done.done():
                            done.set_exception(exc)
                else:
                    for _, done in taken:
                        if not done.done():
                            done.set_result(None)
        finally:
            del self._senders[cluster]
            if not waiting:
                del self._waiting[cluster]

    async def _publish(self, cluster: str, reports: list[HostReport | VmReport]) -> None:
        if len(reports) == 1:
            (one,) = reports
            await (self._client.report_host(one) if isinstance(one, HostReport) else self._client.report_vm(one))
            return
        hosts = [r for r in reports if isinstance(r, HostReport)]
        vms = [r for r in reports if isinstance(r, VmReport)]
        await self._client.report_states(StateReports(cluster_id=cluster, hosts=hosts, vms=vms))


__all__ = ["BusClient", "ReportBatcher", "SchedulerClient"]
