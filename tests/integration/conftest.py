"""Helpers for integration tests that run services in this process.

A test module defines its own `stack` fixture (which services, which settings), usually as
`async with services(cfg, "state-tracker", ...): yield cfg`; the `client` fixture (tests/conftest.py)
then talks to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from vmsched.settings import Settings
from vmsched_services.runner import run

#: How long the services get to start (all of them ready) and to stop.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def services(cfg: Settings, *names: str) -> AsyncIterator[Settings]:
    """The named services running in this process on `cfg` until the block ends."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(list(names), cfg, stop=stop, ready=ready))
    await asyncio.wait_for(ready.wait(), START_TIMEOUT_S)
    try:
        yield cfg
    finally:
        stop.set()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)
