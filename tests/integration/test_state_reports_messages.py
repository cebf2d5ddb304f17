"""StateReports on a real Redis: a message of many host and VM reports stores what its reports,
hosts first, store applied one at a time (with cluster reports, removals and placements between
messages, several messages delivered together); a report in it that cannot be applied dead-letters
the message with its reason while the rest stays applied; 32 running VMs in one message cost the
two round trips a burst of 32 lone reports costs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import host_report
from tests.integration.state_scenarios import (
    LAST_BURST,
    T0,
    RecordingBroker,
    own_prefix,
    place_pending,
    refuse_vm,
    run_scenario,
    running_vm,
    scenario_steps,
    scenario_tracker,
    timed_steps,
)
from vmsched import constants
from vmsched.bus.codec import encode, type_name
from vmsched.bus.dispatch import Delivery, Dispatcher
from vmsched.contracts import HostReport, StateReports, VmReport
from vmsched.settings import Settings
from vmsched.store import Keys
from vmsched.store.redis import unavailable

pytestmark = pytest.mark.integration


def packed(steps: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
    """`steps` with runs of one cluster's host and VM reports (cut to `sizes`, then to LAST_BURST)
    put in StateReports messages, as ReportBatcher sends them."""
    cuts = iter(sizes)
    out: list[Any] = []
    run: list[HostReport | VmReport] = []

    def close() -> None:
        if run:
            hosts = [r for r in run if isinstance(r, HostReport)]
            vms = [r for r in run if isinstance(r, VmReport)]
            out.append(StateReports(cluster_id=run[0].cluster_id, hosts=hosts, vms=vms))
            run.clear()

    size = next(cuts, LAST_BURST)
    for step in steps:
        if isinstance(step, HostReport | VmReport):
            if run and (run[0].cluster_id != step.cluster_id or len(run) >= size):
                close()
                size = next(cuts, LAST_BURST)
            run.append(step)
        else:
            close()
            out.append(step)
    close()
    return out


def flat(steps: Sequence[Any]) -> list[Any]:
    """The messages' reports one by one, in the order a StateReports applies them (hosts first)."""
    return [r for step in steps for r in (step.reports() if isinstance(step, StateReports) else [step])]


@hyp_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=scenario_steps,
    sizes=st.lists(st.integers(min_value=1, max_value=12), max_size=10),
    bursts=st.lists(st.integers(min_value=1, max_value=6), max_size=10),
)
def test_state_reports_leave_what_their_reports_one_at_a_time_leave(
    settings: Settings, steps: list[Any], sizes: list[int], bursts: list[int]
) -> None:
    messages = packed(timed_steps(steps), sizes)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        try:
            one, _ = await run_scenario(client, own_prefix(settings), flat(messages), None, {})
            batched, _ = await run_scenario(client, own_prefix(settings), messages, bursts, {})
            assert batched == one
        finally:
            await client.aclose()

    asyncio.run(scenario())


async def test_a_message_with_a_refused_report_is_dead_lettered_with_its_reason_and_the_rest_applied(
    redis_client: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_vm(monkeypatch, "poison")
    cfg = own_prefix(settings)
    tracker = scenario_tracker(redis_client, cfg)
    host = host_report("ca", "h1", cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000, reported_at=T0)
    vms = [running_vm("ca", "vm-1"), running_vm("ca", "poison"), running_vm("ca", "vm-2")]
    message = StateReports(cluster_id="ca", hosts=[host], vms=vms)
    broker = RecordingBroker()
    delivery = Delivery(
        queue=constants.STATE_EVENTS_QUEUE,
        body=encode(message),
        routing_key=constants.state_reports_key("ca"),
        type=type_name(message),
    )
    dispatcher = Dispatcher(cfg, "state-tracker", [unavailable])
    await dispatcher.event(delivery, broker, {"StateReports": StateReports}, tracker.on_report)

    assert broker.outcome == "dead-lettered"
    assert "vm poison cannot be applied" in broker.reason
    snap = tracker.writer.snapshot("ca")
    assert snap is not None
    assert [vm.vm_id for vm in snap.vms] == ["vm-1", "vm-2"]


async def test_a_message_of_32_running_vms_costs_two_round_trips(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings
) -> None:
    client, sent = counted
    cfg = own_prefix(settings)
    tracker = scenario_tracker(client, cfg)
    await tracker.on_report(
        host_report("ca", "h1", cpu_cores=64, physical_mem_mb=320_000, mem_free_mb=300_000, reported_at=T0)
    )
    vms = [f"m-{n}" for n in range(32)]
    await place_pending(client, cfg, "ca", dict.fromkeys(vms, "h1"))
    sent.clear()
    await tracker.on_report(StateReports(cluster_id="ca", vms=[running_vm("ca", vm) for vm in vms]))
    assert sent == ["EVALSHA", "EVALSHA"], sent
    assert await client.hlen(Keys.from_settings(cfg).pending("ca")) == 0
