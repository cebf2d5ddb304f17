"""The fault experiments, short: seconds each. Every invariant is asserted (nothing lost, nothing
placed twice, no host over-committed, every bad message refused, memory bounded); the figures are printed.

Latency and recovery-time thresholds belong to the long versions (`vmsched chaos --long`, the sizes the
thresholds are stated for, on a machine of their own): here they are held only to bounds that a real
regression crosses (a wedged consumer, a lock kept to its hold timeout), never to how fast a shared,
busy CI machine happens to be. Each check's line says whether the long run's bound held too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.conftest import run_short
from vmsched.settings import Settings

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


def _verdict(result_failures: list[str]) -> str:
    return "thresholds missed:\n  " + "\n  ".join(result_failures)


async def test_worker_kill(chaos_settings: Settings, tmp_path: Path) -> None:
    """SIGKILLed filter-workers and weighers: every request answered, none lost or placed twice."""
    result = await run_short("worker_kill", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_selector_kill(chaos_settings: Settings, tmp_path: Path) -> None:
    """SIGKILLed selectors: no over-committed host, none lost or placed twice, every request answered."""
    result = await run_short("selector_kill", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_tracker_kill(chaos_settings: Settings, tmp_path: Path) -> None:
    """The consuming one of two state trackers SIGKILLed: no report lost or applied out of order."""
    result = await run_short("tracker_kill", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_stale_holder(chaos_settings: Settings, tmp_path: Path) -> None:
    """A SIGSTOPped holder resumed after a takeover: every stale fenced write refused."""
    result = await run_short("stale_holder", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_broker_drop(chaos_settings: Settings, tmp_path: Path) -> None:
    """Broker connections closed and Redis clients killed (this run's own only): 0 lost, 0 duplicates, recovered."""
    result = await run_short("broker_drop", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_redis_sentinel_failover(chaos_settings: Settings, tmp_path: Path) -> None:
    """The Redis primary SIGKILLed mid-stream (private primary, replica, 3 sentinels): the services follow
    the promoted replica; all answered, none lost or placed twice, no host over-committed."""
    result = await run_short("redis_sentinel_failover", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_redis_cluster_failover(chaos_settings: Settings, tmp_path: Path) -> None:
    """One master of a private 3-master Redis Cluster SIGKILLed mid-stream, its replica takes over: all
    answered, none lost or placed twice, no host over-committed."""
    result = await run_short("redis_cluster_failover", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


@pytest.mark.skipif(
    os.environ.get("FAULTS_RABBIT_CLUSTER") != "1",
    reason="starts three RabbitMQ nodes (a minute or more on 2 cores): set FAULTS_RABBIT_CLUSTER=1",
)
async def test_rabbit_node_loss(chaos_settings: Settings, tmp_path: Path) -> None:
    """The node leading the quorum queues of a private 3-node cluster SIGKILLed mid-stream: 0 lost,
    0 placed twice, every queue led again, placing again."""
    result = await run_short("rabbit_node_loss", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_hostile_input(chaos_settings: Settings, tmp_path: Path) -> None:
    """Hostile messages: all refused, no crash or wedge, every valid request answered, RSS growth <= 20 MB."""
    result = await run_short("hostile_input", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_postgres_away(chaos_settings: Settings, tmp_path: Path) -> None:
    """PostgreSQL stopped past the policy caches' TTL: every request answered from cached policies, none
    internal, a never-read cluster refused policy_store_unavailable, the staleness gauge counting."""
    result = await run_short("postgres_away", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_redis_away(chaos_settings: Settings, tmp_path: Path) -> None:
    """Redis stopped under the services: they stop consuming, nothing is answered internal or lost."""
    result = await run_short("redis_away", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_redis_restart(chaos_settings: Settings, tmp_path: Path) -> None:
    """Redis SIGKILLed and started empty under a request stream: none lost, none placed twice (a replayed
    request decided before is answered decision_lost), no host over-committed, the frozen holder's
    stale write refused."""
    result = await run_short("redis_restart", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())
