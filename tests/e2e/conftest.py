"""Services as real OS processes (`python -m vmsched_services.tools.cli run NAME`), for the end-to-end tests.

`stack` gives a test a `vmsched_services.tools.procs.ServiceStack`: it starts services as child processes with this
run's settings in their environment, waits until each one consumes its RPC queue (observed on the
broker, not guessed with sleeps), can freeze, kill or restart one, and stops everything at teardown
(SIGTERM, then SIGKILL). Each process writes stdout and stderr to files under the test's tmp_path;
when a test fails, their tails are attached to the failure report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Mapping
from pathlib import Path
from typing import Any

import pytest

from vmsched.db import migrate
from vmsched.settings import Settings
from vmsched_services.tools.procs import ServiceProcess, ServiceStack

__all__ = ["SERVICE_OVERRIDES", "WORKERS_PLACE", "ServiceProcess", "ServiceStack"]

#: Settings the service processes get on top of the run's: a small prefetch so messages spread
#: over competing consumers, and an RPC timeout (used by the selector's filter and weigh calls) long
#: enough to outlive a frozen filter-worker.
SERVICE_OVERRIDES: Mapping[str, Any] = {
    "prefetch": 4,
    "rpc_timeout_s": 10.0,
    "lock_hold_timeout_s": 15.0,
    "log_level": "WARNING",
}

#: The environment that sends every group to the filter-workers (the selector places none itself):
#: for tests of the workers' part.
WORKERS_PLACE: Mapping[str, str] = {"VMSCHED_PLACE_IN_SELECTOR": "false"}


@pytest.fixture(scope="module")
async def migrated_database(database: str) -> str:
    """The run's PostgreSQL database with the schema and built-in policies (the selector needs them)."""
    await migrate(database)
    return database


@pytest.fixture
def cli_settings(settings: Settings, migrated_database: str) -> Settings:
    """The run's settings on the migrated database, as a user's shell gives them to `vmsched`."""
    return settings.model_copy(update={"postgres_url": migrated_database})


@pytest.fixture
def service_settings(settings: Settings, migrated_database: str) -> Settings:
    """The settings every service process (and the test's clients) use."""
    return settings.model_copy(update={"postgres_url": migrated_database, **SERVICE_OVERRIDES})


@pytest.fixture
async def stack(service_settings: Settings, tmp_path: Path) -> AsyncIterator[ServiceStack]:
    s = ServiceStack(service_settings, tmp_path / "services")
    try:
        yield s
    finally:
        await s.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """On failure, attach the tails of the service processes' output to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        s = getattr(item, "funcargs", {}).get("stack")
        if isinstance(s, ServiceStack):
            report.sections.append(("service process output", s.tails()))
