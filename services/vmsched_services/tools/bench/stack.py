"""What the services are given for a bench run, and taken back after: the policy the bench's
clusters run, their hosts, and the Redis keys of the run."""

from __future__ import annotations

import contextlib
import random

from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport
from vmsched.db import PolicyRepository
from vmsched.errors import VmschedError
from vmsched.scheduling.policy import DEFAULT_POLICY, Policy
from vmsched.settings import Settings
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.bench.data import host_reports
from vmsched_services.tools.procs import delete_broker_objects


async def attach(repo: PolicyRepository, clusters: list[str], policy: Policy) -> None:
    """The bench's clusters run `policy` (a cluster with no link runs the default)."""
    if policy.name == DEFAULT_POLICY.name:
        return
    for name in clusters:
        await repo.clear_cluster(name)
    with contextlib.suppress(VmschedError):
        await repo.delete(policy.id)
    await repo.create(policy)
    for name in clusters:
        await repo.set_cluster_policy(name, policy.id)


async def detach(repo: PolicyRepository, clusters: list[str], policy: Policy) -> None:
    if policy.name == DEFAULT_POLICY.name:
        return
    for name in clusters:
        await repo.clear_cluster(name)
    await repo.delete(policy.id)


async def report_clusters(client: SchedulerClient, rng: random.Random, clusters: list[str], n_hosts: int) -> None:
    for name in clusters:
        await client.report_cluster(ClusterReport(cluster_id=name))
        for h in host_reports(rng, name, n_hosts):
            await client.report_host(h)
    for name in clusters:
        await client.wait_for_state(name, hosts=n_hosts, timeout=120)


async def cleanup(settings: Settings) -> None:
    """Delete the run's Redis keys and its exchanges and queues (every quorum queue left behind
    weighs on the broker)."""
    redis = connect_redis(settings)
    try:
        async for key in redis.scan_iter(match=f"{settings.redis_prefix}:*", count=1000):
            await redis.delete(key)
    finally:
        await redis.aclose()
    await delete_broker_objects(settings)


__all__ = ["attach", "cleanup", "detach", "report_clusters"]
