"""MigrationBudget: the balancer's record of its migrations, which the disruption budgets read.

{prefix}:migration-budget:{cluster} is a sorted set of the cluster's balancing migrations (member:
the decision's JSON, score: its unix time), kept for max(an hour, the return cool-down): what
vmsched.scheduling.budgets.MigrationLedger needs to count migrations per host and per cluster in
the last hour and the hosts each VM left within the cool-down. A balancer that takes over a
cluster's lease reads the same record, so the budgets hold across restarts and handovers. How long
each VM rests is MigrationCooldowns' (vmsched.store.memories), as before.
"""

from __future__ import annotations

import json
from typing import cast

import redis.asyncio as aioredis

from vmsched.scheduling.budgets import HOUR_S, MigrationLedger, MoveRecord
from vmsched.settings import Settings
from vmsched.store.keys import Keys


class MigrationBudget:
    """{prefix}:migration-budget:{cluster} -> zset of moves by decision time (unix seconds)."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)

    async def record(self, cluster_id: str, move: MoveRecord, decision_id: str, keep_s: float) -> None:
        """Note a balancing migration just decided; drop what is older than `keep_s`."""
        key = self._keys.migration_budget(cluster_id)
        member = json.dumps([decision_id, move.vm_id, move.source, move.target])
        keep = max(keep_s, HOUR_S)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {member: move.at_s})
            pipe.zremrangebyscore(key, "-inf", f"({move.at_s - keep}")
            pipe.pexpire(key, int(keep * 1000) + 1000)
            await pipe.execute()

    async def ledger(self, cluster_id: str, now_s: float, return_cooldown_s: float) -> MigrationLedger:
        """The moves of the window ending `now_s`, as the budgets read them."""
        since = now_s - max(return_cooldown_s, HOUR_S)
        rows = await self._redis.zrangebyscore(
            self._keys.migration_budget(cluster_id), f"({since}", "+inf", withscores=True
        )
        moves = []
        for row in rows:
            member, at = cast("tuple[bytes | str, float]", row)
            _, vm, source, target = json.loads(member)
            moves.append(MoveRecord(float(at), str(vm), str(source), str(target)))
        ledger = MigrationLedger(return_cooldown_s, moves)
        ledger.prune(now_s)
        return ledger


__all__ = ["MigrationBudget"]
