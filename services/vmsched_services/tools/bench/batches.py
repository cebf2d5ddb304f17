"""Big batches beside small requests: what a cluster's 1,000-VM batches cost another cluster.

Every service in its own process (one filter-worker, as a small deployment runs), RabbitMQ. First
another cluster's one-VM requests alone (the baseline), then the same while `batches` batches of
`batch_size` VMs are placed on a big cluster of `n_hosts` hosts: how long each batch took and how
it ended, and the other cluster's latency meanwhile. Placing is CPU work on a worker's event loop,
so a batch that never yields holds every other message of that worker for its whole run.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from vmsched.client import SchedulerClient
from vmsched.contracts import ScheduleDecision
from vmsched.db import migrate
from vmsched.errors import VmschedError
from vmsched.settings import Settings
from vmsched_services.tools.bench.data import vm_spec
from vmsched_services.tools.bench.stack import report_clusters
from vmsched_services.tools.bench.timing import latency_stats as _stats
from vmsched_services.tools.procs import Supervisor

#: The other cluster: a few hosts, one-VM requests.
SMALL_HOSTS = 10


def latency_stats(latencies_s: list[float], wall_s: float) -> dict[str, float]:
    """The bench's statistics and the worst one: a held loop shows in the tail."""
    return {**_stats(latencies_s, wall_s), "max_ms": round(max(latencies_s, default=0.0) * 1000, 3)}


async def bench_batches(
    settings: Settings, n_hosts: int, batches: int, batch_size: int, seed: int, *, timeout: float = 120.0
) -> dict[str, Any]:
    """Another cluster's latency alone and while `batches` batches of `batch_size` VMs run."""
    rng = random.Random(seed)
    await migrate(settings.postgres_url)
    big, small = f"bench-batches-{n_hosts}", "bench-batches-other"
    sup = Supervisor(settings, Path(tempfile.mkdtemp(prefix="vmsched-bench-batches-")))
    counter = iter(range(10**9))
    try:
        for service in ("state-tracker", "filter-worker", "weigher", "selector"):
            await sup.start(service)
        async with SchedulerClient(settings) as client:
            await report_clusters(client, rng, [small], SMALL_HOSTS)
            await report_clusters(client, rng, [big], n_hosts)

            failed: list[str] = []

            async def other() -> float:
                """How long another cluster's one-VM request took to be answered (one not placed
                is noted in `failed`: under a held worker it ended in rpc_timeout)."""
                began = time.perf_counter()
                d = await client.schedule(small, vm_spec(rng, next(counter)), timeout=timeout)
                if d.host_id is None:
                    failed.append(d.explanation.summary)
                return time.perf_counter() - began

            for _ in range(5):  # warm caches and connections
                await other()
            began = time.perf_counter()
            alone = [await other() for _ in range(30)]
            baseline = latency_stats(alone, time.perf_counter() - began)

            async def batch() -> dict[str, Any]:
                vms = [vm_spec(rng, next(counter)) for _ in range(batch_size)]
                t0 = time.perf_counter()
                try:
                    d: ScheduleDecision = await client.schedule(big, vms[0], batch=vms[1:], timeout=timeout)
                    ended = str(d.status)
                except VmschedError as exc:
                    ended = exc.code
                return {"ended": ended, "seconds": round(time.perf_counter() - t0, 3)}

            began = time.perf_counter()
            running = [asyncio.create_task(batch()) for _ in range(batches)]
            during: list[float] = []
            while not all(t.done() for t in running):
                during.append(await other())
            ended = [await t for t in running]
            return {
                "hosts": n_hosts,
                "batches": batches,
                "batch_size": batch_size,
                "other_cluster_alone": baseline,
                "other_cluster_during_batches": latency_stats(during, time.perf_counter() - began),
                "other_cluster_not_placed": failed,
                "batch_results": ended,
                "logs": str(sup.log_dir),
            }
    finally:
        sup.stop_all()


__all__ = ["bench_batches"]
