"""The fault suite's short versions (vmsched_services.tools.chaos): real service processes on the real servers.

Each experiment runs under prefixes of its own inside this run's (see vmsched_services.tools.chaos.base), with its
service processes' logs under the test's tmp_path; a failure report carries the experiment's
figures and the tails of those logs.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from vmsched.db import migrate
from vmsched.settings import Settings
from vmsched_services.tools.chaos import EXPERIMENTS, Result


@pytest.fixture(scope="module")
async def chaos_settings(settings: Settings, database: str) -> Settings:
    """The run's settings, on a migrated database (the selector reads policies from it)."""
    await migrate(database)
    return settings.model_copy(update={"postgres_url": database})


async def run_short(name: str, settings: Settings, log_dir: Path) -> Result:
    """Run one experiment's short version and print its figures (shown with -s, and on failure)."""
    result = await EXPERIMENTS[name].run(settings, log_dir, long=False)
    print("\n" + result.summary())
    return result


def tails(log_dir: Path, nbytes: int = 3000) -> str:
    parts = []
    for path in sorted(log_dir.rglob("*")):
        if path.is_file() and path.stat().st_size:
            data = path.read_bytes()[-nbytes:].decode(errors="replace").rstrip()
            parts.append(f"--- {path.name} ---\n{data}")
    return "\n".join(parts) or "(no output)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """On failure, attach the tails of the experiment's service logs."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call":
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            report.sections.append(("service process output", tails(tmp)))
