"""Each cluster's decision history on a real Redis (`vmsched decisions`): written by the scripts that
store decisions, newest first, capped, only what was stored, read in one round trip."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from vmsched.contracts import DecisionStatus, Explanation, ScheduleDecision
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _decision(cluster: str, seconds: float, host: str = "h1") -> ScheduleDecision:
    return ScheduleDecision(
        request_id=uuid.uuid4(),
        cluster_id=cluster,
        vm_id=f"vm-{int(seconds)}",
        status=DecisionStatus.PLACED,
        host_id=host,
        explanation=Explanation(summary="1/1 hosts available", candidates=1),
        decided_at=T0 + timedelta(seconds=seconds),
        elapsed_ms=1.0,
    )


@pytest.fixture
def keys(settings: Settings, unique: str) -> Keys:
    return Keys(f"{settings.redis_prefix}:history-{unique}")


@pytest.fixture
def store(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> DecisionStore:
    return DecisionStore(redis_client, settings.model_copy(update={"decision_history_max": 5}), keys=keys)


async def test_both_ways_of_storing_add_to_the_history_newest_first(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    one = _decision(cluster, 1)
    await store.put(one, fingerprint="fp")
    group = [_decision(cluster, s) for s in (3, 2)]
    await store.put_many([(d, "fp") for d in group])
    assert await store.recent(cluster, 10) == [group[0], group[1], one]
    assert await store.recent(cluster, 2) == [group[0], group[1]]
    assert await store.recent(cluster, 0) == []
    assert await store.recent(f"other-{unique}", 10) == []


async def test_a_request_id_kept_from_before_is_not_listed_twice(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    first = _decision(cluster, 1)
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
    decisions = [_decision(cluster, s) for s in range(8)]
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
    kept, gone = _decision(cluster, 1), _decision(cluster, 2)
    await store.put_many([(kept, "fp"), (gone, "fp")])
    await redis_client.delete(keys.decision(gone.request_id))  # as its TTL would
    assert await store.recent(cluster, 10) == [kept]
    assert await redis_client.zrange(keys.decision_history(cluster), 0, -1) == [str(kept.request_id).encode()]


async def test_a_fenced_out_write_adds_nothing(
    redis_client: aioredis.Redis, settings: Settings, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    locks = ClusterLock(redis_client, settings, keys=keys)
    stale = await locks.acquire(cluster)
    await locks.release(stale)
    current = await locks.acquire(cluster)
    try:
        with pytest.raises(FencedOut):
            await store.put(_decision(cluster, 1), fingerprint="fp", token=stale.token)
        with pytest.raises(FencedOut):
            await store.put_many([(_decision(cluster, 2), "fp")], token=stale.token)
        assert await store.recent(cluster, 10) == []
    finally:
        await locks.release(current)


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[tuple[aioredis.Redis, list[str]]]:
    """A client that notes the command of every request it sends: one entry per round trip."""
    sent: list[str] = []

    class Counted(aioredis.Connection):
        async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
            raw = (
                command.encode()
                if isinstance(command, str)
                else b"".join([command] if isinstance(command, bytes) else command)
            )
            sent.append(raw.split(b"\r\n", 3)[2].decode().upper())
            await super().send_packed_command(command, check_health)

    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False, connection_class=Counted)
    await client.ping()
    yield client, sent
    await client.aclose()


async def test_storing_and_reading_cost_no_extra_round_trip(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings, keys: Keys, unique: str
) -> None:
    client, sent = counted
    store = DecisionStore(client, settings, keys=keys)
    cluster = f"c-{unique}"
    # Load the scripts first (a script Redis has not seen costs one more call once).
    await store.put(_decision(cluster, 0), fingerprint="fp")
    await store.put_many([(_decision(cluster, 0.5), "fp")])
    await store.recent(cluster, 1)
    sent.clear()
    await store.put(_decision(cluster, 1), fingerprint="fp")
    await store.put_many([(_decision(cluster, s), "fp") for s in (2, 3, 4)])
    assert sent == ["EVALSHA", "EVALSHA"]
    sent.clear()
    assert len(await store.recent(cluster, 10)) == 6
    assert sent == ["EVALSHA"]
