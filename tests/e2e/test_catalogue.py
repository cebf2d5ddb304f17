"""A policy that combines oVirt and Nova units, running over the bus in service processes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.e2e.cli import attach_policy, vmsched
from tests.e2e.conftest import ServiceStack
from tests.factories import host_report, vm_report
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    ClusterReport,
    DecisionStatus,
    VmSpec,
)
from vmsched.scheduling.policy import FilterSequence, Policy, PolicyFilter, PolicyWeight

pytestmark = pytest.mark.e2e

MIXED = Policy(
    id=uuid.uuid4(),
    name=f"mixed-{uuid.uuid4().hex[:6]}",
    description="oVirt and Nova units together",
    filters=(
        PolicyFilter(unit="Migration", sequence=FilterSequence.FIRST),
        PolicyFilter(unit="ComputeFilter"),  # Nova: enabled, fresh heartbeat
        PolicyFilter(unit="AvailabilityZoneFilter"),  # Nova: the VM's zone
        PolicyFilter(unit="Memory"),  # oVirt
        PolicyFilter(unit="Network"),  # oVirt
        PolicyFilter(unit="VmAffinityGroups"),  # oVirt hard groups
        PolicyFilter(unit="RetryFilter"),  # Nova: hosts already tried
    ),
    weights=(
        PolicyWeight(unit="OptimalForEvenCpuDistribution", factor=1),  # oVirt
        PolicyWeight(unit="RAMWeigher", factor=2),  # Nova
        PolicyWeight(unit="VmAffinityGroups", factor=1),  # oVirt soft groups
    ),
)


async def test_a_policy_of_both_families_filters_weighs_and_explains(
    stack: ServiceStack, client: SchedulerClient, unique: str
) -> None:
    await stack.start("state-tracker", "filter-worker", "weigher", "selector")
    cluster = f"mixed-{unique}"
    await attach_policy(stack.settings, cluster, MIXED)

    await client.report_cluster(ClusterReport(cluster_id=cluster))
    now = datetime.now(UTC)
    layout = {
        # host: (zone, enabled, free memory MB)
        "h-disabled": ("az1", False, 16384),
        "h-az2": ("az2", True, 16384),
        "h-small": ("az1", True, 1024),
        "h-member": ("az1", True, 16384),
        "h-tried": ("az1", True, 16384),
        "h-big": ("az1", True, 32768),
        "h-mid": ("az1", True, 20000),
    }
    for host, (zone, enabled, free) in layout.items():
        await client.report_host(
            host_report(
                cluster,
                host,
                cpu_cores=16,
                physical_mem_mb=free,
                mem_free_mb=free,
                reserved_mem_mb=0,
                enabled=enabled,
                labels={"availability_zone": zone},
                reported_at=now,
            )
        )
    # a member of the VM's anti-affinity group runs on h-member
    await client.report_vm(vm_report(cluster, "other", "h-member", mem_mb=512, vcpus=1))
    await client.wait_for_state(cluster, hosts=len(layout))

    vm = VmSpec(
        vm_id=f"vm-{unique}",
        mem_mb=4096,
        vcpus=2,
        availability_zone="az1",
        tried_hosts=["h-tried"],
        affinity_groups=[
            AffinityGroup(group_id="apart", vms=["other"], vm_rule=AffinityRule(positive=False, enforcing=True))
        ],
    )
    d = await client.schedule(cluster, vm, explain_scores=True, explain_hosts=True, timeout=20)
    assert d.status is DecisionStatus.PLACED, d.explanation.summary
    removed = {f.host_id: f.filter for f in d.explanation.filtered}
    assert removed == {
        "h-disabled": "ComputeFilter",
        "h-az2": "AvailabilityZoneFilter",
        "h-small": "Memory",
        "h-member": "VmAffinityGroups",
        "h-tried": "RetryFilter",
    }
    assert d.explanation.summary.startswith("2/7 hosts available: ")
    assert d.explanation.filters == [f.unit for f in MIXED.ordered_filters()]
    assert d.explanation.scores is not None
    assert [u.unit for u in d.explanation.scores.units] == [w.unit for w in MIXED.weights]
    # RAMWeigher (factor 2) prefers the host with the most free memory; CPU load is equal
    assert d.host_id == "h-big"
    assert d.alternates == ["h-mid"]

    # `vmsched explain` shows the same decision as a table, as an operator would read it
    code, out, err = await vmsched(
        stack.env, "explain", str(d.request_id), "--cluster", d.cluster_id, "--hosts", "0", timeout=30
    )
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if "factor" in line).split()
    assert header[1:3] == ["h-big", "h-mid"]
    compute = next(line for line in lines if line.strip().startswith("ComputeFilter")).split()
    assert compute[1 + header[1:].index("h-disabled")] == "removed"
    assert any(line.startswith("[") and "h-tried: RetryFilter:" in line for line in lines)
    assert any(line.strip().startswith("RAMWeigher") for line in lines)
