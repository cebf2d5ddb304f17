"""The selector path on real Redis and PostgreSQL, services running in this process, on RabbitMQ and in memory."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    AffinityGroup,
    AffinityRule,
    DecisionStatus,
    ScheduleDecision,
    ScheduleRequest,
    VmSpec,
    VmStatus,
)
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.errors import RemoteError
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched.settings import Settings
from vmsched.store import DecisionStore, Keys, PendingStore
from vmsched.store.decisions import request_fingerprint
from vmsched.store.redis import connect
from vmsched_services.selector.service import start as start_selector

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]

HOST_MEM = 4096  # with reserved 0 and overcommit 100%, three 1024+64 MB VMs fit per host


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    """All four services in this process, plus a second selector competing for requests."""
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", bus=buses):
        second = await buses.runtime(cfg, "selector-2")
        await start_selector(second)
        yield cfg
        await second.close()


#: Hosts of HOST_MEM MB with 8 cores, no reserved memory and the VMs' network, unless told otherwise.
make_cluster = partial(
    factories.make_cluster,
    cpu_cores=8,
    physical_mem_mb=HOST_MEM,
    mem_free_mb=HOST_MEM,
    reserved_mem_mb=0,
    networks=["vmnet"],
)


def small_vm(i: int | str = 0, **kw: object) -> VmSpec:
    """A 1024 MB 1-vCPU VM called vm-<i>, unless told otherwise."""
    return factories.vm_spec(f"vm-{i}", **{"mem_mb": 1024, "vcpus": 1, **kw})


async def test_places_records_pending_under_the_token_and_publishes(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    cluster = f"sel-{unique}"
    hosts = await make_cluster(client, cluster, 3)
    received: list[ScheduleDecision] = []

    async def follow() -> None:
        async for d in client.decisions(cluster):
            received.append(d)
            return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.2)  # the subscription's queue is bound before the decision is published
    d = await client.schedule(cluster, small_vm(unique), explain_scores=True)
    assert d.status is DecisionStatus.PLACED
    assert d.host_id in hosts
    assert set(d.alternates) == set(hosts) - {d.host_id}
    assert d.policy == "none"
    assert d.explanation.summary == "3/3 hosts available"
    assert d.explanation.scores is not None
    assert [u.unit for u in d.explanation.scores.units] == [w.unit for w in DEFAULT_POLICY.weights]
    await asyncio.wait_for(follower, 5)
    assert received[0].request_id == d.request_id

    redis = connect(stack)
    try:
        pending = await PendingStore(redis, stack).read(cluster)
    finally:
        await redis.aclose()
    assert [(p.vm_id, p.host_id, p.mem_mb, p.fencing_token) for p in pending] == [
        (f"vm-{unique}", d.host_id, 1024 + 64, d.fencing_token)
    ]


async def test_same_request_id_twice_gets_the_same_decision_not_a_second_placement(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    cluster = f"idem-{unique}"
    await make_cluster(client, cluster, 3)
    rid = uuid.uuid4()
    first, second = await asyncio.gather(
        client.schedule(cluster, small_vm(1), request_id=rid),
        client.schedule(cluster, small_vm(1), request_id=rid),
    )
    third = await client.schedule(cluster, small_vm(1), request_id=rid)
    assert first.status is DecisionStatus.PLACED
    assert first == second == third


async def test_two_selectors_under_concurrency_never_overcommit(client: SchedulerClient, unique: str) -> None:
    cluster = f"conc-{unique}"
    hosts = await make_cluster(client, cluster, 5)
    vms = [small_vm(f"{unique}-{i}") for i in range(40)]
    decisions = await asyncio.gather(*(client.schedule(cluster, vm, timeout=30) for vm in vms))
    per_host: dict[str, int] = defaultdict(int)
    for d, vm in zip(decisions, vms, strict=True):
        if d.status is DecisionStatus.PLACED:
            assert d.host_id is not None
            per_host[d.host_id] += vm.mem_mb + vm.overhead_mb
        else:
            assert d.status is DecisionStatus.UNPLACEABLE, d
            assert "Memory" in d.explanation.summary
    placed = sum(d.status is DecisionStatus.PLACED for d in decisions)
    assert placed == 3 * len(hosts), [d.explanation.summary for d in decisions]
    assert all(mem <= HOST_MEM for mem in per_host.values()), per_host
    # Requests waiting for the same cluster are decided in groups, one lock acquisition each: a
    # fencing token is shared only by the decisions of one group, which read the state once.
    versions_by_token: dict[int, set[int]] = defaultdict(set)
    for d in decisions:
        if d.status is DecisionStatus.PLACED:
            assert d.fencing_token > 0
            versions_by_token[d.fencing_token].add(d.state_version)
    assert all(len(v) == 1 for v in versions_by_token.values()), versions_by_token


async def test_no_host_but_pending_waits_for_it_to_clear_and_retries_once(client: SchedulerClient, unique: str) -> None:
    cluster = f"retry-{unique}"
    [host] = await make_cluster(client, cluster, 1, physical_mem_mb=2000, mem_free_mb=2000)
    first = await client.schedule(cluster, small_vm("a"))
    assert first.host_id == host

    async def start_fails_soon() -> None:
        await asyncio.sleep(0.15)
        await client.report_vm(factories.vm_report(cluster, "vm-a", None, VmStatus.FAILED, mem_mb=1024, vcpus=1))

    failing = asyncio.create_task(start_fails_soon())
    second = await client.schedule(cluster, small_vm("b"))
    await failing
    assert second.status is DecisionStatus.PLACED, second.explanation.summary
    assert second.retried is True
    assert second.host_id == host


async def test_no_host_and_no_pending_is_unplaceable_with_reasons(client: SchedulerClient, unique: str) -> None:
    cluster = f"nope-{unique}"
    await make_cluster(client, cluster, 3)
    d = await client.schedule(cluster, small_vm(0, networks=["storage"]))
    assert d.status is DecisionStatus.UNPLACEABLE
    assert d.retried is False
    assert d.explanation.summary == "0/3 hosts available: 3 Network (missing network 'storage')"
    assert {f.filter for f in d.explanation.filtered} == {"Network"}
    assert len(d.explanation.filtered) == 3


async def test_a_placed_decision_lists_removed_hosts_only_when_asked(client: SchedulerClient, unique: str) -> None:
    cluster = f"told-{unique}"
    # The first host lacks the VMs' network.
    hosts = await make_cluster(client, cluster, 3, vary=lambda i: {"networks": ["other"] if i == 0 else ["vmnet"]})
    quiet = await client.schedule(cluster, small_vm(0, networks=["vmnet"]))
    assert quiet.status is DecisionStatus.PLACED
    assert quiet.explanation.summary.startswith("2/3 hosts available: 1 Network (")
    assert quiet.explanation.filtered == []
    told = await client.schedule(cluster, small_vm(1, networks=["vmnet"]), explain_hosts=True)
    assert told.status is DecisionStatus.PLACED
    assert [(f.host_id, f.filter) for f in told.explanation.filtered] == [(hosts[0], "Network")]


async def test_a_request_past_its_deadline_is_not_placed(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"late-{unique}"
    await make_cluster(client, cluster, 2)
    d = await client.schedule(cluster, small_vm(0), deadline=datetime.now(UTC) - timedelta(seconds=1))
    assert d.status is DecisionStatus.EXPIRED
    assert d.host_id is None


async def test_unknown_cluster_is_an_error_decision(client: SchedulerClient, unique: str) -> None:
    d = await client.schedule(f"ghost-{unique}", small_vm(0))
    assert d.status is DecisionStatus.ERROR
    assert d.error is not None
    assert d.error.code == "unknown_cluster"


async def test_invalid_property_is_an_error_decision_until_fixed(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    cluster = f"prop-{unique}"
    await make_cluster(client, cluster, 2)
    pool = await connect_pg(stack.postgres_url)
    try:
        repo = PolicyRepository(pool)
        await repo.set_cluster_policy(cluster, "evenly_distributed")
        # An override stored by hand (or by an older version) that no longer passes validation.
        await pool.execute(
            "UPDATE cluster_policy SET properties = $2 WHERE cluster_id = $1",
            cluster,
            {"HighUtilization": "500"},
        )
        await client.policy_changed(cluster_id=cluster)
        await asyncio.sleep(0.3)
        bad = await client.schedule(cluster, small_vm(0))
        assert bad.status is DecisionStatus.ERROR
        assert bad.error is not None
        assert bad.error.code == "invalid_property"
        assert "HighUtilization='500'" in bad.error.message
        assert "^([5-9][0-9])$" in bad.error.message

        await repo.set_cluster_policy(cluster, "evenly_distributed", properties={"HighUtilization": "75"})
        await client.policy_changed(cluster_id=cluster)
        await asyncio.sleep(0.3)
        good = await client.schedule(cluster, small_vm(0))
        assert good.status is DecisionStatus.PLACED
        assert good.policy == "evenly_distributed"
        # What it ran: the stored version, and the properties with the cluster's override merged in.
        assert good.policy_version == (await repo.get("evenly_distributed")).version
        assert good.policy_properties["HighUtilization"] == "75"
        assert good.policy_properties["CpuOverCommitDurationMinutes"] == "2"
    finally:
        await pool.close()


async def test_a_batch_spreads_by_virtually_consuming_each_chosen_host(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    cluster = f"batch-{unique}"
    hosts = await make_cluster(client, cluster, 3)
    big = [small_vm(f"{unique}-{i}", mem_mb=2500) for i in range(3)]  # one per host: 2 would not fit
    d = await client.schedule(cluster, big[0], batch=big[1:])
    assert d.status is DecisionStatus.PLACED, d.explanation.summary
    assert [p.vm_id for p in d.placements] == [vm.vm_id for vm in big]
    assert sorted(p.host_id for p in d.placements) == sorted(hosts)
    assert d.host_id == d.placements[0].host_id
    assert d.explanation.summary.startswith("placed 3 VMs; first: ")

    redis = connect(stack)
    try:
        pending = await PendingStore(redis, stack).read(cluster)
    finally:
        await redis.aclose()
    assert {(p.vm_id, p.host_id) for p in pending} == {(p.vm_id, p.host_id) for p in d.placements}
    assert {p.fencing_token for p in pending} == {d.fencing_token}


async def test_a_batch_is_placed_whole_or_not_at_all(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"whole-{unique}"
    await make_cluster(client, cluster, 2)
    vms = [small_vm(f"{unique}-{i}", mem_mb=2500) for i in range(3)]  # the third fits nowhere
    d = await client.schedule(cluster, vms[0], batch=vms[1:])
    assert d.status is DecisionStatus.UNPLACEABLE
    assert d.placements == []
    assert d.explanation.summary.startswith(f"vm-{unique}-2 (3/3): 0/2 hosts available: 2 Memory")

    redis = connect(stack)
    try:
        assert await PendingStore(redis, stack).read(cluster) == []
    finally:
        await redis.aclose()


async def test_nova_style_instances_get_their_own_ids(client: SchedulerClient, unique: str) -> None:
    cluster = f"inst-{unique}"
    await make_cluster(client, cluster, 4)
    d = await client.schedule_instances(cluster, small_vm(unique), 4)
    assert d.status is DecisionStatus.PLACED
    assert [p.vm_id for p in d.placements] == [f"vm-{unique}-{i}" for i in range(1, 5)]
    # even distribution with virtual consumption puts the four on four hosts
    assert len({p.host_id for p in d.placements}) == 4


async def test_a_batch_in_a_hard_positive_group_lands_on_one_host(client: SchedulerClient, unique: str) -> None:
    """The built-in policy runs VmAffinityGroups: the second VM sees the first one pending on its host."""

    cluster = f"together-{unique}"
    await make_cluster(client, cluster, 4)
    ids = [f"vm-{unique}-a", f"vm-{unique}-b"]
    group = AffinityGroup(group_id="together", vms=ids, vm_rule=AffinityRule(positive=True, enforcing=True))
    first, second = (small_vm(i.removeprefix("vm-"), affinity_groups=[group]) for i in ids)
    d = await client.schedule(cluster, first, batch=[second])
    assert d.status is DecisionStatus.PLACED, d.explanation.summary
    assert len({p.host_id for p in d.placements}) == 1
    # without the group, even distribution would have spread them
    apart = await client.schedule(cluster, small_vm(f"{unique}-c"), batch=[small_vm(f"{unique}-d")])
    assert len({p.host_id for p in apart.placements}) == 2


async def test_a_start_that_ends_elsewhere_or_fails_is_remembered_against_its_host(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    """The engine reports the VM somewhere else (or failed): the host it was placed on is remembered."""

    cluster = f"tried-{unique}"
    hosts = await make_cluster(client, cluster, 3)
    keys = Keys.from_settings(stack)
    redis = connect(stack)
    try:
        moved = await client.schedule(cluster, small_vm("moved"))
        elsewhere = next(h for h in hosts if h != moved.host_id)
        await client.report_vm(factories.vm_report(cluster, "vm-moved", elsewhere, mem_mb=1024, vcpus=1))
        failed = await client.schedule(cluster, small_vm("failed"))
        await client.report_vm(factories.vm_report(cluster, "vm-failed", None, VmStatus.FAILED, mem_mb=1024, vcpus=1))
        fine = await client.schedule(cluster, small_vm("fine"))
        await client.report_vm(factories.vm_report(cluster, "vm-fine", fine.host_id, mem_mb=1024, vcpus=1))
        for _ in range(50):  # the tracker applies reports asynchronously
            if await redis.exists(keys.tried(cluster, "vm-failed")):
                break
            await asyncio.sleep(0.05)
        assert moved.host_id is not None
        assert failed.host_id is not None
        assert await redis.smembers(keys.tried(cluster, "vm-moved")) == {moved.host_id.encode()}
        assert await redis.smembers(keys.tried(cluster, "vm-failed")) == {failed.host_id.encode()}
        assert await redis.smembers(keys.tried(cluster, "vm-fine")) == set()
    finally:
        await redis.aclose()


async def _follow(client: SchedulerClient, cluster: str, into: list[ScheduleDecision]) -> None:
    async for d in client.decisions(cluster):
        into.append(d)


async def test_each_stored_decision_is_published_exactly_once_however_often_it_is_requested(
    client: SchedulerClient, unique: str
) -> None:
    """1,000 concurrent sends of 20 request ids on two selectors: 20 decisions, 20 events."""
    clusters = [f"once-{unique}-{k}" for k in range(2)]
    for cluster in clusters:
        await make_cluster(client, cluster, 4)  # 12 VMs fit per cluster; 10 are asked
    requests = [
        ScheduleRequest(request_id=uuid.uuid4(), cluster_id=clusters[i % 2], vm=small_vm(f"{unique}-{i}"))
        for i in range(20)
    ]
    events: list[ScheduleDecision] = []
    followers = [asyncio.create_task(_follow(client, cluster, events)) for cluster in clusters]
    await asyncio.sleep(0.3)  # the subscriptions' queues are bound before anything is published
    sends = [requests[i % len(requests)] for i in range(1000)]
    random.Random(7).shuffle(sends)
    replies = await asyncio.gather(*(client.send(r, timeout=90) for r in sends))
    await asyncio.sleep(1.0)  # an event published late would still arrive
    for f in followers:
        f.cancel()
    await asyncio.gather(*followers, return_exceptions=True)

    answers: dict[uuid.UUID, set[str]] = defaultdict(set)
    for r, d in zip(sends, replies, strict=True):
        assert d.request_id == r.request_id
        answers[r.request_id].add(d.model_dump_json())
    assert all(len(a) == 1 for a in answers.values()), "one request id got different answers"
    assert {ScheduleDecision.model_validate_json(next(iter(a))).status for a in answers.values()} == {
        DecisionStatus.PLACED
    }
    per_id = Counter(e.request_id for e in events)
    assert per_id == {r.request_id: 1 for r in requests}, f"{len(events)} events for {len(requests)} decisions"


async def test_a_stored_decision_whose_event_was_never_published_is_published_by_the_replay(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    """A selector stored a decision and died before publishing it: the redelivered (or repeated)
    request publishes it, once."""
    cluster = f"unpub-{unique}"
    await make_cluster(client, cluster, 2)
    model = await client.schedule(cluster, small_vm(f"{unique}-model"))
    request = ScheduleRequest(request_id=uuid.uuid4(), cluster_id=cluster, vm=small_vm(f"{unique}-x"))
    stored = model.model_copy(update={"request_id": request.request_id, "vm_id": request.vm.vm_id})
    redis = connect(stack)
    decisions = DecisionStore(redis, stack)
    try:
        created, record = await decisions.put(stored, fingerprint=request_fingerprint(request))
        assert created
        assert not record.published

        events: list[ScheduleDecision] = []
        follower = asyncio.create_task(_follow(client, cluster, events))
        await asyncio.sleep(0.3)
        first = await client.send(request)
        second = await client.send(request)
        await asyncio.sleep(1.0)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)

        assert first == second == stored
        assert [e.request_id for e in events] == [request.request_id]
        assert events[0] == stored
        after = await decisions.record(request.cluster_id, request.request_id)
        assert after is not None
        assert after.published
    finally:
        await redis.aclose()


async def test_a_request_id_reused_for_a_different_request_is_refused(client: SchedulerClient, unique: str) -> None:
    cluster = f"reuse-{unique}"
    await make_cluster(client, cluster, 2)
    rid = uuid.uuid4()
    first = await client.schedule(cluster, small_vm(f"{unique}-1"), request_id=rid)
    assert first.status is DecisionStatus.PLACED

    events: list[ScheduleDecision] = []
    follower = asyncio.create_task(_follow(client, cluster, events))
    await asyncio.sleep(0.3)
    with pytest.raises(RemoteError) as info:
        await client.schedule(cluster, small_vm(f"{unique}-2"), request_id=rid)
    assert info.value.remote_code == "invalid_request"
    assert str(info.value) == (
        f"request_id: request id {rid} was already used for a different request "
        f"(cluster {cluster}, vm vm-{unique}-1); send a new request id"
    )
    with pytest.raises(RemoteError, match="already used for a different request"):
        await client.schedule(cluster, small_vm(f"{unique}-1", mem_mb=2048), request_id=rid)
    # The same request resent with a new deadline is the same request.
    again = await client.schedule(
        cluster, small_vm(f"{unique}-1"), request_id=rid, deadline=datetime.now(UTC) + timedelta(minutes=5)
    )
    await asyncio.sleep(0.5)
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    assert again == first
    assert events == []  # neither the refusals nor the replay published anything
