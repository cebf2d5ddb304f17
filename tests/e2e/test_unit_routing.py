"""Two filter-workers, one with the example plugin and one started without plugins (VMSCHED_PLUGINS=
false, as on a machine where it is not installed): a policy using the plugin's filter is placed by the
worker that has it, every time; a built-in policy by either; with the plugin's worker gone, the
plugin policy fails with `units_unavailable` naming the units and the worker lacking them."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from datetime import UTC, datetime

import pytest

from tests.e2e.cli import attach_policy, vmsched
from tests.e2e.conftest import SERVICE_OVERRIDES, WORKERS_PLACE, ServiceStack
from tests.factories import host_report
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, VmSpec
from vmsched.scheduling.policy import Policy, PolicyFilter
from vmsched.settings import Settings

pytestmark = pytest.mark.e2e

DECISIONS = 12
PLUGIN_UNITS = ["RackLabelFilter", "RackSpreadWeight"]
REFUSED_LOG = "a request names units this instance lacks"


async def queue_arguments(prefix: str) -> dict[str, str]:
    """The local broker's queues named `prefix`..., with their arguments as rabbitmqctl prints them
    ('[{"x-expires",86400000},...]')."""
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "list_queues", "name", "arguments", "-q", "--no-table-headers", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    rows = (line.split("\t", 1) for line in out.decode().splitlines() if "\t" in line)
    return {name: args for name, args in rows if name.startswith(prefix)}


@pytest.fixture
def service_settings(settings: Settings, migrated_database: str) -> Settings:
    """Prefixes of its own: the catalogues an earlier test's killed workers announced (they live
    until their TTL) are not this test's running instances."""
    own = uuid.uuid4().hex[:6]
    return settings.model_copy(
        update={
            "postgres_url": migrated_database,
            **SERVICE_OVERRIDES,
            "amqp_prefix": f"{settings.amqp_prefix}ur-{own}.",
            "redis_prefix": f"{settings.redis_prefix}:ur-{own}",
        }
    )


def racks_policy() -> Policy:
    return Policy(
        id=uuid.uuid4(),
        name=f"racks-{uuid.uuid4().hex[:6]}",
        description="a built-in filter and the example plugin's filter",
        filters=(PolicyFilter(unit="Memory"), PolicyFilter(unit="RackLabelFilter")),
        properties={"RackLabel": "rack"},
    )


def builtin_policy() -> Policy:
    return Policy(
        id=uuid.uuid4(),
        name=f"builtin-{uuid.uuid4().hex[:6]}",
        description="built-in units only",
        filters=(PolicyFilter(unit="Memory"),),
    )


async def test_a_plugin_policy_goes_only_to_the_filter_worker_with_the_plugin(
    stack: ServiceStack, client: SchedulerClient, unique: str
) -> None:
    # Every group goes to a worker: the routing by catalogue is what this tests.
    await stack.start("state-tracker", "weigher", "selector", "policy-admin", env=WORKERS_PLACE)
    [with_plugin] = await stack.start("filter-worker")
    [without] = await stack.start("filter-worker", env={"VMSCHED_PLUGINS": "false"})
    racks, plain = f"racks-{unique}", f"plain-{unique}"
    await attach_policy(stack.settings, racks, racks_policy())
    await attach_policy(stack.settings, plain, builtin_policy())
    now = datetime.now(UTC)
    for cluster in (racks, plain):
        await client.report_cluster(ClusterReport(cluster_id=cluster))
        for n in range(3):
            await client.report_host(
                host_report(
                    cluster,
                    f"h{n}",
                    cpu_cores=64,
                    physical_mem_mb=262144,
                    mem_free_mb=262144,
                    reserved_mem_mb=0,
                    labels={"rack": f"r{n}"},
                    reported_at=now,
                )
            )
        await client.wait_for_state(cluster, hosts=3)

    # Each running instance's catalogue: the worker without the plugin lacks its units.
    code, out, err = await vmsched(stack.env, "units", "running", "--json", timeout=30)
    assert code == 0, err
    workers = [i for i in json.loads(out) if i["service"] == "filter-worker"]
    assert len(workers) == 2
    lacking = [i for i in workers if i["lacks"]]
    assert [i["lacks"] for i in lacking] == [PLUGIN_UNITS]
    assert len({i["catalogue"] for i in workers}) == 2
    code, out, err = await vmsched(stack.env, "units", "list", timeout=30)
    assert code == 0, err
    assert f"LACKS {', '.join(PLUGIN_UNITS)}" in out
    without_id = lacking[0]["instance"]
    # Their queues, one per catalogue, expire once no worker uses them (a catalogue per plugin version).
    catalogue_queues = await queue_arguments(f"{stack.settings.amqp_prefix}{c.RPC_QUEUES[c.RPC_PLACE]}.")
    assert {name.rpartition(".")[2] for name in catalogue_queues} == {i["catalogue"] for i in workers}
    assert all(f'{{"x-expires",{c.CATALOGUE_QUEUE_EXPIRES_MS}}}' in args for args in catalogue_queues.values())

    # Every decision under the plugin policy is placed, none sent to the worker without the plugin
    # (it would refuse it, logging so, and the selector would send it again).
    for n in range(DECISIONS):
        vm = VmSpec(vm_id=f"vm-{n}-{unique}", mem_mb=256, vcpus=1, extra_specs={"rack:allowed": "r0,r1"})
        d = await client.schedule(racks, vm, timeout=20)
        assert d.status is DecisionStatus.PLACED, (d.error, d.explanation.summary)
        assert d.host_id in ("h0", "h1")
    # Built-in only: either worker places it.
    for n in range(DECISIONS):
        d = await client.schedule(plain, VmSpec(vm_id=f"pl-{n}-{unique}", mem_mb=256, vcpus=1), timeout=20)
        assert d.status is DecisionStatus.PLACED, (d.error, d.explanation.summary)
    assert REFUSED_LOG not in without.tail()

    # The worker with the plugin stops (and withdraws its catalogue): the plugin policy cannot run.
    await stack.kill(with_plugin, signal.SIGTERM)
    d = await client.schedule(racks, VmSpec(vm_id=f"late-{unique}", mem_mb=256, vcpus=1), timeout=20)
    assert d.status is DecisionStatus.ERROR
    assert d.error is not None
    assert d.error.code == "units_unavailable"
    assert "missing: RackLabelFilter" in d.error.message
    assert f"filter-worker {without_id}" in d.error.message
    assert REFUSED_LOG not in without.tail()  # refused by the selector: never sent to the worker
    # ... while the built-in policy goes on with the worker left.
    d = await client.schedule(plain, VmSpec(vm_id=f"pl-late-{unique}", mem_mb=256, vcpus=1), timeout=20)
    assert d.status is DecisionStatus.PLACED, (d.error, d.explanation.summary)
