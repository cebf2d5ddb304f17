"""The group commit's one write on a real Redis: the same records as the pending write followed by
the decisions' write with the same token, in one round trip, and nothing at all when fenced out."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import pending_entry, schedule_decision
from vmsched.contracts import ScheduleDecision
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import DecisionStore, Keys, PendingStore
from vmsched.store.group_writes import GroupWrites

pytestmark = pytest.mark.integration

#: A fencing token as the lock issues them: a generation's stamp plus the acquisitions since.
TOKEN = 3 * 2**32 + 7


async def _state(redis: aioredis.Redis, keys: Keys, cluster: str, rids: list[uuid.UUID]) -> dict[str, Any]:
    """What the writes left: the pending hash, the pending version, each decision's record fields
    and the history's members."""
    records = []
    for rid in rids:
        raw = await redis.hgetall(keys.decision(cluster, rid))
        records.append({k: v for k, v in raw.items() if k != b"claimed"})
    history = await redis.zrange(keys.decision_history(cluster), 0, -1)
    return {
        "pending": await redis.hgetall(keys.pending(cluster)),
        "version": await redis.get(keys.pending_version(cluster)),
        "records": records,
        "history": sorted(history),
    }


@hyp_settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    placed=st.integers(0, 6),
    decisions=st.integers(1, 6),
    earlier=st.sets(st.integers(0, 5)),
    repeated=st.booleans(),
)
async def test_one_write_leaves_what_the_two_writes_leave(
    redis_client: aioredis.Redis, settings: Settings, placed: int, decisions: int, earlier: set[int], repeated: bool
) -> None:
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    two, one = Keys(f"{settings.redis_prefix}:gw2"), Keys(f"{settings.redis_prefix}:gw1")
    entries = [pending_entry(f"vm{i}", f"h{i % 3}", TOKEN, expires_at=2e9) for i in range(placed)]
    rids = [uuid.uuid4() for _ in range(decisions)]
    items: list[tuple[ScheduleDecision, str]] = [
        (schedule_decision(cluster, r, f"h{i}"), f"fp-{i}") for i, r in enumerate(rids)
    ]
    if repeated:  # the same request id twice in one group: stored once, the later one gets it back
        items.append((schedule_decision(cluster, rids[0], "h9"), "fp-again"))
    before = [
        (schedule_decision(cluster, rids[i], "before"), f"fp-{i}") for i in sorted(earlier & set(range(decisions)))
    ]
    for keys in (two, one):
        await redis_client.set(keys.fence(cluster), TOKEN)
        if before:  # decided before: kept
            await DecisionStore(redis_client, settings, keys=keys).put_many(before)
    two_store = DecisionStore(redis_client, settings, keys=two)
    version = await PendingStore(redis_client, settings, keys=two).record(cluster, entries, TOKEN)
    stored_two = await two_store.put_many(items, token=TOKEN, ttl_s=60)
    committed = await GroupWrites(
        redis_client, settings, DecisionStore(redis_client, settings, keys=one), keys=one
    ).commit(cluster, entries, items, token=TOKEN, ttl_s=60)
    results = [await _state(redis_client, k, cluster, rids) for k in (two, one)]
    assert committed.stored == stored_two
    assert committed.pending_version == version
    assert results[1] == results[0]


async def test_a_stale_token_writes_nothing(
    redis_client: aioredis.Redis, settings: Settings, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    await redis_client.set(keys.fence(cluster), TOKEN + 1)  # a newer holder took the lock
    writes = GroupWrites(redis_client, settings, DecisionStore(redis_client, settings, keys=keys), keys=keys)
    rid = uuid.uuid4()
    with pytest.raises(FencedOut, match="not the latest"):
        await writes.commit(
            cluster,
            [pending_entry("vm1", "h1", TOKEN)],
            [(schedule_decision(cluster, rid, "h1"), "fp")],
            token=TOKEN,
            ttl_s=60,
        )
    assert await redis_client.exists(keys.pending(cluster), keys.decision(cluster, rid)) == 0
    assert await redis_client.get(keys.pending_version(cluster)) is None


async def test_it_is_one_round_trip(counted: tuple[aioredis.Redis, list[str]], settings: Settings, keys: Keys) -> None:
    redis, commands = counted
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    await redis.set(keys.fence(cluster), TOKEN)
    writes = GroupWrites(redis, settings, DecisionStore(redis, settings, keys=keys), keys=keys)
    await writes.commit(
        cluster, [pending_entry("vm1", "h1", TOKEN)], [(schedule_decision(cluster), "fp")], token=TOKEN, ttl_s=60
    )
    commands.clear()
    entries = [pending_entry(f"vm{i}", "h1", TOKEN) for i in range(5)]
    committed = await writes.commit(
        cluster, entries, [(schedule_decision(cluster), f"fp{i}") for i in range(5)], token=TOKEN, ttl_s=60
    )
    assert len(commands) == 1, commands
    assert all(ours for ours, _ in committed.stored)


async def test_decisions_of_another_cluster_are_refused(
    redis_client: aioredis.Redis, settings: Settings, keys: Keys
) -> None:
    writes = GroupWrites(redis_client, settings, DecisionStore(redis_client, settings, keys=keys), keys=keys)
    with pytest.raises(ValueError, match="one cluster's decisions"):
        await writes.commit("a", [], [(schedule_decision("b"), "fp")], token=TOKEN, ttl_s=60)
