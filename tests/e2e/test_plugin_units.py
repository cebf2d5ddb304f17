"""A plugin's units (examples/vmsched-example-units, installed by the dev setup) deciding over the bus
in service processes, as an operator would run them after `pip install` of the plugin."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from importlib import metadata

import pytest

from tests.e2e.cli import attach_policy, vmsched
from tests.e2e.conftest import ServiceStack
from tests.factories import host_report, vm_report
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, VmSpec
from vmsched.scheduling.policy import Policy, PolicyFilter, PolicyWeight
from vmsched.store.catalogues import UnitCatalogues
from vmsched.store.redis import connect as connect_redis

pytestmark = pytest.mark.e2e

ORIGIN = f"vmsched-example-units {metadata.version('vmsched-example-units')}"

RACKS = Policy(
    id=uuid.uuid4(),
    name=f"racks-{uuid.uuid4().hex[:6]}",
    description="a built-in filter, the example plugin's filter and weight",
    filters=(PolicyFilter(unit="Memory"), PolicyFilter(unit="RackLabelFilter")),
    weights=(PolicyWeight(unit="RackSpreadWeight", factor=1),),
    properties={"RackLabel": "rack"},
)


async def test_a_plugin_filter_and_weight_decide_and_explain_over_the_bus(
    stack: ServiceStack, client: SchedulerClient, unique: str
) -> None:
    await stack.start("state-tracker", "filter-worker", "weigher", "selector")
    cluster = f"racks-{unique}"
    await attach_policy(stack.settings, cluster, RACKS)

    await client.report_cluster(ClusterReport(cluster_id=cluster))
    now = datetime.now(UTC)
    racks = {"h-r1a": "r1", "h-r1b": "r1", "h-r2": "r2", "h-none": None, "h-r3": "r3"}

    async def report(host: str, rack: str | None) -> None:
        await client.report_host(
            host_report(
                cluster,
                host,
                cpu_cores=16,
                physical_mem_mb=32768,
                mem_free_mb=32768,
                reserved_mem_mb=0,
                labels={} if rack is None else {"rack": rack},
                reported_at=now,
            )
        )

    for host, rack in list(racks.items())[:-1]:
        await report(host, rack)
    # rack r1 runs two VMs, r2 none
    for n in range(2):
        await client.report_vm(vm_report(cluster, f"busy-{n}", "h-r1a", mem_mb=512, vcpus=1))
    await report("h-r3", "r3")  # last: the state tracker applies reports in order, so the VMs are in
    await client.wait_for_state(cluster, hosts=len(racks))

    vm = VmSpec(vm_id=f"vm-{unique}", mem_mb=2048, vcpus=2, extra_specs={"rack:allowed": "r1,r2"})
    d = await client.schedule(cluster, vm, explain_scores=True, explain_hosts=True, timeout=20)
    assert d.status is DecisionStatus.PLACED, d.explanation.summary
    assert d.explanation.filters == ["Memory", "RackLabelFilter"]
    assert {f.host_id: (f.filter, f.reason) for f in d.explanation.filtered} == {
        "h-none": ("RackLabelFilter", "no 'rack' label; the VM runs only in rack 'r1', 'r2'"),
        "h-r3": ("RackLabelFilter", "rack 'r3' is not one of the VM's racks 'r1', 'r2'"),
    }
    assert d.explanation.summary == "3/5 hosts available: 2 RackLabelFilter (not in the VM's racks)"
    # RackSpreadWeight: r2 runs no VM, r1 two (both on h-r1a, counted for h-r1b too)
    assert d.host_id == "h-r2"
    assert d.explanation.scores is not None
    assert [u.unit for u in d.explanation.scores.units] == ["RackSpreadWeight"]
    raw = dict(zip(d.explanation.scores.hosts, d.explanation.scores.units[0].raw, strict=True))
    assert raw == {"h-r2": 0.0, "h-r1a": 2.0, "h-r1b": 2.0}

    # Each service process announced its catalogue, the plugin's units with their origin among them.
    redis = connect_redis(stack.settings)
    try:
        catalogues = UnitCatalogues(redis, stack.settings)
        available = await catalogues.available_units()
        for service in ("filter-worker", "weigher", "selector", "state-tracker"):
            assert {"Memory", "RackLabelFilter", "RackSpreadWeight"} <= available[service], service
        announced = [a for a in await catalogues.instances() if a.service == "filter-worker"]
        assert announced
        assert all(a.units["RackLabelFilter"] == ORIGIN and a.units["Memory"] == "builtin" for a in announced)
    finally:
        await redis.aclose()

    # ... and `vmsched units list` shows where the units come from
    code, out, err = await vmsched(stack.env, "units", "list", timeout=30)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("RackLabelFilter "))
    assert line.split()[1:4] == ["filter", *ORIGIN.split()]
