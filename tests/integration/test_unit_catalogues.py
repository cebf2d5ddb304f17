"""Service instances announce their policy units in Redis; `available_units` is what every live one has.

Each test keeps its announcements under a key prefix of its own (below the run's, so they are
removed with it): the index of instances is per prefix, and services of other tests announce too.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from vmsched.settings import Settings
from vmsched.store.catalogues import UnitCatalogues, announce_units
from vmsched.store.keys import Keys

pytestmark = pytest.mark.integration

BUILTIN = "builtin"
RACKS = "vmsched-example-units 0.1.0"


def catalogues(redis: aioredis.Redis, settings: Settings, unique: str, ttl_s: float = 30.0) -> UnitCatalogues:
    cfg = settings.model_copy(update={"unit_catalogue_ttl_s": ttl_s})
    return UnitCatalogues(redis, cfg, keys=Keys(f"{settings.redis_prefix}:catalogue-{unique}"))


async def test_available_units_are_those_every_live_instance_of_a_service_has(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cat = catalogues(redis_client, settings, unique)
    assert await cat.available_units() == {}
    await cat.announce("filter-worker", "fw-1", {"Memory": BUILTIN, "RackLabelFilter": RACKS})
    await cat.announce("filter-worker", "fw-2", {"Memory": BUILTIN, "CPU": BUILTIN})
    await cat.announce("weigher", "w-1", {"RackSpreadWeight": RACKS, "RAMWeigher": BUILTIN})
    assert await cat.available_units() == {
        "filter-worker": frozenset({"Memory"}),  # RackLabelFilter is on fw-1 only, CPU on fw-2 only
        "weigher": frozenset({"RackSpreadWeight", "RAMWeigher"}),
    }
    [fw1, fw2, w1] = await cat.instances()
    assert (fw1.service, fw1.instance, dict(fw1.units)) == (
        "filter-worker",
        "fw-1",
        {"Memory": BUILTIN, "RackLabelFilter": RACKS},
    )
    assert (fw2.instance, w1.instance) == ("fw-2", "w-1")

    # fw-2 is replaced by an instance with the plugin: once fw-2 withdraws, the filter is available
    await cat.announce("filter-worker", "fw-3", {"Memory": BUILTIN, "RackLabelFilter": RACKS})
    assert await cat.available_units() == {
        "filter-worker": frozenset({"Memory"}),
        "weigher": frozenset({"RackSpreadWeight", "RAMWeigher"}),
    }
    await cat.withdraw("filter-worker", "fw-2")
    assert (await cat.available_units())["filter-worker"] == {"Memory", "RackLabelFilter"}


async def test_a_dead_instance_drops_out_when_its_announcement_expires(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    short = catalogues(redis_client, settings, unique, ttl_s=0.4)
    long = catalogues(redis_client, settings, unique, ttl_s=30.0)
    await long.announce("balancer", "alive", {"OptimalForEvenDistribution": BUILTIN})
    await short.announce("balancer", "dies", {"OptimalForPowerSaving": BUILTIN})
    await short.announce("weigher", "dies-too", {"RAMWeigher": BUILTIN})
    assert await long.available_units() == {"balancer": frozenset(), "weigher": frozenset({"RAMWeigher"})}
    await asyncio.sleep(0.6)  # no renewal: "dies" stopped without withdrawing
    assert await long.available_units() == {"balancer": frozenset({"OptimalForEvenDistribution"})}
    assert [a.instance for a in await long.instances()] == ["alive"]
    keys = Keys(f"{settings.redis_prefix}:catalogue-{unique}")
    # the index forgets the dead instances too, so it does not grow with every restart
    assert await redis_client.zrange(keys.unit_catalogue_index(), 0, -1) == [
        keys.unit_catalogue("balancer", "alive").encode()
    ]


async def test_a_running_instance_keeps_its_announcement_alive_and_withdraws_it_when_stopped(
    redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    cat = catalogues(redis_client, settings, unique, ttl_s=0.3)
    units = {"Memory": BUILTIN, "RackLabelFilter": RACKS}
    task = asyncio.create_task(announce_units(cat, ["filter-worker", "weigher"], units, instance="me"))
    try:
        for _ in range(50):
            if len(await cat.instances()) == 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.8)  # several TTLs: only the renewals keep it
        assert await cat.available_units() == {"filter-worker": set(units), "weigher": set(units)}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await cat.available_units() == {}  # withdrawn at once, not after the TTL
