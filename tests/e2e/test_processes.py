"""The services as separate OS processes over the real RabbitMQ, Redis and PostgreSQL.

Each test starts the processes it needs (see conftest.ServiceStack) and talks to them as the engine
would: through SchedulerClient, or the `vmsched` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests import factories
from tests.e2e.cli import vmsched
from tests.e2e.conftest import WORKERS_PLACE, ServiceStack
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    DecisionStatus,
    Explanation,
    ScheduleDecision,
)

pytestmark = pytest.mark.e2e

ALL = ("state-tracker", "filter-worker", "filter-worker", "weigher", "selector")
HOST_MEM_MB = 8192
#: The client's bound on one schedule request (the selector's internal calls use 10 s, see conftest).
SCHEDULE_TIMEOUT_S = 15.0


def _sized(i: int) -> dict[str, Any]:
    """Host i of a cluster: hosts differ in size and load."""
    mem = HOST_MEM_MB + 1024 * i
    return {
        "cpu_cores": 8 + 2 * (i % 3),
        "cpu_usage_pct": float(5 * (i % 4)),
        "physical_mem_mb": mem,
        "mem_free_mb": mem - 512 * (i % 3),
    }


#: A cluster of `n` hosts (different sizes and loads, no reserved memory), once the tracker has them.
make_cluster = partial(factories.make_cluster, timeout=15, vary=_sized, reserved_mem_mb=0, networks=["vmnet"])
#: A 1024 MB 1-vCPU VM unless told otherwise.
vm = partial(factories.vm_spec, mem_mb=1024, vcpus=1)


@contextlib.asynccontextmanager
async def follow_decisions(
    client: SchedulerClient, cluster: str, received: list[ScheduleDecision], want: int
) -> AsyncIterator[asyncio.Task[None]]:
    """A `client.decisions(cluster)` subscriber in a task, yielded once its queue is bound.

    Readiness is proven, not slept for: probe decisions are published on the cluster's decision key
    until the subscriber has seen one (probes are then dropped from `received`). The task ends after
    `want` real decisions, and is cancelled on exit if it has not.
    """
    probe_vm = f"probe-{uuid.uuid4().hex[:8]}"
    seen_probe = asyncio.Event()

    async def run() -> None:
        async for d in client.decisions(cluster):
            if d.vm_id == probe_vm:
                seen_probe.set()
                continue
            received.append(d)
            if len(received) >= want:
                return

    task = asyncio.create_task(run())
    try:
        probe = ScheduleDecision(
            request_id=uuid.uuid4(),
            cluster_id=cluster,
            vm_id=probe_vm,
            status=DecisionStatus.ERROR,
            explanation=Explanation(summary="probe", candidates=0),
            decided_at=datetime.now(UTC),
        )
        end = time.monotonic() + 10
        while not seen_probe.is_set():
            assert not task.done(), "the decisions subscriber ended early"
            assert time.monotonic() < end, "the decisions subscriber never received a probe"
            await client.bus.publish(c.decision_key(cluster), probe, persistent=False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen_probe.wait(), 0.1)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_happy_path_places_explains_and_publishes(
    stack: ServiceStack, client: SchedulerClient, unique: str
) -> None:
    await stack.start(*ALL)
    cluster = f"e2e-{unique}"
    hosts = await make_cluster(client, cluster, 8)
    received: list[ScheduleDecision] = []
    async with follow_decisions(client, cluster, received, want=2) as follower:
        placed, too_big = await schedule_small_and_huge(client, cluster, hosts, unique)
        await asyncio.wait_for(follower, 10)
    assert [d.request_id for d in received] == [placed.request_id, too_big.request_id]
    assert received == [placed, too_big]


async def schedule_small_and_huge(
    client: SchedulerClient, cluster: str, hosts: list[str], unique: str
) -> tuple[ScheduleDecision, ScheduleDecision]:
    """A VM that fits (placed, explained with a score table) and one that fits nowhere (unplaceable)."""
    placed = await client.schedule(cluster, vm(f"{unique}-small"), explain_scores=True, timeout=SCHEDULE_TIMEOUT_S)
    assert placed.status is DecisionStatus.PLACED, placed.explanation.summary
    assert placed.host_id in hosts
    assert len(placed.alternates) == 3
    assert placed.host_id not in placed.alternates
    assert set(placed.alternates) <= set(hosts)
    assert placed.policy == "none"
    assert placed.fencing_token > 0
    assert placed.explanation.summary == "8/8 hosts available"
    assert placed.explanation.candidates == 8
    scores = placed.explanation.scores
    assert scores is not None
    assert sorted(scores.hosts) == sorted(hosts)
    assert scores.hosts[0] == placed.host_id
    assert scores.hosts[1:4] == placed.alternates
    assert scores.units, "the score table names the weight units"
    assert len(scores.totals) == 8
    for unit in scores.units:
        assert len(unit.raw) == len(unit.points) == 8

    too_big = await client.schedule(cluster, vm(f"{unique}-huge", mem_mb=1 << 20), timeout=SCHEDULE_TIMEOUT_S)
    assert too_big.status is DecisionStatus.UNPLACEABLE
    assert too_big.host_id is None
    assert too_big.alternates == []
    removed = too_big.explanation.filtered
    assert sorted(f.host_id for f in removed) == sorted(hosts)
    assert {f.filter for f in removed} == {"Memory"}
    assert all("MB" in f.reason for f in removed), [f.reason for f in removed]
    assert too_big.explanation.summary.startswith("0/8 hosts available: 8 Memory ("), too_big.explanation.summary
    return placed, too_big


async def _unacked_until(stack: ServiceStack, ok: Callable[[int], bool], timeout_s: float = 15.0) -> int | None:
    """The filter-workers' unacknowledged place requests once `ok` holds for the count (or the last
    count after `timeout_s`); None where rabbitmqctl cannot be run."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = await stack.unacknowledged("filter-worker")
        if n is None or ok(n) or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.5)


async def test_a_filter_worker_killed_with_requests_in_flight_loses_none(
    stack: ServiceStack, client: SchedulerClient, unique: str
) -> None:
    """Requests held by a filter-worker that dies are answered by the other one.

    Worker A is frozen (SIGSTOP) before any request is sent: it keeps its AMQP connection and consumer,
    so RabbitMQ still round-robins place requests to it (up to its prefetch of 4), but it never
    answers. Each request is for its own cluster, so the selector's per-cluster lock does not
    serialize them and its place calls are concurrent. Proof that some were in flight at A while it
    was frozen: B is idle and answers in milliseconds, yet requests stay unanswered, and (when
    rabbitmqctl can be run) the place queue shows unacknowledged messages. SIGKILL A: the broker
    requeues A's unacked requests to B, and every schedule request is placed within its timeout.
    """
    services = ("state-tracker", "filter-worker", "filter-worker", "weigher", "selector")
    a, _b = (await stack.start(*services, env=WORKERS_PLACE))[1:3]
    n = 8
    clusters = [f"kill-{unique}-{i}" for i in range(n)]
    await asyncio.gather(*(make_cluster(client, cl, 3) for cl in clusters))

    stack.freeze(a)
    started = time.monotonic()
    tasks = [asyncio.create_task(client.schedule(cl, vm(f"{cl}-vm"), timeout=SCHEDULE_TIMEOUT_S)) for cl in clusters]
    await asyncio.sleep(1.5)
    unanswered = sum(not t.done() for t in tasks)
    assert unanswered > 0, "every request was answered although worker A was frozen: none reached A"
    # A quorum queue's counters reach rabbitmqctl with its metrics, every few seconds: wait for them.
    unacked = await _unacked_until(stack, lambda n: n > 0)
    if unacked is not None:
        assert unacked > 0, "no place request was held by the frozen worker"
    assert all(not t.done() or t.exception() is None for t in tasks)

    code = await stack.kill(a, signal.SIGKILL)
    assert code == -signal.SIGKILL
    decisions = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    assert [d.status for d in decisions] == [DecisionStatus.PLACED] * n, [d.explanation.summary for d in decisions]
    assert [d.cluster_id for d in decisions] == clusters
    # Each answer came within its call's SCHEDULE_TIMEOUT_S (else the call had raised RpcTimeout).
    print(f"{n} requests answered {elapsed:.2f} s after worker A froze")
    if unacked is not None:
        assert await _unacked_until(stack, lambda n: n == 0) == 0


async def test_the_state_tracker_survives_a_restart(stack: ServiceStack, client: SchedulerClient, unique: str) -> None:
    procs = await stack.start(*ALL)
    tracker = procs[0]
    cluster = f"restart-{unique}"
    hosts = await make_cluster(client, cluster, 5)
    before = await client.state(cluster)
    assert sorted(h.report.host_id for h in before.hosts) == sorted(hosts)

    code = await stack.kill(tracker, signal.SIGTERM)
    assert code == 0, f"the state tracker did not stop cleanly on SIGTERM\n{tracker.tail()}"
    await stack.start("state-tracker")

    after = await client.state(cluster)
    assert after.version == before.version
    assert after.hosts == before.hosts
    assert after.settings == before.settings

    # The new tracker goes on from the stored version, and scheduling works against it.
    await client.report_host(before.hosts[0].report.model_copy(update={"host_id": f"{cluster}-late"}))
    later = await client.wait_for_state(cluster, hosts=6, timeout=10)
    assert later.version == before.version + 1
    d = await client.schedule(cluster, vm(f"{unique}-after-restart"), timeout=SCHEDULE_TIMEOUT_S)
    assert d.status is DecisionStatus.PLACED, d.explanation.summary
    assert d.state_version == later.version


async def test_vmsched_schedule_command_prints_a_decision(
    stack: ServiceStack, client: SchedulerClient, unique: str, tmp_path: Path
) -> None:
    await stack.start(*ALL)
    cluster = f"cli-{unique}"
    hosts = await make_cluster(client, cluster, 4)
    vm_file = tmp_path / "vm.json"
    vm_file.write_text(vm(f"{unique}-cli", mem_mb=2048, vcpus=2).model_dump_json())

    code, out, err = await vmsched(
        stack.env, "schedule", "--cluster", cluster, "--vm", str(vm_file), "--json", timeout=30
    )
    assert code == 0, err[-3000:]
    decision = ScheduleDecision.model_validate(json.loads(out))
    assert decision.status is DecisionStatus.PLACED
    assert decision.cluster_id == cluster
    assert decision.vm_id == f"{unique}-cli"
    assert decision.host_id in hosts
    assert decision.explanation.summary == "4/4 hosts available"
