"""The fault suite: real service processes on the real servers, killed, frozen, cut off and fed
hostile input, each experiment bounded in time and reporting its figures against its thresholds.

    result = await EXPERIMENTS["worker_kill"].run(Settings(), Path("/tmp/logs"), long=True)
    print(result.summary())

Every experiment exists in two sizes: `short` (the test suite, tests/faults: seconds each) and
`long` (`vmsched chaos --long`, `make faults`: the sizes the thresholds are stated for). Only the
long broker_drop restarts the broker app, which disturbs every client of the broker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import Check, Result
from vmsched_services.tools.chaos.broker import broker_drop
from vmsched_services.tools.chaos.hostile import hostile_input
from vmsched_services.tools.chaos.kills import selector_kill, worker_kill
from vmsched_services.tools.chaos.outages import postgres_away, redis_away
from vmsched_services.tools.chaos.rabbit_node import rabbit_node_loss
from vmsched_services.tools.chaos.redis_ha import redis_failover
from vmsched_services.tools.chaos.redis_loss import redis_restart
from vmsched_services.tools.chaos.stale import stale_holder
from vmsched_services.tools.chaos.tracker import tracker_kill

ExperimentFn = Callable[..., Awaitable[Result]]


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    fn: ExperimentFn
    short: Mapping[str, Any] = field(default_factory=dict)
    long: Mapping[str, Any] = field(default_factory=dict)

    async def run(self, settings: Settings, log_dir: Path, *, long: bool = False, **overrides: Any) -> Result:
        result = await self.fn(settings, log_dir, **{**(self.long if long else self.short), **overrides})
        return result.judged_as(long=long)


EXPERIMENTS: Mapping[str, Experiment] = MappingProxyType(
    {
        e.name: e
        for e in (
            Experiment(
                "worker_kill",
                "filter-workers and weighers (2 each) SIGKILLed and restarted mid-request: "
                "all answered, max latency <= 5 s, none lost or placed twice",
                worker_kill,
                short={
                    "requests": 24,
                    "clusters": 2,
                    "hosts": 4,
                    "concurrency": 4,
                    "spread_s": 5.0,
                    "kill_every_s": (0.5, 1.0),
                },
                long={"requests": 100, "spread_s": 20.0},
            ),
            Experiment(
                "selector_kill",
                "a selector SIGKILLed every 1-2 s and restarted, default lock timeouts: 0 over-committed "
                "hosts, >= 99 % answered within 5 s, all within acquire timeout + 5 s",
                selector_kill,
                short={"requests": 120, "clusters": 4, "selectors": 2, "concurrency": 16, "spread_s": 6.0},
                long={"requests": 800, "selectors": 3, "spread_s": 20.0},
            ),
            Experiment(
                "tracker_kill",
                "the consuming one of two state trackers SIGKILLed (and replaced) while a host is "
                "reported every 50 ms: 0 reports lost, 0 applied out of order, takeover <= 2 s",
                tracker_kill,
                short={"kills": 2, "settle_s": 3.0},
                long={"kills": 6, "settle_s": 3.0},
            ),
            Experiment(
                "stale_holder",
                "a lock holder SIGSTOPped past its lease, the lock taken over and written, the holder "
                "resumed: every stale fenced write refused",
                stale_holder,
                short={"trials": 3, "per_round": 3, "hold_s": 3.0},
                long={"trials": 20, "per_round": 5},
            ),
            Experiment(
                "broker_drop",
                "the services' broker connections closed, their Redis clients killed (long: the broker "
                "app restarted) during a request stream: 0 lost, 0 duplicates, recovery <= 5 s",
                broker_drop,
                short={"requests": 60, "concurrency": 8, "spread_s": 8.0, "restart_broker": False},
                long={"requests": 300, "spread_s": 30.0, "restart_broker": True},
            ),
            Experiment(
                "redis_sentinel_failover",
                "private Redis primary + replica + 3 sentinels; the primary SIGKILLed mid-stream: all answered, "
                "0 lost, 0 duplicates, 0 over-committed hosts, recovery <= 5 s (counts fence rollbacks and lost "
                "decisions: writes the replica missed)",
                redis_failover,
                short={
                    "mode": "sentinel",
                    "requests": 40,
                    "clusters": 2,
                    "hosts": 3,
                    "concurrency": 8,
                    "spread_s": 6.0,
                },
                long={"mode": "sentinel", "requests": 300, "spread_s": 20.0},
            ),
            Experiment(
                "redis_cluster_failover",
                "private 3-master Redis Cluster, a replica each; the master of one cluster's slot SIGKILLed "
                "mid-stream: all answered, 0 lost, 0 duplicates, 0 over-committed hosts, recovery <= 5 s",
                redis_failover,
                short={"mode": "cluster", "requests": 40, "clusters": 2, "hosts": 3, "concurrency": 8, "spread_s": 6.0},
                long={"mode": "cluster", "requests": 300, "spread_s": 20.0},
            ),
            Experiment(
                "rabbit_node_loss",
                "a private 3-node RabbitMQ cluster, quorum queues; the node leading them SIGKILLed during a "
                "request stream: 0 lost, 0 duplicates, placing again within 10 s",
                rabbit_node_loss,
                short={"requests": 40, "concurrency": 4, "spread_s": 8.0},
                long={"requests": 300, "spread_s": 30.0},
            ),
            Experiment(
                "hostile_input",
                "malformed, oversized, wrongly typed, deeply nested and poisonous messages among valid "
                "requests: all refused, no crash or wedge, valid ones answered within 1 s, RSS +<= 20 MB",
                hostile_input,
                short={"messages": 1500},
                long={"messages": 10_000},
            ),
            Experiment(
                "postgres_away",
                "a private PostgreSQL (the policy store) stopped for several policy-cache TTLs during a request "
                "stream, then started: every request answered from the cached policies, none internal, a "
                "never-read cluster refused policy_store_unavailable, staleness gauge counting, recovery <= 5 s",
                postgres_away,
                short={"requests": 40, "concurrency": 4, "spread_s": 8.0, "away_s": 4.0, "cache_ttl_s": 1.0},
                long={"requests": 200, "spread_s": 30.0, "away_s": 15.0, "cache_ttl_s": 2.0},
            ),
            Experiment(
                "redis_away",
                "a private Redis (every service's) stopped during a request stream, then started: the "
                "services stop consuming while it is away, nothing answered internal, none lost, recovery <= 5 s",
                redis_away,
                short={"requests": 40, "concurrency": 4, "spread_s": 8.0, "away_s": 4.0},
                long={"requests": 100, "spread_s": 20.0, "away_s": 10.0},
            ),
            Experiment(
                "redis_restart",
                "a private Redis (every service's, no persistence) SIGKILLed and started empty during a request "
                "stream, a lock holder frozen across it: 0 lost, 0 placed twice (replays of requests decided "
                "before: decision_lost), 0 over-committed hosts, 0 stale writes accepted, recovery <= 10 s",
                redis_restart,
                short={"requests": 40, "clusters": 2, "holder_clusters": 2, "replays": 3, "spread_s": 8.0},
                long={"requests": 120, "clusters": 2, "hosts": 4, "holder_clusters": 4, "replays": 5, "spread_s": 30.0},
            ),
        )
    }
)

__all__ = ["EXPERIMENTS", "Check", "Experiment", "Result"]
