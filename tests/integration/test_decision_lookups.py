"""Arrival lookups of stored decisions, coalesced per cluster on a real Redis: the same answers as
one read per request, fewer reads under load, and a failed read heard by every request in it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from uuid import UUID

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import schedule_decision
from vmsched.lifecycle.lookups import Lookups
from vmsched.settings import Settings
from vmsched.store import DecisionStore, Keys
from vmsched.store.decisions import StoredDecision

pytestmark = pytest.mark.integration


class CountingStore(DecisionStore):
    """The real store, counting its reads and the ids each asked for."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, keys: Keys) -> None:
        super().__init__(redis, settings, keys=keys)
        self.reads: list[int] = []

    async def records_by_cluster(
        self, asks: Mapping[str, Sequence[UUID | str]]
    ) -> dict[str, list[StoredDecision | None]]:
        self.reads.append(sum(len(ids) for ids in asks.values()))
        return await super().records_by_cluster(asks)


@pytest.fixture
def store(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> CountingStore:
    return CountingStore(redis_client, settings, keys)


@hyp_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=st.lists(st.booleans(), min_size=1, max_size=40), clusters=st.integers(1, 3))
async def test_coalesced_lookups_answer_as_one_read_per_request(
    store: CountingStore, stored: list[bool], clusters: int
) -> None:
    names = [f"c-{uuid.uuid4().hex[:8]}" for _ in range(clusters)]
    asks = [(names[i % clusters], uuid.uuid4()) for i in range(len(stored))]
    for i, ((c, r), keep) in enumerate(zip(asks, stored, strict=True)):
        if keep:
            await store.put_many([(schedule_decision(c, r, f"h{i}"), f"fp-{i}")])
    one_by_one = [await store.record(c, r) for c, r in asks]
    store.reads.clear()
    lookups = Lookups(store)
    together = await asyncio.gather(*(lookups.record(c, r) for c, r in asks))
    assert together == one_by_one
    # Asked in one loop turn: one read, whatever the clusters.
    assert store.reads == [len(asks)]


async def test_asks_made_while_a_read_is_out_go_together_in_the_next(store: CountingStore, unique: str) -> None:
    cluster = f"c-{unique}"
    lookups = Lookups(store, max_ids=8)
    first = asyncio.create_task(lookups.record(cluster, uuid.uuid4()))
    await asyncio.sleep(0)  # the first read is on its way
    await asyncio.sleep(0)
    later = [asyncio.create_task(lookups.record(cluster, uuid.uuid4())) for _ in range(20)]
    assert await first is None
    assert await asyncio.gather(*later) == [None] * 20
    assert store.reads == [1, 8, 8, 4]


async def test_one_round_trip_reads_several_clusters_as_per_cluster_reads_do(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings, keys: Keys
) -> None:
    redis, commands = counted
    store = DecisionStore(redis, settings, keys=keys)
    asks: dict[str, list[UUID | str]] = {}
    for _ in range(4):
        cluster = f"c-{uuid.uuid4().hex[:8]}"
        rids = [uuid.uuid4() for _ in range(3)]
        await store.put_many([(schedule_decision(cluster, rids[0], "h1"), "fp")])
        asks[cluster] = list(rids)
    expected = {cluster: await store.records(cluster, ids) for cluster, ids in asks.items()}
    assert await store.records_by_cluster(asks) == expected
    commands.clear()
    assert await store.records_by_cluster(asks) == expected
    assert commands == ["EVALSHA"]  # one write: the pipeline's four reads leave together
    # A server that lost its scripts (restarted, failed over) is read per cluster, loading it again.
    await redis.script_flush()
    assert await store.records_by_cluster(asks) == expected
    assert await store.records_by_cluster({}) == {}


async def test_a_failed_read_fails_each_request_in_it_and_the_next_reads_again(
    settings: Settings, keys: Keys, redis_client: aioredis.Redis, unique: str
) -> None:
    cluster = f"c-{unique}"
    rid = uuid.uuid4()
    good = DecisionStore(redis_client, settings, keys=keys)
    await good.put_many([(schedule_decision(cluster, rid, "h1"), "fp")])
    # Nothing listens on port 1: a real connection refusal, as when Redis is away.
    away = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    try:
        lookups = Lookups(DecisionStore(away, settings, keys=keys))
        outcomes = await asyncio.gather(*(lookups.record(cluster, rid) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(o, aioredis.ConnectionError) for o in outcomes), outcomes
    finally:
        await away.aclose()
    lookups = Lookups(good)
    found = await lookups.record(cluster, rid)
    assert found is not None
    assert found.decision.host_id == "h1"
