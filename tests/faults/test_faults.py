"""The fault experiments, short: seconds each. Every threshold is asserted; the figures are printed.

The long versions (the sizes the thresholds are stated for) run with `vmsched chaos --long`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.conftest import run_short
from vmsched.settings import Settings

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


def _verdict(result_failures: list[str]) -> str:
    return "thresholds missed:\n  " + "\n  ".join(result_failures)


async def test_worker_kill(chaos_settings: Settings, tmp_path: Path) -> None:
    """SIGKILLed filter-workers and weighers: every request answered within 5 s, none lost or placed twice."""
    result = await run_short("worker_kill", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_selector_kill(chaos_settings: Settings, tmp_path: Path) -> None:
    """SIGKILLed selectors: no over-committed host, >= 99 % answered within 5 s, all within acquire + 5 s."""
    result = await run_short("selector_kill", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_stale_holder(chaos_settings: Settings, tmp_path: Path) -> None:
    """A SIGSTOPped holder resumed after a takeover: every stale fenced write refused."""
    result = await run_short("stale_holder", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_broker_drop(chaos_settings: Settings, tmp_path: Path) -> None:
    """Broker connections closed and Redis clients killed (this run's own only): 0 lost, recovery <= 5 s."""
    result = await run_short("broker_drop", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())


async def test_hostile_input(chaos_settings: Settings, tmp_path: Path) -> None:
    """Hostile messages: all refused, no crash or wedge, valid requests within 1 s, RSS growth <= 20 MB."""
    result = await run_short("hostile_input", chaos_settings, tmp_path)
    assert result.passed, _verdict(result.failures())
