"""Each cluster's decision history on a real Redis (`vmsched decisions`): written by the scripts that
store decisions, newest first, capped, only what was stored, read in one round trip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from tests.factories import first_generation, schedule_decision
from tests.integration.conftest import superseded_lease
from vmsched.contracts import ScheduleDecision
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def decided(cluster: str, seconds: float) -> ScheduleDecision:
    """A decision made `seconds` after T0 (the history orders by decision time)."""
    return schedule_decision(cluster, decided_at=T0 + timedelta(seconds=seconds))


@pytest.fixture
def store(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> DecisionStore:
    return DecisionStore(redis_client, settings.model_copy(update={"decision_history_max": 5}), keys=keys)


async def test_both_ways_of_storing_add_to_the_history_newest_first(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    one = decided(cluster, 1)
    await store.put(one, fingerprint="fp")
    group = [decided(cluster, s) for s in (3, 2)]
    await store.put_many([(d, "fp") for d in group])
    assert await store.recent(cluster, 10) == [group[0], group[1], one]
    assert await store.recent(cluster, 2) == [group[0], group[1]]
    assert await store.recent(cluster, 0) == []
    assert await store.recent(f"other-{unique}", 10) == []


async def test_a_request_id_kept_from_before_is_not_listed_twice(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    first = decided(cluster, 1)
    await store.put(first, fingerprint="fp")
    replay = first.model_copy(update={"decided_at": T0 + timedelta(seconds=9), "host_id": "h2"})
    created, _ = await store.put(replay, fingerprint="fp")
    assert not created
    results = await store.put_many([(replay, "fp")])
    assert [created for created, _ in results] == [False]
    assert await store.recent(cluster, 10) == [first]


async def test_the_history_keeps_the_newest_up_to_its_cap(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    decisions = [decided(cluster, s) for s in range(8)]
    for d in decisions[:4]:
        await store.put(d, fingerprint="fp")
    await store.put_many([(d, "fp") for d in decisions[4:]])
    assert await store.recent(cluster, 100) == decisions[::-1][:5]
    assert await redis_client.zcard(keys.decision_history(cluster)) == 5
    assert await redis_client.pttl(keys.decision_history(cluster)) > 0


async def test_expired_decisions_leave_the_history_when_read(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    kept, gone = decided(cluster, 1), decided(cluster, 2)
    await store.put_many([(kept, "fp"), (gone, "fp")])
    await redis_client.delete(keys.decision(cluster, gone.request_id))  # as its TTL would
    assert await store.recent(cluster, 10) == [kept]
    assert await redis_client.zrange(keys.decision_history(cluster), 0, -1) == [str(kept.request_id).encode()]


async def test_a_fenced_out_write_adds_nothing(
    redis_client: aioredis.Redis, settings: Settings, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    locks = ClusterLock(redis_client, settings, keys=keys, recover=first_generation(redis_client, settings, keys=keys))
    stale, current = await superseded_lease(locks, cluster)
    try:
        with pytest.raises(FencedOut):
            await store.put(decided(cluster, 1), fingerprint="fp", token=stale.token)
        with pytest.raises(FencedOut):
            await store.put_many([(decided(cluster, 2), "fp")], token=stale.token)
        assert await store.recent(cluster, 10) == []
    finally:
        await locks.release(current)


async def test_storing_and_reading_cost_no_extra_round_trip(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings, keys: Keys, unique: str
) -> None:
    client, sent = counted
    store = DecisionStore(client, settings, keys=keys)
    cluster = f"c-{unique}"
    # Load the scripts first (a script Redis has not seen costs one more call once).
    await store.put(decided(cluster, 0), fingerprint="fp")
    await store.put_many([(decided(cluster, 0.5), "fp")])
    await store.recent(cluster, 1)
    sent.clear()
    await store.put(decided(cluster, 1), fingerprint="fp")
    await store.put_many([(decided(cluster, s), "fp") for s in (2, 3, 4)])
    assert sent == ["EVALSHA", "EVALSHA"]
    sent.clear()
    assert len(await store.recent(cluster, 10)) == 6
    assert sent == ["EVALSHA"]
