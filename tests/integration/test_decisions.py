"""The decision store on a real Redis: put-if-absent, fencing, the publication mark, older records,
and the request fingerprint."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, schedule_decision
from tests.integration.conftest import superseded_lease
from vmsched.contracts import ScheduleRequest, VmSpec
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys
from vmsched.store.decisions import request_fingerprint

pytestmark = pytest.mark.integration


async def test_put_keeps_the_first_decision_and_marks_publication_once(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    store = DecisionStore(redis_client, settings)
    rid = uuid.uuid4()
    first = schedule_decision(f"c-{unique}", rid, "h1")
    created, record = await store.put(first, fingerprint="fp-1")
    assert created
    assert (record.decision, record.fingerprint, record.published) == (first, "fp-1", False)
    created, record = await store.put(schedule_decision(f"c-{unique}", rid, "h2"), fingerprint="fp-2")
    assert not created
    assert (record.decision, record.fingerprint, record.published) == (first, "fp-1", False)
    assert await store.mark_published(f"c-{unique}", rid)
    assert not await store.mark_published(f"c-{unique}", rid)
    again = await store.record(f"c-{unique}", rid)
    assert again is not None
    assert again.published
    assert await store.get(f"c-{unique}", rid) == first
    assert await redis_client.pttl(Keys(settings.redis_prefix).decision(f"c-{unique}", rid)) > 0


async def test_put_with_a_stale_token_is_fenced_out(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cluster = f"c-{unique}"
    locks = ClusterLock(redis_client, settings, recover=first_generation(redis_client, settings))
    store = DecisionStore(redis_client, settings)
    old, new = await superseded_lease(locks, cluster)
    rid = uuid.uuid4()
    with pytest.raises(FencedOut, match=f"token {old.token} is not the latest"):
        await store.put(schedule_decision(cluster, rid), fingerprint="fp", token=old.token)
    assert await store.record(f"c-{unique}", rid) is None
    created, _ = await store.put(schedule_decision(cluster, rid), fingerprint="fp", token=new.token)
    assert created
    await locks.release(new)


async def test_a_record_of_the_older_layout_reads_as_published_without_a_fingerprint(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    store = DecisionStore(redis_client, settings)
    rid = uuid.uuid4()
    old = schedule_decision(f"c-{unique}", rid)
    await redis_client.set(Keys(settings.redis_prefix).decision(f"c-{unique}", rid), old.model_dump_json(), px=60_000)
    record = await store.record(f"c-{unique}", rid)
    assert record is not None
    assert (record.decision, record.fingerprint, record.published) == (old, None, True)
    assert record.matches("anything")
    assert not await store.mark_published(f"c-{unique}", rid)
    created, kept = await store.put(schedule_decision(f"c-{unique}", rid, "h9"), fingerprint="fp")
    assert not created
    assert kept.decision == old


async def test_an_unreadable_record_does_not_block_storing(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    store = DecisionStore(redis_client, settings)
    rid = uuid.uuid4()
    await redis_client.set(Keys(settings.redis_prefix).decision(f"c-{unique}", rid), b"{not json", px=60_000)
    assert await store.record(f"c-{unique}", rid) is None
    decision = schedule_decision(f"c-{unique}", rid)
    created, record = await store.put(decision, fingerprint="fp")
    assert created
    assert record.decision == decision


def test_the_fingerprint_ignores_the_deadline_and_sees_everything_else() -> None:
    rid = uuid.uuid4()
    vm = VmSpec(vm_id="vm-1", mem_mb=1024, vcpus=1)
    base = ScheduleRequest(request_id=rid, cluster_id="c1", vm=vm)
    fp = request_fingerprint(base)
    later = base.model_copy(update={"deadline": datetime.now(UTC) + timedelta(minutes=1)})
    assert request_fingerprint(later) == fp
    assert request_fingerprint(base.model_copy(update={"request_id": uuid.uuid4()})) == fp
    assert request_fingerprint(base.model_copy(update={"cluster_id": "c2"})) != fp
    assert request_fingerprint(base.model_copy(update={"vm": vm.model_copy(update={"mem_mb": 2048})})) != fp
    assert request_fingerprint(base.model_copy(update={"blacklist": ["h1"]})) != fp
