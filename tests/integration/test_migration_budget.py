"""The disruption budgets' record of migrations (MigrationBudget) on the real Redis, and a balancing
pass held to it."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from vmsched.scheduling.budgets import Budget, BudgetLimits, MoveRecord
from vmsched.settings import Settings
from vmsched.store.budgets import MigrationBudget
from vmsched.store.keys import Keys

pytestmark = pytest.mark.integration


async def test_the_record_counts_the_hour_and_remembers_returns(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    store = MigrationBudget(redis_client, settings)
    now = time.time()
    cool = 2 * 3600.0
    await store.record(unique, MoveRecord(now - 3 * 3600, "old", "a", "b"), "d0", cool)  # dropped
    await store.record(unique, MoveRecord(now - 5400, "vm1", "h1", "h2"), "d1", cool)
    await store.record(unique, MoveRecord(now - 60, "vm2", "h3", "h4"), "d2", cool)
    ledger = await store.ledger(unique, now, cool)
    assert ledger.in_last_hour() == 1
    assert (ledger.host_count("h3"), ledger.host_count("h4"), ledger.host_count("h1")) == (1, 1, 0)
    assert ledger.left_within("vm1", now) == {"h1"}  # outside the hour, inside the cool-down
    assert ledger.left_within("old", now) == set()
    assert await redis_client.zcard(Keys.from_settings(settings).migration_budget(unique)) == 2
    assert await redis_client.pttl(Keys.from_settings(settings).migration_budget(unique)) > 0

    limits = BudgetLimits(per_host_hour=1, per_cluster_hour=2, concurrent=2, return_cooldown_s=cool)
    budget = Budget(limits, ledger, now, 0)
    assert budget.exhausted() is None
    # vm1 may not go back to h1; h3 and h4 are out of budget this hour.
    assert budget.admit("vm1", "h2", ["h1", "h3", "h5"]) == ("h5",)
    assert budget.admit("vm9", "h4", ["h5"]) == ()
    await store.record(unique, MoveRecord(now, "vm3", "h5", "h6"), "d3", cool)
    full = Budget(limits, await store.ledger(unique, now + 1, cool), now + 1, 0)
    assert full.exhausted() == "2 migrations in the last hour, MigrationsPerClusterPerHour 2"
