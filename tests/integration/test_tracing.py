"""Tracing on the real Redis and PostgreSQL, services in this process, on RabbitMQ and in memory:
one decision is one trace across the client, the selector, the filter-worker, Redis and PostgreSQL,
and the log lines written while deciding carry its trace id; a group is linked to its requests."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from types import ModuleType

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import DecisionStatus, VmSpec
from vmsched.db import migrate
from vmsched.settings import Settings
from vmsched.tracing import Tracing
from vmsched_services.selector import metrics as selector_metrics

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

REDIS_SCOPE = "opentelemetry.instrumentation.redis"
POSTGRES_SCOPE = "opentelemetry.instrumentation.asyncpg"
AMQP_SCOPE = "opentelemetry.instrumentation.aio_pika"

make_cluster = partial(
    factories.make_cluster, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192, reserved_mem_mb=0, networks=["vmnet"]
)


@pytest.fixture(scope="module")
def exporter(bus_kind: str) -> InMemorySpanExporter:
    """One per stack: the tracing's shutdown at the end of a stack shuts its exporter down too."""
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
async def stack(
    bus_settings: Settings, buses: Buses, database: str, exporter: InMemorySpanExporter
) -> AsyncIterator[Settings]:
    """The services traced into `exporter`, logging at INFO (the selector's `decision` line)."""
    await migrate(database)
    # The group goes to the filter-worker (not placed in the selector): the trace crosses that hop too.
    update = {"postgres_url": database, "log_level": "INFO", "log_format": "json", "place_in_selector": False}
    cfg = bus_settings.model_copy(update=update)
    async with services(cfg, "state-tracker", "filter-worker", "selector", bus=buses, span_exporter=exporter):
        assert Tracing.current is not None
        yield cfg
    assert Tracing.current is None  # the last user left: instrumentations off, the log lines plain again


@pytest.fixture
def decision_log(fresh_log: Callable[[ModuleType], None]) -> None:
    """The selector's `decision` line written under the stack's configuration (INFO), whatever an
    earlier module cached."""
    fresh_log(selector_metrics)


def small_vm(name: str) -> VmSpec:
    return factories.vm_spec(name, mem_mb=1024, vcpus=1)


async def spans_of(exporter: InMemorySpanExporter, trace_id: int, wanted: Sequence[str]) -> list[ReadableSpan]:
    """The trace's spans once every `wanted` name is among them: a service's consumer span ends
    after its reply went out, so it may end after the caller has the reply."""
    names: set[str] = set()
    for _ in range(100):
        found = [s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id]
        names = {s.name for s in found}
        if set(wanted) <= names:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"trace {trace_id:032x} has {sorted(names)}, not all of {sorted(wanted)}")


async def orphans(exporter: InMemorySpanExporter, trace_id: int) -> list[str]:
    """The trace's spans whose parent is not in it (after waiting a while for them to end)."""
    missing: list[str] = []
    for _ in range(100):
        found = [s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id]
        ids = {s.context.span_id for s in found if s.context is not None}
        missing = [s.name for s in found if s.parent is not None and s.parent.span_id not in ids]
        if not missing:
            break
        await asyncio.sleep(0.05)
    return missing


def the_span(exporter: InMemorySpanExporter, name: str, request_id: uuid.UUID) -> ReadableSpan:
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("vmsched.request_id") == str(request_id)
    ]
    assert len(found) == 1, [s.name for s in found]
    return found[0]


def group_size(group: ReadableSpan) -> int:
    size = (group.attributes or {}).get("vmsched.group_size", 0)
    assert isinstance(size, int)
    return size


def log_lines(err: str) -> list[dict[str, object]]:
    lines = []
    for line in err.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.mark.usefixtures("decision_log")
async def test_one_decision_is_one_trace_across_the_hops_and_its_log_lines(
    client: SchedulerClient,
    stack: Settings,
    exporter: InMemorySpanExporter,
    unique: str,
    bus_kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = f"trace-{unique}"
    await make_cluster(client, cluster, 2)
    capsys.readouterr()
    first = await client.schedule(cluster, small_vm(f"vm-{unique}-1"))
    assert first.status is DecisionStatus.PLACED

    schedule = the_span(exporter, "vmsched.schedule", first.request_id)
    assert schedule.context is not None
    assert schedule.parent is None
    trace_id = schedule.context.trace_id
    wanted = ["vmsched.schedule", "vmsched.decide", "vmsched.group", "vmsched.place"]
    found = await spans_of(exporter, trace_id, wanted)
    scopes = {s.instrumentation_scope.name for s in found if s.instrumentation_scope is not None}
    # The decision record looked up, the lock, pending and state read (selector and worker), and the
    # cluster's policy read from PostgreSQL (the first request of this cluster: not cached yet).
    assert {REDIS_SCOPE, POSTGRES_SCOPE} <= scopes, scopes
    if bus_kind == "amqp":
        # The messages themselves: the request and the `place` call published and consumed.
        kinds = {s.kind.name for s in found if s.instrumentation_scope and s.instrumentation_scope.name == AMQP_SCOPE}
        assert {"PRODUCER", "CONSUMER"} <= kinds

    # Every span of the decision has its parent in the trace (nothing orphaned by a lost header),
    # once the consumers' spans, which end after their replies, have ended.
    assert await orphans(exporter, trace_id) == []
    place = next(s for s in found if s.name == "vmsched.place")
    assert (place.attributes or {})["vmsched.group_size"] == 1

    # The log lines written while deciding name the trace.
    lines = [line for line in log_lines(capsys.readouterr().err) if line.get("request_id") == str(first.request_id)]
    decided = [line for line in lines if line["event"] == "decision"]
    assert decided, lines
    assert all(line["trace_id"] == f"{trace_id:032x}" for line in lines)
    assert all(isinstance(line["span_id"], str) and len(line["span_id"]) == 16 for line in lines)

    # The next decision is a trace of its own.
    second = await client.schedule(cluster, small_vm(f"vm-{unique}-2"))
    assert second.status is DecisionStatus.PLACED
    again = the_span(exporter, "vmsched.schedule", second.request_id)
    assert again.context is not None
    assert again.context.trace_id != trace_id
    await spans_of(exporter, again.context.trace_id, wanted)


async def test_a_group_is_a_child_of_its_first_request_and_linked_to_every_one(
    client: SchedulerClient, stack: Settings, exporter: InMemorySpanExporter, unique: str
) -> None:
    cluster = f"trace-g-{unique}"
    await make_cluster(client, cluster, 4)
    decisions = await asyncio.gather(*(client.schedule(cluster, small_vm(f"vm-{unique}-{i}")) for i in range(6)))
    assert all(d.status is DecisionStatus.PLACED for d in decisions)
    decides = {d.request_id: the_span(exporter, "vmsched.decide", d.request_id) for d in decisions}
    for _ in range(100):  # a group span ends after its requests are answered
        groups = [
            s
            for s in exporter.get_finished_spans()
            if s.name == "vmsched.group" and (s.attributes or {}).get("vmsched.cluster") == cluster
        ]
        if sum(group_size(g) for g in groups) >= len(decisions):
            break
        await asyncio.sleep(0.05)
    for rid, decide in decides.items():
        assert decide.context is not None
        # Decided in exactly one group, which links to its request...
        mine = [g for g in groups if any(link.context.span_id == decide.context.span_id for link in g.links)]
        assert len(mine) == 1, rid
        group = mine[0]
        assert group.context is not None
        if group.parent is None or group.parent.span_id != decide.context.span_id:
            # ... and, in another request's trace, is linked back to from this request's own.
            assert any(link.context.span_id == group.context.span_id for link in decide.links), rid
    # Each group is in the trace of a request it decided (the one that waited longest).
    members = {d.context.span_id for d in decides.values() if d.context is not None}
    assert all(g.parent is not None and g.parent.span_id in members for g in groups)
