"""The selector's `whatif` RPC: which policy a what-if runs, then vmsched.lifecycle.whatif.

* none named: the cluster's own, with its overrides, as `schedule` reads it (the PolicyCache);
* `policy`: a stored policy by name (policy_not_found if there is none), with the cluster's HA
  reservation switch (a cluster setting, which travels as the HaReservation property) but not the
  cluster's property overrides, which belong to its attachment to its own policy;
* `policy_inline`: a policy document, validated as `vmsched policy apply` validates one
  (invalid_policy listing every problem), with the HA switch likewise.

`properties` are merged over the policy's last, each checked against the units that read it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from vmsched.contracts import PolicyOrigin, WhatIfReply, WhatIfRequest
from vmsched.db.pool import unavailable
from vmsched.db.repository import PolicyRepository
from vmsched.errors import InvalidPolicy
from vmsched.lifecycle.whatif import WhatIf
from vmsched.policy_cache import PolicyCache
from vmsched.runtime import Runtime
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.policy_docs import policy_of, policy_units, problems, property_problems
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY
from vmsched.scheduling.units import REGISTRY
from vmsched.store import PendingStore

T = TypeVar("T")


def _refuse(found: list[str], location: str) -> InvalidPolicy:
    listed = "\n".join(f"- {p}" for p in found)
    return InvalidPolicy(f"nothing was evaluated; {len(found)} problem(s):\n{listed}", location=location)


class WhatIfs:
    def __init__(self, rt: Runtime, policies: PolicyCache) -> None:
        self.rt = rt
        self.policies = policies
        self.what_if = WhatIf(rt.settings, pending=PendingStore(rt.redis, rt.settings), state=rt.state)

    async def handle(self, req: WhatIfRequest) -> WhatIfReply:
        # An unknown cluster is said as `schedule` says it, before any policy is looked for.
        await self.rt.state.version(req.cluster_id)
        policy, origin = await self.policy(req)
        return await self.what_if.run(req, policy, origin)

    async def policy(self, req: WhatIfRequest) -> tuple[Policy, PolicyOrigin]:
        """The policy the what-if runs, validated, with the request's overrides merged in."""
        if req.policy_inline is not None:
            found = problems(req.policy_inline, REGISTRY)
            if found:
                raise _refuse([f"policy {req.policy_inline.name}: {p}" for p in found], "policy_inline")
            doc = req.policy_inline
            policy = await self._with_cluster_switch(
                policy_of(doc, uuid.uuid5(uuid.NAMESPACE_URL, f"vmsched-whatif:{doc.name}")), req.cluster_id
            )
            origin = PolicyOrigin.INLINE
        elif req.policy is not None:
            name = req.policy
            policy = await self._with_cluster_switch(await self._read(lambda repo: repo.get(name)), req.cluster_id)
            origin = PolicyOrigin.STORED
        else:
            policy, origin = await self.policies.for_cluster(req.cluster_id), PolicyOrigin.CLUSTER
        if req.properties:
            found = property_problems(req.properties, policy_units(policy, REGISTRY))
            if found:
                raise _refuse(found, "properties")
            policy = policy.model_copy(update={"properties": {**policy.properties, **req.properties}})
        policy.validate_against(REGISTRY)
        return policy, origin

    async def _with_cluster_switch(self, policy: Policy, cluster_id: str) -> Policy:
        settings = await self._read(lambda repo: repo.get_cluster_settings(cluster_id))
        if not settings.ha_reservation:
            return policy
        return policy.model_copy(update={"properties": {**policy.properties, HA_RESERVATION_PROPERTY: "true"}})

    async def _read(self, read: Callable[[PolicyRepository], Awaitable[T]]) -> T:
        """One read of PostgreSQL, bounded like the policy cache's; away: policy_store_unavailable."""
        try:
            async with asyncio.timeout(self.rt.settings.policy_read_timeout_s):
                return await read(PolicyRepository(await self.rt.postgres()))
        except Exception as exc:
            away = unavailable(exc, io=True)
            if away is None:
                raise
            raise away from exc


__all__ = ["WhatIfs"]
