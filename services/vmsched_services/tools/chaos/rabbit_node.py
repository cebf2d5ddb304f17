"""The rabbit_node_loss experiment: a 3-node RabbitMQ cluster of our own on loopback, the services'
queues quorum queues on it, and the node leading them SIGKILLed during a request stream: nothing
lost or placed twice, and scheduling answers again within a bound.

The cluster is private (tools/servers/rabbit.py): the shared broker is never stopped. The services
and the engine's client are given all three nodes (VMSCHED_AMQP_URL, VMSCHED_AMQP_FAILOVER_URLS),
the first one first, so they all start on the node that then leads the queues (a quorum queue's
leader is put on the node of the connection that declares it): its loss takes away, at once, every
service's connection and every queue's leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from vmsched.client import SchedulerClient
from vmsched.settings import Settings
from vmsched_services.tools.chaos.base import (
    Outcome,
    Result,
    Stage,
    experiment_settings,
    make_clusters,
    pending_duplicates,
    placement_faults,
    run_tag,
    running,
    timed,
)
from vmsched_services.tools.chaos.stream import drive_during, latency_figures, placed_again_after, settle
from vmsched_services.tools.servers.rabbit import RabbitCluster

#: The services the experiment runs (two selectors: one may be mid-decision when its node goes).
SERVICES = ("state-tracker", "filter-worker", "weigher", "selector", "selector")
#: How long the services may take to consume (the default 30 s is short with the nodes running).
SERVICES_START_S = 90.0


async def rabbit_node_loss(
    base: Settings,
    log_dir: Path,
    *,
    requests: int = 300,
    clusters: int = 2,
    concurrency: int = 4,
    spread_s: float = 30.0,
    kill_at: float = 0.4,
    seed: int = 8,
) -> Result:
    """During a stream of schedule requests, once `kill_at` of them are answered, the node leading
    the most of the experiment's queues is SIGKILLed: every request is answered (the engine sends
    a request again under its id, as on any lost connection), none is placed twice, and a fresh
    request is placed again within 10 s of the kill. The node is started again afterwards (it
    rejoins by itself) so the services stop as they would on a whole cluster."""
    res = Result("rabbit_node_loss", {"requests": requests, "concurrency": concurrency, "nodes": 3})
    with timed(res):
        cluster = RabbitCluster(log_dir / "rabbit-cluster")
        try:
            await cluster.start()
            res.figures["cluster_startup_s"] = round(cluster.startup_s, 1)
            settings = experiment_settings(
                base,
                "rabbit-node",
                amqp_url=cluster.urls[0],
                amqp_failover_urls=",".join(cluster.urls[1:]),
                queue_type="quorum",
                # The experiment's own broker: no prefix needed, but the scope keeps Redis keys apart.
            )
            tag = run_tag("rn")
            rng = random.Random(seed)
            async with _staged(settings, log_dir, tag, clusters) as stage:
                outcomes = stage.requests(rng, requests)
                loss = _NodeLoss(cluster, settings, stage, outcomes)
                await loss.find_leaders()  # before the stream: rabbitmqctl takes seconds
                await drive_during(loss.inject(kill_at), stage.client, outcomes, concurrency, spread_s)
                # A probe given up on may still have been placed (its reply lost with the node):
                # asked again under its id, as an engine would, so the pending records can be
                # checked against every decision.
                res.figures["probes_unanswered"] = await settle(stage.client, loss.probes)
                await _figures(res, settings, stage, outcomes, loss)
        finally:
            await cluster.stop()
        res.check("lost", "==", 0)
        res.check("duplicate_placements", "==", 0)
        res.check("pending_mismatches", "==", 0)
        res.check("services_exited", "==", 0)
        res.check("queues_led_by_killed_node", ">=", 1)
        res.check("queues_without_leader_after", "==", 0)
        res.check_timing("recovery_s", "<=", 10.0, short_bound=60.0)
    return res


@dataclass
class _NodeLoss:
    """The kill, and what it did: which node, how many of our queues it led, when placing worked again."""

    cluster: RabbitCluster
    settings: Settings
    stage: Stage
    outcomes: list[Outcome]
    probes: list[Outcome] = field(default_factory=list)
    leaders: dict[str, str] = field(default_factory=dict)
    killed: str = ""
    led_before: int = 0
    in_flight_at_kill: int = 0
    leaderless_after: int = -1
    recovery_s: float = float("inf")
    rejoined_s: float = float("inf")
    restart_error: str = ""

    async def find_leaders(self) -> None:
        """Which node leads the most of the experiment's queues: the one to kill."""
        self.leaders = await self._our_leaders()
        counts: dict[str, int] = {}
        for node in self.leaders.values():
            counts[node] = counts.get(node, 0) + 1
        self.killed = max(counts, key=lambda n: counts[n]) if counts else self.cluster.nodes[0].nodename
        self.led_before = counts.get(self.killed, 0)

    async def inject(self, at: float) -> None:
        """Once `at` of the stream is answered: SIGKILL the node, measure until a request is placed
        again, count the queues left without a leader, and start the node again (it rejoins)."""
        while sum(o.decision is not None for o in self.outcomes) < at * len(self.outcomes):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        node = self.cluster.node_named(self.killed)
        killed_at = time.monotonic()
        await node.kill()
        self.in_flight_at_kill = sum(o.attempts > 0 and o.decision is None for o in self.outcomes)
        self.recovery_s = await placed_again_after(self.stage, self.probes, killed_at, give_up_s=90.0)
        after = await self._our_leaders()
        self.leaderless_after = sum(1 for q in self.leaders if after.get(q, self.killed) == self.killed)
        restarted = time.monotonic()
        try:
            await node.start()
        except RuntimeError as exc:  # a figure of its own (999), not the end of the experiment
            self.restart_error = str(exc)[:300]
        else:
            self.rejoined_s = time.monotonic() - restarted

    async def _our_leaders(self) -> dict[str, str]:
        prefix = self.settings.amqp_prefix
        return {q: n for q, n in (await self.cluster.queue_leaders()).items() if q.startswith(prefix)}


@contextlib.asynccontextmanager
async def _staged(settings: Settings, log_dir: Path, tag: str, clusters: int) -> AsyncIterator[Stage]:
    """base.staged, with more time for the services to start: three Erlang nodes share the machine."""
    async with running(settings, log_dir) as stack:
        started = await stack.start(*SERVICES, timeout=SERVICES_START_S)
        async with SchedulerClient(settings) as client:
            hosts = await make_clusters(client, tag, clusters, 4, 262_144)
            yield Stage(stack, started, client, tag, clusters, hosts)


async def _figures(res: Result, settings: Settings, stage: Stage, outcomes: list[Outcome], loss: _NodeLoss) -> None:
    crashed = [f"{p.name}#{p.index}" for p in stage.stack.procs if not p.alive]
    latency_figures(res, outcomes)
    placed = placement_faults(outcomes + loss.probes, stage.hosts)
    res.figures["duplicate_placements"] = placed["duplicate_placements"]
    res.figures["pending_mismatches"] = await pending_duplicates(settings, outcomes + loss.probes)
    res.figures["killed_node"] = loss.killed
    res.figures["queues_led_by_killed_node"] = loss.led_before
    res.figures["in_flight_at_kill"] = loss.in_flight_at_kill
    res.figures["queues_without_leader_after"] = loss.leaderless_after
    res.figures["recovery_s"] = round(loss.recovery_s, 3) if loss.recovery_s != float("inf") else 999.0
    res.figures["node_restart_s"] = round(loss.rejoined_s, 1) if loss.rejoined_s != float("inf") else 999.0
    res.figures["services_exited"] = len(crashed)
    texts = Counter(e[:160] for o in outcomes + loss.probes for e in o.errors)
    if texts:
        res.notes.append("most frequent client errors: " + " | ".join(f"{t} x{n}" for t, n in texts.most_common(3)))
    unanswered = Counter(
        "no reply" if o.decision is None else f"{o.decision.error.code if o.decision.error else 'error'}"
        for o in outcomes
        if not o.answered
    )
    if unanswered:
        res.notes.append("unanswered: " + ", ".join(f"{k} x{n}" for k, n in unanswered.most_common()))
    if loss.restart_error:
        res.notes.append(f"the killed node did not start again: {loss.restart_error}")
    if crashed:
        res.notes.append("exited: " + ", ".join(crashed))


__all__ = ["rabbit_node_loss"]
