"""Cluster policies cached in a service process, dropped on a `policy.changed` event and re-read
after VMSCHED_POLICY_CACHE_TTL_S anyway, so a missed event (the bus was down when it was sent)
cannot leave a process on an old policy for longer than that.

PostgreSQL away is not a reason to stop deciding: a re-read that fails keeps the policy read last,
for as long as PostgreSQL is away (policies cannot change meanwhile: policy-admin writes them there).
The process's PolicyStoreWatch says so once when PostgreSQL goes away and once when it is back, keeps
the staleness gauge (vmsched_policy_staleness_seconds), and spaces the attempts while it is away so
requests do not queue behind reads bound to fail. Only a cluster with no policy read yet is refused,
with the retryable `policy_store_unavailable`.

It reads through vmsched.db and listens on the bus of the process's Runtime, so it lives next to the
runtime rather than in vmsched.db, which knows neither.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from vmsched import constants as c
from vmsched.contracts import PolicyChanged
from vmsched.db.pool import unavailable
from vmsched.db.repository import PolicyRepository
from vmsched.errors import PolicyStoreUnavailable
from vmsched.logging import get_logger
from vmsched.metrics import POLICY_STALENESS, POLICY_STORE_UP
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units import REGISTRY

if TYPE_CHECKING:
    from vmsched.runtime import Runtime

log = get_logger("vmsched.policy_cache")


class PolicyStoreWatch:
    """Whether PostgreSQL answered the last policy read of the process (one per Runtime, shared by its
    policy caches), and since when it has not."""

    def __init__(self, retry_interval_s: float) -> None:
        self.retry_interval_s = retry_interval_s
        self.last_ok = time.monotonic()
        self.away_since: float | None = None
        self._last_try = 0.0
        # The process's current watch: the gauges read it when scraped.
        POLICY_STALENESS.set_function(self.staleness)
        POLICY_STORE_UP.set_function(lambda: 0.0 if self.away else 1.0)

    @property
    def away(self) -> bool:
        return self.away_since is not None

    def staleness(self) -> float:
        """0 while PostgreSQL answers; while it is away, seconds since the last successful read."""
        return 0.0 if self.away_since is None else time.monotonic() - self.last_ok

    def worth_trying(self) -> bool:
        """Read now? Always while PostgreSQL answers; every retry_interval_s while it is away."""
        return self.away_since is None or time.monotonic() - self._last_try >= self.retry_interval_s

    def trying(self) -> None:
        self._last_try = time.monotonic()

    def answered(self) -> None:
        if self.away_since is not None:
            log.info("PostgreSQL answers again: policies are read afresh", away_s=round(self.staleness(), 1))
        self.last_ok, self.away_since = time.monotonic(), None

    def failed(self, exc: BaseException) -> None:
        if self.away_since is None:
            self.away_since = time.monotonic()
            log.warning(
                "PostgreSQL is away: deciding with the policies read last until it is back",
                error=f"{type(exc).__name__}: {exc}"[:300],
            )


class PolicyCache:
    """Each cluster's policy from PostgreSQL, kept until a `policy.changed` event drops it or it is
    older than the settings' policy_cache_ttl_s and PostgreSQL answers (see the module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        rt.uses_postgres = True
        self.watch = rt.policy_watch
        self._ttl_s = rt.settings.policy_cache_ttl_s
        self._read_timeout_s = rt.settings.policy_read_timeout_s
        self._policies: dict[str, tuple[Policy, float]] = {}

    async def subscribe(self) -> None:
        """Follow policy.changed events (each process its own queue)."""
        await self.rt.bus.subscribe([c.POLICY_CHANGED], [PolicyChanged], self.on_changed)

    async def for_cluster(self, cluster_id: str) -> Policy:
        cached = self._policies.get(cluster_id)
        if cached is not None and (time.monotonic() - cached[1] < self._ttl_s or not self.watch.worth_trying()):
            return cached[0]
        if cached is None and not self.watch.worth_trying():
            raise self._refusal()
        self.watch.trying()
        try:
            async with asyncio.timeout(self._read_timeout_s):
                policy = await PolicyRepository(await self.rt.postgres()).get_for_cluster(cluster_id)
        except Exception as exc:
            away = unavailable(exc, io=True)
            if away is None:
                raise
            self.watch.failed(exc)
            if cached is not None:
                return cached[0]  # the policy read last: it cannot have changed while PostgreSQL is away
            raise self._refusal() from exc
        self.watch.answered()
        policy.validate_against(REGISTRY)
        self._policies[cluster_id] = (policy, time.monotonic())
        return policy

    @staticmethod
    def _refusal() -> PolicyStoreUnavailable:
        return PolicyStoreUnavailable(
            "PostgreSQL, which keeps the policies, is away and no policy of this cluster was read before it went; "
            "send the request again once it is back"
        )

    async def on_changed(self, event: PolicyChanged) -> None:
        if event.cluster_id is not None and event.policy_id is None:
            self._policies.pop(event.cluster_id, None)
        else:
            self._policies.clear()
