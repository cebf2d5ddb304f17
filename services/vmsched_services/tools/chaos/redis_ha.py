"""Fault experiments that fail Redis over mid-stream, on private servers (never the shared Redis):

* redis_sentinel_failover: a primary, its replica and three sentinels (quorum 2); the primary is
  SIGKILLed while schedule requests stream in, the sentinels promote the replica and the services'
  clients follow it (they ask the sentinels again when a connection fails).
* redis_cluster_failover: a 3-master Redis Cluster (one replica each, unless `replicas=0`); the
  master serving one experiment cluster's slot is SIGKILLed, its replica takes the slots over.

Replication is asynchronous: the writes a killed primary acknowledged in its last moments may never
reach the replica it is replaced by. What that costs is measured, not assumed: `fence_rollbacks`
(clusters whose fencing token went back, so a later acquisition can reuse a token a stale holder
has), `decisions_lost` (stored decisions the promoted server no longer has: a replay decides
again), over-committed hosts and duplicate placements (the effect on the hosts). The guard against a
promoted replica that missed writes (the generation marker checked by the lock and state scripts)
turns those losses into refusals and a resync; these figures are what to compare before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import RedisError

from vmsched.contracts import DecisionStatus
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys, PendingStore
from vmsched.store.redis import connect
from vmsched_services.tools.chaos.base import (
    Host,
    Outcome,
    Result,
    experiment_settings,
    pending_duplicates,
    run_tag,
    staged,
    timed,
)
from vmsched_services.tools.chaos.stream import answering_resyncs, engine_stream, placement_figures
from vmsched_services.tools.servers.redis import PrivateRedis, PrivateRedisCluster, SentinelGroup

SERVICES = ("state-tracker", "filter-worker", "weigher", "selector")


@dataclass
class _Failover:
    """The servers of one experiment and how to kill the primary of the experiment's first cluster."""

    settings_update: dict[str, object]
    victim: Callable[[Settings, str], Awaitable[PrivateRedis]]
    note: str


@contextlib.asynccontextmanager
async def _sentinel(directory: Path, replicas: int) -> AsyncIterator[_Failover]:
    del replicas  # one replica: the one the sentinels promote
    async with SentinelGroup(directory) as group:

        async def victim(settings: Settings, cluster: str) -> PrivateRedis:
            return group.primary

        yield _Failover(
            group.settings_update(), victim, "primary + 1 replica + 3 sentinels (quorum 2, down after 500 ms)"
        )


@contextlib.asynccontextmanager
async def _cluster(directory: Path, replicas: int) -> AsyncIterator[_Failover]:
    async with PrivateRedisCluster(directory, replicas=replicas) as cluster:

        async def victim(settings: Settings, cid: str) -> PrivateRedis:
            return await cluster.master_of(Keys.from_settings(settings).lock(cid))

        what = f"3 masters, {replicas} replica(s) each, node timeout 1000 ms"
        if replicas == 0:
            what += "; no replica: the killed master's slots stay down (the other masters serve theirs)"
        yield _Failover(cluster.settings_update(), victim, what)


async def redis_failover(
    base: Settings,
    log_dir: Path,
    *,
    mode: str = "sentinel",
    requests: int = 300,
    clusters: int = 3,
    hosts: int = 4,
    concurrency: int = 16,
    spread_s: float = 20.0,
    kill_at: float = 0.4,
    replicas: int = 1,
    seed: int = 7,
) -> Result:
    """The primary (sentinel) or the master serving the first cluster's slot (cluster) is SIGKILLed
    `kill_at` of the way through a stream of `requests` schedule requests to clusters that fill up."""
    name = f"redis_{mode}_failover"
    res = Result(name, {"requests": requests, "clusters": clusters, "concurrency": concurrency, "replicas": replicas})
    servers = {"sentinel": _sentinel, "cluster": _cluster}[mode]
    with timed(res):
        async with servers(log_dir / f"redis-{mode}", replicas) as failover:
            res.notes.append(failover.note)
            settings = experiment_settings(base, name.replace("_", "-"), **failover.settings_update)
            give_up_s = settings.lock_acquire_timeout_s + settings.lock_hold_timeout_s + 15.0
            rng = random.Random(seed)
            tag = run_tag("rf")
            async with staged(
                settings, log_dir, SERVICES, tag=tag, clusters=clusters, hosts=hosts, mem_mb=16_384
            ) as stage:
                outcomes = stage.requests(rng, requests, (512, 1024, 2048, 4096))
                first = f"{tag}-c0"
                victim = await failover.victim(settings, first)
                # A promoted replica is another server run: vmsched asks for full reports, and this
                # engine answers them (the stream resends what is answered state_resyncing).
                async with answering_resyncs(stage.client, stage.hosts, outcomes) as resyncs:
                    stream = asyncio.create_task(
                        engine_stream(stage.client, outcomes, concurrency, give_up_after=give_up_s, spread_s=spread_s)
                    )
                    await asyncio.sleep(spread_s * kill_at)
                    before = await _max_tokens(outcomes)
                    killed_at = time.monotonic()
                    await victim.kill()
                    res.figures["redis_recovery_s"] = round(await _recovered(settings, first, killed_at, give_up_s), 3)
                    await stream
                res.figures["resync_requests_answered"] = sum(resyncs.values())
                res.figures["kills"] = 1
                await _figures(res, settings, stage.hosts, outcomes, before)
        res.check("answered", ">=", requests)
        res.check("lost", "==", 0)
        res.check("over_committed_hosts", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("kills", ">=", 1)
        res.check_timing("redis_recovery_s", "<=", 5.0, short_bound=30.0)
        res.check_timing("answered_within_5s_pct", ">=", 95.0, short_bound=50.0)
    return res


async def _recovered(settings: Settings, cluster: str, killed_at: float, limit_s: float) -> float:
    """Seconds from the kill until a write to the cluster's slot succeeds again (through a client of
    the experiment's own, as the services' clients find the new primary)."""
    redis = connect(settings)
    key = f"{Keys.from_settings(settings).lock(cluster)}:probe"
    try:
        while time.monotonic() - killed_at < limit_s:
            with contextlib.suppress(RedisError, OSError):
                await redis.set(key, "1", px=1000)
                return time.monotonic() - killed_at
            await asyncio.sleep(0.05)
        return limit_s
    finally:
        await redis.aclose()


async def _max_tokens(outcomes: list[Outcome]) -> dict[str, int]:
    """The highest fencing token each cluster's decisions carried so far."""
    tokens: dict[str, int] = {}
    for o in outcomes:
        for d in o.replies:
            tokens[o.cluster_id] = max(tokens.get(o.cluster_id, 0), d.fencing_token)
    return tokens


#: How long the figures wait for every cluster's keys to be readable again after the failover.
READABLE_WAIT_S = 30.0


async def _readable(settings: Settings, clusters: set[str]) -> None:
    """Until every cluster's pending records read without a connection error, from a new client.

    The figures are read right after the stream: a Redis Cluster node that has not yet learnt of
    the promotion can still hand a new client the killed master for some slots (the services'
    clients, which lived through it, already moved on). What is measured is the data, so the
    reading waits for the topology to settle instead of failing the experiment.
    """
    end = time.monotonic() + READABLE_WAIT_S
    while True:
        redis = connect(settings)
        try:
            store = PendingStore(redis, settings)
            for cid in clusters:
                await store.read(cid)
            return
        except RedisError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.5)
        finally:
            await redis.aclose()


async def _figures(
    res: Result, settings: Settings, hosts: list[Host], outcomes: list[Outcome], tokens_before: dict[str, int]
) -> None:
    placement_figures(res, outcomes, hosts)
    await _readable(settings, {o.cluster_id for o in outcomes})
    res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes)
    redis = connect(settings)
    try:
        locks, decisions = ClusterLock(redis, settings), DecisionStore(redis, settings)
        # A fence below a token already handed out: the promoted server missed INCRs, and the
        # next acquisitions reissue tokens a stale holder may still carry.
        res.figures["fence_rollbacks"] = sum(
            [await locks.current_token(cid) < token for cid, token in tokens_before.items()]
        )
        kept = (DecisionStatus.PLACED, DecisionStatus.UNPLACEABLE)  # errors and expired ones are not stored
        stored = [o for o in outcomes if o.decision is not None and o.decision.status in kept]
        missing = 0
        for o in stored:
            missing += await decisions.record(o.cluster_id, o.request_id) is None
        res.figures["decisions_lost"] = missing
    finally:
        await redis.aclose()
    res.notes.append(
        "fence_rollbacks, decisions_lost and pending_mismatches are informational: writes the killed "
        "primary acknowledged but never replicated (asynchronous replication); the generation marker "
        "is what turns them into refusals"
    )
