"""How the bench times things: latency statistics, best-of-N timings, runs of N calls at a given
concurrency, and the CPU each process spends per decision."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vmsched_services.tools.procs import cpu_ms
from vmsched_services.tools.stats import percentile


def latency_stats(latencies_s: list[float], wall_s: float) -> dict[str, float]:
    ms = [x * 1000 for x in latencies_s]
    return {
        "decisions": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else 0.0,
        "decisions_per_s": round(len(ms) / wall_s, 1) if wall_s else 0.0,
    }


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_ms(fn: Callable[[], object], runs: int = 3) -> float:
    """The best of `runs` timings of `fn`, in milliseconds (the least disturbed by the machine)."""
    return round(min(seconds(fn) for _ in range(runs)) * 1000, 1)


async def timed(n: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)
    lat: list[float] = []

    async def run(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            await one(i)
            lat.append(time.perf_counter() - t0)

    began = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(n)))
    return latency_stats(lat, time.perf_counter() - began)


async def costed(
    pids: dict[str, int], n: int, concurrency: int, one: Callable[[int], Awaitable[None]]
) -> dict[str, Any]:
    """timed, plus the CPU each process spent per decision (ms): where a decision's work goes,
    the servers' share included, and which process saturates first."""
    before = {name: cpu_ms(pid) for name, pid in pids.items()}
    stats: dict[str, Any] = dict(await timed(n, concurrency, one))
    spent = {name: cpu_ms(pid) for name, pid in pids.items()}
    stats["cpu_ms_per_decision"] = {
        name: round((after - start) / n, 2)
        for name, after in spent.items()
        if after is not None and (start := before[name]) is not None
    }
    return stats


__all__ = ["best_ms", "costed", "latency_stats", "seconds", "timed"]
