"""The state tracker's read RPCs for callers with no Redis of their own (the HTTP API, an engine):
`clusters.list` (each cluster with state, in counts, with the policy it runs when PostgreSQL
answers in time) and the stored decisions (`decisions.recent`, `decisions.get`), read from the
DecisionStore the selector writes.
"""

from __future__ import annotations

import asyncio

from vmsched.contracts import (
    ClusterListing,
    ClusterQuery,
    ClusterSummary,
    DecisionListing,
    DecisionQuery,
    DecisionRef,
    ScheduleDecision,
)
from vmsched.db.repository import PolicyRepository
from vmsched.errors import DecisionNotFound
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.store import DecisionStore
from vmsched.store.keys import Keys

log = get_logger("vmsched.state_tracker")


class Reads:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.keys = Keys.from_settings(rt.settings)
        self.decisions = DecisionStore(rt.redis, rt.settings)

    async def clusters(self, _: ClusterQuery) -> ClusterListing:
        ids = await self.rt.state.clusters()
        # One round trip for every cluster's counts (no hash is read whole).
        async with self.rt.redis.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.get(self.keys.state_version(cid))
                pipe.hlen(self.keys.state_hosts(cid))
                pipe.hlen(self.keys.state_vms(cid))
            replies = await pipe.execute()
        policies = await self._policies(ids)
        out: list[ClusterSummary] = []
        for n, cid in enumerate(ids):
            version, hosts, vms = replies[3 * n : 3 * n + 3]
            if version is None:  # removed between the two reads
                continue
            out.append(
                ClusterSummary(
                    cluster_id=cid, hosts=hosts, vms=vms, state_version=int(version), policy=policies.get(cid)
                )
            )
        return ClusterListing(clusters=out)

    async def _policies(self, ids: list[str]) -> dict[str, str]:
        """Each cluster's policy name; empty when PostgreSQL does not answer within the policy read
        timeout (the listing then leaves the policy out rather than fail: the counts are Redis')."""
        if not ids:
            return {}
        try:
            async with asyncio.timeout(self.rt.settings.policy_read_timeout_s):
                repo = PolicyRepository(await self.rt.postgres())
                own = {settings.cluster_id: name for settings, name in await repo.clusters()}
                # Clusters without a row of their own run the default policy.
                default = (await repo.get_default()).name if any(cid not in own for cid in ids) else ""
        except Exception as exc:  # PostgreSQL away or refusing: the listing goes without policies
            log.warning("clusters listed without their policies", error=f"{type(exc).__name__}: {exc}"[:300])
            return {}
        return {cid: own.get(cid, default) for cid in ids}

    async def recent(self, req: DecisionQuery) -> DecisionListing:
        decisions = await self.decisions.recent(req.cluster_id, req.limit)
        return DecisionListing(cluster_id=req.cluster_id, decisions=decisions)

    async def get(self, req: DecisionRef) -> ScheduleDecision:
        decision = await self.decisions.get(req.cluster_id, req.request_id)
        if decision is None:
            raise DecisionNotFound(
                f"no decision stored for request {req.request_id} in cluster {req.cluster_id}; decisions are kept "
                "for VMSCHED_DECISION_TTL_S and errors are not stored",
                location="request_id",
            )
        return decision


__all__ = ["Reads"]
