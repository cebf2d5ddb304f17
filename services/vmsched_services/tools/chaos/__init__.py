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
from vmsched_services.tools.chaos.rabbit_node import rabbit_node_loss
from vmsched_services.tools.chaos.stale import stale_holder

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
        )
    }
)

__all__ = ["EXPERIMENTS", "Check", "Experiment", "Result"]
