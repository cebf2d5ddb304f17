"""Two state trackers on one queue (RabbitMQ): they take turns on it (a single active consumer,
constants.SINGLE_ACTIVE_QUEUES), so reports are applied in the order the engine published them while
both run and across the active one stopping mid-stream; a host's state never goes back to an
earlier report."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from tests import factories
from tests.integration.conftest import services
from vmsched.client import SchedulerClient
from vmsched.db import migrate
from vmsched.settings import Settings

pytestmark = pytest.mark.integration

#: Reports of one host, each with one more MB free than the one before.
REPORTS = 300


async def test_two_trackers_apply_one_hosts_reports_in_order_across_a_takeover(
    settings: Settings, database: str, unique: str
) -> None:
    # A new cluster's generation is numbered in PostgreSQL: the run's database, migrated (when this
    # test runs alone, no earlier test has made it).
    await migrate(database)
    cluster = f"two-trackers-{unique}"
    first, second = contextlib.AsyncExitStack(), contextlib.AsyncExitStack()
    seen: list[int] = []
    try:
        await first.enter_async_context(services(settings, "state-tracker"))
        await second.enter_async_context(services(settings, "state-tracker"))
        async with SchedulerClient(settings) as client:

            async def watch() -> None:
                while True:
                    with contextlib.suppress(Exception):
                        hosts = (await client.state(cluster, timeout=2.0)).hosts
                        if hosts:
                            seen.append(hosts[0].report.mem_free_mb)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            for i in range(REPORTS):
                report = factories.host_report(
                    cluster, "h1", cpu_cores=8, physical_mem_mb=1 << 20, mem_free_mb=1000 + i
                )
                await client.report_host(report)
                if i == REPORTS // 2:
                    await first.aclose()  # the tracker that was consuming stops mid-stream
            async with asyncio.timeout(30):
                while not seen or seen[-1] != 1000 + REPORTS - 1:  # noqa: ASYNC110 (polling the tracker)
                    await asyncio.sleep(0.05)
            watcher.cancel()
            final = await client.state(cluster)
    finally:
        await second.aclose()
        await first.aclose()
    assert [h.report.mem_free_mb for h in final.hosts] == [1000 + REPORTS - 1]
    # Every report applied in order: never an earlier report after a later one. Reports that waited
    # together were applied as one version (state_tracker.batches), so at most one version each.
    assert 1 <= final.version <= REPORTS
    assert seen == sorted(seen), [b for a, b in itertools.pairwise(seen) if b < a][:5]
