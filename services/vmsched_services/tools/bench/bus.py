"""Full decisions through RabbitMQ, every service in its own process, as deployed."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from vmsched.client import ReportBatcher, SchedulerClient
from vmsched.contracts import VmReport
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.scheduling.policy import DEFAULT_POLICY, Policy
from vmsched.settings import Settings
from vmsched_services.tools.bench.data import vm_spec
from vmsched_services.tools.bench.stack import attach, detach, report_clusters
from vmsched_services.tools.bench.timing import costed, timed
from vmsched_services.tools.procs import Supervisor, local_server_pids, rss_mb


async def bench_bus(
    settings: Settings,
    n_hosts: int,
    decisions: int,
    concurrency: int,
    seed: int,
    policy: Policy = DEFAULT_POLICY,
    *,
    clusters: int = 1,
    spread_concurrency: int | None = None,
) -> dict[str, Any]:
    """Decisions over the bus, every service its own process: sequential and `concurrency` at a time
    on one cluster, then (with `clusters` > 1) `spread_concurrency` (default: `concurrency`) at a
    time spread over that many clusters of `n_hosts` each; with the RSS each service ends with."""
    spread_concurrency = spread_concurrency or concurrency

    rng = random.Random(seed)
    await migrate(settings.postgres_url)
    names = [f"bench-{n_hosts}-{policy.name}-{k}" for k in range(max(1, clusters))]
    cluster = names[0]
    pool = await connect_pg(settings.postgres_url)
    repo = PolicyRepository(pool)
    await attach(repo, names, policy)
    sup = Supervisor(settings, Path(tempfile.mkdtemp(prefix="vmsched-bench-")))
    try:
        for service in ("state-tracker", "filter-worker", "weigher", "selector"):
            await sup.start(service)
        async with SchedulerClient(settings) as client:
            await report_clusters(client, rng, names, n_hosts)
            starts: list[asyncio.Task[None]] = []
            # As an engine with many VMs starting would: the reports that wait go as one message.
            reports = ReportBatcher(client)
            counter = iter(range(10**9))

            async def one(i: int, spread: bool = False) -> None:
                target = names[i % len(names)] if spread else cluster
                vm = vm_spec(rng, next(counter))
                d = await client.schedule(target, vm, timeout=60)
                if d.host_id is None:
                    raise RuntimeError(f"bench VM not placed: {d.explanation.summary}")
                # The engine starts it; the state tracker clears its pending record.
                starts.append(asyncio.create_task(reports.report(VmReport.running(target, d.host_id, vm))))

            # Warm caches and connections, of every cluster: the runs measure a steady state.
            await timed(max(10, len(names)), 1, partial(one, spread=True))
            pids = {f"{name}-{i}": proc.pid for i, (name, proc) in enumerate(sup.procs)}
            pids |= {**local_server_pids(), "bench (the engine)": os.getpid()}
            runs = {"sequential": await costed(pids, decisions // 2, 1, one)}
            runs[f"concurrent_{concurrency}"] = await costed(pids, decisions, concurrency, one)
            if len(names) > 1:
                spread = await costed(pids, decisions, spread_concurrency, partial(one, spread=True))
                runs[f"concurrent_{spread_concurrency}_over_{len(names)}_clusters"] = spread
            await asyncio.gather(*starts)
        rss = {f"{name}-{i}": rss_mb(proc.pid) for i, (name, proc) in enumerate(sup.procs)}
        return {**runs, "rss_mb": rss, "logs": str(sup.log_dir)}
    finally:
        sup.stop_all()
        await detach(repo, names, policy)
        await pool.close()


__all__ = ["bench_bus"]
