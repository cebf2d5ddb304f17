"""The maintenance plans the balancer is carrying out, one per host being drained.

`{prefix}:maintenance:{cluster}` -> hash host id -> JSON {"plan": MaintenancePlan, "step": n,
"started": bool, "retry_at": unix seconds or null}: the plan published for the host and how far it
got, so the balancer plans a host once (not on every pass), and a balancer that takes the cluster's
lease over goes on where the last one was. One hash per cluster, read whole once a pass (it is
empty unless a host is in maintenance), so a plan whose host came back up is found and dropped. A
refused plan stands until `retry_at` (REFUSED_RETRY_S after it was made), then the host is planned
again: the cluster may have changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis.asyncio as aioredis

from vmsched.contracts import MaintenancePlan
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import text

#: How long a refused plan stands before the host is planned again (seconds).
REFUSED_RETRY_S = 300.0


@dataclass(frozen=True)
class PlanProgress:
    """A plan and how far it got: `step` is the step being carried out (or next), `started`
    whether its migrations were scheduled; `retry_at` when a refused plan may be made again."""

    plan: MaintenancePlan
    step: int = 0
    started: bool = False
    retry_at: float | None = None


class MaintenancePlans:
    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)

    async def all(self, cluster_id: str) -> dict[str, PlanProgress]:
        """Every plan of the cluster by host id."""
        raw = await self._redis.hgetall(self._keys.maintenance(cluster_id))
        out: dict[str, PlanProgress] = {}
        for host, value in raw.items():
            record = json.loads(value)
            plan = MaintenancePlan.model_validate_json(record["plan"])
            out[text(host)] = PlanProgress(plan, int(record["step"]), bool(record["started"]), record["retry_at"])
        return out

    async def put(self, progress: PlanProgress) -> None:
        plan = progress.plan
        record = {
            "plan": plan.model_dump_json(),
            "step": progress.step,
            "started": progress.started,
            "retry_at": progress.retry_at,
        }
        await self._redis.hset(self._keys.maintenance(plan.cluster_id), plan.host_id, json.dumps(record))

    async def forget(self, cluster_id: str, host_id: str) -> None:
        await self._redis.hdel(self._keys.maintenance(cluster_id), host_id)


__all__ = ["REFUSED_RETRY_S", "MaintenancePlans", "PlanProgress"]
