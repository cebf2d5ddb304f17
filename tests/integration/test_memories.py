"""What the balancer, state tracker and HA monitor remember between cycles, on the real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from vmsched.settings import Settings
from vmsched.store import FailedHosts, HaStatus, MigrationCooldowns

pytestmark = pytest.mark.integration


async def test_failed_hosts_accumulate_per_vm_and_expire(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    hosts = FailedHosts(redis_client, settings.model_copy(update={"failed_host_memory_s": 0.3}))
    await hosts.remember(unique, "vm1", "h1")
    await hosts.remember(unique, "vm1", "h2")
    assert await hosts.of(unique, "vm1") == {"h1", "h2"}
    assert await hosts.of(unique, "vm2") == set()
    await asyncio.sleep(0.5)
    assert await hosts.of(unique, "vm1") == set()


async def test_failed_hosts_remembered_together_are_remembered_as_one_by_one(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    hosts = FailedHosts(redis_client, settings.model_copy(update={"failed_host_memory_s": 0.3}))
    await hosts.remember_all(unique, [("vm1", "h1"), ("vm2", "h1"), ("vm1", "h2")])
    await hosts.remember_all(unique, [])
    assert await hosts.of(unique, "vm1") == {"h1", "h2"}
    assert await hosts.of(unique, "vm2") == {"h1"}
    await asyncio.sleep(0.5)
    assert await hosts.of(unique, "vm1") == await hosts.of(unique, "vm2") == set()


async def test_a_migrated_vm_rests_for_the_cooldown_and_zero_disables_it(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cooldowns = MigrationCooldowns(redis_client, settings.model_copy(update={"migration_cooldown_s": 0.3}))
    await cooldowns.start(unique, "vm1", "d1")
    assert await cooldowns.resting(unique, ["vm1", "vm2"]) == {"vm1"}
    assert await cooldowns.resting(unique, []) == set()
    await asyncio.sleep(0.5)
    assert await cooldowns.resting(unique, ["vm1"]) == set()
    never = MigrationCooldowns(redis_client, settings.model_copy(update={"migration_cooldown_s": 0}))
    await never.start(unique, "vm3", "d3")
    assert await never.resting(unique, ["vm3"]) == set()


async def test_ha_status_keeps_the_failing_set_and_forgets_it_when_empty(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    status = HaStatus(redis_client, settings)
    assert await status.failing(unique) == []
    await status.set_failing(unique, ["h2", "h1"])
    assert await HaStatus(redis_client, settings).failing(unique) == ["h2", "h1"]
    await status.set_failing(unique, [])
    assert await status.failing(unique) == []
