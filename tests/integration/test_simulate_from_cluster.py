"""`vmsched simulate --from-cluster C`: a cluster reported to the real state tracker, attached to a
policy in the real policy-admin (both in this process, on RabbitMQ), becomes a workload with its
hosts, its VMs and its policy with the cluster's overrides, and simulates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests import factories
from tests.integration.conftest import services
from vmsched.client import SchedulerClient
from vmsched.contracts import AffinityGroup, AffinityRule, ClusterAttachment, PolicySet, VmStatus
from vmsched.db import migrate
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.tools.simulate import cluster_snapshot, policies_of, run_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def stack(settings: Settings, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "policy-admin"):
        yield cfg


async def test_a_live_cluster_becomes_a_workload_with_its_hosts_vms_and_policy(stack: Settings, unique: str) -> None:
    cluster, name = f"fc-{unique}", f"fc-{unique}"
    async with SchedulerClient(stack) as client, PolicyClient(stack) as admin:
        hosts = await factories.make_cluster(
            client,
            cluster,
            3,
            cpu_cores=16,
            physical_mem_mb=65536,
            mem_free_mb=65536,
            reserved_mem_mb=0,
            networks=["vmnet"],
            vary=lambda i: {"labels": {"rack": f"r{i}"}},
        )
        rule = AffinityRule(positive=False, enforcing=True)
        apart = AffinityGroup(group_id="apart", vms=["vm0", "vm1"], vm_rule=rule)
        for i in range(4):
            vm = factories.vm_report(
                cluster,
                f"vm{i}",
                hosts[i % 2],
                mem_mb=4096,
                vcpus=2,
                cpu_usage_pct=25.0,
                ha=i == 0,
                affinity_groups=[apart] if i < 2 else [],
            )
            await client.report_vm(vm)
        await client.report_vm(factories.vm_report(cluster, "gone", hosts[0], VmStatus.DOWN, mem_mb=1024, vcpus=1))
        for _ in range(600):  # the tracker applies reports in order; wait until the last VM is in
            if len((await client.state(cluster)).vms) == 5:
                break
            await asyncio.sleep(0.05)
        await admin.clone("power_saving", name)
        attach = ClusterAttachment(cluster_id=cluster, policy=name, properties={"HighUtilization": "70"})
        await admin.apply(PolicySet(clusters=[attach]))

    workload = await cluster_snapshot(cluster, stack, 2.0)

    assert [h.id for h in workload.hosts] == sorted(hosts)
    assert {h.labels["rack"] for h in workload.hosts} == {"r0", "r1", "r2"}
    assert all((h.cpu_cores, h.mem_mb, h.networks) == (16, 65536, ["vmnet"]) for h in workload.hosts)
    assert sorted(a.vm_id for a in workload.arrivals) == ["vm0", "vm1", "vm2", "vm3"]  # not the VM that is down
    assert all((a.at_s, a.mem_mb, a.vcpus, a.cpu_usage_pct) == (0, 4096, 2, 25.0) for a in workload.arrivals)
    assert [a.ha for a in workload.arrivals if a.vm_id == "vm0"] == [True]
    # The groups the VMs' reports carry come along.
    assert [(g.id, g.positive, g.enforcing) for g in workload.affinity_groups] == [("apart", False, True)]
    assert {a.vm_id: a.affinity_groups for a in workload.arrivals}["vm1"] == ["apart"]
    assert workload.duration_s == 7200
    [policy] = workload.policies
    assert (policy.name, policy.properties["HighUtilization"]) == (name, "70")

    [(report, _)] = await run_all(workload, policies_of([], workload))
    assert report.policy == name
    assert report.placed == 4
