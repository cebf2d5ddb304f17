"""The state tracker's scenarios on a real Redis, shared by tests/integration/test_state_batches.py
and test_state_reports_messages.py: one StateTracker per Redis key prefix, fed through its
ReportQueue as the bus feeds it, so two runs of the same reports (one at a time, and together) can
be compared key by key; and a broker double that records what the dispatcher did with a delivery."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from hypothesis import strategies as st

from tests.factories import first_generation, host_report, vm_report
from vmsched import constants
from vmsched.bus.codec import encode, type_name
from vmsched.bus.dispatch import Delivery, Dispatcher, Transport
from vmsched.contracts import (
    ClusterReport,
    HostRemoved,
    HostReport,
    HostState,
    HostStatus,
    Message,
    PendingEntry,
    StateReports,
    VmReport,
    VmStatus,
)
from vmsched.runtime import Runtime
from vmsched.settings import Settings
from vmsched.store import Keys, PendingStore, state_writer
from vmsched.store.generations import GenerationMarkers
from vmsched.store.memories import FailedHosts
from vmsched.store.redis import text, unavailable
from vmsched_services.state_tracker.service import StateTracker

CLUSTERS = ["ca", "cb"]
#: Most steps in the first cluster: runs of one cluster's reports long enough to meet themselves.
cluster_names = st.sampled_from(["ca", "ca", "ca", "cb"])
HOSTS = ["h1", "h2", "h3"]
VMS = ["vm-1", "vm-2", "vm-3", "vm-4"]
#: A fencing token for the pending records the scenarios place (the fence key is set to it).
TOKEN = 1
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: When the scenarios' pending records expire: the same in both runs, and after the test.
EXPIRES = time.time() + 7 * 86400
#: The size of the bursts after those a scenario draws.
LAST_BURST = 8


def scenario_tracker(client: aioredis.Redis, cfg: Settings, *, max_batch: int = 256) -> StateTracker:
    """A state tracker on `cfg`'s prefix; what it reads of its Runtime: Redis, settings, the recover
    hook, and the bus's dispatcher (which says what is a server away)."""
    rt = SimpleNamespace(
        redis=client,
        settings=cfg,
        recovery=first_generation(client, cfg),
        bus=SimpleNamespace(dispatcher=Dispatcher(cfg, "state-tracker", [unavailable])),
    )
    return StateTracker(cast(Runtime, rt), max_batch=max_batch)


def own_prefix(settings: Settings) -> Settings:
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}:b-{uuid.uuid4().hex[:10]}"})


async def place_pending(client: aioredis.Redis, cfg: Settings, cluster: str, placed: dict[str, str]) -> None:
    """Pending records for VMs placed on hosts, as the selector writes them."""
    await client.set(Keys.from_settings(cfg).fence(cluster), TOKEN)
    entries = [
        PendingEntry(
            vm_id=vm_id,
            host_id=host_id,
            mem_mb=512,
            vcpus=1,
            request_id=uuid.UUID(int=n + 1),
            fencing_token=TOKEN,
            expires_at=EXPIRES,
        )
        for n, (vm_id, host_id) in enumerate(sorted(placed.items()))
    ]
    await PendingStore(client, cfg).record(cluster, entries, TOKEN)


async def stored_state(client: aioredis.Redis, cfg: Settings) -> dict[str, Any]:
    """Everything the state tracker writes per cluster, but versions (which batches coalesce)."""
    k = Keys.from_settings(cfg)
    tried = FailedHosts(client, cfg)
    out: dict[str, Any] = {}
    for c in CLUSTERS:
        hosts = {text(h): HostState.model_validate_json(v) for h, v in (await client.hgetall(k.state_hosts(c))).items()}
        out[c] = {
            "hosts": hosts,
            "vms": await client.hgetall(k.state_vms(c)),
            "settings": await client.get(k.state_cluster(c)),
            "pending": await client.hgetall(k.pending(c)),
            "tried": {vm: await tried.of(c, vm) for vm in VMS},
            "tried_expires": {vm: await client.pttl(k.tried(c, vm)) > 0 for vm in VMS},
            "resync": await client.get(k.resync(c)),
        }
    return out


# One step of a scenario: a report, or ("place", cluster, {vm: host}) (the selector placing VMs
# between reports: a point where both runs have applied everything before it).
host_steps = st.builds(
    lambda c, h, status, load: host_report(
        c, h, status=status, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000, cpu_usage_pct=load
    ),
    cluster_names,
    st.sampled_from(HOSTS),
    st.sampled_from([HostStatus.UP, HostStatus.UP, HostStatus.MAINTENANCE]),
    st.integers(min_value=0, max_value=100),
)
vm_steps = st.builds(
    lambda c, vm, h, status, mem: vm_report(c, vm, h, status, mem_mb=mem, vcpus=2),
    cluster_names,
    st.sampled_from(VMS),
    st.sampled_from([*HOSTS, None]),
    st.sampled_from(list(VmStatus)),
    st.integers(min_value=1, max_value=4096),
)
barrier_steps = st.one_of(
    st.builds(
        lambda c, pct: ClusterReport(cluster_id=c, memory_overcommit_pct=pct),
        cluster_names,
        st.integers(100, 200),
    ),
    st.builds(lambda c, h: HostRemoved(cluster_id=c, host_ids=[h]), cluster_names, st.sampled_from(HOSTS)),
)
placement_steps = st.tuples(
    st.just("place"),
    cluster_names,
    st.dictionaries(st.sampled_from(VMS), st.sampled_from(HOSTS), min_size=1),
)
scenario_steps = st.lists(
    st.one_of(host_steps, host_steps, *[vm_steps] * 5, barrier_steps, placement_steps), min_size=10, max_size=40
)


def timed_steps(steps: Sequence[Any]) -> list[Any]:
    """Each report stamped one second after the one before (as the engine would): both runs store
    the same times, where a report without one would be stamped when taken."""
    out: list[Any] = []
    for n, step in enumerate(steps):
        if isinstance(step, HostReport | VmReport | ClusterReport):
            step = step.model_copy(update={"reported_at": T0 + timedelta(seconds=n)})
        out.append(step)
    return out


#: Stated here, not imported: the oracle must not share the implementation's definition.
SETTLED = {VmStatus.RUNNING, VmStatus.FAILED, VmStatus.DOWN}


async def apply_reference(tracker: StateTracker, report: Message) -> None:
    """The oracle: a host or VM report applied as the state tracker applied each before batches
    (its own commit, then the VM's pending record read, cleared, and its host remembered if the
    VM ended elsewhere); any other message through the tracker, alone."""
    if isinstance(report, HostReport):
        await tracker.writer.apply_host(report)
    elif isinstance(report, VmReport):
        await tracker.writer.apply_vm(report)
        if report.status in SETTLED:
            entry = await tracker.pending.get(report.cluster_id, report.vm_id)
            await tracker.pending.clear(report.cluster_id, report.vm_id)
            elsewhere = report.host_id is not None and entry is not None and report.host_id != entry.host_id
            if entry is not None and (report.status is VmStatus.FAILED or elsewhere):
                await tracker.failed_hosts.remember(report.cluster_id, report.vm_id, entry.host_id)
    else:
        await tracker.queue.submit(report)


async def run_scenario(
    client: aioredis.Redis,
    cfg: Settings,
    steps: Sequence[Any],
    bursts: Sequence[int] | None,
    resync: dict[str, tuple[int, int]],
    *,
    max_batch: int = 256,
) -> tuple[dict[str, Any], StateTracker]:
    """Apply `steps` one at a time as the oracle does (`bursts` None), or through the tracker's queue
    in bursts of these sizes, then of LAST_BURST (cut at placements)."""
    markers = GenerationMarkers(client, cfg)
    for c, (hosts, vms) in resync.items():
        # The engine said its full report after the loss had this many hosts and VMs.
        await markers.install(c, 0, resync=True)
        await client.set(Keys.from_settings(cfg).resync(c), f"0 {hosts} {vms}")
    tracker = scenario_tracker(client, cfg, max_batch=max_batch)
    await tracker.load()
    sizes = iter(bursts or [])
    size = next(sizes, LAST_BURST)
    waiting: list[Message] = []

    async def flush() -> None:
        nonlocal size
        if bursts is None:
            for r in waiting:
                await apply_reference(tracker, r)
        else:
            # Removals bypass on_report's check of the sender: the test is the administrator here.
            await asyncio.gather(
                *(tracker.on_report(r) if isinstance(r, StateReports) else tracker.queue.submit(r) for r in waiting)
            )
        waiting.clear()
        size = next(sizes, LAST_BURST)

    for step in steps:
        if isinstance(step, tuple):
            await flush()
            await place_pending(client, cfg, step[1], step[2])
            continue
        waiting.append(step)
        if bursts is None or len(waiting) >= size:
            await flush()
    await flush()
    return await stored_state(client, cfg), tracker


class RecordingBroker(Transport):
    """What the dispatcher did with one delivery: acked, or dead-lettered with a reason."""

    def __init__(self) -> None:
        self.outcome = ""
        self.reason = ""

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        raise AssertionError("events get no reply")

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        self.reason = str(headers[constants.HEADER_DLX_REASON])

    async def retry(self, headers: dict[str, Any]) -> None:
        self.outcome = "retried"

    async def ack(self) -> None:
        self.outcome = self.outcome or ("dead-lettered" if self.reason else "acked")

    async def reject(self) -> None:
        self.outcome = "rejected"


async def deliver_burst(
    tracker: StateTracker, cfg: Settings, reports: Sequence[HostReport | VmReport]
) -> list[RecordingBroker]:
    """The reports delivered together (as a prefetch window is) to the tracker's handler through the
    bus's dispatcher; returns what became of each."""
    dispatcher = Dispatcher(cfg, "state-tracker", [unavailable])
    models: dict[str, type[Message]] = {m.__name__: m for m in (HostReport, VmReport)}
    brokers = [RecordingBroker() for _ in reports]
    deliveries = [
        Delivery(
            queue=constants.STATE_EVENTS_QUEUE,
            body=encode(r),
            routing_key=(constants.host_report_key if isinstance(r, HostReport) else constants.vm_report_key)(
                r.cluster_id
            ),
            type=type_name(r),
        )
        for r in reports
    ]
    await asyncio.gather(
        *(dispatcher.event(d, b, models, tracker.on_report) for d, b in zip(deliveries, brokers, strict=True))
    )
    return brokers


def running_vm(cluster: str, vm_id: str, host_id: str = "h1") -> VmReport:
    return vm_report(cluster, vm_id, host_id, mem_mb=512, vcpus=1, reported_at=T0)


def refuse_vm(monkeypatch: pytest.MonkeyPatch, vm_id: str) -> None:
    """The state writer raises on `vm_id`'s reports ("vm <id> cannot be applied"), as on a report it
    cannot apply, and applies every other as usual."""
    real = state_writer._vm_change

    def refusing(cluster: Any, report: VmReport) -> Any:
        if report.vm_id == vm_id:
            raise ValueError(f"vm {vm_id} cannot be applied")
        return real(cluster, report)

    monkeypatch.setattr(state_writer, "_vm_change", refusing)
