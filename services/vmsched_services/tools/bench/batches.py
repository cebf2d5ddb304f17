"""Big batches: what one costs to place, and what a cluster's 1,000-VM batches cost another cluster.

`batch_cost`: one request of N VMs placed in process with the filter-worker's steps, CPU seconds,
at sizes up to ten times what a request may carry (the cost must grow with the batch, no faster).

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
import uuid
from pathlib import Path
from typing import Any

from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, HostState, PendingEntry, ScheduleDecision, ScheduleRequest, VmSpec
from vmsched.db import migrate
from vmsched.errors import VmschedError
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.pipeline import candidate_hosts
from vmsched.scheduling.placement import LocalSteps, Placed, pending_entry, place, top_hosts
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched.settings import Settings
from vmsched_services.tools.bench.data import host_reports, vm_spec
from vmsched_services.tools.bench.stack import report_clusters
from vmsched_services.tools.bench.timing import latency_stats as _stats
from vmsched_services.tools.procs import Supervisor

#: The other cluster: a few hosts, one-VM requests.
SMALL_HOSTS = 10


def latency_stats(latencies_s: list[float], wall_s: float) -> dict[str, float]:
    """The bench's statistics and the worst one: a held loop shows in the tail."""
    return {**_stats(latencies_s, wall_s), "max_ms": round(max(latencies_s, default=0.0) * 1000, 3)}


async def batch_cost(n_hosts: int, sizes: list[int], seed: int) -> dict[str, float]:
    """CPU seconds to place one batch of each size on `n_hosts` hosts, in process."""
    out: dict[str, float] = {}
    for size in sizes:
        rng = random.Random(seed)
        reports = host_reports(rng, "batch", n_hosts)
        table = HostTable.from_states([HostState(report=r) for r in reports], ClusterReport(cluster_id="batch"))
        vms = [vm_spec(rng, i) for i in range(size)]
        one = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="batch", vm=vms[0])
        # Past the 1,000 a request may carry, on purpose: built without validation.
        req = ScheduleRequest.model_construct(**{**dict(one), "batch": vms[1:]})
        steps = LocalSteps.of(table, DEFAULT_POLICY, now=time.time(), weigh_in_filter=True, top=top_hosts(req))

        def pending_for(vm: VmSpec, host_id: str, rid: uuid.UUID = req.request_id) -> PendingEntry:
            return pending_entry(vm, host_id, request_id=rid, fencing_token=1, expires_at=time.time() + 600)

        began = time.process_time()
        outcome = await place(
            req,
            DEFAULT_POLICY.filter_names(),
            candidate_hosts(table).ids,
            [],
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=pending_for,
            may_wait=False,
        )
        if not isinstance(outcome, Placed):
            raise RuntimeError(f"a bench batch of {size} VMs was not placed; the bench data is wrong")
        out[str(size)] = round(time.process_time() - began, 3)
    return out


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
