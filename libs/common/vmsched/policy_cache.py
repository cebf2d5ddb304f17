"""Cluster policies cached in a service process, dropped on a `policy.changed` event and re-read
after VMSCHED_POLICY_CACHE_TTL_S anyway, so a missed event (the bus was down when it was sent)
cannot leave a process on an old policy for longer than that.

It reads through vmsched.db and listens on the bus of the process's Runtime, so it lives next to the
runtime rather than in vmsched.db, which knows neither.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from vmsched import constants as c
from vmsched.contracts import PolicyChanged
from vmsched.db.repository import PolicyRepository
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import REGISTRY

if TYPE_CHECKING:
    from vmsched.runtime import Runtime


class PolicyCache:
    """Each cluster's policy from PostgreSQL, kept until a `policy.changed` event drops it or it is
    older than the settings' policy_cache_ttl_s."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        rt.uses_postgres = True
        self._ttl_s = rt.settings.policy_cache_ttl_s
        self._policies: dict[str, tuple[Policy, float]] = {}

    async def subscribe(self) -> None:
        """Follow policy.changed events (each process its own queue)."""
        await self.rt.bus.subscribe([c.POLICY_CHANGED], [PolicyChanged], self.on_changed)

    async def for_cluster(self, cluster_id: str) -> Policy:
        cached = self._policies.get(cluster_id)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self._ttl_s:
            return cached[0]
        policy = await PolicyRepository(await self.rt.postgres()).get_for_cluster(cluster_id)
        policy.validate_against(REGISTRY)
        self._policies[cluster_id] = (policy, now)
        return policy

    async def on_changed(self, event: PolicyChanged) -> None:
        if event.cluster_id is not None and event.policy_id is None:
            self._policies.pop(event.cluster_id, None)
        else:
            self._policies.clear()
