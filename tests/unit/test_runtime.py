"""Shutting down background loops: a loop that loses a cancellation still stops."""

from __future__ import annotations

import asyncio

from vmsched.runtime import stop_tasks


async def test_a_loop_that_swallows_a_cancel_is_cancelled_again_until_it_stops() -> None:
    swallowed = 0

    async def stubborn_loop() -> None:
        # What redis-py's asyncio.wait_for does on Python 3.11 when a cancel races a reply.
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed == 0:
                    swallowed += 1
                    task = asyncio.current_task()
                    assert task is not None
                    task.uncancel()
                    continue
                raise

    task = asyncio.create_task(stubborn_loop())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(stop_tasks([task]), timeout=5)
    assert task.cancelled()
    assert swallowed == 1


async def test_tasks_that_failed_or_finished_are_collected_without_raising() -> None:
    async def boom() -> None:
        raise RuntimeError("failed long ago")

    async def done() -> None:
        return None

    tasks = [asyncio.create_task(boom()), asyncio.create_task(done())]
    await asyncio.sleep(0)
    await stop_tasks(tasks)
    assert all(t.done() for t in tasks)
