"""The state tracker's batches on a real Redis: reports applied together leave exactly what they
leave applied one at a time (hosts, VMs, settings, pending records, failed-host memory, a resync's
end), in fewer round trips; a report that cannot be applied is refused alone, the rest of its batch
applied and acked.

Each scenario runs one StateTracker on a Redis key prefix of its own (so two runs of the same
reports, one at a time and in batches, can be compared key by key), fed through its ReportQueue as
the bus feeds it: a burst of handlers called together is what waits together.
"""

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
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
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
    VmReport,
    VmStatus,
)
from vmsched.runtime import Runtime
from vmsched.settings import Settings
from vmsched.store import Keys, PendingStore, StateWriter, state_writer
from vmsched.store.generations import GenerationMarkers
from vmsched.store.memories import FailedHosts
from vmsched.store.redis import text, unavailable
from vmsched_services.state_tracker.service import StateTracker

pytestmark = pytest.mark.integration

CLUSTERS = ["ca", "cb"]
#: Most steps in the first cluster: runs of one cluster's reports long enough to meet themselves.
_clusters = st.sampled_from(["ca", "ca", "ca", "cb"])
HOSTS = ["h1", "h2", "h3"]
VMS = ["vm-1", "vm-2", "vm-3", "vm-4"]
#: A fencing token for the pending records the scenarios place (the fence key is set to it).
TOKEN = 1
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: When the scenarios' pending records expire: the same in both runs, and after the test.
EXPIRES = time.time() + 7 * 86400
#: The size of the bursts after those a scenario draws.
LAST_BURST = 8


def _tracker(client: aioredis.Redis, cfg: Settings, *, max_batch: int = 256) -> StateTracker:
    """A state tracker on `cfg`'s prefix; what it reads of its Runtime: Redis, settings, the recover
    hook, and the bus's dispatcher (which says what is a server away)."""
    rt = SimpleNamespace(
        redis=client,
        settings=cfg,
        recovery=first_generation(client, cfg),
        bus=SimpleNamespace(dispatcher=Dispatcher(cfg, "state-tracker", [unavailable])),
    )
    return StateTracker(cast(Runtime, rt), max_batch=max_batch)


def _prefixed(settings: Settings) -> Settings:
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}:b-{uuid.uuid4().hex[:10]}"})


async def _place(client: aioredis.Redis, cfg: Settings, cluster: str, placed: dict[str, str]) -> None:
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


async def _stored(client: aioredis.Redis, cfg: Settings) -> dict[str, Any]:
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
_host_steps = st.builds(
    lambda c, h, status, load: host_report(
        c, h, status=status, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000, cpu_usage_pct=load
    ),
    _clusters,
    st.sampled_from(HOSTS),
    st.sampled_from([HostStatus.UP, HostStatus.UP, HostStatus.MAINTENANCE]),
    st.integers(min_value=0, max_value=100),
)
_vm_steps = st.builds(
    lambda c, vm, h, status, mem: vm_report(c, vm, h, status, mem_mb=mem, vcpus=2),
    _clusters,
    st.sampled_from(VMS),
    st.sampled_from([*HOSTS, None]),
    st.sampled_from(list(VmStatus)),
    st.integers(min_value=1, max_value=4096),
)
_barriers = st.one_of(
    st.builds(
        lambda c, pct: ClusterReport(cluster_id=c, memory_overcommit_pct=pct),
        _clusters,
        st.integers(100, 200),
    ),
    st.builds(lambda c, h: HostRemoved(cluster_id=c, host_ids=[h]), _clusters, st.sampled_from(HOSTS)),
)
_placements = st.tuples(
    st.just("place"),
    _clusters,
    st.dictionaries(st.sampled_from(VMS), st.sampled_from(HOSTS), min_size=1),
)
_steps = st.lists(
    st.one_of(_host_steps, _host_steps, *[_vm_steps] * 5, _barriers, _placements), min_size=10, max_size=40
)


def _timed(steps: Sequence[Any]) -> list[Any]:
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


async def _reference(tracker: StateTracker, report: Message) -> None:
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


async def _run(
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
    tracker = _tracker(client, cfg, max_batch=max_batch)
    await tracker.load()
    sizes = iter(bursts or [])
    size = next(sizes, LAST_BURST)
    waiting: list[Message] = []

    async def flush() -> None:
        nonlocal size
        if bursts is None:
            for r in waiting:
                await _reference(tracker, r)
        else:
            # Removals bypass on_report's check of the sender: the test is the administrator here.
            await asyncio.gather(*(tracker.queue.submit(r) for r in waiting))
        waiting.clear()
        size = next(sizes, LAST_BURST)

    for step in steps:
        if isinstance(step, tuple):
            await flush()
            await _place(client, cfg, step[1], step[2])
            continue
        waiting.append(step)
        if bursts is None or len(waiting) >= size:
            await flush()
    await flush()
    return await _stored(client, cfg), tracker


@hyp_settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=_steps,
    bursts=st.lists(st.integers(min_value=1, max_value=16), max_size=10),
    max_batch=st.sampled_from([2, 5, 256]),
    resync=st.dictionaries(_clusters, st.tuples(st.integers(0, len(HOSTS)), st.integers(0, len(VMS))), max_size=2),
)
def test_batches_leave_what_one_at_a_time_leaves(
    settings: Settings, steps: list[Any], bursts: list[int], max_batch: int, resync: dict[str, tuple[int, int]]
) -> None:
    """Any sequence of host and VM reports (with cluster reports, host removals and placements
    between them), applied in bursts of any sizes and batches of any bound, stores the same hosts,
    VMs, settings, pending records, failed-host memory and resync state as applied one at a time;
    and the writer holds in memory what a fresh load reads."""
    steps = _timed(steps)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        try:
            one_cfg, batch_cfg = _prefixed(settings), _prefixed(settings)
            one, one_tracker = await _run(client, one_cfg, steps, None, resync)
            batched, tracker = await _run(client, batch_cfg, steps, bursts, resync, max_batch=max_batch)
            assert batched == one
            for c in CLUSTERS:
                one_snap, snap = one_tracker.writer.snapshot(c), tracker.writer.snapshot(c)
                assert (snap is None) == (one_snap is None)
                if snap is not None and one_snap is not None:
                    assert snap.model_copy(update={"version": 0}) == one_snap.model_copy(update={"version": 0})
                    assert snap.version <= one_snap.version  # coalesced: never more versions
                    fresh = StateWriter(client, batch_cfg)
                    await fresh.load([c])
                    assert fresh.snapshot(c) == snap
        finally:
            await client.aclose()

    asyncio.run(scenario())


async def _both(
    redis_client: aioredis.Redis, settings: Settings, steps: list[Any], resync: dict[str, tuple[int, int]] | None = None
) -> dict[str, Any]:
    """`steps` applied one at a time and as one burst: the stores must be the same; returns it."""
    steps = _timed(steps)
    one, _ = await _run(redis_client, _prefixed(settings), steps, None, resync or {})
    batched, _ = await _run(redis_client, _prefixed(settings), steps, [len(steps)], resync or {})
    assert batched == one
    return batched


async def test_a_resync_reached_between_reports_of_a_batch_ends(
    redis_client: aioredis.Redis, settings: Settings
) -> None:
    """The engine's full report had 1 host and 2 VMs; a batch reaches that, then a VM goes down:
    one at a time, the resync ended after the second VM, so it ends in the batch too."""
    steps = [
        host_report("ca", "h1", cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000),
        vm_report("ca", "vm-1", "h1", mem_mb=512, vcpus=1),
        vm_report("ca", "vm-2", "h1", mem_mb=512, vcpus=1),
        vm_report("ca", "vm-2", None, VmStatus.DOWN, mem_mb=512, vcpus=1),
    ]
    stored = await _both(redis_client, settings, steps, {"ca": (1, 2)})
    assert stored["ca"]["resync"] == b"0 done"
    stored = await _both(redis_client, settings, steps[:2] + steps[3:], {"ca": (1, 2)})
    assert stored["ca"]["resync"] == b"0 1 2"  # never reached: still waiting


async def test_a_vm_settled_twice_in_a_batch_is_judged_by_its_first_report(
    redis_client: aioredis.Redis, settings: Settings
) -> None:
    """Placed on h1, the VM runs there, then fails on h2: the first report cleared its record, so
    the second, alone, found none to remember a failed host by; in a batch, the same."""
    steps: list[Any] = [
        ("place", "ca", {"vm-1": "h1", "vm-2": "h1"}),
        vm_report("ca", "vm-1", "h1", mem_mb=512, vcpus=1),
        vm_report("ca", "vm-1", "h2", VmStatus.FAILED, mem_mb=512, vcpus=1),
        vm_report("ca", "vm-2", "h2", VmStatus.RUNNING, mem_mb=512, vcpus=1),
    ]
    stored = await _both(redis_client, settings, steps)
    assert stored["ca"]["tried"] == {"vm-1": set(), "vm-2": {"h1"}, "vm-3": set(), "vm-4": set()}
    assert stored["ca"]["pending"] == {}


class _Broker(Transport):
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


async def _deliver_burst(
    tracker: StateTracker, cfg: Settings, reports: Sequence[HostReport | VmReport]
) -> list[_Broker]:
    """The reports delivered together (as a prefetch window is) to the tracker's handler through the
    bus's dispatcher; returns what became of each."""
    dispatcher = Dispatcher(cfg, "state-tracker", [unavailable])
    models: dict[str, type[Message]] = {m.__name__: m for m in (HostReport, VmReport)}
    brokers = [_Broker() for _ in reports]
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


def _vm(cluster: str, vm_id: str, host_id: str = "h1") -> VmReport:
    return vm_report(cluster, vm_id, host_id, mem_mb=512, vcpus=1, reported_at=T0)


async def test_a_report_the_writer_refuses_is_dead_lettered_alone_and_the_rest_of_its_batch_applied(
    redis_client: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One report of a run cannot be applied (the writer raises on it): the run is applied one
    report at a time, that one dead-lettered with its reason, every other acked and in the state."""
    real = state_writer._vm_change

    def refusing(cluster: Any, report: VmReport) -> Any:
        if report.vm_id == "poison":
            raise ValueError("vm poison cannot be applied")
        return real(cluster, report)

    monkeypatch.setattr(state_writer, "_vm_change", refusing)
    cfg = _prefixed(settings)
    tracker = _tracker(redis_client, cfg)
    host = host_report("ca", "h1", cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000, reported_at=T0)
    burst: list[HostReport | VmReport] = [
        host,
        _vm("ca", "vm-1"),
        _vm("ca", "poison"),
        _vm("ca", "vm-2"),
        _vm("cb", "vm-3"),
    ]
    brokers = await _deliver_burst(tracker, cfg, burst)

    assert [b.outcome for b in brokers] == ["acked", "acked", "dead-lettered", "acked", "acked"]
    assert "vm poison cannot be applied" in brokers[2].reason
    snap = tracker.writer.snapshot("ca")
    assert snap is not None
    assert [vm.vm_id for vm in snap.vms] == ["vm-1", "vm-2"]
    assert [(h.report.host_id, h.vm_count) for h in snap.hosts] == [("h1", 2)]
    stored = StateWriter(redis_client, cfg)
    await stored.load(["ca", "cb"])
    assert stored.snapshot("ca") == snap
    assert [vm.vm_id for vm in stored.snapshot("cb").vms] == ["vm-3"]  # type: ignore[union-attr]


async def test_reports_of_an_unreadable_cluster_are_dead_lettered_and_the_other_clusters_applied(
    redis_client: aioredis.Redis, settings: Settings
) -> None:
    """A cluster whose stored state cannot be read refuses its reports (as it always did, now in a
    batch): each is dead-lettered saying why; the other cluster's reports in the same burst apply."""
    cfg = _prefixed(settings)
    k = Keys.from_settings(cfg)
    await redis_client.hset(k.state_hosts("broken"), "h1", b'{"not": "a host state"}')
    tracker = _tracker(redis_client, cfg)
    assert await tracker.writer.load(["broken"]) == []  # skipped, and refused from now on
    burst: list[HostReport | VmReport] = [
        _vm("ok", "vm-1"),
        _vm("broken", "vm-2"),
        _vm("ok", "vm-3"),
        _vm("broken", "vm-4"),
    ]
    brokers = await _deliver_burst(tracker, cfg, burst)

    assert [b.outcome for b in brokers] == ["acked", "dead-lettered", "acked", "dead-lettered"]
    assert "ValidationError" in brokers[1].reason
    snap = tracker.writer.snapshot("ok")
    assert snap is not None
    assert snap.version == 1  # both in one commit
    assert [vm.vm_id for vm in snap.vms] == ["vm-1", "vm-3"]


async def test_a_burst_of_running_reports_costs_two_round_trips_as_one_does(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings
) -> None:
    """32 VMs placed, reported running together: one state commit and one pending round trip, not
    three or four round trips per report."""
    client, sent = counted
    cfg = _prefixed(settings)
    tracker = _tracker(client, cfg)
    host = host_report("ca", "h1", cpu_cores=64, physical_mem_mb=320_000, mem_free_mb=300_000, reported_at=T0)
    await tracker.on_report(host)
    vms = [f"vm-{n}" for n in range(32)]
    await _place(client, cfg, "ca", dict.fromkeys(vms, "h1"))
    sent.clear()
    brokers = await _deliver_burst(tracker, cfg, [_vm("ca", vm) for vm in vms])

    assert {b.outcome for b in brokers} == {"acked"}
    assert sent == ["EVALSHA", "EVALSHA"], sent
    assert await client.hlen(Keys.from_settings(cfg).pending("ca")) == 0
    assert tracker.writer.version("ca") == 2

    # A lone report too: its commit, and one script that takes its record (not a read, then a clear).
    await _place(client, cfg, "ca", {"vm-lone": "h1"})
    sent.clear()
    await tracker.on_report(_vm("ca", "vm-lone"))
    assert sent == ["EVALSHA", "EVALSHA"], sent
