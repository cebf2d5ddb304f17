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
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import host_report, vm_report
from tests.integration.state_scenarios import (
    CLUSTERS,
    HOSTS,
    T0,
    VMS,
    cluster_names,
    deliver_burst,
    own_prefix,
    place_pending,
    refuse_vm,
    run_scenario,
    running_vm,
    scenario_steps,
    scenario_tracker,
    timed_steps,
)
from vmsched.contracts import (
    HostReport,
    VmReport,
    VmStatus,
)
from vmsched.settings import Settings
from vmsched.store import Keys, StateWriter

pytestmark = pytest.mark.integration


@hyp_settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=scenario_steps,
    bursts=st.lists(st.integers(min_value=1, max_value=16), max_size=10),
    max_batch=st.sampled_from([2, 5, 256]),
    resync=st.dictionaries(cluster_names, st.tuples(st.integers(0, len(HOSTS)), st.integers(0, len(VMS))), max_size=2),
)
def test_batches_leave_what_one_at_a_time_leaves(
    settings: Settings, steps: list[Any], bursts: list[int], max_batch: int, resync: dict[str, tuple[int, int]]
) -> None:
    """Any sequence of host and VM reports (with cluster reports, host removals and placements
    between them), applied in bursts of any sizes and batches of any bound, stores the same hosts,
    VMs, settings, pending records, failed-host memory and resync state as applied one at a time;
    and the writer holds in memory what a fresh load reads."""
    steps = timed_steps(steps)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        try:
            one_cfg, batch_cfg = own_prefix(settings), own_prefix(settings)
            one, one_tracker = await run_scenario(client, one_cfg, steps, None, resync)
            batched, tracker = await run_scenario(client, batch_cfg, steps, bursts, resync, max_batch=max_batch)
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
    steps = timed_steps(steps)
    one, _ = await run_scenario(redis_client, own_prefix(settings), steps, None, resync or {})
    batched, _ = await run_scenario(redis_client, own_prefix(settings), steps, [len(steps)], resync or {})
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


async def test_a_report_the_writer_refuses_is_dead_lettered_alone_and_the_rest_of_its_batch_applied(
    redis_client: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One report of a run cannot be applied (the writer raises on it): the run is applied one
    report at a time, that one dead-lettered with its reason, every other acked and in the state."""
    refuse_vm(monkeypatch, "poison")
    cfg = own_prefix(settings)
    tracker = scenario_tracker(redis_client, cfg)
    host = host_report("ca", "h1", cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000, reported_at=T0)
    burst: list[HostReport | VmReport] = [
        host,
        running_vm("ca", "vm-1"),
        running_vm("ca", "poison"),
        running_vm("ca", "vm-2"),
        running_vm("cb", "vm-3"),
    ]
    brokers = await deliver_burst(tracker, cfg, burst)

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
    cfg = own_prefix(settings)
    k = Keys.from_settings(cfg)
    await redis_client.hset(k.state_hosts("broken"), "h1", b'{"not": "a host state"}')
    tracker = scenario_tracker(redis_client, cfg)
    assert await tracker.writer.load(["broken"]) == []  # skipped, and refused from now on
    burst: list[HostReport | VmReport] = [
        running_vm("ok", "vm-1"),
        running_vm("broken", "vm-2"),
        running_vm("ok", "vm-3"),
        running_vm("broken", "vm-4"),
    ]
    brokers = await deliver_burst(tracker, cfg, burst)

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
    cfg = own_prefix(settings)
    tracker = scenario_tracker(client, cfg)
    host = host_report("ca", "h1", cpu_cores=64, physical_mem_mb=320_000, mem_free_mb=300_000, reported_at=T0)
    await tracker.on_report(host)
    vms = [f"vm-{n}" for n in range(32)]
    await place_pending(client, cfg, "ca", dict.fromkeys(vms, "h1"))
    sent.clear()
    brokers = await deliver_burst(tracker, cfg, [running_vm("ca", vm) for vm in vms])

    assert {b.outcome for b in brokers} == {"acked"}
    assert sent == ["EVALSHA", "EVALSHA"], sent
    assert await client.hlen(Keys.from_settings(cfg).pending("ca")) == 0
    assert tracker.writer.version("ca") == 2

    # A lone report too: its commit, and one script that takes its record (not a read, then a clear).
    await place_pending(client, cfg, "ca", {"vm-lone": "h1"})
    sent.clear()
    await tracker.on_report(running_vm("ca", "vm-lone"))
    assert sent == ["EVALSHA", "EVALSHA"], sent
