"""The request lifecycle (vmsched.lifecycle) on the memory bus and a real Redis, without a selector:
its decisions, its one fenced commit, replays and decisions made meanwhile, for both ways of placing
(a `place` call to a filter-worker, or filter and weigh calls per VM). The tracker, a filter-worker
and a weigher run in this process; the lifecycle is built here on a runtime of its own."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

import pytest

from tests import factories
from tests.integration.conftest import Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import DecisionStatus, Explanation, Placement, ScheduleDecision, ScheduleRequest, VmSpec
from vmsched.db import migrate
from vmsched.errors import FencedOut, InvalidRequest
from vmsched.lifecycle import Lifecycle, Stages, StageTimes, Stored, Turn, Verdict, Wait
from vmsched.lifecycle.decisions import unplaceable
from vmsched.scheduling.placement import pending_entry
from vmsched.scheduling.policy import DEFAULT_POLICY, Policy
from vmsched.settings import Settings
from vmsched.store.decisions import StoredDecision, request_fingerprint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.parametrize("bus_kind", ["memory"], indirect=True, scope="module"),
]

#: Three 1024+64 MB VMs fit on a host (no reserved memory, overcommit 100%), a fourth does not.
make_cluster = partial(factories.make_cluster, cpu_cores=8, physical_mem_mb=4096, mem_free_mb=4096, reserved_mem_mb=0)


class Policies:
    async def for_cluster(self, cluster_id: str) -> Policy:
        return DEFAULT_POLICY


@dataclass
class Recorder(StageTimes):
    """The stage-timing hook, keeping what it heard."""

    decided_: list[tuple[ScheduleDecision, Stages]] = field(default_factory=list)
    lock_waits: int = 0

    def lock_waited(self, seconds: float) -> None:
        self.lock_waits += 1

    def decided(self, decision: ScheduleDecision, stages: Stages, seconds: float) -> None:
        self.decided_.append((decision, dict(stages)))

    def heard(self, request_id: uuid.UUID) -> list[Stages]:
        return [stages for d, stages in self.decided_ if d.request_id == request_id]


@dataclass
class Life:
    cfg: Settings
    buses: Buses
    lifecycle: Lifecycle
    timer: Recorder


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", bus=buses):
        yield cfg


@pytest.fixture(scope="module", params=[True, False], ids=["place", "per-vm"])
async def life(request: pytest.FixtureRequest, stack: Settings, buses: Buses) -> AsyncIterator[Life]:
    cfg = stack.model_copy(update={"place_in_worker": request.param})
    rt = await buses.runtime(cfg, "lifecycle-test")
    timer = Recorder()
    lifecycle = Lifecycle.open(
        rt.bus, rt.redis, cfg, state=rt.state, policies=Policies(), timer=timer, recover=rt.recovery
    )
    yield Life(cfg, buses, lifecycle, timer)
    await rt.close()


def request(cluster: str, vm_id: str, mem_mb: int = 1024) -> ScheduleRequest:
    return ScheduleRequest(
        request_id=uuid.uuid4(), cluster_id=cluster, vm=factories.vm_spec(vm_id, mem_mb=mem_mb, vcpus=1)
    )


async def follow(client: SchedulerClient, cluster: str) -> tuple[list[ScheduleDecision], asyncio.Task[None]]:
    """Every decision event of `cluster` from now on, into the list."""
    seen: list[ScheduleDecision] = []

    async def run() -> None:
        async for d in client.decisions(cluster):
            seen.append(d)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.2)  # subscribed before anything is published
    return seen, task


async def events_of(seen: list[ScheduleDecision], request_id: uuid.UUID, n: int = 1) -> list[ScheduleDecision]:
    """The events of `request_id` once there are `n` (after a moment, to catch an extra one)."""
    for _ in range(100):
        if sum(d.request_id == request_id for d in seen) >= n:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    return [d for d in seen if d.request_id == request_id]


async def marked_record(lc: Lifecycle, req: ScheduleRequest) -> StoredDecision:
    """The request's stored record once its group has left the lock: the answer goes out before
    the event's mark, which is written before the lock is released."""
    async with lc.locks.hold(req.cluster_id):
        record = await lc.decisions.record(req.cluster_id, req.request_id)
    assert record is not None
    return record


async def test_a_placed_request_is_recorded_stored_published_and_replayed(life: Life, unique: str) -> None:
    cluster = f"lc-{unique}"
    lc = life.lifecycle
    async with life.buses.client(life.cfg) as client:
        hosts = await make_cluster(client, cluster, 3)
        seen, follower = await follow(client, cluster)
        req = request(cluster, f"vm-{unique}")
        d = await lc.decide(req)
        assert d.status is DecisionStatus.PLACED
        assert d.host_id in hosts
        assert d.fencing_token > 0
        pending = await lc.pending.read(cluster)
        assert [(p.vm_id, p.host_id, p.mem_mb, p.request_id, p.fencing_token) for p in pending] == [
            (f"vm-{unique}", d.host_id, 1024 + 64, req.request_id, d.fencing_token)
        ]
        record = await marked_record(lc, req)
        assert (record.decision, record.published) == (d, True)
        assert await events_of(seen, req.request_id) == [d]
        [stages] = life.timer.heard(req.request_id)
        assert {"lock_wait", "read_state", "record_pending", "publish"} <= set(stages)
        assert ({"place"} if life.cfg.place_in_worker else {"filter", "weigh"}) <= set(stages)

        # The same request again: the stored decision, nothing placed, no event, no new decision.
        assert await lc.decide(req.model_copy(update={"deadline": None})) == d
        assert len(await lc.pending.read(cluster)) == 1
        assert await events_of(seen, req.request_id) == [d]
        assert len(life.timer.heard(req.request_id)) == 1
        # A different request under the same id is refused.
        other = req.model_copy(update={"vm": factories.vm_spec(f"other-{unique}", mem_mb=1024, vcpus=1)})
        with pytest.raises(InvalidRequest, match="already used for a different request"):
            await lc.decide(other)
        follower.cancel()


async def test_an_unplaceable_request_is_stored_and_published_holding_nothing(life: Life, unique: str) -> None:
    cluster = f"lc-{unique}"
    lc = life.lifecycle
    async with life.buses.client(life.cfg) as client:
        await make_cluster(client, cluster, 2)
        seen, follower = await follow(client, cluster)
        req = request(cluster, f"huge-{unique}", mem_mb=64_000)
        d = await lc.decide(req)
        assert d.status is DecisionStatus.UNPLACEABLE
        assert "Memory" in d.explanation.summary
        assert await lc.pending.read(cluster) == []
        record = await marked_record(lc, req)
        assert (record.decision, record.published) == (d, True)
        assert await events_of(seen, req.request_id) == [d]
        assert await lc.decide(req) == d
        follower.cancel()


async def test_a_group_commits_placed_ones_together_and_the_one_left_waits_then_retries(
    life: Life, unique: str
) -> None:
    cluster = f"lc-{unique}"
    lc = life.lifecycle
    async with life.buses.client(life.cfg) as client:
        await make_cluster(client, cluster, 1)
        reqs = [request(cluster, f"vm-{unique}-{i}") for i in range(4)]
        async with lc.locks.hold(cluster):
            tasks = [asyncio.create_task(lc.decide(r)) for r in reqs]
            await asyncio.sleep(0.3)  # all four queued behind the lock: one group
        decisions = await asyncio.gather(*tasks)
    placed = [d for d in decisions if d.status is DecisionStatus.PLACED]
    [left] = [d for d in decisions if d.status is not DecisionStatus.PLACED]
    assert len(placed) == 3
    assert len({d.fencing_token for d in placed}) == 1  # one lock acquisition, one commit
    # Its group's VMs were pending on the only host: it waited for pending to change, then retried.
    assert left.status is DecisionStatus.UNPLACEABLE
    assert left.retried
    assert sorted(p.vm_id for p in await lc.pending.read(cluster)) == sorted(d.vm_id for d in placed)


async def test_a_decision_stored_meanwhile_is_the_answer_and_its_event_is_published_once(
    life: Life, unique: str
) -> None:
    cluster = f"lc-{unique}"
    lc = life.lifecycle
    async with life.buses.client(life.cfg) as client:
        await make_cluster(client, cluster, 2)
        seen, follower = await follow(client, cluster)
        req = request(cluster, f"vm-{unique}")
        explanation = Explanation(summary="decided elsewhere", candidates=2)
        theirs = unplaceable(req, time.perf_counter(), explanation, policy=DEFAULT_POLICY, version=1, retried=False)
        async with lc.locks.hold(cluster) as lease:
            task = asyncio.create_task(lc.decide(req))
            await asyncio.sleep(0.3)  # queued behind the lock
            # Another selector stores it and dies before publishing.
            created, _ = await lc.decisions.put(theirs, fingerprint=request_fingerprint(req), token=lease.token)
            assert created
        assert await task == theirs
        record = await lc.decisions.record(req.cluster_id, req.request_id)
        assert record is not None
        assert record.published
        assert await events_of(seen, req.request_id) == [theirs]
        assert life.timer.heard(req.request_id) == []  # not a decision of this handling
        follower.cancel()


def turn(cluster: str, vm_id: str) -> Turn:
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id=cluster, vm=factories.vm_spec(vm_id, mem_mb=512, vcpus=1))
    return Turn(req, DEFAULT_POLICY, request_fingerprint(req), time.perf_counter(), False, True, {})


def placed_on(t: Turn, host_id: str, token: int) -> Verdict:
    vm: VmSpec = t.req.vm
    entry = pending_entry(vm, host_id, request_id=t.req.request_id, fencing_token=token, expires_at=time.time() + 30)
    explanation = Explanation(summary="1/1 hosts available", candidates=1)
    return Verdict(t, [Placement(vm_id=vm.vm_id, host_id=host_id)], [entry], explanation, 1)


def unplaceable_verdict(t: Turn) -> Verdict:
    return Verdict(t, [], [], Explanation(summary="0/1 hosts available", candidates=1), 1)


async def test_the_commit_refuses_a_stale_token_for_placed_and_unplaceable_outcomes(life: Life, unique: str) -> None:
    cluster = f"fence-{unique}"
    lc = life.lifecycle
    async with lc.locks.hold(cluster) as old:
        pass
    async with lc.locks.hold(cluster) as new:
        placed, refused, waiting = turn(cluster, "p"), turn(cluster, "u"), turn(cluster, "w")
        with pytest.raises(FencedOut):
            await lc.commit(cluster, old.token, [placed_on(placed, "h1", old.token)])
        with pytest.raises(FencedOut):
            await lc.commit(cluster, old.token, [unplaceable_verdict(refused), Wait(waiting, 4)])
        # Every request to store hears why; a waiting one had nothing to write.
        assert isinstance(placed.done.exception(), FencedOut)
        assert isinstance(refused.done.exception(), FencedOut)
        assert waiting.done.result() == 4
        # Nothing written.
        assert await lc.pending.read(cluster) == []
        assert await lc.pending.version(cluster) == 0
        assert await lc.decisions.records(cluster, [placed.req.request_id, refused.req.request_id]) == [None, None]

        # The latest holder commits placed and unplaceable outcomes together.
        placed, refused = turn(cluster, "p"), turn(cluster, "u")
        verdict = placed_on(placed, "h1", new.token)
        await lc.commit(cluster, new.token, [verdict, unplaceable_verdict(refused)])
    assert await lc.pending.read(cluster) == verdict.pending
    got = [placed.done.result(), refused.done.result()]
    assert all(isinstance(r, Stored) and r.ours for r in got)
    stored = [r.record.decision for r in got if isinstance(r, Stored)]
    assert [(d.status, d.host_id, d.fencing_token) for d in stored] == [
        (DecisionStatus.PLACED, "h1", new.token),
        (DecisionStatus.UNPLACEABLE, None, 0),
    ]
    records = await lc.decisions.records(cluster, [placed.req.request_id, refused.req.request_id])
    assert [r.published if r is not None else None for r in records] == [True, True]


@contextlib.asynccontextmanager
async def watching(life: Life, unique: str) -> AsyncIterator[tuple[Turn, list[ScheduleDecision]]]:
    """A turn on a cluster of two hosts of its own, and every decision event of the cluster."""
    cluster = f"lc-{unique}"
    async with life.buses.client(life.cfg) as client:
        await make_cluster(client, cluster, 2)
        seen, follower = await follow(client, cluster)
        try:
            yield turn(cluster, f"vm-{unique}"), seen
        finally:
            follower.cancel()


async def stored_before(lc: Lifecycle, t: Turn) -> ScheduleDecision:
    """An unplaceable decision for the turn's request, stored (not marked published) as if by
    another selector."""
    d = unplaceable(
        t.req,
        time.perf_counter(),
        Explanation(summary="stored", candidates=2),
        policy=DEFAULT_POLICY,
        version=1,
        retried=False,
    )
    await lc.decisions.put(d, fingerprint=t.fingerprint)
    return d


async def test_replays_and_recovery_never_publish_again_a_decision_marked_published(life: Life, unique: str) -> None:
    lc = life.lifecycle
    async with watching(life, unique) as (t, seen):
        first = await stored_before(lc, t)
        assert await lc.decisions.mark_published(t.req.cluster_id, t.req.request_id)
        # Every way a replay or a recovery meets the decision: the same request again (side by
        # side), the owed-event check of a replay, a commit finding it stored, a claim.
        assert list(await asyncio.gather(lc.decide(t.req), lc.decide(t.req))) == [first, first]
        await lc.events.publish_unconfirmed(t.req.cluster_id, t.req.request_id, {})
        async with lc.locks.hold(t.req.cluster_id) as lease:
            await lc.commit(t.req.cluster_id, lease.token, [unplaceable_verdict(t)])
        result = t.done.result()
        assert isinstance(result, Stored)
        assert (result.ours, result.record.decision) == (False, first)
        assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id], 10.0) == [False]
        assert await events_of(seen, t.req.request_id, n=1) == []


async def test_an_unmarked_decision_found_by_concurrent_replays_is_published_once(life: Life, unique: str) -> None:
    lc = life.lifecycle
    async with watching(life, unique) as (t, seen):
        # Its storer died before publishing: replays with and without the lock find it unmarked.
        theirs = await stored_before(lc, t)
        await asyncio.gather(
            *(lc.events.publish_unconfirmed(t.req.cluster_id, t.req.request_id, {}) for _ in range(4)), lc.decide(t.req)
        )
        assert await events_of(seen, t.req.request_id, n=2) == [theirs]
        record = await lc.decisions.record(t.req.cluster_id, t.req.request_id)
        assert record is not None
        assert record.published


async def test_a_claim_on_republishing_is_taken_once_until_its_lease_passes(life: Life, unique: str) -> None:
    lc = life.lifecycle
    t = turn(f"lc-{unique}", f"vm-{unique}")
    await stored_before(lc, t)
    absent = uuid.uuid4()
    assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id, absent], 0.3) == [True, False]
    assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id], 0.3) == [False]
    await asyncio.sleep(0.4)  # the claimant died: the next replay may claim it
    assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id], 0.3) == [True]
    await lc.decisions.mark_published(t.req.cluster_id, t.req.request_id)
    await asyncio.sleep(0.4)
    assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id], 0.3) == [False]


async def test_a_replay_finding_a_dead_replays_claim_publishes_the_event_once_the_claim_lapses(
    life: Life, unique: str
) -> None:
    lc = life.lifecycle
    async with watching(life, unique) as (t, seen):
        theirs = await stored_before(lc, t)
        # A replay claimed it and died before publishing: the engine's next try must not leave the
        # event unpublished.
        assert await lc.decisions.claim_republish(t.req.cluster_id, [t.req.request_id], 0.3) == [True]
        assert await lc.decide(t.req) == theirs
        assert await events_of(seen, t.req.request_id) == [theirs]
        record = await lc.decisions.record(t.req.cluster_id, t.req.request_id)
        assert record is not None
        assert record.published
