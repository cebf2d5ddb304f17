"""The decision store's batched operations on a real Redis: order, put-if-absent over a mix of new
and stored request ids, fencing of the whole batch, older and unreadable records, one round trip
per call, and the same answers as the one-item methods."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import first_generation, schedule_decision
from tests.integration.conftest import superseded_lease
from vmsched.contracts import ScheduleDecision
from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys
from vmsched.store.decisions import StoredDecision

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_client: aioredis.Redis, settings: Settings, keys: Keys) -> DecisionStore:
    return DecisionStore(redis_client, settings, keys=keys)


def _summary(record: StoredDecision | None) -> tuple[str | None, str | None, bool] | None:
    """What a test compares of a record: its host, fingerprint and publication mark."""
    if record is None:
        return None
    return record.decision.host_id, record.fingerprint, record.published


async def test_results_follow_the_order_of_the_request(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    rids = [uuid.uuid4() for _ in range(12)]
    decisions = [schedule_decision(cluster, r, f"h{i}") for i, r in enumerate(rids)]
    stored = await store.put_many([(d, f"fp-{i}") for i, d in enumerate(decisions)])
    assert stored == [(True, StoredDecision(d, f"fp-{i}", False)) for i, d in enumerate(decisions)]
    shuffled = [*rids[5:], *rids[:5]][::-1]
    by_id = {r: d for r, d in zip(rids, decisions, strict=True)}
    records = await store.records(cluster, shuffled)
    assert [r.decision if r else None for r in records] == [by_id[r] for r in shuffled]
    assert await store.records(cluster, [str(r) for r in shuffled]) == records  # ids as text read the same
    assert await store.records(cluster, []) == []
    assert await store.put_many([]) == []
    assert await store.mark_published_many(cluster, []) == []


async def test_put_many_stores_the_new_ones_and_returns_the_earlier_records(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    rids = [uuid.uuid4() for _ in range(6)]
    earlier = {r: schedule_decision(cluster, r, "old") for r in rids[::2]}
    for d in earlier.values():
        assert (await store.put(d, fingerprint="fp-old"))[0]
    await store.mark_published(cluster, rids[2])
    ours = [schedule_decision(cluster, r, "new") for r in rids]
    results = await store.put_many([(d, "fp-new") for d in ours], ttl_s=60)
    assert [created for created, _ in results] == [False, True, False, True, False, True]
    assert [_summary(rec) for _, rec in results] == [
        ("old", "fp-old", False),
        ("new", "fp-new", False),
        ("old", "fp-old", True),
        ("new", "fp-new", False),
        ("old", "fp-old", False),
        ("new", "fp-new", False),
    ]
    assert results[0][1].decision == earlier[rids[0]]
    assert [_summary(rec) for rec in await store.records(cluster, rids)] == [_summary(rec) for _, rec in results]
    for r in rids[1::2]:
        assert 0 < await redis_client.pttl(keys.decision(cluster, r)) <= 60_000


async def test_a_request_id_twice_in_one_batch_is_stored_once(store: DecisionStore, unique: str) -> None:
    cluster = f"c-{unique}"
    rid = uuid.uuid4()
    first, second = schedule_decision(f"c-{unique}", rid, "h1"), schedule_decision(f"c-{unique}", rid, "h2")
    results = await store.put_many([(first, "fp-1"), (second, "fp-2")])
    record = StoredDecision(first, "fp-1", False)
    assert results == [(True, record), (False, record)]
    assert await store.mark_published_many(cluster, [rid, rid]) == [True, False]


async def test_a_stale_token_writes_nothing_at_all(
    redis_client: aioredis.Redis, settings: Settings, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    locks = ClusterLock(redis_client, settings, keys=keys, recover=first_generation(redis_client, settings, keys=keys))
    old, new = await superseded_lease(locks, cluster)
    try:
        stored = schedule_decision(cluster, uuid.uuid4(), "old")
        assert (await store.put(stored, fingerprint="fp-old", token=new.token))[0]
        fresh = [uuid.uuid4() for _ in range(5)]
        batch = [(schedule_decision(cluster, r, "new"), "fp-new") for r in [*fresh, stored.request_id]]
        with pytest.raises(
            FencedOut, match=f"token {old.token} is not the latest of cluster {cluster} \\({new.token}\\)"
        ):
            await store.put_many(batch, token=old.token)
        for r in fresh:
            assert not await redis_client.exists(keys.decision(cluster, r))
        assert await store.records(cluster, [stored.request_id]) == [StoredDecision(stored, "fp-old", False)]
        # Fenced even where every request id has a decision already: a stale selector learns it lost the lock.
        with pytest.raises(FencedOut):
            await store.put_many([(stored, "fp-old")], token=old.token)
        results = await store.put_many(batch, token=new.token)
        assert [created for created, _ in results] == [True] * 5 + [False]
    finally:
        await locks.release(new)


async def test_decisions_of_two_clusters_are_refused_before_anything_is_written(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(ValueError, match=f"one cluster, got a-{unique} and b-{unique}"):
        await store.put_many([(schedule_decision(f"a-{unique}", a), "fp"), (schedule_decision(f"b-{unique}", b), "fp")])
    assert await redis_client.exists(keys.decision(f"a-{unique}", a), keys.decision(f"b-{unique}", b)) == 0


async def test_one_request_id_alone_is_not_taken_for_a_list_of_ids(store: DecisionStore) -> None:
    cluster = "c1"
    with pytest.raises(TypeError, match="not one request id"):
        await store.records(cluster, str(uuid.uuid4()))
    with pytest.raises(TypeError, match="not one request id"):
        await store.mark_published_many(cluster, str(uuid.uuid4()))


async def _seed_odd_records(redis_client: aioredis.Redis, keys: Keys, cluster: str) -> dict[str, uuid.UUID]:
    """One request id per kind of record `records` must cope with, stored raw."""
    rids = {kind: uuid.uuid4() for kind in ("missing", "older", "garbage", "garbage hash", "list", "good")}
    older = schedule_decision(cluster, rids["older"], "older")
    await redis_client.set(keys.decision(cluster, rids["older"]), older.model_dump_json(), px=60_000)
    await redis_client.set(keys.decision(cluster, rids["garbage"]), b"{not json", px=60_000)
    await redis_client.hset(
        keys.decision(cluster, rids["garbage hash"]), mapping={"decision": b"\xff{", "published": "1"}
    )
    await redis_client.rpush(keys.decision(cluster, rids["list"]), b"x")
    good = schedule_decision(cluster, rids["good"], "good")
    await redis_client.hset(
        keys.decision(cluster, rids["good"]),
        mapping={"decision": good.model_dump_json(), "fingerprint": "fp", "published": "1"},
    )
    return rids


async def test_records_reads_older_and_unreadable_records_like_record(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    rids = await _seed_odd_records(redis_client, keys, cluster)
    records = await store.records(cluster, list(rids.values()))
    assert dict(zip(rids, map(_summary, records), strict=True)) == {
        "missing": None,
        "older": ("older", None, True),
        "garbage": None,
        "garbage hash": None,
        "list": None,
        "good": ("good", "fp", True),
    }
    assert records == [await store.record(cluster, r) for r in rids.values()]


async def test_put_many_over_older_and_unreadable_records(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    """An older record is kept (and answered); an unreadable one, or a key of another type, is
    replaced by ours, as `put` does."""
    cluster = f"c-{unique}"
    rids = await _seed_odd_records(redis_client, keys, cluster)
    results = await store.put_many([(schedule_decision(cluster, r, "ours"), "fp-ours") for r in rids.values()])
    assert dict(zip(rids, ((c, _summary(rec)) for c, rec in results), strict=True)) == {
        "missing": (True, ("ours", "fp-ours", False)),
        "older": (False, ("older", None, True)),
        "garbage": (True, ("ours", "fp-ours", False)),
        "garbage hash": (True, ("ours", "fp-ours", False)),
        "list": (True, ("ours", "fp-ours", False)),
        "good": (False, ("good", "fp", True)),
    }
    assert [_summary(rec) for rec in await store.records(cluster, list(rids.values()))] == [
        _summary(r) for _, r in results
    ]
    assert await redis_client.pttl(keys.decision(cluster, rids["garbage"])) > 0


async def test_an_unreadable_record_is_replaced_only_if_still_the_one_read(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between reading an unreadable record and replacing it, another writer stores a good one: that
    one is kept and answered, not overwritten."""
    cluster = f"c-{unique}"
    rid = uuid.uuid4()
    await redis_client.set(keys.decision(cluster, rid), b"{not json", px=60_000)
    theirs = schedule_decision(cluster, rid, "theirs")
    script = store._put_many
    calls = 0

    async def meanwhile(**kw: Any) -> Any:
        nonlocal calls
        calls += 1
        reply = await script(**kw)
        if calls == 1:
            await redis_client.delete(keys.decision(cluster, rid))
            await redis_client.hset(
                keys.decision(cluster, rid), mapping={"decision": theirs.model_dump_json(), "fingerprint": "fp-theirs"}
            )
        return reply

    monkeypatch.setattr(store, "_put_many", meanwhile)
    results = await store.put_many([(schedule_decision(cluster, rid, "ours"), "fp-ours")])
    assert calls == 2
    assert results == [(False, StoredDecision(theirs, "fp-theirs", False))]
    assert await store.record(cluster, rid) == StoredDecision(theirs, "fp-theirs", False)


async def test_mark_published_many_marks_once(
    redis_client: aioredis.Redis, store: DecisionStore, keys: Keys, unique: str
) -> None:
    cluster = f"c-{unique}"
    rids = [uuid.uuid4() for _ in range(4)]
    await store.put_many([(schedule_decision(cluster, r), "fp") for r in rids[:3]])
    older = uuid.uuid4()
    await redis_client.set(
        keys.decision(cluster, older), schedule_decision(cluster, older).model_dump_json(), px=60_000
    )
    ids = [*rids, older]  # the last two: no record, and an older one (published by definition)
    assert await store.mark_published_many(cluster, ids) == [True, True, True, False, False]
    assert await store.mark_published_many(cluster, ids) == [False] * 5
    assert [_summary(r) for r in await store.records(cluster, ids)] == [("h1", "fp", True)] * 3 + [
        None,
        ("h1", None, True),
    ]
    assert not await redis_client.exists(keys.decision(cluster, rids[3]))  # marking creates nothing


# ---------------------------------------------------------------------- round trips


async def test_each_batched_call_is_one_round_trip(
    counted: tuple[aioredis.Redis, list[str]], settings: Settings, keys: Keys, unique: str
) -> None:
    client, sent = counted
    store = DecisionStore(client, settings, keys=keys)
    cluster = f"c-{unique}"
    locks = ClusterLock(client, settings, keys=keys, recover=first_generation(client, settings, keys=keys))
    lease = await locks.acquire(cluster)
    # Load the scripts first (a script Redis has not seen costs a SCRIPT LOAD and a second EVALSHA once).
    warm = uuid.uuid4()
    await store.put_many([(schedule_decision(cluster, warm), "fp")], token=lease.token)
    await store.records(cluster, [warm])
    await store.mark_published_many(cluster, [warm])
    try:
        rids = [uuid.uuid4() for _ in range(10)]
        ours = [(schedule_decision(cluster, r), "fp") for r in rids]
        await store.put(ours[0][0], fingerprint="fp")  # one of the ten is stored already

        sent.clear()
        results = await store.put_many(ours, token=lease.token)
        assert sent == ["EVALSHA"]
        assert [created for created, _ in results] == [False] + [True] * 9

        sent.clear()
        assert all(await store.records(cluster, rids))
        assert sent == ["EVALSHA"]

        sent.clear()
        assert await store.mark_published_many(cluster, rids) == [True] * 10
        assert sent == ["EVALSHA"]

        # An unreadable record costs one more round trip (replacing it), not one per record.
        garbage = [uuid.uuid4() for _ in range(3)]
        for r in garbage:
            await client.set(keys.decision(cluster, r), b"{not json", px=60_000)
        sent.clear()
        results = await store.put_many([(schedule_decision(cluster, r), "fp") for r in [*garbage, uuid.uuid4()]])
        assert sent == ["EVALSHA", "EVALSHA"]
        assert all(created for created, _ in results)
    finally:
        await locks.release(lease)


# ---------------------------------------------------------------------- the same as one at a time

#: What a request id holds before the calls: nothing, a record (published or not), a record of
#: the older layout, an unreadable one, or a key of another type.
KINDS = ("absent", "stored", "published", "older", "garbage", "list")
_pool = st.lists(st.sampled_from(KINDS), min_size=1, max_size=6)


@hyp_settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=_pool, data=st.data())
def test_batched_calls_answer_as_one_item_calls(settings: Settings, kinds: list[str], data: st.DataObject) -> None:
    """On two copies of the same records, the batched calls and the one-item calls in a loop give
    the same answers and leave the same records, for any mix (and repeats) of request ids."""
    picks = data.draw(st.lists(st.integers(0, len(kinds) - 1), min_size=1, max_size=10), label="picks")

    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        try:
            run = uuid.uuid4().hex[:8]
            cluster = f"p-{run}"
            rids = [uuid.uuid4() for _ in kinds]
            ids = [rids[i] for i in picks]
            ours = [(schedule_decision(cluster, r, "ours"), "fp-ours") for r in ids]
            earlier = {r: schedule_decision(cluster, r, "earlier") for r in rids}
            stores = []
            for copy in ("one", "many"):
                keys = Keys(f"{settings.redis_prefix}:decbatch-{copy}-{run}")
                stores.append(DecisionStore(client, settings, keys=keys))
                await _seed(client, stores[-1], keys, kinds, rids, earlier)
            one, many = stores

            before = [await one.record(cluster, r) for r in ids]
            assert await many.records(cluster, ids) == before
            put_one = [await one.put(d, fingerprint=fp) for d, fp in ours]
            assert await many.put_many(ours) == put_one
            marked_one = [await one.mark_published(cluster, r) for r in ids]
            assert await many.mark_published_many(cluster, ids) == marked_one
            assert await many.records(cluster, rids) == [await one.record(cluster, r) for r in rids]
        finally:
            await client.aclose()

    asyncio.run(scenario())


async def _seed(
    client: aioredis.Redis,
    store: DecisionStore,
    keys: Keys,
    kinds: list[str],
    rids: list[uuid.UUID],
    earlier: dict[uuid.UUID, ScheduleDecision],
) -> None:
    cluster = next(iter(earlier.values())).cluster_id
    for kind, r in zip(kinds, rids, strict=True):
        key = keys.decision(cluster, r)
        if kind in ("stored", "published"):
            await store.put(earlier[r], fingerprint="fp-earlier")
            if kind == "published":
                await store.mark_published(cluster, r)
        elif kind == "older":
            await client.set(key, earlier[r].model_dump_json(), px=60_000)
        elif kind == "garbage":
            await client.set(key, b"{not json", px=60_000)
        elif kind == "list":
            await client.rpush(key, b"x")
            await client.pexpire(key, 60_000)
